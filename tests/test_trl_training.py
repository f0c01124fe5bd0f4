"""TRL as the proof: ``DPOTrainer`` trains on a TRL export as it is written, with no glue.

A two-round MADPOIter run of two agents on the embedded tiny model, agent 1 with SmolLM2's chat template set (so
its prompts go through the template and its TRL file is conversational), is exported by the command line; TRL's
``DPOTrainer`` then trains each agent's starting model for 2 steps on that agent's file, loaded through the card.
What TRL tokenises as each row's prompt is what the agent was prompted with, as the store holds it. Skipped when
TRL is not installed (it is a dev extra).
"""

from __future__ import annotations

import json

import pytest
import torch
from pair_dataset_fixtures import SYSTEM, chat_model_dir, load

from comlrl_lab import cli
from comlrl_lab.engine import ExperimentSpec, RunManager
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME, tiny_model_path
from comlrl_lab.store import RunStore

trl = pytest.importorskip("trl")

pytestmark = [
    pytest.mark.slow,
    # TRL 1.16 calls transformers 5's deprecated gradient_checkpointing names (its own code, not ours).
    pytest.mark.filterwarnings("ignore:`(is_)?gradient_checkpointing.*deprecated:FutureWarning"),
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The run folder, the store's pairs of round 1 and 2, and the TRL export of the run."""
    root = tmp_path_factory.mktemp("trl")
    chat = str(chat_model_dir(root))
    spec = ExperimentSpec(
        algorithm="MADPOIter",
        agent_models=[TINY_MODEL_NAME, chat],
        task="length_ratio",
        config={"num_iterations": 2, "preference_num_candidates": 3, "max_new_tokens": 8, "eval_num_samples": 2},
        max_train_items=4,
        max_eval_items=2,
        name="trl-proof",
    )
    manager = RunManager(root / "runs")
    try:
        run_id = manager.create(spec)
        manager.start(run_id, rounds=2)
        progress = manager.wait(run_id, timeout=600)
        assert progress.status == "finished", progress.last_error
    finally:
        manager.close()
    run_dir = root / "runs" / run_id
    dest = root / "trl-files"
    assert cli.main(["export", str(run_dir), "--format", "trl", "--dest", str(dest)]) == 0
    with RunStore(run_dir / "run.duckdb", read_only=True) as store:
        pairs = store.load_pairs(run_id)
    return {"root": root, "chat": chat, "dest": dest, "pairs": pairs}


def test_the_chat_agents_file_is_conversational_and_the_other_is_text(exported):
    pairs = exported["pairs"]
    assert pairs, "the tiny run made no pair"
    first = json.loads((exported["dest"] / "agent_1.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first["prompt"][0] == {"role": "system", "content": SYSTEM}
    assert first["prompt"][1]["role"] == "user" and pairs[0].prompts[1].endswith(
        first["prompt"][1]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert first["chosen"] == [{"role": "assistant", "content": pairs[0].winner_completions[1]}]
    zero = json.loads((exported["dest"] / "agent_0.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert (zero["prompt"], zero["chosen"], zero["rejected"]) == (
        pairs[0].prompts[0],
        pairs[0].winner_completions[0],
        pairs[0].loser_completions[0],
    )


@pytest.mark.parametrize("agent", [0, 1])
def test_dpo_trainer_trains_two_steps_on_each_agents_file(exported, agent, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = tiny_model_path() if agent == 0 else exported["chat"]
    train = load(exported["dest"], tmp_path, f"agent_{agent}")
    assert train.num_rows == len(exported["pairs"])
    model = AutoModelForCausalLM.from_pretrained(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    args = trl.DPOConfig(
        output_dir=str(tmp_path / "dpo"),
        max_steps=2,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
    )
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
    before = [p.detach().clone() for p in model.parameters()]
    result = trainer.train()
    assert result.global_step == 2
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # What TRL tokenised as the first row's prompt is the prompt the agent sampled from, as the store holds it (the
    # conversational one rendered back from its messages by the template; the text one with the tokenizer's BOS).
    stored = exported["pairs"][0].prompts[agent]
    seen = tokenizer.decode(trainer.train_dataset[0]["prompt_ids"])
    assert seen == (stored if agent == 1 else tokenizer.bos_token + stored)
