"""The Setup form as a new user meets it: a fast first render, fields that never trap, every error at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FIRST_RENDER = """
import os, sys, tempfile
os.environ["COMLRL_LAB_RUNS_DIR"] = tempfile.mkdtemp()
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1], default_timeout=120).run()
assert not at.exception, [e.value for e in at.exception]
assert at.title[0].value == "Set up an experiment"
print(sorted(m for m in ("torch", "transformers", "peft") if m in sys.modules))
"""


def test_the_first_render_of_setup_imports_neither_torch_nor_transformers():
    # torch alone takes about 2 s to import: the page a new user opens first must not wait for it.
    result = subprocess.run(
        [sys.executable, "-c", FIRST_RENDER, str(ROOT / "app.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
