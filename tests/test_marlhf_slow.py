"""MARLHF end to end on the embedded tiny model: every rl_algorithm, MARLHFIter with a learned oracle, exact resume."""

from __future__ import annotations

import math

import pytest
import torch
from model_fixtures import embedded_tiny_model_dir

from comlrl_lab.data.tasks import get_task
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

pytestmark = pytest.mark.slow

TASK = get_task("length_ratio")


@pytest.fixture(scope="module")
def tiny_dir():
    path = embedded_tiny_model_dir()
    if path is None:
        pytest.skip("the embedded tiny model has not been built (python scripts/train_tiny_lm.py)")
    return str(path)


#: The length-ratio task's first three items (two to evaluate), G = 3 rollouts of twelve tokens, two BT epochs.
SETTINGS = dict(
    train_dataset=TASK.train_items()[:3],
    eval_dataset=TASK.eval_items()[:2],
    reward_func=TASK.reward_func,
    formatters=list(TASK.formatters),
    num_generations=3,
    preference_num_candidates=4,
    preference_pairs_per_sample=4,
    max_new_tokens=12,
    reward_num_train_epochs=2,
    reward_train_batch_size=4,
    reward_learning_rate=1e-3,
    rollout_buffer_size=2,
    bt_validation_fraction=0.25,
    seed=42,
)


def _weights(models):
    return [torch.cat([p.detach().reshape(-1).clone() for p in m.parameters()]) for m in models]


class _NoEval:
    def score_candidates(self, *a, **k):
        raise AssertionError("reward model used in evaluation")


@pytest.mark.parametrize(
    "algorithm, extra",
    [
        ("magrpo", {"reference_kl_enabled": True}),
        ("mareinforce", {}),
        ("marloo", {}),
        ("maremax", {}),
        ("maac", {"critic_type": "q"}),
        ("maac", {}),
        ("iac", {}),
        ("iac", {"use_separate_critic": False, "critic_type": "q", "value_head_hidden_dim": 8}),
    ],
)
def test_each_rl_algorithm_end_to_end(make_trainer, tiny_dir, tmp_path, algorithm, extra):
    sink = MemorySink()
    trainer = make_trainer("MARLHF", tmp_path, SETTINGS, extra, agent_model=tiny_dir, rl_algorithm=algorithm, sink=sink)
    before = _weights(trainer.agents)
    critics_before = _weights(trainer.learner.policy.critics + trainer.learner.policy.value_heads)
    for _ in range(3):  # collect, select, train
        trainer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, _weights(trainer.agents)))
    after = _weights(trainer.learner.policy.critics + trainer.learner.policy.value_heads)
    assert len(after) == {"maac": 1, "iac": 2}.get(algorithm, 0)
    assert all(not torch.equal(a, b) for a, b in zip(critics_before, after))
    for name in ("bt/loss", "bt/accuracy", "bt/margin", "bt/val_accuracy", "rl/loss", "rl/reward_model_mean"):
        values = [v for _, v in sink.metric(name)]
        assert values and all(math.isfinite(v) for v in values), name
    if algorithm in ("maac", "iac"):
        assert sink.metric("rl/value_loss") or sink.metric("rl/agent_0/value_loss")
    if extra.get("reference_kl_enabled"):
        assert [v for _, v in sink.metric("turn_1/reference_kl_mean")][-1] > 0  # the policy moved off the reference
    trainer.learner.reward_model = _NoEval()
    trainer.step()  # evaluate: task reward only
    assert trainer.finished and sink.metric("eval/turn_1/reward_mean")
    assert trainer.env_step == 3 * 3  # G per item, one RL epoch over 3 items


@pytest.mark.parametrize("algorithm, extra", [("iac", {"use_separate_critic": False}), ("maac", {})])
def test_iter_resume_is_exact_with_critics_and_reward_model_oracle(make_trainer, tiny_dir, tmp_path, algorithm, extra):
    def build(name):
        return make_trainer(
            "MARLHFIter",
            tmp_path / name,
            SETTINGS,
            extra,
            agent_model=tiny_dir,
            rl_algorithm=algorithm,
            num_iterations=2,
            preference_num_candidates=3,
            max_new_tokens=8,
            preference_scoring_reward="reward_model",
            reward_num_train_epochs=1,
        )

    straight = build("a")
    straight.train()
    interrupted = build("b")
    interrupted.checkpoint_dir = tmp_path / "ckpt"
    for _ in range(4):  # round 1; round 2's collect needs the round-1 reward model from the checkpoint
        interrupted.step()
    resumed = build("c")
    resumed.train(resume_from_checkpoint=tmp_path / "ckpt")

    def learned(t):
        return _weights(t.agents + t.learner.policy.critics + t.learner.policy.value_heads + [t.learner.reward_model])

    for a, b in zip(learned(straight), learned(resumed)):
        assert torch.equal(a, b)
