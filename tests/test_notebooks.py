"""The tutorial notebooks run top to bottom on the embedded tiny model, and match the script that writes them.

Notebook 05 runs SmolLM2-135M-Instruct instead and is committed executed (``build_notebooks.EXECUTED``): it runs here
only where that model is registered (``real_model``).

Each notebook asserts on its own outputs inside its cells (pairs written, shares that sum to one, weights that
match the formula, ...), so a failing assertion fails here with the cell's traceback. Outputs go to a temporary
folder through ``COMLRL_LAB_NOTEBOOK_DIR``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_scripts import load_repo_script

from comlrl_lab.models.registry import SMOLLM2_135M_INSTRUCT, registered_path

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXECUTED = load_repo_script("scripts/build_notebooks.py", "build_notebooks").EXECUTED
REAL_MODEL = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        registered_path(SMOLLM2_135M_INSTRUCT.name) is None,
        reason=f"{SMOLLM2_135M_INSTRUCT.name} is not registered (comlrl-lab models add {SMOLLM2_135M_INSTRUCT.name})",
    ),
]


def _runnable(path: Path):
    return pytest.param(path, marks=REAL_MODEL, id=path.stem) if path.name in EXECUTED else path


CELL_TIMEOUT_S = 300


def test_the_notebooks_exist_and_are_up_to_date_with_their_builder():
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.ipynb",
        "02_analyze_pairs.ipynb",
        "03_custom_task.ipynb",
        "04_compare_replay_modes.ipynb",
        "05_real_model.ipynb",
        "06_human_and_judge_labels.ipynb",
    ]
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_notebooks.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_has_no_outputs_unless_it_is_committed_executed(path):
    nb = nbformat.read(path, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    if path.name in EXECUTED:  # run top to bottom once, in order, without an error
        assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), f"{path.name}: execute it"
        assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
        return
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear the outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", [_runnable(p) for p in NOTEBOOKS], ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    tiny = ROOT / "comlrl_lab" / "models" / "tiny" / "config.json"
    if "COMLRL_LAB_NOTEBOOK_MODEL" not in os.environ:
        assert tiny.is_file(), "the embedded tiny model is missing: python scripts/train_tiny_lm.py"
    # The kernel inherits this environment: outputs under tmp_path, and no plotly renderer that opens a browser.
    monkeypatch.setenv("COMLRL_LAB_NOTEBOOK_DIR", str(tmp_path))
    monkeypatch.setenv("PLOTLY_RENDERER", "plotly_mimetype")
    # One intra-op thread: the tiny model gains nothing from more, and on a CPU shared with other test processes
    # oversubscribed OpenMP threads made a notebook 10x slower (13 s -> 180 s). Results do not depend on it.
    # SmolLM2 (notebook 05) gains from every core.
    if path.name not in EXECUTED:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for name in ("COMLRL_LAB_PAIRS_PARQUET", "COMLRL_LAB_SNAPSHOTS"):
        monkeypatch.delenv(name, raising=False)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S * (4 if path.name in EXECUTED else 1),  # a SmolLM2 round: minutes on 2 cores
        resources={"metadata": {"path": str(path.parent)}},  # run from notebooks/, as Jupyter would
    )
    started = time.perf_counter()
    client.execute()
    print(f"{path.name}: {time.perf_counter() - started:.1f}s")  # well under a minute on a quiet laptop CPU

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
    assert any(tmp_path.iterdir()), "the notebook wrote nothing under COMLRL_LAB_NOTEBOOK_DIR"
    figures = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "application/vnd.plotly.v1+json" in o.get("data", {})
    ]
    if path.stem == "02_analyze_pairs":
        assert len(figures) >= 5, "expected the gap, share, margin, weight and length charts"
    if path.stem == "04_compare_replay_modes":
        (figure,) = figures
        names = [t.get("name") for t in figure["data"]["application/vnd.plotly.v1+json"]["data"]]
        assert sorted(n for n in names if n) == ["all_history", "current"]
