"""One seed -> named, independent random streams. The only module that creates RNG state.

Every consumer asks for a stream by name ("pairs", "replay", "comparator", "generation", ...). Streams are
derived from (seed, name) with numpy's SeedSequence, so adding a new stream never shifts another one, and
comparator sampling never moves the training stream. The whole set can be saved and restored exactly, which
is what checkpoints and resume rely on.

It does not seed torch's global generator and never touches Python's global ``random``.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np


def _derive(seed: int, name: str) -> int:
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    entropy = [int(seed) & 0xFFFFFFFF, (int(seed) >> 32) & 0xFFFFFFFF, *np.frombuffer(digest[:16], dtype=np.uint32)]
    return int(np.random.SeedSequence([int(x) for x in entropy]).generate_state(2, dtype=np.uint64)[0] >> 1)


class RandomStreams:
    """Named ``random.Random`` and ``torch.Generator`` streams derived from one seed.

    ``python(name)`` gives a ``random.Random`` for list shuffles and draws; ``torch(name, device)`` gives a
    ``torch.Generator`` for sampling on that device. Both are created lazily and kept, so repeated calls
    continue the same stream.
    """

    def __init__(self, seed: int = 42):
        self.seed = int(seed)
        self._python: dict[str, random.Random] = {}
        self._torch: dict[tuple[str, str], Any] = {}

    def stream_seed(self, name: str) -> int:
        return _derive(self.seed, name)

    def python(self, name: str) -> random.Random:
        if name not in self._python:
            self._python[name] = random.Random(self.stream_seed(name))
        return self._python[name]

    def torch(self, name: str, device: Any = "cpu"):
        import torch

        device = torch.device(device)
        key = (name, str(device))
        if key not in self._torch:
            generator = torch.Generator(device=device)
            generator.manual_seed(self.stream_seed(f"{name}@{device}") & 0x7FFF_FFFF_FFFF_FFFF)
            self._torch[key] = generator
        return self._torch[key]

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "python": {name: rng.getstate() for name, rng in self._python.items()},
            "torch": {f"{name}|{device}": gen.get_state() for (name, device), gen in self._torch.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = int(state["seed"])
        self._python = {}
        for name, rng_state in state.get("python", {}).items():
            rng = random.Random()
            rng.setstate(_as_python_state(rng_state))
            self._python[name] = rng
        self._torch = {}
        for key, gen_state in state.get("torch", {}).items():
            name, device = key.split("|", 1)
            generator = self.torch(name, device)
            generator.set_state(gen_state)


def _as_python_state(state: Any) -> tuple:
    # JSON/torch.save round trips turn the inner tuple into a list.
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
