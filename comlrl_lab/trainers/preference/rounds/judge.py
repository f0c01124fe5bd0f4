"""The judge model of ``preference_source="judge"``: each comparison asked in both orders through the API client.

The prompt is ``judge_template`` with ``{prompt}``, ``{response_a}`` and ``{response_b}`` replaced (plain text
replacement: braces in the items or responses are never read as placeholders). The judge is asked twice per
comparison, once in the comparison's recorded order (A = its ``a_side``) and once swapped; a verdict is kept only
when both answers prefer the same stored side (or both say tie, or both say both bad), which removes the judge's
position bias at the cost of the comparisons it answers inconsistently. An answer whose first word is not A, B,
tie or both bad is unparseable; its comparison is dropped and counted. Kept verdicts become labels with the
judge's model name as the labeller.

The requests go through ``comparators.api.ApiComparatorClient``, the client of the ``api`` comparator: its four
formats, retries with Retry-After, the concurrency limit, and the key read from the environment and never written
anywhere. ``judge_settings`` hands it the judge's fields under the names it reads. This module imports no torch.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from comlrl_lab.data.labels import Label, other_side, preferred_side, shown_sides
from comlrl_lab.data.records import PreferencePair
from comlrl_lab.trainers.preference.comparators.api import (
    ApiComparatorClient,
    ApiRequest,
    ComparatorApiError,
    ComparatorApiKeyError,
)

_FIRST_WORD = re.compile(r"^[\s\"'*_`(\[]*(both[\s_-]+bad|tie|a|b)(?![a-z0-9])", re.IGNORECASE)


@dataclass(frozen=True)
class JudgeSettings:
    """The API client's settings (its field names) for the judge: what ``ApiComparatorClient`` reads. The judge has
    fields for the first eight; the rest are the api comparator's defaults (see their field help), and one answer
    per request."""

    comparator_api_url: str
    comparator_api_format: str
    comparator_api_model: str | None
    comparator_api_key_env: str | None
    comparator_api_timeout: float
    comparator_api_max_retries: int
    comparator_api_max_concurrency: int
    max_new_tokens: int
    comparator_api_key: None = None
    comparator_api_headers: None = None
    comparator_api_key_header: str = "Authorization"
    comparator_api_key_prefix: str = "Bearer"
    comparator_api_response_field: str = "completions"
    comparator_api_extra_body: None = None
    comparator_api_max_n_per_request: int = 1
    comparator_api_backoff_base: float = 0.5
    comparator_api_backoff_max: float = 60.0
    comparator_api_retry_after_max: float = 60.0
    comparator_api_max_response_bytes: int = 1024 * 1024
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: None = None


def judge_settings(config: Any) -> JudgeSettings:
    """The judge's fields of a validated config, under the API client's names."""
    return JudgeSettings(
        comparator_api_url=config.judge_api_url,
        comparator_api_format=config.judge_api_format,
        comparator_api_model=config.judge_api_model,
        comparator_api_key_env=config.judge_api_key_env,
        comparator_api_timeout=float(config.judge_api_timeout),
        comparator_api_max_retries=int(config.judge_api_max_retries),
        comparator_api_max_concurrency=int(config.judge_api_max_concurrency),
        max_new_tokens=int(config.judge_max_new_tokens),
    )


def labeller_name(config: Any) -> str:
    return config.judge_api_model or "judge"


def render(template: str, prompts: list[str], response_a: list[str], response_b: list[str]) -> str:
    """The judge prompt of one comparison; several agents' parts are numbered."""

    def joint(parts: list[str]) -> str:
        if len(parts) == 1:
            return parts[0]
        return "\n".join(f"[Agent {i + 1}]\n{text}" for i, text in enumerate(parts))

    distinct = list(dict.fromkeys(prompts))
    prompt = distinct[0] if len(distinct) == 1 else joint(prompts)
    out = template
    for placeholder, value in (
        ("{prompt}", prompt),
        ("{response_a}", joint(response_a)),
        ("{response_b}", joint(response_b)),
    ):
        out = out.replace(placeholder, value)
    return out


#: The api comparator's fields in its client's messages -> what they are for the judge.
_JUDGE_FIELDS = {
    "comparator_api_url": "judge_api_url",
    "comparator_api_format": "judge_api_format",
    "comparator_api_model": "judge_api_model",
    "comparator_api_key_env": "judge_api_key_env",
    "comparator_api_key": "judge_api_key_env",
    "comparator_api_timeout": "judge_api_timeout",
    "comparator_api_max_retries": "judge_api_max_retries",
    "comparator_api_max_concurrency": "judge_api_max_concurrency",
}
_FIXED_BOUNDS = {
    "comparator_api_max_response_bytes": "the judge's fixed bound on a response body",
    "comparator_api_retry_after_max": "the judge's fixed cap on Retry-After",
}
_FIELD = re.compile(r"\bcomparator_api_[a-z_]+")


def judge_wording(message: str) -> str:
    """An API client message as the judge's: "Judge API", the judge's field names, and the bounds that are no field
    of the judge's said to be fixed (their values stay)."""

    def field(match: re.Match[str]) -> str:
        name = match.group(0)
        return _JUDGE_FIELDS.get(name) or _FIXED_BOUNDS.get(name) or name

    message = message.replace("Comparator API", "Judge API").replace("for agent 0 (format", "for the judge (format")
    return _FIELD.sub(field, message)


def printable(text: str | None, limit: int = 80) -> str:
    """An answer as a message shows it: its repr (control characters and escape codes escaped), cut to ``limit``."""
    return repr(text if text is None else text[:limit])


def parse_verdict(answer: str) -> str | None:
    """A, B, tie or both_bad from the answer's first word (quotes, markdown and case aside), else None."""
    match = _FIRST_WORD.match(answer or "")
    if match is None:
        return None
    word = re.sub(r"[\s_-]+", "_", match.group(1).lower())
    return {"a": "A", "b": "B", "tie": "tie", "both_bad": "both_bad"}[word]


@dataclass
class JudgeRound:
    """The judge's verdicts on one round's comparisons, and what it dropped."""

    labels: list[Label]
    inconsistent: int = 0
    unparseable: int = 0
    first_unparseable: str | None = None  # the first answer that did not begin with a verdict, as it came back


class Judge:
    """Asks the judge about comparisons, both orders at once, through one API client."""

    def __init__(self, config: Any, *, rng: random.Random | None = None):
        self.config = config
        self.name = labeller_name(config)
        try:
            self.client = ApiComparatorClient(judge_settings(config), rng=rng)
        except ComparatorApiKeyError as error:
            # The client words it for the comparator's fields; the judge's are named here.
            raise ComparatorApiKeyError(
                str(error)
                .replace("comparator_api_format", "judge_api_format")
                .replace("comparator_api_key_env", "judge_api_key_env")
            ) from None

    def ask(self, round_index: int, comparisons: list[PreferencePair], progress: Any = None) -> JudgeRound:
        try:
            return self._ask(round_index, comparisons, progress)
        except ComparatorApiError as error:
            # The client words its errors for the api comparator's fields; the judge has fields of its own.
            raise ComparatorApiError(
                judge_wording(str(error)),
                endpoint=error.endpoint,
                status=error.status,
                body_excerpt=error.body_excerpt,
            ) from None

    def nothing_usable(self, round_index: int, asked: JudgeRound, comparisons: int) -> str:
        """The ``NoUsableLabels`` line of a round whose judge left no verdict that prefers a side: the judge, the
        counts and the likely cause."""
        ties = sum(label.verdict == "tie" for label in asked.labels)
        both_bad = len(asked.labels) - ties
        if asked.unparseable == comparisons:
            cause = (
                f"no answer began with A, B, tie or both bad (the first: {printable(asked.first_unparseable)}); "
                "judge_template must ask for one of them first, and the endpoint must send the answer as text where "
                "judge_api_format reads it"
            )
        elif asked.inconsistent == comparisons:
            cause = "every comparison was answered differently in the two orders: a judge that prefers a position"
        elif asked.labels and asked.unparseable + asked.inconsistent == 0:
            cause = "the judge called every comparison a tie or both bad"
        else:
            cause = "no comparison got the same side in both orders"
        return (
            f"round {round_index}: the judge {self.name!r} at {self.client.endpoint} left no usable label: of "
            f"{comparisons} comparisons (each asked in both orders) {asked.unparseable} got an unparseable answer, "
            f"{asked.inconsistent} inconsistent answers, {ties} tie and {both_bad} both bad; likely cause: {cause}"
        )

    def _ask(self, round_index: int, comparisons: list[PreferencePair], progress: Any = None) -> JudgeRound:
        template = self.config.judge_template
        requests = []
        for pair in comparisons:
            a, b = shown_sides(pair)
            requests.append(ApiRequest(render(template, list(pair.prompts), a, b), agent_idx=0))
            requests.append(ApiRequest(render(template, list(pair.prompts), b, a), agent_idx=0))
        answers = self.client.complete_many(requests, progress=progress)
        out = JudgeRound(labels=[])
        for index, pair in enumerate(comparisons):
            a_side = pair.extra.get("a_side", "winner")
            first, second = (parse_verdict(texts[0] if texts else "") for texts in answers[2 * index : 2 * index + 2])
            if first is None or second is None:
                out.unparseable += 1
                if out.first_unparseable is None:
                    texts = answers[2 * index] if first is None else answers[2 * index + 1]
                    out.first_unparseable = texts[0] if texts else ""
                continue
            same = preferred_side(first, a_side) == preferred_side(second, other_side(a_side))
            if not same or (first in ("tie", "both_bad") and first != second):
                out.inconsistent += 1
                continue
            out.labels.append(Label(round_index, index, self.name, first, a_side))
        return out
