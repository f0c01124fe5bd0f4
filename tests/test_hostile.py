"""Hostile inputs and damaged run folders (issue 25): what a colleague's folder, a link, a spec, a query, a server, a
full disk or a signal can do, and what must happen instead. Nothing lost, nothing run, nothing leaked.

``CASES`` is the table: one row per finding, with the function that sets the trap and checks the outcome. A case
function takes the pytest fixtures it names (``tmp_path``, ``capsys``, ``model_dir``, ...). To add one, write a
``case_...`` function whose docstring says what must happen, and add a row. Cases that kill a process or send a
signal have test functions of their own at the end; ``SEPARATE`` names them, so this file lists every case.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import httpx
import pytest
import streamlit as st
import torch
from case_tables import Case, case_params, check_table, run_case
from http_stub import HttpStub, Reply
from model_fixtures import build_tiny_model_dir
from store_fixtures import make_pairs
from streamlit.testing.v1 import AppTest
from test_api_round import files_containing
from workbench_fixtures import USER_DATA, custom_task_spec, user_task_spec

from comlrl_lab import cli
from comlrl_lab.data.no_space import NoSpaceLeft, is_no_space
from comlrl_lab.engine import ExperimentSpec
from comlrl_lab.engine.run import Run
from comlrl_lab.engine.sweep import MAX_SWEEP_CELLS, SWEEPS_DIR, check_sweep_size
from comlrl_lab.names import metric_names as M
from comlrl_lab.store import ReadOnlyQueryError, RunStore, snapshot_parquet
from comlrl_lab.store.export import is_parquet
from comlrl_lab.trainers.preference import (
    MADPOConfig,
    MADPOIterConfig,
    MADPOTrainer,
    MARLHFConfig,
    MARLHFTrainer,
)
from comlrl_lab.trainers.preference.comparators import api
from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt
from comlrl_lab.trainers.preference.runtime.fingerprint import ModelMismatch
from comlrl_lab.ui import compare, services, state

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
APP = str(ROOT / "app.py")


# -- helpers ------------------------------------------------------------------------------------------------------


class Planted:
    """A pickle that, when loaded, creates ``marker``: what a hostile checkpoint file would do, harmlessly."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant_legacy_checkpoint(run_dir: Path, marker: Path) -> Path:
    """A format-1 checkpoint folder (``state.pt``, a pickle) whose loading would create ``marker``."""
    folder = run_dir / "checkpoint" / "checkpoint-000001"
    folder.mkdir(parents=True)
    torch.save({"format": 1, "weights_version": 0, "payload": Planted(marker)}, folder / ckpt.LEGACY_STATE_FILE)
    return folder


def main(capsys, *argv: str) -> tuple[int, list[str]]:
    """``comlrl-lab ARGV`` in this process: (exit status, stderr lines)."""
    code = cli.main(list(argv))
    return code, capsys.readouterr().err.strip().splitlines()


def made_run(tmp_path: Path, pairs: int = 3) -> Run:
    """A run folder under ``tmp_path/runs`` whose store holds a committed collect with ``pairs`` pairs (closed)."""
    run = Run.create(user_task_spec(), tmp_path / "runs")
    run.store.commit_phase(run.run_id, 1, "collect", pairs=make_pairs(1, pairs))
    run.close()
    return run


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def run_dirs(runs: Path) -> list[Path]:
    return [p for p in runs.iterdir()] if runs.exists() else []


def fresh_cache() -> None:
    services.close_all()
    st.cache_resource.clear()
    st.cache_data.clear()


# -- 1. an export can destroy its own run -------------------------------------------------------------------------


def case_export_over_the_store(tmp_path, capsys):
    """``export RUN --dest RUN/run.duckdb`` is refused with one line; the store is byte for byte what it was."""
    run = made_run(tmp_path)
    store = run.run_dir / "run.duckdb"
    before = store.read_bytes()
    code, err = main(capsys, "export", str(run.run_dir), "--format", "jsonl", "--dest", str(store))
    assert code == 2 and len(err) == 1 and "an export never writes over a store" in err[0], err
    assert store.read_bytes() == before
    with RunStore(store, read_only=True) as s:
        assert s.pairs_count(run.run_id) == 3


def case_export_over_the_spec(tmp_path, capsys):
    """``--dest RUN/spec.json`` (or any path in the run folder but its exports/) is refused; exports/ is fine."""
    run = made_run(tmp_path)
    spec = run.run_dir / "spec.json"
    before = spec.read_bytes()
    for dest, fmt in ((spec, "jsonl"), (run.run_dir / "preference_replay", "rounds"), (run.run_dir, "rounds")):
        code, err = main(capsys, "export", str(run.run_dir), "--format", fmt, "--dest", str(dest))
        assert code == 2 and len(err) == 1 and "an export never writes into a run folder" in err[0], err
    assert spec.read_bytes() == before
    assert not (run.run_dir / "preference_replay").exists()
    code, _ = main(capsys, "export", str(run.run_dir), "--dest", str(run.run_dir / "exports" / "pairs.jsonl"))
    assert code == 0 and len((run.run_dir / "exports" / "pairs.jsonl").read_text().splitlines()) == 3
    ExperimentSpec.load(spec)  # the run can still be resumed


# -- 3. a run folder can run code ---------------------------------------------------------------------------------


def case_planted_pickle_in_a_checkpoint(tmp_path, capsys):
    """A format-1 ``state.pt`` is refused on ``--resume`` with one line naming ``--trust-checkpoint``, unread; a
    pickle put in a format-2 weights file is refused by ``weights_only=True``. Neither runs."""
    run = made_run(tmp_path)
    marker = tmp_path / "pickle-ran"
    plant_legacy_checkpoint(run.run_dir, marker)
    code, err = main(capsys, "run", "--resume", str(run.run_dir), "--runs-root", str(tmp_path / "runs"), "--quiet")
    assert code == 2 and len(err) == 1 and "--trust-checkpoint" in err[0] and "pickle" in err[0], err
    assert not marker.exists()

    root = tmp_path / "ckpt"
    state = {"round_index": 1, "phase_index": 3, "finished": False}
    ckpt.save_checkpoint(root, state, {"agents": [{"w": torch.ones(2)}]}, version=1)
    torch.save({"agents": [Planted(marker)]}, ckpt.weights_file(ckpt.latest_checkpoint(root), 1))
    with pytest.raises(ValueError, match="not a readable weights file"):
        ckpt.load_checkpoint(root)
    assert not marker.exists()


def case_run_open_outside_the_runs_folder(tmp_path, monkeypatch):
    """``?run.open=../elsewhere``, an absolute path or a link out of the runs folder opens nothing (the page says
    so) and reads nothing from there."""
    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    made = made_run(tmp_path)  # a genuine run in the runs folder, to check that those still open
    shutil.copytree(made.run_dir, elsewhere)
    marker = tmp_path / "pickle-ran"
    plant_legacy_checkpoint(elsewhere, marker)
    (runs / "link").symlink_to(elsewhere)
    workspace = services.Workspace(runs)
    try:
        for name in ("../elsewhere", str(elsewhere), "link", "/etc", "", "."):
            with pytest.raises(ValueError, match="is not a run in the runs folder"):
                workspace.view(name)
        assert workspace.view(made.run_id).run_dir == runs / made.run_id
    finally:
        workspace.close()

    monkeypatch.setenv(services.RUNS_DIR_ENV, str(runs))
    fresh_cache()
    try:
        at = AppTest.from_file(APP, default_timeout=90)
        at.query_params[state.URL_RUN] = "../elsewhere"
        at.run()
        at.switch_page("pages/rounds.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert any("is not a run in the runs folder" in w.value for w in at.warning)
    finally:
        fresh_cache()
    assert not marker.exists()


# -- 4. a NUL byte in a credential --------------------------------------------------------------------------------

NUL_MARKERS = {"header": "MARKER-nul-hdr-5d1f", "key": "MARKER-nul-key-e2a9"}


def case_nul_in_an_api_key_or_header(model_dir, tmp_path, capfd, caplog):
    """A key or header value with a NUL fails the request with a clear error, and no byte of it reaches the store,
    the run folder or the output (the planted-marker grep)."""
    caplog.set_level(logging.DEBUG)
    with HttpStub() as server:
        server.route("/v1/chat/completions", Reply(json={"choices": [{"message": {"content": "x"}}]}))
        config = dict(
            num_iterations=1,
            preference_num_candidates=2,
            max_new_tokens=4,
            eval_num_samples=1,
            agent_devices="cpu",
            comparator_policy="api",
            comparator_api_format="openai",
            comparator_api_url=server.url("/v1/chat/completions"),
            comparator_api_model="stub",
            comparator_api_key=f"sk-{NUL_MARKERS['key']}\x00x",
            comparator_api_key_header="X-Api-Key",
            comparator_api_headers={"Authorization": f"Bearer {NUL_MARKERS['header']}\x00x"},
            comparator_api_max_retries=0,
        )
        spec = custom_task_spec(model_dir, config, max_train_items=2, max_eval_items=1)
        path = tmp_path / "spec.json"
        path.write_text(json.dumps({**spec.to_dict(), "config": config}))
        runs = tmp_path / "runs"
        code = cli.main(["run", str(path), "--runs-root", str(runs), "--quiet"])
    captured = capfd.readouterr()
    output = (captured.out + captured.err + caplog.text).encode()
    assert code == 1 and b"Illegal header value" in output  # it did fail where the issue saw it fail
    (run_dir,) = run_dirs(runs)
    with RunStore(run_dir / "run.duckdb", read_only=True) as store:
        events = store.events(store.first_run_id(), level="error")
    assert len(events) == 1 and "***" in events.loc[0, "message"]
    for what, marker in NUL_MARKERS.items():
        found = files_containing(run_dir, marker.encode())  # the planted-marker grep of test_api_round
        assert found == [] and marker.encode() not in output, (what, found)


# -- 5. memory ----------------------------------------------------------------------------------------------------

BOMB = "lol: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]\n" for prev, name in zip("abcdefgh", "bcdefghi")
)


def _bomb_spec(where: str) -> str:
    indent = "    " if "\n" in where else "  "
    return "algorithm: MADPOIter\n" + f"{where}:\n" + "".join(indent + line + "\n" for line in BOMB.splitlines())


def case_yaml_alias_bomb(tmp_path, capsys):
    """An anchor bomb under wandb_config, model_config or comparator_api_headers is refused in one line naming the
    file and line, at once, before any run directory exists."""
    runs = tmp_path / "runs"
    for where in ("wandb_config", "model_config", "config:\n  comparator_api_headers"):
        path = write_spec(tmp_path / "bomb.yaml", _bomb_spec(where))
        started = time.monotonic()
        code, err = main(capsys, "run", str(path), "--runs-root", str(runs))
        assert time.monotonic() - started < 30
        assert code == 2 and len(err) == 1 and "bomb.yaml:" in err[0] and "aliases are expanded" in err[0], err
        assert run_dirs(runs) == []


def case_api_response_body_is_bounded(capsys):
    """A body past ``comparator_api_max_response_bytes`` fails the request, naming the field, whether the server
    declares its length or streams it; the field is validated like the others."""
    big = "x" * 300_000
    with HttpStub() as server:
        server.route("/gen", Reply(body=json.dumps({"completions": [big]})))
        settings = MADPOIterConfig(
            comparator_policy="api",
            comparator_api_url=server.url("/gen"),
            comparator_api_max_response_bytes=100_000,
            comparator_api_max_retries=0,
        )
        with pytest.raises(api.ComparatorApiError, match="comparator_api_max_response_bytes = 100000"):
            api.ApiComparatorClient(settings).complete_many([api.ApiRequest("p", 0, {}, 1)])
        fine = MADPOIterConfig(
            comparator_policy="api", comparator_api_url=server.url("/gen"), comparator_api_max_response_bytes=1_000_000
        )
        assert api.ApiComparatorClient(fine).complete_many([api.ApiRequest("p", 0, {}, 1)]) == [[big]]

    async def chunks():
        for _ in range(100):
            yield b"x" * 50_000

    async def streamed(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=chunks())  # streamed: no Content-Length

    settings = MADPOIterConfig(
        comparator_policy="api",
        comparator_api_url="http://stub/gen",
        comparator_api_max_response_bytes=100_000,
        comparator_api_max_retries=0,
    )
    with _transport(streamed), pytest.raises(api.ComparatorApiError, match="more than 100000 bytes"):
        api.ApiComparatorClient(settings).complete_many([api.ApiRequest("p", 0, {}, 1)])
    with pytest.raises(ValueError, match="comparator_api_max_response_bytes must be >= 1"):
        ExperimentSpec(config={"comparator_api_max_response_bytes": 0}).build_config()


def case_sql_text_is_bounded_before_parsing(store, monkeypatch):
    """A 23 MB query is refused by its length before DuckDB's parser sees it (which took the app to 5 GB)."""

    def parser(*args, **kwargs):
        raise AssertionError("the query reached the parser")

    monkeypatch.setattr("comlrl_lab.store.sql_guard.duckdb.extract_statements", parser)
    query = "SELECT 1 AS x" + " " * (23 * 1024 * 1024)
    with pytest.raises(ReadOnlyQueryError, match=r"characters long; at most 100,000 are read"):
        store.readonly_sql(query)


# -- 6. sweeps ----------------------------------------------------------------------------------------------------


def case_sweep_size_is_bounded(tmp_path, capsys):
    """``sweep --grid dpo_beta=<100 values> --seeds 100`` is refused in one line showing the cells, disk and time
    and naming ``--yes``; nothing is written. Confirmed, it passes the check; a small grid needs no confirmation."""
    runs = tmp_path / "runs"
    spec = ExperimentSpec(config={"num_iterations": 3})
    path = tmp_path / "spec.json"
    spec.save(path)
    values = ",".join(f"{0.01 * (i + 1):.2f}" for i in range(100))
    code, err = main(
        capsys, "sweep", str(path), "--grid", f"dpo_beta={values}", "--seeds", "100", "--runs-root", str(runs)
    )
    assert code == 2 and len(err) == 1, err
    assert "10000 cells" in err[0] and "on disk" in err[0] and "free" in err[0] and "--yes" in err[0], err
    assert run_dirs(runs) == []
    grid = {"dpo_beta": [0.01 * (i + 1) for i in range(100)]}
    size = check_sweep_size(spec, grid, seeds=100, runs_root=runs, confirmed=True)
    assert size.cells == 10_000 and size.cells > MAX_SWEEP_CELLS and size.disk_bytes > 0
    assert not check_sweep_size(spec, {"dpo_beta": [0.1, 0.2]}, seeds=2, runs_root=runs).too_large
    assert not (runs / SWEEPS_DIR).exists()


# -- 7. pages crash with tracebacks -------------------------------------------------------------------------------


def _run_with_eval_curve(runs: Path, value: float) -> Run:
    run = Run.create(user_task_spec(dpo_beta=value), runs)  # two settings: two groups on the Compare page
    for phase in ("collect", "select", "train", "evaluate"):
        metrics = [{"step": 0, "name": M.EVAL_REWARD_MEAN, "value": value}] if phase == "evaluate" else []
        run.store.commit_phase(run.run_id, 1, phase, metrics=metrics)
    snapshot_parquet(run.store, run.run_id, run.run_dir / "snapshots")
    run.store.create_run(run.run_id, status="finished")
    run.close()
    return run


def case_garbage_snapshot_parquet(tmp_path):
    """A snapshot file that is no Parquet is left out of Compare, which names it instead of crashing; opening (or
    resuming) the run writes it again."""
    runs = tmp_path / "runs"
    good, bad = _run_with_eval_curve(runs, 0.25), _run_with_eval_curve(runs, 0.75)
    broken = bad.run_dir / "snapshots" / "metrics" / "round_0001_evaluate.parquet"
    broken.write_bytes(b"this is no parquet file" * 10)
    result = compare.compare(compare.catalogue(runs))
    assert result.unreadable == [str(broken)]
    assert set(result.stats.loc[result.stats["curve"] == "Evaluation reward", "mean"]) == {0.25}
    Run.open(bad.run_dir).close()
    assert is_parquet(broken)
    result = compare.compare(compare.catalogue(runs))
    assert result.unreadable == []
    assert sorted(result.stats.loc[result.stats["curve"] == "Evaluation reward", "mean"]) == [0.25, 0.75]
    assert good.run_id != bad.run_id


def case_sql_nested_400_deep(store):
    """Expressions nested 400 deep (calls, subqueries, CASE) or chained 900 long are refused in one line, never a
    ``RecursionError``, whatever the process's recursion limit (``torch.compile`` raises it to 2000, which once let
    the CASE query through); the nesting a person writes still runs."""
    deep = {
        "SELECT " + "abs(" * 400 + "1" + ")" * 400: "nests parentheses 400 deep; at most 64",
        "SELECT * FROM " + "(SELECT * FROM " * 400 + "range(1)" + ") t" * 400: "nests parentheses 401 deep",
        "SELECT " + "CASE WHEN true THEN " * 400 + "1" + " END" * 400: "nested too deeply to be checked",
        "SELECT " + "+".join(["1"] * 900) + " AS n": "nested too deeply to be checked",
    }
    default_limit = sys.getrecursionlimit()
    try:
        for limit in (default_limit, 2000, 100_000):
            sys.setrecursionlimit(limit)
            for query, refusal in deep.items():
                with pytest.raises(ReadOnlyQueryError, match=refusal):
                    store.readonly_sql(query)
    finally:
        sys.setrecursionlimit(default_limit)
    assert store.readonly_sql("SELECT " + "(" * 40 + "+".join(["1"] * 40) + ")" * 40 + " AS n")["n"].tolist() == [40]
    assert store.readonly_sql("SELECT " + "+".join(["1"] * 100) + " AS n")["n"].tolist() == [100]


# -- 8. unclear errors ----------------------------------------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs at ``tmp_path/full`` (needs root; skipped elsewhere), unmounted afterwards."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)  # lazy: a failed test may still hold a file there


def case_full_disk_says_no_space(full_disk):
    """A checkpoint that does not fit says "no space left on <path>" (not torch's "unexpected pos"), leaves no
    staging folder, and the committed checkpoint before it still loads."""
    root = full_disk / "checkpoint"
    state = {"round_index": 1, "phase_index": 1, "finished": False}
    ckpt.save_checkpoint(root, state, None, version=0)
    big = {"agents": [{"w": torch.zeros(200_000)}]}  # 800 kB, on 256 KiB
    with pytest.raises(ckpt.NoSpaceLeft, match=rf"^no space left on {root} \(.* bytes free\) while writing"):
        ckpt.save_checkpoint(root, {**state, "phase_index": 2}, big, version=1)
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-000001"]
    assert ckpt.load_checkpoint_state(root)["phase_index"] == 1
    # The store's own words for it (DuckDB's "Could not write all bytes") are told the same way.
    with pytest.raises(duckdb.Error) as failed, RunStore(full_disk / "run.duckdb") as store:
        store.create_run("r", trainer="MADPOIter")
        for r in range(1, 100):
            store.commit_phase("r", r, "collect", pairs=make_pairs(r, 200))
    assert is_no_space(failed.value), str(failed.value)
    assert str(NoSpaceLeft(full_disk, "collect of round 3")).startswith(f"no space left on {full_disk} (")


def case_offline_missing_model(tmp_path, capsys, monkeypatch):
    """A hub model that is not in the cache while offline is refused in one line with exit 2, before any run
    directory exists (the README's promise)."""
    monkeypatch.setattr("comlrl_lab.models.loading._hub_offline", lambda: True)
    runs = tmp_path / "runs"
    path = write_spec(
        tmp_path / "spec.yaml", "algorithm: MADPOIter\nagent_models: [nobody/no-such-model, nobody/no-such-model]\n"
    )
    code, err = main(capsys, "run", str(path), "--runs-root", str(runs))
    assert code == 2 and len(err) == 1 and "'nobody/no-such-model'" in err[0] and "offline" in err[0], err
    assert run_dirs(runs) == []


def case_deep_yaml_names_its_file(tmp_path, capsys):
    """A 100,000-deep YAML (or JSON) spec is one line naming the file (and line), not a ``RecursionError``."""
    runs = tmp_path / "runs"
    deep = "[" * 100_000 + "]" * 100_000
    for name, text in (
        ("deep.yaml", f"algorithm: MADPOIter\nconfig: {deep}\n"),
        ("deep.json", f'{{"config": {deep}}}'),
    ):
        code, err = main(capsys, "run", str(write_spec(tmp_path / name, text)), "--runs-root", str(runs))
        assert code == 2 and len(err) == 1 and f"{name}" in err[0] and "nested deeper than 64 levels" in err[0], err
    assert run_dirs(runs) == []


def case_empty_dest(tmp_path, capsys):
    """``--dest ""`` says the destination is empty."""
    run = made_run(tmp_path)
    code, err = main(capsys, "export", str(run.run_dir), "--dest", "")
    assert code == 2 and err == [
        "comlrl-lab export: the destination is empty: name a file for pairs, or a folder for round files"
    ]


# -- 9. export and CLI edges ----------------------------------------------------------------------------------------


def case_unknown_run_id(tmp_path, capsys):
    """``export --run-id no-such-run`` names the runs the store holds, exits 2 and writes nothing."""
    run = made_run(tmp_path)
    dest = tmp_path / "out.jsonl"
    code, err = main(capsys, "export", str(run.run_dir), "--run-id", "no-such-run", "--dest", str(dest))
    assert code == 2 and len(err) == 1 and "no run 'no-such-run' in" in err[0] and run.run_id in err[0], err
    assert not dest.exists() and not dest.with_name(dest.name + ".tmp").exists()


class _transport:
    """Every ``httpx.AsyncClient`` opened meanwhile (the comparator's among them) uses ``handler``, an httpx mock
    transport: the class is swapped on the httpx module, for the whole process, until the block ends."""

    def __init__(self, handler: Callable):
        self.handler = handler

    def __enter__(self):
        real = self.real = httpx.AsyncClient
        handler = self.handler

        class Client(real):
            def __init__(self, *args, **kwargs):
                kwargs["transport"] = httpx.MockTransport(handler)
                super().__init__(*args, **kwargs)

        httpx.AsyncClient = Client
        return self

    def __exit__(self, *exc):
        httpx.AsyncClient = self.real


def case_redirect_leaves_no_unretrieved_task(caplog):
    """A 307 gives the clear error and nothing else: no "Task exception was never retrieved", also when a request
    cancelled because of it ends in an error of its own (a connection torn down mid-cancel)."""
    calls = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            await asyncio.sleep(0.05)
            return httpx.Response(307, headers={"Location": "http://elsewhere/"}, text="moved")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise httpx.ConnectError("connection dropped while cancelling") from None
        return httpx.Response(200, json={"completions": ["x"]})

    settings = MADPOIterConfig(
        comparator_policy="api", comparator_api_url="http://stub/gen", comparator_api_max_retries=0
    )
    with caplog.at_level(logging.ERROR, logger="asyncio"), _transport(handler):
        with pytest.raises(api.ComparatorApiError, match="failed with HTTP 307"):
            api.ApiComparatorClient(settings).complete_many([api.ApiRequest(f"p{i}", i, {}, 1) for i in range(2)])
        gc.collect()  # asyncio reports unread task exceptions when the task is collected
    assert "never retrieved" not in caplog.text


NAN_TASK = """
formatters = [lambda item: item["topic"], lambda item: item["setting"]]


def reward_func(completions_agent1, completions_agent2, batch_items=None):
    return [float("nan")]
"""


def case_all_nan_rewards_say_so(model_dir, tmp_path, capsys, monkeypatch):
    """A run whose every reward is NaN finishes, and both the CLI and the Rounds page say that round 1 collected
    0 pairs, NaN rewards and all (not only the events table)."""
    module = tmp_path / "nan_task.py"
    module.write_text(NAN_TASK)
    spec = ExperimentSpec(
        algorithm="MADPOIter",
        agent_models=[model_dir, model_dir],
        task=None,
        user_task=str(module),
        user_train_data=USER_DATA,
        config={"num_iterations": 1, "preference_num_candidates": 2, "max_new_tokens": 3, "eval_num_samples": 0},
        max_train_items=3,
    )
    path = tmp_path / "spec.json"
    spec.save(path)
    runs = tmp_path / "runs"
    code = cli.main(["run", str(path), "--runs-root", str(runs), "--quiet"])
    captured = capsys.readouterr()
    assert code == 0 and "finished" in captured.out
    assert "warning: round 1 collected 0 preference pairs from 12 candidates, 12 of them with a NaN reward" in (
        captured.err
    )
    (run_dir,) = run_dirs(runs)
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(runs))
    fresh_cache()
    try:
        at = AppTest.from_file(APP, default_timeout=90)
        at.session_state[state.RUN_ID] = run_dir.name
        at.run()
        at.switch_page("pages/rounds.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert any(w.value.startswith("- Round 1 collected 0 preference pairs") for w in at.warning)
    finally:
        fresh_cache()


def case_checkpoint_metrics_reach_the_store_and_the_snapshots(model_dir, tmp_path):
    """Every phase's checkpoint/* rows land in the store and its Parquet snapshot; when the process dies between a
    checkpoint's commit and those rows, reopening the run adds them from the checkpoint (cost.json)."""
    spec = custom_task_spec(
        model_dir,
        {"num_iterations": 1, "preference_num_candidates": 2, "max_new_tokens": 3, "eval_num_samples": 1},
        max_train_items=2,
        max_eval_items=1,
    )
    run = Run.create(spec, tmp_path / "runs")
    trainer = run.ensure_trainer()
    keep = trainer.sink.add_phase_metrics
    dropped = []
    # The train phase's cost never arrives: as if killed right after its checkpoint was committed.
    trainer.sink.add_phase_metrics = lambda r, p, s, v: dropped.append(p) if p == "train" else keep(r, p, s, v)
    for _ in range(4):
        run.step()
    run.close()
    assert dropped == ["train"]
    reopened = Run.open(run.run_dir)
    try:
        metrics = reopened.store.metrics(reopened.run_id, ["checkpoint/"])
        for phase in ("collect", "select", "train", "evaluate"):
            names = set(metrics.loc[metrics["phase"] == phase, "name"])
            assert {M.name(M.CHECKPOINT_SECONDS, phase=phase), M.name(M.CHECKPOINT_BYTES, phase=phase)} <= names
    finally:
        reopened.close()
    with duckdb.connect() as con:
        snapped = con.execute(
            "SELECT DISTINCT phase FROM read_parquet(?) WHERE name LIKE 'checkpoint/%'",
            [str(run.run_dir / "snapshots" / "metrics" / "*.parquet")],
        ).fetchall()
    assert sorted(p for (p,) in snapped) == ["collect", "evaluate", "select", "train"]


# -- 10. a resumed trainer built from other weights ---------------------------------------------------------------

ITEMS = [{"prompt": f"the {w} cat"} for w in ("red", "blue", "green")]


def _reward(c1, c2, **_):
    return [float(len(c1[0].split()) - len(c2[0].split()))]


def _madpo(model, tmp_path, **overrides):
    values = dict(preference_num_candidates=3, max_new_tokens=5, eval_num_samples=0, agent_devices="cpu", seed=3)
    values.update(overrides, output_dir=str(tmp_path / "out"))
    return MADPOTrainer(
        agent_model=model, num_agents=2, train_dataset=ITEMS, reward_func=_reward, args=MADPOConfig(**values)
    )


def case_madpo_after_pairs(model_dir, tmp_path):
    """Resumed after its pairs (weights version 0: nothing to restore), a trainer built from other weights is
    refused; one built from the same models with another seed continues exactly as the straight run did
    (CoMLRL's test_resume_equals_continuous_run)."""
    straight = _madpo(model_dir, tmp_path)
    straight.train()
    first = _madpo(model_dir, tmp_path)
    first.checkpoint_dir = tmp_path / "ckpt"
    first.step("collect")
    first.step("select")
    other = _madpo(str(build_tiny_model_dir(tmp_path / "other-model", seed=1)), tmp_path)
    with pytest.raises(ModelMismatch, match=r"holds no weights yet .* initial weights differ .*agent 0, agent 1"):
        other.load_checkpoint(tmp_path / "ckpt")
    assert other.next_phase == "collect"  # nothing was taken from the checkpoint
    resumed = _madpo(model_dir, tmp_path, seed=11)
    resumed.train(resume_from_checkpoint=tmp_path / "ckpt")
    for a, b in zip(straight.agents[0].parameters(), resumed.agents[0].parameters()):
        assert torch.equal(a, b)


def case_marlhf_before_reward_phase(model_dir, tmp_path):
    """A MARLHF run checkpointed before its train phase (the reward model is fitted there) refuses a trainer built
    from other weights, and resumes one built from the same models."""
    values = dict(
        num_generations=2,
        preference_num_candidates=3,
        max_new_tokens=4,
        eval_num_samples=0,
        agent_devices="cpu",
        output_dir=str(tmp_path / "out"),
    )

    def marlhf(model: str) -> MARLHFTrainer:
        return MARLHFTrainer(agent_model=model, train_dataset=ITEMS, reward_func=_reward, args=MARLHFConfig(**values))

    first = marlhf(model_dir)
    first.checkpoint_dir = tmp_path / "ckpt"
    first.step("collect")
    first.step("select")
    with pytest.raises(ModelMismatch, match="holds no weights yet"):
        marlhf(str(build_tiny_model_dir(tmp_path / "other-model", seed=2))).load_checkpoint(tmp_path / "ckpt")
    same = marlhf(model_dir)
    same.load_checkpoint(tmp_path / "ckpt")
    assert same.next_phase == "train"


# -- the table ------------------------------------------------------------------------------------------------------


CASES = [
    Case("1 export over the store", case_export_over_the_store),
    Case("1 export over the spec", case_export_over_the_spec),
    Case("3 planted pickle on --resume", case_planted_pickle_in_a_checkpoint),
    Case("3 ?run.open= outside the runs folder", case_run_open_outside_the_runs_folder),
    Case("4 NUL in an API key or header", case_nul_in_an_api_key_or_header, (pytest.mark.slow,)),
    Case("5 YAML anchor bomb", case_yaml_alias_bomb),
    Case("5 unbounded API response bodies", case_api_response_body_is_bounded),
    Case("5 SQL text parsed in the app", case_sql_text_is_bounded_before_parsing),
    Case("6 no bound on sweeps", case_sweep_size_is_bounded),
    Case("7 Compare on a garbage snapshot", case_garbage_snapshot_parquet),
    Case("7 SQL nested 400 deep", case_sql_nested_400_deep),
    Case("8 full disk", case_full_disk_says_no_space),
    Case("8 missing model while offline", case_offline_missing_model),
    Case("8 100k-deep YAML", case_deep_yaml_names_its_file),
    Case('8 --dest ""', case_empty_dest),
    Case("9 --run-id no-such-run", case_unknown_run_id),
    Case("9 307 and a never-retrieved task", case_redirect_leaves_no_unretrieved_task),
    Case("9 all-NaN rewards", case_all_nan_rewards_say_so, (pytest.mark.slow,)),
    Case("9 checkpoint metrics", case_checkpoint_metrics_reach_the_store_and_the_snapshots),
    Case("10 madpo_after_pairs", case_madpo_after_pairs),
    Case("10 marlhf_before_reward_phase", case_marlhf_before_reward_phase),
]

#: Cases with a test function of their own below (a killed process, a signal).
SEPARATE = {
    "2 WAL truncated, WAL deleted, store deleted after kill -9": "test_a_store_behind_its_checkpoints_rolls_back",
    "2 the checkpoint to roll back to was pruned": "test_a_store_behind_a_pruned_checkpoint_is_refused_in_one_line",
    "9 SIGTERM / SIGINT during an export": "test_a_signal_during_an_export_leaves_no_tmp_and_prints_one_line",
    "3 a trusted format-1 checkpoint still resumes": "test_a_trusted_format_1_checkpoint_resumes",
}


@pytest.mark.parametrize("case", case_params(CASES))
def test_hostile(case: Case, request):
    run_case(case, request)


def test_the_table_lists_every_case_once():
    check_table(CASES, globals(), SEPARATE)


# -- cases with a process of their own ------------------------------------------------------------------------------

KILL_SPEC = {
    "num_iterations": 3,
    "preference_num_candidates": 4,
    "preference_pairs_per_sample": 4,
    "max_new_tokens": 4,
    "eval_num_samples": 2,
    "agent_devices": "cpu",
    "seed": 5,
}


def _pairs_and_phases(run_dir: Path) -> tuple[int, int]:
    with RunStore(run_dir / "run.duckdb", read_only=True) as store:
        run_id = store.first_run_id()
        return store.pairs_count(run_id), len(store.committed_phases(run_id))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_store_behind_its_checkpoints_rolls_back(model_dir, tmp_path, capsys):
    """Kill -9 after 6 checkpoints, then truncate or delete ``run.duckdb.wal`` or delete the store: the resume rolls
    back to the store's last phase (saying so) and finishes with every pair and phase, 12 of 12.

    Only the run that is killed needs a process of its own; the straight run and the resumes go through the CLI's
    ``main`` in this one, which spares each a fresh start (imports and lazy imports, most of their time)."""
    spec_path = tmp_path / "spec.json"
    custom_task_spec(model_dir, KILL_SPEC, max_train_items=8, max_eval_items=2).save(spec_path)
    straight = tmp_path / "straight"
    assert cli.main(["run", str(spec_path), "--runs-root", str(straight), "--quiet"]) == 0, capsys.readouterr().err
    want = _pairs_and_phases(run_dirs(straight)[0])
    assert want[1] == 12 and want[0] > 0

    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "comlrl_lab.cli", "run", str(spec_path), "--runs-root", str(runs), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=env,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(list(runs.glob("*/checkpoint/checkpoint-*"))) < 6:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    (killed,) = run_dirs(runs)
    assert (killed / "run.duckdb.wal").is_file()  # the commits since the store was opened are in its WAL

    damages = {
        "wal-truncated": lambda d: os.truncate(d / "run.duckdb.wal", (d / "run.duckdb.wal").stat().st_size // 2),
        "wal-deleted": lambda d: (d / "run.duckdb.wal").unlink(),
        "store-deleted": lambda d: [(d / name).unlink() for name in ("run.duckdb", "run.duckdb.wal")],
    }
    for name, damage in damages.items():
        run_dir = tmp_path / name / killed.name
        shutil.copytree(killed, run_dir)
        damage(run_dir)
        resumed = cli.main(["run", "--resume", str(run_dir), "--runs-root", str(tmp_path / name), "--quiet"])
        assert resumed == 0, (name, capsys.readouterr().err[-2000:])
        assert _pairs_and_phases(run_dir) == want, name
        with RunStore(run_dir / "run.duckdb", read_only=True) as store:
            run_id = store.first_run_id()
            assert run_id == killed.name
            warnings = store.events(run_id, level="warning")["message"].tolist()
            costs = store.metrics(run_id, ["checkpoint/"])
        assert any("the store had lost committed phases" in w for w in warnings), (name, warnings)
        assert len(set(zip(costs["round"], costs["phase"]))) == 12, name  # every phase's checkpoint cost


def test_a_store_behind_a_pruned_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    """When the checkpoint for the store's last phase was pruned, the resume is refused, saying what is missing
    and how to recover; nothing is deleted."""
    run = Run.create(user_task_spec(num_iterations=2), tmp_path / "runs")
    run.store.commit_phase(run.run_id, 1, "collect")
    run.close()
    for phase_index in (3, 4):  # checkpoints after round 1 train and evaluate; the one after collect was pruned
        state = {"round_index": 1 + phase_index // 4, "phase_index": phase_index % 4, "finished": False}
        ckpt.save_checkpoint(run.checkpoint_dir, state, None, version=0)
    code, err = main(capsys, "run", "--resume", str(run.run_dir), "--runs-root", str(tmp_path / "runs"))
    assert code == 2 and len(err) == 1, err
    assert (
        "holds the phases up to round 1 collect, but the checkpoints go from round 1 train to round 1 evaluate"
        in (err[0])
    )
    assert "Restore run.duckdb and its .wal from a backup, or start the experiment again: comlrl-lab run" in err[0]
    assert len(ckpt.checkpoint_dirs(run.checkpoint_dir)) == 2


SIGNAL_CHILD = """
import sys
from comlrl_lab import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _big_store(run_dir: Path, pairs: int) -> None:
    """A run folder whose store holds ``pairs`` pairs (one committed, the rest copied by SQL in a moment)."""
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(user_task_spec().to_dict()))
    with RunStore(run_dir / "run.duckdb") as store:
        store.create_run("big", trainer="MADPOIter")
        store.commit_phase("big", 1, "collect", pairs=make_pairs(1, 1))
        store._connection().execute(
            "INSERT INTO pairs SELECT p.* REPLACE (r.i::INTEGER AS pair_index) FROM pairs p, range(1, ?) r(i)", [pairs]
        )


@pytest.mark.parametrize(("sig", "fmt"), [(signal.SIGTERM, "jsonl"), (signal.SIGINT, "jsonl"), (signal.SIGTERM, "csv")])
def test_a_signal_during_an_export_leaves_no_tmp_and_prints_one_line(tmp_path, sig, fmt):
    """SIGTERM or SIGINT while DuckDB writes the export: no ``.tmp`` is left, one line is printed, and the exit
    status is 128 + the signal; no traceback."""
    run_dir = tmp_path / "big-run"
    _big_store(run_dir, 400_000)
    dest = tmp_path / f"pairs.{fmt}"
    tmp = dest.with_name(dest.name + ".tmp")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_CHILD, "export", str(run_dir), "--format", fmt, "--dest", str(dest)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while not tmp.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert tmp.exists(), "the export finished (or failed) before it could be interrupted"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + int(sig), err
    assert err.strip().splitlines() == [
        f"comlrl-lab export: stopped by {sig.name}; no partial file was left at {dest}"
    ], err
    assert not tmp.exists() and not dest.exists()


def test_a_trusted_format_1_checkpoint_resumes(model_dir, tmp_path):
    """A checkpoint of format 1 (as earlier versions wrote it: one pickled ``state.pt``) resumes with
    ``trust_checkpoint=True`` and only then."""
    first = _madpo(model_dir, tmp_path)
    first.checkpoint_dir = tmp_path / "ckpt"
    for phase in ("collect", "select", "train"):
        first.step(phase)
    newest = ckpt.latest_checkpoint(tmp_path / "ckpt")
    state = ckpt.read_state(newest)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    old = {k: v for k, v in state.items() if k not in ("checkpoint_path", "fingerprints")}
    torch.save({**old, "format": 1}, legacy / ckpt.LEGACY_STATE_FILE)
    shutil.copy(ckpt.weights_file(newest, 1), ckpt.weights_file(legacy, 1))
    with pytest.raises(ckpt.UntrustedCheckpoint, match="--trust-checkpoint"):
        _madpo(model_dir, tmp_path).load_checkpoint(legacy)
    resumed = _madpo(model_dir, tmp_path)
    resumed.load_checkpoint(legacy, trust_checkpoint=True)
    assert resumed.next_phase == "evaluate"
    for a, b in zip(first.agents[1].parameters(), resumed.agents[1].parameters()):
        assert torch.equal(a, b)
