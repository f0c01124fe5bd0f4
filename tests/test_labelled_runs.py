"""Runs whose preferences come from people or a judge: the label phase, the pairs it makes, the judge's orders."""

from __future__ import annotations

import json

import pytest
from http_stub import HttpStub, RecordedRequest, Reply

from comlrl_lab.data.labels import AwaitingLabels, Label, shown_sides
from comlrl_lab.names import metric_names as M
from comlrl_lab.trainers.preference.rounds.judge import parse_verdict
from comlrl_lab.trainers.preference.runtime.sink import MemorySink


def test_a_human_round_waits_at_label_then_trains_exactly_the_labelled_winners(make_trainer, tmp_path):
    sink = MemorySink()
    trainer = make_trainer("MADPOIter", tmp_path, preference_source="human", sink=sink)
    assert trainer.phases == ("collect", "label", "select", "train", "evaluate")
    trainer.step("collect")
    comparisons = list(trainer.collector.round_pairs)
    assert comparisons and all(p.extra["a_side"] in ("winner", "loser") for p in comparisons)
    # Nothing labelled: the label phase refuses, and the cursor stays there.
    with pytest.raises(AwaitingLabels, match=rf"round 1 waits for labels: {len(comparisons)} of {len(comparisons)}"):
        trainer.step()
    assert trainer.next_phase == "label"
    # Verdicts by hand: A on even comparisons, B on odd ones, a tie on the last (dropped).
    verdicts = ["A" if i % 2 == 0 else "B" for i in range(len(comparisons))]
    verdicts[-1] = "tie"
    sink.give(*(Label(1, i, "ann", v, p.extra["a_side"]) for i, (p, v) in enumerate(zip(comparisons, verdicts))))
    trainer.step("label")
    trainer.step("select")
    expected = []
    for pair, verdict in zip(comparisons, verdicts):
        a, b = shown_sides(pair)
        if verdict != "tie":
            expected.append((a, b) if verdict == "A" else (b, a))
    trained = [(p.winner_completions, p.loser_completions) for p in trainer.collector.train_pairs]
    assert trained == expected
    round_file = json.loads((tmp_path / "out" / "preference_replay" / "iteration_0001.json").read_text())
    assert [(r["winner_completions"], r["loser_completions"]) for r in round_file["pairs"]] == expected
    assert sink.metric(M.LABELLED_PAIRS)[-1][1] == len(expected)
    assert sink.metric(M.LABELLED_DROPPED)[-1][1] == 1
    assert sink.metric(M.LABEL_COUNT)[-1][1] == len(comparisons)
    trainer.step("train")
    trainer.step("evaluate")
    assert trainer.finished


def test_the_reward_source_keeps_four_phases_and_no_ties(make_trainer, tmp_path):
    trainer = make_trainer("MADPO", tmp_path)
    assert trainer.phases == ("collect", "select", "train", "evaluate") and trainer.labeller is None
    trainer.step("collect")
    assert all(p.reward_gap > 0 and "a_side" not in p.extra for p in trainer.collector.round_pairs)


def test_parse_verdict_reads_the_first_word():
    cases = {
        "A": "A",
        "b.": "B",
        "**B** is better": "B",
        '"Tie" - both fine': "tie",
        "Both bad: neither works": "both_bad",
        "both-bad": "both_bad",
        "I think A": None,
        "Apples": None,
        "": None,
    }
    assert {text: parse_verdict(text) for text in cases} == cases


def _judge_reply(fmt: str, text: str) -> Reply:
    if fmt == "openai":
        return Reply(json={"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})
    if fmt == "anthropic":
        return Reply(json={"content": [{"type": "text", "text": text}]})
    if fmt == "openai_responses":
        return Reply(json={"output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]})
    return Reply(json={"completions": [text]})


def _prompt(request: RecordedRequest) -> str:
    payload = request.json
    if "messages" in payload:
        return payload["messages"][-1]["content"]
    return payload.get("input") or payload["prompt"]


@pytest.mark.parametrize("fmt", ["generic", "openai", "anthropic", "openai_responses"])
def test_a_judge_round_keeps_verdicts_both_orders_agree_on(make_trainer, tmp_path, monkeypatch, fmt):
    """The stub judge prefers the longer joint response; on the "red" item it answers by position (always "A":
    inconsistent), on the "blue" one with garbage (unparseable); the first request gets a 429 and the second
    times out, and both are retried."""
    monkeypatch.setenv("JUDGE_KEY", "sk-judge-secret")
    state = {"calls": 0}

    def responder(request: RecordedRequest) -> Reply:
        state["calls"] += 1
        if state["calls"] == 1:
            return Reply(status=429, json={"error": "slow down"}, headers={"Retry-After": "0"})
        if state["calls"] == 2:
            return Reply(json={"completions": ["late"]}, delay=3.0)
        prompt = _prompt(request)
        a = prompt.split("Response A:\n", 1)[1].split("\n\nResponse B:", 1)[0]
        b = prompt.split("Response B:\n", 1)[1].split("\n\nWhich", 1)[0]
        task = prompt.split("Task:\n", 1)[1].split("\n\nResponse A:", 1)[0]
        if "red" in task:
            return _judge_reply(fmt, "A")  # position bias: A in both orders
        if "blue" in task:
            return _judge_reply(fmt, "I cannot decide")
        verdict = "A" if len(a) > len(b) else ("B" if len(b) > len(a) else "tie")
        return _judge_reply(fmt, f"{verdict}\nbecause it is longer")

    with HttpStub() as stub:
        stub.route("/judge", responder)
        sink = MemorySink()
        trainer = make_trainer(
            "MADPO",
            tmp_path,
            sink=sink,
            preference_source="judge",
            judge_api_url=stub.url("/judge"),
            judge_api_format=fmt,
            judge_api_model="stub-judge",
            judge_api_key_env="JUDGE_KEY",
            judge_api_timeout=1.0,
            judge_api_max_concurrency=2,
        )
        trainer.step("collect")
        comparisons = list(trainer.collector.round_pairs)
        records = trainer.step("label")
        requests = list(stub.requests)
    assert len(requests) == 2 * len(comparisons) + 2  # two orders each, plus the 429 and the timed-out one
    assert all("sk-judge-secret" in "".join(r.headers.values()) for r in requests)
    inconsistent = unparseable = 0
    expected = []
    for index, pair in enumerate(comparisons):
        if "red" in pair.prompts[0]:
            inconsistent += 1
        elif "blue" in pair.prompts[0]:
            unparseable += 1
        else:
            expected.append(index)
    assert inconsistent and unparseable and expected
    metrics = {m["name"]: m["value"] for m in records.metrics}
    assert metrics[M.JUDGE_INCONSISTENT] == inconsistent
    assert metrics[M.JUDGE_UNPARSEABLE] == unparseable
    assert metrics[M.JUDGE_VERDICTS] == len(expected) == len(records.labels)
    assert [label.pair_index for label in records.labels] == expected
    assert {label.labeller for label in records.labels} == {"stub-judge"}
    for label in records.labels:  # each kept verdict is the longer joint response, in the recorded order
        a, b = shown_sides(comparisons[label.pair_index])
        longer = sum(map(len, a)) - sum(map(len, b))
        assert label.verdict == ("A" if longer > 0 else "B" if longer < 0 else "tie")


# ---- the engine, the CLI and the store: a human run end to end ---------------------------------------------------


def test_a_human_cli_run_waits_says_how_to_label_and_trains_on_imported_labels(model_dir, tmp_path, capsys):
    from test_engine import small_spec

    from comlrl_lab import cli
    from comlrl_lab.store import RunStore

    spec = small_spec(model_dir, num_iterations=1, preference_source="human")
    spec_file = tmp_path / "spec.json"
    spec.save(spec_file)
    assert cli.main(["run", str(spec_file), "--runs-root", str(tmp_path / "runs"), "--quiet"]) == 0
    out = capsys.readouterr().out
    run_dir = next((tmp_path / "runs").iterdir())
    assert "waiting: round 1 waits for labels:" in out and "comlrl-lab labels export" in out
    assert f"resume with: comlrl-lab run --resume {run_dir}" in out

    assert cli.main(["labels", "export", str(run_dir), "--format", "jsonl"]) == 0
    waiting_file = run_dir / "labels_waiting.jsonl"
    rows = [json.loads(line) for line in waiting_file.read_text().splitlines()]
    assert rows and [r["pair_index"] for r in rows] == list(range(len(rows)))
    # Fill in: A for every row; then a row for a comparison that does not exist and one with a bad verdict.
    filled = [{**r, "labeller": "ann", "verdict": "A"} for r in rows]
    filled += [
        {**rows[0], "pair_index": 999, "labeller": "ann", "verdict": "A"},
        {**rows[0], "labeller": "bob", "verdict": "C"},
    ]
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps(r) + "\n" for r in filled) + "not json\n")
    assert cli.main(["labels", "import", str(run_dir), str(answers)]) == 0
    captured = capsys.readouterr()
    assert f"imported {len(rows)} labels; 0 already labelled" in captured.out and "3 rows skipped" in captured.out
    assert "line " + str(len(rows) + 1) + ": no comparison round 1 pair 999" in captured.err
    assert "verdict must be one of A, B, tie, both_bad, got 'C'" in captured.err and "not JSON" in captured.err
    # Importing again changes nothing that was labelled.
    changed = [{**r, "verdict": "B"} for r in filled[: len(rows)]]
    answers.write_text("".join(json.dumps(r) + "\n" for r in changed))
    assert cli.main(["labels", "import", str(run_dir), str(answers)]) == 1  # nothing imported
    captured = capsys.readouterr()
    assert f"imported 0 labels; {len(rows)} already labelled" in captured.out
    assert "no label was imported" in captured.err

    assert cli.main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert "finished" in capsys.readouterr().out
    with RunStore(run_dir / "run.duckdb", read_only=True) as store:
        run_id = store.first_run_id()
        assert [p for r, p in store.committed_phases(run_id)] == ["collect", "label", "select", "train", "evaluate"]
        assert {x.verdict for x in store.labels(run_id)} == {"A"}
        comparisons = store.load_pairs(run_id)
    trained = json.loads((run_dir / "preference_replay" / "iteration_0001.json").read_text())["pairs"]
    assert [r["winner_completions"] for r in trained] == [shown_sides(p)[0] for p in comparisons]


KILLED_LABELLER = """
import sys, time
from comlrl_lab.data.labels import Label
from comlrl_lab.store import RunStore
store = RunStore(sys.argv[1])
for i in range(10_000):
    store.put_labels("r", [Label(1, i, "ann", "A", "winner")])
    print(i, flush=True)
"""


def test_a_kill_9_while_labelling_keeps_every_committed_label(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from comlrl_lab.store import RunStore

    path = tmp_path / "run.duckdb"
    RunStore(path).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_LABELLER, str(path)], stdout=subprocess.PIPE, env=env, text=True
    )
    acknowledged = -1
    while acknowledged < 20:  # each printed index was committed before it was printed
        acknowledged = int(child.stdout.readline())
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with RunStore(path) as store:
        kept = [x.pair_index for x in store.labels("r")]
    assert kept[: acknowledged + 1] == list(range(acknowledged + 1))
    assert len(kept) in (acknowledged + 1, acknowledged + 2)  # at most the one being written when killed is lost
