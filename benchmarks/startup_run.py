"""Benchmark: where a fresh ``comlrl-lab run`` spends its time before the first phase, and what a second run pays.

A child process (``python -X importtime``, one torch thread as ``COMLRL_LAB_TORCH_THREADS=auto`` gives the tiny
model) takes the steps of ``comlrl-lab run SPEC`` one at a time, in the CLI's order, and prints a mark on stderr
between them:

1. the CLI module and the spec (``ExperimentSpec.read``);
2. ``import torch``;
3. ``import transformers`` and its ``AutoTokenizer`` / ``AutoModelForCausalLM`` names;
4. our engine and trainer modules (what the run imports before it builds the trainer);
5. the run directory and its DuckDB store (``RunManager.create``);
6. the trainer's build (``Run.ensure_trainer``), in which every ``AutoTokenizer.from_pretrained`` and
   ``AutoModelForCausalLM.from_pretrained`` call is timed on its own;

then a second run of the same spec in the same process (steps 5 and 6 again: a warm process), and the rest of the
first run to its end. ``-X importtime``'s lines between two marks give the seconds each step spent importing
modules, so a call's transformers imports (its lazy imports) are told apart from its loading.
With ``--cli`` the process's wall-clock from its start to its end is compared with a real ``comlrl-lab run`` of the
same spec in a process of its own, to show that the steps are the run's. Usage::

    python benchmarks/startup_run.py [--spec config1|quickstart|FILE] [--repeats 3] [--cli] [--baseline CHECKOUT]
                                     [--json OUT]

``--baseline`` measures another checkout too (its children alternate with this one's), for a before/after split.
``config1`` is ``benchmarks/vs_comlrl.py``'s config 1 as a spec (MADPOIter, 2 rounds, 8 items, 4 candidates,
16 tokens, tiny model, no evaluation). Each repeat is a fresh child; the figures are medians. Timings move with the
machine's load, printed with them: compare the parts with each other.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "STARTUP_RUN_MARK "
RESULT = "STARTUP_RUN_RESULT "
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+(\d+) \|( +)\S+$")
STEPS = (
    ("cli", "the CLI and the spec"),
    ("torch", "import torch"),
    ("transformers", "import transformers (AutoTokenizer, AutoModelForCausalLM)"),
    ("ours", "our engine and trainer modules"),
    ("store", "run directory and DuckDB store"),
    ("build", "trainer build"),
)

CONFIG1 = {
    "algorithm": "MADPOIter",
    "name": "startup-config1",
    "agent_models": ["comlrl-lab/tiny", "comlrl-lab/tiny"],
    "task": "length_ratio",
    "max_train_items": 8,
    "config": {
        "num_iterations": 2,
        "preference_num_candidates": 4,
        "max_new_tokens": 16,
        "agent_devices": "cpu",
        "eval_interval": 0,
        "seed": 0,
    },
}


# The child ---------------------------------------------------------------------------------------------------


def mark(label: str) -> None:
    """A mark on stderr, where ``-X importtime`` writes: the imports after it belong to ``label``'s window."""
    sys.stderr.write(f"{MARK}{json.dumps({'label': label, 'at': time.time()})}\n")
    sys.stderr.flush()


def timed_calls(owner: type, name: str, label: str) -> None:
    """Mark the start and end of every call of the classmethod ``owner.name`` (``label#N``, N from 1)."""
    original = getattr(owner, name).__func__
    count = [0]

    def wrapper(cls, *args, **kwargs):
        count[0] += 1
        mark(f"{label}#{count[0]}")
        try:
            return original(cls, *args, **kwargs)
        finally:
            mark(f"end {label}#{count[0]}")

    setattr(owner, name, classmethod(wrapper))


def child(spec_path: str, runs_root: str) -> None:
    mark("cli")
    from comlrl_lab import cli  # noqa: F401  (the CLI module, as `comlrl-lab run` imports it)
    from comlrl_lab.engine.spec import ExperimentSpec

    spec = ExperimentSpec.read(Path(spec_path).read_text(encoding="utf-8"), spec_path)
    mark("torch")
    import torch  # noqa: F401

    mark("transformers")
    import transformers

    tokenizer_class, model_class = transformers.AutoTokenizer, transformers.AutoModelForCausalLM
    mark("ours")
    from comlrl_lab.engine.manager import RunManager
    from comlrl_lab.engine.run import quiet_library_progress
    from comlrl_lab.engine.spec import ALGORITHMS

    quiet_library_progress()
    ALGORITHMS[spec.algorithm]  # the trainer class's module, as build_trainer resolves it
    timed_calls(tokenizer_class, "from_pretrained", "tokenizer")
    timed_calls(model_class, "from_pretrained", "model")
    manager = RunManager(runs_root)
    for run_number in (1, 2):
        mark(f"store/{run_number}")
        run_id = manager.create(spec)
        mark(f"build/{run_number}")
        manager.run(run_id).ensure_trainer()
        mark(f"built/{run_number}")
        if run_number == 1:
            first = run_id
    mark("rest of the first run")
    manager.start(first, rounds=10**6)
    progress = manager.wait(first)
    manager.close()
    mark("end")
    print(RESULT + json.dumps({"status": progress.status}), flush=True)


# The parent --------------------------------------------------------------------------------------------------


def windows(stderr: str, started: float) -> list[dict]:
    """The marks in order, each with its wall-clock seconds to the next mark and the seconds spent importing in
    between (the cumulative times of the outermost imports: the others are inside them)."""
    marks: list[dict] = []
    for line in stderr.splitlines():
        if line.startswith(MARK):
            marks.append({**json.loads(line[len(MARK) :]), "imports": 0.0})
            continue
        found = IMPORT_LINE.match(line)
        if found and marks and len(found.group(2)) == 1:  # an outermost import
            marks[-1]["imports"] += int(found.group(1)) / 1e6
    for here, after in zip(marks, marks[1:]):
        here["seconds"] = after["at"] - here["at"]
    if marks:
        marks[0]["before"] = marks[0]["at"] - started  # interpreter start and the site imports
    return marks


def split(marks: list[dict]) -> dict:
    """The startup split of one child: seconds per step, and the trainer build's loads and imports."""
    by_label = {m["label"]: m for m in marks}
    result = {"interpreter": marks[0]["before"]}
    for key, _ in STEPS[:-2]:
        result[key] = by_label[key]["seconds"]
    for run_number in (1, 2):
        store, build = by_label[f"store/{run_number}"], by_label[f"build/{run_number}"]
        build_seconds = by_label[f"built/{run_number}"]["at"] - build["at"]
        calls = [
            m
            for m in marks
            if build["at"] <= m["at"] <= by_label[f"built/{run_number}"]["at"]
            and "#" in m["label"]
            and "end" not in m["label"]
        ]
        loads = {}
        for call in calls:
            end = by_label[f"end {call['label']}"]
            kind = call["label"].split("#")[0]
            seconds = end["at"] - call["at"]
            imported = call["imports"]  # the imports made inside this call: its lazy imports
            entry = loads.setdefault(kind, {"calls": 0, "seconds": 0.0, "imports": 0.0})
            entry["calls"] += 1
            entry["seconds"] += seconds
            entry["imports"] += imported
        in_calls = sum(v["seconds"] for v in loads.values())
        imports_outside = sum(
            m["imports"]
            for m in marks
            if build["at"] <= m["at"] < by_label[f"built/{run_number}"]["at"]
            and ("#" not in m["label"] or m["label"].startswith("end "))
        )
        result[f"run{run_number}"] = {
            "store": store["seconds"],
            "store_imports": store["imports"],
            "build": build_seconds,
            "loads": loads,
            "build_imports_outside_loads": imports_outside,
            "build_rest": build_seconds - in_calls - imports_outside,
        }
    result["to_first_phase"] = by_label["rest of the first run"]["at"] - marks[0]["at"] + marks[0]["before"]
    result["to_first_phase"] -= sum(result["run2"][k] for k in ("store", "build"))
    result["process"] = by_label["end"]["at"] - marks[0]["at"] + marks[0]["before"]
    return result


def spec_file(choice: str, folder: Path) -> Path:
    if choice == "config1":
        path = folder / "config1.json"
        path.write_text(json.dumps(CONFIG1), encoding="utf-8")
        return path
    if choice == "quickstart":
        return ROOT / "examples" / "quickstart.yaml"
    return Path(choice)


def run_child(spec: Path, folder: Path, root: Path = ROOT) -> dict:
    """One fresh child importing the project from ``root``; its split."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    runs_root = tempfile.mkdtemp(prefix="runs-", dir=folder)
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", __file__, "--child", str(spec), runs_root],
        env=env,
        capture_output=True,
        text=True,
        cwd=folder,
    )
    if done.returncode != 0 or RESULT not in done.stdout:
        tail = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))[-3000:]
        raise RuntimeError(f"the child failed (exit {done.returncode}):\n{tail}")
    return split(windows(done.stderr, started))


def cli_seconds(spec: Path, folder: Path) -> float:
    """A real ``comlrl-lab run`` of the spec, start to end, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs_root = tempfile.mkdtemp(prefix="cli-", dir=folder)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "comlrl_lab.cli", "run", str(spec), "--runs-root", runs_root, "--quiet"],
        env=env,
        check=True,
        capture_output=True,
        cwd=folder,
    )
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    return statistics.median(values)


def report(columns: dict[str, list[dict]], cli: list[float]) -> str:
    """A Markdown table of the medians, one column per checkout measured."""
    names = list(columns)

    def med(*path: str) -> str:
        cells = []
        for name in names:
            values = []
            for result in columns[name]:
                for key in path:
                    result = result[key]
                values.append(result)
            cells.append(f"{median(values):.2f}")
        return " | ".join(cells)

    def row(text: str, *path: str) -> str:
        return f"| {text} | {med(*path)} |"

    first = columns[names[0]][0]
    lines = ["| Step | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines.append(row("interpreter start and site imports", "interpreter"))
    for key, text in STEPS[:-2]:
        lines.append(row(text, key))
    for run, title in (("run1", "first run"), ("run2", "second run, same process")):
        lines.append(row(f"{title}: {STEPS[4][1]}", run, "store"))
        lines.append(row(f"{title}: {STEPS[5][1]}, all of it", run, "build"))
        for kind in ("tokenizer", "model"):
            if kind in first[run]["loads"]:
                lines.append(row(f"&nbsp;&nbsp;{kind} loads (`from_pretrained` calls)", run, "loads", kind, "seconds"))
                lines.append(row("&nbsp;&nbsp;&nbsp;&nbsp;of which their lazy imports", run, "loads", kind, "imports"))
                lines.append(row("&nbsp;&nbsp;&nbsp;&nbsp;calls", run, "loads", kind, "calls"))
        lines.append(row("&nbsp;&nbsp;imports outside the loads", run, "build_imports_outside_loads"))
        lines.append(row("&nbsp;&nbsp;the rest of the build", run, "build_rest"))
    lines.append(row("**fresh process to the first phase**", "to_first_phase"))
    lines.append(row("whole process (both runs' set-up, the first run to its end)", "process"))
    if cli:
        lines.append(f"| a real `comlrl-lab run`, start to end | {median(cli):.2f} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="config1", help="config1 (default), quickstart, or a spec file")
    parser.add_argument("--repeats", type=int, default=3, help="fresh child processes per checkout")
    parser.add_argument("--cli", action="store_true", help="also time a real `comlrl-lab run` after each child")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="CHECKOUT",
        help="another checkout of the project (its root) measured too, alternating with this one",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every child's split here")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    checkouts = {"this checkout": ROOT}
    if args.baseline is not None:
        checkouts = {"baseline": args.baseline.resolve(), **checkouts}
    columns: dict[str, list[dict]] = {name: [] for name in checkouts}
    cli: list[float] = []
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="startup-run-") as tmp:
        folder = Path(tmp)
        spec = spec_file(args.spec, folder)
        for repeat in range(args.repeats):
            for name, root in checkouts.items():
                result = run_child(spec, folder, root)
                columns[name].append(result)
                loads.append(os.getloadavg()[0])
                print(
                    f"repeat {repeat + 1}, {name}: to the first phase {result['to_first_phase']:.2f} s, second run's "
                    f"set-up {result['run2']['store'] + result['run2']['build']:.2f} s; load {loads[-1]:.2f}",
                    flush=True,
                )
            if args.cli:
                cli.append(cli_seconds(spec, folder))
                print(f"repeat {repeat + 1}: a real CLI run {cli[-1]:.2f} s", flush=True)
    print(
        f"\n`{args.spec}`, {args.repeats} fresh processes per checkout, median seconds; 1-minute load "
        f"{min(loads):.2f} to {max(loads):.2f}:\n"
    )
    print(report(columns, cli))
    if args.json is not None:
        payload = {"spec": args.spec, "columns": columns, "cli": cli, "loads": loads}
        args.json.write_text(json.dumps(payload, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
