"""Experiment trackers fed from each committed phase: Weights & Biases and TensorBoard (``report_to``).

A trainer hands every finished phase's ``PhaseRecords`` to its ``Trackers`` right after the sink has them. W&B
gets the per-update and per-round metrics, evaluation, the logged reward distributions (``wandb.Histogram``) and
a sample of the round's pairs (``wandb.Table``), with project, entity, name, tags, dir, id and resume taken from
the trainer's ``wandb_config`` (CoMLRL's keys). TensorBoard gets the same scalars, the distributions as histograms
and the pair sample as text, in event files under ``<output_dir>/tensorboard``. Both packages are optional extras:
a requested tracker whose package is missing fails when the trainer is built. This module does not choose
metric names or store anything; only the main rank tracks.
"""

from __future__ import annotations

import importlib.util
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from comlrl_lab.trainers.preference.runtime.sink import PhaseRecords

#: The pairs of a collect phase shown in the tracker's sample table.
PAIR_SAMPLE_SIZE = 16
TENSORBOARD_DIR = "tensorboard"
#: tracker -> (the module it needs, the extra that installs it)
_PACKAGES = {"wandb": ("wandb", "wandb"), "tensorboard": ("tensorboard", "tensorboard")}


def requested_trackers(report_to: list[str] | None, wandb_config: dict | None) -> list[str]:
    """The trackers a trainer reports to: ``report_to``, or when it is None, W&B if a wandb_config was given."""
    if report_to is None:
        # CoMLRL logs to W&B whenever wandb_config is given; report_to (TRL's name) chooses explicitly.
        return ["wandb"] if wandb_config is not None else []
    return [name for name in report_to if name != "none"]


def check_installed(trackers: list[str]) -> None:
    """A clear ``ImportError`` naming the extra to install when a requested tracker's package is missing."""
    for name in trackers:
        module, extra = _PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ImportError(
                f"report_to includes {name!r}, but the {module} package is not installed: "
                f"pip install 'comlrl-lab[{extra}]'"
            )


def _scalars(records: PhaseRecords) -> dict[int, dict[str, float]]:
    """The phase's metrics grouped by step, in step order; NaN values (nothing to report) are left out."""
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for metric in records.metrics:
        value = metric["value"]
        if value is not None and math.isfinite(float(value)):
            by_step[int(metric["step"])][str(metric["name"])] = float(value)
    return dict(sorted(by_step.items()))


def _pair_rows(records: PhaseRecords) -> list[list[Any]]:
    return [
        [
            records.round_index,
            p.item_index,
            p.winner_side,
            float(p.winner_reward),
            float(p.loser_reward),
            " | ".join(p.prompts),
            " | ".join(p.winner_completions),
            " | ".join(p.loser_completions),
        ]
        for p in records.pairs[:PAIR_SAMPLE_SIZE]
    ]


PAIR_COLUMNS = ["round", "item", "winner_side", "winner_reward", "loser_reward", "prompts", "winner", "loser"]


def _distribution_key(row: dict[str, Any]) -> str:
    return f"reward_distribution/{row['series']}/{row['side']}"


class WandbTracker:
    """One W&B run, started at the first phase it sees (so building a trainer starts nothing)."""

    def __init__(self, wandb_config: dict | None, output_dir: Path, run_id: str, config: Any):
        self.wandb_config = dict(wandb_config or {})
        self.output_dir = output_dir
        self.run_id = run_id
        self.config = config
        self.run: Any = None

    def _start(self) -> Any:
        import wandb

        cfg = self.wandb_config
        directory = Path(cfg.get("dir") or self.output_dir)
        directory.mkdir(parents=True, exist_ok=True)
        sections = cfg.get("config_sections") or {}
        self.run = wandb.init(
            project=cfg.get("project"),
            entity=cfg.get("entity"),
            name=cfg.get("name") or cfg.get("run_name") or self.run_id,
            tags=list(cfg.get("tags") or []) or None,
            dir=str(directory),
            id=cfg.get("id"),
            resume=cfg.get("resume"),
            config={**self.config.to_dict(), **sections},  # to_dict never holds the API key
            reinit="create_new",
        )
        return self.run

    def log_phase(self, records: PhaseRecords) -> None:
        import wandb

        run = self.run or self._start()
        steps = _scalars(records)
        last = max(steps) if steps else None
        for step, values in steps.items():
            extra: dict[str, Any] = {}
            if step == last:
                extra["iter/round"] = records.round_index
                for row in records.reward_distributions:
                    counts, edges = row["counts"], row["bin_edges"]
                    extra[_distribution_key(row)] = wandb.Histogram(np_histogram=(list(counts), list(edges)))
                    extra[_distribution_key(row) + "/sample_count"] = int(row["sample_count"])
                if records.pairs:
                    extra["pairs/sample"] = wandb.Table(columns=PAIR_COLUMNS, data=_pair_rows(records))
            run.log({**values, **extra}, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


class TensorBoardTracker:
    """Event files under ``<output_dir>/tensorboard``: scalars per update, histograms and pair text per round."""

    def __init__(self, output_dir: Path):
        self.log_dir = output_dir / TENSORBOARD_DIR
        self.writer: Any = None

    def log_phase(self, records: PhaseRecords) -> None:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.log_dir))
        for step, values in _scalars(records).items():
            for name, value in values.items():
                self.writer.add_scalar(name, value, global_step=step)
        for row in records.reward_distributions:
            raw = [float(v) for v in row.get("raw_rewards") or ()]
            if not raw:
                continue
            edges = [float(e) for e in row["bin_edges"]]
            self.writer.add_histogram_raw(
                _distribution_key(row),
                min=min(raw),
                max=max(raw),
                num=len(raw),
                sum=sum(raw),
                sum_squares=sum(v * v for v in raw),
                bucket_limits=edges[1:],
                bucket_counts=[int(c) for c in row["counts"]],
                global_step=records.round_index,
            )
        if records.pairs:
            header = "| " + " | ".join(PAIR_COLUMNS) + " |\n|" + "---|" * len(PAIR_COLUMNS) + "\n"
            lines = ["| " + " | ".join(str(v).replace("|", "/") for v in row) + " |" for row in _pair_rows(records)]
            self.writer.add_text("pairs/sample", header + "\n".join(lines), global_step=records.round_index)
        self.writer.flush()

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class Trackers:
    """The trackers of one trainer; empty (every call a no-op) unless ``report_to`` or ``wandb_config`` asks."""

    def __init__(self, trackers: list[Any]):
        self.trackers = trackers

    @classmethod
    def build(
        cls,
        report_to: list[str] | None,
        wandb_config: dict | None,
        *,
        output_dir: Path,
        run_id: str,
        config: Any,
        is_main: bool,
    ) -> Trackers:
        names = requested_trackers(report_to, wandb_config)
        check_installed(names)  # on every rank, so a missing package fails everywhere at construction
        if not is_main:
            return cls([])
        made: list[Any] = []
        for name in names:
            if name == "wandb":
                made.append(WandbTracker(wandb_config, output_dir, run_id, config))
            else:
                made.append(TensorBoardTracker(output_dir))
        return cls(made)

    def log_phase(self, records: PhaseRecords) -> None:
        for tracker in self.trackers:
            tracker.log_phase(records)

    def finish(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
