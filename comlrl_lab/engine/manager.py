"""Runs experiments in worker threads: one phase, N phases or N rounds; pause, stop, and live progress.

The workbench holds one ``RunManager`` (in ``st.cache_resource``). Worker threads never touch Streamlit: they
step a ``Run`` and update a small lock-protected progress record that pages poll. ``pause`` lets the current
phase finish and then stops; ``stop`` cancels the current phase cooperatively (it is rolled back to the last
finished phase, so nothing committed is lost). Errors stop the queue with the traceback kept for the page.
"""

from __future__ import annotations

import functools
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from comlrl_lab.engine.run import Run
from comlrl_lab.engine.spec import ExperimentSpec
from comlrl_lab.names.phases import InvalidTransition, check_next_phase
from comlrl_lab.trainers.preference.sink import PHASES, PhaseCancelled, PhaseControl


@dataclass(frozen=True)
class Progress:
    """What a page shows about a run; a copy, safe to read from any thread."""

    run_id: str
    status: str = "idle"  # idle | loading | running | pausing | paused | stopping | error | finished
    round_index: int = 1
    phase: str | None = None
    next_phase: str | None = "collect"
    done: int = 0
    total: int = 0
    tokens: int = 0
    tokens_per_second: float = 0.0
    eta_seconds: float | None = None
    phases_left: int = 0
    last_error: str | None = None
    last_traceback: str | None = None
    message: str | None = None

    @property
    def busy(self) -> bool:
        return self.status in ("loading", "running", "pausing", "stopping")

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0


class EngineControl(PhaseControl):
    """PhaseControl that publishes progress through ``publish`` and honours stop requests.

    ``publish(**changes)`` receives the Progress fields that changed; the manager hands in a function bound to
    the run, so the control never reaches into the manager.
    """

    def __init__(self, publish: Callable[..., None]):
        super().__init__()
        self._publish_changes = publish
        self.cancel_event = threading.Event()
        self.phase_seconds: dict[str, list[float]] = {}  # phase -> wall times of its earlier runs, oldest first

    def record_phase(self, phase: str, seconds: float) -> None:
        """Remember how long ``phase`` took, for the next round's estimate."""
        self.phase_seconds.setdefault(phase, []).append(float(seconds))

    def begin(self, round_index: int, phase: str, total: int) -> None:
        super().begin(round_index, phase, total)
        self._publish()

    def advance(self, count: int = 1, tokens: int = 0) -> None:
        self.done += int(count)
        self.tokens += int(tokens)
        self._publish()
        self.check_cancel()

    def cancel_requested(self) -> bool:
        return self.cancel_event.is_set()

    def _publish(self) -> None:
        elapsed = max(1e-9, time.monotonic() - self.started_at)
        rate = self.done / elapsed if self.done else 0.0
        eta = (self.total - self.done) / rate if rate > 0 and self.total >= self.done else None
        past = self.phase_seconds.get(self.phase or "", [])[-3:]
        if past:
            # A phase's steps are not equally long (train fits a reward model, then learns the policy), so its own
            # count extrapolates badly; the same phase in earlier rounds is the better guide.
            eta = max(0.0, sum(past) / len(past) - elapsed)
        self._publish_changes(
            round_index=self.round_index,
            phase=self.phase,
            done=self.done,
            total=self.total,
            tokens=self.tokens,
            tokens_per_second=self.tokens / elapsed,
            eta_seconds=eta,
        )


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
        with self._lock:
            self._runs[run.run_id] = run
            self._controls[run.run_id] = control
            self._pause[run.run_id] = threading.Event()
            self._progress[run.run_id] = Progress(
                run_id=run.run_id,
                status="finished" if next_phase is None else "idle",
                round_index=round_index,
                next_phase=next_phase,
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
            if rounds is not None:
                count = len(PHASES) * int(rounds) - PHASES.index(next_phase)
            else:
                count = 1 if phases is None else int(phases)
            if count < 1:
                raise ValueError("nothing to run: ask for at least one phase or round")
            self._pause[run_id].clear()
            self._controls[run_id].cancel_event.clear()
            self._progress[run_id] = replace(
                self._progress[run_id],
                status="loading" if run.trainer is None else "running",
                phases_left=count,
                last_error=None,
                last_traceback=None,
                message=None,
            )
            worker = threading.Thread(target=self._work, args=(run_id, count), name=f"comlrl-run-{run_id}", daemon=True)
            self._threads[run_id] = worker
        worker.start()

    def pause(self, run_id: str) -> None:
        """Finish the current phase, then stop."""
        self._pause[run_id].set()
        self._update(run_id, status="pausing")

    def stop(self, run_id: str) -> None:
        """Cancel the current phase now; the run returns to its last finished phase."""
        self._pause[run_id].set()
        self._controls[run_id].cancel_event.set()
        self._update(run_id, status="stopping")

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

    def _work(self, run_id: str, count: int) -> None:
        run = self._runs[run_id]
        try:
            run.ensure_trainer()
        except Exception as error:  # model loading, task loading, config
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
        paused = False
        for left in range(count, 0, -1):
            if self._pause[run_id].is_set():
                paused = True
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
            )
            phase, began = trainer.next_phase, time.monotonic()
            try:
                run.step()
            except PhaseCancelled as cancelled:
                self._update(
                    run_id,
                    status="idle",
                    message=f"stopped: {cancelled}; back at the last finished phase",
                    **self._cursor_fields(run),
                )
                return
            except Exception:
                self._update(
                    run_id,
                    status="error",
                    last_error=run.last_error,
                    last_traceback=run.last_traceback,
                    phases_left=0,
                    **self._cursor_fields(run),
                )
                return
            self._controls[run_id].record_phase(phase, time.monotonic() - began)
            self._update(
                run_id, message=(run.trainer.last_message if run.trainer else None), **self._cursor_fields(run)
            )
        if run.trainer is not None and run.trainer.finished:
            final = "finished"
        else:
            final = "paused" if paused else "idle"
        self._update(run_id, status=final, phases_left=0, **self._cursor_fields(run))

    @staticmethod
    def _cursor_fields(run: Run) -> dict[str, Any]:
        round_index, next_phase = run.cursor()
        return {"round_index": round_index, "next_phase": next_phase, "phase": None}
