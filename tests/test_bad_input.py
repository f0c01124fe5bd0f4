"""Bad input meets a clear error before any work (issue 47): one line naming the file, row, field, model or endpoint
and what was wrong; nothing written, nothing committed lost.

``CASES`` is the table, in the style of ``test_hostile.py``: one row per finding, numbered by the issue's item, with
the ``case_...`` function that sets the trap and checks the outcome. A case takes the pytest fixtures it names. Cases
that run a process of their own and send it signals have test functions of their own at the end (``SEPARATE``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from tokenizers import processors
from trainer_fixtures import ITEMS
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_lab.models.generation import SamplingSettings, sample_candidates

# -- 2. CoMLRL's contract: errors of the constructor ----------------------------------------------------------------


class EmptyPromptAdapter:
    """A centralized adapter whose joint prompt is empty for the items whose topic is ``green``."""

    def build_prompt(self, batch_item, agent_prompts):
        return "" if batch_item.get("topic") == "green" else "\n\n".join(agent_prompts)

    def parse_completion(self, completion, batch_item, num_agents):
        return [completion] * num_agents


def case_centralized_actor_count_before_reward_func(make_trainer, tmp_path, model_dir):
    """No reward_func and two actors in a centralized run: CoMLRL's first complaint, the actor count."""
    with pytest.raises(ValueError, match=r"^Centralized collaboration requires exactly one actor model\.$"):
        make_trainer(
            "MADPO",
            tmp_path,
            collaboration_mode="centralized",
            agent_model=None,
            agents=[model_dir, model_dir],
            reward_func=None,
        )


def case_empty_joint_prompt_is_refused_before_loading(make_trainer, tmp_path):
    """An empty joint prompt (centralized) is refused in one line naming the item, before any model is loaded (the
    model path does not exist: loading it would fail differently)."""
    with pytest.raises(ValueError) as caught:
        make_trainer(
            "MADPO",
            tmp_path,
            collaboration_mode="centralized",
            centralized_comparator_adapter=EmptyPromptAdapter(),
            agent_model=str(tmp_path / "no-such-model"),
        )
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("collaboration_mode='centralized': the joint prompt of train item 2 ")
    assert "'topic': 'green'" in message and "is ''" in message and "build_prompt" in message


def case_a_prompt_with_no_tokens_is_refused_by_the_sampler(model_dir):
    """A prompt the tokenizer turns into no tokens (no BOS of its own) is refused naming the prompt, not with torch's
    "cannot reshape tensor of 0 elements"."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A", special_tokens=[])
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    settings = SamplingSettings(max_new_tokens=2)
    for row_seeds, generator in (([1, 2], None), (None, torch.Generator().manual_seed(0))):
        with pytest.raises(ValueError, match=r"^prompt 1 of 2 \(''\) has no tokens"):
            sample_candidates(model, tokenizer, ["the cat", ""], 2, settings, generator, row_seeds=row_seeds)


# -- the table ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One finding: the issue's item and a few words, and the function that checks it."""

    issue: str
    check: Callable[..., None]
    marks: tuple = ()

    @property
    def name(self) -> str:
        return self.check.__name__.removeprefix("case_")


CASES = [
    Case("2 centralized: actor count before reward_func", case_centralized_actor_count_before_reward_func),
    Case("2 centralized: empty joint prompt", case_empty_joint_prompt_is_refused_before_loading),
    Case("2 a prompt with no tokens", case_a_prompt_with_no_tokens_is_refused_by_the_sampler),
]

#: Cases with a test function of their own below.
SEPARATE: dict[str, str] = {}


@pytest.mark.parametrize("case", [pytest.param(c, marks=c.marks, id=c.name) for c in CASES])
def test_bad_input(case: Case, request):
    fixtures = {name: request.getfixturevalue(name) for name in inspect.signature(case.check).parameters}
    case.check(**fixtures)


def test_the_table_lists_every_case_once():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    defined = {name for name in globals() if name.startswith("case_")}
    assert defined == {c.check.__name__ for c in CASES}
    assert all(name in globals() for name in SEPARATE.values())


def test_items_are_the_fixtures():  # the empty-prompt case relies on item 2's topic
    assert ITEMS[2]["topic"] == "green"
