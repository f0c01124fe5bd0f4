"""The one place trainers build their AdamW optimisers, so that every model gets the same implementation.

CoMLRL builds ``torch.optim.AdamW(params, lr)``, which on CPU runs the per-tensor Python loop. The same
update can run as one fused kernel (``fused=True``) or as multi-tensor ops (``foreach=True``): the same
maths, with the arithmetic ordered differently, so the weights after a step agree to float rounding, not
bit for bit. This module does not schedule learning rates or clip gradients.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def build_adamw(params: Iterable[torch.nn.Parameter], lr: float, implementation: str = "fused") -> torch.optim.AdamW:
    """AdamW (torch defaults: weight decay 0.01, betas (0.9, 0.999), eps 1e-8) with the asked implementation.

    ``"fused"`` falls back to ``"foreach"`` where torch has no fused kernel for the parameters' device or
    dtype; ``"for_loop"`` is CoMLRL's (and torch's CPU default) per-tensor loop. ``implementation`` is the config's
    ``adamw_implementation``, already resolved to one of its choices.
    """
    params = list(params)
    if implementation == "fused":
        try:
            return torch.optim.AdamW(params, lr=lr, fused=True)
        except RuntimeError:
            implementation = "foreach"  # no fused kernel here (device or dtype); multi-tensor is the next best
    if implementation == "foreach":
        return torch.optim.AdamW(params, lr=lr, foreach=True)
    return torch.optim.AdamW(params, lr=lr, foreach=False, fused=False)
