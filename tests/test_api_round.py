"""A whole iterative round against a real local HTTP comparator; the API key is then searched for everywhere."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from http_stub import HttpStub, Reply, openai_chat
from trainer_fixtures import small_config
from workbench_fixtures import custom_task_spec

from comlrl_lab.engine import RunManager
from comlrl_lab.store.export import export_pairs, export_round_files
from comlrl_lab.trainers.preference.comparators.api import ComparatorApiKeyError
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

ENV_KEY = "sk-envkey-DO-NOT-LEAK-4f1c9a7e2b"
LITERAL_KEY = "sk-literal-DO-NOT-LEAK-9b3e1d5c7a"


@pytest.fixture
def server():
    with HttpStub() as stub:
        stub.route("/v1/chat/completions", openai_chat(max_choices=2))
        yield stub


def api_config(url: str, **extra) -> dict:
    """A one-round MADPOIter config of the small settings against the OpenAI-style endpoint at ``url``."""
    api = dict(
        preference_pairs_per_sample=2,
        comparator_policy="api",
        comparator_api_format="openai",
        comparator_api_url=url,
        comparator_api_model="stub-model",
        comparator_api_key_env="COMLRL_TEST_API_KEY",
        comparator_api_backoff_base=0.01,
    )
    return small_config("MADPOIter", **{**api, **extra})


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.parametrize("literal", [False, True], ids=["key-from-env", "literal-key-in-config"])
def test_api_round_end_to_end_and_the_key_is_written_nowhere(model_dir, server, tmp_path, monkeypatch, literal):
    monkeypatch.setenv("COMLRL_TEST_API_KEY", ENV_KEY)
    key = LITERAL_KEY if literal else ENV_KEY
    extra = {"comparator_api_key": LITERAL_KEY} if literal else {}
    spec = custom_task_spec(model_dir, api_config(server.url("/v1/chat/completions"), **extra))
    manager = RunManager(tmp_path / "runs")
    run_id = manager.create(spec)
    manager.start(run_id, rounds=1)
    progress = manager.wait(run_id, timeout=300)
    assert progress.status == "finished", progress.last_error

    requests = server.requests_for("/v1/chat/completions")
    # 12 items x 2 agents, M = 3 with at most 2 choices per answer -> n = 3 then n = 1: two requests each.
    assert len(requests) == 12 * 2 * 2
    assert {r.headers["authorization"] for r in requests} == {f"Bearer {key}"}
    assert sorted({r.json["n"] for r in requests}) == [1, 3]

    run = manager.run(run_id)
    store = run.store
    assert store.pairs_count(run_id) > 0
    sides = set(store.readonly_sql("select distinct side from candidates")["side"])
    assert {"current", "comparator"} <= sides
    exports = run.run_dir / "exports"
    for fmt in ("json", "jsonl", "parquet", "csv"):
        export_pairs(store, run_id, fmt, exports / f"pairs.{fmt}")
    export_round_files(store, run_id, exports / "rounds")
    manager.close()  # flush and close DuckDB before reading its bytes

    assert list((run.run_dir / "checkpoint").glob("checkpoint-*/state.json"))
    assert list((run.run_dir / "preference_replay").rglob("iteration_0001.json"))
    assert files_containing(run.run_dir, key.encode()) == []
    assert files_containing(run.run_dir, b"DO-NOT-LEAK") == []


def test_missing_key_fails_before_any_request(make_trainer, server, tmp_path, monkeypatch):
    monkeypatch.delenv("COMLRL_TEST_API_KEY", raising=False)
    with pytest.raises(ComparatorApiKeyError, match="COMLRL_TEST_API_KEY"):
        make_trainer(
            "MADPOIter",
            tmp_path,
            api_config(server.url("/v1/chat/completions")),
            train_dataset=[{"prompt": "the cat"}],
            reward_func=lambda a, b: [float(len(a[0]))],
        )
    assert server.requests_for("/v1/chat/completions") == []


def test_centralized_api_comparator_parses_roles_and_skips_untagged(make_trainer, tmp_path, monkeypatch):
    monkeypatch.setenv("COMLRL_TEST_API_KEY", ENV_KEY)
    answers = iter(["<agent_0>red cat</agent_0>\n<agent_1>big blue dog</agent_1>", "no tags at all"] * 100)

    def responder(request):
        n = int(request.json.get("n", 1))
        choices = [{"index": i, "message": {"role": "assistant", "content": next(answers)}} for i in range(n)]
        return Reply(json={"choices": choices})

    items = [{"prompt": f"the {w}"} for w in ("cat", "dog", "sun")]
    with HttpStub() as stub:
        stub.route("/chat", responder)
        sink = MemorySink()
        trainer = make_trainer(
            "MADPOIter",
            tmp_path,
            api_config(stub.url("/chat"), comparator_generation_mode="centralized", preference_num_candidates=2),
            train_dataset=items,
            eval_dataset=None,
            formatters=None,
            reward_func=lambda a, b: [float(len(b[0].split()) - len(a[0].split()))],
            sink=sink,
        )
        trainer.step()
        requests = stub.requests_for("/chat")
    assert len(requests) == 3  # one joint request per item, for both roles
    assert "<agent_1>" in requests[0].json["messages"][0]["content"]
    comparator = [c for c in sink.phases[0].candidates if c.side == "comparator"]
    parsed = [c for c in comparator if c.parsed]
    assert [c.completions for c in parsed] == [["red cat", "big blue dog"]] * 3
    assert sum(not c.parsed for c in comparator) == 3
    assert sink.metric("collect/unparsed_comparator_candidates")[0][1] == 3


# Distinct markers, one per position a credential can take, so a leak names its source.
MARKERS = {
    "header-authorization": "MARKER-hdr-auth-71c2",
    "header-custom": "MARKER-hdr-custom-93ad",
    "header-from-env": "MARKER-hdr-env-5e0b",
    "url-userinfo": "MARKER-url-pass-28f4",
    "url-query": "MARKER-url-query-c61e",
}


def test_credentials_in_headers_and_url_are_written_nowhere(model_dir, server, tmp_path, monkeypatch, capfd, caplog):
    caplog.set_level(logging.DEBUG)  # httpx logs every request URL at INFO
    monkeypatch.setenv("COMLRL_TEST_HDR", MARKERS["header-from-env"])
    url = (
        server.url("/v1/chat/completions").replace("http://", f"http://lab:{MARKERS['url-userinfo']}@")
        + f"?api_key={MARKERS['url-query']}&region=eu"
    )
    headers = {
        "Authorization": f"Bearer {MARKERS['header-authorization']}",
        "X-Api-Token": MARKERS["header-custom"],
        "X-From-Env": "token ${COMLRL_TEST_HDR}",
    }
    spec = custom_task_spec(
        model_dir,
        api_config(url, comparator_api_key_env="", comparator_api_headers=headers),
        max_train_items=3,
        max_eval_items=2,
    )
    manager = RunManager(tmp_path / "runs")
    run_id = manager.create(spec)
    manager.start(run_id, rounds=1)
    progress = manager.wait(run_id, timeout=300)
    assert progress.status == "finished", progress.last_error

    # The server got every credential, the one from the environment included.
    request = server.requests_for("/v1/chat/completions")[0]
    assert request.headers["x-api-token"] == MARKERS["header-custom"]
    assert request.headers["x-from-env"] == f"token {MARKERS['header-from-env']}"
    assert f"api_key={MARKERS['url-query']}" in request.query

    run = manager.run(run_id)
    exports = tmp_path / "exports"
    for fmt in ("json", "jsonl", "parquet", "csv"):
        export_pairs(run.store, run_id, fmt, exports / f"pairs.{fmt}")
    export_round_files(run.store, run_id, exports / "rounds")
    assert "token ${COMLRL_TEST_HDR}" in (run.run_dir / "spec.json").read_text()  # the reference is kept
    manager.close()

    captured = capfd.readouterr()
    output = (captured.out + captured.err + caplog.text).encode()
    assert b"HTTP Request" in output or caplog.records  # the logs really were captured
    leaks = {
        where: [str(p) for root in (run.run_dir, exports) for p in files_containing(root, marker.encode())]
        + (["captured output"] if marker.encode() in output else [])
        for where, marker in MARKERS.items()
    }
    assert leaks == {where: [] for where in MARKERS}
    assert files_containing(run.run_dir, b"MARKER-") == []
