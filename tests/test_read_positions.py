"""A decoder's last hidden states at the positions read: the full forward's values and gradients, with the last layer
run at those positions only, and the full forward for every model it does not serve."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from comlrl_lab.models.packing import pack_rows
from comlrl_lab.models.read_positions import hidden_states_at, last_positions_logits, serves
from comlrl_lab.trainers.preference.learning.reward_model import (
    JointRewardModel,
    last_token_index,
    mask_position_ids,
)

SIZES = dict(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, head_dim=8
)


def _llama(kv_heads: int = 4, attention: str = "sdpa", **extra) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(num_key_value_heads=kv_heads, initializer_range=0.3, **{**SIZES, **extra})
    config._attn_implementation = attention
    return LlamaForCausalLM(config).eval()


def _rows_seen(module: torch.nn.Module) -> list[int]:
    """Records how many token rows each call of ``module`` gets (its input's leading dimensions)."""
    seen: list[int] = []
    module.register_forward_hook(lambda _m, args, _out: seen.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    return seen


def _padded(side: str):
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, 64, (3, 9), generator=generator)
    mask = torch.ones(3, 9, dtype=torch.long)
    if side == "right":
        mask[1, 6:] = 0
        mask[2, 3:] = 0
    else:
        mask[1, :3] = 0
        mask[2, :6] = 0
    return input_ids, mask, mask_position_ids(mask), torch.arange(3), last_token_index(mask)


def _packed():
    """Two packed rows: a shared prefix and its continuations (block-causal), each continuation's last token read."""
    prefixes = [[5, 6, 7, 8], [9, 10]]
    branches = [[[11, 12, 13], [14, 15]], [[16], [17, 18, 19, 20], [21, 22]]]
    packed = pack_rows(prefixes, branches, pad_token_id=0, dtype=torch.float32)
    rows = torch.tensor([r for r, row in enumerate(branches) for _ in row])
    ends = torch.tensor(
        [s + len(b) - 1 for row, starts in zip(branches, packed.branch_starts) for b, s in zip(row, starts)]
    )
    return packed.input_ids, packed.attention_mask, packed.position_ids, rows, ends


def _unmasked():
    input_ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    return input_ids, torch.ones(2, 8, dtype=torch.long), None, torch.tensor([0, 1, 1]), torch.tensor([7, 2, 5])


INPUTS = {"right padding": lambda: _padded("right"), "left padding": lambda: _padded("left"), "packed": _packed}
INPUTS["no padding"] = _unmasked


def _values_and_gradients(model, inputs, *, read_positions_only: bool):
    model.zero_grad(set_to_none=True)
    values = hidden_states_at(model, *inputs, last_layer_at_read_positions=read_positions_only)
    weights = torch.linspace(-1.0, 1.0, values.numel()).reshape(values.shape)
    (values * weights).sum().backward()
    return values.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


# A head size other than hidden / heads, biases in every projection and llama3's rotary scaling.
UNUSUAL = dict(
    head_dim=16,
    attention_bias=True,
    mlp_bias=True,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
)


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("inputs", list(INPUTS))
@pytest.mark.parametrize("unusual", [False, True])
def test_the_last_layer_at_the_read_positions_gives_the_full_forwards_values_and_gradients(kv_heads, inputs, unusual):
    model = _llama(kv_heads, **(UNUSUAL if unusual else {}))
    if unusual:
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.normal_(parameter, std=0.5)
    assert serves(model)
    batch = INPUTS[inputs]()
    mlp_rows, query_rows, key_rows = (_rows_seen(m) for m in (model.model.layers[-1].mlp, *_projections(model)))

    values, gradients = _values_and_gradients(model, batch, read_positions_only=True)

    reads = len(batch[3])
    tokens = batch[0].numel()
    # The last layer's MLP and query projection ran at the read positions only; its keys and values everywhere.
    assert (mlp_rows, query_rows, key_rows) == ([reads], [reads], [tokens])
    full_values, full_gradients = _values_and_gradients(model, batch, read_positions_only=False)
    assert mlp_rows[-1] == tokens
    assert values.shape == (reads, 32)
    torch.testing.assert_close(values, full_values, atol=2e-5, rtol=1e-5)
    assert gradients.keys() == full_gradients.keys()
    assert len(gradients) == len(list(model.parameters())) - 1  # all but the LM head, which is never run
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, full_gradients[name], atol=1e-4, rtol=1e-4, msg=name)


def _projections(model):
    attention = model.model.layers[-1].self_attn
    return attention.q_proj, attention.k_proj


@pytest.mark.parametrize("inputs", ["right padding", "left padding", "packed"])
def test_the_last_positions_logits_are_a_forwards_with_logits_to_keep(inputs):
    model = _llama(kv_heads=2, **UNUSUAL)
    input_ids, mask, position_ids, _, _ = INPUTS[inputs]()
    keep = 4
    mlp_rows = _rows_seen(model.model.layers[-1].mlp)
    weights = torch.linspace(-1.0, 1.0, len(input_ids) * keep * 64).reshape(len(input_ids), keep, 64)

    ours = last_positions_logits(model, input_ids, mask, position_ids, keep)
    (ours * weights).sum().backward()
    our_gradients = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    full = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, logits_to_keep=keep).logits
    (full * weights).sum().backward()

    assert mlp_rows == [len(input_ids) * keep, input_ids.numel()]
    torch.testing.assert_close(ours, full, atol=2e-5, rtol=1e-5)
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(our_gradients[name], parameter.grad, atol=1e-4, rtol=1e-4, msg=name)


def test_a_wrapper_that_acts_around_the_call_is_not_served():
    peft = pytest.importorskip("peft")
    from comlrl_lab.models.lora import AdapterDisabled

    wrapped = peft.get_peft_model(_llama(), peft.LoraConfig(r=4, target_modules=["q_proj"]))
    assert serves(wrapped)
    assert not serves(AdapterDisabled(wrapped))  # it switches the adapters off around each call
    prefix = peft.get_peft_model(_llama(), peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    assert not serves(prefix)  # its wrapper adds the virtual tokens


def test_a_model_it_does_not_serve_runs_its_last_layer_everywhere_with_the_same_values():
    torch.manual_seed(0)
    qwen3 = Qwen3ForCausalLM(Qwen3Config(num_key_value_heads=2, **SIZES)).eval()  # q/k norms: not served
    dropout = _llama(attention_dropout=0.5).train()  # attention dropout in play
    hooked = _llama()
    hooked.model.layers[-1].self_attn.register_forward_hook(lambda *_: None)  # it would be skipped
    eager = _llama(attention="eager")
    assert not serves(qwen3) and not serves(dropout) and serves(dropout.eval()) and not serves(hooked)
    assert not serves(eager) and not serves(_llama(attention="flex_attention"))
    batch = _padded("right")
    mlp_rows = _rows_seen(qwen3.model.layers[-1].mlp)

    values = hidden_states_at(qwen3, *batch)

    assert mlp_rows == [batch[0].numel()]
    assert torch.equal(values, hidden_states_at(qwen3, *batch, last_layer_at_read_positions=False))


def test_a_lora_backbone_runs_its_adapted_last_layer_at_the_read_positions():
    peft = pytest.importorskip("peft")
    model = _llama(kv_heads=2)
    base_values = hidden_states_at(model, *_packed(), last_layer_at_read_positions=False).detach()
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, parameter in wrapped.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5, generator=torch.Generator().manual_seed(3))
    assert serves(wrapped)
    mlp_rows = _rows_seen(model.model.layers[-1].mlp)

    values = hidden_states_at(wrapped, *_packed())

    assert mlp_rows == [len(_packed()[3])]
    full = hidden_states_at(wrapped, *_packed(), last_layer_at_read_positions=False)
    torch.testing.assert_close(values, full, atol=2e-5, rtol=1e-5)
    assert (values - base_values).abs().max() > 0.1  # the adapter took part


def test_the_reward_model_runs_its_backbones_last_layer_once_per_scored_text(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    backbone = AutoModelForCausalLM.from_pretrained(model_dir)
    reward = JointRewardModel.from_backbone(
        backbone, AutoTokenizer.from_pretrained(model_dir), generator=torch.Generator().manual_seed(0), packed=True
    )
    mlp_rows = _rows_seen(backbone.model.layers[-1].mlp)
    prompts = [["Agent 1 writes.", "Agent 2 answers."]] * 3
    completions = [[" one", " two"], [" three", " four five"], [" six", " seven"]]

    packed_scores = reward.score_joint(prompts, completions)
    reward.packed = False
    padded_scores = reward.score_joint(prompts, completions)

    reward.last_layer_at_read_positions = False
    everywhere_scores = reward.score_joint(prompts, completions)

    assert mlp_rows[:2] == [3, 3] and mlp_rows[2] > 3 * 10  # every token of the three padded texts
    assert packed_scores == pytest.approx(padded_scores, abs=1e-5)
    assert everywhere_scores == pytest.approx(padded_scores, abs=1e-5)


def test_another_threads_forward_of_the_same_model_runs_whole_while_one_reads_positions():
    model = _llama()
    batch = _padded("right")
    expected = model(input_ids=batch[0], attention_mask=batch[1]).logits
    reading_started, other_done = threading.Event(), threading.Event()
    first = model.model.layers[0]

    def pause_the_reader(_module, _args):
        if threading.current_thread().name == "reader":
            reading_started.set()
            assert other_done.wait(30)

    first.register_forward_pre_hook(pause_the_reader)
    results = {}
    reader = threading.Thread(
        target=lambda: results.update(read=hidden_states_at(model, *batch)), name="reader", daemon=True
    )
    reader.start()
    assert reading_started.wait(30)  # the reader's stop hook is on the last layer now

    results["other"] = model(input_ids=batch[0], attention_mask=batch[1]).logits
    other_done.set()
    reader.join(30)

    assert torch.equal(results["other"], expected)
    assert results["read"].shape == (3, 32)
    assert not model.model.layers[-1]._forward_pre_hooks  # the reader's hook is gone
