"""Plotly figures of the workbench, built from the store's DataFrames; pure functions, no Streamlit calls.

Each function takes plain frames or lists and returns a ``plotly.graph_objects.Figure``. Colours are fixed per
meaning across pages: the current agents blue, the comparator orange, evaluation green, and one colour per phase.
This module does not read the store or compute weights; pages hand it what to draw.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

CURRENT = "#2563eb"
COMPARATOR = "#ea580c"
EVAL = "#16a34a"
MUTED = "#94a3b8"
SIDE_COLORS = {"current": CURRENT, "comparator": COMPARATOR, "eval": EVAL}
PHASE_COLORS = {
    "collect": "#2563eb",
    "label": "#d97706",
    "select": "#9333ea",
    "train": "#dc2626",
    "evaluate": "#16a34a",
}
SERIES_PALETTE = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777")


def _layout(fig: go.Figure, title: str | None = None, *, height: int = 320, **kwargs) -> go.Figure:
    # The legend sits under the plot (container coordinates), so it never covers the title or the data.
    fig.update_layout(
        title={"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}} if title else None,
        height=height,
        margin={"l": 10, "r": 10, "t": 44 if title else 16, "b": 10},
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0, "xanchor": "left"},
        # A vertical toolbar sits at the right edge, beside the plot instead of over the left-aligned title.
        modebar={"orientation": "v"},
        **kwargs,
    )
    return fig


def round_axis(fig: go.Figure, rounds: Sequence[int]) -> go.Figure:
    fig.update_xaxes(title="round", tickmode="array", tickvals=list(rounds), ticktext=[str(r) for r in rounds])
    return fig


def lambda_weights(
    rounds: Sequence[int], weights: Sequence[float], *, lam: float, highlight: str = CURRENT, title: str | None = None
) -> go.Figure:
    """λ-decay weight of each round dataset, oldest left, newest right, labelled with its value."""
    labels = [f"round {r}" for r in rounds]
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=list(weights),
            marker_color=highlight,
            text=[f"{w:.3f}" for w in weights],
            textposition="outside",
            hovertemplate="%{x}<br>weight %{y:.4f}<extra></extra>",
            name="weight",
        )
    )
    fig.update_yaxes(title="weight", range=[0, max([*weights, 0.01]) * 1.25])
    fig.update_xaxes(title="round dataset (oldest → newest)", type="category")
    return _layout(fig, title or f"λ-decay weights, λ = {lam:g}, K = {len(rounds)}")


def replay_draws(frame: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Per source round: pairs available, pairs drawn into the training sample, and the weight used (label)."""
    labels = [f"round {int(r)}" for r in frame["source_round"]]
    fig = go.Figure()
    if "available" in frame:
        fig.add_bar(x=labels, y=frame["available"], name="pairs in the dataset", marker_color=MUTED, opacity=0.55)
    fig.add_bar(
        x=labels,
        y=frame["drawn_count"],
        name="drawn into the training sample",
        marker_color=CURRENT,
        text=[f"w={w:.3f}" for w in frame["weight"]],
        textposition="outside",
        hovertemplate="%{x}<br>%{y} pairs drawn<extra></extra>",
    )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="source round (oldest → newest)", type="category")
    fig.update_yaxes(title="pairs")
    return _layout(fig, title)


#: Each series of a chart has its own dash and marker as well as its colour, so a line that lies on another (one
#: agent's margin on the joint margin) still shows.
SERIES_DASHES = ("solid", "dash", "dot", "dashdot", "longdash")
SERIES_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x")


def round_curves(frame: pd.DataFrame, *, title: str, y_title: str, colors: dict[str, str] | None = None) -> go.Figure:
    """Lines over rounds. ``frame``: columns round, series, value (one row per round and series)."""
    fig = go.Figure()
    colors = colors or {}
    for i, (series, part) in enumerate(frame.groupby("series", sort=False)):
        part = part.sort_values("round")
        fig.add_scatter(
            x=part["round"],
            y=part["value"],
            mode="lines+markers",
            name=str(series),
            marker={"symbol": SERIES_SYMBOLS[i % len(SERIES_SYMBOLS)], "size": 8},
            line={
                "color": colors.get(str(series), SERIES_PALETTE[i % len(SERIES_PALETTE)]),
                "width": 2,
                "dash": SERIES_DASHES[i % len(SERIES_DASHES)],
            },
            hovertemplate=f"{series}<br>round %{{x}}: %{{y:.4g}}<extra></extra>",
        )
    fig.update_yaxes(title=y_title)
    rounds = sorted(int(r) for r in frame["round"].unique()) if len(frame) else []
    return _layout(round_axis(fig, rounds), title)


def add_interval_band(fig: go.Figure, frame: pd.DataFrame, *, color: str, name: str) -> go.Figure:
    """Shade ``frame``'s interval (columns round, low, high) under the lines already in ``fig``."""
    if frame.empty:
        return fig
    part = frame.sort_values("round")
    rounds = part["round"].tolist()
    fig.add_scatter(
        x=rounds + rounds[::-1],
        y=part["high"].tolist() + part["low"].tolist()[::-1],
        fill="toself",
        mode="lines",
        line={"width": 0, "color": color},
        fillcolor=color,
        opacity=0.18,
        name=name,
        hoverinfo="skip",
    )
    return fig


def step_curves(frame: pd.DataFrame, panels: Sequence[tuple[str, Sequence[str]]], *, title: str) -> go.Figure:
    """Per-update values, one panel per (y-axis title, series) in ``panels``, stacked on a shared update axis:
    quantities of different kinds (a loss near 0.7, a margin near 30, an accuracy in [0, 1]) never share an axis.
    ``frame``: columns step, round, series, value."""
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.06)
    color = 0
    for row, (y_title, names) in enumerate(panels, start=1):
        for series in names:
            part = frame[frame["series"] == series].sort_values("step")
            fig.add_scatter(
                x=part["step"],
                y=part["value"],
                mode="lines+markers",
                name=str(series),
                line={"color": SERIES_PALETTE[color % len(SERIES_PALETTE)], "width": 1.5},
                marker={"size": 5},
                customdata=part["round"],
                hovertemplate=f"{series}<br>update %{{x}} (round %{{customdata}}): %{{y:.4g}}<extra></extra>",
                row=row,
                col=1,
            )
            color += 1
        fig.update_yaxes(title=y_title, row=row, col=1)
    fig.update_xaxes(title="optimiser update", row=len(panels), col=1)
    return _layout(fig, title, height=80 + 220 * len(panels))


def reward_histogram(frame: pd.DataFrame, *, title: str, bins: int = 20) -> go.Figure:
    """Overlaid reward histograms per side. ``frame``: columns side, reward."""
    fig = go.Figure()
    for side, part in frame.groupby("side", sort=False):
        values = part["reward"].dropna()
        fig.add_histogram(
            x=values,
            name=f"{side} (mean {values.mean():.3f}, n={len(values)})",
            nbinsx=bins,
            opacity=0.6,
            marker_color=SIDE_COLORS.get(str(side), MUTED),
        )
        if len(values):
            fig.add_vline(x=float(values.mean()), line_dash="dash", line_color=SIDE_COLORS.get(str(side), MUTED))
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title="reward")
    fig.update_yaxes(title="candidates")
    return _layout(fig, title)


def binned_distribution(frame: pd.DataFrame, *, title: str) -> go.Figure:
    """The histograms a run logged with log_reward_distribution (CoMLRL's 16 bins over reward_range), one round.

    ``frame``: rows of series (candidate / selected), side, bin_edges, counts, sample_count. Candidate bars are
    solid, the training pairs' (selected) bars hatched, each side in its colour.
    """
    fig = go.Figure()
    for row in frame.itertuples(index=False):
        edges = [float(e) for e in row.bin_edges]
        centers = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
        selected = row.series == "selected"
        fig.add_bar(
            x=centers,
            y=[int(c) for c in row.counts],
            width=[b - a for a, b in zip(edges[:-1], edges[1:])],
            name=f"{row.series} {row.side} (n={int(row.sample_count)})",
            marker_color=SIDE_COLORS.get(str(row.side), MUTED),
            marker_pattern_shape="/" if selected else "",
            opacity=0.5 if selected else 0.8,
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="raw reward (bins over reward_range)")
    fig.update_yaxes(title="count")
    return _layout(fig, title)


def reward_boxes(frame: pd.DataFrame, *, title: str) -> go.Figure:
    """Reward distribution per round and side. ``frame``: columns round, side, reward."""
    fig = go.Figure()
    for side, part in frame.groupby("side", sort=False):
        fig.add_box(
            x=part["round"],
            y=part["reward"],
            name=str(side),
            marker_color=SIDE_COLORS.get(str(side), MUTED),
            boxmean=True,
        )
    fig.update_layout(boxmode="group")
    fig.update_yaxes(title="reward")
    rounds = sorted(int(r) for r in frame["round"].unique()) if len(frame) else []
    return _layout(round_axis(fig, rounds), title)


def candidate_rewards(
    frame: pd.DataFrame, *, winner: tuple[str, int] | None, loser: tuple[str, int] | None
) -> go.Figure:
    """Every candidate of one item by side; the pair's winner and loser ringed. ``frame``: side, candidate_index, reward."""
    fig = go.Figure()
    for side, part in frame.groupby("side", sort=False):
        fig.add_scatter(
            x=part["candidate_index"],
            y=part["reward"],
            mode="markers",
            name=str(side),
            marker={"color": SIDE_COLORS.get(str(side), MUTED), "size": 11, "opacity": 0.85},
            hovertemplate=f"{side} candidate %{{x}}<br>reward %{{y:.4g}}<extra></extra>",
        )
    for role, mark, color in (("winner", winner, "#15803d"), ("loser", loser, "#b91c1c")):
        if mark is None:
            continue
        hit = frame[(frame["side"] == mark[0]) & (frame["candidate_index"] == mark[1])]
        if len(hit):
            fig.add_scatter(
                x=hit["candidate_index"],
                y=hit["reward"],
                mode="markers+text",
                name=role,
                text=[role],
                textposition="top center",
                cliponaxis=False,
                marker={"symbol": "circle-open", "size": 20, "line": {"width": 3, "color": color}},
            )
    fig.update_xaxes(title="candidate index", dtick=1)
    fig.update_yaxes(title="reward")
    if len(frame):
        # Headroom above the best candidate, where the "winner" label sits (it was cut off at the plot's edge).
        low, high = float(frame["reward"].min()), float(frame["reward"].max())
        pad = 0.12 * (high - low) or 0.1
        fig.update_yaxes(range=[low - pad, high + 2 * pad])
    return _layout(fig, "Every candidate of this item", height=300)


def phase_timeline(frame: pd.DataFrame) -> go.Figure:
    """Gantt chart of finished phases: one bar per phase from its start to its commit. ``frame``: round, phase,
    start, finish (timestamps), seconds. Horizontal bars on a date axis (cheaper to build than plotly express)."""
    fig = go.Figure()
    labels = {r: f"round {int(r)}" for r in sorted(frame["round"].unique())}
    for phase, color in PHASE_COLORS.items():
        part = frame[frame["phase"] == phase]
        if part.empty:
            continue
        durations_ms = [max(1.0, (f - s).total_seconds() * 1000.0) for s, f in zip(part["start"], part["finish"])]
        fig.add_bar(
            y=[labels[r] for r in part["round"]],
            x=durations_ms,
            base=[s.isoformat() for s in part["start"]],
            orientation="h",
            name=phase,
            marker_color=color,
            customdata=part["seconds"],
            hovertemplate=f"{phase}<br>%{{customdata:.2f}} s<extra></extra>",
        )
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(type="date", title=None)
    fig.update_yaxes(title=None, autorange="reversed", categoryorder="array", categoryarray=list(labels.values()))
    return _layout(fig, None, height=max(160, 60 + 42 * len(labels)))
