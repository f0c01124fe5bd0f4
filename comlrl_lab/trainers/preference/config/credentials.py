"""Credentials in comparator settings: what counts as secret, how it is masked on disk, and ``${ENV}`` values.

Secret are ``comparator_api_key``, every value of ``comparator_api_headers``, and in ``comparator_api_url`` the
userinfo (``user:key@host``) and the values of query parameters whose names look like keys or tokens
(``?api_key=...``). A secret written as an environment reference, ``${MY_TOKEN}`` (alone or inside a value, as
in ``"Bearer ${MY_TOKEN}"``), is saved as written, since the reference names a variable and holds no secret;
any other secret is replaced by ``***`` wherever a config leaves memory: spec.json, the store's config, Parquet
snapshots, checkpoints, exports, reprs, logs and error messages. A masked value read back from disk is refused
when a request would send it (``check_unmasked``), so a resumed run asks for the credential again instead of
sending ``***``.

It reads the environment only in ``expand_env``; it does no HTTP and imports no torch. It lives with the configs it
masks: ``config.py`` (``to_dict`` and the reprs), the API comparator and the engine's ``spec.json`` use it, and the
engine may import the trainers, never the other way.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

MASK = "***"
KEY_FIELD = "comparator_api_key"
HEADERS_FIELD = "comparator_api_headers"
URL_FIELD = "comparator_api_url"
JUDGE_URL_FIELD = "judge_api_url"  # the judge model's endpoint, masked as the comparator's is
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Query parameter names holding a credential: api_key, access_token, sig, X-Amz-Signature, password, ...
_SECRET_PARAM = re.compile(r"key|token|secret|pass|pwd|auth|sig|credential|session|cookie|bearer", re.IGNORECASE)
# Where a value splits into parts that may be echoed alone: whitespace, and control characters (NUL included).
_SEPARATORS = re.compile(r"[\s\x00-\x1f\x7f]+")


class MissingCredentialError(ValueError):
    """A credential named by ``${VAR}`` is unset, or one was masked on disk and not given again."""


def is_reference(value: str) -> bool:
    """True when ``value`` takes its secret from the environment, so it may be saved as written."""
    return bool(ENV_REFERENCE.search(value))


def _mask(value: str) -> str:
    return value if is_reference(value) else MASK


def public_headers(headers: Mapping[Any, Any] | None) -> dict[str, str] | None:
    """Header names with their values masked (``${VAR}`` references kept)."""
    if headers is None:
        return None
    return {str(name): _mask(str(value)) for name, value in dict(headers).items()}


def public_url(url: Any) -> Any:
    """``url`` with the userinfo and the values of key-like query parameters masked; anything else unchanged."""
    if not isinstance(url, str) or not url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        # An unparsable URL cannot be told apart from a credential: keep none of it.
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = f"{_mask(userinfo)}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(
            f"{quote(name, safe='')}={quote(_mask(value) if _SECRET_PARAM.search(name) else value, safe='${}*')}"
            for name, value in pairs
        )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def public_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """Config values as they may be written: no key, headers and URL masked. Other fields are unchanged."""
    # Differs from CoMLRL: it saves headers and URL as given, credentials included.
    out = {name: value for name, value in values.items() if name != KEY_FIELD}
    if isinstance(out.get(HEADERS_FIELD), Mapping):
        out[HEADERS_FIELD] = public_headers(out[HEADERS_FIELD])
    for name in (URL_FIELD, JUDGE_URL_FIELD):
        if name in out:
            out[name] = public_url(out[name])
    return out


def expand_env(value: str, what: str, environ: Mapping[str, str] | None = None) -> str:
    """``value`` with every ``${VAR}`` replaced by the variable; an unset or empty one is an error naming it."""
    environ = os.environ if environ is None else environ

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        found = environ.get(name, "")
        if not found:
            raise MissingCredentialError(f"{what} refers to the environment variable {name}, which is not set.")
        return found

    return ENV_REFERENCE.sub(replace, value)


def check_unmasked(headers: Mapping[str, str], url: str) -> None:
    """Refuse credentials that were masked when the run was saved (sending ``***`` would only earn a 401)."""
    for name, value in headers.items():
        if value == MASK:
            raise MissingCredentialError(
                f"{HEADERS_FIELD}[{name!r}] was not saved with the run (header values never are); give it again, "
                "or write it as ${ENV_VARIABLE} so that it is read from the environment."
            )
    parts = urlsplit(url)
    userinfo = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
    query_values = [value for _, value in parse_qsl(parts.query, keep_blank_values=True)]
    if userinfo == MASK or MASK in query_values:
        raise MissingCredentialError(
            f"{URL_FIELD} lost its credentials when the run was saved (they never are); give the URL again, "
            "or write the credential as ${ENV_VARIABLE}."
        )


def secret_strings(headers: Mapping[str, str], url: str, extra: Iterable[str | None] = ()) -> tuple[str, ...]:
    """Every literal secret in resolved headers and URL (and ``extra``), longest first, for masking text."""
    found: set[str] = {str(v) for v in extra if v}
    found.update(str(v) for v in headers.values() if str(v).strip())
    for value in [*headers.values(), *(str(v) for v in extra if v)]:
        # "Bearer abc": the token alone may be echoed without its prefix; "abc\x00d" may be cut at the NUL.
        found.update(part for part in _SEPARATORS.split(str(value)) if len(part) >= 6)
    parts = urlsplit(url)
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        found.add(userinfo)
        found.update(p for p in userinfo.split(":") if p)
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if value and _SECRET_PARAM.search(name):
            found.add(value)
            found.add(quote(value, safe=""))
    spelled = {form for secret in found for form in spellings(secret)}
    return tuple(sorted(spelled - {MASK, ""}, key=len, reverse=True))


def spellings(secret: str) -> set[str]:
    """``secret`` as messages may write it: as it is, and escaped the ways Python and JSON write a str or bytes
    repr (an ``Illegal header value b'Bearer sk-...\\x00x'`` shows the NUL as four characters)."""
    forms = {secret, secret.encode("unicode_escape").decode("ascii"), json.dumps(secret)[1:-1], repr(secret)[1:-1]}
    forms.add(repr(secret.encode("utf-8", "backslashreplace"))[2:-1])
    return forms


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text
