"""Run a grid from the workbench: the sweeps this server runs, and the panel that starts and watches one.

A ``SweepBoard`` (one per server, ``st.cache_resource``) starts ``engine.sweep.SweepRunner``s on the workspace's own
``RunManager``, so every cell is also an ordinary run that the other pages open. The panel takes a past run as the
base experiment, up to two config fields with their values (typed by the field, as ``comlrl-lab sweep --grid``
does), a number of seeds and how many cells run at once; while the sweep runs, a fragment polls its progress, and
the Compare page's tag filter is set to the sweep, so its curves fill in as cells finish. Nothing here trains.
"""

from __future__ import annotations

import threading
from dataclasses import fields
from pathlib import Path

import streamlit as st

from comlrl_lab.engine import ExperimentSpec, eta
from comlrl_lab.engine.run import SPEC_FILE
from comlrl_lab.engine.sweep import MANIFEST_FILE, SWEEPS_DIR, Sweep, SweepProgress, SweepRunner, parse_grid
from comlrl_lab.ui import components, services, state
from comlrl_lab.ui.compare import RunEntry

GRID_ROWS = 2


class SweepBoard:
    """The sweeps started from this server, by sweep id."""

    def __init__(self) -> None:
        self._runners: dict[str, SweepRunner] = {}
        self._lock = threading.Lock()

    def start(self, base_dir: Path, entries: list[str], *, seeds: int, parallel: int) -> str:
        """Make the sweep (every cell's config checked first, CoMLRL's messages) and start it in the background."""
        ws = services.workspace()
        spec = ExperimentSpec.load(base_dir / SPEC_FILE)
        spec.tags = []  # the base run's own tags (an earlier sweep's) must not mark the new cells
        grid = parse_grid(spec.config_class, entries)
        sweep = Sweep.create(spec, grid, seeds=seeds, runs_root=ws.root, parallel=parallel)
        runner = SweepRunner(sweep, ws.manager)
        with self._lock:
            self._runners[sweep.sweep_id] = runner
        runner.start()
        return sweep.sweep_id

    def progress(self, sweep_id: str) -> SweepProgress | None:
        runner = self._runners.get(sweep_id)
        return None if runner is None else runner.progress()

    def wait(self, sweep_id: str, timeout: float | None = None) -> SweepProgress | None:
        runner = self._runners.get(sweep_id)
        return None if runner is None else runner.wait(timeout)

    def stop(self, sweep_id: str) -> None:
        runner = self._runners.get(sweep_id)
        if runner is not None:
            runner.stop()


@st.cache_resource(show_spinner=False)
def _board(root: str) -> SweepBoard:
    return SweepBoard()


def board() -> SweepBoard:
    """This server's sweeps (shared by every session)."""
    return _board(str(services.runs_root()))


def grid_panel(entries: list[RunEntry]) -> None:
    """The "Run a grid" form and, once started, the live progress of the sweep this session started."""
    with st.expander("Run a grid", icon=":material/grid_view:", expanded=state.SWEEP_ID in st.session_state):
        sweep_id = st.session_state.get(state.SWEEP_ID)
        if sweep_id is not None and board().progress(sweep_id) is not None:
            _progress(sweep_id)
        if not entries:
            st.caption("Create a run on the Setup page first: a grid varies a past run's settings.")
            return
        by_id = {e.run_id: e for e in entries}
        current = state.current_run_id()
        ids = list(by_id)
        base = st.selectbox(
            "Base run",
            ids,
            index=ids.index(current) if current in ids else 0,
            key=state.SWEEP_BASE,
            help="Its spec is copied into every cell; the grid overrides the fields below.",
        )
        with st.form(state.SWEEP_FORM, border=False):
            names = sorted(f.name for f in fields(ExperimentSpec.load(by_id[base].run_dir / SPEC_FILE).config_class))
            rows = []
            for i in range(GRID_ROWS):
                left, right = st.columns([1, 2])
                name = left.selectbox(
                    f"Field {i + 1}", names, index=None, key=state.sweep_field_key(i), placeholder="a config field"
                )
                values = right.text_input(
                    f"Values {i + 1}",
                    key=state.sweep_values_key(i),
                    placeholder="V1,V2 (none for an optional field; JSON for a list)",
                )
                if name and values.strip():
                    rows.append(f"{name}={values}")
            left, right = st.columns(2)
            seeds = left.number_input("Seeds", min_value=1, max_value=20, value=2, key=state.SWEEP_SEEDS)
            parallel = right.number_input("Runs at once", min_value=1, max_value=8, value=1, key=state.SWEEP_PARALLEL)
            submitted = st.form_submit_button(
                "Run the grid", key=state.SWEEP_START, type="primary", icon=":material/play_arrow:"
            )
        if submitted:
            if not rows:
                st.error("Choose at least one field and its values.")
                return
            try:
                new_id = board().start(by_id[base].run_dir, rows, seeds=int(seeds), parallel=int(parallel))
            except (ValueError, FileNotFoundError) as error:
                st.error(str(error))
                return
            st.session_state[state.SWEEP_ID] = new_id
            show_sweep(new_id)
            st.rerun()


def sweep_picker() -> None:
    """Open a sweep (started here or by ``comlrl-lab sweep``) in the Compare page: its tag becomes the filter."""
    folder = services.runs_root() / SWEEPS_DIR
    found = (
        sorted((p.name for p in folder.iterdir() if (p / MANIFEST_FILE).is_file()), reverse=True)
        if folder.is_dir()
        else []
    )
    if not found:
        return
    st.selectbox(
        "Open a sweep",
        found,
        index=None,
        key=state.SWEEP_OPEN,
        placeholder="Show the runs of a sweep",
        on_change=lambda: (
            show_sweep(st.session_state[state.SWEEP_OPEN]) if st.session_state[state.SWEEP_OPEN] else None
        ),
    )


def show_sweep(sweep_id: str) -> None:
    """Point the Compare page's filters at the sweep's runs (call before its widgets are drawn)."""
    st.session_state[state.COMPARE_TAGS] = [sweep_id]
    st.session_state[state.COMPARE_ALGORITHMS] = []
    st.session_state[state.COMPARE_TASKS] = []


def _progress(sweep_id: str) -> None:
    started = board().progress(sweep_id)

    @st.fragment(run_every=components.PANEL_POLL_S if started is not None and started.busy else None)
    def panel() -> None:
        now = board().progress(sweep_id)
        if now is None:
            return
        if started is not None and (now.finished, now.busy) != (started.finished, started.busy):
            st.rerun()  # a cell finished: its runs and curves join the page
        text = f"Sweep `{sweep_id}`: {now.finished}/{now.cells} runs finished"
        if now.running:
            text += f", {now.running} running"
        if now.errors:
            text += f", {now.errors} failed"
        if now.eta_seconds is not None:
            text += f", about {eta.text(now.eta_seconds)} left"
        st.progress(now.fraction, text=text)
        if now.busy:
            if st.button("Stop the sweep", key=state.SWEEP_STOP, icon=":material/stop:"):
                board().stop(sweep_id)
        elif now.finished == now.cells:
            st.success("The sweep has finished: the Compare page shows its runs.", icon=":material/check:")

    panel()
