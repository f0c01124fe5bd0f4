"""The sampler's exact-maths savings as command-line switches, shared by ``collection.py`` and ``madpo_round.py``.

Each saving is on by default; ``--no-<name>`` switches it off, so on and off runs can be interleaved.
"""

from __future__ import annotations

import argparse

#: SamplingSettings field -> what switching it off does.
SAMPLER_SAVINGS = {
    "top_k_first": "row-seeded sampler: sort the whole vocabulary for top-p",
    "prefill_once": "prefill every (prompt, candidate) row instead of each distinct prompt once",
    "sides_in_one_pass": "sample a current comparison's current and comparator sides in two passes over the model",
    "own_decode_loop": "row-seeded sampler: transformers' generate, which feeds every row until the last one ends",
    "single_query_attention": "own decode loop: torch's CPU flash attention for its one-token steps",
    "shared_prefix_attention": "own decode loop: copy each prompt's KV cache into every candidate's row",
    "preallocated_cache": "own decode loop: grow each KV cache layer by concatenation, copying it every step",
}


def add_sampler_switches(parser: argparse.ArgumentParser) -> None:
    for name, off in SAMPLER_SAVINGS.items():
        parser.add_argument(
            f"--no-{name.replace('_', '-')}", dest=name, action="store_false", help=f"{off} (the saving off)"
        )


def sampler_savings_off(args: argparse.Namespace) -> dict[str, bool]:
    """The SamplingSettings overrides of the savings switched off on the command line."""
    return {name: False for name in SAMPLER_SAVINGS if not getattr(args, name)}
