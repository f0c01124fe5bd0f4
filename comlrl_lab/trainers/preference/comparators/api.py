"""API comparator: send comparator prompts to a remote LLM endpoint over HTTP and return candidate texts.

Four request formats (``comparator_api_format``), with CoMLRL 1.4.3's bodies, headers and parsing
(reference section 4.6): ``generic`` (one JSON request with ``num_return_sequences``), ``openai`` (chat
completions, ``n`` per request with a cap; DeepSeek-style endpoints get ``n = 1``), ``anthropic`` (Messages
API) and ``openai_responses`` (Responses API); the last two have no ``n``, so each candidate is one request.

What this module adds to CoMLRL (all requests of a collection phase go through ``complete_many`` at once):
bounded concurrency across candidates and items, retries with exponential backoff and full jitter on 429,
5xx, timeouts and connection errors (``Retry-After`` honoured), clear errors naming the endpoint, status
and a body excerpt, and a key read from the environment that never appears in a message, a log, a repr
or a pickle.

Everything a request needs is read from the preference config it is given, under the config's field names
(``comparator_api_*``, ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``); the config has checked them all
and resolved the format's aliases, so nothing here checks or defaults them again.

It does not build prompts, parse centralized joint texts into roles (``centralized.py`` does; here a
centralized request is one more prompt whose completions come back as joint texts), score or pair. It
imports no torch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import json
import logging
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from comlrl_lab.trainers.preference.config import credentials

# httpx (with its command line's click) is imported by the first request: a run without an API comparator, and every
# process that only reads a config, does without its 0.4 s.
if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "openai_responses": "OPENAI_API_KEY"}
ANTHROPIC_VERSION = "2023-06-01"
BODY_EXCERPT_CHARS = 300
_GENERIC_FALLBACK_FIELDS = ("completions", "responses", "outputs", "choices")


class ComparatorApiError(RuntimeError):
    """A comparator request failed for good. ``endpoint`` has no query string; ``status`` is None when no
    HTTP answer came back; ``body_excerpt`` is the first 300 characters of the answer."""

    def __init__(self, message: str, *, endpoint: str, status: int | None = None, body_excerpt: str = ""):
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status
        self.body_excerpt = body_excerpt


class ComparatorApiKeyError(ValueError):
    """The format needs an API key and none was found; raised before any request is sent."""


@dataclass(frozen=True)
class ApiRequest:
    """One prompt for which ``num_candidates`` completions are wanted (decentralized: one per agent and
    item; centralized: the joint prompt, with ``agent_idx`` the centralized agent index)."""

    prompt: str
    agent_idx: int
    batch_item: Mapping[str, Any] = field(default_factory=dict)
    num_candidates: int = 1


# -- the key and the headers -----------------------------------------------------------------------------


def key_env_name(config: Any) -> str | None:
    """The environment variable the key is read from, or None when no key is expected: ``comparator_api_key_env``
    (an empty name sends no key, for local OpenAI-compatible servers), else the format's (``DEFAULT_KEY_ENV``)."""
    if config.comparator_api_key_env is not None:
        return config.comparator_api_key_env.strip() or None
    return DEFAULT_KEY_ENV.get(config.comparator_api_format)


def resolve_key(config: Any) -> str | None:
    """The literal ``comparator_api_key`` (held in memory only), else the environment variable's value; raises
    ``ComparatorApiKeyError`` when a variable is expected but unset or empty. A generic endpoint with no variable
    named needs no key."""
    literal = config.comparator_api_key
    if literal and literal.strip():
        return literal.strip()
    env_name = key_env_name(config)
    if env_name is None:
        return None
    value = os.environ.get(env_name, "").strip()
    # Differs from CoMLRL: a missing key is reported here, before any request, not as an HTTP 401.
    if not value:
        raise ComparatorApiKeyError(
            f"comparator_api_format={config.comparator_api_format!r} needs an API key: the environment variable "
            f"{env_name} is not set (or is empty). Set it, or name another variable in "
            "comparator_api_key_env (an empty string sends no key)."
        )
    return value


def configured_headers(config: Any) -> dict[str, str]:
    """``comparator_api_headers`` as they will be sent, before ``${ENV}`` references are read."""
    return {str(k): str(v) for k, v in (config.comparator_api_headers or {}).items()}


def request_headers(config: Any, key: str | None) -> dict[str, str]:
    """Content-Type, then the configured headers, then anthropic-version (anthropic), then the key."""
    headers: dict[str, str] = {}
    _set_header(headers, "Content-Type", "application/json")
    for name, value in configured_headers(config).items():
        _set_header(headers, name, credentials.expand_env(value, f"comparator_api_headers[{name!r}]"))
    is_anthropic = config.comparator_api_format == "anthropic"
    if is_anthropic and not _has_header(headers, "anthropic-version"):
        _set_header(headers, "anthropic-version", ANTHROPIC_VERSION)
    if key:
        name = config.comparator_api_key_header
        prefix = (config.comparator_api_key_prefix or "").strip()
        if is_anthropic and name.lower() == "authorization":
            name = "x-api-key"
        if is_anthropic and prefix == "Bearer":
            prefix = ""
        _set_header(headers, name, f"{prefix} {key}" if prefix else key)
    return headers


# -- pure helpers: bodies, parsing, backoff -------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """A task item made JSON-safe: scalars as they are, containers recursively, numpy/torch scalars via
    ``.item()``, arrays via ``.tolist()`` (CoMLRL falls back to ``str`` for those), anything else ``str``."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    # Differs from CoMLRL: arrays become lists (CoMLRL's .item() fails on them and falls back to str).
    for method in ("item", "tolist"):
        convert = getattr(value, method, None)
        if callable(convert):
            try:
                return jsonable(convert())
            except (ValueError, RuntimeError, TypeError):
                continue
    return str(value)


def openai_max_n(config: Any, num_candidates: int) -> int:
    """``n`` cap per chat request: the configured cap clamped to [1, M]; else 1 for DeepSeek; else M."""
    if config.comparator_api_max_n_per_request is not None:
        return max(1, min(config.comparator_api_max_n_per_request, num_candidates))
    model = (config.comparator_api_model or "").lower()
    if "api.deepseek.com" in config.comparator_api_url.lower() or model.startswith("deepseek-"):
        return 1
    return max(1, num_candidates)


def build_body(config: Any, request: ApiRequest, count: int) -> dict[str, Any]:
    """The JSON body asking for ``count`` candidates (``count`` is 1 for anthropic and responses)."""
    fmt, model = config.comparator_api_format, config.comparator_api_model
    if fmt == "generic":
        body: dict[str, Any] = {
            "prompt": request.prompt,
            "agent_idx": request.agent_idx,
            "num_return_sequences": count,
            "max_new_tokens": config.max_new_tokens,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "top_k": config.top_k,
            "batch_item": jsonable(dict(request.batch_item or {})),
        }
        if model:
            body["model"] = model
    else:
        messages = [{"role": "user", "content": request.prompt}]
        if fmt == "openai":
            body = {
                "model": model,
                "messages": messages,
                "n": count,
                "max_tokens": config.max_new_tokens,
                "temperature": config.temperature,
                "top_p": config.top_p,
            }
        elif fmt == "anthropic":
            body = {
                "model": model,
                "max_tokens": config.max_new_tokens,
                "messages": messages,
                "temperature": config.temperature,
            }
        else:
            body = {"model": model, "input": request.prompt, "max_output_tokens": config.max_new_tokens}
        body = {k: v for k, v in body.items() if v is not None}
    body.update(config.comparator_api_extra_body or {})
    return body


def _text_of(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    if not isinstance(item, Mapping):
        return None
    for name in ("text", "content", "completion", "response"):
        value = item.get(name)
        if isinstance(value, str):
            return value
    message = item.get("message")
    if isinstance(message, Mapping) and isinstance(message.get("content"), str):
        return message["content"]
    return None


def extract_generic(payload: Any, response_field: str = "completions") -> list[str]:
    """Texts at the dotted ``response_field`` (list indices allowed), else at the first truthy of
    completions/responses/outputs/choices; a bare list or string answer is taken as the value itself."""
    value: Any = payload
    for part in response_field.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            value = None
            break
    if value is None or value == [] or value == "":
        value = None
        if isinstance(payload, Mapping):
            value = next((payload[k] for k in _GENERIC_FALLBACK_FIELDS if payload.get(k)), None)
        elif isinstance(payload, (list, str)):
            value = payload
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text for text in map(_text_of, value) if text is not None]
    text = _text_of(value)
    return [text if text is not None else str(value)]


def extract_openai_chat(payload: Any) -> list[str]:
    """``choices[*].message.content`` (a list of text parts is joined), else ``choices[*].text``."""
    choices = payload.get("choices") if isinstance(payload, Mapping) else None
    texts: list[str] = []
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, Mapping):
            continue
        message = choice.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping)) or None
        if not isinstance(content, str):
            content = choice.get("text") if isinstance(choice.get("text"), str) else None
        if content is not None:
            texts.append(content)
    return texts


def extract_anthropic(payload: Any) -> list[str]:
    """The first ``type: text`` content block (CoMLRL uses only the first)."""
    blocks = payload.get("content") if isinstance(payload, Mapping) else None
    for block in blocks if isinstance(blocks, list) else []:
        if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str):
            return [block["text"]]
    return []


def extract_responses(payload: Any) -> list[str]:
    """The first ``output[*].content[*]`` part of type output_text or text (first only, as CoMLRL)."""
    items = payload.get("output") if isinstance(payload, Mapping) else None
    for item in items if isinstance(items, list) else []:
        parts = item.get("content") if isinstance(item, Mapping) else None
        for part in parts if isinstance(parts, list) else []:
            is_text = isinstance(part, Mapping) and part.get("type") in ("output_text", "text")
            if is_text and isinstance(part.get("text"), str):
                return [part["text"]]
    return []


def backoff_delay(
    attempt: int, *, base: float, cap: float, rng: random.Random, retry_after: float | None = None
) -> float:
    """Seconds to wait before retry ``attempt + 1``: the server's Retry-After when given (capped),
    otherwise full jitter, uniform in [0, min(cap, base * 2**attempt)]."""
    if retry_after is not None:
        return max(0.0, min(retry_after, cap))
    return rng.uniform(0.0, min(cap, base * (2.0**attempt)))


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """``retry-after-ms`` (OpenAI) or ``Retry-After`` as seconds or an HTTP date; None when absent."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        if "retry-after-ms" in lowered:
            return float(lowered["retry-after-ms"]) / 1000.0
        if "retry-after" in lowered:
            raw = lowered["retry-after"].strip()
            try:
                return float(raw)
            except ValueError:
                when = email.utils.parsedate_to_datetime(raw)
                return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None
    return None


_EXTRACTORS: dict[str, Callable[[Any], list[str]]] = {
    "openai": extract_openai_chat,
    "anthropic": extract_anthropic,
    "openai_responses": extract_responses,
}


# -- the client -------------------------------------------------------------------------------------------


class ApiComparatorClient:
    """Sends all requests of a collection phase concurrently and returns their candidates in order.

    ``rng`` drives only the backoff jitter. The key is resolved (and a missing one reported) here, before
    any request. Each ``complete_many`` call opens one ``httpx.AsyncClient`` on its own event loop, so it
    works from any thread; from inside a running loop it hops to a helper thread (or use
    ``acomplete_many``).
    """

    def __init__(self, config: Any, *, rng: random.Random | None = None):
        self.config = config
        self._rng = rng if rng is not None else random.Random(0)
        #: The URL without credentials, query string or fragment: what messages show.
        self.endpoint = _endpoint_of(config.comparator_api_url)
        configured = configured_headers(config)
        credentials.check_unmasked(configured, config.comparator_api_url)
        key = resolve_key(config)
        self._headers = request_headers(config, key)
        self._url = credentials.expand_env(config.comparator_api_url, "comparator_api_url")
        sent = {k: v for k, v in self._headers.items() if _has_header(configured, k)}
        self._secrets = credentials.secret_strings(sent, self._url, [key])
        _HTTP_LOG_FILTER.add(self._secrets)

    def __repr__(self) -> str:
        return f"ApiComparatorClient({self.config.comparator_api_format} at {self.endpoint})"

    def __reduce__(self) -> tuple:
        # Never pickle resolved headers (they hold the key); the config pickles without its secrets, and the copy
        # reads the key from the environment again.
        return (_rebuild_client, (self.config, self._rng))

    def complete_many(
        self, requests: Sequence[ApiRequest], *, progress: Callable[[int, int], None] | None = None
    ) -> list[list[str]]:
        """Completions per request, in request order (each list has ``num_candidates`` texts).

        ``progress(done, total)`` is called as each request finishes, on the thread running the loop.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.acomplete_many(requests, progress=progress))
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(lambda: asyncio.run(self.acomplete_many(requests, progress=progress))).result()

    async def acomplete_many(
        self, requests: Sequence[ApiRequest], *, progress: Callable[[int, int], None] | None = None
    ) -> list[list[str]]:
        requests = list(requests)
        if not requests:
            return []
        limit = self.config.comparator_api_max_concurrency
        semaphore = asyncio.Semaphore(limit)
        done = 0

        async def run_one(request: ApiRequest) -> list[str]:
            nonlocal done
            texts = await self._complete_one(client, semaphore, request)
            done += 1
            if progress is not None:
                progress(done, len(requests))
            return texts

        import httpx

        async with httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.comparator_api_timeout),
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
            follow_redirects=False,
        ) as client:
            return await _all_or_cancel([run_one(r) for r in requests])

    # -- per request ---------------------------------------------------------------------------------------
    async def _complete_one(
        self, client: httpx.AsyncClient, semaphore: asyncio.Semaphore, request: ApiRequest
    ) -> list[str]:
        wanted = int(request.num_candidates)
        if wanted <= 0:
            return []
        fmt = self.config.comparator_api_format
        if fmt in ("anthropic", "openai_responses"):
            # No `n` in these APIs: one request per candidate, all in flight together.
            body = build_body(self.config, request, 1)
            results = await _all_or_cancel([self._ask(client, semaphore, body, request, 1) for _ in range(wanted)])
            return [texts[0] for texts in results]
        texts: list[str] = []
        while len(texts) < wanted:
            remaining = wanted - len(texts)
            if fmt == "openai":
                # CoMLRL loops n = min(max_n, remaining) one request at a time; we send the chunks of a
                # round together, which asks for the same n values whenever the server returns all of them.
                cap = openai_max_n(self.config, wanted)
                sizes = [min(cap, remaining - start) for start in range(0, remaining, cap)]
            else:
                # Differs from CoMLRL: generic never topped up a short answer; we ask again for the rest.
                sizes = [remaining]
            bodies = [build_body(self.config, request, size) for size in sizes]
            rounds = await _all_or_cancel([self._ask(client, semaphore, b, request, s) for b, s in zip(bodies, sizes)])
            for got in rounds:
                texts.extend(got)
        return texts[:wanted]

    async def _ask(
        self, client: httpx.AsyncClient, semaphore: asyncio.Semaphore, body: dict, request: ApiRequest, count: int
    ) -> list[str]:
        """One request (with retries), parsed; an answer with no completion is an error, which also bounds
        the top-up loops: every round either adds a text or raises."""
        payload, raw = await self._post(client, semaphore, body)
        fmt = self.config.comparator_api_format
        if fmt == "generic":
            texts = extract_generic(payload, self.config.comparator_api_response_field)
        else:
            texts = _EXTRACTORS[fmt](payload)
        if not texts:
            where = f"agent {request.agent_idx} (format {fmt!r}, asked for {count}) from {self.endpoint}"
            raise self._error(f"Comparator API returned no completions for {where}.", 200, raw)
        return texts[:count]

    async def _post(self, client: httpx.AsyncClient, semaphore: asyncio.Semaphore, body: dict) -> tuple[Any, str]:
        import httpx

        config, endpoint = self.config, self.endpoint
        timeout = config.comparator_api_timeout
        content = json.dumps(body, ensure_ascii=False).encode("utf-8")
        attempts = config.comparator_api_max_retries + 1
        for attempt in range(attempts):
            status: int | None = None
            raw = ""
            retry_after = None
            try:
                # Differs from CoMLRL: bounded concurrency (the semaphore) and retries with backoff (this loop).
                # httpx's timeout is per socket operation; asyncio.timeout bounds the whole exchange. Not wait_for:
                # it runs the request in a task of its own, whose error is never read when a cancel (another request
                # failed first) reaches it mid-flight: "Task exception was never retrieved" after a 307.
                async with semaphore, asyncio.timeout(timeout):
                    response, raw = await self._send(client, content)
            except _BodyTooLarge as too_large:
                message = (
                    f"Comparator API at {endpoint} sent a response body of more than {too_large.size} bytes, past "
                    f"comparator_api_max_response_bytes = {config.comparator_api_max_response_bytes}; it was not read further."
                )
                raise self._error(message, too_large.status, "") from None
            except (httpx.TimeoutException, asyncio.TimeoutError):
                failure = f"timed out after {timeout:g} s"
            except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                failure = f"connection failed ({type(exc).__name__}: {exc})"
            except httpx.HTTPError as exc:
                raise self._error(
                    f"Comparator API request to {endpoint} failed: {type(exc).__name__}: {exc}", None, ""
                ) from None
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return self._decode(raw, status), raw
                if status == 402:
                    raise self._error(
                        f"Comparator API at {endpoint} returned HTTP 402: insufficient balance.", 402, raw
                    )
                if not _retryable(status):
                    hint = ""
                    if status in (401, 403):
                        hint = f" Check the API key ({key_env_name(config) or 'comparator_api_key'})."
                    raise self._error(
                        f"Comparator API request to {endpoint} failed with HTTP {status}.{hint}", status, raw
                    )
                failure = f"HTTP {status}"
                retry_after = retry_after_seconds(response.headers)
                cap = config.comparator_api_retry_after_max
                if retry_after is not None and retry_after > cap:
                    # Differs from CoMLRL (which never retries): a long Retry-After fails now, not after the waits.
                    message = (
                        f"Comparator API at {endpoint} answered {failure} and asked to wait {retry_after:g} s "
                        f"(Retry-After), more than comparator_api_retry_after_max = {cap:g} s."
                    )
                    raise self._error(message, status, raw)
            if attempt + 1 >= attempts:
                message = f"Comparator API request to {endpoint} failed after {attempts} attempt(s): {failure}."
                raise self._error(message, status, raw)
            delay = backoff_delay(
                attempt,
                base=config.comparator_api_backoff_base,
                cap=config.comparator_api_backoff_max,
                rng=self._rng,
                retry_after=retry_after,
            )
            retry = f"retry {attempt + 1} of {config.comparator_api_max_retries} in {delay:.2f} s"
            logger.warning("Comparator API %s: %s; %s", endpoint, self._redact(failure), retry)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send(self, client: httpx.AsyncClient, content: bytes) -> tuple[httpx.Response, str]:
        """POST and read the body, at most ``max_response_bytes`` of it (decoded): eight concurrent 1 GB answers
        must not take the process past its memory."""
        limit = self.config.comparator_api_max_response_bytes
        request = client.build_request("POST", self._url, content=content, headers=self._headers)
        response = await client.send(request, stream=True)
        try:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise _BodyTooLarge(int(declared) - 1, response.status_code)
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise _BodyTooLarge(limit, response.status_code)
                chunks.append(chunk)
        finally:
            await response.aclose()
        return response, b"".join(chunks).decode(response.encoding or "utf-8", errors="replace")

    def _decode(self, raw: str, status: int) -> Any:
        if not raw.strip():
            raise self._error(f"Comparator API at {self.endpoint} returned an empty body (HTTP {status}).", status, raw)
        try:
            return json.loads(raw)
        except ValueError:
            message = f"Comparator API at {self.endpoint} returned a body that is not JSON (HTTP {status})."
            raise self._error(message, status, raw) from None

    def _redact(self, text: str) -> str:
        return credentials.redact(text, self._secrets)

    def _error(self, message: str, status: int | None, body: str) -> ComparatorApiError:
        """The error to raise, with the body excerpt appended and every secret masked."""
        if body.strip():
            message = f"{message} Response body: {_excerpt(body)}"
        return ComparatorApiError(
            self._redact(message),
            endpoint=self.endpoint,
            status=status,
            body_excerpt=self._redact(_excerpt(body)),
        )


class _BodyTooLarge(Exception):
    """A response body passed ``max_response_bytes`` (``size`` bytes were known to be too many)."""

    def __init__(self, size: int, status: int):
        super().__init__(size)
        self.size = size
        self.status = status


class _RedactingFilter(logging.Filter):
    """Masks comparator credentials in httpx's own log lines, which print the full request URL."""

    def __init__(self) -> None:
        super().__init__()
        self._secrets: tuple[str, ...] = ()

    def add(self, secrets: Sequence[str]) -> None:
        self._secrets = tuple(sorted(set(self._secrets) | set(secrets), key=len, reverse=True))

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            message = record.getMessage()
            redacted = credentials.redact(message, self._secrets)
            if redacted != message:
                record.msg, record.args = redacted, ()
        return True


_HTTP_LOG_FILTER = _RedactingFilter()
# A logger's filters see only the records logged to that logger, not its children's: httpcore logs through
# "httpcore.http11" and friends, whose DEBUG traces hold the failing request's header values.
for _name in (
    "httpx",
    "httpcore",
    *(f"httpcore.{part}" for part in ("connection", "http11", "http2", "proxy", "socks")),
):
    logging.getLogger(_name).addFilter(_HTTP_LOG_FILTER)


def _rebuild_client(config: Any, rng: random.Random) -> ApiComparatorClient:
    return ApiComparatorClient(config, rng=rng)


async def _all_or_cancel(coros: Sequence[Awaitable[Any]]) -> list[Any]:
    """Results in order; on the first failure cancel the rest and raise it (no orphaned requests)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        # Read every finished task's exception, not only the first, before anything here awaits: an outer
        # _all_or_cancel that gives up on this call cancels it at that await, and asyncio reports any exception left
        # unread as "Task exception was never retrieved" (several requests failing with the same 401 or 307).
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    errors = [task.exception() for task in tasks if not task.cancelled()]
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first
    return [task.result() for task in tasks]


def _retryable(status: int) -> bool:
    return status in (408, 429) or status >= 500


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _excerpt(raw: str) -> str:
    """The first characters of a body, control characters (a terminal's escape codes) written as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", (raw or "")[:BODY_EXCERPT_CHARS])


def _endpoint_of(url: str) -> str:
    parts = urlsplit(str(url or ""))
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _has_header(headers: Mapping[str, str], name: str) -> bool:
    return any(k.lower() == name.lower() for k in headers)


def _set_header(headers: dict[str, str], name: str, value: str) -> None:
    for existing in [k for k in headers if k.lower() == name.lower()]:
        del headers[existing]
    headers[name] = value
