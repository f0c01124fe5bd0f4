"""Page data and plotly figures, built once per run and data version and shared by every session.

Building a plotly figure costs tens of milliseconds of Python (validation), which a training thread in the same
process makes slower still. The figures of a run change only when a phase commits, so each builder here is
cached (``st.cache_resource``: the same read-only figure object, no copy) under ``(run id, data version)``,
where the version is the run's round table (one timestamp per committed phase). Revisiting a page while a round
trains then costs a cache lookup. Nothing here mutates a cached figure; pages only hand it to ``st.plotly_chart``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from comlrl_lab.names import metric_names
from comlrl_lab.names.phases import ALL_PHASES
from comlrl_lab.ui import charts, frames, services

CACHE_ENTRIES = 64


def data_version(rounds: pd.DataFrame) -> str:
    """A string that changes whenever a phase of the run commits (its rounds rows carry the commit times)."""
    if rounds.empty:
        return "empty"
    parts = []
    for row in rounds.itertuples(index=False):
        stamps = [getattr(row, f"{p}_at", None) for p in ALL_PHASES]
        parts.append(f"{int(row.round)}:{int(row.num_pairs)}:{int(row.num_drawn)}:" + ",".join(str(s) for s in stamps))
    return "|".join(parts)


def _store(run_id: str):
    return services.workspace().view(run_id).store


# -- Rounds ---------------------------------------------------------------------------------------------------


@st.cache_resource(max_entries=CACHE_ENTRIES, show_spinner=False)
def timeline(run_id: str, version: str) -> tuple[dict, go.Figure | None]:
    """(phase durations by (round, phase), Gantt figure or None) of ``run_id`` at ``version``."""
    store = _store(run_id)
    durations = frames.phase_durations(store.metrics(run_id, names=["time/"]))
    spans = frames.timeline(store.rounds(run_id), durations)
    return durations, (charts.phase_timeline(spans) if len(spans) else None)


# -- Learning -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tile:
    label: str
    value: str
    delta: str | None
    help: str
    inverse: bool = False


@dataclass(frozen=True)
class LearningData:
    tiles: list[Tile]
    figures: dict[str, go.Figure] = field(default_factory=dict)
    rounds: list[int] = field(default_factory=list)
    step_series: list[str] = field(default_factory=list)
    has_distributions: bool = False


#: The shaded 95% CI of the evaluation reward (from its logged standard error and n).
EVAL_BAND_NAME = "evaluation: 95% CI"

REWARD_COLORS = {
    "candidates: current agents": charts.CURRENT,
    "candidates: comparator": charts.COMPARATOR,
    "evaluation (task reward)": charts.EVAL,
}


#: The Learning page's training panels: figure name -> (metric kinds, title, y-axis title). DPO and Bradley-Terry
#: losses sit near log 2 while policy-learning losses can be a hundred times larger (on one axis the former look
#: flat at 0), a winner's per-token NLL is not a preference loss, and log-prob margins and reward-model margins are
#: different quantities: each gets its own panel.
TRAINING_PANELS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "loss": (
        metric_names.PREFERENCE_LOSS_KINDS,
        "Preference loss per round (mean over updates)",
        "DPO / Bradley-Terry loss",
    ),
    "nll": (
        metric_names.NLL_KINDS,
        "Winner NLL per round (madpo_nll_weight; mean over updates)",
        "per-token NLL of the winner",
    ),
    "rl_loss": (metric_names.RL_LOSS_KINDS, "Policy-learning loss per round (mean over updates)", "RL loss"),
    "margins": (metric_names.LOGPROB_MARGIN_KINDS, "Log-prob margins per round", "log-prob margin"),
    "reward_margins": (
        metric_names.REWARD_MARGIN_KINDS,
        "Reward-model margins per round",
        "reward margin R(w) - R(l)",
    ),
}


def training_panels(metrics: pd.DataFrame) -> dict[str, go.Figure]:
    """The ``TRAINING_PANELS`` that ``metrics`` has data for, each a figure of per-round means."""
    out = {}
    for name, (kinds, title, y_title) in TRAINING_PANELS.items():
        frame = frames.per_round(metrics, frames.training_metrics(metrics, kinds))
        if len(frame):
            out[name] = charts.round_curves(frame, title=title, y_title=y_title)
    return out


def code_eval_panels(metrics: pd.DataFrame) -> dict[str, go.Figure]:
    """A code task's evaluation per round (``frames.CODE_EVAL_PANELS``: pass@1, mean level reward), each line over
    the 95% CI the evaluation recorded; {} for other tasks."""
    out = {}
    for name, (label, y_title, mean, low, high, (bottom, top)) in frames.CODE_EVAL_PANELS.items():
        frame = frames.per_round(metrics, {label: (mean, None)})
        if len(frame):
            fig = charts.round_curves(
                frame, title=f"Evaluation: {label} per round", y_title=y_title, colors={label: charts.EVAL}
            )
            charts.add_interval_band(
                fig, frames.recorded_interval(metrics, low, high), color=charts.EVAL, name=f"{label}: 95% CI"
            )
            # The values' own bounds: a t interval of few programs can reach past them, the axis need not.
            pad = (top - bottom) * 0.03
            out[name] = fig.update_yaxes(range=[bottom - pad, top + pad])
    return out


#: The loss a Learning tile shows, in order of preference: the MADPO loss, else the reward model's Bradley-Terry fit.
HEADLINE_LOSSES = (metric_names.MADPO_LOSS, metric_names.BT_LOSS)


def learning_tiles(metrics: pd.DataFrame) -> list[Tile]:
    """The Learning page's headline numbers: latest round and its change, for rewards, loss, accuracy, win share."""
    rewards = frames.per_round(metrics, frames.REWARD_SERIES)
    losses = frames.per_round(metrics, frames.training_metrics(metrics, metric_names.PREFERENCE_LOSS_KINDS))
    accuracy = frames.per_round(metrics, frames.training_metrics(metrics, metric_names.ACCURACY_KINDS))
    win_share = frames.per_round(
        metrics, {"current agents' share of wins": (metric_names.CURRENT_WIN_SHARE, "collect")}
    )
    code = frames.per_round(metrics, {"pass@1": (metric_names.EVAL_PASS_AT_1, None)})
    recorded = set(losses["series"])
    loss = next((name for name in HEADLINE_LOSSES if name in recorded), "")
    tiles = []
    for label, frame, series, fmt in (
        ("eval reward", rewards, "evaluation (task reward)", "{:.4f}"),
        ("candidate reward", rewards, "candidates: current agents", "{:.4f}"),
        ("DPO / BT loss", losses, loss, "{:.4f}"),
        ("pair accuracy", accuracy, accuracy["series"].iloc[0] if len(accuracy) else "", "{:.1%}"),
        ("current wins", win_share, "current agents' share of wins", "{:.1%}"),
        *((("eval pass@1", code, "pass@1", "{:.1%}"),) if len(code) else ()),
    ):
        latest, delta = frames.latest_and_delta(frame, series)
        tiles.append(
            Tile(
                label,
                "–" if latest is None else fmt.format(latest),
                None if delta is None else fmt.format(delta),
                f"{series or label}: latest round, and the change from the round before",
                inverse="loss" in label,
            )
        )
    return tiles


@st.cache_resource(max_entries=CACHE_ENTRIES, show_spinner=False)
def learning(run_id: str, version: str) -> LearningData | None:
    """Headline numbers and per-round figures of the Learning page; None when the run has no metrics yet."""
    store = _store(run_id)
    metrics = store.metrics(run_id)
    if metrics.empty:
        return None
    rewards = frames.per_round(metrics, frames.REWARD_SERIES)
    accuracy = frames.per_round(metrics, frames.training_metrics(metrics, metric_names.ACCURACY_KINDS))
    win_share = frames.per_round(
        metrics, {"current agents' share of wins": (metric_names.CURRENT_WIN_SHARE, "collect")}
    )
    tiles = learning_tiles(metrics)

    figures: dict[str, go.Figure] = {}
    if len(rewards):
        figures["rewards"] = charts.round_curves(
            rewards, title="Rewards per round", y_title="mean reward", colors=REWARD_COLORS
        )
        charts.add_interval_band(
            figures["rewards"], frames.eval_interval(metrics), color=charts.EVAL, name=EVAL_BAND_NAME
        )
    figures.update(code_eval_panels(metrics))
    panels = training_panels(metrics)
    figures.update(panels)
    if len(accuracy) or len(win_share):
        figures["accuracy"] = charts.round_curves(
            pd.concat([accuracy, win_share], ignore_index=True),
            title="Pair accuracy and current agents' win share",
            y_title="share",
        )
    step_series = [trace.name for name in TRAINING_PANELS if name in panels for trace in panels[name].data]
    step_series += list(accuracy["series"].unique())

    rounds = [int(r) for r in store.rounds(run_id)["round"]]
    dist = _distributions(store, run_id, rounds)
    if len(dist):
        figures["boxes"] = charts.reward_boxes(dist, title="Candidate rewards by round (box: quartiles, dashed: mean)")
    return LearningData(tiles, figures, rounds, step_series, has_distributions=bool(len(dist)))


def _distributions(store, run_id: str, rounds: list[int]) -> pd.DataFrame:
    parts = []
    for r in rounds:
        dist = store.reward_distributions(run_id, r)
        parts.append(dist[dist["series"] == "candidate"].assign(round=r))
    if not parts:
        return pd.DataFrame(columns=["series", "side", "raw_reward", "reward", "round"])
    frame = pd.concat(parts, ignore_index=True)
    return frame[frame["side"].isin(["current", "comparator"])]


@st.cache_resource(max_entries=CACHE_ENTRIES, show_spinner=False)
def reward_histogram(run_id: str, version: str, round_index: int) -> go.Figure:
    store = _store(run_id)
    dist = _distributions(store, run_id, [round_index])
    return charts.reward_histogram(dist, title=f"Candidate rewards in round {round_index}")


@st.cache_resource(max_entries=CACHE_ENTRIES, show_spinner=False)
def logged_distribution(run_id: str, version: str, round_index: int) -> go.Figure | None:
    """The round's log_reward_distribution histograms, or None when the run did not log them."""
    frame = _store(run_id).binned_reward_distributions(run_id, round_index)
    if frame.empty:
        return None
    return charts.binned_distribution(frame, title=f"Logged reward distribution, round {round_index}")


def step_panels(names: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The per-update chart's panels: (y-axis title, series) per kind of metric, in the Learning page's order."""
    titles = {kind: y_title for kinds, _, y_title in TRAINING_PANELS.values() for kind in kinds}
    titles.update({kind: "share" for kind in metric_names.ACCURACY_KINDS})
    panels: dict[str, list[str]] = {}
    for name in names:
        panels.setdefault(titles.get(metric_names.kind_of(name), "value"), []).append(name)
    return list(panels.items())


@st.cache_resource(max_entries=CACHE_ENTRIES, show_spinner=False)
def step_curves(run_id: str, version: str, names: tuple[str, ...]) -> go.Figure | None:
    steps = frames.per_step(_store(run_id).metrics(run_id), list(names))
    return charts.step_curves(steps, step_panels(names), title="Per update") if len(steps) else None


# -- Replay and pairs -----------------------------------------------------------------------------------------


@st.cache_resource(max_entries=CACHE_ENTRIES, show_spinner=False)
def replay_draws(run_id: str, version: str, round_index: int) -> tuple[pd.DataFrame, go.Figure | None]:
    store = _store(run_id)
    sizes = frames.dataset_sizes(store.rounds(run_id))
    drawn = frames.replay_round(store.replay(run_id), sizes, round_index)
    fig = (
        charts.replay_draws(drawn, title=f"Pairs per round dataset, drawn into B^({round_index})")
        if len(drawn)
        else None
    )
    return drawn, fig


@st.cache_resource(max_entries=CACHE_ENTRIES, show_spinner=False)
def item_candidates(run_id: str, version: str, round_index: int, item: int) -> pd.DataFrame:
    frame = _store(run_id).candidates_for_item(run_id, round_index, item)
    return frame[frame["phase"] == "collect"].reset_index(drop=True) if "phase" in frame else frame


@st.cache_resource(max_entries=CACHE_ENTRIES, show_spinner=False)
def candidates_figure(
    run_id: str, version: str, round_index: int, item: int, winner: tuple | None, loser: tuple | None
) -> go.Figure:
    return charts.candidate_rewards(item_candidates(run_id, version, round_index, item), winner=winner, loser=loser)
