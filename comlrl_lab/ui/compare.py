"""Data of the Compare page: runs found under the runs folder, grouped over seeds, curves as mean ± 95% CI.

Runs are read from their ``spec.json`` (what they are) and their Parquet ``snapshots/`` (what they recorded), never
from their DuckDB files, which a running run (in this process or another) holds locked. ``catalogue`` lists the
runs; ``compare`` leaves out the runs that never committed a phase, counts a run once when another run has its
settings and seed (a base run and the seed-0 cell of a grid made from it are the same experiment), puts together
runs whose settings differ only in ``seed`` (``group_runs``; ``num_iterations`` is a run's length, not a setting),
and cuts each group's curves at the rounds all its runs reached. It builds everything the page draws (curve bands,
final and best evaluation as mean ± 95% CI, the config diff, pair statistics and their figures) in one pass;
``group_difference`` compares two groups with a CI (``data.intervals``). ``cached_compare`` keeps it per
selection and snapshot state. Only ``cached_compare`` touches Streamlit (its cache); no SQL here.
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

from comlrl_lab.data.tasks import get_task, list_tasks
from comlrl_lab.engine import ExperimentSpec
from comlrl_lab.engine.run import SNAPSHOT_DIR, SPEC_FILE
from comlrl_lab.engine.sweep import SWEEPS_DIR, sweep_memberships
from comlrl_lab.names import metric_names as mn
from comlrl_lab.store.snapshots import pair_rows, round_metrics
from comlrl_lab.ui import state
from comlrl_lab.ui.charts import COMPARATOR, CURRENT, SERIES_PALETTE
from comlrl_lab.ui.frames import has_any_tag
from comlrl_lab.ui.intervals import PAIRED, Interval, difference, mean_interval
from comlrl_lab.ui.stats import ci95_half_width, t975
from comlrl_lab.ui.url_state import UrlKey

EVALUATION = "Evaluation reward"
#: The curves compared: label -> (metric name, phase it is recorded in) in order of preference per run.
CURVES: dict[str, tuple[tuple[str, str], ...]] = {
    EVALUATION: ((mn.EVAL_REWARD_MEAN, "evaluate"),),
    "Candidate reward (current agents)": ((mn.REWARD_MEAN, "collect"),),
    "Pair accuracy": ((mn.ROUND_PREFIX + mn.MADPO_PAIR_ACCURACY, "train"),),
    "Loss": ((mn.ROUND_PREFIX + mn.MADPO_LOSS, "train"), (mn.ROUND_PREFIX + mn.RL_LOSS, "train")),
    "Joint margin": ((mn.ROUND_PREFIX + mn.MADPO_JOINT_MARGIN, "train"),),
    "Current agents' win share": ((mn.CURRENT_WIN_SHARE, "collect"),),
    # A code task's evaluation (humaneval); runs of other tasks have no such curves.
    "Evaluation pass@1": ((mn.EVAL_PASS_AT_1, "evaluate"),),
    "Evaluation level reward": ((mn.EVAL_LEVEL_REWARD_MEAN, "evaluate"),),
}
#: The curves whose values cannot leave [0, 1] (shares and accuracies); a band past that range is clipped to it.
UNIT_CURVES = frozenset({"Pair accuracy", "Current agents' win share", "Evaluation pass@1"})
#: The curves in the task reward's units: clipped to the task's ``reward_range`` when the task is a built-in one
#: (a task module of the user's declares none, so its bands stay as computed).
REWARD_CURVES = frozenset({EVALUATION, "Candidate reward (current agents)"})
#: Fewer seeds than this give a 95% band that is flagged as too wide to read (t = 12.7 at 2 seeds).
FEW_SEEDS = 3
#: Settings that never make two runs different experiments: the seed (the group's samples), bookkeeping, and the
#: number of rounds (round r does not depend on how many follow it; a 3-round run is the start of a 5-round one).
NOT_SETTINGS = frozenset({"seed", "name", "tags", "output_dir", "preference_replay_dir", "num_iterations"})
STATS_COLUMNS = ["curve", "group", "round", "mean", "low", "high", "n", "clipped"]
#: Longest setting value a label shows in full; longer ones are cut with "...".
VALUE_CHARS = 40


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
    """Runs whose settings agree in everything but the seed; ``label`` names what sets it apart, ``name`` ("A",
    "B", ...) stands for it where the label would not fit (pair statistics)."""

    label: str
    runs: tuple[RunEntry, ...]
    name: str = ""

    @property
    def settings(self) -> dict[str, Any]:
        return self.runs[0].settings

    @property
    def legend(self) -> str:
        """The name and the label, as the curves' legend shows them."""
        return f"{self.name}: {self.label}" if self.name else self.label


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
    outcomes: pd.DataFrame = field(default_factory=pd.DataFrame)  # OUTCOME_COLUMNS: final and best evaluation
    evaluations: pd.DataFrame = field(default_factory=pd.DataFrame)  # run_id, round, value: every run's evaluation
    unstarted: tuple[str, ...] = ()  # runs that never committed a phase, left out
    repeats: dict[str, tuple[str, ...]] = field(default_factory=dict)  # kept run -> runs with its settings and seed
    cuts: tuple[str, ...] = ()  # one line per group whose runs reached different rounds
    band_notes: tuple[str, ...] = ()  # bands clipped to their metric's range, and bands from too few seeds


# -- the runs -------------------------------------------------------------------------------------------------


def _settings(spec: ExperimentSpec) -> tuple[dict[str, Any], int | None]:
    """(every setting that defines the experiment, the seed): spec fields and the config with its defaults."""
    try:
        config = spec.validated_config().to_dict()
    except (ValueError, TypeError):  # a spec from another version: compare what it says
        config = dict(spec.config)
    data = spec.to_dict()
    top = {k: v for k, v in data.items() if k not in ("config", "model_config") and k not in NOT_SETTINGS}
    top.update({f"model_config.{k}": v for k, v in (spec.model_config or {}).items()})
    top.update({k: v for k, v in config.items() if k not in NOT_SETTINGS})
    seed = config.get("seed")
    return top, (int(seed) if isinstance(seed, int) else None)


def catalogue(runs_root: str | Path) -> list[RunEntry]:
    """Every engine run under ``runs_root`` (folders with spec.json), sorted by run id; unreadable ones skipped.
    A run's tags are its spec's and those of the sweeps that count it as a cell (a grid's base run)."""
    root = Path(runs_root)
    memberships = sweep_memberships(root)
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
                tags=tuple(dict.fromkeys([*spec.tags, *memberships.get(run_dir.name, ())])),
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
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 3] + "..."


def _group_name(index: int) -> str:
    """A, B, ..., Z, AA, AB, ...: short names for groups."""
    name = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        name = chr(ord("A") + rest) + name
    return name


def _labels(settings: Sequence[dict[str, Any]], differing: Sequence[str]) -> list[str]:
    """One label per group naming exactly the settings it differs in: ``name=value`` for each differing setting
    that is set (a setting left at None, one that does not apply under the group's modes, is left out unless the
    labels would coincide without it)."""
    full = [[f"{n}={_short(s.get(n))}" for n in differing] for s in settings]
    short = [[f"{n}={_short(s.get(n))}" for n in differing if s.get(n) is not None] for s in settings]
    labels = [", ".join(parts) for parts in short]
    if len(set(labels)) < len(labels) or not all(labels):
        labels = [", ".join(parts) for parts in full]
    return labels


def group_runs(entries: Sequence[RunEntry], *, by_seed: bool = True) -> list[Group]:
    """Groups of runs that differ only in ``seed`` (or one group per run), named A, B, ... and labelled by exactly
    the settings that differ between them."""
    buckets: dict[str, list[RunEntry]] = {}
    for entry in entries:
        buckets.setdefault(_key(entry.settings) if by_seed else entry.run_id, []).append(entry)
    members = list(buckets.values())
    differing = differing_settings([m[0].settings for m in members])
    labels = _labels([m[0].settings for m in members], differing) if differing else [""] * len(members)
    groups = []
    for i, (runs, label) in enumerate(zip(members, labels, strict=True)):
        label = label or f"{runs[0].algorithm} on {runs[0].task}"
        if not by_seed:
            label = f"{label} (seed {runs[0].seed}, {runs[0].run_id})"
        groups.append(Group(label, tuple(runs), _group_name(i)))
    return groups


def committed_phases(entry: RunEntry) -> int:
    """How many phases the run has committed, from its snapshot's manifest (0 when it has none)."""
    try:
        manifest = json.loads((entry.snapshot_dir / "_manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    phases = manifest.get("phases") if isinstance(manifest, dict) else None
    return len(phases) if isinstance(phases, dict) else 0


def deduplicate(entries: Sequence[RunEntry], phases: dict[str, int]) -> tuple[list[RunEntry], dict[str, tuple]]:
    """One run per (settings, seed): the same seed gives the same pairs, so a repeat is not another sample.

    The run that got furthest is kept (its first rounds are the others'); returns the kept runs in their order and,
    for each kept run that had repeats, their ids.
    """
    best: dict[str, RunEntry] = {}
    repeats: dict[str, list[str]] = {}
    for entry in entries:
        key = _key([entry.settings, entry.seed])
        kept = best.get(key)
        if kept is None:
            best[key] = entry
        elif phases.get(entry.run_id, 0) > phases.get(kept.run_id, 0):
            repeats.setdefault(key, []).append(kept.run_id)
            best[key] = entry
        else:
            repeats.setdefault(key, []).append(entry.run_id)
    kept_ids = {e.run_id for e in best.values()}
    ordered = [e for e in entries if e.run_id in kept_ids]
    return ordered, {best[key].run_id: tuple(ids) for key, ids in repeats.items()}


def config_diff(groups: Sequence[Group]) -> pd.DataFrame:
    """The settings that differ between groups: one row per setting, one column per group (by its name)."""
    names = differing_settings([g.settings for g in groups])
    data = {g.name or g.label: [_short(g.settings.get(n)) for n in names] for g in groups}
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

    Only the rounds every run of the group reached are kept: a mean over fewer seeds than its neighbours would
    jump. With ``smoothing`` > 1 each run's curve is first a trailing moving average over that many rounds, so the
    band stays a band over seeds. A group of one run has low = high = its value.
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
    size = {g.label: len(g.runs) for g in groups}
    agg = agg[agg["count"] == agg["group"].map(size)]
    half = [ci95_half_width(s, int(n)) if n > 1 else 0.0 for s, n in zip(agg["std"], agg["count"], strict=True)]
    agg["low"] = agg["mean"] - half
    agg["high"] = agg["mean"] + half
    # A band past the metric's possible range says nothing the range does not: clip it there, and mark the rows.
    ranges = {g.label: {c: curve_range(c, g) for c in CURVES} for g in groups}
    bounds = [ranges[g][c] for c, g in zip(agg["curve"], agg["group"], strict=True)]
    agg["clipped"] = [
        bool(b) and (lo < b[0] or hi > b[1]) for lo, hi, b in zip(agg["low"], agg["high"], bounds, strict=True)
    ]
    agg["low"] = [max(lo, b[0]) if b else lo for lo, b in zip(agg["low"], bounds, strict=True)]
    agg["high"] = [min(hi, b[1]) if b else hi for hi, b in zip(agg["high"], bounds, strict=True)]
    agg = agg.rename(columns={"count": "n"})
    order = {g.label: i for i, g in enumerate(groups)}
    agg = agg.sort_values(["curve", "group", "round"], key=lambda c: c.map(order) if c.name == "group" else c)
    return agg[STATS_COLUMNS].reset_index(drop=True)


def curve_range(curve: str, group: Group) -> tuple[float, float] | None:
    """The values ``curve`` can take for ``group``'s runs: [0, 1] for a share or an accuracy, the task's reward range
    for a reward of a built-in task; None when the range is not known (a loss, a margin, a user's task)."""
    if curve in UNIT_CURVES:
        return (0.0, 1.0)
    if curve in REWARD_CURVES and group.runs and group.runs[0].task in list_tasks():
        low, high = get_task(group.runs[0].task).reward_range
        return (float(low), float(high))
    return None


def band_notes(stats: pd.DataFrame, groups: Sequence[Group]) -> tuple[str, ...]:
    """One line per curve whose band was clipped to its range, and one per group with fewer than ``FEW_SEEDS`` seeds
    (its band is drawn, but a 95% interval from two seeds is too wide to read)."""
    notes = []
    clipped = stats[stats["clipped"]] if len(stats) else stats
    for curve in dict.fromkeys(clipped["curve"]) if len(clipped) else ():
        group = next(g for g in groups if g.label == clipped.loc[clipped["curve"] == curve, "group"].iloc[0])
        low, high = curve_range(curve, group)
        notes.append(f"{curve}: the 95% band is clipped to [{low:g}, {high:g}], the range the metric can take.")
    few = [g for g in groups if 1 < len(g.runs) < FEW_SEEDS]
    if few:
        names = ", ".join(g.name or g.label for g in few)
        notes.append(
            f"Group{'s' if len(few) > 1 else ''} {names}: {len(few[0].runs) if len(few) == 1 else 'fewer than 3'} "
            f"seeds, so the 95% bands and ± intervals are too wide to read (Student's t is {t975(1):.1f} for 2 seeds); run 3 or more "
            "seeds to tell the groups apart."
        )
    return tuple(notes)


def shared_round_notes(values: pd.DataFrame, groups: Sequence[Group]) -> tuple[str, ...]:
    """One line per group whose runs reached different rounds: where its curves stop and why."""
    notes = []
    reached = values.groupby("run_id")["round"].max() if len(values) else pd.Series(dtype=float)
    for g in groups:
        rounds = [int(reached.get(r.run_id, 0)) for r in g.runs]
        if len(set(rounds)) > 1:
            notes.append(
                f"{g.name}: curves stop at round {min(rounds)}, the last round all its {len(rounds)} runs reached "
                f"(the furthest reached round {max(rounds)})"
            )
    return tuple(notes)


#: The numbers table: per group, its evaluation reward at the last round all its runs reached, and at its best.
OUTCOME_COLUMNS = ["group", "runs", "final round", "final", "final ±", "best", "best ±"]


def _per_run(evaluations: pd.DataFrame, group: Group, upto: int) -> pd.DataFrame:
    ids = [r.run_id for r in group.runs]
    return evaluations[evaluations["run_id"].isin(ids) & (evaluations["round"] <= upto)]


def last_shared_round(evaluations: pd.DataFrame, group: Group) -> int | None:
    """The last round with an evaluation from every run of ``group``; None when one of them has none."""
    rounds = [set(evaluations.loc[evaluations["run_id"] == r.run_id, "round"]) for r in group.runs]
    shared = set.intersection(*rounds) if rounds else set()
    return int(max(shared)) if shared else None


def outcome_table(evaluations: pd.DataFrame, groups: Sequence[Group]) -> pd.DataFrame:
    """Each group's final evaluation (at the last round all its runs reached) and best (each run's highest up to
    that round), as mean ± 95% CI half-width over its runs. The best of noisy rounds is biased upward; the final is
    not."""
    rows = []
    for g in groups:
        last = last_shared_round(evaluations, g)
        if last is None:
            continue
        part = _per_run(evaluations, g, last)
        final = mean_interval(part.loc[part["round"] == last, "value"].tolist())
        best = mean_interval(part.groupby("run_id")["value"].max().tolist())
        rows.append([g.name, len(g.runs), last, final.mean, final.half_width, best.mean, best.half_width])
    return pd.DataFrame(rows, columns=OUTCOME_COLUMNS)


def group_difference(comparison: Comparison, first: str, second: str) -> tuple[Interval, int] | None:
    """Final evaluation of group ``first`` minus group ``second`` (by name) at the last round both reached, with
    its 95% CI: paired by seed when both ran the same seeds, Welch's otherwise (``intervals.difference``). None
    when the two share no evaluated round."""
    groups = {g.name: g for g in comparison.groups}
    a, b = groups[first], groups[second]
    rounds = [last_shared_round(comparison.evaluations, g) for g in (a, b)]
    if None in rounds:
        return None
    at = min(rounds)

    def by_seed(group: Group) -> dict[int, float]:
        part = comparison.evaluations[comparison.evaluations["round"] == at]
        values = dict(zip(part["run_id"], part["value"], strict=True))
        # A run without a seed in its spec cannot be paired: a key of its own makes the test Welch's.
        return {(r.seed if r.seed is not None else -1 - i): float(values[r.run_id]) for i, r in enumerate(group.runs)}

    return difference(by_seed(a), by_seed(b)), at


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


def _wrap(text: str, width: int = 60) -> str:
    """``text`` broken into lines of about ``width`` characters at its ", " separators (a legend does not wrap)."""
    lines, line = [], ""
    for part in text.split(", "):
        if line and len(line) + 2 + len(part) > width:
            lines.append(line + ",")
            line = part
        else:
            line = f"{line}, {part}" if line else part
    return "<br>".join([*lines, line])


def curves_figure(stats: pd.DataFrame, groups: Sequence[Group]) -> go.Figure | None:
    """One panel per curve, one colour per group: the mean line over a shaded 95% CI band."""
    curves = [c for c in CURVES if c in set(stats["curve"])]
    if not curves:
        return None
    cols = 2
    rows = math.ceil(len(curves) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=curves, horizontal_spacing=0.08, vertical_spacing=0.12)
    colors = {g.label: SERIES_PALETTE[i % len(SERIES_PALETTE)] for i, g in enumerate(groups)}
    legends = {g.label: _wrap(g.legend) for g in groups}
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
                    name=legends.get(str(label), str(label)),
                    line={"color": color},
                    customdata=part["n"].tolist(),
                    hovertemplate="round %{x}: %{y:.3f} (n=%{customdata})",
                    legendgroup=str(label),
                    showlegend=i == 0,
                ),
                row=row,
                col=col,
            )
        part = stats[stats["curve"] == curve]
        marks = []
        if part["clipped"].any():
            low, high = next(
                curve_range(curve, g) for g in groups if g.label in set(part.loc[part["clipped"], "group"])
            )
            marks.append(f"band clipped to [{low:g}, {high:g}]")
        if (part["n"].between(2, FEW_SEEDS - 1) & (part["high"] > part["low"])).any():  # a band is drawn
            marks.append(f"n<{FEW_SEEDS} seeds: band too wide to read")
        if marks:
            fig.add_annotation(
                text=" · ".join(marks),
                xref="x domain",
                yref="y domain",
                x=0.0,
                y=1.0,
                xanchor="left",
                yanchor="top",
                showarrow=False,
                font={"size": 11, "color": "#b45309"},
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
                "group": g.name,
                "settings": g.label,
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
        fig.add_trace(
            go.Box(
                y=gaps.tolist(),
                name=g.name,
                hovertext=_wrap(g.legend),
                marker_color=SERIES_PALETTE[i % len(SERIES_PALETTE)],
            )
        )
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
    hover = [_wrap(f"{name}: {label}") for name, label in zip(table["group"], table["settings"], strict=True)]
    for name, share, color in (
        ("current agents", table["current wins"], CURRENT),
        ("comparator", 1 - table["current wins"], COMPARATOR),
    ):
        fig.add_trace(go.Bar(x=table["group"], y=share, name=name, marker_color=color, hovertext=hover))
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
    phases = {e.run_id: committed_phases(e) for e in entries}
    started, repeats = deduplicate([e for e in entries if phases[e.run_id]], phases)
    groups = group_runs(started, by_seed=by_seed)
    dirs = [e.snapshot_dir for e in started]
    names = sorted({name for choices in CURVES.values() for name, _ in choices})
    curve_phases = sorted({phase for choices in CURVES.values() for _, phase in choices})
    metrics = round_metrics(dirs, names, curve_phases)
    values = curve_values(metrics)
    stats = curve_stats(values, groups, smoothing=smoothing)
    evaluations = values.loc[values["curve"] == EVALUATION, ["run_id", "round", "value"]].reset_index(drop=True)
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
        outcomes=outcome_table(evaluations, groups),
        evaluations=evaluations,
        unstarted=tuple(e.run_id for e in entries if not phases[e.run_id]),
        repeats=repeats,
        cuts=shared_round_notes(values, groups),
        band_notes=band_notes(stats, groups),
    )


# -- what the page prints -----------------------------------------------------------------------------------------


def left_out_lines(comparison: Comparison) -> list[str]:
    """The runs the comparison did not count, and why."""
    lines = []
    if comparison.unstarted:
        names = ", ".join(comparison.unstarted)
        lines.append(f"Left out, never started (no phase committed): {names}.")
    for kept, repeats in comparison.repeats.items():
        lines.append(
            f"Counted once: {', '.join(repeats)} {'has' if len(repeats) == 1 else 'have'} the settings and seed of "
            f"{kept} (same seed, same pairs), so only {kept} counts."
        )
    return lines


def groups_frame(comparison: Comparison) -> pd.DataFrame:
    """One row per group: its name, the settings that set it apart, its runs and their seeds."""
    return pd.DataFrame(
        [
            {
                "group": g.name,
                "settings that differ": g.label,
                "runs": len(g.runs),
                "seeds": ", ".join(str(r.seed) for r in g.runs),
            }
            for g in comparison.groups
        ],
        columns=["group", "settings that differ", "runs", "seeds"],
    )


def outcomes_display(outcomes: pd.DataFrame) -> pd.DataFrame:
    """``outcome_table`` as the page prints it: "0.512 ± 0.034" per cell, and n."""

    def cell(mean: float, half: float) -> str:
        return Interval(mean, half, 0).text()

    return pd.DataFrame(
        {
            "group": outcomes["group"],
            "n (runs)": outcomes["runs"],
            "final round": outcomes["final round"],
            "final evaluation": [cell(m, h) for m, h in zip(outcomes["final"], outcomes["final ±"], strict=True)],
            "best evaluation": [cell(m, h) for m, h in zip(outcomes["best"], outcomes["best ±"], strict=True)],
        }
    )


def difference_text(comparison: Comparison, first: str, second: str) -> str:
    """The final evaluation of one group minus another's, with its CI, the test used and why, in one sentence."""
    if first == second:
        return "Pick two different groups."
    found = group_difference(comparison, first, second)
    if found is None:
        return f"{first} and {second} share no evaluated round yet."
    interval, at = found
    if interval.method == PAIRED:
        how = (
            f"paired by seed over the {interval.n} seeds both ran: with one seed both groups draw their evaluation "
            "samples from the same per-row seeds (common random numbers), so the per-seed difference cancels the "
            "noise they share"
        )
    else:
        how = f"Welch's t interval over {interval.n} runs, since the groups did not run the same seeds"
    if math.isnan(interval.half_width):
        return (
            f"**{first} − {second}** at round {at}: {interval.text()} (one run per group is too few for an interval)."
        )
    verdict = "excludes 0" if interval.excludes_zero() else "includes 0: no clear difference"
    return f"**{first} − {second}** at round {at}: **{interval.text()}** (95% CI {verdict}); {how}."


#: The view choices the page keeps in its address (``url_state``).
URL_FILTERS = (state.COMPARE_ALGORITHMS, state.COMPARE_TASKS)


def url_keys(default_runs: Sequence[str] = ()) -> list[UrlKey]:
    """The Compare page's keys in the address; the runs only when they differ from every matching run."""
    return [
        UrlKey(state.COMPARE_ALGORITHMS, "list", []),
        UrlKey(state.COMPARE_TASKS, "list", []),
        UrlKey(state.COMPARE_TAGS, "list", []),
        UrlKey(state.COMPARE_RUNS, "list", list(default_runs)),
        UrlKey(state.COMPARE_BY_SEED, "bool", True),
        UrlKey(state.COMPARE_SMOOTHING, "int", 1),
        UrlKey(state.COMPARE_DIFF_A, "text", None),
        UrlKey(state.COMPARE_DIFF_B, "text", None),
    ]


URL_KEYS = url_keys()


def filter_options(entries: Sequence[RunEntry], key: str) -> list[str]:
    """The choices of one filter (algorithm, task or tag) over ``entries``, sorted."""
    if key == state.COMPARE_TAGS:
        return sorted({t for e in entries for t in e.tags})
    return sorted({e.algorithm if key == state.COMPARE_ALGORITHMS else e.task for e in entries})


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
def _cached_catalogue(root: str, stamp: tuple[int, int]) -> list[RunEntry]:
    return catalogue(root)


def cached_catalogue(runs_root: str | Path) -> list[RunEntry]:
    """``catalogue``, read again only when a run folder or a sweep is added or removed (a folder's mtime changes)."""
    root = Path(runs_root)
    stamp = tuple(p.stat().st_mtime_ns if p.exists() else 0 for p in (root, root / SWEEPS_DIR))
    return _cached_catalogue(str(root), stamp)
