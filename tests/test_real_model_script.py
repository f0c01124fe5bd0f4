"""benchmarks/real_model.py on the embedded tiny model: each part runs through the trainer as it is built today
(the SmolLM2 figures themselves are the benchmark's, never a test's)."""

from __future__ import annotations

import argparse
import re
import tempfile

import torch
from repo_scripts import load_repo_script


def tiny_args(**overrides) -> argparse.Namespace:
    values = dict(
        model="comlrl-lab/tiny",
        task="length_ratio",
        items=2,
        candidates=4,
        max_new_tokens=6,
        batch_size=8,
        scoring_batch_size=None,
        repeats=1,
        threads=1,
        lora=False,
    )
    return argparse.Namespace(**{**values, **overrides})


def test_the_train_step_part_times_our_update_and_the_raw_step_on_the_same_pairs(monkeypatch):
    bench = load_repo_script("benchmarks/real_model.py", "real_model_benchmark")
    changed = {"raw": 0}
    plain_raw_step = bench.raw_step

    def counting_raw_step(models, optimizers, batch):
        before = [p.detach().clone() for p in models[0].parameters()]
        plain_raw_step(models, optimizers, batch)
        changed["raw"] += any(not torch.equal(a, p) for a, p in zip(before, models[0].parameters()))

    monkeypatch.setattr(bench, "raw_step", counting_raw_step)
    ours, raw, pairs = bench.train_step(tiny_args())
    assert pairs > 0 and ours > 0 and raw > 0
    assert changed["raw"] >= 1  # the raw side really stepped the agent's weights


def test_the_bf16_part_builds_bfloat16_agents():
    bench = load_repo_script("benchmarks/real_model.py", "real_model_benchmark")
    with tempfile.TemporaryDirectory() as tmp:
        trainer = bench.build_trainer(tiny_args(), tmp, dtype="bfloat16")
        assert {p.dtype for model in trainer.agents for p in model.parameters()} == {torch.bfloat16}


def test_the_scoring_micro_batch_defaults_to_the_batch_and_can_be_smaller():
    bench = load_repo_script("benchmarks/real_model.py", "real_model_benchmark")
    with tempfile.TemporaryDirectory() as tmp:
        assert bench.build_trainer(tiny_args(), tmp).args.scoring_batch_size == 8
    with tempfile.TemporaryDirectory() as tmp:
        assert bench.build_trainer(tiny_args(scoring_batch_size=2), tmp).args.scoring_batch_size == 2


def test_every_figure_is_printed_under_the_machine_line_with_the_load_it_was_taken_at(capsys):
    bench = load_repo_script("benchmarks/real_model.py", "real_model_benchmark")
    argv = ["--model", "tiny", "--parts", "collection", "--items", "2", "--candidates", "2", "--max-new-tokens", "4"]
    assert bench.main([*argv, "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Machine: ") and " CPUs; torch " in lines[0]
    (figure,) = [line for line in lines if line.startswith("collection: ")]
    assert re.search(r"ratio \d+\.\d\d \(target >= 0\.9\)  \[load \d+\.\d\d \d+\.\d\d \d+\.\d\d\]$", figure)
