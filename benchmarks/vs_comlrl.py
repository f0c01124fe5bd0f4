"""Side by side with CoMLRL 1.4.3: the same CoMLRL-style script and config, one thread each, interleaved runs.

For each config, ``benchmarks/vs_comlrl_worker.py`` runs once with CoMLRL (installed in a venv of its own that
this script creates; CoMLRL is never a dependency of the project) and once with comlrl-lab, interleaved (A B, B A,
A B, ...) ``--repeats`` times, so that a change in the machine's load hits both sides alike. Each run is a
fresh process with one thread and W&B off. It reports the wall-clock of ``trainer.train()`` and of the whole
process (imports and model loading included): medians, min and max, CoMLRL's median over ours, and the median of
the pairs' own ratios with their min and max (a pair's two runs are close in time, so its ratio moves less with the
machine than the medians of runs far apart).

The configs (all on the built-in ``length_ratio`` task, two agents, the Iter trainers' defaults otherwise:
comparator ``current``, replay ``current``, temperature 0.6, top-p 0.6, top-k 50, no evaluation):

1. MADPOIter, 2 rounds, 8 items, 4 candidates, 16 tokens, the embedded tiny model;
2. MADPOIter, 3 rounds, 32 items, 8 candidates, 32 tokens, tiny model;
3. MARLHFIter, the sizes of 2 (reward model and RL on the tiny model too);
4. MADPOIter, 1 round, 8 items, 4 candidates, 32 tokens, a random 86M Llama (``LlamaConfig``, seed 0, the tiny
   model's tokenizer), built once into a temporary folder and used by both sides;
5. MADPOIter, 1 round, 8 items, 4 candidates, 32 tokens, SmolLM2-135M-Instruct: both sides load the folder that
   ``comlrl-lab models add smollm2-135m-instruct`` converted (skipped when it is not registered). CoMLRL has no
   chat templates, so ours gets ``use_chat_template=false``: the same prompts, the same maths.

Usage::

    python benchmarks/vs_comlrl.py [--configs 1,2,3,4,5] [--repeats 3] [--venv .bench/comlrl-venv] [--json OUT]
                                   [--threads 1] [--ours FIELD=VALUE ...] [--max-load-drift 0.5]
                                   [--settle-below LOAD] [--comlrl-keeps-freed-memory]

``--threads 0`` gives both sides torch's default thread count (the machine's cores), and ``--ours
concurrent_cpu_agents=true`` measures our agents in threads of their own against CoMLRL as it runs by default.
Our trainers set glibc's malloc thresholds themselves (``keep_freed_host_memory``); ``--comlrl-keeps-freed-memory``
gives CoMLRL's process the same thresholds through ``GLIBC_TUNABLES``, so the ratio shows what is left without them.

**MKL's kernels.** Each run reports the code path MKL chose by itself (``mkl_kernels.py``), and the tables name both
sides'. Neither side's choice is steered: both multiply with the kernels MKL picks for the CPU, so the ratio is the
code's alone.

**The load.** Before and after each pair of runs (one of each side) it reads the load average
(``os.getloadavg()``) and, from ``/proc/stat``, how much CPU other processes took while the pair ran (the machine's
busy time less this benchmark's own, in cores). Every figure is printed with them; a pair whose 1-minute load moved
by more than ``--max-load-drift`` (0.5) is flagged in the table and the JSON, and a last line says whether the whole
measurement counts as quiet (1-minute load below 0.5 at every reading). The 1-minute load counts this benchmark's
own busy thread too, so after a long run it climbs towards 1 on an otherwise idle machine; ``--settle-below 0.5``
waits before each pair (at most ``--settle-max`` seconds) until it has fallen below 0.5, and the others' CPU is the
figure that this benchmark does not inflate.

**The order.** CoMLRL runs first in pairs 1, 3, 5, ... and ours in pairs 2, 4, ..., so whatever favours a pair's first
run (a CPU rested while the load settled, say) falls on both sides alike when ``--repeats`` is even (with an odd
number CoMLRL goes first once more); the JSON names each pair's ``first`` side.

**The work.** Each run also reports a fingerprint of the weights it trained (taken after ``train()``'s timing, and its
own time taken off the whole process's). A side whose runs ended with different weights is flagged in the table, and
the JSON gives each config's ``distinct_weights``. At one thread each run of a side does the same arithmetic, so
different weights mean different work (more or fewer generated tokens, say), and its times then differ by more than
the machine; with more threads (``--threads 0``, ``concurrent_cpu_agents``) sums may also be ordered differently from
run to run, and the flag says no more than that the last bits differ.

**System time and page faults.** Each run also reports the user and system CPU time and the page faults (minor plus
major) of its ``train()``, from ``getrusage`` around it; they are printed with each pair and as a table of medians
(``system_time_table``). README, "`train()`'s system time and page faults", says what they showed on one machine.

The CPU, its logical CPUs, torch's CPU kernels and BLAS are printed with the tables and written to the JSON
(``machine``): the ratio depends on them, not only on the code and the load.

The first run creates the venv (``python -m venv``, then ``pip install torch==<ours> comlrl==1.4.3
transformers==<ours>``: a few minutes). Absolute times move with the machine's load; the ratios of interleaved
runs much less.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from field_args import field_arg
from machine import machine_description, machine_line

from comlrl_lab.models.host_memory import glibc_tunables
from comlrl_lab.trainers.preference import MARLHFIterConfig

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "benchmarks" / "vs_comlrl_worker.py"
RESULT_MARKER = "VS_COMLRL_RESULT "
COMLRL_VERSION = "1.4.3"
DEFAULT_VENV = ROOT / ".bench" / "comlrl-venv"
LOG_DIR = ROOT / ".bench" / "vs-comlrl-logs"
SIDES = ("comlrl", "comlrl_lab")
SIDE_NAMES = {"comlrl": "CoMLRL", "comlrl_lab": "comlrl-lab"}
TASK = "length_ratio"
SEED = 0


@dataclass(frozen=True)
class BenchConfig:
    trainer: str  # "MADPOIter" or "MARLHFIter"
    rounds: int
    items: int
    candidates: int
    max_new_tokens: int
    model: str  # a key of MODEL_LABELS

    def label(self) -> str:
        model = MODEL_LABELS[self.model]
        rounds = f"{self.rounds} round" + ("s" if self.rounds != 1 else "")
        return (
            f"{self.trainer}, {rounds}, {self.items} items, {self.candidates} candidates, "
            f"{self.max_new_tokens} tokens, {model}"
        )


CONFIGS: dict[str, BenchConfig] = {
    "1": BenchConfig("MADPOIter", 2, 8, 4, 16, "tiny"),
    "2": BenchConfig("MADPOIter", 3, 32, 8, 32, "tiny"),
    "3": BenchConfig("MARLHFIter", 3, 32, 8, 32, "tiny"),
    "4": BenchConfig("MADPOIter", 1, 8, 4, 32, "llama86m"),
    "5": BenchConfig("MADPOIter", 1, 8, 4, 32, "smollm2"),
}
MODEL_LABELS = {"tiny": "tiny model", "llama86m": "random 86M Llama", "smollm2": "SmolLM2-135M-Instruct"}
# CoMLRL renders a task's prompt as it is; a real model's chat template would give our side other prompts.
OURS_FIELDS_FOR_MODEL = {"smollm2": {"use_chat_template": False}}

# About 86M parameters: 12 layers of 7.08M (attention 4 x 768^2, SwiGLU MLP 3 x 768 x 2048) and the tiny
# tokenizer's 1,307-token embedding, tied to the head.
LLAMA_86M = dict(
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=12,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


def config_fields(bench: BenchConfig, model_dir: str, replay_dir: str) -> dict:
    """The config fields both sides get: CoMLRL's names, nothing of ours."""
    fields = dict(
        num_agents=2,
        num_iterations=bench.rounds,
        preference_num_candidates=bench.candidates,
        max_new_tokens=bench.max_new_tokens,
        agent_devices="cpu",
        eval_interval=0,
        preference_replay_dir=replay_dir,
    )
    if bench.trainer == "MARLHFIter":
        # CoMLRL's reward_model_device defaults to cuda:0; with model objects as agents it needs a name to load.
        fields.update(reward_model_device="cpu", reward_model_name=model_dir)
    return fields


def llama_86m_config(vocab_size: int, pad_token_id: int, bos_token_id: int, eos_token_id: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        **LLAMA_86M,
    )


def build_llama_86m(target: Path) -> Path:
    """A random 86M Llama (seed 0) with the tiny model's tokenizer, saved to ``target``."""
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    from comlrl_lab.models.tiny_model import tiny_model_path

    tiny = Path(tiny_model_path())
    tiny_config = AutoConfig.from_pretrained(tiny)
    config = llama_86m_config(
        tiny_config.vocab_size, tiny_config.pad_token_id, tiny_config.bos_token_id, tiny_config.eos_token_id
    )
    torch.manual_seed(SEED)
    LlamaForCausalLM(config).save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, target / name)
    return target


def ensure_comlrl_venv(venv: Path) -> Path:
    """The venv's python, creating the venv with CoMLRL and our torch/transformers versions when missing."""
    python = venv / "bin" / "python"
    probe = "import importlib.metadata as m; print(m.version('comlrl'))"
    if python.exists():
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip() == COMLRL_VERSION:
            return python
    import torch
    import transformers

    # An exact torch pin: a bare "torch" would resolve to the multi-gigabyte CUDA build.
    torch_version = torch.__version__.split("+")[0]
    print(f"creating {venv} (CoMLRL {COMLRL_VERSION}, torch {torch_version}, transformers {transformers.__version__})")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            f"torch=={torch_version}",
            f"comlrl=={COMLRL_VERSION}",
            f"transformers=={transformers.__version__}",
        ],
        check=True,
    )
    return python


@dataclass
class RunTime:
    train_seconds: float
    process_seconds: float
    weights: str  # the worker's fingerprint of the trained parameters: at one thread, equal runs did the same work
    user_seconds: float  # train()'s CPU time in user space, summed over the process's threads
    system_seconds: float  # train()'s CPU time in the kernel (page faults, system calls), summed over the threads
    page_faults: int  # train()'s minor plus major page faults
    mkl_branch: str | None  # the code path MKL chose for the process's matrix products (None: torch without MKL)


QUIET_LOAD = 0.5  # a 1-minute load average below this at every reading makes a quiet measurement


def pair_order(repeat: int) -> tuple[str, ...]:
    """The sides of pair ``repeat`` (counted from 0) in the order they run: CoMLRL first at repeats 0, 2, ..., ours at
    1, 3, ..., so that whatever favours a pair's first run (a CPU rested while the load settled) falls on both sides
    alike over an even number of pairs."""
    return SIDES if repeat % 2 == 0 else SIDES[::-1]


def read_load() -> tuple[float, float, float]:
    """The 1-, 5- and 15-minute load averages."""
    return tuple(round(value, 2) for value in os.getloadavg())


def machine_busy_seconds() -> float | None:
    """CPU seconds all cores have spent busy since boot (``/proc/stat``), or None where there is no such file."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user..steal; guest is already in user


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of the finished runs it waited for."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@dataclass
class Pair:
    """One interleaved pair of runs (CoMLRL's and ours, in ``pair_order``) and the machine's load around it."""

    theirs: RunTime
    ours: RunTime
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    others_cores: float | None  # CPU other processes took during the pair, in cores; None without /proc/stat
    first: str  # the side that ran first

    @property
    def load_drift(self) -> float:
        return round(abs(self.load_after[0] - self.load_before[0]), 2)

    def as_json(self, max_drift: float) -> dict:
        return {
            "comlrl": vars(self.theirs),
            "comlrl_lab": vars(self.ours),
            "load_before": list(self.load_before),
            "load_after": list(self.load_after),
            "load_drift": self.load_drift,
            "drifted": self.load_drift > max_drift,
            "others_cores": self.others_cores,
            "first": self.first,
        }


class PairMeter:
    """Reads the load before a pair and, after it, the load and the other processes' share of the CPU."""

    def __enter__(self) -> PairMeter:
        self.load_before = read_load()
        self.busy, self.own, self.started = machine_busy_seconds(), own_cpu_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self.started
        busy = machine_busy_seconds()
        own = own_cpu_seconds() - self.own
        self.load_after = read_load()
        self.others_cores = (
            None if busy is None or self.busy is None else round(max(0.0, (busy - self.busy - own) / wall), 2)
        )


def settle(below: float, max_wait: float, poll: float = 5.0) -> float:
    """Wait until the 1-minute load is below ``below`` or ``max_wait`` seconds have passed; the seconds waited."""
    started = time.perf_counter()
    while os.getloadavg()[0] >= below and time.perf_counter() - started < max_wait:
        time.sleep(poll)
    return time.perf_counter() - started


@dataclass(frozen=True)
class LoadVerdict:
    """What the load readings of a measurement say about it."""

    quiet: bool  # every 1-minute reading below QUIET_LOAD
    lowest: float
    highest: float
    drifted: int  # pairs whose 1-minute load moved by more than the allowed drift
    pairs: int
    others_cores: float | None  # the most CPU other processes took during one pair, in cores

    def line(self, max_drift: float) -> str:
        quiet = "quiet" if self.quiet else "NOT quiet"
        others = "" if self.others_cores is None else f"; other processes took at most {self.others_cores:.2f} cores"
        drift = (
            f"{self.drifted} of {self.pairs} pairs moved by more than {max_drift} (flagged)"
            if self.drifted
            else f"no pair moved by more than {max_drift}"
        )
        return (
            f"Load: {quiet} (1-minute load {self.lowest:.2f} to {self.highest:.2f}, quiet means below {QUIET_LOAD} at "
            f"every reading); {drift}{others}."
        )


def load_verdict(pairs: list[Pair], max_drift: float) -> LoadVerdict:
    readings = [p.load_before[0] for p in pairs] + [p.load_after[0] for p in pairs]
    others = [p.others_cores for p in pairs if p.others_cores is not None]
    return LoadVerdict(
        quiet=max(readings) < QUIET_LOAD,
        lowest=min(readings),
        highest=max(readings),
        drifted=sum(p.load_drift > max_drift for p in pairs),
        pairs=len(pairs),
        others_cores=max(others) if others else None,
    )


def run_worker(
    python: str,
    side: str,
    bench: BenchConfig,
    model_dir: str,
    log_path: Path,
    *,
    threads: int = 1,
    extra_fields: dict | None = None,
    extra_env: dict | None = None,
) -> RunTime:
    """One fresh process of the worker; its stderr and stdout go to ``log_path``.

    ``threads`` torch threads (0: torch's own default, the machine's cores); ``extra_fields`` are added to this
    side's config (our own fields, such as ``concurrent_cpu_agents``, for our side only); ``extra_env`` is added to its
    environment."""
    with tempfile.TemporaryDirectory(prefix="vs-comlrl-run-") as workdir:
        spec = {
            "package": side,
            "repo_root": str(ROOT),
            "trainer": bench.trainer,
            "model_dir": model_dir,
            "task": TASK,
            "items": bench.items,
            "seed": SEED,
            "config": {
                **config_fields(bench, model_dir, str(Path(workdir) / "preference_replay")),
                **(extra_fields or {}),
            },
            "threads": threads,
        }
        spec_path = Path(workdir) / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        env = {**os.environ, "WANDB_MODE": "disabled", **(extra_env or {})}
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.pop(name, None)
            if threads:
                env[name] = str(threads)
        # Our side imports the checkout under test; the CoMLRL side gets it only for the task module.
        env["PYTHONPATH"] = str(ROOT) if side == "comlrl_lab" else ""
        started = time.perf_counter()
        with open(log_path, "w", encoding="utf-8") as log:
            done = subprocess.run(
                [python, str(WORKER), str(spec_path)],
                cwd=workdir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        process_seconds = time.perf_counter() - started
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(done.stdout)
    results = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if done.returncode != 0 or not results:
        raise RuntimeError(f"{side} run failed (exit {done.returncode}); see {log_path}")
    result = json.loads(results[-1][len(RESULT_MARKER) :])
    # The fingerprint is the benchmark's own work, not the run's: it does not count in the whole process's time.
    return RunTime(
        train_seconds=result["train_seconds"],
        process_seconds=process_seconds - result["fingerprint_seconds"],
        weights=result["weights"],
        user_seconds=result["train_user_seconds"],
        system_seconds=result["train_system_seconds"],
        page_faults=result["train_page_faults"],
        mkl_branch=result["mkl_branch"],
    )


def run_config_side(
    pythons: dict,
    bench: BenchConfig,
    model_dir: str,
    log_dir: Path,
    name: str,
    repeat: int,
    threads: int,
    ours: dict,
    extra_envs: dict[str, dict],
    side: str,
) -> RunTime:
    """One run of ``side`` in pair ``repeat`` of config ``name``: our fields for ours, ``extra_envs[side]`` for each."""
    return run_worker(
        pythons[side],
        side,
        bench,
        model_dir,
        log_dir / f"config{name}-{side}-{repeat + 1}.log",
        threads=threads,
        extra_fields={**OURS_FIELDS_FOR_MODEL.get(bench.model, {}), **ours} if side == "comlrl_lab" else None,
        extra_env=extra_envs.get(side),
    )


def run_pair(repeat: int, run_side) -> Pair:
    """Pair ``repeat`` (from 0): ``run_side(side)`` -> ``RunTime`` for each side in ``pair_order(repeat)``, inside one
    ``PairMeter``."""
    order = pair_order(repeat)
    with PairMeter() as meter:
        runs = {side: run_side(side) for side in order}
    return Pair(
        runs["comlrl"], runs["comlrl_lab"], meter.load_before, meter.load_after, meter.others_cores, first=order[0]
    )


@dataclass(frozen=True)
class Summary:
    median: float
    low: float
    high: float


def summarise(values: list[float]) -> Summary:
    return Summary(statistics.median(values), min(values), max(values))


def distinct_weights(pairs: list[Pair]) -> dict[str, int]:
    """Per side, how many different trained weights its runs ended with: 1 when every run did the same work, so that
    their times differ only by the machine."""
    return {
        "comlrl": len({p.theirs.weights for p in pairs}),
        "comlrl_lab": len({p.ours.weights for p in pairs}),
    }


def table(rows: list[tuple[str, list[Pair]]], seconds: str, max_drift: float) -> str:
    """A Markdown table: per row a label and its pairs; CoMLRL's and our ``seconds`` ("train_seconds" or
    "process_seconds") as medians with [min, max], the ratio of the medians, the median of the pairs' own ratios with
    [min, max] (each pair ran close in time, so it moves less with the machine), the 1-minute load before and after the
    pairs ([lowest, highest] reading) and the other processes' CPU, and a flag when a pair's load drifted or a side's
    runs trained different weights."""
    lines = [
        "| Config | CoMLRL | comlrl-lab | speed-up | median pair | load (1 min) | others' CPU | flag |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, pairs in rows:
        a = summarise([getattr(p.theirs, seconds) for p in pairs])
        b = summarise([getattr(p.ours, seconds) for p in pairs])
        ratios = summarise([getattr(p.theirs, seconds) / getattr(p.ours, seconds) for p in pairs])
        loads = [p.load_before[0] for p in pairs] + [p.load_after[0] for p in pairs]
        others = [p.others_cores for p in pairs if p.others_cores is not None]
        others_text = f"{max(others):.2f} cores" if others else "n/a"
        drifted = sum(p.load_drift > max_drift for p in pairs)
        flags = [f"load moved > {max_drift} in {drifted} of {len(pairs)} pairs"] if drifted else []
        flags += [
            f"{SIDE_NAMES[side]} trained {count} different weights"
            for side, count in distinct_weights(pairs).items()
            if count > 1
        ]
        flag = "; ".join(flags)
        lines.append(
            f"| {label} | {a.median:.2f} s [{a.low:.2f}, {a.high:.2f}] | {b.median:.2f} s [{b.low:.2f}, {b.high:.2f}] "
            f"| {a.median / b.median:.2f}x | {ratios.median:.2f}x [{ratios.low:.2f}, {ratios.high:.2f}] "
            f"| {min(loads):.2f}-{max(loads):.2f} | {others_text} | {flag} |"
        )
    return "\n".join(lines)


def system_time_table(rows: list[tuple[str, list[Pair]]]) -> str:
    """A Markdown table of ``train()``'s system CPU time and page faults: per side the median system time, its share
    of the median CPU time (user plus system, so that it stays a share with more than one thread), and the median
    count of page faults."""
    lines = [
        "| Config | CoMLRL system CPU | CoMLRL page faults | comlrl-lab system CPU | comlrl-lab page faults |",
        "|---|---|---|---|---|",
    ]
    for label, pairs in rows:
        cells = []
        for runs in ([p.theirs for p in pairs], [p.ours for p in pairs]):
            system = statistics.median(r.system_seconds for r in runs)
            share = system / statistics.median(r.user_seconds + r.system_seconds for r in runs)
            faults = statistics.median(r.page_faults for r in runs)
            cells += [f"{system:.2f} s ({share:.0%} of its CPU time)", f"{faults:,.0f}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mkl_line(pairs: list[Pair]) -> str:
    """The code paths MKL chose in each side's runs (several when they differed between runs)."""

    def paths(side: str) -> str:
        found = sorted({getattr(pair, side).mkl_branch or "no MKL" for pair in pairs})
        return " / ".join(found) or "no runs"

    return f"MKL's kernels: CoMLRL {paths('theirs')}; comlrl-lab {paths('ours')}"


def parse_configs(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in CONFIGS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"configs are among {', '.join(CONFIGS)}; got {text!r}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=parse_configs, default=list(CONFIGS), help="comma-separated: 1,2,3,4,5")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side and config, interleaved")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="CoMLRL's venv (created when missing)")
    parser.add_argument("--json", type=Path, default=None, help="also write every run's times and loads here")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per run, both sides (0: torch's default, the cores)"
    )
    parser.add_argument(
        "--ours",
        action="append",
        type=field_arg(MARLHFIterConfig),  # it has every field the configs have
        default=[],
        metavar="FIELD=VALUE",
        help="a config field for our side only, e.g. concurrent_cpu_agents=true; repeatable",
    )
    parser.add_argument(
        "--max-load-drift",
        type=float,
        default=0.5,
        help="flag a pair whose 1-minute load average moved by more than this between before and after",
    )
    parser.add_argument(
        "--settle-below",
        type=float,
        default=None,
        metavar="LOAD",
        help="before each pair, wait until the 1-minute load average is below LOAD (at most --settle-max seconds)",
    )
    parser.add_argument("--settle-max", type=float, default=180.0, help="the longest wait of --settle-below, s")
    parser.add_argument(
        "--comlrl-keeps-freed-memory",
        action="store_true",
        help="give CoMLRL's process the malloc thresholds ours sets itself (keep_freed_host_memory), as GLIBC_TUNABLES",
    )
    args = parser.parse_args()
    ours = dict(args.ours)
    comlrl_env = None
    if args.comlrl_keeps_freed_memory:  # added to any tunables already in the environment
        comlrl_env = {"GLIBC_TUNABLES": ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"), glibc_tunables()]))}
    extra_envs = {"comlrl": comlrl_env} if comlrl_env else {}
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.max_load_drift < 0:
        parser.error("--max-load-drift must be >= 0")

    pythons = {"comlrl": str(ensure_comlrl_venv(args.venv)), "comlrl_lab": sys.executable}
    from comlrl_lab.models.registry import SMOLLM2_135M_INSTRUCT, registered_path
    from comlrl_lab.models.tiny_model import tiny_model_path

    rows: list[tuple[str, list[Pair]]] = []
    machine = machine_description()
    print(machine_line(machine), flush=True)
    raw: dict = {"machine": machine, "max_load_drift": args.max_load_drift, "configs": {}}
    with tempfile.TemporaryDirectory(prefix="vs-comlrl-") as tmp:
        log_dir = LOG_DIR
        log_dir.mkdir(parents=True, exist_ok=True)
        big_model = None
        for name in args.configs:
            bench = CONFIGS[name]
            if bench.model == "tiny":
                model_dir = tiny_model_path()
            elif bench.model == "smollm2":
                model_dir = registered_path(SMOLLM2_135M_INSTRUCT.name)
                if model_dir is None:
                    print(f"[{name}] skipped: comlrl-lab models add {SMOLLM2_135M_INSTRUCT.name} first", flush=True)
                    continue
                model_dir = str(model_dir)
            else:
                big_model = big_model or str(build_llama_86m(Path(tmp) / "llama86m"))
                model_dir = big_model
            pairs: list[Pair] = []
            for repeat in range(args.repeats):
                if args.settle_below is not None:
                    waited = settle(args.settle_below, args.settle_max)
                    print(f"[{name}] waited {waited:.0f} s for the load to settle: {read_load()}", flush=True)
                run_side = functools.partial(
                    run_config_side, pythons, bench, model_dir, log_dir, name, repeat, args.threads, ours, extra_envs
                )
                pair = run_pair(repeat, run_side)
                pairs.append(pair)
                flag = "  FLAGGED: load moved" if pair.load_drift > args.max_load_drift else ""
                print(
                    f"[{name}] pair {repeat + 1} ({SIDE_NAMES[pair.first]} first): train CoMLRL "
                    f"{pair.theirs.train_seconds:.2f} s, ours "
                    f"{pair.ours.train_seconds:.2f} s ({pair.theirs.train_seconds / pair.ours.train_seconds:.2f}x); "
                    f"system CPU CoMLRL {pair.theirs.system_seconds:.2f} s ({pair.theirs.page_faults:,} page "
                    f"faults), ours {pair.ours.system_seconds:.2f} s ({pair.ours.page_faults:,}); "
                    f"process {pair.theirs.process_seconds:.2f} s, {pair.ours.process_seconds:.2f} s; load "
                    f"{pair.load_before} -> {pair.load_after}, others' CPU {pair.others_cores} cores; weights "
                    f"{pair.theirs.weights}, {pair.ours.weights}{flag}",
                    flush=True,
                )
            label = bench.label()
            rows.append((label, pairs))
            raw["configs"][name] = {
                "label": label,
                "pairs": [p.as_json(args.max_load_drift) for p in pairs],
                "distinct_weights": distinct_weights(pairs),
            }
            # Each config's rows as soon as it is done: a long run interrupted later still leaves them.
            print(
                f"[{name}] train()\n{table(rows[-1:], 'train_seconds', args.max_load_drift)}\n"
                f"[{name}] train()'s system CPU time and page faults\n{system_time_table(rows[-1:])}\n"
                f"[{name}] process\n{table(rows[-1:], 'process_seconds', args.max_load_drift)}\n"
                f"[{name}] {mkl_line(pairs)}",
                flush=True,
            )
            if args.json is not None:
                args.json.write_text(json.dumps(raw, indent=2), encoding="utf-8")

    verdict = load_verdict([p for _, pairs in rows for p in pairs], args.max_load_drift)
    raw["load"] = {**vars(verdict), "quiet_below": QUIET_LOAD}
    if args.json is not None:
        args.json.write_text(json.dumps(raw, indent=2), encoding="utf-8")
    threads = "torch's default threads" if args.threads == 0 else f"{args.threads} thread{'s' * (args.threads > 1)}"
    extra = f"; ours with {', '.join(f'{k}={v}' for k, v in ours.items())}" if ours else ""
    if args.comlrl_keeps_freed_memory:
        extra += f"; CoMLRL with GLIBC_TUNABLES={comlrl_env['GLIBC_TUNABLES']}"
    print(
        f"\n`trainer.train()` wall-clock, median [min, max] of {args.repeats} interleaved runs per side, {threads}{extra}."
    )
    print(machine_line(machine))
    print(mkl_line([p for _, pairs in rows for p in pairs]) + "\n")
    print(table(rows, "train_seconds", args.max_load_drift))
    print("\n`train()`'s system CPU time and page faults (medians):\n")
    print(system_time_table(rows))
    print("\nWhole process (imports, model loading and training):\n")
    print(table(rows, "process_seconds", args.max_load_drift))
    print("\n" + verdict.line(args.max_load_drift))


if __name__ == "__main__":
    main()
