"""How a chat template wrapped an agent's prompts: the text around the user message, and the system prompt in it.

An agent whose prompts went through its tokenizer's chat template (``use_chat_template``) stores each prompt as the
rendered conversation: ``prefix + user message + suffix``, where the prefix holds the template's opening (and the
system prompt the template writes when it is given none) and the suffix closes the user turn and opens the
assistant's. With it an export gives TRL the conversation the text was rendered from, ``[system, user]``, instead of
the rendered text (``store.trl_export``). ``models.chat.chat_form`` finds the form of a tokenizer; this module holds
only strings and does not import a tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatForm:
    """``prefix + user message + suffix`` is one rendered prompt; ``system`` is the system prompt the prefix holds
    (None when the template writes none), given back as the first message. Rendering ``[system, user]`` through
    the template gives the prompt again (``models.chat.chat_form`` checks it)."""

    prefix: str
    suffix: str
    system: str | None = None
