"""Run CoMLRL 1.4.3's own preference tests against comlrl-lab: its test files, with the preference imports ported.

The promise is that a CoMLRL script runs here once its import line changes. This checks it the strongest way we have:
CoMLRL's own test suite, fetched from PyPI (its sdist; nothing of it is kept in this repository), with every import
of a public name from ``comlrl.trainers.preference`` (and its submodules) changed to ``comlrl_lab.trainers.preference``.
Everything else its tests import (MAGRPO, its utilities, its test helpers) stays CoMLRL's, installed with
``--no-deps`` into a temporary folder. Only the test files that import the preference trainers run. A test that
imports one of CoMLRL's private helpers (its checkpoint internals, ``_`` names, modules it monkeypatches) errors at
collection here: those test CoMLRL's internals, not its contract. Usage::

    python scripts/comlrl_suite.py [--sdist comlrl-1.4.3.tar.gz] [--json OUT] [-- PYTEST ARGS]

It prints each test's outcome and a count per file; docs/differences_from_comlrl.md says which differences are by
design.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

COMLRL_VERSION = "1.4.3"
PREFERENCE = "comlrl.trainers.preference"
# "from comlrl.trainers.preference[.sub] import NAMES" (one line or a parenthesised block).
_IMPORT = re.compile(r"from comlrl\.trainers\.preference(?:\.\w+)? import (\([^)]*\)|[^\n]*)")
# Names that are CoMLRL's modules rather than public names; tests that patch them cannot be ported.
_MODULES = frozenset({"checkpointing", "iterative", "marlhf", "madpo", "centralized", "collaboration", "output_paths"})


def port_imports(source: str) -> str:
    """``source`` with each import of public preference names taken from ``comlrl_lab.trainers.preference``.

    Private names (a leading underscore) and CoMLRL's own modules keep their CoMLRL import, so the test that needs
    them fails to import rather than silently testing CoMLRL."""

    def port(match: re.Match) -> str:
        names = [n for n in re.split(r"[\s,()]+", match.group(1)) if n]
        if any(name.startswith("_") or name in _MODULES for name in names):
            return match.group(0)
        return f"from comlrl_lab.trainers.preference import ({', '.join(names)})"

    return _IMPORT.sub(port, source)


def fetch(folder: Path, sdist: Path | None) -> tuple[Path, Path]:
    """CoMLRL's tests folder (from its sdist) and a folder holding the installed package, under ``folder``."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    if sdist is None:
        subprocess.run(
            [*pip, "download", f"comlrl=={COMLRL_VERSION}", "--no-deps", "--no-binary", ":all:", "-d", str(folder)],
            check=True,
        )
        (sdist,) = folder.glob("comlrl-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(folder, filter="data")
    package = folder / "package"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(package), f"comlrl=={COMLRL_VERSION}"], check=True)
    return folder / f"comlrl-{COMLRL_VERSION}" / "tests", package


def preference_test_files(tests: Path) -> list[Path]:
    return sorted(p for p in tests.glob("test_*.py") if PREFERENCE in p.read_text(encoding="utf-8"))


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed, failed, error or skipped, from pytest's JUnit XML."""
    found = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        found[name] = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed").replace(
            "failure", "failed"
        )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help="CoMLRL's sdist, instead of downloading it")
    parser.add_argument("--json", type=Path, help="also write every test's outcome here")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="comlrl-suite-") as tmp:
        tests, package = fetch(Path(tmp), args.sdist)
        files = preference_test_files(tests)  # before porting, which changes the imports it looks for
        for path in tests.glob("*.py"):
            path.write_text(port_imports(path.read_text(encoding="utf-8")), encoding="utf-8")
        junit = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "-rfE"]
        command.append("--continue-on-collection-errors")  # a file that needs CoMLRL internals errors alone
        subprocess.run(
            [*command, *map(str, files), *args.pytest_args],
            cwd=tests,
            env={**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(package)},
        )
        found = outcomes(junit) if junit.exists() else {}
    by_file: dict[str, dict[str, int]] = {}
    for name, outcome in sorted(found.items()):
        counts = by_file.setdefault(name.split("::")[0], {})
        counts[outcome] = counts.get(outcome, 0) + 1
    for file, counts in by_file.items():
        print(f"{file}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    total = {k: sum(c.get(k, 0) for c in by_file.values()) for k in ("passed", "failed", "error", "skipped")}
    print("total: " + ", ".join(f"{n} {k}" for k, n in total.items()))
    if args.json:
        args.json.write_text(json.dumps(found, indent=1, sort_keys=True), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
