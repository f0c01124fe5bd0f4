"""Large-model options on the tiny random model: LoRA adapters (trained, saved and reloaded alone, base shared)
and gradient checkpointing (same update, less memory)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_madpo_script import DIST
from trainer_fixtures import build_trainer

from comlrl_lab.models.loading import load_model
from comlrl_lab.models.lora import (
    AdapterDisabled,
    LoraSettings,
    apply_lora,
    is_adapter_model,
    load_adapter_model,
    reference_scoring,
)
from comlrl_lab.models.scoring import sequence_logps
from comlrl_lab.trainers.preference.comparators.local import HISTORY_ADAPTER

pytest.importorskip("peft")


def logps(model, trainer, pairs, agent):
    with torch.no_grad():
        return sequence_logps(
            model,
            [p.prompt_ids[agent] for p in pairs] * 2,
            [p.winner_ids[agent] for p in pairs] + [p.loser_ids[agent] for p in pairs],
            pad_token_id=trainer.context.pad_token_id(agent),
            score_final_token=True,
            micro_batch_size=16,
        )


#: The trainers here are dist_madpo_script's MADPOIter (history comparator, lambda-decay replay), one round, LoRA.
LORA = dict(lora_r=4, lora_alpha=8.0, lora_target_modules=["q_proj", "v_proj"], num_iterations=1)


@pytest.fixture(scope="module")
def lora_run(model_dir, tmp_path_factory):
    """One MADPOIter round with LoRA against the history comparator, checkpointed after every phase."""
    out = tmp_path_factory.mktemp("lora")
    trainer = build_trainer("MADPOIter", model_dir, out, DIST, LORA)
    trainer.checkpoint_dir = out / "ckpt"
    trainer.train()
    return trainer, out


def test_only_adapters_are_trained_and_checkpointed(lora_run, model_dir):
    trainer, out = lora_run
    assert trainer.updates_seen > 0 and trainer.collector.replay.round_pairs(1)
    base = load_model(model_dir, device="cpu")
    for agent, optimizer in zip(trainer.agents, trainer.optimizers):
        assert is_adapter_model(agent)
        trainable = [n for n, p in agent.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)
        assert sum(len(g["params"]) for g in optimizer.param_groups) == len(trainable)
        # The base weights did not move (peft renames a wrapped layer's weight to <layer>.base_layer.weight).
        frozen = {
            k.replace(".base_layer", ""): v for k, v in agent.get_base_model().state_dict().items() if "lora_" not in k
        }
        assert frozen.keys() == base.state_dict().keys()
        for name, value in base.state_dict().items():
            torch.testing.assert_close(frozen[name], value, rtol=0, atol=0)
    weights = sorted((out / "ckpt").glob("checkpoint-*/weights-*.pt"))[-1]
    saved = torch.load(weights, weights_only=False)
    assert all(key and all("lora_" in k for k in agent) for agent in saved["agents"] for key in agent)


def test_saved_adapters_reload_to_the_same_logps(lora_run, tmp_path):
    trainer, _ = lora_run
    trainer.save_model(tmp_path / "saved")
    pairs = trainer.collector.replay.round_pairs(1)[:6]
    for i, agent in enumerate(trainer.agents):
        files = sorted(p.name for p in (tmp_path / "saved" / f"agent_{i}").iterdir())
        assert "adapter_model.safetensors" in files and "adapter_config.json" in files
        assert not any(name.startswith(("model", "pytorch_model")) for name in files)  # no base weights
        reloaded = load_adapter_model(tmp_path / "saved" / f"agent_{i}", device="cpu")
        torch.testing.assert_close(
            logps(reloaded, trainer, pairs, i), logps(agent, trainer, pairs, i), rtol=0, atol=1e-5
        )
        # The adapter changed the policy: the base alone scores differently.
        assert not torch.allclose(logps(AdapterDisabled(agent), trainer, pairs, i), logps(agent, trainer, pairs, i))


def test_checkpoint_resume_restores_the_adapters(lora_run, make_trainer, tmp_path):
    trainer, out = lora_run
    fresh = make_trainer("MADPOIter", tmp_path, DIST, LORA)
    pairs = trainer.collector.replay.round_pairs(1)[:6]
    assert not torch.allclose(logps(fresh.agents[0], fresh, pairs, 0), logps(trainer.agents[0], trainer, pairs, 0))
    fresh.load_checkpoint(out / "ckpt")
    assert fresh.finished
    for i in range(2):
        torch.testing.assert_close(logps(fresh.agents[i], fresh, pairs, i), logps(trainer.agents[i], trainer, pairs, i))


def test_history_comparator_shares_the_base_and_switches_back(lora_run):
    trainer, out = lora_run
    pairs = trainer.collector.replay.round_pairs(1)[:6]
    comparator = trainer.collector.comparator
    snapshot = Path(trainer.collector.history_dir) / "initial"
    assert (snapshot / "agent_0" / "adapter_config.json").is_file()
    before = [logps(agent, trainer, pairs, i) for i, agent in enumerate(trainer.agents)]
    trainable = [[p for p in agent.parameters() if p.requires_grad] for agent in trainer.agents]
    comparator.prepare_round(1)  # k = 1 in round 1: the initial snapshot
    try:
        assert comparator.models_for_round()[0] is trainer.agents[0]  # no copy of the base
        for i, agent in enumerate(trainer.agents):
            with comparator.sampling_context(i):
                initial = logps(agent, trainer, pairs, i)
            # The initial adapter is LoRA's zero update: the base model.
            torch.testing.assert_close(initial, logps(AdapterDisabled(agent), trainer, pairs, i))
            # Outside the block the trained adapter is back, with the same trainable parameters.
            torch.testing.assert_close(logps(agent, trainer, pairs, i), before[i])
            assert [p for p in agent.parameters() if p.requires_grad] == trainable[i]
    finally:
        comparator.release()
    assert all(HISTORY_ADAPTER not in agent.peft_config for agent in trainer.agents)


def test_gradient_checkpointing_takes_the_same_step(make_trainer, tmp_path):
    states = []
    for flag in (False, True):
        trainer = make_trainer("MADPOIter", tmp_path / str(flag), DIST, gradient_checkpointing=flag, num_iterations=1)
        trainer.step()  # collect
        trainer.step()  # select
        batch = trainer.collector.train_pairs[:4]
        assert batch
        metrics = trainer.learner.update(batch)
        assert all(not m.training for m in trainer.agents)
        states.append(
            (metrics["madpo/loss"], [{k: v.clone() for k, v in m.state_dict().items()} for m in trainer.agents])
        )
    agent = trainer.agents[0]
    assert getattr(agent, "is_activation_checkpointing", None) or agent.is_gradient_checkpointing
    assert states[0][0] == pytest.approx(states[1][0], rel=1e-6)
    for a, b in zip(states[0][1], states[1][1]):
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)


def test_madpo_reference_with_lora_is_the_frozen_base_at_no_copy(make_trainer, model_dir, tmp_path):
    trainer = make_trainer("MADPOIter", tmp_path, DIST, LORA, madpo_reference="initial")
    assert all(
        isinstance(r, AdapterDisabled) and r.model is a for r, a in zip(trainer.learner.references, trainer.agents)
    )
    trainer.train()  # one round: the adapters move, the reference (the base) does not
    pairs = trainer.collector.replay.round_pairs(1)[:4]
    base = load_model(model_dir, device="cpu")
    with torch.no_grad():
        expected = sequence_logps(
            base,
            [p.prompt_ids[0] for p in pairs],
            [p.winner_ids[0] for p in pairs],
            pad_token_id=trainer.context.pad_token_id(0),
            micro_batch_size=16,
        )
    assert [p.reference_winner_logps[0] for p in pairs] == pytest.approx(expected.tolist(), abs=1e-5)


def test_a_held_reference_switches_the_adapters_off_once_for_many_forwards(model_dir, monkeypatch):
    model = apply_lora(load_model(model_dir, device="cpu"), LoraSettings(r=4, target_modules=["q_proj"]), seed=0)
    with torch.no_grad():  # LoRA's B starts at zero (no change); a drawn B makes the adapter show in the logits
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)))
    switches = []
    switch = model.disable_adapter
    monkeypatch.setattr(model, "disable_adapter", lambda: switches.append(1) or switch())
    reference, ids = AdapterDisabled(model), torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        live = model(input_ids=ids).logits
        base = reference(input_ids=ids).logits
        assert len(switches) == 1 and not torch.allclose(base, live)
        with reference_scoring(reference):
            held = [reference(input_ids=ids).logits for _ in range(3)]
            with reference_scoring(reference):  # nested: still one switch
                held.append(reference(input_ids=ids).logits)
        assert len(switches) == 2
        assert all(torch.equal(logits, base) for logits in held)
        assert torch.equal(model(input_ids=ids).logits, live)  # the adapters are on again after the block
        with pytest.raises(RuntimeError), reference_scoring(reference):
            reference(input_ids=ids)
            raise RuntimeError("scoring failed")
        assert torch.equal(model(input_ids=ids).logits, live)  # and after a block that raised
        assert any(parameter.requires_grad for parameter in model.parameters())
    plain = load_model(model_dir, device="cpu")
    with reference_scoring(plain) as scored:
        assert scored is plain
