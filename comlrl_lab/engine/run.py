"""One experiment in its own run directory: trainer, DuckDB store and checkpoints, advanced phase by phase.

Layout of a run directory::

    spec.json            the experiment (no secrets)
    run.duckdb           every candidate, pair, replay draw, metric and event
    checkpoint/          checkpoint-NNNNNN/ after finished phases; the newest is the resume point
    preference_replay/   iteration_NNNN.json, CoMLRL's format
    policy_history/      policy snapshots for the history comparator
    snapshots/           Parquet copies of the tables after each phase, for notebooks and other processes

Opening a run lines its store up with its checkpoints (``reconcile_store``): a store that lost committed phases
(a deleted or truncated ``run.duckdb.wal``, a deleted store) is rolled back, with its checkpoints, to the last phase
it still holds, so the run redoes what was lost instead of finishing with less; where the checkpoint for that phase
was pruned, the open is refused with ``StoreBehind``, saying what is missing. A checkpoint's cost that a kill kept
from reaching the store is added from the checkpoint, and unreadable snapshot files are written again.

A ``Run`` is not thread-safe; ``RunManager`` makes sure one thread at a time steps it. Reading the store is
safe from any thread. Under torchrun only rank 0 holds the store (DuckDB locks its file per process); the other
ranks ``attach`` to the run directory and step the same trainer without one (``run_data_parallel``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import traceback
from pathlib import Path
from typing import Any

from comlrl_lab.data.labels import AwaitingLabels, Label
from comlrl_lab.data.no_space import NoSpaceLeft, is_no_space
from comlrl_lab.engine.preflight import preflight
from comlrl_lab.engine.spec import ExperimentSpec, build_trainer
from comlrl_lab.names.phases import InvalidTransition
from comlrl_lab.names.run_ids import new_run_id
from comlrl_lab.sandbox import SandboxError, sandbox_capabilities
from comlrl_lab.store import RunStore, snapshot_parquet
from comlrl_lab.trainers.preference.rounds.replay import drop_round_files
from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt
from comlrl_lab.trainers.preference.runtime.sink import PhaseCancelled, PhaseControl, PhaseRecords

# Loading models is not thread-safe: transformers imports lazily and from_pretrained builds modules under a global
# "empty weights" context, so two runs loading at once in one process (a sweep with --parallel 2, two runs started
# from the workbench) failed with "Cannot copy out of meta tensor" or a half-imported transformers.
_BUILD_LOCK = threading.Lock()

SPEC_FILE = "spec.json"
STORE_FILE = "run.duckdb"
CHECKPOINT_DIR = "checkpoint"
SNAPSHOT_DIR = "snapshots"


class StoreBehind(RuntimeError):
    """The store lost committed phases and no checkpoint is left to go back to; the message says how to recover."""


def empty_round_notes(store: RunStore, run_id: str) -> list[str]:
    """One line per collected round without a preference pair (the CLI and the Rounds page say so)."""
    notes = []
    for row in store.rounds_without_pairs(run_id).itertuples(index=False):
        nan = f", {row.nan_rewards} of them with a NaN reward" if row.nan_rewards else ""
        notes.append(
            f"round {row.round} collected 0 preference pairs from {row.candidates} candidates{nan}: "
            "its training had nothing new to learn from"
        )
    return notes


def _phase_name(done: int, phases: tuple[str, ...]) -> str:
    """How ``done`` finished phases of rounds of ``phases`` read: "round 2 select" for the last, "nothing" for none."""
    if done <= 0:
        return "nothing"
    return f"round {(done - 1) // len(phases) + 1} {phases[(done - 1) % len(phases)]}"


def _phases_done(state: dict[str, Any], phases: tuple[str, ...]) -> int:
    """Finished phases before a checkpoint's cursor (a finished run's cursor is past its last round)."""
    return (int(state["round_index"]) - 1) * len(phases) + int(state["phase_index"])


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
        # A checkpoint's cost arrives from the writer thread while the next phase may be snapshotting.
        self._snapshot_lock = threading.Lock()
        self.num_rounds = num_rounds

    def commit_phase(self, records: PhaseRecords) -> None:
        last = (records.round_index, records.phase) == (self.num_rounds, "evaluate")
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
            labels=records.labels,
            status="finished" if last else "running",
        )
        if self.snapshot_dir is not None:
            with self._snapshot_lock:
                snapshot_parquet(self.store, self.run_id, self.snapshot_dir)

    def labels(self, round_index: int) -> list[Label]:
        return self.store.labels(self.run_id, round_index)

    def add_phase_metrics(self, round_index: int, phase: str, step: int, values: dict[str, float]) -> None:
        rows = [{"step": step, "name": name, "value": value} for name, value in values.items()]
        self.store.append_metrics(self.run_id, round_index, phase, rows)
        if self.snapshot_dir is not None:  # the phase's snapshot was written before these rows existed
            with self._snapshot_lock:
                snapshot_parquet(
                    self.store, self.run_id, self.snapshot_dir, round=round_index, phase=phase, tables=("metrics",)
                )


class Run:
    """An experiment in ``run_dir``. Build with ``Run.create`` (new) or ``Run.open`` (existing)."""

    def __init__(
        self,
        run_dir: Path,
        spec: ExperimentSpec,
        run_id: str,
        store: RunStore | None,
        *,
        trust_checkpoint: bool = False,
    ):
        self.run_dir = Path(run_dir)
        self.spec = spec
        self.run_id = run_id
        self.store = store
        # Format-1 checkpoints are pickles; they are read only when the person resuming says they trust them.
        self.trust_checkpoint = bool(trust_checkpoint)
        self.trainer: Any = None
        self.control: PhaseControl = PhaseControl()
        self.last_error: str | None = None
        self.last_traceback: str | None = None

    # Construction ------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, spec: ExperimentSpec, runs_root: str | Path) -> Run:
        config = spec.validated_config()  # validated when the spec was made
        task = preflight(spec, config)  # task, data files, models and devices, before anything is written
        run_id = new_run_id(spec.name or spec.algorithm)
        run_dir = Path(runs_root) / run_id
        run_dir.mkdir(parents=True, exist_ok=False)  # a new run never reuses another run's directory
        spec.save(run_dir / SPEC_FILE)
        store = RunStore(run_dir / STORE_FILE)
        store.create_run(run_id, trainer=spec.algorithm, config=config.to_dict(), num_agents=config.num_agents)
        run = cls(run_dir, spec, run_id, store)
        run.log_sandbox(task.reward_func)
        return run

    def log_sandbox(self, reward_func: Any) -> None:
        """Once per run, when its reward runs programs in the sandbox: what this host's sandbox enforces and what
        it cannot (a warning when something is not enforced, so the run's log says so before any program runs)."""
        limits = getattr(reward_func, "sandbox_limits", None)
        if limits is None:
            return
        try:
            capabilities = sandbox_capabilities(limits)
        except SandboxError as error:  # the reward raises the same at its first program, failing that phase
            self.log("error", f"sandbox: no program can run here: {error}")
            return
        self.log("warning" if capabilities.not_enforced else "info", capabilities.summary())

    @classmethod
    def open(cls, run_dir: str | Path, secrets: dict[str, Any] | None = None, *, trust_checkpoint: bool = False) -> Run:
        run_dir = Path(run_dir)
        if not (run_dir / SPEC_FILE).is_file():
            raise FileNotFoundError(f"{run_dir} is not a comlrl-lab run directory (no {SPEC_FILE})")
        spec = ExperimentSpec.load(run_dir / SPEC_FILE)
        if secrets:
            spec.config.update(secrets)
        store = RunStore(run_dir / STORE_FILE)
        run_id = store.first_run_id() or run_dir.name
        run = cls(run_dir, spec, run_id, store, trust_checkpoint=trust_checkpoint)
        try:
            # The settings pages read (every config value, defaults filled in) as this code resumes the run; a run
            # stored before the store kept them gets them now.
            settings = spec.validated_config().to_dict()
            info = store.run(run_id)
            if info is not None and json.loads(info["config_json"] or "null") != settings:
                store.create_run(run_id, config=settings, status=info["status"], source=info["source"])
            run.reconcile_store()
            run.reconcile_files()
        except BaseException:
            store.close()
            raise
        return run

    def _read_newest(self, read) -> dict[str, Any] | None:
        """``read`` (``checkpoint.read_cursor`` or ``read_state``) of the newest checkpoint, or None where there is
        none; ``UntrustedCheckpoint`` for a format-1 one not trusted."""
        found = ckpt.latest_checkpoint(self.checkpoint_dir)
        return None if found is None else read(found, trust_checkpoint=self.trust_checkpoint)

    def _newest_cursor(self) -> dict[str, Any] | None:
        """Where the newest checkpoint stands, read without torch (``checkpoint.read_cursor``), or None."""
        return self._read_newest(ckpt.read_cursor)

    def check_resumable(self) -> None:
        """Raise now what resuming would raise on its first phase: an untrusted format-1 checkpoint, a state or
        tensors file that cannot be read. The whole state is read (``read_state``), not only the cursor."""
        self._read_newest(ckpt.read_state)

    def _store_done(self) -> int:
        """Phases the store holds without a gap from the start (a lost WAL loses the newest ones)."""
        committed = set(self.store.committed_phases(self.run_id))
        done = 0
        phases = self.phases
        while (done // len(phases) + 1, phases[done % len(phases)]) in committed:
            done += 1
        return done

    def reconcile_store(self) -> None:
        """Line the store and the checkpoints up (see the module docstring); rank 0 only, before the trainer exists."""
        ckpt.remove_stale_tmp(self.checkpoint_dir)
        if self.store.run(self.run_id) is None:  # the store was deleted: it starts again, as Run.create made it
            self.store.create_run(self.run_id, trainer=self.spec.algorithm, config=self.spec.to_dict())
        try:
            newest = self._newest_cursor()
        except ckpt.UntrustedCheckpoint:
            return  # nothing can be compared with a checkpoint that may not be read; resuming will refuse it
        stored = self._store_done()
        if newest is not None and _phases_done(newest, self.phases) > stored:
            self._roll_back(stored, _phases_done(newest, self.phases))
        self._recover_checkpoint_costs()
        snapshot_parquet(self.store, self.run_id, self.run_dir / SNAPSHOT_DIR, repair=True)

    def _roll_back(self, stored: int, newest: int) -> None:
        """Drop the checkpoints after the store's last phase, or refuse when the one for that phase is gone."""
        folders = ckpt.checkpoint_dirs(self.checkpoint_dir)
        phases = self.phases
        done = [_phases_done(ckpt.read_cursor(f, trust_checkpoint=self.trust_checkpoint), phases) for f in folders]
        name = functools.partial(_phase_name, phases=phases)
        if stored > 0 and stored not in done:
            oldest = name(min(done))
            raise StoreBehind(
                f"{self.store.path} holds the phases up to {name(stored)}, but the checkpoints go from "
                f"{oldest} to {name(newest)}: the phases after {name(stored)} are missing from the store "
                f"(a lost {self.store.path.name}.wal?) and no checkpoint is left to redo them from. Restore "
                f"{self.store.path.name} and its .wal from a backup, or start the experiment again: comlrl-lab run "
                f"{self.run_dir / SPEC_FILE}"
            )
        ckpt.drop_checkpoints(self.checkpoint_dir, [f for f, d in zip(folders, done) if d > stored])
        message = (
            f"the store had lost committed phases: it held the phases up to {name(stored)}, the checkpoints "
            f"went up to {name(newest)}; the run went back to {name(stored)} and redoes the rest"
        )
        self.store.log_event(self.run_id, "warning", message)

    def _recover_checkpoint_costs(self) -> None:
        """Add each checkpoint's cost (``cost.json``) to its phase when a kill kept it from the store."""
        committed = set(self.store.committed_phases(self.run_id))
        for cost in ckpt.checkpoint_costs(self.checkpoint_dir):
            where = (int(cost["round"]), str(cost["phase"]))
            if where not in committed:
                continue
            names = list(cost["metrics"])
            have = self.store.metrics(self.run_id, names)
            have = have[(have["round"] == where[0]) & (have["phase"] == where[1])]
            if have.empty:
                rows = [{"step": int(cost["step"]), "name": n, "value": float(v)} for n, v in cost["metrics"].items()]
                self.store.append_metrics(self.run_id, *where, rows)
                snapshot_parquet(
                    self.store,
                    self.run_id,
                    self.run_dir / SNAPSHOT_DIR,
                    round=where[0],
                    phase=where[1],
                    tables=("metrics",),
                )

    def reconcile_files(self) -> None:
        """Line the files up with the last finished phase: no round file of an unfinished collect."""
        round_index, next_phase = self.cursor()

        def collected(round_: int) -> bool:
            return next_phase is None or round_ < round_index or (round_ == round_index and next_phase != "collect")

        replay_dir = self.spec.config.get("preference_replay_dir") or "preference_replay"
        drop_round_files(self.run_dir / replay_dir, self.run_id, collected)

    @classmethod
    def attach(cls, run_dir: str | Path, run_id: str, *, trust_checkpoint: bool = False) -> Run:
        """A data-parallel rank other than 0: the run's spec and directory, no store (rank 0 writes everything)."""
        run_dir = Path(run_dir)
        if not (run_dir / SPEC_FILE).is_file():
            raise FileNotFoundError(f"{run_dir} is not a comlrl-lab run directory (no {SPEC_FILE})")
        spec = ExperimentSpec.load(run_dir / SPEC_FILE)
        return cls(run_dir, spec, run_id, store=None, trust_checkpoint=trust_checkpoint)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / CHECKPOINT_DIR

    @property
    def num_rounds(self) -> int:
        return self.spec.num_rounds()

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases of one of this run's rounds (``preference_source`` human and judge add ``label``)."""
        return self.spec.round_phases()

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
                if ckpt.has_checkpoint(self.checkpoint_dir):
                    trainer.load_checkpoint(self.checkpoint_dir, trust_checkpoint=self.trust_checkpoint)
            self.trainer = trainer
        return self.trainer

    # Cursor ------------------------------------------------------------------------------------------------
    def cursor(self) -> tuple[int, str | None]:
        """(round, next phase) without building the trainer when a checkpoint can tell."""
        if self.trainer is not None:
            return self.trainer.round_index, self.trainer.next_phase
        try:
            state = self._newest_cursor()
        except ckpt.UntrustedCheckpoint:
            # A checkpoint that may not be read: the store tells where the run stands, for browsing it.
            done = self._store_done() if self.store is not None else 0
            finished = self.store is not None and (self.store.run(self.run_id) or {}).get("status") == "finished"
            phases = self.phases
            return (done // len(phases) + 1, None if finished else phases[done % len(phases)])
        if state is not None:
            return int(state["round_index"]), None if state["finished"] else self.phases[int(state["phase_index"])]
        return 1, self.phases[0]

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
        except AwaitingLabels as waiting:
            # Not a failure: the round waits at its label phase, which changed nothing, until people label.
            self.log("info", str(waiting), **where)
            raise
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
        if is_no_space(error):  # torch, DuckDB and pyarrow each word a full disk their own way
            doing = f"{phase} of round {round}" if phase else "working"
            self.last_error = str(error if isinstance(error, NoSpaceLeft) else NoSpaceLeft(self.run_dir, doing))
        else:
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

    def mark_interrupted(self, signal_name: str) -> str:
        """Set ``runs.status`` to interrupted (a signal stopped the run between phases or abandoned one) and log where
        it stands; returns that line. The next finished phase sets the status back, as after a failure."""
        round_index, next_phase = self.cursor()
        where = "with every round done" if next_phase is None else f"before {next_phase} of round {round_index}"
        line = f"interrupted by {signal_name}: stopped {where}; every finished phase is kept"
        if self.store is not None:
            with contextlib.suppress(Exception):  # a store that fails now must not hide how to resume
                self.store.create_run(self.run_id, status="interrupted")
                self.store.log_event(self.run_id, "warning", line, round=round_index, phase=next_phase)
                snapshot_parquet(self.store, self.run_id, self.run_dir / SNAPSHOT_DIR)
        return line

    def restore_last_good(self) -> None:
        if self.trainer is None:
            return
        if ckpt.has_checkpoint(self.checkpoint_dir):
            try:
                self.trainer.load_checkpoint(self.checkpoint_dir, trust_checkpoint=self.trust_checkpoint)
            except ckpt.InitialWeightsCheckpoint:
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
    trust_checkpoint: bool = False,
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
                run = Run.open(resume, trust_checkpoint=trust_checkpoint)
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
        run = Run.attach(where[0], where[1], trust_checkpoint=trust_checkpoint)
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
