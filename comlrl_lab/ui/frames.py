"""Shapes the store's DataFrames into what the pages draw: timelines, per-round curves, replay tables.

Pure pandas on frames the store's named queries returned, plus the replay weights of
``comlrl_lab.trainers.preference.rounds.replay`` (the trainer's own formula, so the page and the run never disagree).
No Streamlit, no SQL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from comlrl_lab.names import metric_names
from comlrl_lab.names.phases import ALL_PHASES, PHASES
from comlrl_lab.trainers.preference.config import MADPOIterConfig
from comlrl_lab.trainers.preference.config.fields import FLOAT, applies, field_specs
from comlrl_lab.trainers.preference.rounds.replay import (
    REPLAY_FIELDS,
    REPLAY_MODES,
    lambda_decay_weights,
    replay_weights,
)
from comlrl_lab.ui.stats import t975

PHASE_LABELS = {
    "collect": "Collect",
    "label": "Label",
    "select": "Select replay sample",
    "train": "Train",
    "evaluate": "Evaluate",
}

#: Rewards per round: series label -> (metric name, phase it is recorded in, or None for any).
REWARD_SERIES: dict[str, tuple[str, str | None]] = {
    "candidates: current agents": (metric_names.REWARD_MEAN, "collect"),
    "candidates: comparator": (metric_names.COMPARATOR_REWARD_MEAN, "collect"),
    "evaluation (task reward)": (metric_names.EVAL_REWARD_MEAN, None),
}


# -- rounds and phases --------------------------------------------------------------------------------------


def phase_durations(metrics: pd.DataFrame) -> dict[tuple[int, str], float]:
    """(round, phase) -> seconds, from the ``time/<phase>_seconds`` metric each phase records."""
    out: dict[tuple[int, str], float] = {}
    if metrics.empty:
        return out
    timed = metrics[metrics["name"].str.startswith("time/") & metrics["name"].str.endswith("_seconds")]
    for row in timed.itertuples(index=False):
        phase = str(row.name)[len("time/") : -len("_seconds")]
        if phase in ALL_PHASES and row.round is not None and not pd.isna(row.round):
            out[(int(row.round), phase)] = float(row.value)
    return out


def timeline(rounds: pd.DataFrame, durations: Mapping[tuple[int, str], float]) -> pd.DataFrame:
    """One row per committed phase: round, phase, start, finish, seconds (start = commit time - duration)."""
    rows = []
    for row in rounds.itertuples(index=False):
        for phase in ALL_PHASES:
            finish = getattr(row, f"{phase}_at", None)
            if finish is None or pd.isna(finish):
                continue
            seconds = float(durations.get((int(row.round), phase), 0.0))
            finish = pd.Timestamp(finish)
            rows.append(
                {
                    "round": int(row.round),
                    "phase": phase,
                    "start": finish - pd.Timedelta(seconds=seconds),
                    "finish": finish,
                    "seconds": seconds,
                }
            )
    return pd.DataFrame(rows, columns=["round", "phase", "start", "finish", "seconds"])


CHECKPOINT_PREFIX = metric_names.CHECKPOINT_PREFIX
CHECKPOINT_COLUMNS = {
    metric_names.CHECKPOINT_SECONDS: "seconds holding up training",
    metric_names.CHECKPOINT_BACKGROUND_SECONDS: "seconds in the background",
    metric_names.CHECKPOINT_BYTES: "MB written",
}


#: Every ``checkpoint/<phase>_...`` metric name -> the ``CHECKPOINT_COLUMNS`` template it was made from.
_CHECKPOINT_TEMPLATES = {
    metric_names.name(template, phase=phase): template for phase in ALL_PHASES for template in CHECKPOINT_COLUMNS
}


def checkpoint_costs(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per checkpointed phase, in run order: round, phase, then the ``CHECKPOINT_COLUMNS`` (NaN where a
    figure was not recorded: the background seconds of a checkpoint written in the foreground)."""
    columns = ["round", "phase", *CHECKPOINT_COLUMNS.values()]
    if metrics.empty:
        return pd.DataFrame(columns=columns)
    costs = metrics.assign(name=metrics["name"].map(_CHECKPOINT_TEMPLATES)).dropna(subset=["name"])
    if costs.empty:
        return pd.DataFrame(columns=columns)
    wide = costs.pivot_table(index=["round", "phase"], columns="name", values="value", aggfunc="last").reset_index()
    wide = wide.reindex(columns=["round", "phase", *CHECKPOINT_COLUMNS])
    wide[metric_names.CHECKPOINT_BYTES] = wide[metric_names.CHECKPOINT_BYTES] / 1e6
    wide = wide.rename(columns=CHECKPOINT_COLUMNS)
    wide["order"] = wide["phase"].map(ALL_PHASES.index)
    wide = wide.sort_values(["round", "order"]).drop(columns="order").reset_index(drop=True)
    wide["round"] = wide["round"].astype(int)
    wide["phase"] = wide["phase"].map(PHASE_LABELS)
    return wide[columns]


def checkpoint_display(costs: pd.DataFrame) -> pd.DataFrame:
    """``checkpoint_costs`` as the Rounds page shows them: no background column when nothing was written in the
    background, and 0 s for the checkpoints written in the foreground when something was (a table cell would
    otherwise read "None")."""
    background = CHECKPOINT_COLUMNS[metric_names.CHECKPOINT_BACKGROUND_SECONDS]
    if costs[background].isna().all():
        return costs.drop(columns=background)
    return costs.fillna({background: 0.0})


def checkpoint_summary(costs: pd.DataFrame) -> str:
    """One line of totals over ``checkpoint_costs`` rows."""
    blocked, background, written = (costs[c].sum() for c in CHECKPOINT_COLUMNS.values())
    parts = [f"{len(costs)} checkpoint{'s' if len(costs) != 1 else ''}", f"{blocked:.2f} s holding up training"]
    if costs[CHECKPOINT_COLUMNS[metric_names.CHECKPOINT_BACKGROUND_SECONDS]].notna().any():
        parts.append(f"{background:.2f} s written in the background")
    parts.append(f"{written:.2f} MB written")
    return " · ".join(parts) + ". Set by save_strategy, save_total_limit and save_in_background."


#: The count columns of the phase table: label -> column of the store's rounds table. Evaluation samples are
#: counted apart from the collected candidates that pairs are made of.
ROUND_COUNTS = {
    "candidates": "num_candidates",
    "pairs": "num_pairs",
    "drawn for training": "num_drawn",
    "evaluation samples": "num_eval_samples",
}


def phase_table(
    rounds: pd.DataFrame,
    durations: Mapping[tuple[int, str], float],
    num_rounds: int | None,
    cursor: tuple[int, str | None],
    running: tuple[int, str] | None = None,
    phases: Sequence[str] = PHASES,
) -> pd.DataFrame:
    """Round-by-phase status grid for the Rounds page: "✓ 3.2 s" (its duration), "running…", "next" or "·", one
    column per phase of the run's rounds (``phases``: with a label phase for a human or judge run)."""
    done = {}
    info = {}
    for row in rounds.itertuples(index=False):
        info[int(row.round)] = row
        for phase in phases:
            at = getattr(row, f"{phase}_at", None)
            if at is not None and not pd.isna(at):
                done[(int(row.round), phase)] = pd.Timestamp(at)
    last_round = max([num_rounds or 0, *info, cursor[0] if cursor[1] else 0])
    records = []
    for r in range(1, last_round + 1):
        record: dict[str, object] = {"round": r}
        for phase in phases:
            if (r, phase) in done:
                seconds = durations.get((r, phase))
                record[PHASE_LABELS[phase]] = (
                    f"✓ {seconds:.1f} s" if seconds is not None else f"✓ {done[(r, phase)]:%H:%M:%S}"
                )
            elif running == (r, phase):
                record[PHASE_LABELS[phase]] = "running…"
            elif cursor == (r, phase):
                record[PHASE_LABELS[phase]] = "next"
            else:
                record[PHASE_LABELS[phase]] = "·"
        row = info.get(r)
        for label, column in ROUND_COUNTS.items():
            value = getattr(row, column, None) if row is not None else None
            # A round not reached yet has no counts: a dash, not the table's "None".
            record[label] = f"{int(value):,}" if value is not None and not pd.isna(value) else "–"
        records.append(record)
    return pd.DataFrame(records)


# -- metrics ------------------------------------------------------------------------------------------------


def per_round(metrics: pd.DataFrame, series: Mapping[str, tuple[str, str | None]]) -> pd.DataFrame:
    """Mean value per round of each named metric: columns round, series, value."""
    parts = []
    for label, (name, phase) in series.items():
        rows = metrics[metrics["name"] == name]
        if phase is not None:
            rows = rows[rows["phase"] == phase]
        if rows.empty:
            continue
        means = rows.groupby("round", as_index=False)["value"].mean()
        means["series"] = label
        parts.append(means)
    if not parts:
        return pd.DataFrame(columns=["round", "series", "value"])
    out = pd.concat(parts, ignore_index=True)
    out = out[out["value"].map(lambda v: v is not None and not (isinstance(v, float) and math.isnan(v)))]
    return out[["round", "series", "value"]]


def training_metrics(metrics: pd.DataFrame, kinds: Sequence[str]) -> dict[str, tuple[str, str | None]]:
    """Per-update training metrics of the given ``metric_names`` kinds (round/ summaries and evaluation left out)."""
    names = sorted(
        n
        for n in metrics["name"].unique()
        if metric_names.kind_of(n) in kinds and not n.startswith((metric_names.ROUND_PREFIX, metric_names.EVAL_PREFIX))
    )
    return {n: (n, None) for n in names}


def per_step(metrics: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    rows = metrics[metrics["name"].isin(list(names)) & (metrics["phase"] == "train")]
    return rows.rename(columns={"name": "series"})[["step", "round", "series", "value"]]


def eval_interval(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per round, the evaluation reward's 95% confidence interval: columns round, low, high.

    mean ± t_{0.975, n-1} · SE, from the standard error and n each evaluation logs; empty for runs that logged
    no standard error (imports, older runs). With several samples per eval item the SE is the stratified one, of
    n - items degrees of freedom, not n - 1; for n >= 100 and k >= 2 the two t quantiles differ by under 1%.
    """
    names = [metric_names.EVAL_REWARD_MEAN, metric_names.EVAL_REWARD_SEM, metric_names.EVAL_NUM_SAMPLES]
    rows = metrics[metrics["name"].isin(names)]
    if rows.empty:
        return pd.DataFrame(columns=["round", "low", "high"])
    wide = rows.groupby(["round", "name"])["value"].mean().unstack("name")
    if not set(names) <= set(wide.columns):
        return pd.DataFrame(columns=["round", "low", "high"])
    half = wide[metric_names.EVAL_REWARD_SEM] * wide[metric_names.EVAL_NUM_SAMPLES].map(lambda n: t975(int(n) - 1))
    mean = wide[metric_names.EVAL_REWARD_MEAN]
    out = pd.DataFrame({"round": wide.index.astype(int), "low": (mean - half).values, "high": (mean + half).values})
    return out.dropna().reset_index(drop=True)


# -- reward breakdowns (a task whose reward explains itself: reward_details) ------------------------------------

#: Keys of a breakdown the Pairs page shows on their own: the headline, the reward, the program and why it stopped.
BREAKDOWN_SHOWN = ("summary", "reward", "program", "error")


def breakdown_summary(details: Mapping[str, Any] | None) -> str:
    """One line on why a candidate scored as it did: the breakdown's own ``summary`` ("parses · 5/7 tests · uses
    aux"), else its other fields as ``name: value``; "" without a breakdown."""
    if not details:
        return ""
    if details.get("summary"):
        return str(details["summary"])
    return " · ".join(f"{k}: {v}" for k, v in details.items() if k not in BREAKDOWN_SHOWN)


def breakdown_column(details_json: Sequence[Any]) -> list[str]:
    """``breakdown_summary`` of each stored ``details_json`` (NULL: "")."""
    return [breakdown_summary(json.loads(text)) if isinstance(text, str) and text else "" for text in details_json]


#: A code task's evaluation (``eval/code/*``, recorded with its 95% CI): panel -> (series label, y-axis title, mean,
#: CI low, CI high, the values' bounds, which the y axis shows).
CODE_EVAL_PANELS: dict[str, tuple[str, str, str, str, str, tuple[float, float]]] = {
    "pass_at_1": (
        "pass@1",
        "share passing every test",
        metric_names.EVAL_PASS_AT_1,
        metric_names.EVAL_PASS_AT_1_LOW,
        metric_names.EVAL_PASS_AT_1_HIGH,
        (0.0, 1.0),
    ),
    "level_reward": (
        "mean level reward",
        "level reward, raw (0 to 4)",
        metric_names.EVAL_LEVEL_REWARD_MEAN,
        metric_names.EVAL_LEVEL_REWARD_LOW,
        metric_names.EVAL_LEVEL_REWARD_HIGH,
        (0.0, 4.0),
    ),
}


def recorded_interval(metrics: pd.DataFrame, low: str, high: str) -> pd.DataFrame:
    """Per round, a 95% CI the evaluation recorded as two metrics: columns round, low, high (rounds lacking either
    end left out)."""
    ends = per_round(metrics, {"low": (low, None), "high": (high, None)})
    if ends.empty:
        return pd.DataFrame(columns=["round", "low", "high"])
    wide = ends.pivot_table(index="round", columns="series", values="value")
    if not {"low", "high"} <= set(wide.columns):
        return pd.DataFrame(columns=["round", "low", "high"])
    out = wide[["low", "high"]].dropna().reset_index()
    out["round"] = out["round"].astype(int)
    out.columns.name = None
    return out[["round", "low", "high"]]


def latest_and_delta(frame: pd.DataFrame, series: str) -> tuple[float | None, float | None]:
    """(value in the latest round, change from the round before) of one series of a ``per_round`` frame."""
    rows = frame[frame["series"] == series].sort_values("round")
    if rows.empty:
        return None, None
    latest = float(rows["value"].iloc[-1])
    delta = latest - float(rows["value"].iloc[-2]) if len(rows) > 1 else None
    return latest, delta


# -- replay -------------------------------------------------------------------------------------------------


def dataset_sizes(rounds: pd.DataFrame) -> dict[int, int]:
    """Round -> pairs collected (the round datasets of the replay buffer)."""
    return {int(r.round): int(r.num_pairs) for r in rounds.itertuples(index=False)}


def replay_round(replay: pd.DataFrame, sizes: Mapping[int, int], round_index: int) -> pd.DataFrame:
    """What round ``round_index``'s training sample drew: source_round, weight, drawn_count, available."""
    rows = replay[replay["round"] == round_index].copy()
    rows["available"] = [int(sizes.get(int(s), 0)) for s in rows["source_round"]]
    return rows.sort_values("source_round")[["source_round", "weight", "drawn_count", "available"]].reset_index(
        drop=True
    )


def replay_setting(settings: Mapping[str, Any]) -> str:
    """The values that apply under the mode of ``settings`` (config field names -> values), by the symbol their
    field's metadata gives them: " (λ = 0.5)", " (k = 2)", or "" for a mode that takes none."""
    specs = field_specs(MADPOIterConfig)
    parts = [
        f"{specs[name].symbol} = {settings[name]:g}"
        for name in REPLAY_FIELDS
        if "symbol" in specs[name].metadata and settings.get(name) is not None and applies(specs, name, settings)
    ]
    return f" ({', '.join(parts)})" if parts else ""


def _viewed_fields() -> list[str]:
    """The replay fields the Replay page lets the user vary (the ones with a symbol: k and λ)."""
    specs = field_specs(MADPOIterConfig)
    return [name for name in REPLAY_FIELDS if "symbol" in specs[name].metadata]


def replay_labels() -> dict[str, str]:
    """Each varied field's label: its symbol and the modes it applies under, "λ (lambda_decay)"."""
    specs = field_specs(MADPOIterConfig)
    return {
        name: f"{specs[name].symbol} ({', '.join(specs[name].applies_when['preference_replay_mode'])})"
        for name in _viewed_fields()
    }


def replay_view_start(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Where the Replay page's k and λ start: a run's own values (its stored ``settings``), else the values the
    Setup form suggests for them (their metadata), as int or float by the field's kind."""
    specs = field_specs(MADPOIterConfig)
    start = {}
    for name in _viewed_fields():
        value = settings.get(name)
        value = specs[name].suggested if value is None else value
        start[name] = float(value) if specs[name].kind == FLOAT else int(value)
    return start


def mode_weights(
    sizes: Mapping[int, int],
    round_index: int,
    *,
    view: Mapping[str, Any],
    run: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """For each replay mode, the weight it gives each round dataset at ``round_index`` (blank: not eligible).

    The rows of the modes use the values in ``view`` (k, λ: replay fields by their config names); with ``run`` (a
    run's stored settings), a first row shows the run's own mode with the run's own values, so moving the view's λ
    never relabels what the run did.
    """
    rounds = sorted(r for r in sizes if r <= round_index)
    rows = []
    for mode in REPLAY_MODES:
        settings = {**view, "preference_replay_mode": mode}
        rows.append((f"{mode}{replay_setting(settings)}", settings))
    if run is not None and run.get("preference_replay_mode") in REPLAY_MODES:
        rows.insert(0, (f"this run: {run['preference_replay_mode']}{replay_setting(run)}", run))
    records = []
    for label, settings in rows:
        weights = dict(replay_weights(settings, {r: sizes[r] for r in rounds}, current_round=round_index))
        record: dict[str, object] = {"mode": label}
        for r in rounds:
            record[f"round {r} ({sizes[r]} pairs)"] = round(weights[r], 4) if r in weights else math.nan
        record["datasets used"] = len(weights)
        records.append(record)
    return pd.DataFrame(records)


def mode_weights_view(table: pd.DataFrame) -> pd.DataFrame:
    """``mode_weights`` as the Replay page prints it: four decimals, and an empty cell where a mode cannot use a
    dataset. The weights become text because st.dataframe draws a missing number as "None" whatever a Styler says."""
    rounds = [c for c in table.columns if c.startswith("round ")]
    return table.assign(**{c: [f"{w:.4f}" if not math.isnan(w) else "" for w in table[c]] for c in rounds})


def eligible_rounds(sizes: Mapping[int, int], round_index: int) -> list[int]:
    """Non-empty round datasets up to ``round_index``, oldest first (what lambda_decay and all_history use)."""
    return sorted(r for r, n in sizes.items() if r <= round_index and n > 0)


def lambda_table(rounds: Sequence[int], lam: float, sample_size: int | None = None) -> pd.DataFrame:
    """λ-decay weight of each dataset (oldest first) and, with ``sample_size``, the pairs it is expected to give."""
    weights = lambda_decay_weights(len(rounds), lam)
    frame = pd.DataFrame({"source round": list(rounds), "age": list(range(len(rounds) - 1, -1, -1)), "weight": weights})
    if sample_size is not None:
        frame["expected pairs"] = [w * sample_size for w in weights]
    return frame


# -- run list -----------------------------------------------------------------------------------------------

#: Orders of the run list: label -> (column, ascending).
RUN_SORTS: dict[str, tuple[str, bool]] = {
    "newest first": ("modified", False),
    "oldest first": ("modified", True),
    "run id": ("run_id", True),
    "algorithm": ("algorithm", True),
    "task": ("task", True),
    "status": ("status", True),
}


def has_any_tag(run_tags: Sequence[str], wanted: Sequence[str]) -> bool:
    """Whether a run carrying ``run_tags`` (its ``ExperimentSpec.tags``) passes a tag filter set to ``wanted``: an
    empty filter passes every run, otherwise the run needs one of the tags. The Setup run list and the Compare page
    both filter with it."""
    return not wanted or not set(wanted).isdisjoint(run_tags)


def filter_runs(
    runs: pd.DataFrame,
    *,
    algorithms: Sequence[str] = (),
    tasks: Sequence[str] = (),
    statuses: Sequence[str] = (),
    tags: Sequence[str] = (),
    text: str = "",
    sort: str = "newest first",
) -> pd.DataFrame:
    """The runs that match every filter given (an empty filter matches all), in the order ``sort`` names.

    ``tags`` matches the runs' ``tags`` column (``has_any_tag``); ``text`` matches anywhere in the run id.
    """
    keep = pd.Series(True, index=runs.index)
    for column, wanted in (("algorithm", algorithms), ("task", tasks), ("status", statuses)):
        if wanted:
            keep &= runs[column].isin(list(wanted))
    if tags:
        keep &= runs["tags"].map(lambda run_tags: has_any_tag(run_tags, tags)).astype(bool)
    if text.strip():
        keep &= runs["run_id"].str.contains(text.strip(), case=False, regex=False)
    column, ascending = RUN_SORTS[sort]
    return runs[keep].sort_values(column, ascending=ascending, na_position="last", kind="stable", ignore_index=True)
