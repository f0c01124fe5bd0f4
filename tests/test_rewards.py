"""Reward calling convention (CoMLRL 1.4.3, reference section 2.5), batched calls, processors and errors."""

from __future__ import annotations

import functools
import math
import pickle

import pytest

from comlrl_lab.data import rewards as rewards_module
from comlrl_lab.data.rewards import (
    RewardFunctionError,
    RewardProcessors,
    apply_reward_processor,
    batched_reward,
    call_reward_function,
    set_reward_range,
)

# Two agents, three joint responses; completions[i][j] is agent i's text in joint response j.
COMPLETIONS = [["a", "bb", "ccc"], ["xxxx", "y", "zz"]]
PROMPTS = [["p0", "p01", "p012"], ["q", "qq", "qqq"]]
ITEMS = [{"w": 10}, {"w": 20}, {"w": 30}]


class FakeTensor:
    """Duck-typed stand-in for a torch tensor: only ``tolist()``."""

    def __init__(self, values):
        self.values = values

    def tolist(self):
        return self.values


class Recorder:
    """Callable that records the arguments of every call and returns a fixed value."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.fn(*args, **kwargs)


# ---------------------------------------------------------------------------------------------------
# The calling forms


def test_var_args_form_gets_one_list_per_agent():
    seen = []

    def reward(*completions):
        seen.append(completions)
        return [sum(len(c[0]) for c in completions)]

    assert call_reward_function(reward, COMPLETIONS) == [5.0, 3.0, 5.0]
    assert seen[0] == (["a"], ["xxxx"])


def test_exactly_a_positional_parameters():
    def reward(c1, c2):
        return [len(c1[0]) * 10 + len(c2[0])]

    assert call_reward_function(reward, COMPLETIONS) == [14.0, 21.0, 32.0]


def test_a_plus_one_positional_gets_agent_zero_prompt_first():
    seen = []

    def reward(prompts, c1, c2):
        seen.append(prompts)
        return [len(prompts[0]) + len(c1[0]) + len(c2[0])]

    assert call_reward_function(reward, COMPLETIONS, prompts=PROMPTS) == [7.0, 6.0, 9.0]
    assert seen == [["p0"], ["p01"], ["p012"]]  # P = [prompt of agent 0]


def test_a_plus_one_positional_without_prompts_is_a_clear_error():
    def reward(prompts, c1, c2):
        return [0.0]

    with pytest.raises(ValueError, match="takes the prompts as its first parameter"):
        call_reward_function(reward, COMPLETIONS)


def test_single_list_parameter_with_several_agents():
    seen = []

    def reward(completions):
        seen.append(completions)
        return [len(completions[0][0]) - len(completions[1][0])]

    assert call_reward_function(reward, COMPLETIONS) == [-3.0, 1.0, 1.0]
    assert seen[0] == [["a"], ["xxxx"]]


def test_single_parameter_with_one_agent_is_the_plain_form():
    def reward(completions):
        return [float(len(completions[0]))]

    assert call_reward_function(reward, [["ab", "abc"]]) == [2.0, 3.0]


def test_keyword_only_batch_items_and_prompts():
    calls = []

    def reward(c1, c2, *, batch_items, prompts):
        calls.append((batch_items, prompts))
        return [batch_items[0]["w"] + len(prompts[0])]

    assert call_reward_function(reward, COMPLETIONS, prompts=PROMPTS, batch_items=ITEMS) == [12.0, 23.0, 34.0]
    assert calls[1] == ([{"w": 20}], ["p01"])


def test_defaulted_keywords_are_not_counted_as_completion_slots():
    def reward(c1, c2, batch_items=None, prompts=None):
        return [(batch_items[0]["w"] if batch_items else -1) + (len(prompts[0]) if prompts else 0)]

    assert call_reward_function(reward, COMPLETIONS, batch_items=ITEMS) == [10.0, 20.0, 30.0]
    assert call_reward_function(reward, COMPLETIONS, prompts=PROMPTS) == [1.0, 2.0, 3.0]
    assert call_reward_function(reward, COMPLETIONS) == [-1.0, -1.0, -1.0]


def test_var_kwargs_receive_batch_items_and_prompts():
    seen = []

    def reward(c1, c2, **kwargs):
        seen.append(kwargs)
        return 1.0

    call_reward_function(reward, COMPLETIONS, prompts=PROMPTS, batch_items=ITEMS)
    assert seen[0] == {"prompts": ["p0"], "batch_items": [{"w": 10}]}
    seen.clear()
    call_reward_function(reward, COMPLETIONS)
    assert seen[0] == {}


def test_prompts_keyword_is_not_passed_when_prompts_are_positional():
    seen = []

    def reward(prompts, c1, c2, **kwargs):
        seen.append(kwargs)
        return [0.0]

    call_reward_function(reward, COMPLETIONS, prompts=PROMPTS, batch_items=ITEMS)
    assert seen[0] == {"batch_items": [{"w": 10}]}


def test_return_values_tensor_list_tuple_scalar_element_zero_is_the_reward():
    values = iter([FakeTensor([0.5, 9.0]), (2, 9), [3.25], 4, True, FakeTensor(6.0), FakeTensor([[7.0]])])

    def reward(c1, c2):
        return next(values)

    completions = [["a"] * 7, ["b"] * 7]
    assert call_reward_function(reward, completions) == [0.5, 2.0, 3.25, 4.0, 1.0, 6.0, 7.0]


def test_nan_rewards_are_kept():
    def reward(c1, c2):
        return [math.nan if c1[0] == "bb" else 1.0]

    out = call_reward_function(reward, COMPLETIONS)
    assert out[0] == 1.0 and math.isnan(out[1]) and out[2] == 1.0


@pytest.mark.parametrize("batched", [False, True])
def test_an_infinite_reward_is_refused_naming_the_item(batched):
    def reward(c1, c2):
        return [-math.inf if c1[0] == "bb" else 1.0]

    def reward_all(c1, c2):
        return [math.inf if c == "bb" else 1.0 for c in c1]

    func = batched_reward(reward_all) if batched else reward
    items = [{"prompt": "the cat"}, {"prompt": "the dog"}, {"prompt": "the sun"}]
    with pytest.raises(ValueError, match=r"joint response 1, task item 'the dog'\).*inf; a reward must be finite"):
        call_reward_function(func, COMPLETIONS, batch_items=items)
    with pytest.raises(ValueError, match="reward_processor .*joint response 2.*must be finite"):
        apply_reward_processor(lambda r: math.inf if r > 2 else r, [1.0, 2.0, 3.0])


def test_callable_object_partial_and_builtin():
    class Scorer:
        def __call__(self, c1, c2, batch_items=None):
            return [len(c1[0]) + (batch_items[0]["w"] if batch_items else 0)]

    assert call_reward_function(Scorer(), COMPLETIONS, batch_items=ITEMS) == [11.0, 22.0, 33.0]

    def weighted(weight, c1, c2):
        return [weight * len(c2[0])]

    assert call_reward_function(functools.partial(weighted, 2.0), COMPLETIONS) == [8.0, 2.0, 4.0]


def test_uninspectable_builtin_uses_fallback_order():
    # max() has no inspectable signature: the keyword form (no keywords here) is f(C_0, C_1) = max([1], [3]).
    assert call_reward_function(max, [[1, 5], [3, 0]]) == [3.0, 5.0]


def test_bound_method_with_self():
    class Task:
        bonus = 100

        def reward(self, c1, c2):
            return [self.bonus + len(c1[0])]

    assert call_reward_function(Task().reward, COMPLETIONS) == [101.0, 102.0, 103.0]


def test_agent_prompts_extension_only_when_declared():
    seen = []

    def reward(c1, c2, agent_prompts=None, **kwargs):
        seen.append((agent_prompts, kwargs))
        return [0.0]

    call_reward_function(reward, COMPLETIONS, prompts=PROMPTS)
    assert seen[0] == ([["p0"], ["q"]], {"prompts": ["p0"]})


def test_three_agents_and_a_plus_one_form():
    completions = [["a", "b"], ["cc", "d"], ["eee", "f"]]
    prompts = [["P", "PP"], ["x", "x"], ["y", "y"]]

    def reward(p, c1, c2, c3):
        return [len(p[0]) * 100 + len(c1[0]) + len(c2[0]) + len(c3[0])]

    assert call_reward_function(reward, completions, prompts=prompts) == [106.0, 203.0]


def test_empty_batch_returns_empty_list():
    assert call_reward_function(lambda a, b: [1.0], [[], []]) == []


# ---------------------------------------------------------------------------------------------------
# Batched functions


def _per_candidate_reward(c1, c2, batch_items=None, prompts=None):
    return [len(c1[0]) * 2 + len(c2[0]) + batch_items[0]["w"] + len(prompts[0])]


@batched_reward
def _batched_reward(c1, c2, batch_items=None, prompts=None):
    return [len(a) * 2 + len(b) + item["w"] + len(p) for a, b, item, p in zip(c1, c2, batch_items, prompts)]


def test_batched_equals_per_candidate_and_is_called_once():
    recorder = batched_reward(Recorder(_batched_reward))
    per = call_reward_function(_per_candidate_reward, COMPLETIONS, prompts=PROMPTS, batch_items=ITEMS)
    batched = call_reward_function(recorder, COMPLETIONS, prompts=PROMPTS, batch_items=ITEMS)
    assert per == batched == [18.0, 28.0, 42.0]
    assert len(recorder.calls) == 1


def test_batched_call_receives_whole_lists():
    seen = {}

    @batched_reward
    def reward(*completions, prompts=None, batch_items=None, agent_prompts=None):
        seen.update(completions=completions, prompts=prompts, items=batch_items, agent_prompts=agent_prompts)
        return FakeTensor([1.0, 2.0, 3.0])

    assert call_reward_function(reward, COMPLETIONS, prompts=PROMPTS, batch_items=ITEMS) == [1.0, 2.0, 3.0]
    assert seen["completions"] == (COMPLETIONS[0], COMPLETIONS[1])
    assert seen["prompts"] == PROMPTS[0]  # CoMLRL's P, aligned with the completions
    assert seen["agent_prompts"] == PROMPTS
    assert seen["items"] == ITEMS


def test_batched_wrong_length_is_a_clear_error():
    @batched_reward
    def reward(c1, c2):
        return [1.0, 2.0]

    with pytest.raises(ValueError, match=r"supports_batch.*3 joint responses.*returned 2 values"):
        call_reward_function(reward, COMPLETIONS)


def test_batched_scalar_is_accepted_only_for_one_response():
    @batched_reward
    def reward(c1, c2):
        return 0.25

    assert call_reward_function(reward, [["a"], ["b"]]) == [0.25]
    with pytest.raises(ValueError, match="one joint reward per joint response"):
        call_reward_function(reward, COMPLETIONS)


def test_batched_error_names_the_function():
    @batched_reward
    def exploding(c1, c2):
        raise ZeroDivisionError("boom")

    with pytest.raises(RewardFunctionError, match=r"exploding raised ZeroDivisionError in a batched call") as info:
        call_reward_function(exploding, COMPLETIONS)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


# ---------------------------------------------------------------------------------------------------
# Errors


def test_not_callable_uses_comlrl_message():
    with pytest.raises(ValueError, match=r"^reward_func must be a callable\.$"):
        call_reward_function(None, COMPLETIONS)
    with pytest.raises(ValueError, match=r"^reward_func must be a callable\.$"):
        call_reward_function("module:func", COMPLETIONS)


def test_raising_reward_is_wrapped_with_index_and_cause():
    def fragile(c1, c2):
        if c1[0] == "ccc":
            raise KeyError("answer")
        return [1.0]

    with pytest.raises(RewardFunctionError, match=r"fragile raised KeyError at joint response 2") as info:
        call_reward_function(fragile, COMPLETIONS)
    assert isinstance(info.value.__cause__, KeyError)
    assert isinstance(info.value, RuntimeError)


def test_internal_type_error_is_reported_not_retried():
    calls = []

    def buggy(c1, c2, batch_items=None):
        calls.append(1)
        return [len(None)]

    with pytest.raises(RewardFunctionError, match="TypeError at joint response 0") as info:
        call_reward_function(buggy, COMPLETIONS, batch_items=ITEMS)
    assert isinstance(info.value.__cause__, TypeError)
    assert len(calls) == 1


def test_required_keyword_missing_falls_back_then_explains():
    def needs_items(c1, c2, *, batch_items):
        return [0.0]

    with pytest.raises(TypeError, match=r"cannot be called with 2 agents' completions"):
        call_reward_function(needs_items, COMPLETIONS)


def test_incompatible_signature_is_a_clear_type_error():
    def four(a, b, c, d):
        return [0.0]

    with pytest.raises(TypeError, match=r"four\(a, b, c, d\) cannot be called with 2 agents"):
        call_reward_function(four, COMPLETIONS, prompts=PROMPTS)


@pytest.mark.parametrize("value", [[], None, "0.5", {"r": 1}])
def test_bad_return_values(value):
    with pytest.raises(ValueError, match=r"reward_func .* \(joint response 0\) returned"):
        call_reward_function(lambda a, b: value, COMPLETIONS)


def test_input_shapes_are_checked():
    reward = lambda a, b: [0.0]  # noqa: E731
    with pytest.raises(ValueError, match="same number of completions"):
        call_reward_function(reward, [["a", "b"], ["c"]])
    with pytest.raises(ValueError, match="one list of texts per agent"):
        call_reward_function(reward, [])
    with pytest.raises(ValueError, match=r"completions\[0\] must be a list"):
        call_reward_function(reward, ["ab", "cd"])
    with pytest.raises(ValueError, match="batch_items has 1 entries; expected 3"):
        call_reward_function(reward, COMPLETIONS, batch_items=[{}])
    with pytest.raises(ValueError, match=r"prompts\[1\] must be a list of 3 prompts"):
        call_reward_function(reward, COMPLETIONS, prompts=[["a", "b", "c"], ["a"]])


def test_signature_inspection_is_cached(monkeypatch):
    def reward(c1, c2, batch_items=None):
        return [1.0]

    call_reward_function(reward, COMPLETIONS, batch_items=ITEMS)
    calls = []
    original = rewards_module.inspect.signature
    monkeypatch.setattr(rewards_module.inspect, "signature", lambda fn: calls.append(fn) or original(fn))
    call_reward_function(reward, COMPLETIONS, batch_items=ITEMS)
    call_reward_function(reward, COMPLETIONS)  # a new keyword combination reuses the cached signature
    assert calls == []


# ---------------------------------------------------------------------------------------------------
# reward_processor and helpers


def test_apply_reward_processor():
    assert apply_reward_processor(None, [1, 2.5]) == [1.0, 2.5]
    assert apply_reward_processor(RewardProcessors.scale(2), [1.0, -0.5]) == [2.0, -1.0]
    assert apply_reward_processor(RewardProcessors.shift(-1), [1.0, 3.0]) == [0.0, 2.0]
    out = apply_reward_processor(RewardProcessors.scale(3), [math.nan])
    assert math.isnan(out[0])


def test_processors_are_picklable_and_compare_by_value():
    scale = RewardProcessors.scale(0.5)
    assert pickle.loads(pickle.dumps(scale)) == scale
    assert scale(4.0) == 2.0
    assert RewardProcessors.shift(1)(1.0) == 2.0


def test_apply_reward_processor_errors():
    with pytest.raises(ValueError, match=r"^reward_processor must be a callable\.$"):
        apply_reward_processor(3, [1.0])

    def raise_on_two(r):
        if r == 2.0:
            raise ValueError("bad")
        return r

    with pytest.raises(
        RewardFunctionError, match=r"raise_on_two raised ValueError on raw reward 2.0 \(joint response 1\)"
    ):
        apply_reward_processor(raise_on_two, [1.0, 2.0])


def test_set_reward_range_and_batched_reward_attributes():
    def reward(a, b):
        return [0.0]

    assert set_reward_range(reward, 0, 1) is reward and reward.reward_range == (0.0, 1.0)
    assert batched_reward(reward) is reward and reward.supports_batch is True
    with pytest.raises(ValueError, match="min < max"):
        set_reward_range(reward, 1, 1)


def test_keyword_names_in_positional_places_are_passed_by_keyword():
    def required_items(c1, c2, batch_items):
        return [batch_items[0]["w"]]

    def prompts_last(c1, c2, prompts):
        return [len(prompts[0])]

    def single_list_with_items(completions, batch_items):
        return [len(completions) + batch_items[0]["w"]]

    assert call_reward_function(required_items, COMPLETIONS, batch_items=ITEMS) == [10.0, 20.0, 30.0]
    assert call_reward_function(prompts_last, COMPLETIONS, prompts=PROMPTS) == [2.0, 3.0, 4.0]
    assert call_reward_function(single_list_with_items, COMPLETIONS, batch_items=ITEMS) == [12.0, 22.0, 32.0]
    with pytest.raises(TypeError, match="cannot be called with 2 agents"):
        call_reward_function(prompts_last, COMPLETIONS)
