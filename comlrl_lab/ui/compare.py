"""Data of the Compare page: runs found under the runs folder, grouped over seeds, curves as mean ± 95% CI.

Runs are read from their ``spec.json`` (what they are) and their Parquet ``snapshots/`` (what they recorded), never
from their DuckDB files, which a running run (in this process or another) holds locked. ``catalogue`` lists the
runs, ``group_runs`` puts together runs whose settings differ only in ``seed``, and ``compare`` builds everything
the page draws (curve bands, the config diff, pair statistics and their figures) in one pass; ``cached_compare``
keeps it per selection and snapshot state. Only ``cached_compare`` touches Streamlit (its cache); no SQL here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from comlrl_lab.engine import ExperimentSpec
from comlrl_lab.engine.run import SNAPSHOT_DIR, SPEC_FILE
from comlrl_lab.names import metric_names as mn
from comlrl_lab.store.snapshots import pair_rows, round_metrics
from comlrl_lab.ui.charts import COMPARATOR, CURRENT, SERIES_PALETTE
from comlrl_lab.ui.frames import has_any_tag
from comlrl_lab.ui.stats import ci95_half_width

#: The curves compared: label -> (metric name, phase it is recorded in) in order of preference per run.
CURVES: dict[str, tuple[tuple[str, str], ...]] = {
    "Evaluation reward": ((mn.EVAL_REWARD_MEAN, "evaluate"),),
    "Candidate reward (current agents)": ((mn.REWARD_MEAN, "collect"),),
    "Pair accuracy": ((mn.ROUND_PREFIX + mn.MADPO_PAIR_ACCURACY, "train"),),
    "Loss": ((mn.ROUND_PREFIX + mn.MADPO_LOSS, "train"), (mn.ROUND_PREFIX + mn.RL_LOSS, "train")),
    "Joint margin": ((mn.ROUND_PREFIX + mn.MADPO_JOINT_MARGIN, "train"),),
    "Current agents' win share": ((mn.CURRENT_WIN_SHARE, "collect"),),
}
#: Settings that never make two runs different experiments: the seed (the group's samples) and bookkeeping.
NOT_SETTINGS = frozenset({"seed", "name", "tags", "output_dir", "preference_replay_dir"})
STATS_COLUMNS = ["curve", "group", "round", "mean", "low", "high", "n"]


@dataclass(frozen=True)
class RunEntry:
    """One run as the Compare page knows it: from its spec.json, and where its snapshots are."""

    run_id: str
    run_dir: Path
    algorithm: str
    task: str
    tags: tuple[str, ...]
    seed: int | None
    settings: dict[str, Any] = field(hash=False, compare=False)

    @property
    def snapshot_dir(self) -> Path:
        return self.run_dir / SNAPSHOT_DIR


@dataclass(frozen=True)
class Group:
    """Runs whose settings agree in everything but the seed; ``label`` names what sets it apart."""

    label: str
    runs: tuple[RunEntry, ...]

    @property
    def settings(self) -> dict[str, Any]:
        return self.runs[0].settings


@dataclass
class Comparison:
    """Everything the Compare page draws for one selection of runs."""

    groups: list[Group]
    stats: pd.DataFrame  # STATS_COLUMNS
    config_diff: pd.DataFrame  # index: setting; one column per group
    pair_table: pd.DataFrame  # one row per group
    curves_figure: go.Figure | None
    gaps_figure: go.Figure | None
    sides_figure: go.Figure | None
    unreadable: list[str] = field(default_factory=list)  # snapshot files left out: no Parquet any more


# -- the runs -------------------------------------------------------------------------------------------------


def _settings(spec: ExperimentSpec) -> tuple[dict[str, Any], int | None]:
    """(every setting that defines the experiment, the seed): spec fields and the config with its defaults."""
    try:
        config = spec.build_config().to_dict()
    except (ValueError, TypeError):  # a spec from another version: compare what it says
        config = dict(spec.config)
    data = spec.to_dict()
    top = {k: v for k, v in data.items() if k not in ("config", "model_config") and k not in NOT_SETTINGS}
    top.update({f"model_config.{k}": v for k, v in (spec.model_config or {}).items()})
    top.update({k: v for k, v in config.items() if k not in NOT_SETTINGS})
    seed = config.get("seed")
    return top, (int(seed) if isinstance(seed, int) else None)


def catalogue(runs_root: str | Path) -> list[RunEntry]:
    """Every engine run under ``runs_root`` (folders with spec.json), sorted by run id; unreadable ones skipped."""
    root = Path(runs_root)
    entries = []
    for run_dir in sorted(root.iterdir()) if root.is_dir() else []:
        if run_dir.name.startswith(("_", ".")) or not (run_dir / SPEC_FILE).is_file():
            continue
        try:
            spec = ExperimentSpec.load(run_dir / SPEC_FILE)
        except (OSError, ValueError, TypeError):
            continue
        settings, seed = _settings(spec)
        entries.append(
            RunEntry(
                run_id=run_dir.name,
                run_dir=run_dir,
                algorithm=spec.algorithm,
                task=str(spec.task or spec.user_task or ""),
                tags=tuple(spec.tags),
                seed=seed,
                settings=settings,
            )
        )
    return entries


def catalogue_frame(entries: Sequence[RunEntry]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"run_id": e.run_id, "algorithm": e.algorithm, "task": e.task, "tags": ", ".join(e.tags), "seed": e.seed}
            for e in entries
        ],
        columns=["run_id", "algorithm", "task", "tags", "seed"],
    )


def filter_runs(
    entries: Iterable[RunEntry],
    *,
    algorithms: Sequence[str] = (),
    tasks: Sequence[str] = (),
    tags: Sequence[str] = (),
) -> list[RunEntry]:
    """The runs matching every non-empty filter (a run matches a tag filter when it carries any of the tags)."""
    return [
        e
        for e in entries
        if (not algorithms or e.algorithm in algorithms)
        and (not tasks or e.task in tasks)
        and has_any_tag(e.tags, tags)
    ]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def differing_settings(settings: Sequence[dict[str, Any]]) -> list[str]:
    """Names of the settings whose values are not all equal across ``settings``, in first-seen order."""
    names: dict[str, None] = {}
    for s in settings:
        names.update(dict.fromkeys(s))
    return [n for n in names if len({_key(s.get(n)) for s in settings}) > 1]


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else _key(value)
    return text if len(text) <= 40 else text[:37] + "..."


def group_runs(entries: Sequence[RunEntry], *, by_seed: bool = True) -> list[Group]:
    """Groups of runs that differ only in ``seed`` (or one group per run), labelled by the settings that differ."""
    buckets: dict[str, list[RunEntry]] = {}
    for entry in entries:
        buckets.setdefault(_key(entry.settings) if by_seed else entry.run_id, []).append(entry)
    members = list(buckets.values())
    differing = differing_settings([m[0].settings for m in members])
    groups, seen = [], set()
    for runs in members:
        parts = [f"{name}={_short(runs[0].settings.get(name))}" for name in differing[:3]]
        label = ", ".join(parts) or f"{runs[0].algorithm} on {runs[0].task}"
        if not by_seed:
            label = f"{runs[0].run_id}" if not parts else f"{label} (seed {runs[0].seed})"
        while label in seen:  # two groups differing only beyond the third setting
            label += "'"
        seen.add(label)
        groups.append(Group(label, tuple(runs)))
    return groups


def config_diff(groups: Sequence[Group]) -> pd.DataFrame:
    """The settings that differ between groups: one row per setting, one column per group."""
    names = differing_settings([g.settings for g in groups])
    data = {g.label: [_short(g.settings.get(n)) for n in names] for g in groups}
    return pd.DataFrame(data, index=pd.Index(names, name="setting"))


# -- curves ---------------------------------------------------------------------------------------------------


def curve_values(metrics: pd.DataFrame) -> pd.DataFrame:
    """(curve, run_id, round, value): each curve from the first of its metrics that the run recorded."""
    frames = []
    for curve, choices in CURVES.items():
        taken: set[str] = set()
        for name, phase in choices:
            rows = metrics[(metrics["name"] == name) & (metrics["phase"] == phase) & ~metrics["run_id"].isin(taken)]
            if rows.empty:
                continue
            taken |= set(rows["run_id"])
            frames.append(rows.assign(curve=curve)[["curve", "run_id", "round", "value"]])
    if not frames:
        return pd.DataFrame(columns=["curve", "run_id", "round", "value"])
    return pd.concat(frames, ignore_index=True)


def curve_stats(values: pd.DataFrame, groups: Sequence[Group], *, smoothing: int = 1) -> pd.DataFrame:
    """Mean and 95% CI (Student's t over the group's seeds) per curve, group and round.

    With ``smoothing`` > 1 each run's curve is first a trailing moving average over that many rounds, so the
    band stays a band over seeds. A round that only one seed reached has low = high = its value.
    """
    if values.empty:
        return pd.DataFrame(columns=STATS_COLUMNS)
    run_group = {run.run_id: g.label for g in groups for run in g.runs}
    frame = values[values["run_id"].isin(run_group)].copy()
    frame["group"] = frame["run_id"].map(run_group)
    frame = frame.sort_values(["curve", "run_id", "round"])
    if smoothing > 1:
        frame["value"] = frame.groupby(["curve", "run_id"], sort=False)["value"].transform(
            lambda s: s.rolling(int(smoothing), min_periods=1).mean()
        )
    agg = frame.groupby(["curve", "group", "round"], sort=False)["value"].agg(["mean", "std", "count"]).reset_index()
    half = [ci95_half_width(s, int(n)) if n > 1 else 0.0 for s, n in zip(agg["std"], agg["count"], strict=True)]
    agg["low"] = agg["mean"] - half
    agg["high"] = agg["mean"] + half
    agg = agg.rename(columns={"count": "n"})
    order = {g.label: i for i, g in enumerate(groups)}
    agg = agg.sort_values(["curve", "group", "round"], key=lambda c: c.map(order) if c.name == "group" else c)
    return agg[STATS_COLUMNS].reset_index(drop=True)


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


def curves_figure(stats: pd.DataFrame, groups: Sequence[Group]) -> go.Figure | None:
    """One panel per curve, one colour per group: the mean line over a shaded 95% CI band."""
    curves = [c for c in CURVES if c in set(stats["curve"])]
    if not curves:
        return None
    cols = 2
    rows = math.ceil(len(curves) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=curves, horizontal_spacing=0.08, vertical_spacing=0.12)
    colors = {g.label: SERIES_PALETTE[i % len(SERIES_PALETTE)] for i, g in enumerate(groups)}
    for i, curve in enumerate(curves):
        row, col = i // cols + 1, i % cols + 1
        for label, part in stats[stats["curve"] == curve].groupby("group", sort=False):
            color = colors.get(str(label), SERIES_PALETTE[0])
            x = part["round"].tolist()
            fig.add_trace(
                go.Scatter(
                    x=x + x[::-1],
                    y=part["high"].tolist() + part["low"].tolist()[::-1],
                    mode="lines",  # the band's outline only: no markers at its corners
                    fill="toself",
                    fillcolor=_rgba(color, 0.18),
                    line={"width": 0},
                    hoverinfo="skip",
                    showlegend=False,
                    legendgroup=str(label),
                ),
                row=row,
                col=col,
            )
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=part["mean"].tolist(),
                    mode="lines+markers",
                    name=str(label),
                    line={"color": color},
                    customdata=part["n"].tolist(),
                    hovertemplate="round %{x}: %{y:.3f} (n=%{customdata})",
                    legendgroup=str(label),
                    showlegend=i == 0,
                ),
                row=row,
                col=col,
            )
    fig.update_xaxes(title_text="round", dtick=1)
    fig.update_layout(
        height=300 * rows,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
    )
    return fig


# -- pair statistics ------------------------------------------------------------------------------------------


def pair_table(pairs: pd.DataFrame, groups: Sequence[Group]) -> pd.DataFrame:
    """Per group: pairs per round (mean over its runs and rounds), current agents' win share, gap and lengths."""
    rows = []
    for g in groups:
        part = pairs[pairs["run_id"].isin([r.run_id for r in g.runs])]
        per_round = part.groupby(["run_id", "round"]).size()
        rows.append(
            {
                "group": g.label,
                "runs": len(g.runs),
                "pairs": len(part),
                "pairs per round": float(per_round.mean()) if len(per_round) else math.nan,
                "current wins": float((part["winner_side"] == "current").mean()) if len(part) else math.nan,
                "gap mean": float(part["reward_gap"].mean()) if len(part) else math.nan,
                "gap median": float(part["reward_gap"].median()) if len(part) else math.nan,
                "winner tokens": float(part["winner_tokens"].mean()) if len(part) else math.nan,
                "loser tokens": float(part["loser_tokens"].mean()) if len(part) else math.nan,
            }
        )
    return pd.DataFrame(rows)


def gaps_figure(pairs: pd.DataFrame, groups: Sequence[Group]) -> go.Figure | None:
    """The reward-gap distribution of each group's pairs, as box plots side by side."""
    if pairs.empty:
        return None
    fig = go.Figure()
    for i, g in enumerate(groups):
        gaps = pairs.loc[pairs["run_id"].isin([r.run_id for r in g.runs]), "reward_gap"]
        fig.add_trace(go.Box(y=gaps.tolist(), name=g.label, marker_color=SERIES_PALETTE[i % len(SERIES_PALETTE)]))
    fig.update_layout(
        title={"text": "Reward gap of the pairs", "x": 0, "font": {"size": 15}},
        height=320,
        showlegend=False,
        margin={"l": 10, "r": 10, "t": 44, "b": 10},
        yaxis_title="winner - loser reward",
    )
    return fig


def sides_figure(table: pd.DataFrame) -> go.Figure | None:
    """Which side won the pairs, per group: stacked shares of current agents and comparator."""
    if table.empty or table["current wins"].isna().all():
        return None
    fig = go.Figure()
    fig.add_trace(go.Bar(x=table["group"], y=table["current wins"], name="current agents", marker_color=CURRENT))
    fig.add_trace(go.Bar(x=table["group"], y=1 - table["current wins"], name="comparator", marker_color=COMPARATOR))
    fig.update_layout(
        barmode="stack",
        title={"text": "Winner side", "x": 0, "font": {"size": 15}},
        height=320,
        margin={"l": 10, "r": 10, "t": 44, "b": 10},
        yaxis={"title": "share of pairs", "range": [0, 1]},
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
    )
    return fig


def compare(entries: Sequence[RunEntry], *, by_seed: bool = True, smoothing: int = 1) -> Comparison:
    """Everything the Compare page shows for ``entries``, read from their snapshots in two queries."""
    groups = group_runs(entries, by_seed=by_seed)
    dirs = [e.snapshot_dir for e in entries]
    names = sorted({name for choices in CURVES.values() for name, _ in choices})
    phases = sorted({phase for choices in CURVES.values() for _, phase in choices})
    metrics = round_metrics(dirs, names, phases)
    stats = curve_stats(curve_values(metrics), groups, smoothing=smoothing)
    pairs = pair_rows(dirs)
    table = pair_table(pairs, groups)
    return Comparison(
        unreadable=metrics.attrs.get("unreadable", []) + pairs.attrs.get("unreadable", []),
        groups=groups,
        stats=stats,
        config_diff=config_diff(groups),
        pair_table=table,
        curves_figure=curves_figure(stats, groups),
        gaps_figure=gaps_figure(pairs, groups),
        sides_figure=sides_figure(table),
    )


def snapshot_stamp(entries: Sequence[RunEntry]) -> str:
    """Changes whenever a selected run writes a new snapshot (its manifest is rewritten after every phase)."""
    stamps = []
    for e in entries:
        manifest = e.snapshot_dir / "_manifest.json"
        stamps.append(f"{e.run_id}:{manifest.stat().st_mtime_ns if manifest.exists() else 0}")
    return "|".join(stamps)


@st.cache_resource(max_entries=16, show_spinner=False)
def _cached(root: str, run_ids: tuple[str, ...], stamp: str, by_seed: bool, smoothing: int) -> Comparison:
    chosen = {e.run_id: e for e in catalogue(root)}
    return compare([chosen[r] for r in run_ids if r in chosen], by_seed=by_seed, smoothing=smoothing)


def cached_compare(runs_root: str | Path, entries: Sequence[RunEntry], *, by_seed: bool, smoothing: int) -> Comparison:
    """``compare`` shared by every session until a selected run commits another phase."""
    ids = tuple(e.run_id for e in entries)
    return _cached(str(runs_root), ids, snapshot_stamp(entries), bool(by_seed), int(smoothing))


@st.cache_resource(max_entries=4, show_spinner=False)
def _cached_catalogue(root: str, stamp: int) -> list[RunEntry]:
    return catalogue(root)


def cached_catalogue(runs_root: str | Path) -> list[RunEntry]:
    """``catalogue``, read again only when a run folder is added or removed (the folder's mtime changes)."""
    root = Path(runs_root)
    return _cached_catalogue(str(root), root.stat().st_mtime_ns if root.exists() else 0)
