"""One home per name: run ids, export formats, the store's run id and the phase order are each defined once.

The format tests pin what the UI and the tests parse; the scans fail when a module grows a definition of its own.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from comlrl_lab.data.run_ids import new_run_id, random_hex, safe_stem

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "comlrl_lab"
STAMP = r"\d{8}-\d{6}"


def _modules(*, skip: tuple[str, ...] = ()) -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).as_posix() not in skip]


# -- run ids ---------------------------------------------------------------------------------------------------


def test_run_id_formats():
    assert re.fullmatch(rf"MADPOIter-{STAMP}-[0-9a-f]{{4}}", new_run_id("MADPOIter"))
    assert re.fullmatch(rf"{STAMP}-[0-9a-f]{{6}}", new_run_id(digits=6))
    assert re.fullmatch(
        rf"import-preference_replay-{STAMP}-[0-9a-f]{{4}}", new_run_id("preference_replay", prefix="import")
    )
    assert re.fullmatch(rf"import-pairs-{STAMP}-[0-9a-f]{{4}}", new_run_id("?!", prefix="import", fallback="pairs"))
    assert re.fullmatch(r"[0-9a-f]{12}", random_hex(12))


def test_a_stem_is_one_safe_path_component():
    assert safe_stem("my run / v2", "run") == "my-run-v2"
    assert safe_stem("..hidden.", "run") == "hidden"
    assert safe_stem("", "run") == safe_stem(None, "run") == "run"
    assert safe_stem("pairs-r0001-current", "run") == "pairs-r0001-current"


def _makes_ids(path: Path) -> list[str]:
    """Lines that import uuid or format a time stamp: the ways a second run-id maker starts."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name == "uuid" for a in node.names):
            found.append(f"{path.name}:{node.lineno}: import uuid")
        elif isinstance(node, ast.ImportFrom) and node.module == "uuid":
            found.append(f"{path.name}:{node.lineno}: from uuid import")
        elif isinstance(node, ast.Attribute) and node.attr == "strftime":
            found.append(f"{path.name}:{node.lineno}: strftime")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "%Y%m%d" in node.value:
            found.append(f"{path.name}:{node.lineno}: stamp format")
    return found


def test_only_the_run_id_module_makes_ids():
    offenders = [hit for path in _modules(skip=("data/run_ids.py",)) for hit in _makes_ids(path)]
    assert offenders == []


def test_the_id_scan_finds_a_maker_of_its_own(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text('import time\nimport uuid\nrun_id = time.strftime("%Y%m%d") + uuid.uuid4().hex\n')
    assert len(_makes_ids(sneaky)) == 3


# -- export formats --------------------------------------------------------------------------------------------


def test_cli_and_workbench_offer_the_store_table():
    from comlrl_lab import cli
    from comlrl_lab.store.formats import EXPORT_FORMATS, PAIR_FORMATS, ROUND_FILES
    from comlrl_lab.ui import services

    assert services.EXPORT_FORMATS is EXPORT_FORMATS and services.ROUND_FILES == ROUND_FILES
    parser = cli.build_parser()
    for name in EXPORT_FORMATS:
        assert parser.parse_args(["export", "run", "--dest", "out", "--format", name]).format == name
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "run", "--dest", "out", "--format", "xml"])
    assert [*PAIR_FORMATS, ROUND_FILES] == list(EXPORT_FORMATS)
    assert all(spec.suffix.startswith(".") and spec.label and spec.mime for spec in EXPORT_FORMATS.values())


def _lists_export_formats(path: Path) -> list[str]:
    """Literal collections naming export formats, and the table's labels written out again.

    Readers of data and of imports take json, jsonl and csv too, so a list counts only when it names a format
    nothing but an export writes (parquet, rounds).
    """
    from comlrl_lab.store.formats import EXPORT_FORMATS

    export_only = {"parquet", "rounds"}
    labels = {spec.label for spec in EXPORT_FORMATS.values()}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            elts = node.keys if isinstance(node, ast.Dict) else node.elts
            names = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in EXPORT_FORMATS}
            if len(names) >= 2 and names & export_only:
                found.append(f"{path.name}:{node.lineno}: {sorted(names)}")
        elif isinstance(node, ast.Constant) and node.value in labels:
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_lists_export_formats_outside_the_table():
    paths = [*_modules(skip=("store/formats.py",)), *sorted((ROOT / "app_pages").glob("*.py")), ROOT / "app.py"]
    assert [hit for path in paths for hit in _lists_export_formats(path)] == []


def test_the_format_scan_finds_a_table_of_its_own(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        'FORMATS = ("json", "jsonl", "parquet", "csv", "rounds")\n'
        'LABELS = {"csv": "CSV (records + provenance)"}\n'
        'UPLOADS = ["jsonl", "json", "csv"]\n'
    )
    assert [line.split(":")[1] for line in _lists_export_formats(sneaky)] == ["1", "2"]


# -- the run id a store holds ----------------------------------------------------------------------------------


def test_first_run_id_is_the_oldest_run(tmp_path):
    from comlrl_lab.store import RunStore

    with RunStore(tmp_path / "run.duckdb") as store:
        assert store.first_run_id() is None
        store.create_run("a-first", trainer="MADPO")
        store.create_run("b-second", trainer="MADPO")
        assert store.first_run_id() == "a-first"


def test_only_the_store_reads_a_run_id_out_of_it():
    paths = [*_modules(), *sorted((ROOT / "app_pages").glob("*.py")), *sorted((ROOT / "tests").glob("*.py"))]
    needles = ('["run_id"].iloc', "['run_id'].iloc", "SELECT run_id FROM runs")
    offenders = [
        f"{path.relative_to(ROOT)}: {needle}"
        for path in paths
        if path.name not in ("queries.py", "test_names.py")
        for needle in needles
        if needle in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


# -- the phase order -------------------------------------------------------------------------------------------


def test_check_next_phase():
    from comlrl_lab.data.phases import InvalidTransition, check_next_phase
    from comlrl_lab.engine import InvalidTransition as EngineInvalidTransition

    assert EngineInvalidTransition is InvalidTransition
    check_next_phase("select", 2, "select")
    with pytest.raises(InvalidTransition, match="^cannot run 'train' now: the next phase of round 2 is 'select'$"):
        check_next_phase("train", 2, "select")


def test_only_the_phase_module_checks_the_order():
    offenders = [
        path.relative_to(ROOT).as_posix()
        for path in _modules(skip=("data/phases.py",))
        if "cannot run '" in path.read_text(encoding="utf-8")
        or "class InvalidTransition" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []
