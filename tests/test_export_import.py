"""Exports (JSON, JSONL, Parquet, CSV, round files, snapshots) and imports (CoMLRL replay dirs, uploaded files)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from store_fixtures import held_store, make_pairs, phase_payload

from comlrl_lab import cli
from comlrl_lab.data.records import SEED_RECORD_FIELDS, PreferencePair, round_file_payload
from comlrl_lab.store import (
    PHASES,
    RunStore,
    export_pairs,
    export_round_files,
    import_pair_files,
    import_replay_dir,
    snapshot_parquet,
)
from comlrl_lab.store import export as export_module
from comlrl_lab.store import writer as store_writer
from comlrl_lab.store.dataset_schema import PAIR_SCHEMA
from comlrl_lab.store.export import ExportError
from comlrl_lab.store.importer import ImportRefused
from comlrl_lab.ui.services import Workspace


@pytest.fixture
def three_rounds(store):
    """Run "r" with 8, 0 and 8 pairs in rounds 1 to 3 (an empty round in the middle)."""
    for r in (1, 2, 3):
        store.commit_phase("r", r, "collect", pairs=make_pairs(r, 8 if r != 2 else 0))
    return store


def seed_fields(rows) -> list[dict]:
    """The seed's record fields of exported rows (JSONL and tables add labels and TRL's columns)."""
    return [{k: row[k] for k in SEED_RECORD_FIELDS} for row in rows]


def all_records() -> list[dict]:
    return [p.to_record() for r in (1, 3) for p in make_pairs(r, 8)]


# -- pair exports --------------------------------------------------------------------------------------------------


def test_json_export_is_the_seed_records_exactly(three_rounds, tmp_path):
    dest = tmp_path / "out" / "pairs.json"
    assert export_pairs(three_rounds, "r", "json", dest) == 16
    records = json.loads(dest.read_text(encoding="utf-8"))
    assert records == all_records()
    assert all(list(r) == list(SEED_RECORD_FIELDS) for r in records)
    assert "勝ち" in dest.read_text(encoding="utf-8")  # UTF-8, not \\u escapes
    assert not list(dest.parent.glob("*.tmp"))


def test_jsonl_export_and_filters(three_rounds, tmp_path):
    dest = tmp_path / "pairs.jsonl"
    n = export_pairs(three_rounds, "r", "jsonl", dest, round=3, winner_side="comparator", min_gap=1.0)
    lines = dest.read_text(encoding="utf-8").splitlines()
    expected = [p.to_record() for p in make_pairs(3, 8) if p.winner_side == "comparator" and p.reward_gap >= 1.0]
    rows = [json.loads(line) for line in lines]
    assert n == len(lines) == len(expected) and [{k: r[k] for k in SEED_RECORD_FIELDS} for r in rows] == expected
    # Every column of the one pair schema, provenance first; TRL's columns: a reward-labelled run chooses its winner.
    assert list(rows[0]) == PAIR_SCHEMA.names
    assert [(r["round"], r["pair_index"], r["winner_side"]) for r in rows] == [
        (3, p, "comparator") for p in (1, 3, 5, 7)
    ]
    first = expected[0]
    assert (
        rows[0]["labels"] == []
        and rows[0]["prompt"] == "[Agent 1]\n" + first["prompts"][0] + "\n[Agent 2]\n" + (first["prompts"][1])
    )
    assert rows[0]["chosen"].startswith("[Agent 1]\n" + first["winner_completions"][0])
    assert rows[0]["rejected"].endswith("[Agent 2]\n" + first["loser_completions"][1])


def test_a_labelled_runs_export_carries_its_labels_and_chooses_the_labelled_side(store, tmp_path):
    from comlrl_lab.data.labels import Label

    store.create_run("h", trainer="MADPO", config={"preference_source": "human"}, num_agents=1)
    pairs = make_pairs(1, 4, num_agents=1)
    store.commit_phase("h", 1, "collect", pairs=pairs)
    store.put_labels(
        "h",
        [
            Label(1, 0, "ann", "A", "winner"),  # the reward's winner
            Label(1, 1, "ann", "A", "loser"),  # overrules the reward: the stored loser is chosen
            Label(1, 1, "bob", "B", "winner"),
            Label(1, 2, "ann", "tie", "winner"),  # dropped: nothing chosen
        ],
    )  # comparison 3 has no label yet
    for fmt in ("jsonl", "parquet", "csv"):
        dest = tmp_path / f"h.{fmt}"
        assert export_pairs(store, "h", fmt, dest) == 4
        if fmt == "jsonl":
            rows = [json.loads(line) for line in dest.read_text(encoding="utf-8").splitlines()]
        elif fmt == "parquet":
            rows = pq.read_table(dest).to_pylist()
        else:
            rows = pd.read_csv(dest, keep_default_na=False).to_dict("records")
            for row in rows:
                row["labels"] = json.loads(row["labels"])
                row["chosen"] = row["chosen"] or None
                row["rejected"] = row["rejected"] or None
        assert [r["labels"] for r in rows] == [
            [{"labeller": "ann", "verdict": "A"}],
            [{"labeller": "ann", "verdict": "A"}, {"labeller": "bob", "verdict": "B"}],
            [{"labeller": "ann", "verdict": "tie"}],
            [],
        ], fmt
        chosen = [(r["chosen"], r["rejected"]) for r in rows]
        assert chosen == [
            (pairs[0].winner_completions[0], pairs[0].loser_completions[0]),
            (pairs[1].loser_completions[0], pairs[1].winner_completions[0]),
            (None, None),
            (None, None),
        ], fmt
        assert [r["prompt"] for r in rows] == [p.prompts[0] for p in pairs]


def test_empty_export_is_valid_json(three_rounds, tmp_path):
    dest = tmp_path / "none.json"
    assert export_pairs(three_rounds, "r", "json", dest, round=2) == 0
    assert json.loads(dest.read_text()) == []


def test_parquet_and_csv_have_the_fields_and_provenance(three_rounds, tmp_path):
    export_pairs(three_rounds, "r", "parquet", tmp_path / "p.parquet")
    table = pq.read_table(tmp_path / "p.parquet")
    assert table.num_rows == 16
    assert {"round", "pair_index", "item_index", "winner_side", "reward_gap", *SEED_RECORD_FIELDS} <= set(
        table.column_names
    )
    rows = table.to_pylist()
    assert [{k: r[k] for k in SEED_RECORD_FIELDS} for r in rows] == all_records()
    assert rows[1]["winner_side"] == "comparator" and rows[8]["round"] == 3
    export_pairs(three_rounds, "r", "csv", tmp_path / "p.csv", item=1)
    csv = pd.read_csv(tmp_path / "p.csv")
    assert len(csv) == 2 and csv["round"].tolist() == [1, 3]
    first = make_pairs(1, 8)[1]
    assert json.loads(csv["winner_completions"][0]) == first.winner_completions  # lists as JSON text, newlines kept
    assert json.loads(csv["raw_rewards"][0]) == first.raw_rewards


def test_export_from_a_path_and_bad_format(three_rounds, tmp_path):
    path = three_rounds.path
    three_rounds.close()
    assert export_pairs(path, "r", "jsonl", tmp_path / "x.jsonl") == 16
    with pytest.raises(ValueError, match="fmt must be one of"):
        export_pairs(path, "r", "xml", tmp_path / "x.xml")


# -- round files ---------------------------------------------------------------------------------------------------


def test_round_files_are_comlrl_bytes(three_rounds, tmp_path):
    paths = export_round_files(three_rounds, "r", tmp_path / "replay")
    assert [p.name for p in paths] == ["iteration_0001.json", "iteration_0002.json", "iteration_0003.json"]
    for path, r in zip(paths, (1, 2, 3)):
        pairs = make_pairs(r, 8 if r != 2 else 0)
        assert path.read_text(encoding="utf-8") == json.dumps(round_file_payload(r, pairs), ensure_ascii=False)
    assert json.loads(paths[1].read_text()) == {"iteration": 2, "num_pairs": 0, "pairs": []}


# -- round trips ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_export_then_import_gives_identical_records(three_rounds, tmp_path, fmt):
    first = tmp_path / f"a.{fmt}"
    export_pairs(three_rounds, "r", fmt, first)
    with RunStore(tmp_path / "imported.duckdb") as target:
        report = import_pair_files(target, [first])
        assert report.skipped == [] and report.pairs == 16
        second = tmp_path / f"b.{fmt}"
        export_pairs(target, report.run_id, fmt, second)
        assert [p.to_record() for p in target.load_pairs(report.run_id)] == all_records()
    assert first.read_bytes() == second.read_bytes()


def test_the_cli_exports_a_run_another_process_holds_from_its_snapshot(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with RunStore(run_dir / "run.duckdb") as store:
        for r in (1, 2, 3):
            store.commit_phase("r", r, "collect", pairs=make_pairs(r, 8 if r != 2 else 0), status="running")
            snapshot_parquet(store, "r", run_dir / "snapshots")
        store.log_event("r", "info", "stop asked during train", round=3)
    # The workbench keeps the runs it shows open read-write, which locks every other process out of the file.
    with held_store(run_dir / "run.duckdb") as holder:
        capsys.readouterr()
        assert cli.main(["export", str(run_dir), "--format", "jsonl", "--dest", str(tmp_path / "p.jsonl")]) == 0
        assert cli.main(["export", str(run_dir), "--format", "rounds", "--dest", str(tmp_path / "rounds")]) == 0
    lines = (tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()
    assert seed_fields(json.loads(line) for line in lines) == all_records()
    assert sorted(p.name for p in (tmp_path / "rounds").iterdir()) == [f"iteration_000{r}.json" for r in (1, 2, 3)]
    err = capsys.readouterr().err
    assert f"is held by process {holder.pid}" in err and "exporting its snapshot of the last committed phase" in err


def test_the_cli_imports_into_the_runs_folder_where_the_workbench_lists_it(tmp_path, capsys):
    export_dir = tmp_path / "replay"
    with RunStore(tmp_path / "source.duckdb") as source:
        source.commit_phase("r", 1, "collect", pairs=make_pairs(1, 3))
        export_round_files(source, "r", export_dir)
    assert cli.main(["import", str(export_dir), "--runs-root", str(tmp_path / "runs")]) == 0
    listed = Workspace(tmp_path / "runs").past_runs()
    (folder,) = listed["path"]
    assert listed["kind"].tolist() == ["imported pairs"] and Path(folder).name.startswith("import-replay")
    assert f"into {Path(folder) / 'run.duckdb'}" in capsys.readouterr().out


def test_round_files_round_trip_with_provenance(three_rounds, tmp_path):
    export_round_files(three_rounds, "r", tmp_path / "replay")
    with RunStore(tmp_path / "imported.duckdb") as target:
        report = import_replay_dir(target, tmp_path / "replay", run_id="again")
        assert report.rounds == [1, 2, 3] and report.pairs == 16 and report.skipped == []
        assert target.rounds("again")["num_pairs"].tolist() == [8, 0, 8]
        original = three_rounds.pairs_page("r", limit=100)
        imported = target.pairs_page("again", limit=100)
        cols = ["round", "pair_index", "winner_side", "reward_gap", "winner_reward"]
        pd.testing.assert_frame_equal(original[cols], imported[cols])  # winner side read back from raw_rewards
        assert target.run("again")["source"] == "import"


# -- CoMLRL directories ----------------------------------------------------------------------------------------------


def write(path: Path, payload) -> Path:
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False), encoding="utf-8")
    return path


def test_import_comlrl_dir_reports_malformed_files_by_name(tmp_path):
    d = tmp_path / "preference_replay"
    d.mkdir()
    good1 = [p.to_record() for p in make_pairs(1, 3)]
    write(d / "iteration_0001.json", {"iteration": 1, "num_pairs": 3, "pairs": good1})
    write(d / "iteration_0002.json", [p.to_record() for p in make_pairs(2, 2)])  # bare list: round from the name
    write(d / "iteration_0003.json", '{"iteration": 3, "pairs": [')
    write(d / "iteration_0004.json", {"iteration": 4, "num_pairs": 1, "pairs": [{**good1[0], "winner_reward": "high"}]})
    write(d / "iteration_0005.json", {"iteration": 5, "num_pairs": 2, "pairs": good1[:1]})
    write(d / "iteration_0006.json", {"iteration": 6, "records": good1})
    write(d / "iteration_0007.json", [good1[0], "not a record"])
    (d / "iteration_0008.json").write_bytes(b'[{"prompts": ["\xff"]}]')
    write(d / "notes.txt", "ignored: not JSON")
    # A seed record without the iterative fields (non-iterative trainers) is fine.
    base = {k: v for k, v in good1[0].items() if k in SEED_RECORD_FIELDS[:6]}
    write(d / "iteration_0009.json", {"iteration": 9, "num_pairs": 1, "pairs": [base]})
    with RunStore(tmp_path / "store" / "run.duckdb") as s:
        report = import_replay_dir(s, d)
        assert report.imported_files == ["iteration_0001.json", "iteration_0002.json", "iteration_0009.json"]
        assert report.rounds == [1, 2, 9] and report.pairs == 6
        reasons = dict(report.skipped)
        assert set(reasons) == {f"iteration_000{i}.json" for i in range(3, 9)}
        assert "not valid JSON" in reasons["iteration_0003.json"]
        assert "pair 0" in reasons["iteration_0004.json"] and "winner_reward" in reasons["iteration_0004.json"]
        assert "num_pairs" in reasons["iteration_0005.json"]
        assert "'pairs' list" in reasons["iteration_0006.json"]
        assert "pair 1" in reasons["iteration_0007.json"]
        assert "UTF-8" in reasons["iteration_0008.json"]
        assert s.rounds(report.run_id)["round"].tolist() == [1, 2, 9]
        assert [p.to_record() for p in s.load_pairs(report.run_id, round=1)] == good1
        assert s.load_pairs(report.run_id, round=9)[0].to_record()["raw_rewards"] == []
        assert report.run_id.startswith("import-preference_replay-")


def test_import_writes_nothing_when_the_transaction_fails(tmp_path, monkeypatch):
    d = tmp_path / "replay"
    d.mkdir()
    for r in (1, 2, 3):
        write(d / f"iteration_000{r}.json", round_file_payload(r, make_pairs(r, 4)))
    calls = {"n": 0}
    real_append = store_writer._append

    def fail_on_third(con, table, rows, key):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        real_append(con, table, rows, key)

    monkeypatch.setattr(store_writer, "_append", fail_on_third)
    with RunStore(tmp_path / "store" / "run.duckdb") as s:
        with pytest.raises(OSError, match="disk full"):
            import_replay_dir(s, d, run_id="imp")
        assert s.list_runs().empty and s.pairs_count("imp") == 0  # nothing half-imported


def test_import_uploaded_files(tmp_path):
    records = [p.to_record() for p in make_pairs(1, 3)]
    jsonl = "\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n\n"

    class Upload(io.BytesIO):  # what Streamlit's UploadedFile offers: .name and .getvalue()
        name = "mine.jsonl"

    files = [
        Upload(jsonl.encode()),
        ("round.json", json.dumps({"iteration": 7, "num_pairs": 3, "pairs": records})),
        ("list.json", json.dumps(records).encode()),
        ("bad.jsonl", b'{"prompts": []}\nnot json\n'),
        tmp_path / "missing.json",
    ]
    with RunStore(tmp_path / "store" / "run.duckdb") as s:
        report = import_pair_files(s, files, run_id="up")
        assert report.imported_files == ["mine.jsonl", "round.json", "list.json"]
        assert report.rounds == [8, 7, 9]  # explicit iterations keep their number; the others take the next free ones
        assert [name for name, _ in report.skipped] == ["bad.jsonl", "missing.json"]
        assert "line 2" in dict(report.skipped)["bad.jsonl"]
        assert s.pairs_count("up") == 9
        # Importing again into the same run replaces rounds instead of duplicating them.
        again = import_pair_files(s, [("round.json", json.dumps({"iteration": 7, "pairs": records[:1]}))], run_id="up")
        assert again.rounds == [7] and s.pairs_count("up", round=7) == 1 and s.pairs_count("up") == 7


def test_from_record_is_the_validator():
    with pytest.raises(ValueError, match="prompts"):
        PreferencePair.from_record({"winner_completions": []})


# -- snapshots -----------------------------------------------------------------------------------------------------


def test_parquet_snapshot_per_phase_and_incremental(tmp_path):
    snap = tmp_path / "snap"
    with RunStore(tmp_path / "store" / "run.duckdb") as s:
        for phase in PHASES:
            s.commit_phase("r", 1, phase, **phase_payload(1, phase, pairs_per_round=5))
            snapshot_parquet(s, "r", snap, round=1, phase=phase)
        assert len(pd.read_parquet(snap / "pairs")) == 5
        assert len(pd.read_parquet(snap / "metrics")) == 3 + 1 + 25 + 1
        assert pd.read_parquet(snap / "rounds.parquet")["status"].tolist() == ["evaluate"]
        # A full snapshot elsewhere, then only what changed is rewritten; discarded phases disappear.
        full = snapshot_parquet(s, "r", tmp_path / "full")
        assert {p.parent.name for p in full} >= {"pairs", "metrics", "replay", "candidates"}
        assert len(snapshot_parquet(s, "r", tmp_path / "full")) == 4  # runs, rounds, phases, labels only
        s.commit_phase("r", 1, "collect", pairs=make_pairs(1, 2))
        s.discard_after("r", 1, "select")
        written = snapshot_parquet(s, "r", tmp_path / "full")
        assert sorted(p.name for p in written if p.parent.name == "pairs") == ["round_0001_collect.parquet"]
        assert len(pd.read_parquet(tmp_path / "full" / "pairs")) == 2
        assert not (tmp_path / "full" / "metrics" / "round_0001_train.parquet").exists()
        assert not (tmp_path / "full" / "candidates" / "round_0001_collect.parquet").exists()


def test_exports_stay_in_round_order_whatever_the_commit_order(tmp_path):
    with RunStore(tmp_path / "store" / "run.duckdb") as s:
        s.commit_phase("r", 1, "collect", pairs=make_pairs(1, 4))
        s.commit_phase("r", 2, "collect", pairs=make_pairs(2, 4))
        s.commit_phase("r", 2, "collect", pairs=make_pairs(2, 4))  # the latest round again: still in file order
        assert s.run("r")["pairs_in_order"]
        s.commit_phase("r", 1, "collect", pairs=make_pairs(1, 3))  # an older round after a newer one
        assert not s.run("r")["pairs_in_order"]
        export_pairs(s, "r", "jsonl", tmp_path / "a.jsonl")
        lines = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()]
        assert seed_fields(lines) == [p.to_record() for p in make_pairs(1, 3) + make_pairs(2, 4)]
        shuffled = pd.DataFrame([{**p.to_record(), "pair_index": i} for i, p in enumerate(make_pairs(3, 5))]).iloc[
            [3, 0, 4, 2, 1]
        ]
        s.commit_phase("r", 3, "collect", pairs=shuffled)
        export_pairs(s, "r", "json", tmp_path / "b.json", round=3)
        assert json.loads((tmp_path / "b.json").read_text(encoding="utf-8")) == [
            p.to_record() for p in make_pairs(3, 5)
        ]
        with pytest.raises(ValueError, match="distinct"):
            s.commit_phase("r", 4, "collect", pairs=shuffled.assign(pair_index=0))


def test_import_refuses_a_store_that_holds_a_training_run(three_rounds, tmp_path, capsys):
    export_round_files(three_rounds, "r", tmp_path / "replay")
    for attempt in (
        lambda: import_replay_dir(three_rounds, tmp_path / "replay", run_id="r"),
        lambda: import_pair_files(three_rounds, [tmp_path / "replay" / "iteration_0001.json"], run_id="again"),
    ):
        with pytest.raises(ImportRefused, match="holds the training run 'r'"):
            attempt()
    assert three_rounds.list_runs()["run_id"].tolist() == ["r"]
    assert three_rounds.rounds("r")["num_pairs"].tolist() == [8, 0, 8]
    three_rounds.close()
    # The CLI says so in one line, with exit status 2, and leaves the run as it was.
    store_path = str(three_rounds.path)
    assert cli.main(["import", str(tmp_path / "replay"), "--store", store_path, "--run-id", "r"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds the training run 'r'" in err[0]
    with RunStore(store_path, read_only=True) as again:
        assert again.rounds("r")["num_pairs"].tolist() == [8, 0, 8]


def test_one_bad_file_is_named_and_skipped_and_the_rest_imported(tmp_path):
    d = tmp_path / "replay"
    d.mkdir()
    write(d / "iteration_0001.json", round_file_payload(1, make_pairs(1, 2)))
    write(d / "iteration_0002.json", "[" * 5000 + "]" * 5000)  # 10 KB nested 5,000 deep
    write(d / "iteration_0003.json", '{"iteration": ' + str(10**30) + ', "pairs": []}')
    write(d / "iteration_0004.json", [{**make_pairs(4, 1)[0].to_record(), "prompts": [[[["deep"]]] * 2]}])
    write(d / "iteration_0005.json", round_file_payload(5, make_pairs(5, 3)))
    with RunStore(tmp_path / "store" / "run.duckdb") as s:
        report = import_replay_dir(s, d)
        assert report.imported_files == ["iteration_0001.json", "iteration_0005.json"]
        assert report.pairs == 5 and report.rounds == [1, 5]
        reasons = dict(report.skipped)
        assert "nested too deeply" in reasons["iteration_0002.json"]
        assert "'iteration' must be an integer from 0 to 2147483647" in reasons["iteration_0003.json"]
        assert "pair 0" in reasons["iteration_0004.json"]


def test_import_names_ignored_entries_and_follows_no_link_out_of_the_directory(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    write(outside / "iteration_0009.json", round_file_payload(9, make_pairs(9, 4)))
    d = tmp_path / "replay"
    d.mkdir()
    write(d / "iteration_0001.json", round_file_payload(1, make_pairs(1, 2)))
    (d / "sub").mkdir()
    write(d / "sub" / "second.json", round_file_payload(2, make_pairs(2, 2)))
    (d / "iteration_0002.json").symlink_to(d / "sub" / "second.json")  # a link inside the directory is fine
    (d / "iteration_0009.json").symlink_to(outside / "iteration_0009.json")
    write(d / "pairs.jsonl", "{}")
    write(d / "iteration_0003.JSON.bak", "{}")
    with RunStore(tmp_path / "store" / "run.duckdb") as s:
        report = import_replay_dir(s, d)
        assert report.imported_files == ["iteration_0001.json", "iteration_0002.json"] and report.pairs == 4
        ignored = dict(report.ignored)
        assert set(ignored) == {"iteration_0009.json", "pairs.jsonl", "iteration_0003.JSON.bak", "sub"}
        assert "leads out of the directory" in ignored["iteration_0009.json"]
        assert "not a .json file" in ignored["pairs.jsonl"] and "a folder" in ignored["sub"]
        assert 9 not in s.rounds(report.run_id)["round"].tolist()


def test_a_failed_import_in_the_app_leaves_no_folder_and_no_open_store(tmp_path, monkeypatch):
    d = tmp_path / "replay"
    d.mkdir()
    write(d / "iteration_0001.json", round_file_payload(1, make_pairs(1, 2)))
    opened = []
    real_init = RunStore.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        opened.append(self)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(RunStore, "__init__", recording_init)
    monkeypatch.setattr(store_writer, "_append", fail)
    ws = Workspace(tmp_path / "runs")
    try:
        with pytest.raises(OSError, match="disk full"):
            ws.import_replay_dir(d)
        assert [p.name for p in (tmp_path / "runs").iterdir()] == []
        assert opened and all(s._con is None for s in opened)
    finally:
        ws.close()


def test_a_failed_export_leaves_no_tmp_file_and_names_the_destination(three_rounds, tmp_path, monkeypatch):
    def refuse(src, dst):
        raise OSError(28, "No space left on device", str(src), str(dst))

    monkeypatch.setattr(export_module.os, "replace", refuse)
    dest = tmp_path / "out" / "pairs.jsonl"
    with pytest.raises(ExportError) as info:
        export_pairs(three_rounds, "r", "jsonl", dest)
    assert str(dest) in str(info.value) and ".tmp" not in str(info.value)
    with pytest.raises(ExportError, match="iteration_0001.json"):
        export_round_files(three_rounds, "r", tmp_path / "rounds")
    assert [p.name for p in tmp_path.rglob("*.tmp")] == []
