"""keep_freed_host_memory: glibc's malloc keeps freed tensor memory for reuse, once per process, unless told not to."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from comlrl_lab.models import host_memory
from comlrl_lab.models.host_memory import glibc_tunables, user_tuned_malloc

GLIBC = os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc") if hasattr(os, "confstr") else False

# A KV cache grown one position a step as a decode loop concatenates it (256 rows, 4 heads of 32, 4 layers' worth):
# each step allocates a slightly larger tensor and frees the previous one. Prints the page faults it took.
GROWING_CACHE = """
import json, resource, sys, torch
from comlrl_lab.models.host_memory import keep_freed_host_memory
outcome = keep_freed_host_memory() if sys.argv[1] == "keep" else "not called"
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
start = faults()
for call in range(6):
    cache = torch.ones(256 * 4 * 32, 30)
    for step in range(32):
        cache = torch.cat([cache, torch.ones(256 * 4 * 32, 1)], dim=1)
print(json.dumps({"outcome": outcome, "again": keep_freed_host_memory() if outcome == "set" else None,
                  "faults": faults() - start}))
"""


def run_growing_cache(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD") and "MALLOC_" not in k}
    done = subprocess.run(
        [sys.executable, "-c", GROWING_CACHE, mode],
        env={**clean, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_kept_memory_spares_the_page_faults_of_a_growing_cache():
    kept, default = run_growing_cache("keep"), run_growing_cache("default")
    assert (kept["outcome"], kept["again"]) == ("set", "already set")
    # 6 x 32 steps of 4-5 MiB tensors: by default glibc unmaps or trims most of them and faults the pages in again
    # (about 74,000 faults here); kept, the pages are faulted in once (about 10,000).
    assert kept["faults"] * 3 < default["faults"], (kept, default)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_the_users_own_malloc_settings_are_left_alone():
    tuned = run_growing_cache("keep", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1048576")
    assert tuned["outcome"] == "skipped: GLIBC_TUNABLES sets malloc options"


def test_what_counts_as_malloc_tuned_by_the_user():
    assert user_tuned_malloc({}) is None
    assert user_tuned_malloc({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4096"}) is None
    assert user_tuned_malloc({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == "GLIBC_TUNABLES sets malloc options"
    assert user_tuned_malloc({"MALLOC_TRIM_THRESHOLD_": "0"}) == "MALLOC_TRIM_THRESHOLD_ is set"
    assert user_tuned_malloc({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == "LD_PRELOAD loads jemalloc"
    assert user_tuned_malloc({"LD_PRELOAD": "/usr/lib/libfoo.so"}) is None


def test_the_tunables_string_carries_the_thresholds_mallopt_sets():
    assert glibc_tunables() == "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=67108864"


@pytest.mark.parametrize("keep", [True, False])
def test_a_trainer_sets_the_thresholds_before_its_first_phase_unless_told_not_to(make_trainer, tmp_path, monkeypatch, keep):
    from comlrl_lab.trainers.preference import base

    calls = []
    monkeypatch.setattr(base, "keep_freed_host_memory", lambda: calls.append("set") or "set")
    trainer = make_trainer("MADPO", tmp_path, keep_freed_host_memory=keep)
    assert calls == []  # building a trainer leaves malloc alone
    trainer.step()
    assert calls == (["set"] if keep else [])


def test_the_outcome_is_remembered_for_the_process(monkeypatch):
    monkeypatch.setattr(host_memory, "_outcome", None)
    monkeypatch.setattr(host_memory, "_glibc", lambda: False)
    assert host_memory.keep_freed_host_memory() == "skipped: malloc is not glibc's"
    monkeypatch.setattr(host_memory, "_glibc", lambda: True)
    assert host_memory.keep_freed_host_memory() == "skipped: malloc is not glibc's"  # decided once
