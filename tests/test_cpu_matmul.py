"""cpu_matmul="onednn": large fp32 CPU linears on oneDNN, the rest on torch's BLAS, and the trainer's switch."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from test_fast_paths import SETTINGS

from comlrl_lab.models import cpu_matmul
from comlrl_lab.models.cpu_matmul import OneDNNLinear, routes_to_onednn, use_onednn_linears
from comlrl_lab.names import metric_names as M
from comlrl_lab.trainers.preference import MADPOConfig
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

pytestmark = pytest.mark.skipif(not cpu_matmul.onednn_available(), reason="this torch has no oneDNN linear")


def _layer_and_input(batch_shape, inputs, outputs, bias, seed=0):
    generator = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(inputs, outputs, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(outputs, inputs, generator=generator) / inputs**0.5)
        if bias:
            layer.bias.copy_(torch.randn(outputs, generator=generator))
    x = torch.randn(*batch_shape, inputs, generator=generator)
    return layer, x


def _output_and_grads(layer, x):
    x = x.clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    out = layer(x)
    # A weighting that is not symmetric, so a transposed gradient would not pass.
    (out * torch.linspace(-1, 2, out.shape[-1])).sum().backward()
    grads = [x.grad] + [p.grad for p in layer.parameters()]
    return out.detach(), grads


@pytest.mark.parametrize("bias", [True, False])
def test_a_large_product_on_onednn_matches_the_blas_forward_and_backward(bias, monkeypatch):
    # 2 rows x 90 tokens x 576 in x 1536 out: SmolLM2's MLP, 159 M multiply-adds.
    layer, x = _layer_and_input((2, 90), 576, 1536, bias)
    expected = _output_and_grads(layer, x)
    layer.__class__ = OneDNNLinear
    assert routes_to_onednn(x, layer.weight)
    shapes = []
    original = cpu_matmul._onednn_product
    monkeypatch.setattr(cpu_matmul, "_onednn_product", lambda a, w: shapes.append((a.shape, w.shape)) or original(a, w))
    got = _output_and_grads(layer, x)
    # The forward, the input's gradient g @ W and the weight's g^T @ x, as (rows, in) x (out, in) products.
    assert shapes == [((180, 576), (1536, 576)), ((180, 1536), (576, 1536)), ((1536, 180), (576, 180))]
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-4)
    assert len(got[1]) == len(expected[1]) == (3 if bias else 2)
    for a, b in zip(got[1], expected[1]):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-3)


def test_a_small_product_stays_on_the_blas_bit_for_bit():
    layer, x = _layer_and_input((2, 37), 128, 384, bias=False)  # the tiny model's MLP: 2.8 M multiply-adds
    expected = _output_and_grads(layer, x)
    layer.__class__ = OneDNNLinear
    assert not routes_to_onednn(x, layer.weight)
    got = _output_and_grads(layer, x)
    assert torch.equal(got[0], expected[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))


def test_only_fp32_cpu_products_from_the_threshold_up_go_to_onednn(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "MIN_MULTIPLY_ADDS", 6 * 4 * 5)
    weight = torch.zeros(5, 4)
    assert routes_to_onednn(torch.zeros(2, 3, 4), weight)  # 6 rows x 4 x 5: exactly the threshold
    assert not routes_to_onednn(torch.zeros(5, 4), weight)  # one row short
    assert not routes_to_onednn(torch.zeros(2, 3, 4, dtype=torch.float64), weight.double())
    assert not routes_to_onednn(torch.zeros(2, 3, 4, dtype=torch.bfloat16), weight.bfloat16())
    assert not routes_to_onednn(torch.zeros(2, 3, 4, device="meta"), weight)


def _saved_and_products(layer, x, monkeypatch):
    """Shapes autograd saved for a forward + backward of ``layer`` on ``x``, and the oneDNN products it ran."""
    products = []
    original = cpu_matmul._onednn_product
    monkeypatch.setattr(cpu_matmul, "_onednn_product", lambda a, w: products.append(tuple(w.shape)) or original(a, w))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        out = layer(x)
    out.sum().backward()
    return saved, products


def test_frozen_weights_and_inputs_without_grad_get_no_gradient_and_keep_nothing_alive(monkeypatch):
    layer, x = _layer_and_input((180,), 576, 576, bias=True)
    layer.__class__ = OneDNNLinear
    layer.weight.requires_grad_(False)  # a LoRA adapter's frozen base layer
    x.requires_grad_(True)
    saved, products = _saved_and_products(layer, x, monkeypatch)
    # As F.linear: the weight for the input's gradient, and not the input, which only a weight gradient needs.
    assert saved == [(576, 576)] and products == [(576, 576), (576, 576)]
    assert layer.weight.grad is None and x.grad is not None and layer.bias.grad is not None

    layer.weight.requires_grad_(True)
    saved, products = _saved_and_products(layer, x.detach(), monkeypatch)
    assert saved == [(180, 576)] and len(products) == 2  # the forward and the weight's gradient
    assert layer.weight.grad is not None


def test_one_dimensional_and_strided_inputs_give_the_blas_answer(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "MIN_MULTIPLY_ADDS", 0)
    layer, x = _layer_and_input((6, 4), 32, 24, bias=True)
    for value in (x[0, 0], x.transpose(0, 1), x[:, ::2]):
        expected = _output_and_grads(layer, value)
        onednn = copy.deepcopy(layer)
        onednn.__class__ = OneDNNLinear
        got = _output_and_grads(onednn, value)
        assert got[0].shape == expected[0].shape
        torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)
        for a, b in zip(got[1], expected[1]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_second_order_gradient_is_refused_not_silently_zero(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "MIN_MULTIPLY_ADDS", 0)
    layer, x = _layer_and_input((3,), 8, 8, bias=False)
    layer.__class__ = OneDNNLinear
    x.requires_grad_(True)
    (grad,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()


def test_cpu_autocast_keeps_torchs_own_linear(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "MIN_MULTIPLY_ADDS", 0)
    layer, x = _layer_and_input((3,), 8, 8, bias=False)
    assert routes_to_onednn(x, layer.weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not routes_to_onednn(x, layer.weight)
        layer.__class__ = OneDNNLinear
        assert layer(x).dtype == torch.bfloat16


def test_the_switch_changes_plain_linears_only_and_keeps_weights_state_and_copies():
    class Quantised(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), Quantised(8, 2), torch.nn.Linear(2, 2))
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    assert use_onednn_linears(model) == 2
    assert [type(m).__name__ for m in model] == ["OneDNNLinear", "ReLU", "Quantised", "OneDNNLinear"]
    assert list(model.state_dict()) == list(state)
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in state.items())
    assert type(copy.deepcopy(model)[3]) is OneDNNLinear
    assert use_onednn_linears(model) == 0  # already done


def test_without_onednn_the_switch_says_so(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "onednn_available", lambda: False)
    with pytest.raises(RuntimeError, match="cpu_matmul='onednn' needs a torch built with oneDNN"):
        use_onednn_linears(torch.nn.Linear(2, 2))


def test_the_trainer_sends_its_cpu_agents_large_products_to_onednn_and_still_learns(
    make_trainer, tmp_path, monkeypatch
):
    # The tiny model's products are all below the threshold; lowered here, every one of them goes to oneDNN.
    monkeypatch.setattr(cpu_matmul, "MIN_MULTIPLY_ADDS", 0)
    products = {"collect": 0, "select": 0, "train": 0}
    layer_calls = dict(products)
    phase = "collect"
    original = cpu_matmul._onednn_product

    def counted(x, weight):
        products[phase] += 1
        return original(x, weight)

    monkeypatch.setattr(cpu_matmul, "_onednn_product", counted)
    trainer = make_trainer("MADPO", tmp_path, SETTINGS, cpu_matmul="onednn")
    linears = [m for agent in trainer.agents for m in agent.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is OneDNNLinear for m in linears)
    for linear in linears:
        linear.register_forward_hook(lambda *_: layer_calls.__setitem__(phase, layer_calls[phase] + 1))
    trainer.sink = sink = MemorySink()
    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    for phase in ("collect", "select", "train"):
        trainer.step(phase)
    # Sampling: one product per layer call. Training: each layer call's product, then its input's and its weight's
    # gradient products in the backward (every input and weight here needs a gradient).
    assert products["collect"] == layer_calls["collect"] > 0
    assert products["train"] == 3 * layer_calls["train"] > 0
    losses = [m["value"] for records in sink.phases for m in records.metrics if m["name"] == M.MADPO_LOSS]
    assert losses and all(math.isfinite(value) for value in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.agents[0].parameters()))


def test_the_default_leaves_the_agents_linears_alone(make_trainer, tmp_path):
    assert MADPOConfig().cpu_matmul == "torch"
    trainer = make_trainer("MADPO", tmp_path, SETTINGS)
    assert not any(type(m) is OneDNNLinear for agent in trainer.agents for m in agent.modules())


def test_onednn_product_is_the_plain_product():
    x, weight = torch.randn(300, 64), torch.randn(96, 64)
    torch.testing.assert_close(cpu_matmul._onednn_product(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-4)


def test_lora_adapters_train_over_onednn_base_layers(make_trainer, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_matmul, "MIN_MULTIPLY_ADDS", 0)
    trainer = make_trainer("MADPO", tmp_path, SETTINGS, cpu_matmul="onednn", lora_r=4)
    agent = trainer.agents[0]
    bases = [m.base_layer for m in agent.modules() if hasattr(m, "base_layer") and hasattr(m, "lora_A")]
    assert bases and all(type(base) is OneDNNLinear for base in bases)
    adapters = {name: p.detach().clone() for name, p in agent.named_parameters() if p.requires_grad}
    frozen = {name: p.detach().clone() for name, p in agent.named_parameters() if not p.requires_grad}
    for phase in ("collect", "select", "train"):
        trainer.step(phase)
    after = dict(agent.named_parameters())
    assert any(not torch.equal(after[name], value) for name, value in adapters.items())
    assert all(torch.equal(after[name], value) for name, value in frozen.items())


def test_marlhf_trains_its_agents_over_onednn_and_leaves_its_reward_model_alone(make_trainer, tmp_path, monkeypatch):
    from test_marlhf import SETTINGS as MARLHF_SETTINGS

    monkeypatch.setattr(cpu_matmul, "MIN_MULTIPLY_ADDS", 0)
    trainer = make_trainer("MARLHF", tmp_path, MARLHF_SETTINGS, cpu_matmul="onednn", sink=(sink := MemorySink()))
    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    trainer.train()
    # The policy-gradient loss scores every token through the agents' oneDNN linears and their backward.
    losses = [value for _, value in sink.metric("rl/loss")]
    assert losses and all(math.isfinite(value) for value in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.agents[0].parameters()))
    reward_model = trainer.learner.reward_model
    assert any(isinstance(m, torch.nn.Linear) for m in reward_model.modules())
    assert not any(type(m) is OneDNNLinear for m in reward_model.modules())
