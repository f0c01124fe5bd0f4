"""eval_logger receives CoMLRL's argument shapes, decentralized and centralized."""

from __future__ import annotations

from comlrl_lab.data.records import JointCandidate
from comlrl_lab.trainers.preference import base as base_module

ITEMS = [{"prompt": "left right", "topic": "t"}]


def reward(first, second, prompts=None, batch_items=None):
    return [float(len(first[0]) + len(second[0]))]


def fmt_left(item):
    return "left"


def fmt_right(item):
    return "right"


def fixed_sampler(texts):
    """Every agent 'samples' texts[agent]: the shapes are the point, not the tokens."""

    def sample(models, tokenizers, prompts, item_indices, num_candidates, *args, **kwargs):
        return [
            [
                JointCandidate(
                    item_index=index,
                    candidate_index=0,
                    side="current",
                    prompts=[p[k] for p in prompts],
                    completions=list(texts),
                    completion_ids=[[5] for _ in texts],
                    prompt_ids=[[5] for _ in texts],
                )
            ]
            for k, index in enumerate(item_indices)
        ]

    return sample


def run_eval(make_trainer, tmp_path, monkeypatch, texts, **config):
    calls = []

    def eval_logger(**kwargs):
        calls.append(kwargs)
        return [{"n": 1.0}]

    trainer = make_trainer(
        "MADPO",
        tmp_path,
        train_dataset=ITEMS,
        eval_dataset=ITEMS,
        reward_func=reward,
        formatters=[fmt_left, fmt_right],
        eval_logger=eval_logger,
        eval_aggregator=lambda logged, num_turns: {"count": len(logged)},
        eval_num_samples=1,
        **config,
    )
    monkeypatch.setattr(base_module, "sample_joint_candidates", fixed_sampler(texts))
    trainer.evaluate()
    assert len(calls) == 1
    return calls[0]


def test_decentralized_eval_logger_gets_agent_sample_turn_completions_and_item_prompts(
    make_trainer, tmp_path, monkeypatch
):
    call = run_eval(make_trainer, tmp_path, monkeypatch, ["good", "fine"])
    assert call["agent_completions_turns"] == [[["good"]], [["fine"]]]
    assert call["prompts"] == ["left right"]  # the item's prompt field, not [["left", "right"]]
    assert call["batch_items"] == ITEMS


def test_centralized_eval_logger_gets_parsed_role_texts(make_trainer, tmp_path, monkeypatch):
    joint = "<agent_0>good</agent_0> <agent_1>good</agent_1>"
    call = run_eval(make_trainer, tmp_path, monkeypatch, [joint], collaboration_mode="centralized", num_agents=2)
    assert call["agent_completions_turns"] == [[["good"]], [["good"]]]
    assert call["prompts"] == ["left right"]
