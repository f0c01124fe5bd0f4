"""Benchmark: two CPU agents one after the other, or one thread each (``concurrent_cpu_agents``).

One MADPOIter round (collect, select, train, evaluate) of two agents on the CPU, 8 items, 4 candidates,
16 new tokens, on a random Llama (``--size tiny``: hidden 32, 2 layers; ``small``: hidden 256, 4 layers),
with ``concurrent_cpu_agents`` off and on, interleaved (off-on, then on-off, ...), at ``--threads`` torch
intra-op threads (off: every agent uses them all in turn; on: each agent's thread gets threads / 2). It prints
the medians, their ratio (off / on: above 1 means the threads are faster), whether both gave the same pairs
and the largest weight difference after the round (0 at one thread; a few ulps when the split changes how
torch sums). The engine builds each trainer from an ``ExperimentSpec`` whose user task is this module: its
``ITEMS`` (written to a JSONL file), ``formatters`` and ``reward_func``. Usage::

    python benchmarks/cpu_agents.py [--size tiny|small] [--threads N] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from comlrl_lab.data.tasks.length_ratio import length_ratio_reward
from comlrl_lab.engine import ExperimentSpec, build_trainer
from comlrl_lab.names.run_ids import new_run_id
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

SIZES = {"tiny": (32, 64, 2, 4, 2), "small": (256, 688, 4, 8, 4)}
ITEMS = [{"prompt": f"the {w} cat"} for w in ("red", "blue", "green", "big", "small", "fast", "slow", "old")]

# This module is the runs' user task (the engine loads it by path): the reward and the agents' prompts.
reward_func = length_ratio_reward


def first_prompt(item: dict) -> str:
    return item["prompt"] + " one"


def second_prompt(item: dict) -> str:
    return item["prompt"] + " two"


formatters = [first_prompt, second_prompt]


def build_model(directory: Path, size: str) -> str:
    """A random Llama of ``size`` with the tests' word-level tokenizer, saved under ``directory``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = [
        "<pad>",
        "</s>",
        "<s>",
        "<unk>",
        "the",
        "cat",
        "one",
        "two",
        *[w for item in ITEMS for w in item["prompt"].split()],
    ]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words + [f"w{i}" for i in range(64)]))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", bos_token="<s>", unk_token="<unk>"
    )
    hidden, intermediate, layers, heads, kv_heads = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        initializer_range=0.3,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def one_round(model: str, items_file: Path, concurrent: bool) -> tuple[float, list, list[torch.Tensor]]:
    spec = ExperimentSpec(
        algorithm="MADPOIter",
        agent_models=[model, model],
        task=None,
        user_task=__file__,
        user_train_data=str(items_file),
        user_eval_data=str(items_file),
        max_eval_items=4,
        config=dict(
            num_iterations=1,
            preference_num_candidates=4,
            max_new_tokens=16,
            eval_num_samples=4,
            agent_devices="cpu",
            seed=7,
            concurrent_cpu_agents=concurrent,
        ),
    )
    sink = MemorySink()
    trainer = build_trainer(spec, output_dir=tempfile.mkdtemp(), run_id=new_run_id("cpu-agents"), sink=sink)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    pairs = [(p.item_index, p.winner_ids, p.loser_ids) for p in sink.pairs()]
    return seconds, pairs, [p.detach().clone() for m in trainer.agents for p in m.parameters()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workdir = Path(tempfile.mkdtemp())
    model = build_model(workdir / "model", args.size)
    items_file = workdir / "items.jsonl"
    items_file.write_text("".join(json.dumps(item) + "\n" for item in ITEMS), encoding="utf-8")
    times: dict[bool, list[float]] = {False: [], True: []}
    first: dict[bool, tuple[list, list[torch.Tensor]]] = {}
    for repeat in range(args.repeats):
        for concurrent in (False, True) if repeat % 2 == 0 else (True, False):
            seconds, pairs, weights = one_round(model, items_file, concurrent)
            times[concurrent].append(seconds)
            first.setdefault(concurrent, (pairs, weights))
    off, on = statistics.median(times[False]), statistics.median(times[True])
    diff = max((a - b).abs().max().item() for a, b in zip(first[False][1], first[True][1]))
    print(
        json.dumps(
            {
                "size": args.size,
                "threads": args.threads,
                "repeats": args.repeats,
                "median_s": {"one_after_the_other": off, "one_thread_each": on},
                "off_over_on": off / on,
                "same_pairs": first[False][0] == first[True][0],
                "max_weight_difference": diff,
                "runs_s": {"one_after_the_other": times[False], "one_thread_each": times[True]},
            }
        )
    )


if __name__ == "__main__":
    main()
