"""Run a grid from the workbench: the sweeps this server runs, and the panel that starts and watches one.

A ``SweepBoard`` (one per server, ``st.cache_resource``) starts ``engine.sweep.SweepRunner``s on the workspace's own
``RunManager``, so every cell is also an ordinary run that the other pages open. The panel takes a past run as the
base experiment, up to two config fields with their values (typed by the field, as ``comlrl-lab sweep --grid``
does), a number of seeds and how many cells run at once. Where Slurm can be reached (submitit installed, ``sbatch``
and ``srun`` on PATH) it also offers the Slurm launcher, which submits the cells as one job array
(``engine.cluster``) and leaves them to the cluster. The sweep a session started or opened is followed by a
fragment that polls its progress (the board's, or for any other sweep its manifest and its runs' snapshots, the
files a sweep run elsewhere leaves in the shared runs folder), and the Compare page's tag filter is set to the
sweep, so its curves fill in as cells finish. Nothing here trains.
"""

from __future__ import annotations

import threading
from dataclasses import fields
from pathlib import Path

import streamlit as st

from comlrl_lab.engine import ExperimentSpec, cluster, eta
from comlrl_lab.engine.run import SPEC_FILE
from comlrl_lab.engine.sweep import (
    MANIFEST_FILE,
    MAX_SWEEP_CELLS,
    SWEEPS_DIR,
    Sweep,
    SweepProgress,
    SweepRunner,
    check_sweep_size,
    parse_grid,
)
from comlrl_lab.ui import components, services, state
from comlrl_lab.ui.compare import RunEntry

GRID_ROWS = 2
THIS_SERVER, SLURM = "This server", "Slurm cluster"
LAUNCHER_NAMES = {cluster.SLURM: "Slurm", cluster.SUBMITIT_LOCAL: "local submitit"}
#: Seconds between looks at a cluster sweep's progress (squeue is asked each time); a sweep on this server is
#: polled as the run panel is (``components.PANEL_POLL_S``).
POLL_CLUSTER_S = 5.0


def new_sweep(
    base_dir: Path,
    entries: list[str],
    *,
    seeds: int,
    parallel: int,
    launcher: dict | None = None,
    confirmed: bool = False,
) -> Sweep:
    """The sweep of ``entries`` (none: seeds alone) over a past run's spec, written to the workspace (its size
    bounded unless ``confirmed``, every cell's config checked first, CoMLRL's messages); nothing runs yet. The cell
    with the base run's settings and seed is the base run itself, once that has finished."""
    spec = ExperimentSpec.load(base_dir / SPEC_FILE)
    spec.tags = []  # the base run's own tags (an earlier sweep's) must not mark the new cells
    grid = parse_grid(spec.config_class, entries)
    root = services.workspace().root
    check_sweep_size(spec, grid, seeds=seeds, runs_root=root, confirmed=confirmed)
    return Sweep.create(
        spec, grid, seeds=seeds, runs_root=root, parallel=parallel, launcher=launcher, base_run=base_dir
    )


class SweepBoard:
    """The sweeps started from this server, by sweep id."""

    def __init__(self) -> None:
        self._runners: dict[str, SweepRunner] = {}
        self._lock = threading.Lock()

    def start(self, base_dir: Path, entries: list[str], *, seeds: int, parallel: int, confirmed: bool = False) -> str:
        """Make the sweep and start it in the background, on this server."""
        sweep = new_sweep(base_dir, entries, seeds=seeds, parallel=parallel, confirmed=confirmed)
        runner = SweepRunner(sweep, services.workspace().manager)
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


def submit_to_slurm(
    base_dir: Path, entries: list[str], *, seeds: int, options: cluster.ClusterOptions, confirmed: bool = False
) -> str:
    """Make the sweep and submit its cells as one Slurm job array; the cluster runs them."""
    launcher = options.launcher(cluster.SLURM)
    sweep = new_sweep(base_dir, entries, seeds=seeds, parallel=1, launcher=launcher, confirmed=confirmed)
    cluster.submit(sweep, sweep.unfinished, cluster.SLURM, options)
    return sweep.sweep_id


def grid_panel(entries: list[RunEntry]) -> None:
    """The "Run a grid" form: a base run, up to two fields with their values (or none: more seeds of the base
    run), seeds, and where the cells run."""
    with st.expander("Run a grid", icon=":material/grid_view:", expanded=state.SWEEP_ID in st.session_state):
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
        on_slurm = cluster.slurm_available() and (
            st.radio(
                "Launcher",
                [THIS_SERVER, SLURM],
                key=state.SWEEP_LAUNCHER,
                horizontal=True,
                help="Slurm submits one job array, a job per cell, and returns; the cells fill this page in as "
                "they finish, read from the shared runs folder.",
            )
            == SLURM
        )
        # Enter in a Values box must not start a grid: only the button does.
        with st.form(state.SWEEP_FORM, border=False, enter_to_submit=False):
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
                    placeholder="V1,V2 (none for an optional field; JSON for a list; nearest_k:k=4 brings k along)",
                )
                if name and values.strip():
                    rows.append(f"{name}={values}")
            st.caption(
                "A value that needs fields of its own brings them along: their suggested values, as Setup fills them "
                "in, or those written after a colon (`nearest_k:k=4`). A field that does not apply to a cell is left "
                "out of it. With no field, the grid is more seeds of the base run."
            )
            left, right = st.columns(2)
            seeds = left.number_input(
                "Seeds",
                min_value=1,
                max_value=20,
                value=2,
                key=state.SWEEP_SEEDS,
                help="Seeds per grid point, counting up from the base run's seed. A cell with the base run's settings "
                "and seed is the base run itself (once it has finished), so no field and 3 seeds adds two runs.",
            )
            parallel = right.number_input("Runs at once", min_value=1, max_value=8, value=1, key=state.SWEEP_PARALLEL)
            confirmed = st.checkbox(
                "Run it even when it is large",
                key=state.SWEEP_CONFIRM,
                help=f"A grid of more than {MAX_SWEEP_CELLS} runs, or one that needs more disk than is free, starts "
                "only with this ticked; the refusal shows its size first.",
            )
            if on_slurm:
                options = _slurm_fields()
            submitted = st.form_submit_button(
                "Submit the grid" if on_slurm else "Run the grid",
                key=state.SWEEP_START,
                type="primary",
                icon=":material/play_arrow:",
            )
        if submitted:
            try:
                if on_slurm:
                    new_id = submit_to_slurm(
                        by_id[base].run_dir,
                        rows,
                        seeds=int(seeds),
                        options=cluster.ClusterOptions(**options, array_parallelism=int(parallel)),
                        confirmed=confirmed,
                    )
                else:
                    new_id = board().start(
                        by_id[base].run_dir, rows, seeds=int(seeds), parallel=int(parallel), confirmed=confirmed
                    )
            except (ValueError, FileNotFoundError) as error:
                st.error(str(error))
                return
            except RuntimeError as error:  # sbatch refused the array: its message
                st.error(f"The submission failed: {error}")
                return
            follow(new_id)
            st.rerun()


def _slurm_fields() -> dict:
    """The Slurm options the form asks for; the CLI takes the rest (``comlrl-lab sweep --help``)."""
    left, middle, right = st.columns(3)
    default = cluster.ClusterOptions()
    return {
        "partition": left.text_input("Partition", key=state.SWEEP_PARTITION, placeholder="the cluster's default")
        or None,
        "time": middle.text_input("Time limit per job", value=default.time, key=state.SWEEP_TIME),
        "gpus_per_run": int(
            right.number_input(
                "GPUs per run", min_value=0, max_value=8, value=default.gpus_per_run, key=state.SWEEP_GPUS
            )
        ),
    }


def sweep_picker() -> None:
    """Open a sweep (started here, by ``comlrl-lab sweep``, or on a cluster) in the Compare page: its tag becomes
    the filter, and the sweep is followed as it fills in."""
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
        on_change=lambda: follow(st.session_state[state.SWEEP_OPEN]) if st.session_state[state.SWEEP_OPEN] else None,
    )
    sweep_id = st.session_state.get(state.SWEEP_ID)
    if sweep_id is not None and (folder / sweep_id / MANIFEST_FILE).is_file():
        _progress(sweep_id)


def follow(sweep_id: str) -> None:
    """Follow the sweep: its progress below the picker, and the Compare page's filters on its runs."""
    st.session_state[state.SWEEP_ID] = sweep_id
    show_sweep(sweep_id)


def show_sweep(sweep_id: str) -> None:
    """Point the Compare page's filters at the sweep's runs (call before its widgets are drawn)."""
    st.session_state[state.COMPARE_TAGS] = [sweep_id]
    st.session_state[state.COMPARE_ALGORITHMS] = []
    st.session_state[state.COMPARE_TASKS] = []


def sweep_status(sweep_id: str) -> tuple[SweepProgress, dict[str, int], str]:
    """Where the sweep stands: from this server's runner when it runs here, else from its files (the manifest and
    the runs' snapshots), for a sweep of the command line or of a cluster. Also the count of each cell state and
    the launcher's kind."""
    live = board().progress(sweep_id)
    if live is not None:
        return live, {}, cluster.LOCAL
    sweep = Sweep.open(services.runs_root() / SWEEPS_DIR / sweep_id)
    states = cluster.cell_states(sweep, strict=False)
    return sweep.progress(states), {s: states.count(s) for s in states}, sweep.launcher.get("kind", cluster.LOCAL)


def _progress(sweep_id: str) -> None:
    started, _, kind = sweep_status(sweep_id)

    @st.fragment(
        run_every=(components.PANEL_POLL_S if kind == cluster.LOCAL else POLL_CLUSTER_S) if started.busy else None
    )
    def panel() -> None:
        now, counts, _ = sweep_status(sweep_id)
        if (now.finished, now.busy) != (started.finished, started.busy):
            st.rerun()  # a cell finished: its runs and curves join the page
        text = f"Sweep `{sweep_id}`: {now.finished}/{now.cells} runs finished"
        if now.running:
            text += f", {now.running} running"
        queued = counts.get("submitted", 0) + counts.get("requeued", 0)
        if queued:
            text += f", {queued} queued"
        if counts.get("lost"):
            text += f", {counts['lost']} lost"
        if now.errors:
            text += f", {now.errors} failed"
        if now.eta_seconds is not None:
            text += f", about {eta.text(now.eta_seconds)} left"
        st.progress(now.fraction, text=text)
        live = board().progress(sweep_id) is not None
        if now.busy and live:
            if st.button("Stop the sweep", key=state.SWEEP_STOP, icon=":material/stop:"):
                board().stop(sweep_id)
        elif now.finished == now.cells:
            st.success("The sweep has finished: the Compare page shows its runs.", icon=":material/check:")
        if kind != cluster.LOCAL:
            sweep_dir = services.runs_root() / SWEEPS_DIR / sweep_id
            st.caption(
                f"Cells run as {LAUNCHER_NAMES.get(kind, kind)} jobs. Each cell's job and round: `comlrl-lab sweep status {sweep_dir}`; "
                f"failed or lost cells go again with `comlrl-lab sweep --resume {sweep_dir}`."
            )

    panel()
