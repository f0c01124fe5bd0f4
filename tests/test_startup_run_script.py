"""benchmarks/startup_run.py: its reading of a child's marks and ``-X importtime`` lines, against a known trace."""

from __future__ import annotations

import json

import pytest
from repo_scripts import load_repo_script


def load_benchmark():
    return load_repo_script("benchmarks/startup_run.py", "startup_run_benchmark")


def trace(bench, events: list[tuple]) -> str:
    """stderr as the child writes it: marks (label, time) and import lines (microseconds, depth, module)."""
    lines = []
    for event in events:
        if isinstance(event[0], str):
            lines.append(bench.MARK + json.dumps({"label": event[0], "at": event[1]}))
        else:
            micros, depth, module = event
            lines.append(f"import time: {10:>9} | {micros:>10} |{' ' * (1 + 2 * depth)}{module}")
    return "\n".join(lines)


def test_split_gives_each_step_its_seconds_and_each_load_its_lazy_imports():
    bench = load_benchmark()
    stderr = trace(
        bench,
        [
            ("cli", 100.0),
            (200_000, 0, "comlrl_lab.cli"),
            ("torch", 100.5),
            (3_000_000, 1, "torch._C"),  # inside torch's own import: not counted twice
            (4_000_000, 0, "torch"),
            ("transformers", 104.5),
            (1_000_000, 0, "transformers"),
            ("ours", 105.7),
            (500_000, 0, "comlrl_lab.engine.manager"),
            ("store/1", 106.5),
            ("build/1", 106.7),
            ("tokenizer#1", 106.8),
            (300_000, 0, "transformers.utils.type_validators"),
            ("end tokenizer#1", 107.2),
            (100_000, 0, "comlrl_lab.models.lora"),  # between the loads: the build's own imports
            ("model#1", 107.3),
            (600_000, 0, "transformers.masking_utils"),
            ("end model#1", 108.1),
            ("built/1", 108.3),
            ("store/2", 108.3),
            ("build/2", 108.5),
            ("tokenizer#2", 108.5),
            ("end tokenizer#2", 108.55),
            ("model#2", 108.55),
            ("end model#2", 108.6),
            ("built/2", 108.62),
            ("rest of the first run", 108.62),
            ("end", 110.62),
        ],
    )
    marks = bench.windows(stderr, started=99.2)
    assert marks[1]["imports"] == pytest.approx(4.0)  # torch alone: torch._C is inside it
    split = bench.split(marks)
    expected = {"interpreter": 0.8, "cli": 0.5, "torch": 4.0, "transformers": 1.2, "ours": 0.8}
    assert {key: split[key] for key in expected} == pytest.approx(expected)
    first = split["run1"]
    assert first["store"] == pytest.approx(0.2) and first["build"] == pytest.approx(1.6)
    assert first["loads"] == {
        "tokenizer": {"calls": 1, "seconds": pytest.approx(0.4), "imports": pytest.approx(0.3)},
        "model": {"calls": 1, "seconds": pytest.approx(0.8), "imports": pytest.approx(0.6)},
    }
    assert first["build_imports_outside_loads"] == pytest.approx(0.1)
    assert first["build_rest"] == pytest.approx(1.6 - 1.2 - 0.1)
    second = split["run2"]
    assert (second["store"], second["build"]) == (pytest.approx(0.2), pytest.approx(0.12))
    assert second["loads"]["model"]["imports"] == 0
    # To the first phase: from the interpreter's start to the end of the first build, less the second run's set-up.
    assert split["to_first_phase"] == pytest.approx(0.8 + 8.62 - 0.32)
    assert split["process"] == pytest.approx(11.42)


def test_report_puts_each_checkout_in_a_column():
    bench = load_benchmark()
    loads = {"model": {"calls": 2, "seconds": 1.0, "imports": 0.5}}
    run = {"store": 0.2, "build": 1.5, "loads": loads, "build_imports_outside_loads": 0.0, "build_rest": 0.5}
    one = {"interpreter": 0.1, "cli": 0.2, "torch": 3.0, "transformers": 1.0, "ours": 0.5, "run1": run, "run2": run}
    one |= {"to_first_phase": 6.5, "process": 9.0}
    two = {**one, "to_first_phase": 5.5}
    table = bench.report({"baseline": [one], "this checkout": [two, {**two, "to_first_phase": 4.5}]}, cli=[])
    lines = table.splitlines()
    assert lines[0] == "| Step | baseline | this checkout |"
    assert "| import torch | 3.00 | 3.00 |" in lines
    assert "| **fresh process to the first phase** | 6.50 | 5.00 |" in lines
    assert "| &nbsp;&nbsp;&nbsp;&nbsp;calls | 2.00 | 2.00 |" in lines
