"""Chat templates: a task prompt sent as one user message through the tokenizer's template, and the end of a turn.

An instruction-tuned model expects its prompts wrapped in its chat format (``use_chat_template``: ``auto`` when
the tokenizer has a template, ``true``, ``false``). ``chat_formatters`` wraps each agent's formatter so that the
prompt text it returns is the rendered conversation (``apply_chat_template(add_generation_prompt=True)``): that
rendered text is what is sampled from, scored, stored in pairs and exported. ``stop_at_end_of_turn`` adds the
token that closes an assistant turn to the model's EOS ids, so a response ends where the model ends its turn.
``chat_form`` says how the template wraps a prompt (the text around the user message and the system prompt it
writes by itself), so an export can give the stored prompts back as messages. This module does not sample or train.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from comlrl_lab.data.chat_form import ChatForm

_PROBE = "\u2063comlrl-lab-end-of-turn-probe\u2063"
_USER_PROBE = "\u2063comlrl-lab-user-probe\u2063"
_SYSTEM_PROBE = "\u2063comlrl-lab-system-probe\u2063"


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def uses_chat_template(tokenizer: Any, setting: str, *, source: Any = None) -> bool:
    """Whether prompts for this tokenizer go through its chat template under ``use_chat_template=setting``."""
    if setting == "false":
        return False
    if has_chat_template(tokenizer):
        return True
    if setting == "true":
        name = source if isinstance(source, str) else getattr(tokenizer, "name_or_path", "") or "the agent"
        raise ValueError(
            f"use_chat_template='true', but the tokenizer of {name!r} has no chat template; use 'auto' (a template "
            "when there is one) or 'false'."
        )
    return False


def _adds_bos(tokenizer: Any) -> bool:
    bos = tokenizer.bos_token_id
    ids = tokenizer("a")["input_ids"]
    return bos is not None and bool(ids) and ids[0] == bos


def render_prompt(tokenizer: Any, text: str) -> str:
    """``text`` as a one-message conversation, ready for the assistant's answer.

    The text is tokenised later with the tokenizer's default special tokens, as every prompt is; when those
    include a BOS that the template also writes, the template's copy is dropped so the ids are the template's.
    """
    return _render(tokenizer, [{"role": "user", "content": text}])


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    bos = tokenizer.bos_token
    if bos and rendered.startswith(bos) and _adds_bos(tokenizer):
        rendered = rendered[len(bos) :]
    return rendered


def chat_form(tokenizer: Any) -> ChatForm:
    """How ``render_prompt`` wraps a user message for this tokenizer: the text before and after it, and the system
    prompt the template writes when the conversation has none (SmolLM2's "You are a helpful AI assistant ...").

    Found by rendering marker messages, so it works for any template that writes the user message once as it is;
    ``ValueError`` for one that does not (a template that rewrites the message cannot be read back).
    """
    plain = render_prompt(tokenizer, _USER_PROBE)
    if plain.count(_USER_PROBE) != 1:
        raise ValueError(
            "the chat template does not write the user message once as it is; its prompts cannot be read back"
        )
    prefix, suffix = plain.split(_USER_PROBE)
    return ChatForm(prefix=prefix, suffix=suffix, system=_default_system(tokenizer, prefix, plain))


def _default_system(tokenizer: Any, prefix: str, plain: str) -> str | None:
    """The system prompt in ``prefix``: rendered with a marker system message, the template writes ``before`` marker
    ``between`` user message, so a prefix of ``before + S + between`` holds S, kept when [system S, user] renders
    exactly as the user message alone does. None when the template writes no system prompt (or refuses the role)."""
    from jinja2 import TemplateError  # what apply_chat_template renders with (torch and transformers bring it)

    try:
        given = _render(
            tokenizer, [{"role": "system", "content": _SYSTEM_PROBE}, {"role": "user", "content": _USER_PROBE}]
        )
    except TemplateError:  # a template without a system role raises from its own raise_exception
        return None
    if given.count(_SYSTEM_PROBE) != 1 or given.count(_USER_PROBE) != 1:
        return None
    before, after = given.split(_SYSTEM_PROBE)
    between = after.split(_USER_PROBE)[0]
    if len(prefix) <= len(before) + len(between) or not prefix.startswith(before) or not prefix.endswith(between):
        return None
    system = prefix[len(before) : len(prefix) - len(between)]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": _USER_PROBE}]
    return system if _render(tokenizer, messages) == plain else None


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The special token the template writes right after an assistant message ([] when it writes none).

    Found by rendering a conversation with a marker as the answer, so it works for any template (``<|im_end|>``,
    ``<|eot_id|>``, ``<end_of_turn>``, a plain EOS, ...).
    """
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _PROBE}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    after = rendered.split(_PROBE, 1)[1] if _PROBE in rendered else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    special = set(tokenizer.all_special_ids) | {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})}
    return [int(ids[0])] if ids and int(ids[0]) in special else []


def stop_at_end_of_turn(model: Any, tokenizer: Any) -> None:
    """Add the end-of-turn token to ``model.generation_config.eos_token_id`` (kept first: the model's own EOS)."""
    config = model.generation_config
    current = config.eos_token_id
    ids = [] if current is None else list(current) if isinstance(current, (list, tuple)) else [current]
    if tokenizer.eos_token_id is not None and not ids:
        ids = [int(tokenizer.eos_token_id)]
    for token in end_of_turn_ids(tokenizer):
        if token not in ids:
            ids.append(token)
    if ids:
        config.eos_token_id = ids[0] if len(ids) == 1 else ids


class ChatFormatter:
    """A formatter whose prompt is rendered through ``tokenizer``'s chat template as one user message."""

    def __init__(self, formatter: Callable[[dict], str], tokenizer: Any):
        self.formatter = formatter
        self.tokenizer = tokenizer

    def __call__(self, item: dict) -> str:
        return render_prompt(self.tokenizer, self.formatter(item))


def raw_formatter(formatter: Callable[[dict], str]) -> Callable[[dict], str]:
    """The formatter under a ``ChatFormatter`` (the task's own text, before the template); others unchanged."""
    return formatter.formatter if isinstance(formatter, ChatFormatter) else formatter


def chat_formatters(
    formatters: Sequence[Callable[[dict], str]],
    models: Sequence[Any],
    tokenizers: Sequence[Any],
    setting: str,
    sources: Sequence[Any] = (),
) -> list[Callable[[dict], str]]:
    """One formatter per agent: ``ChatFormatter`` where the chat template applies (and that agent's model then stops
    at the end of a turn), the formatter itself elsewhere."""
    out = []
    for i, (formatter, model, tokenizer) in enumerate(zip(formatters, models, tokenizers)):
        if uses_chat_template(tokenizer, setting, source=sources[i] if i < len(sources) else None):
            stop_at_end_of_turn(model, tokenizer)
            out.append(ChatFormatter(formatter, tokenizer))
        else:
            out.append(formatter)
    return out


def agent_chat_forms(
    sources: Sequence[str], setting: str, model_config: Mapping[str, Any] | None = None
) -> list[ChatForm | None]:
    """Per agent, the ``ChatForm`` of its template where ``chat_formatters`` renders its prompts through it under
    ``use_chat_template=setting``, None where it does not: decided as the trainer decides, from each source's
    tokenizer alone (no weights are loaded; "false" loads nothing)."""
    if setting == "false":
        return [None] * len(sources)
    from transformers import AutoTokenizer

    from comlrl_lab.models.loading import hub_options, load_pretrained

    kwargs = hub_options((model_config or {}).get("model_kwargs"))
    forms: dict[str, ChatForm | None] = {}
    for source in dict.fromkeys(sources):
        tokenizer = load_pretrained(AutoTokenizer.from_pretrained, source, "tokenizer", **kwargs)
        forms[source] = chat_form(tokenizer) if uses_chat_template(tokenizer, setting, source=source) else None
    return [forms[source] for source in sources]
