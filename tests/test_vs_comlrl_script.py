"""benchmarks/vs_comlrl.py: its configs, its table against known numbers, the 86M model's size, and one run of the
worker on our side. CoMLRL's venv is never created here."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest
from repo_scripts import load_repo_script

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark():
    return load_repo_script("benchmarks/vs_comlrl.py", "vs_comlrl_benchmark")


def test_the_configs_are_the_issues_sizes():
    bench = load_benchmark()
    sizes = {
        name: (c.trainer, c.rounds, c.items, c.candidates, c.max_new_tokens, c.model)
        for name, c in bench.CONFIGS.items()
    }
    assert sizes == {
        "1": ("MADPOIter", 2, 8, 4, 16, "tiny"),
        "2": ("MADPOIter", 3, 32, 8, 32, "tiny"),
        "3": ("MARLHFIter", 3, 32, 8, 32, "tiny"),
        "4": ("MADPOIter", 1, 8, 4, 32, "llama86m"),
        "5": ("MADPOIter", 1, 8, 4, 32, "smollm2"),
    }
    assert bench.CONFIGS["4"].label() == "MADPOIter, 1 round, 8 items, 4 candidates, 32 tokens, random 86M Llama"
    assert bench.parse_configs(" 2,4 ") == ["2", "4"]
    assert bench.CONFIGS["5"].label().endswith("SmolLM2-135M-Instruct")
    # CoMLRL has no chat templates: on the real model our side renders the same plain prompts.
    assert bench.OURS_FIELDS_FOR_MODEL == {"smollm2": {"use_chat_template": False}}
    with pytest.raises(argparse.ArgumentTypeError, match="among 1, 2, 3, 4, 5"):
        bench.parse_configs("2,6")


def test_config_fields_build_our_configs_and_keep_the_reward_model_on_cpu():
    from comlrl_lab.trainers.preference import MADPOIterConfig, MARLHFIterConfig

    bench = load_benchmark()
    madpo = bench.config_fields(bench.CONFIGS["2"], "/m", "/r")
    assert madpo == dict(
        num_agents=2,
        num_iterations=3,
        preference_num_candidates=8,
        max_new_tokens=32,
        agent_devices="cpu",
        eval_interval=0,
        preference_replay_dir="/r",
    )
    MADPOIterConfig(**madpo)
    marlhf = bench.config_fields(bench.CONFIGS["3"], "/m", "/r")
    # CoMLRL's default reward_model_device is cuda:0, which fails on a CPU-only machine.
    assert marlhf == {**madpo, "reward_model_device": "cpu", "reward_model_name": "/m"}
    MARLHFIterConfig(**marlhf)


def run_time(bench, train, process, weights, system=0.1, faults=11000, user=None, mkl_branch="AVX2"):
    """A run of ``train`` seconds, ``system`` of it in the kernel; its user time makes up the rest unless given."""
    return bench.RunTime(
        train_seconds=train,
        process_seconds=process,
        weights=weights,
        user_seconds=round(train - system, 6) if user is None else user,
        system_seconds=system,
        page_faults=faults,
        mkl_branch=mkl_branch,
    )


def pair(bench, theirs, ours, before, after, others=0.1, system=((0.2, 13000), (0.1, 11000)), user=None):
    (their_system, their_faults), (our_system, our_faults) = system
    return bench.Pair(
        run_time(bench, theirs, theirs + 5, "aa", their_system, their_faults, user),
        run_time(bench, ours, ours + 4, "bb", our_system, our_faults, user),
        before,
        after,
        others,
        "comlrl",
    )


def test_table_gives_medians_ranges_the_ratio_of_medians_the_median_pair_and_the_load():
    bench = load_benchmark()
    a = [
        pair(bench, 3.0, 1.0, (0.2, 0.3, 0.3), (0.4, 0.3, 0.3)),
        pair(bench, 1.0, 0.5, (0.4, 0.3, 0.3), (1.1, 0.5, 0.4), others=0.25),  # moved by 0.7
        pair(bench, 2.0, 2.0, (1.1, 0.5, 0.4), (0.9, 0.5, 0.4)),
    ]
    b = [pair(bench, 9.0, 2.0, (0.1, 0.1, 0.1), (0.3, 0.1, 0.1), others=None)]
    # The ratio of the medians (6 / 2) and the median of the pairs' ratios (5, 2, 1.5) differ.
    c = [pair(bench, theirs, ours, (0.1, 0, 0), (0.2, 0, 0)) for theirs, ours in ((10.0, 2.0), (4.0, 2.0), (6.0, 4.0))]
    text = bench.table([("cfg A", a), ("cfg B", b), ("cfg C", c)], "train_seconds", max_drift=0.5)
    assert text.splitlines() == [
        "| Config | CoMLRL | comlrl-lab | speed-up | median pair | load (1 min) | others' CPU | flag |",
        "|---|---|---|---|---|---|---|---|",
        "| cfg A | 2.00 s [1.00, 3.00] | 1.00 s [0.50, 2.00] | 2.00x | 2.00x [1.00, 3.00] | 0.20-1.10 | 0.25 cores "
        "| load moved > 0.5 in 1 of 3 pairs |",
        "| cfg B | 9.00 s [9.00, 9.00] | 2.00 s [2.00, 2.00] | 4.50x | 4.50x [4.50, 4.50] | 0.10-0.30 | n/a |  |",
        "| cfg C | 6.00 s [4.00, 10.00] | 2.00 s [2.00, 4.00] | 3.00x | 2.00x [1.50, 5.00] | 0.10-0.20 | 0.10 cores |  |",
    ]
    process = bench.table([("cfg B", b)], "process_seconds", max_drift=0.5).splitlines()[-1]
    assert process.startswith("| cfg B | 14.00 s [14.00, 14.00] | 6.00 s [6.00, 6.00] | 2.33x | 2.33x [2.33, 2.33] |")
    assert bench.summarise([4.0, 1.0, 3.0, 2.0]) == bench.Summary(2.5, 1.0, 4.0)


def test_the_system_time_table_gives_each_sides_median_system_time_its_share_and_page_faults():
    bench = load_benchmark()
    runs = [
        pair(bench, 3.0, 0.6, (0.2, 0, 0), (0.3, 0, 0), system=((0.21, 13170), (0.18, 11633))),
        pair(bench, 3.5, 0.7, (0.2, 0, 0), (0.3, 0, 0), system=((0.25, 13263), (0.12, 11645))),
        pair(bench, 2.5, 0.8, (0.2, 0, 0), (0.3, 0, 0), system=((0.15, 13100), (0.16, 11700))),
    ]
    # Medians: CoMLRL 0.21 s of 3.00 s of CPU (7%), 13,170 faults; ours 0.16 s of 0.70 s (23%), 11,645 faults.
    assert bench.system_time_table([("cfg", runs)]).splitlines() == [
        "| Config | CoMLRL system CPU | CoMLRL page faults | comlrl-lab system CPU | comlrl-lab page faults |",
        "|---|---|---|---|---|",
        "| cfg | 0.21 s (7% of its CPU time) | 13,170 | 0.16 s (23% of its CPU time) | 11,645 |",
    ]
    # With two busy threads the CPU time is twice the wall-clock: the share is of the CPU time, not of train().
    doubled = [pair(bench, 1.0, 1.0, (0.2, 0, 0), (0.3, 0, 0), system=((0.5, 1), (1.5, 1)), user=0.5)]
    assert bench.system_time_table([("two", doubled)]).splitlines()[-1] == (
        "| two | 0.50 s (50% of its CPU time) | 1 | 1.50 s (75% of its CPU time) | 1 |"
    )
    assert runs[0].as_json(0.5)["comlrl_lab"] == {
        "train_seconds": 0.6,
        "process_seconds": 4.6,
        "weights": "bb",
        "user_seconds": 0.42,
        "system_seconds": 0.18,
        "page_faults": 11633,
        "mkl_branch": "AVX2",
    }


def test_the_mkl_line_names_each_sides_kernels_and_every_one_its_runs_reported():
    bench = load_benchmark()

    def run(branch):
        return run_time(bench, 1.0, 2.0, "aa", mkl_branch=branch)

    same = [bench.Pair(run("generic"), run("AVX-512 E1"), (0.1, 0, 0), (0.2, 0, 0), 0.0, "comlrl")] * 2
    assert bench.mkl_line(same) == "MKL's kernels: CoMLRL generic; comlrl-lab AVX-512 E1"
    mixed = same + [bench.Pair(run("AVX-512 E1"), run(None), (0.1, 0, 0), (0.2, 0, 0), 0.0, "comlrl")]
    assert bench.mkl_line(mixed) == "MKL's kernels: CoMLRL AVX-512 E1 / generic; comlrl-lab AVX-512 E1 / no MKL"


def test_the_pairs_alternate_which_side_runs_first_and_say_so():
    bench = load_benchmark()
    calls = []

    def run_side(side):
        calls.append(side)
        return run_time(bench, 2.0 if side == "comlrl" else 1.0, 3.0, side)

    pairs = [bench.run_pair(repeat, run_side) for repeat in range(3)]
    assert calls == ["comlrl", "comlrl_lab", "comlrl_lab", "comlrl", "comlrl", "comlrl_lab"]
    assert [p.first for p in pairs] == ["comlrl", "comlrl_lab", "comlrl"]
    assert [p.as_json(0.5)["first"] for p in pairs] == ["comlrl", "comlrl_lab", "comlrl"]
    # Whichever ran first, each side's run lands in its own slot.
    assert all((p.theirs.weights, p.ours.weights) == ("comlrl", "comlrl_lab") for p in pairs)
    assert all(len(p.load_before) == len(p.load_after) == 3 for p in pairs)


def test_a_side_whose_runs_trained_different_weights_is_flagged():
    bench = load_benchmark()
    runs = [pair(bench, 3.0, 1.0, (0.2, 0, 0), (0.3, 0, 0)) for _ in range(3)]
    for run, theirs in zip(runs, ["aa", "bb", "aa"], strict=True):
        run.theirs.weights, run.ours.weights = theirs, "cc"
    assert bench.distinct_weights(runs) == {"comlrl": 2, "comlrl_lab": 1}
    assert bench.table([("cfg", runs)], "train_seconds", max_drift=0.5).endswith(
        "| CoMLRL trained 2 different weights |"
    )
    runs[0].ours.weights = "dd"
    runs[1].load_after = (1.0, 0, 0)
    assert bench.table([("cfg", runs)], "train_seconds", max_drift=0.5).endswith(
        "| load moved > 0.5 in 1 of 3 pairs; CoMLRL trained 2 different weights; comlrl-lab trained 2 different "
        "weights |"
    )


def test_the_weights_fingerprint_reads_every_byte_in_agent_order_and_by_name():
    import copy

    import torch

    worker = load_repo_script("benchmarks/vs_comlrl_worker.py", "vs_comlrl_worker")
    torch.manual_seed(0)
    a = torch.nn.Linear(40, 30)  # 1,200 weights: more than a sampling fingerprint would read
    b = copy.deepcopy(a)
    fingerprint = worker.weights_fingerprint([a, b])
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    assert worker.weights_fingerprint([copy.deepcopy(a), copy.deepcopy(b)]) == fingerprint  # the values, not objects
    assert worker.weights_fingerprint([a]) != fingerprint
    with torch.no_grad():
        b.weight[17, 23] = torch.nextafter(b.weight[17, 23], torch.tensor(1.0))  # one bit of one weight
    changed = worker.weights_fingerprint([a, b])
    assert changed != fingerprint and worker.weights_fingerprint([b, a]) != changed  # the agents' order counts
    renamed = torch.nn.Sequential(copy.deepcopy(a))  # the same values under the name "0.weight"
    assert worker.weights_fingerprint([renamed]) != worker.weights_fingerprint([a])
    odd = torch.nn.Module()  # bf16, a 0-dim and a transposed (non-contiguous) parameter
    odd.bf16 = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    odd.scalar = torch.nn.Parameter(torch.tensor(2.0))
    odd.turned = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3).t())
    assert worker.weights_fingerprint([odd]) == worker.weights_fingerprint([copy.deepcopy(odd)])
    stored = copy.deepcopy(odd)
    stored.turned = torch.nn.Parameter(odd.turned.detach().contiguous())  # the same values, laid out row by row
    assert worker.weights_fingerprint([stored]) == worker.weights_fingerprint([odd])


def test_load_verdict_is_quiet_only_below_half_at_every_reading_and_counts_drifted_pairs():
    bench = load_benchmark()
    quiet = [
        pair(bench, 1, 1, (0.05, 0, 0), (0.45, 0, 0), others=0.02),
        pair(bench, 1, 1, (0.3, 0, 0), (0.49, 0, 0), others=0.04),
    ]
    verdict = bench.load_verdict(quiet, max_drift=0.5)
    assert verdict == bench.LoadVerdict(quiet=True, lowest=0.05, highest=0.49, drifted=0, pairs=2, others_cores=0.04)
    assert verdict.line(0.5) == (
        "Load: quiet (1-minute load 0.05 to 0.49, quiet means below 0.5 at every reading); no pair moved by more "
        "than 0.5; other processes took at most 0.04 cores."
    )
    # One reading at 0.5 is enough to lose "quiet"; a move of exactly the drift is not flagged, one past it is.
    loud = quiet + [pair(bench, 1, 1, (0.5, 0, 0), (1.0, 0, 0)), pair(bench, 1, 1, (1.0, 0, 0), (0.2, 0, 0))]
    verdict = bench.load_verdict(loud, max_drift=0.5)
    assert (verdict.quiet, verdict.highest, verdict.drifted, verdict.pairs) == (False, 1.0, 1, 4)
    assert "NOT quiet" in verdict.line(0.5) and "1 of 4 pairs moved by more than 0.5 (flagged)" in verdict.line(0.5)
    assert loud[3].as_json(0.5)["drifted"] is True and loud[2].as_json(0.5)["load_drift"] == 0.5


def test_others_cpu_is_the_machines_busy_time_less_this_process_and_its_children(monkeypatch):
    bench = load_benchmark()
    # Over 2 s of wall-clock the machine was busy 3 CPU-seconds, 1 of them this benchmark's own: others took 1 core.
    readings = {"busy": iter([100.0, 103.0]), "own": iter([10.0, 11.0]), "clock": iter([50.0, 52.0])}
    monkeypatch.setattr(bench, "machine_busy_seconds", lambda: next(readings["busy"]))
    monkeypatch.setattr(bench, "own_cpu_seconds", lambda: next(readings["own"]))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(readings["clock"]))
    loads = iter([(0.1, 0.2, 0.3), (0.4, 0.2, 0.3)])
    monkeypatch.setattr(bench, "read_load", lambda: next(loads))
    with bench.PairMeter() as meter:
        pass
    assert (meter.load_before, meter.load_after, meter.others_cores) == ((0.1, 0.2, 0.3), (0.4, 0.2, 0.3), 1.0)


def test_the_readings_come_from_this_machine():
    bench = load_benchmark()
    assert len(bench.read_load()) == 3
    assert bench.own_cpu_seconds() > 0
    busy = bench.machine_busy_seconds()
    assert busy is None or busy > 0


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: a second block that is never read
"""


def test_the_machine_line_names_the_cpu_its_cores_and_torchs_kernels():
    bench = load_repo_script("benchmarks/machine.py", "benchmark_machine")
    cpu = bench.cpu_identity(CPUINFO)
    assert cpu == {"model_name": "AMD EPYC", "vendor": "AuthenticAMD", "family": "26", "model": "2"}
    machine = {**cpu, "cpus": 2, "torch": "2.13.0+cpu", "capability": "AVX512", "blas": "mkl"}
    assert bench.machine_line(machine) == (
        "Machine: AMD EPYC (AuthenticAMD, family 26, model 2), 2 CPUs; torch 2.13.0+cpu, AVX512 kernels, BLAS mkl"
    )
    # Where /proc/cpuinfo says little (another OS, an ARM machine), the line still reads.
    bare = {"model_name": None, "vendor": None, "family": None, "model": None}
    assert bench.cpu_identity("Processor\t: ARMv8\n") == bare
    assert bench.machine_line({**machine, **bare, "blas": None}) == (
        "Machine: unknown CPU, 2 CPUs; torch 2.13.0+cpu, AVX512 kernels, BLAS unknown"
    )


def test_the_machine_description_reads_this_machine_and_this_torch():
    import torch

    machine = load_repo_script("benchmarks/machine.py", "benchmark_machine").machine_description()
    assert machine["cpus"] == os.cpu_count()
    assert machine["torch"] == torch.__version__
    assert machine["capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["blas"] is None or machine["blas"] in torch.__config__.show()


def test_ours_fields_are_read_by_the_field_codec():
    bench = load_benchmark()
    parse = bench.field_arg(bench.MARLHFIterConfig)
    assert parse("concurrent_cpu_agents=true") == ("concurrent_cpu_agents", True)
    assert parse("scoring_batch_size=16") == ("scoring_batch_size", 16)
    assert parse("adamw_implementation=loop") == ("adamw_implementation", "for_loop")  # the alias, resolved
    with pytest.raises(argparse.ArgumentTypeError, match="FIELD=VALUE"):
        parse("concurrent_cpu_agents")
    with pytest.raises(argparse.ArgumentTypeError, match="'sixteen' is not an int"):
        parse("scoring_batch_size=sixteen")
    with pytest.raises(argparse.ArgumentTypeError, match="did you mean 'concurrent_cpu_agents'"):
        parse("concurent_cpu_agents=true")


def test_the_llama_config_has_86m_parameters():
    import torch
    from transformers import LlamaForCausalLM

    bench = load_benchmark()
    config = bench.llama_86m_config(vocab_size=1307, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Per layer: q, k, v, o 4 x 768^2 = 2,359,296; MLP 3 x 768 x 2048 = 4,718,592; two norms 1,536 -> 7,079,424.
    # Twelve layers 84,953,088, embedding (tied head) 1,307 x 768 = 1,003,776, final norm 768.
    assert sum(p.numel() for p in model.parameters()) == 85_957_632


@pytest.mark.slow
def test_worker_trains_on_our_side_and_reports_its_time(tmp_path):
    from transformers import AutoModelForCausalLM

    from comlrl_lab.models.tiny_model import tiny_model_path

    bench = load_benchmark()
    small = bench.BenchConfig("MADPOIter", 1, 4, 4, 8, "tiny")  # big enough that the round has pairs to train on
    run = bench.run_worker(
        sys.executable,
        "comlrl_lab",
        small,
        tiny_model_path(),
        tmp_path / "run.log",
        threads=2,
        extra_fields={"concurrent_cpu_agents": True},
    )
    assert 0 < run.train_seconds < run.process_seconds
    # Training touches new pages, at least for AdamW's moments (how many faults that takes depends on the page size).
    assert isinstance(run.page_faults, int) and run.page_faults > 0
    # The CPU times are train()'s, not the whole process's (whose imports alone take seconds): at most its two threads
    # busy for its wall-clock. Their split is not asserted: where first touches are dear (a VM), the kernel's share of a
    # run this small can pass the user's.
    assert run.user_seconds > 0 and run.system_seconds >= 0
    assert run.user_seconds + run.system_seconds <= 2 * run.train_seconds + 0.05
    untrained = [AutoModelForCausalLM.from_pretrained(tiny_model_path()) for _ in range(2)]
    worker = load_repo_script("benchmarks/vs_comlrl_worker.py", "vs_comlrl_worker")
    assert len(run.weights) == 16 and run.weights != worker.weights_fingerprint(untrained)  # the trained agents'
    assert bench.RESULT_MARKER in (tmp_path / "run.log").read_text(encoding="utf-8")
    # Nothing steers MKL in either process: the worker reports the same code path as this one.
    mkl_kernels = load_repo_script("benchmarks/mkl_kernels.py", "mkl_kernels")
    assert run.mkl_branch == mkl_kernels.mkl_branch()
