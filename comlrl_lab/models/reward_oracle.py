"""An LLM oracle: a Hugging Face sequence-classification reward model turned into a joint reward function.

``hf_reward_model_oracle(source)`` loads ``AutoModelForSequenceClassification`` and its tokenizer (a local
directory, or a hub id looked up in the local cache first), puts the model on its own device in eval mode,
and returns a callable with CoMLRL's reward calling convention that is marked ``supports_batch``: one call
scores all joint responses, in padded batches sorted by length, under ``torch.inference_mode``.

Each joint response is read as one text, by default the same text CoMLRL's ``JointRewardModel`` reads
(1-based agent numbers): "Joint multi-agent response", then "Agent k prompt:\\n{prompt}" and
"Agent k response:\\n{completion}" for each agent, joined by blank lines. The score is
``logits[:, score_index]``, optionally squashed into [0, 1] by a sigmoid.

It does not train the reward model (that is ``JointRewardModel``) and applies no ``reward_processor``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from comlrl_lab.models.devices import resolve_devices, resolve_dtype
from comlrl_lab.models.loading import dtype_keyword as _dtype_keyword
from comlrl_lab.models.loading import ensure_pad_token
from comlrl_lab.models.loading import load_pretrained as _from_pretrained

__all__ = ["HFRewardModelOracle", "hf_reward_model_oracle", "joint_reward_text"]

JOINT_TEXT_HEADER = "Joint multi-agent response"


def joint_reward_text(prompts: Sequence[str], completions: Sequence[str]) -> str:
    """CoMLRL's reward-model text for one joint response (agent numbers are 1-based)."""
    parts = [JOINT_TEXT_HEADER]
    for k, (prompt, completion) in enumerate(zip(prompts, completions), start=1):
        parts.append(f"Agent {k} prompt:\n{prompt}")
        parts.append(f"Agent {k} response:\n{completion}")
    return "\n\n".join(parts)


class HFRewardModelOracle:
    """A joint reward function backed by a sequence-classification model (see the module docstring).

    Call it like any batched reward: ``oracle(completions_agent1, ..., agent_prompts=[[...], ...])`` with
    one list per agent, or through ``call_reward_function(oracle, completions, prompts=...)``, which passes
    every agent's prompts as ``agent_prompts``. Returns one float per joint response.
    """

    supports_batch = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: torch.device,
        batch_size: int = 16,
        max_length: int = 512,
        joint_text_fn: Callable[[Sequence[str], Sequence[str]], str] | None = None,
        score_index: int = 0,
        squash: bool = False,
        padding_side: str = "right",
        name: str = "hf_reward_model_oracle",
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be a positive integer, got {max_length!r}.")
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
        num_labels = int(getattr(model.config, "num_labels", 1))
        if isinstance(score_index, bool) or not isinstance(score_index, int) or not 0 <= score_index < num_labels:
            raise ValueError(
                f"score_index must be in [0, {num_labels}) for a model with {num_labels} labels, got {score_index!r}."
            )
        ensure_pad_token(tokenizer)
        if getattr(model.config, "pad_token_id", None) is None:
            # Sequence classifiers pool at the last non-padding token, found through config.pad_token_id.
            model.config.pad_token_id = tokenizer.pad_token_id
        self.model = model.to(device).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self.joint_text_fn = joint_text_fn or joint_reward_text
        self.score_index = score_index
        self.squash = bool(squash)
        self.padding_side = padding_side
        self.__name__ = name
        if self.squash:
            self.reward_range = (0.0, 1.0)
        forward_params = inspect.signature(model.forward).parameters
        # Absolute-position models would see left padding as a shift; explicit position ids undo it.
        self._pass_position_ids = "position_ids" in forward_params
        self._pass_token_type_ids = "token_type_ids" in forward_params

    def __repr__(self) -> str:
        return f"<{self.__name__} on {self.device}>"

    def __call__(
        self,
        *completions: Sequence[str],
        agent_prompts: Sequence[Sequence[str]] | None = None,
        prompts: Sequence[str] | None = None,
        batch_items: Sequence[Any] | None = None,
    ) -> list[float]:
        if not completions:
            raise ValueError("The reward model oracle needs one completion list per agent.")
        num_agents, k = len(completions), len(completions[0])
        if any(len(column) != k for column in completions):
            raise ValueError("Every agent needs the same number of completions.")
        if agent_prompts is None:
            if prompts is not None and num_agents == 1:
                agent_prompts = [prompts]
            else:
                raise ValueError(
                    "The reward model oracle reads every agent's prompt: pass agent_prompts=[[...] per agent] or "
                    "call it through call_reward_function(oracle, completions, prompts=...)."
                )
        if len(agent_prompts) != num_agents or any(len(column) != k for column in agent_prompts):
            raise ValueError(
                f"agent_prompts must hold {num_agents} lists of {k} prompts, aligned with the completions."
            )
        texts = [
            self.joint_text_fn([column[j] for column in agent_prompts], [column[j] for column in completions])
            for j in range(k)
        ]
        return self.score_texts(texts)

    def score_texts(self, texts: Sequence[str]) -> list[float]:
        """One score per text, in the order given."""
        if not texts:
            return []
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=False)
        input_ids: list[list[int]] = encoded["input_ids"]
        token_type_ids: list[list[int]] | None = encoded.get("token_type_ids") if self._pass_token_type_ids else None
        # Longest first, so each batch pads little; scores go back to the caller's order.
        order = sorted(range(len(texts)), key=lambda n: len(input_ids[n]), reverse=True)
        scores = [0.0] * len(texts)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                batch = self._pad(
                    [input_ids[n] for n in chunk], [token_type_ids[n] for n in chunk] if token_type_ids else None
                )
                logits = self.model(**batch).logits  # (B, num_labels)
                values = logits[:, self.score_index].float()
                if self.squash:
                    values = torch.sigmoid(values)
                for n, value in zip(chunk, values.tolist()):
                    scores[n] = float(value)
        return scores

    def _pad(self, rows: list[list[int]], type_rows: list[list[int]] | None) -> dict[str, torch.Tensor]:
        width = max(len(row) for row in rows)
        pad_id = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
        types = torch.zeros((len(rows), width), dtype=torch.long) if type_rows is not None else None
        for b, row in enumerate(rows):
            span = slice(width - len(row), width) if self.padding_side == "left" else slice(0, len(row))
            ids[b, span] = torch.tensor(row, dtype=torch.long)
            mask[b, span] = 1
            if types is not None:
                types[b, span] = torch.tensor(type_rows[b], dtype=torch.long)
        batch = {"input_ids": ids, "attention_mask": mask}
        if types is not None:
            batch["token_type_ids"] = types
        if self._pass_position_ids:
            batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T), 0 at each text's first token
        return {key: value.to(self.device) for key, value in batch.items()}


def hf_reward_model_oracle(
    source: str | os.PathLike[str] | Any,
    *,
    tokenizer: Any = None,
    device: Any = None,
    batch_size: int = 16,
    max_length: int = 512,
    dtype: Any = None,
    joint_text_fn: Callable[[Sequence[str], Sequence[str]], str] | None = None,
    score_index: int = 0,
    squash: bool = False,
    padding_side: str = "right",
) -> HFRewardModelOracle:
    """A batched joint reward function from a Hugging Face reward model (sequence classification).

    ``source`` is a hub id or a local directory (the local cache is tried first, so a downloaded model
    loads offline), or an already loaded model, in which case ``tokenizer`` is required. ``tokenizer`` may
    also name a different tokenizer source. ``device`` follows ``resolve_devices`` (None: the first GPU,
    else the CPU); ``dtype`` follows ``resolve_dtype`` (None: bf16 on a capable GPU, fp32 otherwise).
    ``joint_text_fn(prompts, completions) -> str`` replaces CoMLRL's joint text; ``score_index`` picks
    the logit; ``squash=True`` maps scores into [0, 1] with a sigmoid and sets ``reward_range``.
    """
    target = resolve_devices(device, 1, field_name="reward_model_device")[0]
    if isinstance(source, (str, os.PathLike)):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        source = os.fspath(source)
        torch_dtype = resolve_dtype(dtype, target)
        model = _from_pretrained(
            AutoModelForSequenceClassification.from_pretrained,
            source,
            "reward model",
            **{_dtype_keyword(): torch_dtype},
        )
        tokenizer_source = tokenizer if tokenizer is not None else source
        if isinstance(tokenizer_source, (str, os.PathLike)):
            tokenizer = _from_pretrained(
                AutoTokenizer.from_pretrained, os.fspath(tokenizer_source), "reward model tokenizer"
            )
        else:
            tokenizer = tokenizer_source
        name = f"hf_reward_model_oracle({source!r})"
    else:
        if tokenizer is None:
            raise ValueError("A tokenizer must be provided when the reward model is a model object.")
        model = source
        if isinstance(tokenizer, (str, os.PathLike)):
            from transformers import AutoTokenizer

            tokenizer = _from_pretrained(AutoTokenizer.from_pretrained, os.fspath(tokenizer), "reward model tokenizer")
        if dtype is not None:
            model = model.to(resolve_dtype(dtype, target))
        name = f"hf_reward_model_oracle({getattr(model.config, '_name_or_path', '') or type(model).__name__!r})"
    return HFRewardModelOracle(
        model,
        tokenizer,
        device=target,
        batch_size=batch_size,
        max_length=max_length,
        joint_text_fn=joint_text_fn,
        score_index=score_index,
        squash=squash,
        padding_side=padding_side,
        name=name,
    )
