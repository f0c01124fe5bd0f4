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

    ``cuda_offset`` is for data-parallel ranks that each own a slice of the GPUs: a stream on ``cuda:i`` is
    named (seeded, saved) after ``cuda:(i - cuda_offset)``, the rank's own numbering, so every rank draws the
    same numbers and a checkpoint resumes on any rank layout.
    """

    def __init__(self, seed: int = 42, *, cuda_offset: int = 0):
        self.seed = int(seed)
        self.cuda_offset = int(cuda_offset)
        self._python: dict[str, random.Random] = {}
        self._torch: dict[tuple[str, str], Any] = {}

    def stream_seed(self, name: str) -> int:
        return _derive(self.seed, name)

    def _logical(self, device: Any) -> str:
        if device.type == "cuda" and device.index is not None and self.cuda_offset:
            return f"cuda:{device.index - self.cuda_offset}"
        return str(device)

    def _physical(self, name: str) -> str:
        if name.startswith("cuda:") and self.cuda_offset:
            return f"cuda:{int(name.split(':', 1)[1]) + self.cuda_offset}"
        return name

    def python(self, name: str) -> random.Random:
        if name not in self._python:
            self._python[name] = random.Random(self.stream_seed(name))
        return self._python[name]

    def torch(self, name: str, device: Any = "cpu"):
        import torch

        device = torch.device(device)
        logical = self._logical(device)
        key = (name, logical)
        if key not in self._torch:
            generator = torch.Generator(device=device)
            generator.manual_seed(self.stream_seed(f"{name}@{logical}") & 0x7FFF_FFFF_FFFF_FFFF)
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
            generator = self.torch(name, self._physical(device))
            generator.set_state(gen_state)


def _as_python_state(state: Any) -> tuple:
    # JSON/torch.save round trips turn the inner tuple into a list.
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
