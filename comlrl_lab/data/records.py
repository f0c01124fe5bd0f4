"""Record types that travel between sampling, pairing, replay, the store and exports.

This module holds plain dataclasses and the seed's JSON (de)serialisation. It does not import torch:
token ids are plain ``list[int]`` so records can be stored, exported and replayed anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Side = Literal["current", "comparator", "eval"]  # eval: fresh samples scored by the task reward

#: The nine fields of one pair record, in the seed page's order. Exports write exactly these keys.
SEED_RECORD_FIELDS: tuple[str, ...] = (
    "prompts",
    "winner_completions",
    "loser_completions",
    "winner_reward",
    "loser_reward",
    "candidate_reward_mean",
    "raw_rewards",
    "target_raw_reward",
    "comparator_raw_reward",
)

PARSE_OK = "ok"
PARSE_UNPARSED = "unparsed"


@dataclass
class JointCandidate:
    """One joint response: candidate ``candidate_index`` of every agent for one task item.

    ``completion_ids[i]`` are the tokens agent i sampled (no padding, EOS kept when the model emitted it),
    so training and replay use exactly what was sampled. ``details`` is the task reward's breakdown of this
    response (``reward_details``, a JSON-ready dict such as a code task's levels), None when the reward gives none.
    """

    item_index: int
    candidate_index: int
    side: Side
    prompts: list[str]
    completions: list[str]
    completion_ids: list[list[int]]
    prompt_ids: list[list[int]]
    raw_reward: float = math.nan
    reward: float = math.nan
    parse_status: str = PARSE_OK
    details: dict[str, Any] | None = None

    @property
    def parsed(self) -> bool:
        return self.parse_status == PARSE_OK

    @property
    def token_counts(self) -> list[int]:
        return [len(ids) for ids in self.completion_ids]


@dataclass
class PreferencePair:
    """One preference pair: the seed's nine fields plus where it came from and the sampled tokens."""

    prompts: list[str]
    winner_completions: list[str]
    loser_completions: list[str]
    winner_reward: float
    loser_reward: float
    candidate_reward_mean: float
    raw_rewards: list[float] | None = None
    target_raw_reward: float | None = None
    comparator_raw_reward: float | None = None
    # Provenance (not part of the seed record).
    round_index: int | None = None  # 1-based iteration, as in iteration_NNNN.json; None for base trainers
    item_index: int | None = None
    winner_candidate_index: int | None = None
    loser_candidate_index: int | None = None
    winner_side: Side | None = None  # None for base trainers (both sides are the current policy)
    # Sampled tokens per agent; None when the pair came from text only (e.g. an imported CoMLRL file).
    prompt_ids: list[list[int]] | None = None
    winner_ids: list[list[int]] | None = None
    loser_ids: list[list[int]] | None = None
    # Per agent: summed log-prob of the winner's and the loser's completion under the frozen reference policy,
    # taken once when the pair is collected (madpo_reference="initial"); None otherwise.
    reference_winner_logps: list[float] | None = None
    reference_loser_logps: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def reward_gap(self) -> float:
        return float(self.winner_reward) - float(self.loser_reward)

    @property
    def has_token_ids(self) -> bool:
        return self.prompt_ids is not None and self.winner_ids is not None and self.loser_ids is not None

    def to_record(self) -> dict[str, Any]:
        """The seed's JSON record: nine keys, floats, ``raw_rewards`` [] and targets null when absent."""
        return {
            "prompts": list(self.prompts),
            "winner_completions": list(self.winner_completions),
            "loser_completions": list(self.loser_completions),
            "winner_reward": float(self.winner_reward),
            "loser_reward": float(self.loser_reward),
            "candidate_reward_mean": float(self.candidate_reward_mean),
            "raw_rewards": [float(x) for x in self.raw_rewards] if self.raw_rewards is not None else [],
            "target_raw_reward": _optional_float(self.target_raw_reward),
            "comparator_raw_reward": _optional_float(self.comparator_raw_reward),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any], num_agents: int | None = None, **provenance: Any) -> PreferencePair:
        """Build a pair from a seed/CoMLRL JSON record.

        Text lists are cut or padded with "" to ``num_agents`` entries, as CoMLRL does when it reloads shards.
        Raises ``ValueError`` naming the missing or malformed field.
        """
        if not isinstance(record, dict):
            raise ValueError(f"a pair record must be a JSON object, got {type(record).__name__}")
        texts: dict[str, list[str]] = {}
        for name in ("prompts", "winner_completions", "loser_completions"):
            value = record.get(name)
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                raise ValueError(f"pair record field '{name}' must be a list of strings")
            texts[name] = _fit(value, num_agents) if num_agents else list(value)
        numbers: dict[str, float] = {}
        for name in ("winner_reward", "loser_reward"):
            numbers[name] = _required_float(record, name)
        mean = record.get("candidate_reward_mean")
        numbers["candidate_reward_mean"] = (
            _required_float(record, "candidate_reward_mean")
            if mean is not None
            else (numbers["winner_reward"] + numbers["loser_reward"]) / 2.0
        )
        raw = record.get("raw_rewards")
        if raw in (None, []):
            raw_rewards = None
        elif isinstance(raw, list) and all(_is_number(x) for x in raw):
            raw_rewards = [float(x) for x in raw]
        else:
            raise ValueError("pair record field 'raw_rewards' must be a list of numbers")
        return cls(
            **texts,
            **numbers,
            raw_rewards=raw_rewards,
            target_raw_reward=_optional_record_float(record, "target_raw_reward"),
            comparator_raw_reward=_optional_record_float(record, "comparator_raw_reward"),
            **provenance,
        )


def round_file_payload(iteration: int, pairs: list[PreferencePair]) -> dict[str, Any]:
    """The object CoMLRL writes per round: ``{"iteration", "num_pairs", "pairs"}``."""
    records = [p.to_record() for p in pairs]
    return {"iteration": int(iteration), "num_pairs": len(records), "pairs": records}


def _fit(values: list[str], n: int) -> list[str]:
    return (list(values) + [""] * n)[:n]


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _required_float(record: dict[str, Any], name: str) -> float:
    value = record.get(name)
    if not _is_number(value):
        raise ValueError(f"pair record field '{name}' must be a number, got {value!r}")
    return float(value)


def _optional_record_float(record: dict[str, Any], name: str) -> float | None:
    value = record.get(name)
    if value is None:
        return None
    if not _is_number(value):
        raise ValueError(f"pair record field '{name}' must be a number or null, got {value!r}")
    return float(value)


def _optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def align_joint(
    per_agent, prompts: list[list[str]], item_indices: Sequence[int], side: Side
) -> list[list[JointCandidate]]:
    """``per_agent[i][k][j]`` (a sample with ``text``, ``completion_ids`` and ``prompt_ids``) -> ``joint[k][j]``,
    index-aligned across agents."""
    joint: list[list[JointCandidate]] = []
    for k, item_index in enumerate(item_indices):
        count = min(len(per_agent[i][k]) for i in range(len(per_agent)))
        row = []
        for j in range(count):
            samples = [per_agent[i][k][j] for i in range(len(per_agent))]
            row.append(
                JointCandidate(
                    item_index=int(item_index),
                    candidate_index=j,
                    side=side,
                    prompts=[prompts[i][k] for i in range(len(per_agent))],
                    completions=[s.text for s in samples],
                    completion_ids=[list(s.completion_ids) for s in samples],
                    prompt_ids=[list(s.prompt_ids) for s in samples],
                )
            )
        joint.append(row)
    return joint
