"""One experiment in its own run directory: trainer, DuckDB store and checkpoints, advanced phase by phase.

Layout of a run directory::

    spec.json            the experiment (no secrets)
    run.duckdb           every candidate, pair, replay draw, metric and event
    checkpoint/          checkpoint-NNNNNN/ after finished phases; the newest is the resume point
    preference_replay/   iteration_NNNN.json, CoMLRL's format
    policy_history/      policy snapshots for the history comparator
    snapshots/           Parquet copies of the tables after each phase, for notebooks and other processes

A ``Run`` is not thread-safe; ``RunManager`` makes sure one thread at a time steps it. Reading the store is
safe from any thread. Under torchrun only rank 0 holds the store (DuckDB locks its file per process); the other
ranks ``attach`` to the run directory and step the same trainer without one (``run_data_parallel``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from pathlib import Path
from typing import Any

from comlrl_lab.data.phases import InvalidTransition
from comlrl_lab.data.run_ids import new_run_id
from comlrl_lab.engine import spec_checks
from comlrl_lab.engine.spec import ExperimentSpec, build_trainer
from comlrl_lab.store import RunStore, snapshot_parquet
from comlrl_lab.trainers.preference.replay import drop_round_files
from comlrl_lab.trainers.preference.sink import PHASES, PhaseCancelled, PhaseControl, PhaseRecords


def _ckpt():
    """The checkpoint module, imported on first use: it imports torch, which opening the workbench must not."""
    from comlrl_lab.trainers.preference import checkpoint

    return checkpoint


# Loading models is not thread-safe: transformers imports lazily and from_pretrained builds modules under a global
# "empty weights" context, so two runs loading at once in one process (a sweep with --parallel 2, two runs started
# from the workbench) failed with "Cannot copy out of meta tensor" or a half-imported transformers.
_BUILD_LOCK = threading.Lock()

SPEC_FILE = "spec.json"
STORE_FILE = "run.duckdb"
CHECKPOINT_DIR = "checkpoint"
SNAPSHOT_DIR = "snapshots"


def quiet_library_progress() -> None:
    """Keep the libraries' own progress bars (transformers' "Loading weights" for every model) out of the workbench
    server's log and from under the CLI's bar; set before transformers is first imported. A user's setting stands."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def apply_torch_threads(spec: ExperimentSpec) -> None:
    """Set torch's CPU thread count from ``COMLRL_LAB_TORCH_THREADS``; "auto" (default) picks 1 for the tiny model.

    The embedded 1M-parameter model spends more time synchronising threads than computing: one round took 44.6 s
    with 2 threads and 8.1 s with 1 while the app server shared the cores. Larger models keep torch's default.
    """
    import torch

    from comlrl_lab.models.tiny_model import is_tiny_model_name

    setting = os.environ.get("COMLRL_LAB_TORCH_THREADS", "auto").strip().lower()
    if setting == "auto":
        if all(is_tiny_model_name(m) for m in spec.agent_models):
            torch.set_num_threads(1)
    elif setting.isdigit() and int(setting) > 0:
        torch.set_num_threads(int(setting))
    else:
        raise ValueError(f"COMLRL_LAB_TORCH_THREADS must be 'auto' or a positive integer, got {setting!r}")


class StoreSink:
    """Commits each finished phase to the run's DuckDB file in one transaction, then refreshes the snapshot.

    The commit also sets the run's status: "finished" with the last phase of round ``num_rounds``, else
    "running", so the store and its snapshot never disagree about a run that has ended.
    """

    def __init__(self, store: RunStore, run_id: str, snapshot_dir: Path | None = None, num_rounds: int | None = None):
        self.store = store
        self.run_id = run_id
        self.snapshot_dir = snapshot_dir
        self.num_rounds = num_rounds

    def commit_phase(self, records: PhaseRecords) -> None:
        last = (records.round_index, records.phase) == (self.num_rounds, PHASES[-1])
        self.store.commit_phase(
            self.run_id,
            records.round_index,
            records.phase,
            candidates=records.candidates,
            pairs=records.pairs,
            replay_rows=records.replay_rows,
            metrics=records.metrics,
            events=records.events,
            reward_distributions=records.reward_distributions,
            status="finished" if last else "running",
        )
        if self.snapshot_dir is not None:
            snapshot_parquet(self.store, self.run_id, self.snapshot_dir)

    def add_phase_metrics(self, round_index: int, phase: str, step: int, values: dict[str, float]) -> None:
        rows = [{"step": step, "name": name, "value": value} for name, value in values.items()]
        self.store.append_metrics(self.run_id, round_index, phase, rows)


class Run:
    """An experiment in ``run_dir``. Build with ``Run.create`` (new) or ``Run.open`` (existing)."""

    def __init__(self, run_dir: Path, spec: ExperimentSpec, run_id: str, store: RunStore | None):
        self.run_dir = Path(run_dir)
        self.spec = spec
        self.run_id = run_id
        self.store = store
        self.trainer: Any = None
        self.control: PhaseControl = PhaseControl()
        self.last_error: str | None = None
        self.last_traceback: str | None = None

    # Construction ------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, spec: ExperimentSpec, runs_root: str | Path) -> Run:
        spec_checks.preflight(spec)  # config, task, data files, models and devices, before anything is written
        run_id = new_run_id(spec.name or spec.algorithm)
        run_dir = Path(runs_root) / run_id
        run_dir.mkdir(parents=True, exist_ok=False)  # a new run never reuses another run's directory
        spec.save(run_dir / SPEC_FILE)
        store = RunStore(run_dir / STORE_FILE)
        store.create_run(run_id, trainer=spec.algorithm, config=spec.to_dict())
        return cls(run_dir, spec, run_id, store)

    @classmethod
    def open(cls, run_dir: str | Path, secrets: dict[str, Any] | None = None) -> Run:
        run_dir = Path(run_dir)
        if not (run_dir / SPEC_FILE).is_file():
            raise FileNotFoundError(f"{run_dir} is not a comlrl-lab run directory (no {SPEC_FILE})")
        spec = ExperimentSpec.load(run_dir / SPEC_FILE)
        if secrets:
            spec.config.update(secrets)
        store = RunStore(run_dir / STORE_FILE)
        run_id = store.first_run_id() or run_dir.name
        run = cls(run_dir, spec, run_id, store)
        run.reconcile_files()
        return run

    def reconcile_files(self) -> None:
        """Line the files up with the last finished phase: no round file of an unfinished collect, no half-written
        checkpoint file of a killed process."""
        _ckpt().remove_stale_tmp(self.checkpoint_dir)
        round_index, next_phase = self.cursor()

        def collected(round_: int) -> bool:
            return next_phase is None or round_ < round_index or (round_ == round_index and next_phase != PHASES[0])

        replay_dir = self.spec.config.get("preference_replay_dir") or "preference_replay"
        drop_round_files(self.run_dir / replay_dir, self.run_id, collected)

    @classmethod
    def attach(cls, run_dir: str | Path, run_id: str) -> Run:
        """A data-parallel rank other than 0: the run's spec and directory, no store (rank 0 writes everything)."""
        run_dir = Path(run_dir)
        if not (run_dir / SPEC_FILE).is_file():
            raise FileNotFoundError(f"{run_dir} is not a comlrl-lab run directory (no {SPEC_FILE})")
        return cls(run_dir, ExperimentSpec.load(run_dir / SPEC_FILE), run_id, store=None)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / CHECKPOINT_DIR

    @property
    def num_rounds(self) -> int:
        return self.spec.num_rounds()

    def attach_control(self, control: PhaseControl) -> None:
        self.control = control
        if self.trainer is not None:
            self.trainer.control = control

    def ensure_trainer(self) -> Any:
        """Build the trainer on first use (loading models takes seconds) and resume from the checkpoint."""
        if self.trainer is None:
            apply_torch_threads(self.spec)
            sink = (
                None
                if self.store is None
                else StoreSink(self.store, self.run_id, self.run_dir / SNAPSHOT_DIR, self.num_rounds)
            )
            with _BUILD_LOCK:
                trainer = build_trainer(
                    self.spec, output_dir=self.run_dir, run_id=self.run_id, sink=sink, control=self.control
                )
                trainer.checkpoint_dir = self.checkpoint_dir
                if _ckpt().has_checkpoint(self.checkpoint_dir):
                    trainer.load_checkpoint(self.checkpoint_dir)
            self.trainer = trainer
        return self.trainer

    # Cursor ------------------------------------------------------------------------------------------------
    def cursor(self) -> tuple[int, str | None]:
        """(round, next phase) without building the trainer when a checkpoint can tell."""
        if self.trainer is not None:
            return self.trainer.round_index, self.trainer.next_phase
        if _ckpt().has_checkpoint(self.checkpoint_dir):
            state = _ckpt().load_checkpoint_state(self.checkpoint_dir)
            return int(state["round_index"]), None if state["finished"] else PHASES[int(state["phase_index"])]
        return 1, PHASES[0]

    @property
    def finished(self) -> bool:
        return self.trainer is not None and self.trainer.finished

    def step(self, expected_phase: str | None = None) -> PhaseRecords | None:
        """Run the next phase. With ``expected_phase``, refuse when the cursor is elsewhere."""
        trainer = self.ensure_trainer()
        if trainer.finished:
            raise InvalidTransition(f"run {self.run_id} has finished all {trainer.num_rounds} rounds")
        where = {"round": trainer.round_index, "phase": trainer.next_phase}
        try:
            records = trainer.step(expected_phase)
        except InvalidTransition:
            raise  # refused before anything ran: there is no failure to log and nothing to restore
        except PhaseCancelled:
            # A stop the user asked for is not an error: log it as such, and go back to the last finished phase.
            self.log(
                "info",
                f"{where['phase']} of round {where['round']} cancelled; back at the last finished phase",
                **where,
            )
            self.restore_last_good()
            raise
        except BaseException as error:
            self.record_failure(error, **where)
            raise
        self.last_error = self.last_traceback = None
        return records

    def record_failure(self, error: BaseException, *, round: int | None = None, phase: str | None = None) -> None:
        """Log the error with the round and phase it hit, and put the trainer back to the last finished phase."""
        self.last_error = f"{type(error).__name__}: {error}"
        self.last_traceback = traceback.format_exc()
        self.log("error", self.last_error, traceback=self.last_traceback, round=round, phase=phase)
        if not isinstance(error, PhaseCancelled):  # a stop asked for is not a failure
            self.mark_failed()
        self.restore_last_good()

    def log(self, level: str, message: str, **where: Any) -> None:
        """Add an event to the run's log (``round`` and ``phase`` say what it is about); no-op without a store."""
        if self.store is not None:
            with contextlib.suppress(Exception):  # the store must not hide the original error
                self.store.log_event(self.run_id, level, message, **where)

    def mark_failed(self) -> None:
        """Set ``runs.status`` to failed, in the store and its snapshot; the next finished phase sets it back."""
        if self.store is not None:
            with contextlib.suppress(Exception):  # the store must not hide the original error
                self.store.create_run(self.run_id, status="failed")
                snapshot_parquet(self.store, self.run_id, self.run_dir / SNAPSHOT_DIR)

    def restore_last_good(self) -> None:
        if self.trainer is None:
            return
        if _ckpt().has_checkpoint(self.checkpoint_dir):
            try:
                self.trainer.load_checkpoint(self.checkpoint_dir)
            except _ckpt().InitialWeightsCheckpoint:
                self.trainer = None  # the checkpoint holds the initial weights: a rebuilt trainer has them
        else:
            # Nothing finished yet: rebuild from scratch so no half-run phase leaks into the next attempt.
            self.trainer = None

    def close(self) -> None:
        try:
            if self.trainer is not None:
                self.trainer.wait_for_checkpoint()  # save_in_background: the last phase's checkpoint lands first
        finally:
            if self.store is not None:
                self.store.close()


def run_data_parallel(
    dist: Any,
    *,
    spec: ExperimentSpec | None = None,
    resume: str | Path | None = None,
    runs_root: str | Path = "runs",
    log: Any = print,
) -> Run:
    """Every rank of a torchrun job steps the same run to its end; returns this rank's ``Run`` (closed).

    Rank 0 creates the run directory (or opens ``resume``) with its store and broadcasts where it is; the other
    ranks attach to it. The trainers shard collection and training across the ranks (``distributed.py``) and
    only rank 0 commits records and writes checkpoints. ``log`` (rank 0 only) gets one line per finished phase.
    """
    dist.init_process_group()
    where: tuple[str | None, str | None, str | None] = (None, None, None)
    run: Run | None = None
    if dist.is_main:
        try:
            if resume is not None:
                run = Run.open(resume)
            else:
                if spec is None:
                    raise ValueError("give a spec or a run directory to resume")
                run = Run.create(spec, runs_root)
            where = (str(run.run_dir), run.run_id, None)
        except Exception as error:  # tell the other ranks before failing, so none waits forever
            where = (None, None, f"{type(error).__name__}: {error}")
            dist.broadcast_object(where)
            raise
    where = dist.broadcast_object(where)
    if where[2] is not None:
        raise RuntimeError(f"rank 0 could not open the run: {where[2]}")
    if run is None:
        run = Run.attach(where[0], where[1])
    try:
        trainer = run.ensure_trainer()
        while not trainer.finished:
            records = run.step()
            if dist.is_main and records is not None:
                log(f"round {records.round_index} {records.phase}: done")
    finally:
        run.close()
        dist.shutdown()
    return run
