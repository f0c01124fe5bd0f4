"""Each candidate's reward breakdown travels with its reward: asked for in the same call as the reward (a code task's
programs run once), kept on the ``JointCandidate``, through the centralized view and a checkpoint's state codec."""

from __future__ import annotations

import dataclasses
import math

import pytest

from comlrl_lab.data.records import PARSE_UNPARSED, JointCandidate
from comlrl_lab.data.rewards import (
    RewardFunctionError,
    RewardProcessors,
    batched_reward,
    breakdown_dict,
    call_reward_with_details,
    set_reward_details,
)
from comlrl_lab.data.tasks import get_task
from comlrl_lab.data.tasks import humaneval as he
from comlrl_lab.trainers.preference.rounds.collection import score_with_task_reward
from comlrl_lab.trainers.preference.runtime import state_codec

COMPLETIONS = [["a", "bb", "ccc"], ["xxxx", "y", "zz"]]
ITEMS = [{"w": 10}, {"w": 20}, {"w": 30}]


@dataclasses.dataclass(frozen=True)
class Why:
    length: int
    reward: float


class Counted:
    """A batched reward with a breakdown; counts how often each is called."""

    def __init__(self, with_reward: bool = True):
        self.calls = {"reward": 0, "details": 0}
        self.with_reward = with_reward

        @batched_reward
        def reward(c1, c2, *, batch_items=None):
            self.calls["reward"] += 1
            return [float(len(a) + len(b)) for a, b in zip(c1, c2)]

        def details(c1, c2, *, batch_items=None):
            self.calls["details"] += 1
            if self.with_reward:
                return [Why(len(a) + len(b), float(len(a) + len(b))) for a, b in zip(c1, c2)]
            return [{"length": len(a) + len(b), "item": item["w"]} for a, b, item in zip(c1, c2, batch_items)]

        self.fn = set_reward_details(reward, details)


def test_a_breakdown_with_its_reward_answers_both_in_one_call():
    counted = Counted()
    scores, details = call_reward_with_details(counted.fn, COMPLETIONS, batch_items=ITEMS)
    assert scores == [5.0, 3.0, 5.0]
    assert details == [{"length": 5, "reward": 5.0}, {"length": 3, "reward": 3.0}, {"length": 5, "reward": 5.0}]
    assert counted.calls == {"reward": 0, "details": 1}


def test_a_breakdown_without_a_reward_field_leaves_the_score_to_the_reward():
    counted = Counted(with_reward=False)
    scores, details = call_reward_with_details(counted.fn, COMPLETIONS, batch_items=ITEMS)
    assert scores == [5.0, 3.0, 5.0]
    assert [d["item"] for d in details] == [10, 20, 30]
    assert counted.calls == {"reward": 1, "details": 1}


def test_a_reward_without_breakdowns_is_called_as_before():
    scores, details = call_reward_with_details(lambda a, b: float(len(a[0]) * len(b[0])), COMPLETIONS)
    assert scores == [4.0, 2.0, 6.0] and details is None


def test_an_unbatched_reward_gets_its_breakdown_one_joint_response_at_a_time():
    seen = []

    def reward(a, b):
        return [float(len(a[0]))]

    def details(a, b):
        seen.append((a, b))
        return [{"first": a[0], "reward": float(len(a[0]))}]

    scores, found = call_reward_with_details(set_reward_details(reward, details), COMPLETIONS)
    assert scores == [1.0, 2.0, 3.0] and [d["first"] for d in found] == ["a", "bb", "ccc"]
    assert seen == [(["a"], ["xxxx"]), (["bb"], ["y"]), (["ccc"], ["zz"])]


def test_wrong_breakdowns_are_refused_by_name():
    reward = batched_reward(lambda a, b: [0.0] * len(a))
    set_reward_details(reward, lambda a, b: [{"reward": 0.0}])
    with pytest.raises(ValueError, match="returned 1 breakdowns for 3 joint responses"):
        call_reward_with_details(reward, COMPLETIONS)
    set_reward_details(reward, lambda a, b: ["why"] * len(a))
    with pytest.raises(ValueError, match="a breakdown is a dataclass or a mapping"):
        call_reward_with_details(reward, COMPLETIONS)
    set_reward_details(reward, lambda a, b: [{"reward": math.inf}] * len(a))
    with pytest.raises(ValueError, match="must be finite"):
        call_reward_with_details(reward, COMPLETIONS)

    def broken(a, b):
        raise KeyError("tests")

    set_reward_details(reward, broken)
    with pytest.raises(
        RewardFunctionError, match=r"reward_details of reward_func .* raised KeyError in a batched call"
    ):
        call_reward_with_details(reward, COMPLETIONS)


def test_breakdown_dict_takes_dataclasses_and_mappings():
    assert breakdown_dict(Why(2, 1.5)) == {"length": 2, "reward": 1.5}
    assert breakdown_dict({1: "x"}) == {"1": "x"}
    with pytest.raises(ValueError, match="a breakdown is a dataclass"):
        breakdown_dict(Why)  # the class, not a breakdown


def _candidate(item: int, j: int, aux: str, main: str, **kw) -> JointCandidate:
    return JointCandidate(item, j, "current", ["p1", "p2"], [aux, main], [[1], [2]], [[0], [0]], **kw)


AUX = "def aux(numbers):\n    s = sorted(numbers)\n    return min((b - a for a, b in zip(s, s[1:])), default=1e9)\n"
MAIN = "def has_close_elements(numbers, threshold):\n    gap = aux(numbers)\n    return gap < threshold\n"


def test_the_trainer_scores_humaneval_once_and_keeps_each_candidates_levels(monkeypatch):
    task = get_task("humaneval")
    item = task.eval_items()[0]
    runs = []
    real = he.run_programs

    def counting(jobs, limits=None):
        runs.append(len(jobs))
        return real(jobs, limits)

    monkeypatch.setattr(he, "run_programs", counting)
    # A unique program each time, so the sandbox's cache cannot hide a second run.
    tag = f"# {id(runs)}\n"
    candidates = [
        _candidate(0, 0, AUX, tag + MAIN),
        _candidate(0, 1, AUX, tag + "def has_close_elements(numbers, threshold):\n    return False\n"),
        _candidate(0, 2, "no code", "no code"),
        _candidate(0, 3, AUX, MAIN, parse_status=PARSE_UNPARSED),
    ]
    score_with_task_reward(candidates, {0: item}, task.reward_func, RewardProcessors.shift(-4))
    assert runs == [2]  # one sandbox batch for the two programs that reach the tests; nothing run twice
    assert [c.raw_reward for c in candidates[:3]] == pytest.approx([4.0, 1.5 + 3 / 7, 0.0])
    assert [c.reward for c in candidates[:3]] == pytest.approx([0.0, -2.5 + 3 / 7, -4.0])
    assert [c.details["summary"] for c in candidates[:3]] == [
        "parses · 7/7 tests · uses aux",
        "parses · 3/7 tests",
        "no aux · no main",
    ]
    assert candidates[0].details["reward"] == 4.0 and "gap = aux(numbers)" in candidates[0].details["program"]
    assert candidates[3].details is None and math.isnan(candidates[3].reward)  # unparsed: not scored


def test_a_reward_without_breakdowns_leaves_details_empty():
    candidates = [_candidate(0, 0, "a", "bb")]
    score_with_task_reward(candidates, {0: {}}, batched_reward(lambda a, b: [1.0] * len(a)), None)
    assert candidates[0].reward == 1.0 and candidates[0].details is None


def test_a_checkpoint_state_keeps_the_breakdowns_and_reads_older_candidates():
    candidate = _candidate(3, 1, "x", "y", raw_reward=2.5, reward=-1.5)
    candidate.details = {"summary": "parses · 1/2 tests", "tests_passed": 1, "reward": 2.5, "nested": [1, None]}
    tree, tensors = state_codec.encode({"candidates": [candidate]})
    assert state_codec.decode(tree, tensors)["candidates"] == [candidate]
    del tree["candidates"][0]["fields"]["details"]  # a checkpoint written before the field existed
    assert state_codec.decode(tree, tensors)["candidates"][0].details is None
