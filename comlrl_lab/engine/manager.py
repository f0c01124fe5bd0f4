"""Runs experiments in worker threads: one phase, N phases or N rounds; pause, stop, and live progress.

The workbench holds one ``RunManager`` (in ``st.cache_resource``). Worker threads never touch Streamlit: they
step a ``Run`` and update a small lock-protected progress record that pages poll. ``pause`` lets the current
phase finish and then stops; ``stop`` cancels the current phase cooperatively (it is rolled back to the last
finished phase, so nothing committed is lost). Errors stop the queue with the traceback kept for the page.
Starts, pauses, stops, finished phases and the end of the work go to the run's event log (``Run.log``).
"""

from __future__ import annotations

import functools
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from comlrl_lab.data.labels import AwaitingLabels
from comlrl_lab.engine import eta
from comlrl_lab.engine.run import Run
from comlrl_lab.engine.spec import ExperimentSpec
from comlrl_lab.names import metric_names
from comlrl_lab.names.phases import ALL_PHASES, PHASES, InvalidTransition, check_next_phase
from comlrl_lab.trainers.preference.runtime.sink import PhaseCancelled, PhaseControl

#: The ``Progress.history`` entry of building a run's trainer (loading its models, resuming its checkpoint).
LOAD = "load"
#: What ``Progress.done`` counts in each phase: each agent's prompt of a task item (per side), the replay draw, an
#: optimiser step (MADPO update, Bradley-Terry batch or policy-learning buffer), an evaluation response.
PHASE_UNITS = {"collect": "prompt", "label": "comparison", "select": "draw", "train": "step", "evaluate": "response"}


@dataclass(frozen=True)
class Progress:
    """What a page shows about a run; a copy, safe to read from any thread."""

    run_id: str
    # idle | loading | running | pausing | paused | stopping | error | finished | awaiting labels
    status: str = "idle"
    round_index: int = 1
    num_rounds: int | None = None
    phase: str | None = None
    next_phase: str | None = "collect"
    done: int = 0
    total: int = 0
    tokens: int = 0
    tokens_per_second: float = 0.0
    started_at: float | None = None  # wall clock (time.time()) when the current phase, or the model loading, began
    phases_left: int = 0
    # Seconds each phase took in this run so far (oldest first), and LOAD for building the trainer.
    history: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    last_error: str | None = None
    last_traceback: str | None = None
    message: str | None = None
    phases: tuple[str, ...] = PHASES  # one round's phases (with label for a human or judge run)

    @property
    def busy(self) -> bool:
        return self.status in ("loading", "running", "pausing", "stopping")

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0

    @property
    def shown_round(self) -> int:
        """The round to name: the cursor sits at ``num_rounds + 1`` once the last round is done."""
        return min(self.round_index, self.num_rounds) if self.num_rounds else self.round_index

    def elapsed(self, now: float | None = None) -> float:
        """Seconds since the current phase (or the model loading) began; 0 when nothing runs."""
        if not self.busy or self.started_at is None:
            return 0.0
        return max(0.0, (time.time() if now is None else now) - self.started_at)

    def eta(self, now: float | None = None) -> float | None:
        """Seconds the current phase, or the model loading, has left (``eta.phase_eta``); None when unknown."""
        if not self.busy:
            return None
        if self.status == "loading":
            return eta.phase_eta(self.elapsed(now), 0, 0, self.history.get(LOAD))
        return eta.phase_eta(self.elapsed(now), self.done, self.total, self.history.get(self.phase or ""))

    def queue_eta(self, now: float | None = None) -> float | None:
        """Seconds until every queued phase is done; None until each of them has run once in this run."""
        phase = self.phase or self.next_phase
        if not self.busy or phase is None:
            return None
        queued = eta.queued_phases(phase, self.phases_left, self.phases)
        # While the models load, the first queued phase has not begun: all of it is still to come.
        later = queued if self.status == "loading" else queued[1:]
        return eta.queue_eta(self.eta(now), later, self.history)


class EngineControl(PhaseControl):
    """PhaseControl that publishes progress through ``publish`` and honours stop requests.

    ``publish(**changes)`` receives the Progress fields that changed; the manager hands in a function bound to
    the run, so the control never reaches into the manager.
    """

    def __init__(self, publish: Callable[..., None]):
        super().__init__()
        self._publish_changes = publish
        self.cancel_event = threading.Event()

    def begin(self, round_index: int, phase: str, total: int) -> None:
        super().begin(round_index, phase, total)
        self._publish(started_at=time.time())

    def advance(self, count: int = 1, tokens: int = 0) -> None:
        self.done += int(count)
        self.tokens += int(tokens)
        self._publish()
        self.check_cancel()

    def cancel_requested(self) -> bool:
        return self.cancel_event.is_set()

    def _publish(self, **extra: Any) -> None:
        elapsed = max(1e-9, time.monotonic() - self.started_at)
        self._publish_changes(
            round_index=self.round_index,
            phase=self.phase,
            done=self.done,
            total=self.total,
            tokens=self.tokens,
            tokens_per_second=self.tokens / elapsed,
            **extra,
        )


def _phase_history(run: Run) -> dict[str, tuple[float, ...]]:
    """How long each phase took in a reopened run (its ``time/<phase>_seconds`` metrics), oldest first."""
    if run.store is None:
        return {}
    names = {metric_names.name(metric_names.PHASE_SECONDS, phase=p): p for p in ALL_PHASES}
    rows = run.store.metrics(run.run_id, names=list(names))
    history: dict[str, list[float]] = {}
    for name, value in zip(rows["name"], rows["value"], strict=True):
        history.setdefault(names[name], []).append(float(value))
    return {phase: tuple(values) for phase, values in history.items()}


def _describe(count: int, round_index: int, phase: str) -> str:
    where = f"{phase} of round {round_index}"
    return where if count == 1 else f"{count} phases from {where}"


class RunManager:
    """Owns the open runs of one process and the worker thread of each."""

    def __init__(self, runs_root: str | Path = "runs"):
        self.runs_root = Path(runs_root)
        self.runs_root.mkdir(parents=True, exist_ok=True)
        self._runs: dict[str, Run] = {}
        self._controls: dict[str, EngineControl] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._progress: dict[str, Progress] = {}
        self._pause: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        # Seconds of the last trainer builds in this process, for the next load's estimate (any run: the first
        # build also imports torch and transformers, later ones only load weights).
        self._load_seconds: list[float] = []

    # Runs --------------------------------------------------------------------------------------------------
    def create(self, spec: ExperimentSpec) -> str:
        run = Run.create(spec, self.runs_root)
        self._register(run)
        return run.run_id

    def open(
        self, run_dir: str | Path, secrets: dict[str, Any] | None = None, *, trust_checkpoint: bool = False
    ) -> str:
        run_dir = Path(run_dir)
        for run in self._runs.values():
            if run.run_dir.resolve() == run_dir.resolve():
                return run.run_id
        run = Run.open(run_dir, secrets=secrets, trust_checkpoint=trust_checkpoint)
        self._register(run)
        return run.run_id

    def _register(self, run: Run) -> None:
        control = EngineControl(functools.partial(self._update, run.run_id))
        run.attach_control(control)
        round_index, next_phase = run.cursor()
        history = _phase_history(run)
        with self._lock:
            self._runs[run.run_id] = run
            self._controls[run.run_id] = control
            self._pause[run.run_id] = threading.Event()
            self._progress[run.run_id] = Progress(
                run_id=run.run_id,
                status="finished" if next_phase is None else "idle",
                round_index=round_index,
                num_rounds=run.num_rounds,
                next_phase=next_phase,
                history=history,
                phases=run.phases,
            )

    def run(self, run_id: str) -> Run:
        try:
            return self._runs[run_id]
        except KeyError:
            raise KeyError(f"no open run {run_id!r}") from None

    def open_runs(self) -> list[str]:
        return list(self._runs)

    def forget(self, run_id: str) -> None:
        """Close an idle run and let go of it (before its folder is archived or deleted); refused while it works."""
        with self._lock:
            if run_id not in self._runs:
                return
            if self._progress[run_id].busy:
                raise RuntimeError(f"run {run_id} is {self._progress[run_id].status}: pause or stop it first")
            run = self._runs.pop(run_id)
            for table in (self._controls, self._threads, self._progress, self._pause):
                table.pop(run_id, None)
        run.close()

    # Commands ----------------------------------------------------------------------------------------------
    def start(
        self, run_id: str, *, phases: int | None = None, rounds: int | None = None, phase: str | None = None
    ) -> None:
        """Run ``phase`` (checked against the cursor), or the next ``phases`` phases, or ``rounds`` whole rounds."""
        run = self.run(run_id)
        with self._lock:
            thread = self._threads.get(run_id)
            if thread is not None and thread.is_alive():
                raise InvalidTransition(f"run {run_id} is already running a phase; pause or stop it first")
            round_index, next_phase = run.cursor()
            if next_phase is None:
                raise InvalidTransition(f"run {run_id} has finished all its rounds")
            if phase is not None:
                check_next_phase(phase, round_index, next_phase)  # refused here, not later in the worker thread
            order = run.phases
            left = len(order) * (run.num_rounds - round_index + 1) - order.index(next_phase)
            if rounds is not None:
                count = len(order) * int(rounds) - order.index(next_phase)
            else:
                count = 1 if phases is None else int(phases)
            if count < 1:
                raise ValueError("nothing to run: ask for at least one phase or round")
            count = min(count, left)  # "run 10**6 rounds" means to the end; the queue never outruns the run
            self._pause[run_id].clear()
            self._controls[run_id].cancel_event.clear()
            before = self._progress[run_id]
            loading = run.trainer is None
            self._progress[run_id] = replace(
                before,
                status="loading" if loading else "running",
                phases_left=count,
                done=0,
                total=0,
                started_at=time.time(),
                history={**before.history, LOAD: tuple(self._load_seconds)},
                last_error=None,
                last_traceback=None,
                message=None,
            )
            worker = threading.Thread(target=self._work, args=(run_id, count), name=f"comlrl-run-{run_id}", daemon=True)
            self._threads[run_id] = worker
        committed = (round_index, next_phase) != (1, "collect")
        verb = "resumed" if committed or before.status in ("paused", "error") else "started"
        run.log("info", f"{verb}: {_describe(count, round_index, next_phase)}", round=round_index, phase=next_phase)
        worker.start()

    def pause(self, run_id: str) -> None:
        """Finish the current phase, then stop."""
        self._pause[run_id].set()
        self._update(run_id, status="pausing")
        now = self.progress(run_id)
        self._runs[run_id].log(
            "info", f"pause asked: the run stops after {now.phase or now.next_phase}", round=now.round_index
        )

    def stop(self, run_id: str) -> None:
        """Cancel the current phase now; the run returns to its last finished phase."""
        self._pause[run_id].set()
        self._controls[run_id].cancel_event.set()
        self._update(run_id, status="stopping")
        now = self.progress(run_id)
        self._runs[run_id].log(
            "info", f"stop asked during {now.phase or now.next_phase}", round=now.round_index, phase=now.phase
        )

    def wait(self, run_id: str, timeout: float | None = None) -> Progress:
        thread = self._threads.get(run_id)
        if thread is not None:
            thread.join(timeout)
        return self.progress(run_id)

    def progress(self, run_id: str) -> Progress:
        with self._lock:
            return self._progress[run_id]

    def release(self, run_id: str) -> None:
        """Forget an idle run: its trainer (models) is dropped and its store closed; ``open`` brings it back."""
        if self.progress(run_id).busy:
            raise InvalidTransition(f"run {run_id} is busy; pause or stop it before releasing it")
        self.wait(run_id)
        with self._lock:
            run = self._runs.pop(run_id)
            for table in (self._controls, self._threads, self._progress, self._pause):
                table.pop(run_id, None)
        run.close()

    def close(self) -> None:
        for run_id in list(self._runs):
            if self.progress(run_id).busy:
                self.stop(run_id)
            self.wait(run_id, timeout=60)
            self._runs[run_id].close()
        self._runs.clear()

    # Worker ------------------------------------------------------------------------------------------------
    def _update(self, run_id: str, **changes: Any) -> None:
        with self._lock:
            self._progress[run_id] = replace(self._progress[run_id], **changes)

    def _record(self, run_id: str, name: str, seconds: float) -> None:
        """Add ``seconds`` to the history of ``name`` (a phase, or LOAD) for the estimates that follow."""
        with self._lock:
            now = self._progress[run_id]
            history = {**now.history, name: (*now.history.get(name, ()), float(seconds))}
            self._progress[run_id] = replace(now, history=history)

    def _work(self, run_id: str, count: int) -> None:
        run = self._runs[run_id]
        try:
            if run.trainer is None:
                began = time.monotonic()
                run.ensure_trainer()
                seconds = time.monotonic() - began
                self._load_seconds.append(seconds)
                self._record(run_id, LOAD, seconds)
                run.log("info", f"models loaded in {seconds:.1f} s")
        except BaseException as error:  # model loading, task loading, config; see the phase's below
            round_index, phase = run.cursor()
            run.record_failure(error, round=round_index, phase=phase)
            self._update(
                run_id,
                status="error",
                last_error=f"{type(error).__name__}: {error}",
                last_traceback=traceback.format_exc(),
                phases_left=0,
            )
            return
        paused = stopped = False
        for left in range(count, 0, -1):
            if self._pause[run_id].is_set():
                # A stop asked before a phase began (while the models loaded) leaves the run idle, as a stop does.
                stopped = self._controls[run_id].cancel_event.is_set()
                paused = not stopped
                break
            trainer = run.trainer
            if trainer.finished:
                break
            self._update(
                run_id,
                status="running",
                phases_left=left,
                round_index=trainer.round_index,
                phase=trainer.next_phase,
                next_phase=trainer.next_phase,
                done=0,
                total=0,
                started_at=time.time(),
            )
            where = {"round": trainer.round_index, "phase": trainer.next_phase}
            began = time.monotonic()
            try:
                run.step()
            except AwaitingLabels as waiting:
                self._update(run_id, status="awaiting labels", message=str(waiting), **self._cursor_fields(run))
                return
            except PhaseCancelled as cancelled:
                self._update(
                    run_id,
                    status="idle",
                    message=f"stopped: {cancelled}; back at the last finished phase",
                    **self._cursor_fields(run),
                )
                return
            except BaseException:
                # Not only Exception: a SystemExit (a reward function's sys.exit(), a library's exit()) would end
                # this thread silently, and the run would look busy for ever to the app and the CLI. In a worker
                # thread it cannot end the process anyway.
                self._update(
                    run_id,
                    status="error",
                    last_error=run.last_error,
                    last_traceback=run.last_traceback,
                    phases_left=0,
                    **self._cursor_fields(run),
                )
                return
            seconds = time.monotonic() - began
            self._record(run_id, where["phase"], seconds)
            run.log("info", f"{where['phase']} of round {where['round']} done in {seconds:.1f} s", **where)
            self._update(
                run_id, message=(run.trainer.last_message if run.trainer else None), **self._cursor_fields(run)
            )
        if run.trainer is not None and run.trainer.finished:
            final = "finished"
            run.log("info", f"finished: all {run.num_rounds} rounds")
        else:
            final = "paused" if paused else "idle"
            if paused or stopped:
                round_index, next_phase = run.cursor()
                verb = "paused" if paused else "stopped"
                run.log("info", f"{verb} before {next_phase} of round {round_index}", round=round_index)
        self._update(run_id, status=final, phases_left=0, **self._cursor_fields(run))

    @staticmethod
    def _cursor_fields(run: Run) -> dict[str, Any]:
        round_index, next_phase = run.cursor()
        return {"round_index": round_index, "next_phase": next_phase, "phase": None}
