"""API comparator against a real recording HTTP server on 127.0.0.1: bodies, headers, n loop, retries,
timeouts, bad answers, key handling and concurrency. Sleeps are kept tiny (backoff_base 0.01)."""

from __future__ import annotations

import asyncio
import gc
import logging
import pickle
import random
import socket
import threading
import time

import pytest
from http_stub import (
    HttpStub,
    RecordedRequest,
    Reply,
    anthropic_messages,
    generic,
    openai_chat,
    openai_responses,
    sequence,
    with_delay,
)
from repo_scripts import load_repo_script

from comlrl_lab.trainers.preference import MADPOIterConfig
from comlrl_lab.trainers.preference.comparators.api import (
    ApiComparatorClient,
    ApiRequest,
    ComparatorApiError,
    ComparatorApiKeyError,
    backoff_delay,
    build_body,
    extract_anthropic,
    extract_generic,
    extract_openai_chat,
    extract_responses,
    jsonable,
    key_env_name,
    openai_max_n,
    resolve_key,
    retry_after_seconds,
)
from comlrl_lab.trainers.preference.config import ConfigError, credentials
from comlrl_lab.trainers.preference.config.credentials import MissingCredentialError

pytestmark = pytest.mark.timeout(60)

SECRET = "sk-test-SECRET-0123456789"
KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MY_COMPARATOR_KEY")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in KEY_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def stub():
    with HttpStub() as server:
        yield server


def api_config(url: str, **fields) -> MADPOIterConfig:
    """An api-comparator config for ``url`` with quick retries; ``fields`` by their config names."""
    values = {"comparator_api_backoff_base": 0.01, "comparator_api_max_retries": 3, "comparator_api_timeout": 5.0}
    values.update(fields)
    return MADPOIterConfig(comparator_policy="api", comparator_api_url=url, **values)


def client_for(url: str, **fields) -> ApiComparatorClient:
    return ApiComparatorClient(api_config(url, **fields), rng=random.Random(7))


class FakeScalar:
    """Stands in for a numpy or torch scalar in a task item."""

    def __init__(self, value):
        self.value = value

    def item(self):
        return self.value


# -- formats: exact bodies and headers -------------------------------------------------------------------


def test_the_format_comes_resolved_from_the_config(stub):
    # The config resolves aliases once; the client reads the canonical name. CoMLRL sends an unknown format as
    # generic; here it is the config's error, raised before any client or request exists.
    assert [client_for(stub.url("/x"), comparator_api_format=x, comparator_api_key="k").config.comparator_api_format
            for x in (" Chat ", "MESSAGES", "codex", "generic")] == ["openai", "anthropic", "openai_responses", "generic"]  # fmt: skip
    with pytest.raises(ConfigError, match="did you mean 'openai'") as error:
        client_for(stub.url("/x"), comparator_api_format="opneai")
    assert error.value.field == "comparator_api_format" and error.value.suggestion == "openai"
    assert stub.requests == []


def test_generic_body_and_headers_are_exact(stub):
    stub.route("/gen", generic())
    client = client_for(
        stub.url("/gen"),
        comparator_api_model="m-1",
        top_k=None,
        comparator_api_headers={"X-Team": "lab"},
        comparator_api_extra_body={"temperature": 0.9, "stop": ["\n"]},
        comparator_api_key=SECRET,
        max_new_tokens=32,
    )
    item = {"id": FakeScalar(3), "tags": ("a", "b"), "nested": {"x": FakeScalar(1.5)}, "obj": object}
    out = client.complete_many([ApiRequest("Say hi", 1, item, 2)])
    assert out == [["Say hi#0", "Say hi#1"]]
    (request,) = stub.requests
    assert request.method == "POST"
    assert request.json == {
        "prompt": "Say hi",
        "agent_idx": 1,
        "num_return_sequences": 2,
        "max_new_tokens": 32,
        "temperature": 0.9,  # extra_body is merged last and wins
        "top_p": 0.6,
        "top_k": None,  # generic keeps None values
        "batch_item": {"id": 3, "tags": ["a", "b"], "nested": {"x": 1.5}, "obj": str(object)},
        "model": "m-1",
        "stop": ["\n"],
    }
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-team"] == "lab"
    assert request.headers["authorization"] == f"Bearer {SECRET}"


def test_generic_endpoint_without_key_sends_no_auth_header(stub):
    stub.route("/gen", generic())
    client = client_for(stub.url("/gen"))
    assert client.complete_many([ApiRequest("p", 0, {}, 1)]) == [["p#0"]]
    assert "authorization" not in stub.requests[0].headers
    assert "model" not in stub.requests[0].json


def test_openai_body_and_headers_are_exact(stub, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    stub.route("/v1/chat/completions", openai_chat())
    client = client_for(
        stub.url("/v1/chat/completions"), comparator_api_format="openai", comparator_api_model="gpt-x", top_k=7
    )
    out = client.complete_many([ApiRequest("Q?", 0, {"a": 1}, 3)])
    assert out == [["Q?|n3|0", "Q?|n3|1", "Q?|n3|2"]]
    (request,) = stub.requests
    assert request.json == {
        "model": "gpt-x",
        "messages": [{"role": "user", "content": "Q?"}],
        "n": 3,
        "max_tokens": 256,
        "temperature": 0.6,
        "top_p": 0.6,
    }  # no top_k, no batch_item
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert request.headers["content-type"] == "application/json"
    assert "anthropic-version" not in request.headers


def test_anthropic_one_request_per_candidate_with_x_api_key(stub, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    stub.route("/v1/messages", anthropic_messages())
    client = client_for(
        stub.url("/v1/messages"),
        comparator_api_format="anthropic",
        comparator_api_model="claude-x",
        comparator_api_extra_body={"top_k": 5},
    )
    out = client.complete_many([ApiRequest("Hello", 0, {}, 3)])
    assert out == [["Hello|a"] * 3]  # only the first text block of each answer
    assert len(stub.requests) == 3
    for request in stub.requests:
        assert request.json == {
            "model": "claude-x",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "Hello"}],
            "temperature": 0.6,
            "top_k": 5,
        }
        assert request.headers["x-api-key"] == SECRET  # Authorization -> x-api-key, "Bearer" dropped
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in request.headers


def test_anthropic_keeps_a_configured_version_header(stub, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    stub.route("/v1/messages", anthropic_messages())
    client = client_for(
        stub.url("/v1/messages"),
        comparator_api_format="messages",
        comparator_api_headers={"Anthropic-Version": "2099-01-01"},
    )
    client.complete_many([ApiRequest("x", 0, {}, 1)])
    assert stub.requests[0].headers["anthropic-version"] == "2099-01-01"


@pytest.mark.parametrize("alias", ["openai_responses", "responses", "codex"])
def test_responses_one_request_per_candidate(stub, monkeypatch, alias):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    stub.route("/v1/responses", openai_responses())
    client = client_for(
        stub.url("/v1/responses"), comparator_api_format=alias, comparator_api_model="gpt-r", max_new_tokens=16
    )
    out = client.complete_many([ApiRequest("Why?", 2, {}, 2)])
    assert out == [["Why?|r", "Why?|r"]]
    assert len(stub.requests) == 2
    for request in stub.requests:
        assert request.json == {"model": "gpt-r", "input": "Why?", "max_output_tokens": 16}
        assert request.headers["authorization"] == f"Bearer {SECRET}"


@pytest.mark.parametrize(
    ("header", "prefix", "expected_name", "expected_value"),
    [("X-Key", "", "x-key", SECRET), ("Authorization", "Token", "authorization", f"Token {SECRET}")],
)
def test_key_header_and_prefix(stub, monkeypatch, header, prefix, expected_name, expected_value):
    monkeypatch.setenv("MY_COMPARATOR_KEY", SECRET)
    stub.route("/gen", generic())
    client_for(
        stub.url("/gen"),
        comparator_api_key_env="MY_COMPARATOR_KEY",
        comparator_api_key_header=header,
        comparator_api_key_prefix=prefix,
    ).complete_many([ApiRequest("p", 0, {}, 1)])
    assert stub.requests[0].headers[expected_name] == expected_value


# -- candidate counts: the n loop and generic top-up -------------------------------------------------------


def test_openai_n_loop_with_a_server_capped_at_two_choices(stub, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    stub.route("/v1/chat/completions", openai_chat(max_choices=2))
    client = client_for(stub.url("/v1/chat/completions"), comparator_api_format="openai", comparator_api_model="gpt-x")
    out = client.complete_many([ApiRequest("q", 0, {}, 5)])
    assert [r.json["n"] for r in stub.requests] == [5, 3, 1]
    assert out == [["q|n5|0", "q|n5|1", "q|n3|0", "q|n3|1", "q|n1|0"]]


def test_openai_configured_cap_splits_requests(stub, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    stub.route("/v1/chat/completions", openai_chat())
    client = client_for(
        stub.url("/v1/chat/completions"), comparator_api_format="openai", comparator_api_max_n_per_request=2
    )
    out = client.complete_many([ApiRequest("q", 0, {}, 5)])
    assert sorted(r.json["n"] for r in stub.requests) == [1, 2, 2]
    assert out == [["q|n2|0", "q|n2|1", "q|n2|0", "q|n2|1", "q|n1|0"]]


def test_deepseek_gets_one_candidate_per_request(stub, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    stub.route("/chat/completions", openai_chat())
    client = client_for(
        stub.url("/chat/completions"), comparator_api_format="openai", comparator_api_model="deepseek-chat"
    )
    assert client.complete_many([ApiRequest("q", 0, {}, 3)]) == [["q|n1|0"] * 3]
    assert [r.json["n"] for r in stub.requests] == [1, 1, 1]
    by_url = api_config(
        "https://api.deepseek.com/chat/completions", comparator_api_format="openai", comparator_api_model="x"
    )
    assert openai_max_n(by_url, 5) == 1
    assert (
        openai_max_n(api_config("http://h/v1", comparator_api_format="openai", comparator_api_max_n_per_request=9), 5)
        == 5
    )
    assert openai_max_n(api_config("http://h/v1", comparator_api_format="openai"), 5) == 5


def test_generic_tops_up_short_answers(stub):
    stub.route("/gen", generic(field_name="data.texts", max_choices=2))
    client = client_for(stub.url("/gen"), comparator_api_response_field="data.texts")
    out = client.complete_many([ApiRequest("p", 0, {}, 5)])
    assert [r.json["num_return_sequences"] for r in stub.requests] == [5, 3, 1]
    assert out == [["p#0", "p#1", "p#0", "p#1", "p#0"]]


def test_decentralized_request_sets_keep_request_order(stub):
    stub.route("/gen", with_delay(generic(), 0.0))
    requests = [ApiRequest(f"item{i}-agent{a}", a, {"i": i}, 2) for i in range(4) for a in range(2)]
    out = client_for(stub.url("/gen")).complete_many(requests)
    assert out == [[f"{r.prompt}#0", f"{r.prompt}#1"] for r in requests]
    assert sorted((r.json["batch_item"]["i"], r.json["agent_idx"]) for r in stub.requests) == [
        (i, a) for i in range(4) for a in range(2)
    ]


def test_centralized_request_returns_joint_texts_unparsed(stub):
    joint = "<agent_0>\nA\n</agent_0>\n<agent_1>\nB\n</agent_1>"
    stub.route("/gen", Reply(json={"completions": [joint, joint]}))
    out = client_for(stub.url("/gen")).complete_many([ApiRequest("You are a centralized coordinator...", 1, {}, 2)])
    assert out == [[joint, joint]]
    assert stub.requests[0].json["agent_idx"] == 1


def test_zero_candidates_and_no_requests_send_nothing(stub):
    stub.route("/gen", generic())
    client = client_for(stub.url("/gen"))
    assert client.complete_many([]) == []
    assert client.complete_many([ApiRequest("p", 0, {}, 0)]) == [[]]
    assert stub.requests == []


# -- retries, timeouts and errors ------------------------------------------------------------------------------


def test_429_then_success_honours_retry_after(stub):
    stub.route("/gen", sequence([Reply(status=429, body="slow down", headers={"Retry-After": "0.3"})], then=generic()))
    client = client_for(stub.url("/gen"), comparator_api_backoff_base=1e-6)  # the wait is the server's
    start = time.perf_counter()
    assert client.complete_many([ApiRequest("p", 0, {}, 1)]) == [["p#0"]]
    assert time.perf_counter() - start >= 0.3
    assert len(stub.requests) == 2


def test_500_three_times_then_a_clear_error(stub):
    stub.route("/v1/gen", Reply(status=500, body="upstream exploded " + "x" * 1000))
    client = client_for(stub.url("/v1/gen?api-version=2024&token=abc"), comparator_api_max_retries=2)
    with pytest.raises(ComparatorApiError) as info:
        client.complete_many([ApiRequest("p", 0, {}, 1)])
    error = info.value
    assert len(stub.requests) == 3
    assert error.status == 500
    assert error.endpoint == stub.url("/v1/gen")  # no query string
    assert error.body_excerpt == ("upstream exploded " + "x" * 1000)[:300]
    message = str(error)
    assert stub.url("/v1/gen") in message and "HTTP 500" in message and "3 attempt" in message
    assert "upstream exploded" in message and "token=abc" not in message


def test_5xx_recovers_within_the_retry_budget(stub):
    stub.route("/gen", sequence([Reply(status=502), Reply(status=503)], then=generic()))
    assert client_for(stub.url("/gen"), comparator_api_max_retries=2).complete_many([ApiRequest("p", 0, {}, 1)]) == [
        ["p#0"]
    ]
    assert len(stub.requests) == 3


def test_a_hanging_server_hits_the_timeout(stub):
    stub.route("/gen", Reply(delay=30.0, json={"completions": ["late"]}))
    client = client_for(stub.url("/gen"), comparator_api_timeout=0.3, comparator_api_max_retries=1)
    start = time.perf_counter()
    with pytest.raises(ComparatorApiError, match=r"timed out after 0.3 s") as info:
        client.complete_many([ApiRequest("p", 0, {}, 1)])
    assert time.perf_counter() - start < 5.0
    assert info.value.status is None
    assert len(stub.requests) == 2


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = client_for(f"http://127.0.0.1:{port}/gen", comparator_api_max_retries=1)
    with pytest.raises(ComparatorApiError, match="connection failed") as info:
        client.complete_many([ApiRequest("p", 0, {}, 1)])
    assert info.value.endpoint == f"http://127.0.0.1:{port}/gen"


@pytest.mark.parametrize(
    ("reply", "pattern"),
    [
        (Reply(body="<html>definitely not json"), r"not JSON \(HTTP 200\). Response body: <html>definitely not json"),
        (Reply(body="{'completions': ['x'"), "not JSON"),
        (Reply(body=""), "empty body"),
        (Reply(json={"completions": []}), "returned no completions for agent 0"),
        (Reply(json={"unexpected": 1}), "returned no completions"),
    ],
)
def test_garbage_answers_give_clear_errors(stub, reply, pattern):
    stub.route("/gen", reply)
    with pytest.raises(ComparatorApiError, match=pattern):
        client_for(stub.url("/gen")).complete_many([ApiRequest("p", 0, {}, 1)])
    assert len(stub.requests) == 1  # a malformed 200 is not retried


def test_402_says_insufficient_balance_without_retrying(stub):
    stub.route("/gen", Reply(status=402, json={"error": "Insufficient Balance"}))
    with pytest.raises(ComparatorApiError, match="HTTP 402: insufficient balance") as info:
        client_for(stub.url("/gen")).complete_many([ApiRequest("p", 0, {}, 1)])
    assert info.value.status == 402 and "Insufficient Balance" in str(info.value)
    assert len(stub.requests) == 1


def test_other_client_errors_are_not_retried_and_401_names_the_variable(stub, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    stub.route("/v1/chat/completions", Reply(status=401, json={"error": "bad key"}))
    client = client_for(stub.url("/v1/chat/completions"), comparator_api_format="openai")
    with pytest.raises(ComparatorApiError, match="HTTP 401. Check the API key \\(OPENAI_API_KEY\\)"):
        client.complete_many([ApiRequest("p", 0, {}, 1)])
    assert len(stub.requests) == 1


def test_first_failure_cancels_the_other_requests(stub):
    def responder(request: RecordedRequest) -> Reply:
        if request.json["prompt"] == "bad":
            return Reply(status=400, body="bad prompt")
        return Reply(delay=10.0, json={"completions": ["slow"]})

    stub.route("/gen", responder)
    start = time.perf_counter()
    with pytest.raises(ComparatorApiError, match="HTTP 400"):
        client_for(stub.url("/gen")).complete_many([ApiRequest("slow", 0, {}, 1)] * 3 + [ApiRequest("bad", 0, {}, 1)])
    assert time.perf_counter() - start < 5.0


# -- keys --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api_format", "variable"),
    [("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY"), ("codex", "OPENAI_API_KEY")],
)
def test_missing_key_fails_before_any_request(stub, api_format, variable):
    stub.route("/x", generic())
    with pytest.raises(ComparatorApiKeyError, match=variable):
        client_for(stub.url("/x"), comparator_api_format=api_format)
    with pytest.raises(ComparatorApiKeyError, match="MY_COMPARATOR_KEY"):
        client_for(stub.url("/x"), comparator_api_format=api_format, comparator_api_key_env="MY_COMPARATOR_KEY")
    assert stub.requests == []


def test_key_sources(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert resolve_key(api_config("http://h/x", comparator_api_format="openai")) == "from-env"
    assert resolve_key(api_config("http://h/x", comparator_api_format="openai", comparator_api_key=SECRET)) == SECRET
    local = api_config("http://h/x", comparator_api_format="openai", comparator_api_key_env="")
    assert resolve_key(local) is None  # local servers
    assert resolve_key(api_config("http://h/x")) is None  # generic: no default variable
    with pytest.raises(ComparatorApiKeyError, match="MY_COMPARATOR_KEY"):  # a named variable must be set
        resolve_key(api_config("http://h/x", comparator_api_key_env="MY_COMPARATOR_KEY"))


def test_the_key_never_appears_in_messages_logs_reprs_or_pickles(stub, monkeypatch, caplog):
    def echo(request: RecordedRequest) -> Reply:
        return Reply(status=503, body=f"headers were {request.headers}")

    stub.route("/echo", echo)
    config = api_config(
        stub.url("/echo"),
        comparator_api_key=SECRET,
        comparator_api_headers={"X-Api-Key": "hdr-" + SECRET},
        comparator_api_max_retries=1,
    )
    client = ApiComparatorClient(config, rng=random.Random(0))
    with caplog.at_level(logging.DEBUG), pytest.raises(ComparatorApiError) as info:
        client.complete_many([ApiRequest("p", 0, {}, 1)])
    assert SECRET in str(stub.requests[0].headers)  # the server really got it ...
    seen = [
        str(info.value),
        info.value.body_excerpt,
        caplog.text,
        repr(config),
        repr(client),
        str(config.to_dict()),
    ]
    assert all(SECRET not in text for text in seen)  # ... but nothing of ours shows it
    assert "***" in str(info.value)
    literal = api_config(stub.url("/echo"), comparator_api_key=SECRET)
    assert SECRET.encode() not in pickle.dumps(literal)  # a literal key is never written
    restored = pickle.loads(pickle.dumps(literal))
    assert restored.comparator_api_key is None and restored.comparator_api_url == literal.comparator_api_url

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    openai_client = ApiComparatorClient(api_config(stub.url("/echo"), comparator_api_format="openai"))
    assert SECRET.encode() not in pickle.dumps(openai_client)
    assert pickle.loads(pickle.dumps(openai_client))._headers["Authorization"] == f"Bearer {SECRET}"


# -- reading the config --------------------------------------------------------------------------------------------


def test_the_client_reads_the_configs_fields_under_their_names(monkeypatch):
    config = MADPOIterConfig(
        comparator_policy="api",
        comparator_api_url="https://example.test/v1/messages?x=1",
        comparator_api_format="Anthropic_Messages",
        comparator_api_model="claude",
        comparator_api_timeout=12.0,
        comparator_api_key=SECRET,
        comparator_api_extra_body={"metadata": {"run": 1}},
        max_new_tokens=64,
        temperature=0.7,
        top_p=0.9,
        top_k=None,
    )
    client = ApiComparatorClient(config)
    assert client.endpoint == "https://example.test/v1/messages"
    assert key_env_name(config) == "ANTHROPIC_API_KEY" and resolve_key(config) == SECRET
    assert client._headers["x-api-key"] == SECRET and client._headers["anthropic-version"] == "2023-06-01"
    assert build_body(config, ApiRequest("p", 0, {}, 1), 1) == {
        "model": "claude",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "p"}],
        "temperature": 0.7,
        "metadata": {"run": 1},
    }


# -- pure helpers ---------------------------------------------------------------------------------------------------


def test_extractors():
    assert extract_generic({"completions": "one"}) == ["one"]
    assert extract_generic({"out": [{"text": "a"}, {"content": "b"}, {"message": {"content": "c"}}, 3]}, "out") == [
        "a",
        "b",
        "c",
    ]
    assert extract_generic({"missing": 1, "outputs": ["x"]}, "data.texts") == ["x"]
    assert extract_generic({"data": [{"t": "y"}]}, "data.0.t") == ["y"]
    assert extract_generic({"completions": 42}) == ["42"]
    assert extract_generic(["bare", "list"]) == ["bare", "list"]
    assert extract_generic({"nothing": 1}) == []
    choices = [{"message": {"content": "m"}}, {"text": "t"}, {"message": {"content": [{"type": "text", "text": "p"}]}}]
    assert extract_openai_chat({"choices": choices}) == ["m", "t", "p"]
    assert extract_anthropic({"content": [{"type": "tool_use"}, {"type": "text", "text": "a"}]}) == ["a"]
    assert extract_responses({"output": [{"content": [{"type": "text", "text": "r"}]}]}) == ["r"]
    assert extract_anthropic({}) == extract_responses({"output": None}) == extract_openai_chat("x") == []


def test_jsonable_converts_scalars_arrays_and_unknowns():
    class FakeArray:
        def item(self):
            raise ValueError("only one element tensors can be converted")

        def tolist(self):
            return [[1, 2], [3, 4]]

    assert jsonable({"s": FakeScalar(2), "a": FakeArray(), "t": (1, "x"), 1: None}) == {
        "s": 2,
        "a": [[1, 2], [3, 4]],
        "t": [1, "x"],
        "1": None,
    }
    assert jsonable({1, 2}) in ("{1, 2}", "{2, 1}")


def test_backoff_is_seeded_full_jitter_capped_and_honours_retry_after():
    draws = [backoff_delay(a, base=0.5, cap=3.0, rng=random.Random(1)) for a in range(6)]
    again = [backoff_delay(a, base=0.5, cap=3.0, rng=random.Random(1)) for a in range(6)]
    assert draws == again
    assert all(0.0 <= d <= min(3.0, 0.5 * 2**a) for a, d in enumerate(draws))
    assert backoff_delay(0, base=0.5, cap=3.0, rng=random.Random(1), retry_after=2.0) == 2.0
    assert backoff_delay(0, base=0.5, cap=3.0, rng=random.Random(1), retry_after=100.0) == 3.0
    assert retry_after_seconds({"Retry-After": "7"}) == 7.0
    assert retry_after_seconds({"retry-after-ms": "250", "Retry-After": "7"}) == 0.25
    assert retry_after_seconds({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after_seconds({"Retry-After": "soon"}) is None
    assert retry_after_seconds({}) is None


# -- concurrency and threads -------------------------------------------------------------------------------------------


def test_concurrency_is_bounded(stub):
    stub.route("/gen", with_delay(generic(), 0.1))
    client = client_for(stub.url("/gen"), comparator_api_max_concurrency=3)
    done: list[tuple[int, int]] = []
    out = client.complete_many(
        [ApiRequest(f"p{i}", 0, {}, 1) for i in range(12)], progress=lambda d, t: done.append((d, t))
    )
    assert out == [[f"p{i}#0"] for i in range(12)]
    assert 2 <= stub.max_in_flight <= 3
    assert done[-1] == (12, 12) and len(done) == 12


def test_works_from_a_worker_thread_and_inside_a_running_loop(stub):
    stub.route("/gen", generic())
    client = client_for(stub.url("/gen"))
    results: list = []
    worker = threading.Thread(target=lambda: results.append(client.complete_many([ApiRequest("t", 0, {}, 1)])))
    worker.start()
    worker.join(timeout=30)
    assert results == [[["t#0"]]]

    async def inside_loop():
        sync = client.complete_many([ApiRequest("s", 0, {}, 1)])  # hops to a helper thread
        native = await client.acomplete_many([ApiRequest("a", 0, {}, 1)])
        return sync, native

    assert asyncio.run(inside_loop()) == ([["s#0"]], [["a#0"]])


@pytest.mark.benchmark
def test_benchmark_64_candidates_with_200ms_latency_run_concurrently():
    module = load_repo_script("benchmarks/api_concurrency.py", "api_concurrency_benchmark")
    result = module.measure(num_candidates=64, latency=0.2, max_concurrency=8)
    print(f"\n64 candidates x 200 ms, max_concurrency=8: {result['elapsed_s']:.3f} s, ratio {result['ratio']:.3f}")
    assert result["candidates"] == 64 and result["http_requests"] == 64
    assert result["ratio"] < 0.35  # ideal 1/8 = 0.125; sequential (CoMLRL) = 1.0


def test_custom_header_values_and_url_credentials_are_masked_in_errors_and_logs(stub, monkeypatch, caplog):
    def echo(request: RecordedRequest) -> Reply:
        return Reply(status=401, body=f"saw {request.headers} at {request.path}?{request.query}")

    stub.route("/echo", echo)
    monkeypatch.setenv("COMLRL_TEST_TRACE", "envtoken-7f3a91")
    url = stub.url("/echo").replace("http://", "http://bob:pw-52e8c1@") + "?access_token=qtok-0d94b2&region=eu"
    headers = {"X-Custom-Auth": "custom-1b7e40", "X-Trace": "${COMLRL_TEST_TRACE}"}
    config = api_config(url, comparator_api_headers=headers, comparator_api_max_retries=0)
    client = ApiComparatorClient(config, rng=random.Random(0))
    with caplog.at_level(logging.DEBUG), pytest.raises(ComparatorApiError) as info:
        client.complete_many([ApiRequest("p", 0, {}, 1)])
    assert stub.requests[0].headers["x-trace"] == "envtoken-7f3a91"
    seen = "\n".join([str(info.value), info.value.body_excerpt, caplog.text, repr(config), repr(client)])
    for secret in ("custom-1b7e40", "envtoken-7f3a91", "pw-52e8c1", "qtok-0d94b2"):
        assert secret not in seen
    assert "region=eu" in repr(config) and "${COMLRL_TEST_TRACE}" in repr(config)


def test_env_reference_must_be_set_and_masked_values_are_refused(stub, monkeypatch):
    monkeypatch.delenv("COMLRL_TEST_UNSET", raising=False)
    with pytest.raises(MissingCredentialError, match=r"comparator_api_headers\['X-T'\].*COMLRL_TEST_UNSET"):
        client_for(stub.url("/x"), comparator_api_headers={"X-T": "${COMLRL_TEST_UNSET}"})
    # What spec.json holds after a save: a resumed run must be given the credential again, not send ***.
    with pytest.raises(MissingCredentialError, match=r"comparator_api_headers\['X-T'\] was not saved"):
        client_for(stub.url("/x"), comparator_api_headers={"X-T": "***"})
    with pytest.raises(MissingCredentialError, match="comparator_api_url lost its credentials"):
        client_for(stub.url("/x") + "?api_key=***")
    assert stub.requests == []


@pytest.mark.parametrize(
    ("url", "public"),
    [
        ("https://h/v1", "https://h/v1"),
        ("https://user:pw@h/v1", "https://***@h/v1"),
        ("https://tok@h/v1", "https://***@h/v1"),
        ("https://h/v1?api_key=s&x=1", "https://h/v1?api_key=***&x=1"),
        ("https://h/v1?Token=s&sig=t&model=m", "https://h/v1?Token=***&sig=***&model=m"),
        ("https://h/v1?key=${K}", "https://h/v1?key=${K}"),
        ("https://${U}:${P}@h/", "https://${U}:${P}@h/"),
    ],
)
def test_public_url_masks_userinfo_and_key_like_parameters(url, public):
    assert credentials.public_url(url) == public


def test_a_long_retry_after_fails_at_once_naming_the_cap(stub):
    stub.route("/gen", Reply(status=429, body="later", headers={"Retry-After": "3600"}))
    client = client_for(stub.url("/gen"), comparator_api_max_retries=3, comparator_api_retry_after_max=60.0)
    start = time.monotonic()
    with pytest.raises(ComparatorApiError, match=r"asked to wait 3600 s .*comparator_api_retry_after_max = 60 s"):
        client.complete_many([ApiRequest("p", 0, {}, 1)])
    assert time.monotonic() - start < 5 and len(stub.requests) == 1


def test_every_failed_task_is_collected_after_a_401(stub, caplog):
    stub.route("/gen", Reply(status=401, body="bad key"))
    client = client_for(
        stub.url("/gen"), comparator_api_format="anthropic", comparator_api_key="k", comparator_api_max_concurrency=8
    )
    with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(ComparatorApiError, match="HTTP 401"):
        client.complete_many([ApiRequest(f"p{i}", 0, {}, 4) for i in range(4)])
    gc.collect()  # asyncio reports unread task exceptions when the task is collected
    assert "never retrieved" not in caplog.text
