"""A model whose ``generate`` is replaced is sampled through it, as CoMLRL samples every candidate.

Plain models keep our own decode loop (row-seeded) or transformers' ``generate`` (stream); a subclass or an instance
with its own ``generate`` gets CoMLRL's sampling call: one per prompt with ``num_return_sequences`` when row-seeded,
batched from the stream otherwise. Counted on agents, on a ``model`` comparator, and in the run's log.
"""

from __future__ import annotations

import types

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from comlrl_lab.models.generation import SamplingSettings, replaced_generate, sample_candidates, sampling_path


class CountingLlama(LlamaForCausalLM):
    """The fixtures' tiny Llama with a ``generate`` that counts its calls and the rows it returns."""

    calls = 0
    rows = 0
    seen_kwargs: list[dict] = []

    def generate(self, *args, **kwargs):
        type(self).calls += 1
        type(self).seen_kwargs.append(kwargs)
        output = super().generate(*args, **kwargs)
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        type(self).rows += sequences.shape[0]
        return output


@pytest.fixture
def counting(model_dir):
    """``counting()``: a fresh CountingLlama from the tiny model's folder; the counters start at zero."""
    CountingLlama.calls = CountingLlama.rows = 0
    CountingLlama.seen_kwargs = []
    return lambda: CountingLlama.from_pretrained(model_dir)


SETTINGS = SamplingSettings(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None)
PROMPTS = ["the red cat", "a dog sat on the mat"]


def test_replaced_generate_is_found_on_the_class_and_on_the_instance(model_dir, counting):
    plain = LlamaForCausalLM.from_pretrained(model_dir)
    assert replaced_generate(plain) is None
    assert replaced_generate(counting()) == "CountingLlama.generate"

    def own(self, *args, **kwargs):
        return LlamaForCausalLM.generate(self, *args, **kwargs)

    plain.generate = types.MethodType(own, plain)
    assert replaced_generate(plain).endswith("own")
    assert replaced_generate(torch.nn.Linear(2, 2)) is None  # no generate at all: nothing replaced


def test_a_lora_agent_is_judged_by_the_model_it_wraps(model_dir, counting):
    pytest.importorskip("peft")
    from comlrl_lab.models.lora import LoraSettings, apply_lora

    settings = LoraSettings(r=2, target_modules=["q_proj"])
    assert replaced_generate(apply_lora(LlamaForCausalLM.from_pretrained(model_dir), settings, seed=0)) is None
    assert replaced_generate(apply_lora(counting(), settings, seed=0)) == "CountingLlama.generate"


@pytest.mark.parametrize("row_seeded", [True, False])
def test_sampling_goes_through_the_replaced_generate(counting, model_dir, row_seeded):
    model = counting()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    seeds = [11, 12] if row_seeded else None
    generator = None if row_seeded else torch.Generator().manual_seed(0)

    rows = sample_candidates(model, tokenizer, PROMPTS, 3, SETTINGS, generator, row_seeds=seeds)

    # Row-seeded: CoMLRL's call, one per prompt asking for its 3 candidates; stream: one batch of all 6 rows.
    assert CountingLlama.calls == (2 if row_seeded else 1)
    assert CountingLlama.rows == 6
    assert [len(row) for row in rows] == [3, 3]
    kwargs = CountingLlama.seen_kwargs[0]
    assert kwargs["do_sample"] is True and kwargs["temperature"] == 1.0 and "logits_processor" not in kwargs
    assert kwargs.get("num_return_sequences", 1) == (3 if row_seeded else 1)
    assert "past_key_values" not in kwargs and "cache" not in kwargs  # none of our caches reach it


def test_a_prompts_candidates_depend_on_its_seed_alone(counting, model_dir):
    """Row-seeded through a replaced generate: the same prompt and seed give the same candidates, whatever prompts
    are sampled beside it (the per-prompt call), and equal what CoMLRL's call gives under that seed."""
    model = counting()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    both = sample_candidates(model, tokenizer, PROMPTS, 3, SETTINGS, None, row_seeds=[11, 12])
    alone = sample_candidates(model, tokenizer, PROMPTS[1:], 3, SETTINGS, None, row_seeds=[12])
    assert [c.completion_ids for c in both[1]] == [c.completion_ids for c in alone[0]]

    ids = tokenizer(PROMPTS[1], return_tensors="pt")
    generator = torch.Generator().manual_seed(12)
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(generator.get_state())
        direct = LlamaForCausalLM.generate(
            model, **ids, do_sample=True, num_beams=1, max_new_tokens=4, temperature=1.0, top_p=1.0,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, num_return_sequences=3,
        )  # fmt: skip
    expected = direct[:, ids["input_ids"].shape[1] :].tolist()
    for candidate, row in zip(both[1], expected):
        assert candidate.completion_ids == row[: len(candidate.completion_ids)]


def test_plain_models_keep_our_paths(model_dir):
    plain = LlamaForCausalLM.from_pretrained(model_dir)
    assert sampling_path(plain, SETTINGS, row_seeded=True) == "comlrl-lab's decode loop (row-seeded)"
    assert sampling_path(plain, SETTINGS, row_seeded=False) == "transformers' generate (from the stream)"
    off = SamplingSettings(max_new_tokens=4, own_decode_loop=False)
    assert sampling_path(plain, off, row_seeded=True) == "transformers' generate (row-seeded logits processor)"


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_madpo_collect_samples_every_candidate_through_the_agents_generate(
    make_trainer, tmp_path, counting, model_dir, batch_invariant
):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = make_trainer(
        "MADPO",
        tmp_path,
        agent_model=None,
        agents=[counting(), counting()],
        tokenizer=tokenizer,
        batch_invariant_sampling=batch_invariant,
    )
    records = trainer.step("collect")

    # 6 items x 3 candidates per agent: per prompt one call each (12), or one batch of 18 rows per agent (2).
    assert CountingLlama.calls == (12 if batch_invariant else 2)
    assert CountingLlama.rows == 2 * 18
    how = "one call per prompt" if batch_invariant else "batched, from the stream"
    lines = [e["message"] for e in records.events if e["message"].startswith("sampling: ")]
    assert lines == [
        f"sampling: agent {i} (CountingLlama) samples through its own generate (CountingLlama.generate; {how}"
        + (", seeded from the prompt's row seed)" if batch_invariant else ")")
        for i in range(2)
    ]
    assert not any(e["message"].startswith("sampling: ") for e in trainer.step("select").events)  # once per run


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_a_model_comparator_samples_through_its_generate(make_trainer, tmp_path, counting, batch_invariant):
    trainer = make_trainer(
        "MADPOIter",
        tmp_path,
        comparator_policy="model",
        comparator_agents=[counting(), counting()],
        batch_invariant_sampling=batch_invariant,
    )
    records = trainer.step("collect")

    # Only the comparator counts: the agents are plain models from the folder.
    assert CountingLlama.calls == (12 if batch_invariant else 2)
    assert CountingLlama.rows == 2 * 18
    lines = [e["message"] for e in records.events if e["message"].startswith("sampling: ")]
    assert lines[0] == (
        "sampling: agent 0 (LlamaForCausalLM) samples through "
        + ("comlrl-lab's decode loop (row-seeded)" if batch_invariant else "transformers' generate (from the stream)")
    )
    assert lines[2].startswith("sampling: comparator 0 (CountingLlama) samples through its own generate")


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_a_current_comparison_samples_both_sides_through_the_agents_generate(
    make_trainer, tmp_path, counting, model_dir, batch_invariant
):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = make_trainer(
        "MADPOIter",
        tmp_path,
        agent_model=None,
        agents=[counting(), counting()],
        tokenizer=tokenizer,
        batch_invariant_sampling=batch_invariant,
    )
    trainer.step("collect")

    # Row-seeded (both sides in one pass): a call per prompt, side and agent (6 x 2 x 2); stream: one batch per side
    # and agent.
    assert CountingLlama.calls == (24 if batch_invariant else 4)
    assert CountingLlama.rows == 2 * 2 * 18
