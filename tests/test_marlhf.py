"""MARLHF known answers: six backends' advantages, Bradley-Terry metrics, pooling, KL penalty, eval oracle, errors."""

from __future__ import annotations

import math

import pytest
import torch
from model_fixtures import build_model, build_tokenizer

from comlrl_lab.data.rewards import batched_reward
from comlrl_lab.trainers.preference.learning import policy_learning
from comlrl_lab.trainers.preference.learning.policy_learning import (
    RL_BACKENDS,
    compute_advantages,
    resolve_backend,
)
from comlrl_lab.trainers.preference.learning.reward_model import (
    JointRewardModel,
    evaluate_bradley_terry,
    fit_bradley_terry,
    last_token_index,
    split_validation,
)
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

DTYPE = torch.float64
RETURNS = [1.0, 2.0, 3.0, 4.0, 5.0, 9.0]  # mean 4, biased std sqrt(40/6)
VALUES = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]  # critic values for maac / iac: R - V = [0, 1, 1, 2, 2, 6]
STD = math.sqrt(40 / 6)
ITEMS = [{"prompt": f"the {w} cat"} for w in ("red", "blue", "green")]


@batched_reward
def word_count_reward(c1, c2, **_):
    return [float(len(a.split()) + len(b.split())) for a, b in zip(c1, c2)]


#: The trainers here: three items prompted as they are, no evaluation unless a test asks, the word-count reward.
SETTINGS = dict(
    train_dataset=ITEMS, eval_dataset=None, formatters=None, reward_func=word_count_reward, max_new_tokens=4, seed=42
)


# ----------------------------------------------------------------------------------------- advantages
def _advantages(name: str, normalize: bool = True) -> list[float]:
    returns = torch.tensor(RETURNS, dtype=DTYPE).view(1, 1, 6)  # (A, K, G)
    values = torch.tensor(VALUES, dtype=DTYPE).view(1, 1, 6)
    return compute_advantages(resolve_backend(name), returns, values, normalize).view(-1).tolist()


EXPECTED_NORMALISED = {
    # Differs from CoMLRL: it re-centres, which maps the four baselines to the same magrpo vector.
    "magrpo": [(r - 4.0) / STD for r in RETURNS],
    "mareinforce": [r / STD for r in RETURNS],
    "marloo": [(6 * r - 24.0) / 5 / STD for r in RETURNS],  # R_j - mean of the other five
    "maremax": [(r - 9.0) / STD for r in RETURNS],
    # R - V = [0, 1, 1, 2, 2, 6], mean 2, biased std sqrt(22/6); scaled, not re-centred.
    "maac": [a / math.sqrt(22 / 6) for a in (0.0, 1.0, 1.0, 2.0, 2.0, 6.0)],
    "iac": [a / math.sqrt(22 / 6) for a in (0.0, 1.0, 1.0, 2.0, 2.0, 6.0)],
}


@pytest.mark.parametrize("name", sorted(RL_BACKENDS))
def test_advantages_of_all_six_algorithms(name):
    assert _advantages(name) == pytest.approx(EXPECTED_NORMALISED[name], abs=1e-12)


def test_advantages_by_hand_and_distinct():
    assert _advantages("magrpo") == pytest.approx([-1.161895, -0.774597, -0.387298, 0.0, 0.387298, 1.936492], abs=1e-6)
    assert _advantages("marloo") == pytest.approx([-1.394274, -0.929516, -0.464758, 0.0, 0.464758, 2.323790], abs=1e-6)
    assert _advantages("maremax") == pytest.approx(
        [-3.098387, -2.711088, -2.323790, -1.936492, -1.549193, 0.0], abs=1e-6
    )
    assert _advantages("mareinforce") == pytest.approx(
        [0.387298, 0.774597, 1.161895, 1.549193, 1.936492, 3.485685], abs=1e-6
    )
    group = [tuple(round(a, 9) for a in _advantages(n)) for n in ("magrpo", "mareinforce", "marloo", "maremax")]
    assert len(set(group)) == 4


def test_advantages_without_normalisation():
    assert _advantages("magrpo", False) == pytest.approx([-3, -2, -1, 0, 1, 5])
    assert _advantages("mareinforce", False) == pytest.approx(RETURNS)
    assert _advantages("marloo", False) == pytest.approx([-3.6, -2.4, -1.2, 0, 1.2, 6.0])
    assert _advantages("maremax", False) == pytest.approx([-8, -7, -6, -5, -4, 0])
    assert _advantages("maac", False) == pytest.approx([0, 1, 1, 2, 2, 6])


def test_group_advantages_are_per_item_and_per_agent():
    # Two agents (different KL penalties), two items: each (agent, item) group has its own baseline.
    returns = torch.tensor([[[1.0, 3.0], [10.0, 10.0]], [[0.0, 4.0], [2.0, 6.0]]], dtype=DTYPE)  # (A=2, K=2, G=2)
    out = compute_advantages(resolve_backend("magrpo"), returns, None, True)
    assert out.tolist() == [[[-1.0, 1.0], [0.0, 0.0]], [[-1.0, 1.0], [-1.0, 1.0]]]
    with pytest.raises(ValueError, match="needs critic values"):
        compute_advantages(resolve_backend("iac"), returns, None, True)


def test_backend_table_resolves_each_name_once():
    assert {n: (b.advantage_mode, b.critic) for n, b in RL_BACKENDS.items()} == {
        "magrpo": ("mean", None),
        "mareinforce": ("raw", None),
        "marloo": ("rloo", None),
        "maremax": ("max", None),
        "maac": (None, "central"),
        "iac": (None, "independent"),
    }


# --------------------------------------------------------------------------------------- Bradley-Terry
class LookupScores(torch.nn.Module):
    """A stand-in reward model: one learnable score per known text; records each forward's batch."""

    def __init__(self, scores: dict[str, float]):
        super().__init__()
        self.index = {text: i for i, text in enumerate(scores)}
        self.values = torch.nn.Parameter(torch.tensor(list(scores.values()), dtype=torch.float32))
        self.batches: list[list[str]] = []

    def score_texts(self, texts, *, micro_batch_size=32):
        self.batches.append(list(texts))
        return self.values[torch.tensor([self.index[t] for t in texts])]

    def tokenize(self, texts):
        self.tokenized = getattr(self, "tokenized", 0) + len(texts)
        return [[self.index[t]] for t in texts]

    def score_ids(self, rows):
        names = list(self.index)
        self.batches.append([names[row[0]] for row in rows])
        return self.values[torch.tensor([row[0] for row in rows])]

    def trainable_parameters(self):
        return [self.values]


def test_bradley_terry_loss_accuracy_margin_on_hand_made_scores():
    scores = {"w1": 2.0, "l1": 1.0, "w2": 0.5, "l2": 1.5, "w3": -1.0, "l3": -3.0}  # margins 1, -1, 2
    model = LookupScores(scores)
    metrics = evaluate_bradley_terry(model, [("w1", "l1"), ("w2", "l2"), ("w3", "l3")])
    expected_loss = (math.log1p(math.exp(-1)) + math.log1p(math.exp(1)) + math.log1p(math.exp(-2))) / 3
    assert metrics["loss"] == pytest.approx(expected_loss, abs=1e-6)  # 0.5844838
    assert metrics["loss"] == pytest.approx(0.5844838, abs=1e-6)
    assert metrics["accuracy"] == pytest.approx(2 / 3)
    assert metrics["margin"] == pytest.approx(2 / 3)
    # Winners and losers of a micro-batch share one forward.
    assert model.batches == [["w1", "w2", "w3", "l1", "l2", "l3"]]
    assert all(math.isnan(v) for v in evaluate_bradley_terry(model, []).values())


def test_fit_bradley_terry_learns_and_reports_per_epoch():
    scores = {name: 0.0 for name in ("a", "b", "c", "d", "e", "f")}
    model = LookupScores(scores)
    train = [("a", "b"), ("b", "c"), ("d", "e")]
    val = [("a", "c")]
    import random

    history = fit_bradley_terry(
        model, train, val, epochs=20, batch_size=3, learning_rate=0.1, rng=random.Random(0), micro_batch_size=2
    )
    assert [h["bt/epoch"] for h in history] == [float(e) for e in range(1, 21)]
    first = history[0]
    # Epoch 1 is one step from equal scores: loss log 2, no correct pair, margin 0 (measured before the step).
    assert first["bt/loss"] == pytest.approx(math.log(2))
    assert first["bt/accuracy"] == 0.0 and first["bt/margin"] == 0.0
    # One AdamW step of lr 0.1 moves a up by 0.1 and c down by 0.1 (b is a winner once and a loser once).
    assert first["bt/val_margin"] == pytest.approx(0.2, abs=1e-4)
    assert first["bt/val_loss"] == pytest.approx(math.log1p(math.exp(-0.2)), abs=1e-4)  # 0.598139
    assert first["bt/val_accuracy"] == 1.0
    assert history[-1]["bt/loss"] < first["bt/loss"]
    assert history[-1]["bt/accuracy"] == 1.0
    assert history[-1]["bt/val_accuracy"] == 1.0  # a > b > c generalises to a > c


def test_split_validation_holds_out_a_slice():
    import random

    train, val = split_validation(20, 0.1, random.Random(0))
    assert len(val) == 2 and len(train) == 18 and sorted(train + val) == list(range(20))
    assert split_validation(5, 0.0, random.Random(0)) == ([0, 1, 2, 3, 4], [])
    assert len(split_validation(3, 0.1, random.Random(0))[1]) == 1  # at least one held out when asked
    assert split_validation(1, 0.4, random.Random(0)) == ([0], [])  # never the only pair
    # A pair the replay sampler drew twice stays on one side: held-out pairs are never trained on.
    for seed in range(10):
        keys = ["a", "b", "a", "c", "b", "d", "a", "e"]
        train, val = split_validation(8, 0.25, random.Random(seed), keys=keys)
        assert val and not {keys[i] for i in train} & {keys[i] for i in val}


# --------------------------------------------------------------------------------------------- pooling
def test_last_token_index_left_and_right_padding():
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert last_token_index(right).tolist() == [2, 4, 0]
    assert last_token_index(left).tolist() == [4, 4, 4]


@pytest.mark.parametrize("side", ["left", "right"])
def test_reward_model_pools_last_real_token_without_lm_head(side):
    tokenizer = build_tokenizer()
    tokenizer.padding_side = side
    backbone = build_model(len(tokenizer), seed=3)
    model = JointRewardModel.from_backbone(backbone, tokenizer, generator=torch.Generator().manual_seed(0))
    texts = ["the red cat", "one two three four five six seven", "dog"]
    calls = []
    backbone.lm_head.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        batched = model.score_texts(texts)
        alone = torch.cat([model.score_texts([t]) for t in texts])
        # By hand: the last layer's hidden state at the last real token, through the head.
        ids, mask = model.encode(texts)
        hidden = backbone.model(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
        ).last_hidden_state
        last = [int(torch.nonzero(row).max()) for row in mask]
        by_hand = model.head(hidden[torch.arange(3), last].float()).squeeze(-1)
    assert calls == []  # no vocabulary projection
    assert torch.allclose(batched, alone, atol=1e-5)  # padding side and batch mates change nothing
    assert torch.allclose(batched, by_hand, atol=1e-6)
    if side == "left":
        assert last == [mask.shape[1] - 1] * 3
    else:
        assert last[1] == mask.shape[1] - 1 and last[2] < last[0] < last[1]


def test_joint_text_layout():
    text = JointRewardModel.joint_text(["p1", "p2"], ["c1", "c2"])
    assert text == (
        "Joint multi-agent response\n\nAgent 1 prompt:\np1\n\nAgent 1 response:\nc1\n\n"
        "Agent 2 prompt:\np2\n\nAgent 2 response:\nc2"
    )


# ------------------------------------------------------------------------------------------ KL penalty
def test_kl_penalty_arithmetic_by_hand():
    from comlrl_lab.trainers.preference.learning.losses import kl_k3, kl_penalized_returns

    policy = torch.tensor([[-1.0, -2.0, 0.0]], dtype=DTYPE)
    reference = torch.tensor([[-1.5, -1.0, float("inf")]], dtype=DTYPE)  # the padding slot holds junk
    mask = torch.tensor([[True, True, False]])
    kl = kl_k3(policy, reference, mask)
    # r = ref - pol = [-0.5, 1]; k3 = e^r - r - 1 = [0.1065307, 0.7182818]
    assert kl.item() == pytest.approx(math.exp(-0.5) - 0.5 + math.exp(1) - 2, abs=1e-12)  # 0.8248125
    assert kl_penalized_returns(torch.tensor([1.0], dtype=DTYPE), kl, 0.1).item() == pytest.approx(
        1 - 0.08248125, abs=1e-7
    )


def test_rollout_subtracts_each_agents_kl_times_coef(make_trainer, tmp_path):
    trainer = make_trainer(
        "MARLHF", tmp_path, SETTINGS, reference_kl_enabled=True, reference_kl_coef=0.5, num_generations=3
    )
    learner = trainer.learner.policy
    fake_scores = [0.25 * k for k in range(len(ITEMS) * 3)]
    rollout = learner.rollout(ITEMS, [0, 1, 2], lambda cands: fake_scores[: len(cands)])
    assert rollout.kl.abs().max().item() < 1e-6  # policy == fixed reference before any update
    with torch.no_grad():  # move agent 1 away from its reference only
        for p in trainer.agents[1].parameters():
            p.add_(0.05 * torch.ones_like(p))
    rollout = learner.rollout(ITEMS, [0, 1, 2], lambda cands: fake_scores[: len(cands)])
    rewards = torch.tensor(fake_scores).view(3, 3)
    assert torch.equal(rollout.rewards, rewards)
    assert rollout.kl[0].abs().max().item() < 1e-6 and rollout.kl[1].min().item() > 0
    for i in range(2):
        assert torch.allclose(rollout.returns[i], rewards - 0.5 * rollout.kl[i])
    assert rollout.metrics["turn_1/reference_kl_penalty_mean"] == pytest.approx(0.5 * rollout.kl.mean().item())
    assert trainer.learner.policy.references[0] is not trainer.agents[0]


def test_row_seeded_rollouts_draw_each_item_alike_in_any_buffer_and_leave_the_stream_alone(make_trainer, tmp_path):
    trainer = make_trainer("MARLHF", tmp_path, SETTINGS, num_generations=3, max_new_tokens=6)
    learner = trainer.learner.policy
    seeds = [trainer.context.row_seeds("rl/0", [0, 1, 2], i, 1) for i in range(2)]

    def tokens(rollout):
        return [[c.completion_ids for c in row] for row in rollout.candidates]

    stream = learner.streams.torch(policy_learning.RL_GENERATION_STREAM, "cpu").get_state()
    whole = learner.rollout(ITEMS, [0, 1, 2], lambda cands: [0.0] * len(cands), seeds)
    # The shards a rank would sample: items 0 and 2, then item 1 alone.
    shard = learner.rollout([ITEMS[0], ITEMS[2]], [0, 2], lambda c: [0.0] * len(c), [[s[0], s[2]] for s in seeds])
    alone = learner.rollout([ITEMS[1]], [1], lambda c: [0.0] * len(c), [[s[1]] for s in seeds])
    assert tokens(whole) == [tokens(shard)[0], tokens(alone)[0], tokens(shard)[1]]
    assert torch.equal(learner.streams.torch(policy_learning.RL_GENERATION_STREAM, "cpu").get_state(), stream)
    # The three generations of an item differ (their own seeds), and the next epoch's names draw afresh.
    assert len({tuple(map(tuple, c.completion_ids)) for c in whole.candidates[0]}) > 1
    again = learner.rollout(ITEMS, [0, 1, 2], lambda c: [0.0] * len(c), seeds)
    later = [trainer.context.row_seeds("rl/1", [0, 1, 2], i, 1) for i in range(2)]
    assert tokens(again) == tokens(whole)
    assert tokens(learner.rollout(ITEMS, [0, 1, 2], lambda c: [0.0] * len(c), later)) != tokens(whole)


# ----------------------------------------------------------------------------- reward model not in eval
class ExplodingRewardModel:
    def score_candidates(self, *args, **kwargs):
        raise AssertionError("the reward model must never score evaluation samples")


def test_evaluation_uses_task_reward_never_the_reward_model(make_trainer, tmp_path):
    sink = MemorySink()
    trainer = make_trainer("MARLHF", tmp_path, SETTINGS, eval_dataset=ITEMS, sink=sink)
    trainer.train()
    assert trainer.learner.reward_model is not None
    assert sink.metric("bt/loss") and sink.metric("rl/loss") and sink.metric("rl/reward_model_mean")
    trainer.learner.reward_model = ExplodingRewardModel()
    metrics = trainer.evaluate()
    expected = (
        sum(word_count_reward([c.completions[0]], [c.completions[1]])[0] for c in trainer.last_eval_candidates) / 2
    )
    assert metrics["eval/turn_1/reward_mean"] == pytest.approx(expected)


def test_iter_scoring_uses_reward_model_only_after_one_is_fitted(make_trainer, tmp_path):
    trainer = make_trainer(
        "MARLHFIter",
        tmp_path,
        SETTINGS,
        eval_dataset=ITEMS,
        num_iterations=2,
        preference_scoring_reward="reward_model",
    )
    first = trainer.step()  # collect, round 1: task reward
    for c in first.candidates:
        assert c.raw_reward == word_count_reward([c.completions[0]], [c.completions[1]])[0]
    trainer.step(), trainer.step()  # select, train: a reward model is fitted and kept for scoring
    assert trainer.learner.reward_model is not None
    trainer.step()  # evaluate: task reward
    second = trainer.step()  # collect, round 2: the reward model labels the comparisons
    model_scores = trainer.learner.reward_model.score_candidates(second.candidates)
    assert [c.raw_reward for c in second.candidates] == pytest.approx(model_scores, abs=1e-5)
    assert [c.reward for c in second.candidates] == [c.raw_reward for c in second.candidates]


def test_iter_with_task_scoring_frees_the_reward_model(make_trainer, tmp_path):
    trainer = make_trainer("MARLHFIter", tmp_path, SETTINGS)
    trainer.train()
    assert trainer.learner.reward_model is None


# --------------------------------------------------------------------------------------------- errors
def _model_objects() -> dict:
    """Two random tiny Llamas given as objects with their tokenizer, instead of a model to load."""
    tokenizer = build_tokenizer()
    return dict(agent_model=None, agents=[build_model(len(tokenizer), seed=s) for s in (0, 1)], tokenizer=tokenizer)


def test_model_objects_need_reward_model_name(make_trainer, tmp_path):
    with pytest.raises(ValueError, match="^reward_model_name must be provided when agent models are objects.$"):
        make_trainer("MARLHF", tmp_path, SETTINGS, _model_objects())


@pytest.mark.parametrize("algorithm, separate", [("maac", True), ("iac", True)])
def test_model_objects_need_critic_source(make_trainer, model_dir, tmp_path, algorithm, separate):
    with pytest.raises(
        ValueError, match="^critic_model_name must be provided for MARLHF with MAAC/IAC when agent models are objects.$"
    ):
        make_trainer(
            "MARLHF",
            tmp_path,
            SETTINGS,
            _model_objects(),
            rl_algorithm=algorithm,
            use_separate_critic=separate,
            reward_model_name=model_dir,
        )


def test_value_heads_and_critic_objects_need_no_critic_name(make_trainer, model_dir, tmp_path):
    objects = _model_objects()
    trainer = make_trainer(
        "MARLHF",
        tmp_path,
        SETTINGS,
        objects,
        rl_algorithm="iac",
        use_separate_critic=False,
        reward_model_name=model_dir,
    )
    assert len(trainer.learner.policy.value_heads) == 2 and trainer.learner.policy.critics == []
    critic = build_model(len(objects["tokenizer"]), seed=7)
    trainer = make_trainer(
        "MARLHF", tmp_path, SETTINGS, objects, rl_algorithm="maac", reward_model_name=model_dir, critic_model=critic
    )
    assert len(trainer.learner.policy.critics) == 1 and trainer.learner.policy.critics[0].backbone is critic


def test_reward_model_and_critics_follow_the_agents(make_trainer, tmp_path):
    trainer = make_trainer("MARLHF", tmp_path, SETTINGS, rl_algorithm="iac")
    assert trainer.learner.reward_model_device == trainer.agent_devices[0] == torch.device("cpu")
    assert [c.device for c in trainer.learner.policy.critics] == trainer.agent_devices


def test_packed_scoring_fits_and_rolls_out_as_one_row_per_sequence_does(make_trainer, tmp_path):
    """pack_pair_scoring runs a shared prompt once (the reward model's pairs and candidates, the policy's
    candidates): the same Bradley-Terry fit, reward-model scores and policy loss up to float rounding."""
    from comlrl_lab.models.scoring import supports_packed_pairs

    metrics = {}
    for packed in (True, False):
        sink = MemorySink()
        trainer = make_trainer(
            "MARLHF", tmp_path / str(packed), SETTINGS, num_generations=3, pack_pair_scoring=packed, sink=sink
        )
        assert trainer.learner.policy.packed is packed and supports_packed_pairs(trainer.agents[0])
        trainer.train()
        assert trainer.learner.reward_model.packed is packed
        names = ("bt/loss", "bt/margin", "rl/reward_model_mean", "rl/loss")
        metrics[packed] = {name: [value for _, value in sink.metric(name)] for name in names}
    for name, values in metrics[False].items():
        assert values, name
        # The first rollout samples from the same untrained policy; later ones may part by a rounding-flipped token.
        first = 1 if name.startswith("rl/") else len(values)
        assert metrics[True][name][:first] == pytest.approx(values[:first], rel=1e-4, abs=1e-5), name
