"""Calling task reward functions with CoMLRL's convention, in batches where the function allows.

A joint reward function scores joint responses: ``completions[i][j]`` is agent i's text in joint response j.
Functions written for CoMLRL are called once per joint response, exactly as CoMLRL calls them
(reference section 2.5); functions marked with :func:`batched_reward` are called once for the whole batch.
This module also applies ``reward_processor`` and holds CoMLRL's small helpers (``set_reward_range``,
``RewardProcessors``) and ours (``set_reward_details``, ``set_sandbox_limits``).

It does not pair, sort or drop anything: NaN rewards are returned as NaN, and the pairing skips them.
It does not import torch; tensor return values are read through their ``tolist()`` method.

Calling forms for one joint response j (A agents, ``C_i = [completions[i][j]]``, ``P = [prompts[0][j]]``):

- ``f(*args)`` or exactly A positional parameters: ``f(C_0, ..., C_{A-1})``;
- A + 1 positional parameters: ``f(P, C_0, ..., C_{A-1})``;
- one positional parameter and A > 1: ``f([C_0, ..., C_{A-1}])``.

``batch_items=[item]`` and ``prompts=P`` are added as keywords when the function declares them or takes
``**kwargs`` (``prompts`` only when P was not passed positionally). Element 0 of the returned value
(tensor, list, tuple or scalar) is the joint reward.

A batched call (``supports_batch = True``) uses the same forms with whole lists: ``C_i = completions[i]``,
``P = prompts[0]`` and ``batch_items=batch_items``, and must return one value per joint response.
comlrl-lab extension: a function that declares an ``agent_prompts`` parameter also receives every agent's
prompts, ``agent_prompts[i]`` aligned with ``C_i`` (CoMLRL's ``P`` holds agent 0's prompt only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RewardFunctionError",
    "RewardProcessors",
    "apply_reward_processor",
    "batched_reward",
    "breakdown_dict",
    "call_reward_function",
    "call_reward_with_details",
    "reward_function_name",
    "set_reward_details",
    "set_reward_range",
    "set_sandbox_limits",
]


def batched_reward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a reward function as batch-capable: given k completions per agent it returns k joint rewards."""
    fn.supports_batch = True  # type: ignore[attr-defined]
    return fn


def set_reward_range(fn: Callable[..., Any], low: float, high: float) -> Callable[..., Any]:
    """Attach ``reward_range = (low, high)`` (CoMLRL's helper of the same name)."""
    low, high = float(low), float(high)
    if not (low < high):
        raise ValueError("reward_range must be a finite (min, max) pair with min < max.")
    fn.reward_range = (low, high)  # type: ignore[attr-defined]
    return fn


def set_reward_details(fn: Callable[..., Any], details: Callable[..., list[Any]]) -> Callable[..., Any]:
    """Attach ``reward_details``: called like ``fn``, it returns one breakdown per joint response (why it scored so).

    comlrl-lab extension; ``Task.reward_details`` calls it, and the trainers (``call_reward_with_details``) store
    each candidate's breakdown beside its reward. The breakdowns are dataclasses that ``dataclasses.asdict`` turns
    into JSON-ready dicts (or such dicts). A breakdown's ``reward`` field, when it has one, must be the joint reward
    ``fn`` gives: the trainers then take the reward from it and call ``fn`` no more.
    """
    if not callable(details):
        raise ValueError("reward_details must be a callable.")
    fn.reward_details = details  # type: ignore[attr-defined]
    return fn


def set_sandbox_limits(fn: Callable[..., Any], limits: Any) -> Callable[..., Any]:
    """Mark ``fn`` as a reward that runs model-written programs in ``comlrl_lab.sandbox`` under ``limits`` (a
    ``SandboxLimits``), so a run logs once what this host's sandbox enforces and what it cannot (comlrl-lab
    extension; the engine reads ``fn.sandbox_limits``)."""
    fn.sandbox_limits = limits  # type: ignore[attr-defined]
    return fn


class RewardFunctionError(RuntimeError):
    """A reward function (or reward_processor) raised; the original exception is the ``__cause__``."""


def reward_function_name(fn: Any) -> str:
    """A readable name for error messages: qualified name, the wrapped function of a partial, or the type."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name:
        return str(name)
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and inner is not fn:
        return f"partial({reward_function_name(inner)})"
    return type(fn).__name__


# --------------------------------------------------------------------------------------------------
# Signature inspection, cached per function object: the per-candidate loop must stay cheap.

_ARGS = "args"  # f(C_0, ..., C_{A-1})
_PROMPT_FIRST = "prompt_first"  # f(P, C_0, ..., C_{A-1})
_SINGLE_LIST = "single_list"  # f([C_0, ..., C_{A-1}])
_KEYWORD_NAMES = ("batch_items", "agent_prompts")  # never a completion slot; "prompts" only after position 0


@dataclass(frozen=True)
class _SignatureInfo:
    signature: inspect.Signature
    var_positional: bool
    var_keyword: bool
    n_required: int  # completion/prompt slots without a default
    n_max: int  # completion/prompt slots: positional parameters other than the keyword names
    positional_index: dict[str, int]  # name -> index, positional-or-keyword parameters
    keyword_only: frozenset[str]


@dataclass(frozen=True)
class _CallPlan:
    form: str
    pass_prompts: bool
    pass_batch_items: bool
    pass_agent_prompts: bool


_UNINSPECTABLE = object()
_signature_cache: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_plan_cache: weakref.WeakKeyDictionary[Any, dict[tuple[int, bool, bool], _CallPlan]] = weakref.WeakKeyDictionary()


def _cache_get(cache: weakref.WeakKeyDictionary[Any, Any], fn: Any) -> Any:
    try:
        return cache.get(fn)
    except TypeError:  # unhashable or not weak-referenceable: no caching
        return None


def _cache_put(cache: weakref.WeakKeyDictionary[Any, Any], fn: Any, value: Any) -> None:
    with contextlib.suppress(TypeError):  # unhashable or not weak-referenceable: no caching
        cache[fn] = value


def _signature_info(fn: Any) -> _SignatureInfo | None:
    cached = _cache_get(_signature_cache, fn)
    if cached is not None:
        return None if cached is _UNINSPECTABLE else cached
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        _cache_put(_signature_cache, fn, _UNINSPECTABLE)
        return None
    n_required = n_max = 0
    positional_index: dict[str, int] = {}
    keyword_only: set[str] = set()
    var_positional = var_keyword = False
    index = 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if p.kind is p.POSITIONAL_OR_KEYWORD:
                positional_index[p.name] = index
                # `def f(c0, c1, batch_items=None)` has two completion slots, not three; `prompts` is a
                # slot only in first place, as in f(prompts, c0, c1).
                if p.name in _KEYWORD_NAMES or (p.name == "prompts" and index > 0):
                    index += 1
                    continue
            index += 1
            n_required += p.default is p.empty
            n_max += 1
        elif p.kind is p.KEYWORD_ONLY:
            keyword_only.add(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            var_positional = True
        else:
            var_keyword = True
    info = _SignatureInfo(
        signature=sig,
        var_positional=var_positional,
        var_keyword=var_keyword,
        n_required=n_required,
        n_max=n_max,
        positional_index=positional_index,
        keyword_only=frozenset(keyword_only),
    )
    _cache_put(_signature_cache, fn, info)
    return info


def _n_positional_args(form: str, num_agents: int) -> int:
    return {_ARGS: num_agents, _PROMPT_FIRST: num_agents + 1, _SINGLE_LIST: 1}[form]


def _accepts_keyword(info: _SignatureInfo, name: str, n_args: int, *, via_var_keyword: bool = True) -> bool:
    if name in info.keyword_only:
        return True
    if name in info.positional_index:
        return info.positional_index[name] >= n_args  # not already filled positionally
    return via_var_keyword and info.var_keyword


def _plan_binds(info: _SignatureInfo, plan: _CallPlan, num_agents: int) -> bool:
    args = [None] * _n_positional_args(plan.form, num_agents)
    kwargs = {
        name: None
        for name, on in (
            ("prompts", plan.pass_prompts),
            ("batch_items", plan.pass_batch_items),
            ("agent_prompts", plan.pass_agent_prompts),
        )
        if on
    }
    try:
        info.signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def _make_plan(info: _SignatureInfo, form: str, num_agents: int, have_prompts: bool, have_items: bool) -> _CallPlan:
    n_args = _n_positional_args(form, num_agents)
    return _CallPlan(
        form=form,
        pass_prompts=have_prompts and form != _PROMPT_FIRST and _accepts_keyword(info, "prompts", n_args),
        pass_batch_items=have_items and _accepts_keyword(info, "batch_items", n_args),
        pass_agent_prompts=have_prompts and _accepts_keyword(info, "agent_prompts", n_args, via_var_keyword=False),
    )


def _call_plan(fn: Any, num_agents: int, have_prompts: bool, have_items: bool) -> _CallPlan | None:
    """The calling form for ``fn`` with ``num_agents`` agents; None when the signature cannot be inspected."""
    key = (num_agents, have_prompts, have_items)
    per_fn = _cache_get(_plan_cache, fn)
    if per_fn is not None and key in per_fn:
        return per_fn[key]
    info = _signature_info(fn)
    if info is None:
        return None

    def fits(n: int) -> bool:
        return info.n_required <= n <= info.n_max

    if info.var_positional or fits(num_agents):
        form = _ARGS
    elif fits(num_agents + 1):
        form = _PROMPT_FIRST
    elif num_agents > 1 and fits(1):
        form = _SINGLE_LIST
    else:
        form = _ARGS
    if form == _PROMPT_FIRST and not have_prompts:
        raise ValueError(
            f"reward_func {reward_function_name(fn)}{info.signature} takes the prompts as its first parameter "
            f"(A + 1 = {num_agents + 1} positional parameters for {num_agents} agents), but no prompts were given."
        )
    plan = _make_plan(info, form, num_agents, have_prompts, have_items)
    if not _plan_binds(info, plan, num_agents):
        # Differs from CoMLRL: it calls, and retries f(C_0, ..., C_{A-1}) on any TypeError; we check the binding
        # first and call once, so a TypeError raised inside the function body is reported, not retried.
        plan = _CallPlan(_ARGS, False, False, False)
        if not _plan_binds(info, plan, num_agents):
            raise TypeError(
                f"reward_func {reward_function_name(fn)}{info.signature} cannot be called with {num_agents} agents' "
                "completions. Expected f(c_1, ..., c_A) or f(*completions), f(prompts, c_1, ..., c_A), or "
                "f(completions) taking one list when A > 1; optional keywords: prompts, batch_items."
            )
    if per_fn is None:
        per_fn = {}
        _cache_put(_plan_cache, fn, per_fn)
    per_fn[key] = plan
    return plan


def _invoke(
    fn: Any,
    plan: _CallPlan | None,
    columns: list[Any],
    prompt_arg: Any,
    agent_prompts: Any,
    items: Any,
) -> Any:
    """Call ``fn`` once. ``columns[i]`` is agent i's completion list, ``prompt_arg`` is CoMLRL's P."""
    if plan is None:  # no inspectable signature: CoMLRL's order of attempts
        kwargs: dict[str, Any] = {}
        if prompt_arg is not None:
            kwargs["prompts"] = prompt_arg
        if items is not None:
            kwargs["batch_items"] = items
        attempts: list[Callable[[], Any]] = [lambda: fn(*columns, **kwargs), lambda: fn(*columns)]
        if len(columns) > 1:
            attempts.append(lambda: fn(list(columns)))
        first_error: TypeError | None = None
        for attempt in attempts:
            try:
                return attempt()
            except TypeError as exc:
                first_error = first_error or exc
        assert first_error is not None
        raise first_error
    kwargs = {}
    if plan.pass_prompts:
        kwargs["prompts"] = prompt_arg
    if plan.pass_batch_items:
        kwargs["batch_items"] = items
    if plan.pass_agent_prompts:
        kwargs["agent_prompts"] = agent_prompts
    if plan.form == _ARGS:
        return fn(*columns, **kwargs)
    if plan.form == _PROMPT_FIRST:
        return fn(prompt_arg, *columns, **kwargs)
    return fn(list(columns), **kwargs)


# --------------------------------------------------------------------------------------------------
# Return values


def _as_list(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)  # torch / numpy, duck-typed so this module needs neither
    if callable(tolist) and not isinstance(value, (list, tuple, str, bytes)):
        value = tolist()
    return value


def _first_float(value: Any, what: str) -> float:
    value = _as_list(value)
    while isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{what} returned an empty list; element 0 is the joint reward.")
        value = _as_list(value[0])
    if value is None or isinstance(value, (str, bytes)):
        raise ValueError(f"{what} returned {value!r}; expected a number, a list of numbers or a tensor.")
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} returned {value!r}; expected a number, a list of numbers or a tensor.") from exc
    _check_not_infinite(number, what)
    return number


def _check_not_infinite(number: float, what: str) -> None:
    # Differs from CoMLRL: an infinite reward is refused here; there it turned every mean and loss into inf.
    if math.isinf(number):
        raise ValueError(f"{what} returned {number}; a reward must be finite (NaN is skipped, infinity is not).")


def _item_label(batch_items: Sequence[Any] | None, j: int) -> str:
    """``", task item '...'"`` from the item's prompt (or the item), so a bad reward names its item."""
    if batch_items is None:
        return ""
    item = batch_items[j]
    text = item.get("prompt", item) if isinstance(item, dict) else item
    text = " ".join(str(text).split())
    return f", task item {text[:60] + ('...' if len(text) > 60 else '')!r}"


def _batch_floats(value: Any, k: int, name: str, batch_items: Sequence[Any] | None = None) -> list[float]:
    value = _as_list(value)
    if not isinstance(value, (list, tuple)):
        if k == 1:
            return [_first_float(value, f"reward_func {name}{_item_label(batch_items, 0)}")]
        raise ValueError(
            f"reward_func {name} is marked supports_batch and was given {k} joint responses, but returned "
            f"{type(value).__name__}; it must return one joint reward per joint response."
        )
    if len(value) != k:
        raise ValueError(
            f"reward_func {name} is marked supports_batch and was given {k} joint responses, but returned "
            f"{len(value)} values; it must return one joint reward per joint response."
        )
    return [
        _first_float(v, f"reward_func {name} (joint response {j}{_item_label(batch_items, j)})")
        for j, v in enumerate(value)
    ]


# --------------------------------------------------------------------------------------------------
# Public entry points


def _check_inputs(
    completions: Sequence[Sequence[str]],
    prompts: Sequence[Sequence[str]] | None,
    batch_items: Sequence[Any] | None,
) -> int:
    if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence) or not completions:
        raise ValueError("completions must be a non-empty list with one list of texts per agent.")
    k = len(completions[0])
    for i, column in enumerate(completions):
        if isinstance(column, (str, bytes)) or not isinstance(column, Sequence):
            raise ValueError(
                f"completions[{i}] must be a list of texts (one per joint response), got {type(column).__name__}."
            )
        if len(column) != k:
            raise ValueError(
                f"every agent needs the same number of completions: agent 0 has {k}, agent {i} has {len(column)}."
            )
    if prompts is not None:
        if len(prompts) != len(completions):
            raise ValueError(f"prompts has {len(prompts)} agent lists; completions has {len(completions)}.")
        for i, column in enumerate(prompts):
            if isinstance(column, (str, bytes)) or len(column) != k:
                raise ValueError(f"prompts[{i}] must be a list of {k} prompts, one per joint response.")
    if batch_items is not None and len(batch_items) != k:
        raise ValueError(f"batch_items has {len(batch_items)} entries; expected {k}, one per joint response.")
    return k


def _call_each(
    fn: Callable[..., Any],
    completions: Sequence[Sequence[str]],
    prompts: Sequence[Sequence[str]] | None,
    batch_items: Sequence[dict[str, Any]] | None,
    *,
    batched: bool,
    what: str,
) -> list[Any]:
    """``fn``'s return values: one batched call's (a list of one), or one call's per joint response.

    ``what`` names the function in the ``RewardFunctionError`` an exception inside it becomes.
    """
    k = len(completions[0])
    plan = _call_plan(fn, len(completions), prompts is not None, batch_items is not None)
    if batched:
        columns = [list(column) for column in completions]
        agent_prompts = [list(column) for column in prompts] if prompts is not None else None
        try:
            value = _invoke(
                fn,
                plan,
                columns,
                agent_prompts[0] if agent_prompts is not None else None,
                agent_prompts,
                list(batch_items) if batch_items is not None else None,
            )
        except Exception as exc:
            raise RewardFunctionError(
                f"{what} raised {type(exc).__name__} in a batched call over joint responses 0..{k - 1}: {exc}"
            ) from exc
        return [value]
    values: list[Any] = []
    for j in range(k):
        columns = [[column[j]] for column in completions]
        agent_prompts = [[column[j]] for column in prompts] if prompts is not None else None
        try:
            values.append(
                _invoke(
                    fn,
                    plan,
                    columns,
                    agent_prompts[0] if agent_prompts is not None else None,
                    agent_prompts,
                    [batch_items[j]] if batch_items is not None else None,
                )
            )
        except Exception as exc:
            raise RewardFunctionError(f"{what} raised {type(exc).__name__} at joint response {j}: {exc}") from exc
    return values


def call_reward_function(
    reward_func: Callable[..., Any],
    completions: Sequence[Sequence[str]],
    *,
    prompts: Sequence[Sequence[str]] | None = None,
    batch_items: Sequence[dict[str, Any]] | None = None,
) -> list[float]:
    """Score k joint responses; return one joint reward (element 0 of the function's value) per response.

    ``completions[i][j]`` is agent i's text in joint response j, ``prompts[i][j]`` agent i's prompt for it and
    ``batch_items[j]`` its task item. Functions with ``supports_batch`` are called once; others once per
    joint response with CoMLRL's calling forms (module docstring). An exception raised by the function is
    re-raised as :class:`RewardFunctionError` naming the function and the joint response.
    """
    if not callable(reward_func):
        raise ValueError("reward_func must be a callable.")
    k = _check_inputs(completions, prompts, batch_items)
    if k == 0:
        return []
    name = reward_function_name(reward_func)
    batched = bool(getattr(reward_func, "supports_batch", False))
    values = _call_each(reward_func, completions, prompts, batch_items, batched=batched, what=f"reward_func {name}")
    if batched:
        return _batch_floats(values[0], k, name, batch_items)
    return [
        _first_float(value, f"reward_func {name} (joint response {j}{_item_label(batch_items, j)})")
        for j, value in enumerate(values)
    ]


def call_reward_with_details(
    reward_func: Callable[..., Any],
    completions: Sequence[Sequence[str]],
    *,
    prompts: Sequence[Sequence[str]] | None = None,
    batch_items: Sequence[dict[str, Any]] | None = None,
) -> tuple[list[float], list[dict[str, Any]] | None]:
    """``call_reward_function``'s rewards, and each joint response's breakdown as a JSON-ready dict (None when the
    function has no ``reward_details``).

    ``reward_details`` is called as the reward would be (once when the reward is marked ``supports_batch``, else
    once per joint response). When every breakdown holds a number ``reward``, that is the joint reward and the
    reward function itself is not called, so a reward that runs programs runs them once; otherwise the reward
    function is called as well.
    """
    details_fn = getattr(reward_func, "reward_details", None)
    if details_fn is None:
        return call_reward_function(reward_func, completions, prompts=prompts, batch_items=batch_items), None
    k = _check_inputs(completions, prompts, batch_items)
    if k == 0:
        return [], []
    name = reward_function_name(reward_func)
    batched = bool(getattr(reward_func, "supports_batch", False))
    what = f"reward_details of reward_func {name}"
    values = _call_each(details_fn, completions, prompts, batch_items, batched=batched, what=what)
    if batched:
        found = list(_as_list(values[0]))
    else:  # one breakdown per call, alone or as element 0 of a list
        found = [v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v for v in values]
    if len(found) != k:
        raise ValueError(f"{what} returned {len(found)} breakdowns for {k} joint responses; it must return one each.")
    details = [breakdown_dict(d, what) for d in found]
    if all(_is_number(d.get("reward")) for d in details):
        rewards = []
        for j, d in enumerate(details):
            rewards.append(float(d["reward"]))
            _check_not_infinite(rewards[-1], f"{what} (joint response {j}{_item_label(batch_items, j)})")
        return rewards, details
    return call_reward_function(reward_func, completions, prompts=prompts, batch_items=batch_items), details


def breakdown_dict(breakdown: Any, what: str = "reward_details") -> dict[str, Any]:
    """One breakdown as a plain dict: a dataclass through ``dataclasses.asdict``, a mapping as it is."""
    if dataclasses.is_dataclass(breakdown) and not isinstance(breakdown, type):
        return dataclasses.asdict(breakdown)
    if isinstance(breakdown, Mapping):
        return {str(key): value for key, value in breakdown.items()}
    raise ValueError(f"{what} returned a {type(breakdown).__name__}; a breakdown is a dataclass or a mapping.")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def apply_reward_processor(processor: Callable[[float], float] | None, raw: Sequence[float]) -> list[float]:
    """Apply ``reward_processor`` (float -> float) to each raw reward; None is the identity.

    Every value goes through the processor, NaN included, as in CoMLRL; the pairing skips NaN rewards.
    """
    if processor is None:
        return [float(r) for r in raw]
    if not callable(processor):
        raise ValueError("reward_processor must be a callable.")
    processed: list[float] = []
    for j, r in enumerate(raw):
        r = float(r)
        try:
            processed.append(float(processor(r)))
        except Exception as exc:
            raise RewardFunctionError(
                f"reward_processor {reward_function_name(processor)} raised {type(exc).__name__} "
                f"on raw reward {r!r} (joint response {j}): {exc}"
            ) from exc
        _check_not_infinite(processed[-1], f"reward_processor {reward_function_name(processor)} (joint response {j})")
    return processed


@dataclass(frozen=True)
class _Scale:
    factor: float

    def __call__(self, reward: float) -> float:
        return reward * self.factor


@dataclass(frozen=True)
class _Shift:
    value: float

    def __call__(self, reward: float) -> float:
        return reward + self.value


class RewardProcessors:
    """CoMLRL's reward_processor helpers; the results are picklable and compare by value."""

    @staticmethod
    def scale(factor: float) -> Callable[[float], float]:
        """``r -> r * factor``."""
        return _Scale(float(factor))

    @staticmethod
    def shift(value: float) -> Callable[[float], float]:
        """``r -> r + value``."""
        return _Shift(float(value))
