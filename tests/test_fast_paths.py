"""Speed savings that must not change the maths: each one against the slow path it replaces."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch
from trainer_fixtures import ITEMS

from comlrl_lab.models.decode_loop import DROP_SHARE
from comlrl_lab.models.generation import (
    DEFAULT_ROWS_PER_CALL,
    MOST_ROWS_PER_CALL,
    RowSeededSampler,
    SamplingSettings,
    rows_per_call,
    sample_candidates,
    sample_sides,
    sampling_path,
    top_k_then_top_p,
)
from comlrl_lab.trainers.preference import MADPOConfig
from comlrl_lab.trainers.preference.learning.optim import build_adamw


def _reward(completions1, completions2, **_):
    return [float(len(a) - len(b)) for a, b in zip(completions1, completions2)]


_DEFAULTS = MADPOConfig()
#: The trainers here: four items, no evaluation, a reward that compares the answers' lengths, and the configs'
#: default temperature, top_p and top_k, so that sampling runs its top-k and top-p filters.
SETTINGS = dict(
    train_dataset=ITEMS[:4],
    eval_dataset=None,
    eval_num_samples=0,
    reward_func=_reward,
    temperature=_DEFAULTS.temperature,
    top_p=_DEFAULTS.top_p,
    top_k=_DEFAULTS.top_k,
    seed=3,
)


def _adamw_steps(implementation: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    optimizer = build_adamw(params, 1e-2, implementation)
    for step in range(3):
        optimizer.zero_grad()
        (sum((p**2).sum() for p in params) * (step + 1)).backward()
        optimizer.step()
    return [p.detach().clone() for p in params]


def test_adamw_implementations_take_the_same_step():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    reference = torch.optim.AdamW(params, lr=1e-2)
    for step in range(3):
        reference.zero_grad()
        (sum((p**2).sum() for p in params) * (step + 1)).backward()
        reference.step()
    loop = _adamw_steps("for_loop")
    # The loop is CoMLRL's (torch's CPU default) bit for bit; fused and foreach agree to float rounding.
    assert all(torch.equal(a, b) for a, b in zip(loop, params))
    for implementation in ("fused", "foreach"):
        for a, b in zip(_adamw_steps(implementation), loop):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_agents_get_a_fused_adamw_unless_asked_otherwise(make_trainer, tmp_path):
    fused = make_trainer("MADPO", tmp_path, SETTINGS)
    assert [opt.defaults["fused"] for opt in fused.optimizers] == [True, True]
    loop = make_trainer("MADPO", tmp_path, SETTINGS, adamw_implementation="loop")
    assert loop.args.adamw_implementation == "for_loop"
    assert [(opt.defaults["fused"], opt.defaults["foreach"]) for opt in loop.optimizers] == [(False, False)] * 2
    with pytest.raises(ValueError, match="adamw_implementation must be one of: fused, foreach, for_loop"):
        MADPOConfig(adamw_implementation="apex")


def _reference_warpers(top_k: int, top_p: float):
    from transformers.generation.logits_process import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

    return LogitsProcessorList(
        [TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1), TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1)]
    )


def test_top_k_then_top_p_keeps_what_the_warpers_keep():
    generator = torch.Generator().manual_seed(0)
    for trial in range(60):
        scores = torch.randn(6, (256, 1000, 4096)[trial % 3], generator=generator) * (0.5, 2.0, 8.0)[trial % 5 % 3]
        top_k, top_p = (5, 50, 200)[trial % 4 % 3], (0.6, 0.9, 0.3, 0.95)[trial % 4]
        expected = _reference_warpers(top_k, top_p)(None, scores)
        filtered, tied = top_k_then_top_p(scores, top_k, top_p)
        assert tied is None and torch.equal(filtered, expected)
    # A tie at the k-th score makes top-k keep more than k tokens: the caller must run the full warpers on that row.
    scores = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0], [3.0, 1.0, 2.5, 2.0, 0.0]])
    assert top_k_then_top_p(scores, 2, 0.9)[1].tolist() == [0]
    assert torch.isfinite(_reference_warpers(2, 0.9)(None, scores[:1])).sum() == 3


def test_sampling_filters_only_the_tied_rows_with_the_full_warpers():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 300, generator=generator)
    for row in (1, 4):  # the lowest score becomes the 20th: tied with one inside the top 20
        scores[row, scores[row].argmin()] = scores[row].topk(20).values[-1]
    settings = SamplingSettings(temperature=0.7, top_k=20, top_p=0.9)
    sampler = RowSeededSampler(torch.rand(6, 1, generator=generator), settings)
    fast, tied = top_k_then_top_p(scores / 0.7, 20, 0.9)
    assert tied.tolist() == [1, 4]
    expected = _reference_warpers(20, 0.9)(None, scores / 0.7)
    # The fast filter alone is right for the other rows and wrong for the tied ones.
    assert [torch.equal(fast[row], expected[row]) for row in range(6)] == [True, False, True, True, False, True]
    calls = []
    warpers = sampler.warpers
    sampler.warpers = lambda ids, rows: calls.append(len(rows)) or warpers(ids, rows)
    assert torch.equal(sampler.filtered(scores), expected)
    assert calls == [2]  # the full warpers ran on the two tied rows only


def test_row_seeded_sampling_gives_the_same_tokens_with_top_k_first(model_dir):
    from comlrl_lab.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, device="cpu", dtype="float32")
    prompts = [f"the {w} cat" for w in ("red", "blue", "green", "big", "small")]
    seeds = [11, 12, 13, 14, 15]
    samples = {}
    for first in (True, False):
        settings = SamplingSettings(max_new_tokens=8, temperature=0.7, top_p=0.6, top_k=7, top_k_first=first)
        result = sample_candidates(model, tokenizer, prompts, 4, settings, None, row_seeds=seeds)
        samples[first] = [[s.completion_ids for s in row] for row in result]
    assert samples[True] == samples[False]
    assert len({tuple(ids) for row in samples[True] for ids in row}) > 1  # the rows really sampled


def _count_mode_switches(models):
    calls = []
    for index, model in enumerate(models):
        plain = model.train

        def counted(mode=True, plain=plain, index=index):
            calls.append((index, mode))
            return plain(mode)

        model.train = counted
    return calls


@pytest.mark.parametrize("disable_dropout", [True, False])
def test_train_phase_switches_modes_once_not_per_update(make_trainer, tmp_path, disable_dropout):
    trainer = make_trainer(
        "MADPO", tmp_path, SETTINGS, train_batch_size=2, num_train_epochs=3, disable_dropout=disable_dropout
    )
    trainer.step("collect")
    trainer.step("select")
    assert len(trainer.collector.train_pairs) > 2  # several updates per epoch
    calls = _count_mode_switches(trainer.agents)
    seen = []
    plain_update = trainer.learner._update

    def watched(batch, step):
        seen.append([model.training for model in trainer.agents])
        return plain_update(batch, step)

    trainer.learner._update = watched
    trainer.step("train")
    assert trainer.updates_seen == len(seen) > 3
    # Dropout off: the agents are already in eval mode, so no update switches anything.
    expected = [] if disable_dropout else [(0, True), (1, True), (0, False), (1, False)]
    assert calls == expected
    assert seen[1:] == [[not disable_dropout] * 2] * (len(seen) - 1)
    assert not any(model.training for model in trainer.agents)


def test_sampling_an_eval_model_leaves_its_mode_alone(model_dir):
    from comlrl_lab.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, device="cpu", dtype="float32").eval()
    calls = _count_mode_switches([model])
    sample_candidates(model, tokenizer, ["a cat"], 2, SamplingSettings(max_new_tokens=3), None, row_seeds=[1])
    assert calls == []
    model.train(True)
    calls.clear()
    sample_candidates(model, tokenizer, ["a cat"], 2, SamplingSettings(max_new_tokens=3), None, row_seeds=[1])
    assert calls == [(0, False), (0, True)] and model.training


def model_logging_forward_shapes(model_dir):
    """The tiny model in eval mode, its tokenizer, and the list every forward appends its input_ids shape to."""
    from comlrl_lab.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, device="cpu", dtype="float32").eval()
    forward_rows: list[tuple[int, ...]] = []
    plain_forward = model.forward

    @functools.wraps(plain_forward)  # the sampler reads the forward's signature
    def watched(*args, **kwargs):
        forward_rows.append(tuple(kwargs["input_ids"].shape))
        return plain_forward(*args, **kwargs)

    model.forward = watched
    return model, tokenizer, forward_rows


def test_each_prompt_is_prefilled_once_with_the_same_tokens(model_dir):
    model, tokenizer, forward_rows = model_logging_forward_shapes(model_dir)
    prompts = ["the red cat sat on the mat", "a dog", "the green bird sang all day long"]
    samples = {}
    for prefill in (True, False):
        for seeded in (True, False):
            settings = SamplingSettings(max_new_tokens=6, batch_size=8, prefill_once=prefill)
            forward_rows.clear()
            result = sample_candidates(
                model,
                tokenizer,
                prompts,
                4,
                settings,
                None if seeded else torch.Generator().manual_seed(5),
                row_seeds=[3, 4, 5] if seeded else None,
            )
            samples[prefill, seeded] = [[s.completion_ids for s in row] for row in result]
            first_calls = [shape for shape in forward_rows if shape[1] > 1]
            if prefill:
                # Two generate calls (8 rows, then 4): their distinct prompts (2, then 1) run once over all their
                # tokens but the last; every row then feeds only its last token.
                assert [rows for rows, _ in first_calls] == [2, 1]
            else:
                assert [rows for rows, _ in first_calls] == [8, 4]
    assert samples[True, True] == samples[False, True]
    assert samples[True, False] == samples[False, False]


def test_two_sides_in_one_pass_get_their_own_tokens_from_one_prefill(model_dir):
    model, tokenizer, forward_rows = model_logging_forward_shapes(model_dir)
    prompts = ["the red cat sat on the mat", "a dog", "the green bird sang all day long"]
    settings = SamplingSettings(max_new_tokens=6, batch_size=64, top_p=0.9)
    apart = [
        [
            [s.completion_ids for s in row]
            for row in sample_candidates(model, tokenizer, prompts, n, settings, None, row_seeds=seeds)
        ]
        for n, seeds in ((3, [3, 4, 5]), (2, [7, 8, 9]))
    ]
    forward_rows.clear()
    together = sample_sides(model, tokenizer, prompts, [3, 2], settings, [[3, 4, 5], [7, 8, 9]])
    assert [[[s.completion_ids for s in row] for row in side] for side in together] == apart
    # One generate call of 15 rows; its 3 distinct prompts are prefilled once for both sides.
    assert [rows for rows, width in forward_rows if width > 1] == [3]
    assert apart[0] != apart[1]  # different seeds: the sides are not copies of each other


def _decode_steps_fed(lengths: list[int], finished: list[bool], max_new_tokens: int) -> list[int]:
    """The rows the own decode loop feeds at each step, worked out from the rows' completions by its rule: after a
    step, the rows that have emitted their EOS leave once they are at least ``DROP_SHARE`` of the rows fed."""
    fed, counts = list(range(len(lengths))), []
    for step in range(max_new_tokens):
        counts.append(len(fed))
        done = [r for r in fed if finished[r] and lengths[r] <= step + 1]
        if len(done) == len(fed):
            break
        if len(done) >= DROP_SHARE * len(fed):
            fed = [r for r in fed if r not in done]
    return counts


@pytest.mark.parametrize("prefill_once", [True, False])
def test_the_own_decode_loop_samples_generates_tokens_and_feeds_only_unfinished_rows(model_dir, prefill_once):
    model, tokenizer, forward_rows = model_logging_forward_shapes(model_dir)
    prompts = ["the red cat sat on the mat", "a dog", "the green bird sang all day long"]
    seeds = [3, 4, 5]
    settings = SamplingSettings(
        max_new_tokens=10, temperature=1.5, top_p=1.0, top_k=None, batch_size=12, prefill_once=prefill_once
    )
    # An EOS the tiny model samples often, so that rows end at different steps.
    first = sample_candidates(model, tokenizer, prompts, 4, settings, None, row_seeds=seeds)
    tokens = [t for row in first for s in row for t in s.completion_ids]
    model.generation_config.eos_token_id = max(set(tokens), key=tokens.count)
    results = {}
    for own in (True, False):
        forward_rows.clear()
        result = sample_candidates(
            model, tokenizer, prompts, 4, dataclasses.replace(settings, own_decode_loop=own), None, row_seeds=seeds
        )
        results[own] = [[(s.completion_ids, s.finished) for s in row] for row in result]
        # Each forward of the loop after the prompt's: one token per row (without the shared prefix, the first
        # forward runs the whole left-padded prompts).
        steps = [rows for rows, width in forward_rows if width == 1]
        if not prefill_once:
            steps = [forward_rows[0][0], *steps]
        if own:
            # Rows in the loop's order: prompts shortest first ("a dog", then the others), 4 candidates each.
            rows = [results[own][k][j] for k in (1, 0, 2) for j in range(4)]
            lengths, finished = [len(ids) for ids, _ in rows], [done for _, done in rows]
            assert any(finished) and not all(finished) and len(set(lengths)) > 2
            assert steps == _decode_steps_fed(lengths, finished, settings.max_new_tokens)
            assert steps[0] == 12 and min(steps) < 12  # finished rows did leave
        else:
            assert set(steps) == {12}  # generate feeds every row until the last one ends
    assert results[True] == results[False]


def test_a_lora_agent_samples_in_the_own_decode_loop_with_its_adapter(model_dir):
    pytest.importorskip("peft")
    from comlrl_lab.models.lora import LoraSettings, apply_lora

    inner, tokenizer, forward_rows = model_logging_forward_shapes(model_dir)
    model = apply_lora(inner, LoraSettings(r=4, target_modules=["q_proj", "v_proj"]), seed=0)
    with torch.no_grad():  # LoRA's B starts at zero (no change); a drawn B makes the adapter change the tokens
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)))
    prompts = ["the red cat sat on the mat", "a dog", "the green bird sang all day long"]
    seeds = [3, 4, 5]
    settings = SamplingSettings(max_new_tokens=10, temperature=1.5, top_p=1.0, top_k=None, batch_size=12)
    assert sampling_path(model, settings, row_seeded=True) == "comlrl-lab's decode loop (row-seeded)"
    first = sample_candidates(model, tokenizer, prompts, 4, settings, None, row_seeds=seeds)
    tokens = [t for row in first for s in row for t in s.completion_ids]
    inner.generation_config.eos_token_id = max(set(tokens), key=tokens.count)  # rows end at different steps
    results, steps = {}, {}
    for own in (True, False):
        forward_rows.clear()
        result = sample_candidates(
            model, tokenizer, prompts, 4, dataclasses.replace(settings, own_decode_loop=own), None, row_seeds=seeds
        )
        results[own] = [[(s.completion_ids, s.finished) for s in row] for row in result]
        # Both ways run each distinct prompt once, through the wrapped model's forward, then one token a row.
        assert [rows for rows, width in forward_rows if width > 1] == [3]
        steps[own] = [rows for rows, width in forward_rows if width == 1]
    assert results[True] == results[False]
    # peft's own generate, as a LoRA agent sampled before: no shared prefill, no own loop.
    peft_only = dataclasses.replace(settings, own_decode_loop=False, prefill_once=False)
    result = sample_candidates(model, tokenizer, prompts, 4, peft_only, None, row_seeds=seeds)
    assert [[(s.completion_ids, s.finished) for s in row] for row in result] == results[True]
    assert steps[False][0] == 12 and set(steps[False]) == {12}
    assert steps[True][0] == 12 and min(steps[True]) < 12  # finished rows left the own loop's batch
    with model.disable_adapter():
        base = sample_candidates(model, tokenizer, prompts, 4, settings, None, row_seeds=seeds)
    assert [[(s.completion_ids, s.finished) for s in row] for row in base] != results[True]


def test_generation_configs_that_add_processors_keep_generate(model_dir, monkeypatch):
    import comlrl_lab.models.generation as generation

    model, tokenizer, _ = model_logging_forward_shapes(model_dir)
    settings = SamplingSettings(max_new_tokens=4)

    def no_loop(*args, **kwargs):
        raise AssertionError("the own decode loop ran")

    monkeypatch.setattr(generation, "decode_rows", no_loop)
    with pytest.raises(AssertionError, match="own decode loop"):
        sample_candidates(model, tokenizer, ["a cat"], 2, settings, None, row_seeds=[1])
    model.generation_config.repetition_penalty = 1.3  # a processor only generate applies
    assert len(sample_candidates(model, tokenizer, ["a cat"], 2, settings, None, row_seeds=[1])[0]) == 2
    model.generation_config.repetition_penalty = 1.0
    # Stream sampling and extra generate kwargs keep generate too.
    sample_candidates(model, tokenizer, ["a cat"], 2, settings, torch.Generator().manual_seed(0))
    sample_candidates(
        model, tokenizer, ["a cat"], 2, settings, None, row_seeds=[1], extra_generate_kwargs={"min_new_tokens": 2}
    )


def test_row_seeded_calls_are_sized_by_their_kv_cache(model_dir):
    from comlrl_lab.models.loading import load_model

    model = load_model(model_dir, device="cpu", dtype="float32")
    config = model.config  # the test model: 2 layers, 2 KV heads of 8 dims, float32: 256 bytes a position
    assert (config.num_hidden_layers, config.num_key_value_heads, config.head_dim) == (2, 2, 8)
    assert rows_per_call(model, 40, 32) == MOST_ROWS_PER_CALL  # 72 positions: 18,432 bytes a row
    assert rows_per_call(model, 30_000, 11_943) == 100  # 10,737,408 bytes a row: 100 rows in 1 GiB
    assert rows_per_call(model, 100_000, 60_000) == DEFAULT_ROWS_PER_CALL  # 26 would fit: never below 64
    model.config = type("Config", (), {})()  # a config that does not give the cache's shape
    assert rows_per_call(model, 40, 32) == DEFAULT_ROWS_PER_CALL


def test_stream_sampling_keeps_calls_of_64_rows_and_row_seeded_sampling_takes_more(model_dir):
    model, tokenizer, forward_rows = model_logging_forward_shapes(model_dir)
    prompts = [f"the {w} cat" for w in ("red", "blue", "green", "big", "small")]
    settings = SamplingSettings(max_new_tokens=2, prefill_once=False)  # batch_size None
    sample_candidates(model, tokenizer, prompts, 16, settings, torch.Generator().manual_seed(0))
    assert [rows for rows, width in forward_rows if width > 1] == [64, 16]
    forward_rows.clear()
    sample_candidates(model, tokenizer, prompts, 16, settings, None, row_seeds=[1, 2, 3, 4, 5])
    assert [rows for rows, width in forward_rows if width > 1] == [80]


@pytest.mark.parametrize("policy", ["current", "current_copy"])
def test_current_comparison_samples_both_sides_in_one_pass_with_the_same_pairs(make_trainer, tmp_path, policy):
    def run(one_pass):
        trainer = make_trainer(
            "MADPOIter",
            tmp_path / str(one_pass),
            SETTINGS,
            num_iterations=2,
            comparator_num_candidates=4,
            comparator_policy=policy,
        )
        plain = trainer.context.sampling_settings
        trainer.context.sampling_settings = lambda **overrides: plain(**{"sides_in_one_pass": one_pass, **overrides})
        trainer.collector.comparator.context.sampling = trainer.context.sampling_settings()
        assert trainer.collector.sides_in_one_pass() is one_pass
        pairs = []
        while not trainer.finished:
            trainer.step()
            pairs.extend(
                (p.round_index, p.item_index, p.winner_side, p.winner_ids, p.loser_ids)
                for p in trainer.collector.round_pairs
                if trainer.phase_index == 1
            )
        return pairs

    together = run(True)
    assert together and together == run(False)
    assert {side for _, _, side, _, _ in together} == {"current", "comparator"}


def _random_pairs(seed: int, vocab_size: int):
    generator = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(5, vocab_size, (n,), generator=generator).tolist()

    prompts = [ids(n) for n in (3, 7, 1, 5, 9)]
    winners = [ids(n) for n in (4, 1, 6, 0, 8)]
    losers = [ids(n) for n in (2, 5, 1, 7, 3)]
    return prompts, winners, losers


@pytest.mark.parametrize("score_final_token", [False, True])
def test_packed_pair_scoring_equals_two_rows_per_pair(model_dir, score_final_token):
    from comlrl_lab.models.loading import load_model
    from comlrl_lab.models.scoring import pair_logps, sequence_logps

    model = load_model(model_dir, device="cpu", dtype="float32").eval()
    prompts, winners, losers = _random_pairs(1, model.config.vocab_size)
    kwargs = dict(pad_token_id=0, score_final_token=score_final_token, micro_batch_size=2)
    packed = pair_logps(model, prompts, winners, losers, packed=True, **kwargs)
    (packed[0].sum() - 2 * packed[1].sum()).backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    rows = sequence_logps(model, prompts + prompts, winners + losers, **kwargs)
    (rows[:5].sum() - 2 * rows[5:].sum()).backward()
    torch.testing.assert_close(packed[0], rows[:5], rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(packed[1], rows[5:], rtol=1e-6, atol=1e-4)
    for got, expected in zip(packed_grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)
    # An empty winner scores 0, as sequence_logps scores it.
    assert float(packed[0][3].detach()) == 0.0


def test_packed_loser_never_sees_its_winner(model_dir):
    from comlrl_lab.models.loading import load_model
    from comlrl_lab.models.scoring import pair_logps

    model = load_model(model_dir, device="cpu", dtype="float32").eval()
    prompts, winners, losers = _random_pairs(2, model.config.vocab_size)
    with torch.no_grad():
        before = pair_logps(model, prompts, winners, losers, pad_token_id=0)
        changed = [
            [(t * 7 + 3) % (model.config.vocab_size - 5) + 5 for t in w] for w in winners
        ]  # same lengths, other tokens
        after = pair_logps(model, prompts, changed, losers, pad_token_id=0)
    torch.testing.assert_close(after[1], before[1], rtol=0, atol=1e-5)
    assert not torch.allclose(after[0], before[0])


def test_models_without_custom_masks_score_two_rows(model_dir, monkeypatch):
    from comlrl_lab.models.loading import load_model
    from comlrl_lab.models.scoring import pair_logps, sequence_logps, supports_packed_pairs

    model = load_model(model_dir, device="cpu", dtype="float32").eval()
    assert supports_packed_pairs(model)
    with monkeypatch.context() as patch:
        patch.setattr(model.config, "_attn_implementation", "flash_attention_2", raising=False)
        assert not supports_packed_pairs(model)
    # Score as such a model would be scored (flash attention itself needs a GPU kernel package).
    monkeypatch.setattr("comlrl_lab.models.scoring.supports_packed_pairs", lambda model: False)
    prompts, winners, losers = _random_pairs(3, model.config.vocab_size)
    with torch.no_grad():
        fallback = pair_logps(model, prompts, winners, losers, pad_token_id=0, micro_batch_size=5)
        rows = sequence_logps(model, prompts + prompts, winners + losers, pad_token_id=0, micro_batch_size=10)
    assert torch.equal(torch.cat(fallback), rows)


@pytest.mark.parametrize("packed", [True, False])
def test_dpo_update_scores_one_row_per_pair_when_packing(make_trainer, tmp_path, packed):
    trainer = make_trainer(
        "MADPO", tmp_path, SETTINGS, pack_pair_scoring=packed, scoring_batch_size=64, train_batch_size=64
    )
    trainer.step("collect")
    trainer.step("select")
    pairs = trainer.collector.train_pairs
    rows = []
    for agent in trainer.agents:
        decoder = agent.model  # the LM's decoder: it runs in every scoring forward, whatever runs the last layer
        plain = decoder.forward

        @functools.wraps(plain)
        def watched(*args, plain=plain, **kwargs):
            rows.append(kwargs["input_ids"].shape[0])
            return plain(*args, **kwargs)

        decoder.forward = watched
    trainer.learner.update(pairs)
    assert rows == [len(pairs) if packed else 2 * len(pairs)] * 2


class _CountingTokenizer:
    """Delegates to a tokenizer and counts its __call__s."""

    def __init__(self, tokenizer):
        self._tokenizer, self.calls = tokenizer, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


@pytest.mark.parametrize("side", ["left", "right"])
def test_reward_model_fit_tokenises_each_text_once(side):
    import random

    from model_fixtures import build_model, build_tokenizer

    from comlrl_lab.trainers.preference.learning.reward_model import JointRewardModel, fit_bradley_terry

    tokenizer = build_tokenizer()
    tokenizer.padding_side = side
    model = JointRewardModel.from_backbone(
        build_model(len(tokenizer), seed=3), tokenizer, generator=torch.Generator().manual_seed(0)
    )
    texts = ["the red cat", "one two three four five six seven", "dog", "a b"]
    with torch.no_grad():
        # Pre-tokenised rows pad exactly as the tokenizer pads them: the same scores, bit for bit.
        assert torch.equal(model.score_ids(model.tokenize(texts)), model.score_texts(texts))
    counting = _CountingTokenizer(tokenizer)
    model.tokenizer = counting
    pairs = [(texts[0], texts[1]), (texts[2], texts[3]), (texts[1], texts[2])]
    fit_bradley_terry(
        model, pairs, [(texts[3], texts[0])], epochs=3, batch_size=1, learning_rate=1e-3, rng=random.Random(0)
    )
    assert counting.calls == 2  # the training texts once, the held-out texts once; not once per step


def _files(directory):
    """The files of the newest checkpoint under ``directory``."""
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    newest = ckpt.latest_checkpoint(directory)
    return sorted(p.name for p in newest.iterdir()) if newest is not None else []


def _count(directory):
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    return len(ckpt.checkpoint_dirs(directory))


def test_checkpoints_write_weights_only_after_training(make_trainer, tmp_path):
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    trainer = make_trainer("MADPO", tmp_path, SETTINGS)
    trainer.checkpoint_dir = tmp_path / "ckpt"
    trainer.step("collect")
    trainer.step("select")
    # Nothing trained yet: the state file alone, pointing at version 0 (the weights as built).
    assert _files(trainer.checkpoint_dir) == ["cost.json", "state.json", "state.safetensors"]
    state, weights = ckpt.load_checkpoint(trainer.checkpoint_dir)
    assert state["weights_version"] == 0 and weights is None
    fresh = make_trainer("MADPO", tmp_path, SETTINGS)
    fresh.load_checkpoint(trainer.checkpoint_dir)
    assert fresh.next_phase == "train"
    trainer.step("train")
    assert _files(trainer.checkpoint_dir) == ["cost.json", "state.json", "state.safetensors", "weights-000001.pt"]
    assert ckpt.load_checkpoint(trainer.checkpoint_dir)[1]["optimizers"] is not None  # the run goes on

    # Checkpointing once per round, the last one comes when the run has finished: no moments to resume with.
    once = make_trainer("MADPO", tmp_path, SETTINGS, save_strategy="round")
    once.train(checkpoint_dir=tmp_path / "round")
    _, weights = ckpt.load_checkpoint(tmp_path / "round")
    assert weights["optimizers"] is None and len(weights["agents"]) == 2
    resumed = make_trainer("MADPO", tmp_path, SETTINGS)
    resumed.load_checkpoint(tmp_path / "round")
    assert resumed.finished
    for a, b in zip(once.agents[0].parameters(), resumed.agents[0].parameters()):
        assert torch.equal(a, b)


def test_a_trained_trainer_refuses_the_initial_weights_checkpoint(make_trainer, tmp_path):
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    trainer = make_trainer("MADPO", tmp_path, SETTINGS)
    trainer.checkpoint_dir = tmp_path / "ckpt"
    trainer.step("collect")
    trainer.step("select")
    trainer.checkpoint_dir = None
    trainer.step("train")
    with pytest.raises(ckpt.InitialWeightsCheckpoint, match="build a fresh trainer"):
        trainer.load_checkpoint(tmp_path / "ckpt")


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [("phase", [True, True, True, True]), ("round", [False, False, False, True]), ("no", [False] * 4)],
)
def test_save_strategy_picks_the_phases_that_checkpoint(make_trainer, tmp_path, strategy, expected):
    trainer = make_trainer("MADPO", tmp_path, SETTINGS, save_strategy=strategy, eval_num_samples=1)
    trainer.checkpoint_dir = tmp_path / "ckpt"
    saved = []
    for phase in ("collect", "select", "train", "evaluate"):
        before = _count(trainer.checkpoint_dir)
        trainer.step(phase)
        saved.append(_count(trainer.checkpoint_dir) == before + 1)
    assert saved == expected
    with pytest.raises(ValueError, match="save_strategy must be one of: phase, round, no"):
        MADPOConfig(save_strategy="steps")


def test_background_checkpoint_lands_after_step_returns_and_holds_that_phase(make_trainer, tmp_path, monkeypatch):
    import threading

    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    trainer = make_trainer("MADPO", tmp_path, SETTINGS, save_in_background=True, num_train_epochs=2)
    trainer.checkpoint_dir = tmp_path / "ckpt"
    trainer.step("collect")
    trainer.step("select")
    trainer.wait_for_checkpoint()
    release = threading.Event()
    plain_save = ckpt.save_checkpoint

    def held(*args, **kwargs):
        release.wait(timeout=60)
        return plain_save(*args, **kwargs)

    monkeypatch.setattr(ckpt, "save_checkpoint", held)
    trainer.step("train")
    expected = [p.detach().clone() for p in trainer.agents[0].parameters()]
    # The step returned while its checkpoint is still being written: the last committed one is the select's.
    assert "weights-000001.pt" not in _files(trainer.checkpoint_dir) and _count(trainer.checkpoint_dir) == 2
    with torch.no_grad():  # the next phase changing the weights must not reach the checkpoint in flight
        for p in trainer.agents[0].parameters():
            p.add_(1.0)
    release.set()
    trainer.wait_for_checkpoint()
    assert "weights-000001.pt" in _files(trainer.checkpoint_dir)
    resumed = make_trainer("MADPO", tmp_path, SETTINGS)
    resumed.load_checkpoint(trainer.checkpoint_dir)
    assert resumed.next_phase == "evaluate"
    for got, want in zip(resumed.agents[0].parameters(), expected):
        assert torch.equal(got, want)


def test_background_checkpoint_errors_surface_at_the_next_wait(make_trainer, tmp_path, monkeypatch):
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    trainer = make_trainer("MADPO", tmp_path, SETTINGS, save_in_background=True)
    trainer.checkpoint_dir = tmp_path / "ckpt"

    def full_disk(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(ckpt, "save_checkpoint", full_disk)
    trainer.step("collect")
    with pytest.raises(OSError, match="No space left"):
        trainer.wait_for_checkpoint()
    trainer.wait_for_checkpoint()  # reported once


def _names(directory):
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    return [p.name for p in ckpt.checkpoint_dirs(directory)]


def test_save_total_limit_keeps_the_newest_checkpoints_and_resumes_from_the_newest(make_trainer, tmp_path):
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    trainer = make_trainer("MADPO", tmp_path, SETTINGS, save_total_limit=2)
    trainer.checkpoint_dir = tmp_path / "ckpt"
    for phase in ("collect", "select", "train"):
        trainer.step(phase)
    assert _names(trainer.checkpoint_dir) == ["checkpoint-000002", "checkpoint-000003"]
    resumed = make_trainer("MADPO", tmp_path, SETTINGS)
    resumed.load_checkpoint(trainer.checkpoint_dir)
    assert resumed.next_phase == "evaluate"
    for got, want in zip(resumed.agents[1].parameters(), trainer.agents[1].parameters()):
        assert torch.equal(got, want)
    trainer.step("evaluate")
    assert _names(trainer.checkpoint_dir) == ["checkpoint-000003", "checkpoint-000004"]
    # The evaluate phase changed no weights: its checkpoint links the train phase's file instead of writing it.
    trained, evaluated = (ckpt.weights_file(trainer.checkpoint_dir / n, 1) for n in _names(trainer.checkpoint_dir))
    assert evaluated.stat().st_ino == trained.stat().st_ino
    with pytest.raises(ValueError, match="save_total_limit must be >= 1."):
        MADPOConfig(save_total_limit=0)


def test_an_old_checkpoint_goes_only_after_its_successor_is_committed(make_trainer, tmp_path, monkeypatch):
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    trainer = make_trainer("MADPO", tmp_path, SETTINGS, save_total_limit=1)
    trainer.checkpoint_dir = root = tmp_path / "ckpt"
    trainer.step("collect")
    seen_at_prune = []
    prune = ckpt.prune_checkpoints
    monkeypatch.setattr(ckpt, "prune_checkpoints", lambda r, limit: seen_at_prune.append(_names(r)) or prune(r, limit))
    trainer.step("select")
    assert seen_at_prune == [["checkpoint-000001", "checkpoint-000002"]] and _names(root) == ["checkpoint-000002"]

    # A write that dies before its commit (a kill, a full disk) leaves the last committed checkpoint in place.
    def dies_at_the_state_file(state, directory):
        raise OSError("killed")

    monkeypatch.setattr(ckpt, "_save_state", dies_at_the_state_file)
    with pytest.raises(OSError, match="killed"):
        trainer.step("train")
    assert _names(root) == ["checkpoint-000002"] and len(seen_at_prune) == 1
    assert [p.name for p in ckpt.remove_stale_tmp(root)] == []  # this process's own staging folder is not stale
    resumed = make_trainer("MADPO", tmp_path, SETTINGS)
    resumed.load_checkpoint(root)
    assert resumed.next_phase == "train"


def test_a_resume_from_an_older_checkpoint_numbers_on_under_the_same_root(make_trainer, tmp_path):
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    first = make_trainer("MADPO", tmp_path, SETTINGS)
    first.train(checkpoint_dir=tmp_path / "ckpt")
    root = tmp_path / "ckpt"
    assert _names(root) == [f"checkpoint-00000{i}" for i in range(1, 5)]  # None keeps every checkpoint
    again = make_trainer("MADPO", tmp_path, SETTINGS)
    again.train(resume_from_checkpoint=root / "checkpoint-000002", checkpoint_total_limit=3)
    # The same seed retrains to the same weights; the new checkpoints follow the newest, under the same root.
    assert _names(root) == ["checkpoint-000004", "checkpoint-000005", "checkpoint-000006"]
    _, before = ckpt.load_checkpoint(root / "checkpoint-000004")
    _, after = ckpt.load_checkpoint(root / "checkpoint-000006")
    for a, b in zip(before["agents"], after["agents"]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="checkpoint_total_limit must be a positive integer or None."):
        make_trainer("MADPO", tmp_path, SETTINGS).train(checkpoint_total_limit=0)


def test_a_background_write_in_flight_is_never_pruned(make_trainer, tmp_path, monkeypatch):
    import threading

    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    trainer = make_trainer("MADPO", tmp_path, SETTINGS, save_in_background=True, save_total_limit=1)
    trainer.checkpoint_dir = root = tmp_path / "ckpt"
    trainer.step("collect")
    trainer.wait_for_checkpoint()
    release = threading.Event()
    save = ckpt._save_state

    def held(state, directory):
        release.wait(timeout=60)
        return save(state, directory)

    monkeypatch.setattr(ckpt, "_save_state", held)
    trainer.step("select")
    # Written, not yet committed: the collect's checkpoint is still the one a resume would use.
    assert _names(root) == ["checkpoint-000001"]
    assert ckpt.load_checkpoint(root)[0]["phase_index"] == 1
    release.set()
    trainer.wait_for_checkpoint()
    assert _names(root) == ["checkpoint-000002"] and ckpt.load_checkpoint(root)[0]["phase_index"] == 2


@pytest.mark.parametrize("background", [False, True])
def test_each_checkpoint_adds_its_cost_to_its_phase(make_trainer, tmp_path, background):
    from comlrl_lab.names import metric_names as M
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt
    from comlrl_lab.trainers.preference.runtime.sink import MemorySink

    trainer = make_trainer("MADPO", tmp_path, SETTINGS, save_in_background=background)
    trainer.sink = sink = MemorySink()
    trainer.checkpoint_dir = root = tmp_path / "ckpt"
    for phase in ("collect", "select", "train"):
        trainer.step(phase)
    trainer.wait_for_checkpoint()
    folders = ckpt.checkpoint_dirs(root)
    for records, folder in zip(sink.phases, folders):
        costs = {m["name"]: m["value"] for m in records.metrics if m["name"].startswith("checkpoint/")}
        size, seconds, background_seconds = (
            M.name(template, phase=records.phase)
            for template in (M.CHECKPOINT_BYTES, M.CHECKPOINT_SECONDS, M.CHECKPOINT_BACKGROUND_SECONDS)
        )
        # Bytes written: the state files, and the weights file the train phase wrote; not the record of the cost.
        assert costs[size] == sum(p.stat().st_size for p in folder.iterdir() if p.name != ckpt.COST_FILE)
        assert json.loads((folder / ckpt.COST_FILE).read_text())["metrics"] == costs  # kept for a reopening
        assert costs[seconds] > 0
        assert (background_seconds in costs) == background
        assert len(costs) == (3 if background else 2)
        if background:
            assert costs[background_seconds] > 0
    assert (folders[2] / "weights-000001.pt").is_file()  # the train phase's checkpoint holds weights
    trainer.step("evaluate")
    trainer.wait_for_checkpoint()
    evaluated = {m["name"]: m["value"] for m in sink.phases[3].metrics}
    # Its weights are linked from the train phase's checkpoint: only the state files count.
    written = evaluated[M.name(M.CHECKPOINT_BYTES, phase="evaluate")]
    newest = ckpt.checkpoint_dirs(root)[3]
    assert written == sum((newest / name).stat().st_size for name in (ckpt.STATE_FILE, ckpt.TENSORS_FILE))
    assert len(sink.phases) == 4


@pytest.mark.parametrize("row_seeded", [True, False])
def test_concurrent_cpu_agents_give_the_same_pairs_and_weights(make_trainer, tmp_path, monkeypatch, row_seeded):
    from comlrl_lab.trainers.preference.runtime import concurrency

    monkeypatch.setattr(concurrency, "available_cores", lambda: 2)
    threaded = []
    in_threads = concurrency._in_threads
    monkeypatch.setattr(concurrency, "_in_threads", lambda fn, count: threaded.append(count) or in_threads(fn, count))
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # one intra-op thread either way, so the sums are the same to the bit
    try:
        runs, threaded_by_phase = [], {}
        for concurrent in (False, True):
            trainer = make_trainer(
                "MADPO", tmp_path, SETTINGS, concurrent_cpu_agents=concurrent, batch_invariant_sampling=row_seeded
            )
            for phase in ("collect", "select", "train", "evaluate"):
                threaded.clear()
                trainer.step(phase)
                threaded_by_phase[(concurrent, phase)] = len(threaded)
                if phase == "collect":
                    pairs = [(p.item_index, p.winner_ids, p.loser_ids) for p in trainer.collector.round_pairs]
            runs.append((pairs, [p.detach().clone() for m in trainer.agents for p in m.parameters()]))
    finally:
        torch.set_num_threads(before)
    (pairs_off, weights_off), (pairs_on, weights_on) = runs
    assert pairs_on and pairs_on == pairs_off
    assert all(torch.equal(a, b) for a, b in zip(weights_off, weights_on))
    assert not any(threaded_by_phase[(False, phase)] for phase in ("collect", "select", "train", "evaluate"))
    assert threaded_by_phase[(True, "train")] > 0  # pair scoring overlaps
    # Sampling overlaps only with row seeds: without them the CPU agents share one stream, whose order matters.
    assert (threaded_by_phase[(True, "collect")] > 0) == row_seeded
