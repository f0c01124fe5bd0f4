"""collaboration_mode='centralized': one actor writes every role; rewards see parsed roles; whole-text scoring."""

from __future__ import annotations

import pytest
import torch
from trainer_fixtures import ITEMS

from comlrl_lab.data.records import JointCandidate, PreferencePair
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

SEEN: list[tuple[list[str], list[str]]] = []


def role_reward(first, second, prompts=None, batch_items=None):
    SEEN.append((list(first), list(second)))
    return [float(len(second[0].split()) - len(first[0].split()))]


def fmt_one(item):
    return f"describe {item['topic']}"


def fmt_two(item):
    return f"praise {item['topic']}"


#: One actor writing both roles on three items; the reward records what each role wrote.
CENTRALIZED = dict(
    collaboration_mode="centralized",
    train_dataset=ITEMS[:3],
    eval_dataset=ITEMS[:3],
    reward_func=role_reward,
    formatters=[fmt_one, fmt_two],
    max_new_tokens=6,
    seed=1,
)


def test_centralized_collaboration_messages(make_trainer, model_dir, tmp_path):
    with pytest.raises(ValueError, match="Centralized collaboration requires exactly one actor model."):
        make_trainer("MADPOIter", tmp_path, CENTRALIZED, agent_model=None, agents=[model_dir, model_dir])
    with pytest.raises(ValueError, match=r"num_agents must match args.num_agents \(the role count\)."):
        make_trainer("MADPOIter", tmp_path, CENTRALIZED, num_agents=3)


def test_one_actor_writes_the_joint_text_and_the_reward_sees_roles(make_trainer, tmp_path):
    trainer = make_trainer("MADPOIter", tmp_path, CENTRALIZED)
    assert trainer.num_agents == 1 and trainer.context.roles.count == 2
    prompt = trainer.formatters[0](ITEMS[0])
    assert "Agent 0 original prompt:\ndescribe red" in prompt and "<agent_1>" in prompt

    tagged = JointCandidate(
        item_index=0,
        candidate_index=0,
        side="current",
        prompts=[prompt],
        completions=["<agent_0>red cat</agent_0> <agent_1>a big red dog</agent_1>"],
        completion_ids=[[1]],
        prompt_ids=[[1]],
    )
    untagged = JointCandidate(
        item_index=0,
        candidate_index=1,
        side="current",
        prompts=[prompt],
        completions=["no tags here"],
        completion_ids=[[1]],
        prompt_ids=[[1]],
    )
    SEEN.clear()
    trainer.context.score_task([tagged, untagged], {0: ITEMS[0]})
    assert SEEN == [(["red cat"], ["a big red dog"]), ([""], [""])]
    assert tagged.reward == 2.0 and untagged.reward == 0.0


def test_round_runs_with_a_comparator_that_keeps_joint_text(make_trainer, tmp_path):
    sink = MemorySink()
    trainer = make_trainer("MADPOIter", tmp_path, CENTRALIZED, sink=sink)
    trainer.train()
    collected = sink.phases[0].candidates
    assert {c.side for c in collected} == {"current", "comparator"}
    assert all(len(c.completions) == 1 and c.parse_status == "ok" for c in collected)
    assert trainer.finished


def test_centralized_scoring_covers_the_whole_completion(make_trainer, tmp_path):
    trainer = make_trainer("MADPOIter", tmp_path, CENTRALIZED)
    for group in trainer.optimizers[0].param_groups:
        group["lr"] = 0.0
    tok = trainer.tokenizers[0]
    prompt_ids = tok("the red cat")["input_ids"]
    winner = tok("big dog", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    loser = tok("up", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    pair = PreferencePair(
        prompts=["p"],
        winner_completions=["w"],
        loser_completions=["l"],
        winner_reward=1.0,
        loser_reward=0.0,
        candidate_reward_mean=0.5,
        prompt_ids=[prompt_ids],
        winner_ids=[winner],
        loser_ids=[loser],
    )
    metrics = trainer.learner.update([pair])
    model = trainer.agents[0]

    def full_logp(completion):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt_ids + completion])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        return sum(float(logprobs[len(prompt_ids) - 1 + t, tok_id]) for t, tok_id in enumerate(completion))

    assert metrics["madpo/joint_margin"] == pytest.approx(full_logp(winner) - full_logp(loser), rel=1e-4)
