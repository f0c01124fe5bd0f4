"""One timed training run for ``benchmarks/vs_comlrl.py``, written the way a CoMLRL user writes one.

The same file runs under CoMLRL 1.4.3 (``comlrl``, in its own venv) and under ours (``comlrl_lab``): it builds
the config from the same fields, loads two agents and their tokenizer with ``AutoModelForCausalLM`` /
``AutoTokenizer`` from one model directory, takes a built-in task's items, formatters and reward, and times
``trainer.train()``. One thread unless the spec says otherwise, W&B off. It is the one benchmark that builds its
trainer by hand rather than through ``comlrl_lab.engine.build_trainer``: the same file must run under CoMLRL, which
has no engine. Usage (the driver calls it)::

    python benchmarks/vs_comlrl_worker.py SPEC.json

SPEC holds ``package`` ("comlrl" or "comlrl_lab"), ``repo_root``, ``trainer`` ("MADPOIter" or "MARLHFIter"),
``model_dir``, ``task``, ``items``, ``seed``, ``config`` (the config fields) and ``threads`` (torch threads; 0
leaves torch's default, the machine's cores). The last stdout line is a JSON
object with ``train_seconds``, ``setup_seconds``, ``train_user_seconds``, ``train_system_seconds`` and
``train_page_faults`` (``train()``'s user and system CPU time, summed over the process's threads, and its minor plus
major page faults, from ``getrusage``), ``mkl_branch`` (the code path MKL chose for the process's matrix products,
``mkl_kernels.mkl_branch``), ``weights`` (a fingerprint of the trained
agents' parameters, taken after the timing, so the driver can tell whether runs of one side did the same work or only
took different times) and ``fingerprint_seconds`` (its own time, which the driver takes off the whole process's).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import random
import resource
import sys
import time

os.environ.setdefault("WANDB_MODE", "disabled")

RESULT_MARKER = "VS_COMLRL_RESULT "


def weights_fingerprint(agents) -> str:
    """The first 16 hex digits of a SHA-256 over every byte of every agent's parameters, in order of agent and name.

    Every byte, not a sample (as ``comlrl_lab.trainers.preference.runtime.fingerprint`` takes): this file also runs under
    CoMLRL, where comlrl_lab's trainers cannot be imported, and a change in one last bit must show."""
    import torch

    digest = hashlib.sha256()
    for agent in agents:
        for name, parameter in sorted(agent.named_parameters(), key=lambda named: named[0]):
            digest.update(name.encode())
            digest.update(parameter.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:16]


def main(spec_path: str) -> None:
    started = time.perf_counter()
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)

    package = importlib.import_module(f"{spec['package']}.trainers.preference")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = int(spec.get("threads", 1))
    if threads:  # 0 leaves torch's default: as many threads as the machine has cores
        torch.set_num_threads(threads)
    # The task module is pure Python (no torch, no comlrl_lab trainers), so the CoMLRL side imports it from the
    # checkout: both sides score with the same reward code.
    sys.path.insert(0, spec["repo_root"])
    from mkl_kernels import mkl_branch  # this script's folder, first on sys.path

    from comlrl_lab.data.tasks import get_task

    config_class = getattr(package, f"{spec['trainer']}Config")
    trainer_class = getattr(package, f"{spec['trainer']}Trainer")

    random.seed(spec["seed"])
    torch.manual_seed(spec["seed"])
    task = get_task(spec["task"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    agents = [AutoModelForCausalLM.from_pretrained(spec["model_dir"]) for _ in range(task.num_agents)]
    trainer = trainer_class(
        agents=agents,
        num_agents=task.num_agents,
        tokenizer=tokenizer,
        train_dataset=task.train_items()[: spec["items"]],
        reward_func=task.reward_func,
        formatters=list(task.formatters),
        args=config_class(**spec["config"]),
    )
    setup_seconds = time.perf_counter() - started

    before = resource.getrusage(resource.RUSAGE_SELF)
    train_started = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - train_started
    after = resource.getrusage(resource.RUSAGE_SELF)
    fingerprint_started = time.perf_counter()
    weights = weights_fingerprint(trainer.agents)
    result = {
        "train_seconds": train_seconds,
        "setup_seconds": setup_seconds,
        "train_user_seconds": after.ru_utime - before.ru_utime,
        "train_system_seconds": after.ru_stime - before.ru_stime,
        "train_page_faults": (after.ru_minflt - before.ru_minflt) + (after.ru_majflt - before.ru_majflt),
        "weights": weights,
        "mkl_branch": mkl_branch(),
        "fingerprint_seconds": time.perf_counter() - fingerprint_started,
    }
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
