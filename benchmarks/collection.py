"""Benchmark: the candidate sampler's overhead against raw batched ``model.generate``, in tokens per second.

Both sides sample the same prompts x candidates with the same ``max_new_tokens``, sampling settings and
batch size on the same model, one thread:

(a) raw: the sequences in dataset order, left-padded by the tokenizer, ``batch_size`` per ``model.generate``
    call, counting generated tokens that are not padding;
(b) ``comlrl_lab.models.generation.sample_candidates``: the same work plus tokenisation, length sorting,
    generator swapping, EOS cutting and decoding, counting ``count_tokens``;
(c) the same with ``row_seeds`` (batch-invariant sampling: each row draws from its own seeded uniforms and a
    logits processor picks the token; what the trainers use by default, ``batch_invariant_sampling=True``).

(d) a ``current`` comparison: the row-seeded sampler over both sides (current and comparator seeds, N candidates
    each), in one pass over the model (``sample_sides``, each prompt prefilled once for both sides), or with
    ``--no-sides-in-one-pass`` in two ``sample_candidates`` calls as before.

It prints the rates, (b) / (a) and (c) / (a); the target is >= 0.8 for both. ``--no-top-k-first`` (top-p sorts
the whole vocabulary) and ``--no-prefill-once`` (every row prefills its prompt) and ``--no-own-decode-loop`` (row-seeded rows go
through ``generate``) and ``--no-single-query-attention`` (the decode loop's one-token steps use torch's CPU flash
attention) and ``--no-shared-prefix-attention`` (every candidate's row holds a copy of its prompt's KV cache) switch
the sampler's savings off. Prompts come from the built-in ``length_ratio``
task (agent 1's formatter) when it is available. The embedded tiny model is used by default; when it has
not been built yet the benchmark says so and exits. Usage::

    python benchmarks/collection.py [--model comlrl-lab/tiny] [--items 16] [--candidates 8]
        [--max-new-tokens 32] [--batch-size 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping

import torch
from sampler_switches import SAMPLER_SAVINGS, add_sampler_switches, sampler_savings_off

from comlrl_lab.models.generation import SamplingSettings, count_tokens, sample_candidates, sample_sides
from comlrl_lab.models.loading import ModelLoadError, load_model, load_tokenizer
from comlrl_lab.models.tiny_model import is_tiny_model_name, tiny_model_path

SETTINGS_FIELDS = frozenset(field.name for field in dataclasses.fields(SamplingSettings))

FALLBACK_PROMPTS = [
    "Write one short sentence about the sea.",
    "Name three colours.",
    "Describe a cat in a few words.",
    "Say something kind to a friend who is tired after a long day at work.",
]


def task_prompts(num_items: int) -> list[str]:
    """Agent 1's prompts for the first ``num_items`` training items of ``length_ratio`` (fixed ones otherwise)."""
    try:
        from comlrl_lab.data.tasks import get_task

        task = get_task("length_ratio")
        prompts = [task.formatters[0](item) for item in task.train_items()]
    except (ImportError, KeyError, ValueError, OSError):
        prompts = FALLBACK_PROMPTS
    return [prompts[i % len(prompts)] for i in range(num_items)]


def raw_generate(model, tokenizer, prompts: list[str], num_candidates: int, settings: SamplingSettings, seed: int):
    """Plain batched generate over prompts x candidates; returns (generated non-pad tokens, seconds)."""
    sequences = [p for p in prompts for _ in range(num_candidates)]
    kwargs = dict(
        do_sample=True,
        num_beams=1,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        pad_token_id=tokenizer.pad_token_id,
    )
    if settings.top_k is not None:
        kwargs["top_k"] = settings.top_k
    tokens = 0
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(seed)
        for i in range(0, len(sequences), settings.batch_size):
            batch = tokenizer(
                sequences[i : i + settings.batch_size], return_tensors="pt", padding=True, padding_side="left"
            )
            out = model.generate(**batch, **kwargs)
            tokens += int((out[:, batch["input_ids"].shape[1] :] != tokenizer.pad_token_id).sum())
    return tokens, time.perf_counter() - start


def ours(model, tokenizer, prompts: list[str], num_candidates: int, settings: SamplingSettings, seed: int):
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    samples = sample_candidates(model, tokenizer, prompts, num_candidates, settings, generator)
    return count_tokens(samples), time.perf_counter() - start


def ours_row_seeded(model, tokenizer, prompts: list[str], num_candidates: int, settings: SamplingSettings, seed: int):
    row_seeds = [seed * 1_000_003 + k for k in range(len(prompts))]
    start = time.perf_counter()
    samples = sample_candidates(model, tokenizer, prompts, num_candidates, settings, None, row_seeds=row_seeds)
    return count_tokens(samples), time.perf_counter() - start


def ours_both_sides(
    model, tokenizer, prompts: list[str], num_candidates: int, settings: SamplingSettings, seed: int, one_pass: bool
):
    """Current and comparator sides of a ``current`` comparison: one ``sample_sides`` pass, or two calls."""
    seeds = [[seed * 1_000_003 + side * 1_009 + k for k in range(len(prompts))] for side in (0, 1)]
    start = time.perf_counter()
    if one_pass:
        sides = sample_sides(model, tokenizer, prompts, [num_candidates] * 2, settings, seeds)
    else:
        sides = [
            sample_candidates(model, tokenizer, prompts, num_candidates, settings, None, row_seeds=side_seeds)
            for side_seeds in seeds
        ]
    return sum(count_tokens(side) for side in sides), time.perf_counter() - start


def measure(
    model_source: str = "comlrl-lab/tiny",
    *,
    num_items: int = 16,
    num_candidates: int = 8,
    max_new_tokens: int = 32,
    batch_size: int = 64,
    repeats: int = 3,
    savings_off: Mapping[str, bool] | None = None,
) -> dict:
    """Median tokens/s of both sides over ``repeats`` alternating runs (after one warm-up run each).

    ``savings_off`` maps the names of ``SAMPLER_SAVINGS`` switched off to False (``sampler_savings_off``).
    """
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(model_source)
    model = load_model(model_source, device="cpu", dtype="float32").eval()
    prompts = task_prompts(num_items)
    savings = {name: True for name in SAMPLER_SAVINGS} | dict(savings_off or {})
    # sides_in_one_pass is this benchmark's choice of call, not a setting of the sampler.
    sides_in_one_pass = savings["sides_in_one_pass"]
    # CoMLRL's sampling defaults
    settings = SamplingSettings(
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        **{name: on for name, on in savings.items() if name in SETTINGS_FIELDS and name != "sides_in_one_pass"},
    )
    raw_generate(model, tokenizer, prompts[:2], 2, settings, 0)
    ours(model, tokenizer, prompts[:2], 2, settings, 0)
    ours_row_seeded(model, tokenizer, prompts[:2], 2, settings, 0)
    ours_both_sides(model, tokenizer, prompts[:2], 2, settings, 0, sides_in_one_pass)
    raw_rates, our_rates, raw_tokens, our_tokens = [], [], [], []
    row_rates, row_tokens, sides_rates = [], [], []
    for r in range(repeats):
        tokens, seconds = raw_generate(model, tokenizer, prompts, num_candidates, settings, seed=r)
        raw_rates.append(tokens / seconds)
        raw_tokens.append(tokens)
        tokens, seconds = ours(model, tokenizer, prompts, num_candidates, settings, seed=r)
        our_rates.append(tokens / seconds)
        our_tokens.append(tokens)
        tokens, seconds = ours_row_seeded(model, tokenizer, prompts, num_candidates, settings, seed=r)
        row_rates.append(tokens / seconds)
        row_tokens.append(tokens)
        tokens, seconds = ours_both_sides(model, tokenizer, prompts, num_candidates, settings, r, sides_in_one_pass)
        sides_rates.append(tokens / seconds)
    raw_rate, our_rate = statistics.median(raw_rates), statistics.median(our_rates)
    row_rate = statistics.median(row_rates)
    return {
        "model": model_source,
        "sequences": num_items * num_candidates,
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        "repeats": repeats,
        **savings,
        "raw_tokens": raw_tokens,
        "sampler_tokens": our_tokens,
        "raw_tokens_per_s": round(raw_rate, 1),
        "sampler_tokens_per_s": round(our_rate, 1),
        "ratio": round(our_rate / raw_rate, 3),
        "row_seeded_tokens": row_tokens,
        "row_seeded_tokens_per_s": round(row_rate, 1),
        "row_seeded_ratio": round(row_rate / raw_rate, 3),
        "both_sides_tokens_per_s": round(statistics.median(sides_rates), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="comlrl-lab/tiny", help="embedded name, directory or cached hub id")
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    add_sampler_switches(parser)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    if is_tiny_model_name(args.model) and not os.path.isfile(os.path.join(tiny_model_path(), "config.json")):
        print(f"skipped: the embedded tiny model has not been built yet ({tiny_model_path()} is missing)")
        return 0
    try:
        result = measure(
            args.model,
            num_items=args.items,
            num_candidates=args.candidates,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            repeats=args.repeats,
            savings_off=sampler_savings_off(args),
        )
    except ModelLoadError as exc:
        print(f"skipped: {exc}")
        return 0
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"model {result['model']}: {result['sequences']} sequences, max_new_tokens {result['max_new_tokens']}, "
        f"batch size {result['batch_size']}, median of {result['repeats']}, 1 thread, "
        + ", ".join(f"{name} {result[name]}" for name in SAMPLER_SAVINGS)
    )
    print(f"  (a) raw model.generate   {result['raw_tokens_per_s']:>10.1f} tokens/s")
    print(f"  (b) sample_candidates    {result['sampler_tokens_per_s']:>10.1f} tokens/s")
    print(f"  (c) row-seeded sampler   {result['row_seeded_tokens_per_s']:>10.1f} tokens/s")
    print(f"  (d) both sides, current  {result['both_sides_tokens_per_s']:>10.1f} tokens/s")
    print(f"  ratio (b)/(a)            {result['ratio']:>10.3f}   (target >= 0.8)")
    print(f"  ratio (c)/(a)            {result['row_seeded_ratio']:>10.3f}   (target >= 0.8)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
