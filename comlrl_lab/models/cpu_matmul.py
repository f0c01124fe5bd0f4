"""Large fp32 linear products on the CPU through oneDNN's kernels instead of torch's BLAS (``cpu_matmul="onednn"``).

A CPU ``nn.Linear`` calls torch's BLAS (MKL in the PyPI wheels). On an AMD EPYC with AVX-512, MKL's generic kernels
ran SmolLM2-135M's fp32 products at 67-92 GFLOP/s on one thread, against 143-203 through the oneDNN kernels that ship
inside the same torch (``benchmarks/cpu_gemm.py``). On an Intel CPU, where MKL runs its own AVX-512 kernels, oneDNN is
no faster: measure first. oneDNN builds a kernel
for each new shape (0.7-2.4 ms there, then cached), and a batch's lengths change every call, so only products of at
least ``MIN_MULTIPLY_ADDS`` go to it; smaller ones stay on the BLAS, bit for bit. oneDNN sums in another order, so
its products differ from the BLAS's in the last bits.

``torch.ops.mkldnn._linear_pointwise`` is the op torch's own compiler emits for CPU linears; it has no backward, so
``_OneDNNLinearFunction`` gives it one out of the same op (the input's gradient is g @ W, the weight's g^T @ x).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

#: Products below this many multiply-adds (rows x in x out) stay on torch's BLAS. A rough line, measured on one
#: thread: a new shape's oneDNN kernel took 0.7-2.4 ms to build, a 20 M multiply-add product about 0.5 ms on MKL,
#: so smaller products rarely win back the build. The tiny model crosses it only in forwards of more than about 120
#: tokens (its head, 128 x 1,307), 400 (its MLP) or 1,200 (its attention).
MIN_MULTIPLY_ADDS = 20_000_000


@functools.cache
def _linear_op():
    try:
        return torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):
        return None


def onednn_available() -> bool:
    """Whether this torch has oneDNN on the CPU and the linear op that uses it."""
    return torch.backends.mkldnn.is_available() and _linear_op() is not None


def _onednn_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (n, in) @ weight (out, in)^T -> (n, out), on oneDNN."""
    return _linear_op()(x, weight, None, "none", [], "")


class _OneDNNLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        out = _onednn_product(rows, weight)
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        x, weight, bias = inputs
        # Only what a gradient needs, as F.linear saves: a frozen weight (a LoRA base) keeps no input alive.
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, weight if ctx.needs_input_grad[0] else None)
        ctx.has_bias = bias is not None
        ctx.x_shape = x.shape

    @staticmethod
    @torch.autograd.function.once_differentiable  # the op has no derivative of its own: a second order would be 0
    def backward(ctx: Any, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_rows = grad.reshape(-1, grad.shape[-1])  # (n, out)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_product(grad_rows, weight.t()).reshape(ctx.x_shape)  # g @ W
        if ctx.needs_input_grad[1]:
            grad_weight = _onednn_product(grad_rows.t(), x.reshape(-1, x.shape[-1]).t())  # g^T @ x
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_rows.sum(0)
        return grad_x, grad_weight, grad_bias


def routes_to_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``OneDNNLinear`` sends this product to oneDNN: fp32 on the CPU, outside CPU autocast (where F.linear
    would compute in the autocast dtype), and at least ``MIN_MULTIPLY_ADDS``."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.dim() == 0:
        return False
    if torch.is_autocast_enabled("cpu"):
        return False
    return x.numel() * weight.shape[0] >= MIN_MULTIPLY_ADDS


class OneDNNLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose large fp32 CPU products run on oneDNN; every other call is ``F.linear``'s."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if routes_to_onednn(input, self.weight):
            return _OneDNNLinearFunction.apply(input, self.weight, self.bias)
        return F.linear(input, self.weight, self.bias)


def use_onednn_linears(model: Any) -> int:
    """Make every plain ``nn.Linear`` in ``model`` a ``OneDNNLinear``; the number changed.

    Only the class changes, in place (a model object the caller passed in changes too): the parameters, the state
    dict, hooks and a LoRA wrapper's base layer stay as they are, and a copy of the model (a frozen reference, a
    current-policy copy) keeps the class. Subclasses of ``nn.Linear`` (quantised layers, for one) are left alone.
    """
    if not onednn_available():
        raise RuntimeError(
            "cpu_matmul='onednn' needs a torch built with oneDNN (torch.backends.mkldnn); this one has none."
        )
    changed = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = OneDNNLinear
            changed += 1
    return changed
