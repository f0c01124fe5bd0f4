"""Benchmark: how much the API comparator's bounded concurrency saves against one-at-a-time requests.

A local recording server (tests/http_stub.py, 127.0.0.1 only) answers every request after a fixed
latency. We ask for C candidates in the anthropic format, which has no ``n`` and so costs one request per
candidate (CoMLRL sends them one after another), and report wall time / (C x latency): 1.0 is CoMLRL's
sequential time, lower is better. Usage::

    python benchmarks/api_concurrency.py [--candidates 64] [--latency 0.2] [--concurrency 8 64]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from http_stub import HttpStub, anthropic_messages, with_delay  # noqa: E402

from comlrl_lab.trainers.preference import MADPOIterConfig  # noqa: E402
from comlrl_lab.trainers.preference.comparators.api import ApiComparatorClient, ApiRequest  # noqa: E402


def measure(num_candidates: int = 64, latency: float = 0.2, max_concurrency: int = 8, num_prompts: int = 8) -> dict:
    """Time ``num_candidates`` candidates spread over ``num_prompts`` prompts; returns the timing and ratio."""
    per_prompt = [num_candidates // num_prompts + (i < num_candidates % num_prompts) for i in range(num_prompts)]
    with HttpStub() as stub:
        stub.route("/v1/messages", with_delay(anthropic_messages(), latency))
        config = MADPOIterConfig(
            comparator_policy="api",
            comparator_api_url=stub.url("/v1/messages"),
            comparator_api_format="anthropic",
            comparator_api_model="bench",
            comparator_api_key="bench-key",
            comparator_api_max_concurrency=max_concurrency,
        )
        client = ApiComparatorClient(config, rng=random.Random(0))
        requests = [ApiRequest(f"prompt {i}", i % 2, {}, count) for i, count in enumerate(per_prompt)]
        start = time.perf_counter()
        out = client.complete_many(requests)
        elapsed = time.perf_counter() - start
        got = sum(len(texts) for texts in out)
        http_requests = len(stub.requests)
    sequential = num_candidates * latency
    return {
        "candidates": got,
        "http_requests": http_requests,
        "latency_s": latency,
        "max_concurrency": max_concurrency,
        "elapsed_s": elapsed,
        "sequential_s": sequential,
        "ratio": elapsed / sequential,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    args = parser.parse_args(argv)
    print(
        f"API comparator concurrency ({os.cpu_count()} CPUs): {args.candidates} candidates, {args.latency:g} s latency"
    )
    for limit in args.concurrency:
        r = measure(args.candidates, args.latency, limit)
        print(
            f"max_concurrency={limit:3d}: {r['elapsed_s']:.3f} s for {r['candidates']} candidates "
            f"({r['http_requests']} requests) vs {r['sequential_s']:.1f} s sequential -> ratio {r['ratio']:.3f}"
        )


if __name__ == "__main__":
    main()
