"""MADPO / MADPOIter trainers on a tiny random model: hand-checked gradients, comparators, NaN, resume."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from trainer_fixtures import ITEMS, small_config

from comlrl_lab.data.records import PreferencePair
from comlrl_lab.data.rewards import batched_reward
from comlrl_lab.names.phases import InvalidTransition
from comlrl_lab.trainers.preference import MADPOIterConfig
from comlrl_lab.trainers.preference.learning.losses import NonFiniteLossError
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

#: The MADPOIter runs here: three rounds of four candidates of six tokens, two pairs per item, three eval items.
ITER = dict(
    num_iterations=3, preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=6, eval_num_samples=3
)
LAMBDA_REPLAY = dict(preference_replay_mode="lambda_decay", preference_replay_lambda=0.5)


def hand_worked_pair(tok) -> PreferencePair:
    """One two-agent pair with completions of different lengths, for the update tests worked by hand."""

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    return PreferencePair(
        prompts=["the red cat one", "the red cat two"],
        winner_completions=["a", "b"],
        loser_completions=["c", "d"],
        winner_reward=1.0,
        loser_reward=0.0,
        candidate_reward_mean=0.5,
        prompt_ids=[tok("the red cat one")["input_ids"], tok("the red cat two")["input_ids"]],
        winner_ids=[ids("big dog") + [tok.eos_token_id], ids("small bird sun") + [tok.eos_token_id]],
        loser_ids=[ids("up") + [tok.eos_token_id], ids("moon moon") + [tok.eos_token_id]],
    )


def manual_logp(model, prompt_ids, completion_ids, score_final_token=False):
    """Batch-1 reference: sum of log p(completion token) over the scored positions."""
    scored = completion_ids if score_final_token else completion_ids[:-1]
    if not scored:
        return torch.zeros((), requires_grad=False)
    ids = torch.tensor([prompt_ids + completion_ids])
    logits = model(input_ids=ids).logits[0]
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(prompt_ids)
    return sum(logprobs[start - 1 + t, tok] for t, tok in enumerate(scored))


@pytest.mark.parametrize("packed", [False, True])
def test_madpo_update_matches_hand_computed_loss_and_gradients(make_trainer, tmp_path, packed):
    """The update that trains (DPOLearner.update -> losses.madpo_losses) against batch-1 forwards by hand.

    Both sides run in float64, so the comparison is exact up to summation order on any CPU. Packed scoring
    ([prompt | winner | loser] in one row) attends over masked keys as well, which Llama's float32 RMSNorm
    rounds differently: equal to float32 precision there.
    """
    rel, grad_rtol, grad_atol = (1e-6, 1e-5, 1e-6) if packed else (1e-12, 1e-9, 1e-12)
    trainer = make_trainer(
        "MADPO",
        tmp_path,
        pack_pair_scoring=packed,
        agent_learning_rate=0.0,
        preference_num_candidates=2,
        dpo_beta=0.5,
        eval_dataset=None,
    )
    for model in trainer.agents:
        model.to(torch.float64)
    pair = hand_worked_pair(trainer.tokenizers[0])
    metrics = trainer.learner.update([pair])

    beta = 0.5
    deltas = [
        manual_logp(model, pair.prompt_ids[i], pair.winner_ids[i])
        - manual_logp(model, pair.prompt_ids[i], pair.loser_ids[i])
        for i, model in enumerate(trainer.agents)
    ]
    margins = [float(delta.detach()) for delta in deltas]
    joint = sum(margins)
    assert metrics["madpo/loss"] == pytest.approx(math.log1p(math.exp(-beta * joint)), rel=rel)
    assert metrics["madpo/joint_margin"] == pytest.approx(joint, rel=rel)
    for i in range(2):
        assert metrics[f"madpo/agent_{i}/margin"] == pytest.approx(margins[i], rel=rel)
    # dL_i/dθ_i = -β σ(-βΔ) ∇Δ_i: backpropagate that hand-computed weight through each batch-1 Δ_i. Feeding it
    # as the upstream gradient (rather than scaling ∇Δ_i afterwards) keeps the model's own float32 steps
    # (Llama's RMSNorm upcasts) rounding the same numbers as in the update.
    weight = beta / (1 + math.exp(beta * joint))
    grads = []
    for model, delta in zip(trainer.agents, deltas):
        model.zero_grad(set_to_none=True)
        delta.backward(gradient=torch.tensor(-weight, dtype=torch.float64))
        grads.append([p.grad.clone() for p in model.parameters()])
    # Re-run the update to get its gradients (the manual pass above overwrote .grad).
    trainer.learner.update([pair])
    for i, model in enumerate(trainer.agents):
        for got, manual in zip((p.grad for p in model.parameters()), grads[i]):
            assert got.dtype == torch.float64
            torch.testing.assert_close(got, manual, rtol=grad_rtol, atol=grad_atol)


def test_step_refuses_a_phase_out_of_order_and_runs_nothing(make_trainer, tmp_path):
    sink = MemorySink()
    trainer = make_trainer("MADPOIter", tmp_path, ITER, num_iterations=1, sink=sink)
    with pytest.raises(InvalidTransition, match="cannot run 'train' now: the next phase of round 1 is 'collect'"):
        trainer.step("train")
    assert sink.phases == [] and trainer.next_phase == "collect"
    assert trainer.step("collect").phase == "collect"


def test_stabilised_update_matches_hand_computed_loss_and_gradients(make_trainer, tmp_path):
    """madpo_reference="initial" + length normalisation + NLL weight, through the update that trains, in float64.

    Before any step the policy equals its reference, so every margin is 0 and the DPO part is ln 2, up to the
    float32 steps inside Llama's RMSNorm (about 1e-7); agent i's gradient is -β σ(-βΔ) ∇Δ_i + α ∇NLL_i, with Δ_i
    the difference of per-token mean log-probs.
    """
    beta, alpha = 0.5, 0.3
    trainer = make_trainer(
        "MADPO",
        tmp_path,
        agent_learning_rate=0.0,
        preference_num_candidates=2,
        dpo_beta=beta,
        madpo_reference="initial",
        madpo_length_normalize=True,
        madpo_nll_weight=alpha,
        pack_pair_scoring=False,  # the batch-1 forwards by hand score two rows per pair; packing has its own test
        eval_dataset=None,
        model_config={"dtype": "fp64"},
    )
    assert all(next(m.parameters()).dtype == torch.float64 for m in trainer.agents)
    pair = hand_worked_pair(trainer.tokenizers[0])
    trainer.learner.on_pairs_collected([pair])
    for i, model in enumerate(trainer.agents):  # the reference log-probs were taken once, with the pair
        by_hand = manual_logp(model, pair.prompt_ids[i], pair.winner_ids[i]).detach().item()
        assert pair.reference_winner_logps[i] == pytest.approx(by_hand, rel=1e-6)
    metrics = trainer.learner.update([pair])
    joint = metrics["madpo/joint_margin"]
    assert joint == pytest.approx(0.0, abs=1e-5)
    assert metrics["madpo/loss"] == pytest.approx(math.log1p(math.exp(-beta * joint)), rel=1e-12)
    assert metrics["madpo/loss"] == pytest.approx(math.log(2), abs=1e-5)
    weight = beta / (1 + math.exp(beta * joint))  # β σ(-βΔ), ≈ β/2

    grads = []
    for i, model in enumerate(trainer.agents):
        model.zero_grad(set_to_none=True)
        n_w, n_l = len(pair.winner_ids[i]) - 1, len(pair.loser_ids[i]) - 1  # the last token is not scored
        logp_w = manual_logp(model, pair.prompt_ids[i], pair.winner_ids[i])
        logp_l = manual_logp(model, pair.prompt_ids[i], pair.loser_ids[i])
        assert metrics[f"madpo/agent_{i}/winner_nll"] == pytest.approx(-logp_w.detach().item() / n_w, rel=1e-12)
        # L_i = -log σ(β Δ) + α NLL_i: backpropagate dL_i/dΔ_i = -β σ(-βΔ) through Δ_i, and α through NLL_i.
        surrogate = -weight * (logp_w / n_w - logp_l / n_l) + alpha * (-logp_w / n_w)
        surrogate.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    trainer.learner.update([pair])
    for i, model in enumerate(trainer.agents):
        for got, manual in zip((p.grad for p in model.parameters()), grads[i]):
            torch.testing.assert_close(got, manual, rtol=1e-6, atol=1e-9)


def test_replayed_pairs_keep_the_reference_log_probs_of_their_collection(make_trainer, tmp_path):
    trainer = make_trainer("MADPOIter", tmp_path, ITER, num_iterations=2, madpo_reference="initial")
    for _ in range(4):
        trainer.step()  # round 1: its pairs get reference log-probs at collect, then training moves the agents
    first_round = trainer.collector.replay.round_pairs(1)
    taken = [(list(p.reference_winner_logps), list(p.reference_loser_logps)) for p in first_round]
    assert first_round and all(w is not None for w, _ in taken)
    trainer.step()  # round 2 collect: new pairs get theirs, round 1's stay as they were
    assert [(p.reference_winner_logps, p.reference_loser_logps) for p in first_round] == taken
    assert all(p.reference_winner_logps is not None for p in trainer.collector.round_pairs)


def test_nan_loss_stops_training_and_keeps_weights(make_trainer, tmp_path, monkeypatch):
    trainer = make_trainer("MADPOIter", tmp_path, ITER, num_iterations=1)
    trainer.step()  # collect
    trainer.step()  # select
    before = [p.detach().clone() for p in trainer.agents[0].parameters()]
    import comlrl_lab.trainers.preference.madpo as madpo

    def nan_logps(*args, **kwargs):
        winners, losers = original(*args, **kwargs)
        return winners * float("nan"), losers

    original = madpo.pair_logps
    monkeypatch.setattr(madpo, "pair_logps", nan_logps)
    assert trainer.collector.train_pairs, "the seeded round must produce pairs"
    with pytest.raises(NonFiniteLossError, match="loss of agent 0"):
        trainer.step()
    for a, b in zip(before, trainer.agents[0].parameters()):
        assert torch.equal(a, b)
    assert trainer.next_phase == "train"


def test_base_trainer_without_pairs_makes_no_update(make_trainer, tmp_path):
    @batched_reward
    def constant(c1, c2, **_):
        return [0.5] * len(c1)

    sink = MemorySink()
    trainer = make_trainer(
        "MADPO",
        tmp_path,
        max_new_tokens=4,
        train_dataset=ITEMS[:2],
        eval_dataset=None,
        reward_func=constant,
        sink=sink,
    )
    before = [p.detach().clone() for p in trainer.agents[1].parameters()]
    trainer.train()
    assert trainer.updates_seen == 0
    messages = [e["message"] for phase in sink.phases for e in phase.events]
    assert "MADPO: no non-tied preference pairs were generated." in messages
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.agents[1].parameters()))


def test_comparator_sampling_does_not_shift_training_stream(make_trainer, tmp_path):
    current = [MemorySink(), MemorySink()]
    for sink, policy in zip(current, ("current", "history")):
        trainer = make_trainer(
            "MADPOIter", tmp_path / policy, ITER, comparator_policy=policy, num_iterations=1, sink=sink
        )
        trainer.step()
    texts = [[c.completions for c in sink.phases[0].candidates if c.side == "current"] for sink in current]
    assert texts[0] == texts[1]


def test_comparator_candidate_count_limits_comparisons(make_trainer, tmp_path):
    sink = MemorySink()
    trainer = make_trainer(
        "MADPOIter",
        tmp_path,
        ITER,
        num_iterations=1,
        preference_num_candidates=5,
        comparator_num_candidates=2,
        pair_selection="all",
        preference_pairs_per_sample=None,
        sink=sink,
    )
    trainer.step()
    collected = sink.phases[0]
    assert sum(c.side == "comparator" for c in collected.candidates) == 2 * len(ITEMS)
    assert all(p.winner_candidate_index < 2 for p in collected.pairs)


def test_madpo_update_on_an_empty_batch_is_a_no_op(make_trainer, tmp_path):
    trainer = make_trainer("MADPO", tmp_path, preference_num_candidates=2, formatters=None, eval_dataset=None)
    before = [p.detach().clone() for model in trainer.agents for p in model.parameters()]
    assert trainer.learner.update([]) == {}
    after = [p.detach() for model in trainer.agents for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert all(not opt.state for opt in trainer.optimizers)


def test_save_checkpoint_after_a_plain_train_resumes(make_trainer, tmp_path):
    # Differs from CoMLRL, which raises "Preference checkpoint tracking was not enabled" here.
    trainer = make_trainer("MADPOIter", tmp_path, ITER, num_iterations=1, eval_interval=0)
    trainer.train()
    path = trainer.save_checkpoint(tmp_path / "ckpt")
    fresh = make_trainer("MADPOIter", tmp_path, ITER, num_iterations=1, eval_interval=0)
    fresh.load_checkpoint(path)
    assert fresh.finished and fresh.updates_seen == trainer.updates_seen > 0
    for trained, restored in zip(trainer.agents, fresh.agents):
        for a, b in zip(trained.parameters(), restored.parameters()):
            assert torch.equal(a, b)


def test_history_comparator_picks_snapshot_k_rounds_back(make_trainer, tmp_path):
    trainer = make_trainer("MADPOIter", tmp_path, ITER, comparator_policy="history", comparator_history_k=2)
    comparator = trainer.collector.comparator
    root = trainer.collector.history_dir
    assert comparator.snapshot_for_round(1).name == "initial"
    assert comparator.snapshot_for_round(2).name == "initial"
    (root / "iteration_0001").mkdir(parents=True)
    assert comparator.snapshot_for_round(3).name == "iteration_0001"
    assert comparator.snapshot_for_round(5).name == "iteration_0001"  # newest existing before round 3


def test_history_comparator_reads_snapshots_from_policy_checkpoint_dir(make_trainer, tmp_path, monkeypatch):
    # The reported case: a relative policy_checkpoint_dir; the snapshots went there, the comparator looked
    # under <output_dir>/policy_history and round 1 failed.
    monkeypatch.chdir(tmp_path)
    trainer = make_trainer(
        "MADPOIter",
        tmp_path,
        ITER,
        num_iterations=2,
        comparator_policy="history",
        policy_checkpoint_dir="snapshots",
        eval_interval=0,
    )
    trainer.train()
    snapshots = tmp_path / "snapshots"
    assert sorted(p.name for p in snapshots.iterdir()) == ["initial", "iteration_0001", "iteration_0002"]
    assert trainer.collector.comparator.snapshot_for_round(2) == Path("snapshots") / "iteration_0001"
    assert not (tmp_path / "out" / "policy_history").exists()


def test_centralized_comparator_marks_unparsed_outputs_and_continues(make_trainer, tmp_path):
    sink = MemorySink()
    trainer = make_trainer(
        "MADPOIter", tmp_path, ITER, num_iterations=1, comparator_generation_mode="centralized", sink=sink
    )
    trainer.step()
    comparator = [c for c in sink.phases[0].candidates if c.side == "comparator"]
    # A random word model never writes <agent_i> tags: every output is marked and skipped, and no pair uses one.
    assert comparator and all(c.parse_status == "unparsed" for c in comparator)
    assert sink.phases[0].pairs == []
    assert any("could not be parsed" in e["message"] for e in sink.phases[0].events)


def test_replay_files_written_in_seed_format(make_trainer, tmp_path):
    trainer = make_trainer("MADPOIter", tmp_path, ITER, num_iterations=1)
    trainer.step()
    path = Path(trainer.collector.replay.replay_dir) / "iteration_0001.json"
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert payload["iteration"] == 1
    assert payload["num_pairs"] == len(payload["pairs"]) == len(trainer.collector.round_pairs)
    if payload["pairs"]:
        assert list(payload["pairs"][0]) == [
            "prompts",
            "winner_completions",
            "loser_completions",
            "winner_reward",
            "loser_reward",
            "candidate_reward_mean",
            "raw_rewards",
            "target_raw_reward",
            "comparator_raw_reward",
        ]


RESUME_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from trainer_fixtures import build_trainer
    from test_madpo_trainer import ITER, LAMBDA_REPLAY
    trainer = build_trainer("MADPOIter", {model_dir!r}, {tmp!r}, ITER, LAMBDA_REPLAY, run_id="resume-run")
    trainer.checkpoint_dir = Path({ckpt!r})
    for _ in range(8):   # two whole rounds
        trainer.step()
    def die(count=1, tokens=0):
        os.kill(os.getpid(), signal.SIGKILL)   # killed inside round 3's collection
    trainer.control.advance = die
    trainer.step()
    """
)


def summarise(sink_or_pairs):
    return [
        (
            p.round_index,
            p.item_index,
            p.winner_candidate_index,
            p.winner_side,
            p.winner_completions,
            p.loser_completions,
        )
        for p in sink_or_pairs
    ]


@pytest.mark.slow
def test_three_rounds_equal_two_rounds_kill_resume_one(make_trainer, model_dir, tmp_path):
    straight_sink = MemorySink()
    straight = make_trainer("MADPOIter", tmp_path / "a", ITER, LAMBDA_REPLAY, sink=straight_sink, run_id="resume-run")
    straight.train()

    ckpt_dir = tmp_path / "b" / "ckpt"
    script = RESUME_SCRIPT.format(
        tests=str(Path(__file__).resolve().parent), model_dir=model_dir, tmp=str(tmp_path / "b"), ckpt=str(ckpt_dir)
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]

    resumed_sink = MemorySink()
    resumed = make_trainer("MADPOIter", tmp_path / "b", ITER, LAMBDA_REPLAY, sink=resumed_sink, run_id="resume-run")
    resumed.train(resume_from_checkpoint=ckpt_dir)
    assert resumed.round_index == 4 and resumed.finished

    assert summarise(resumed_sink.pairs(3)) == summarise(straight_sink.pairs(3))
    straight_replay = [r.replay_rows for r in straight_sink.phases if r.phase == "select" and r.round_index == 3]
    resumed_replay = [r.replay_rows for r in resumed_sink.phases if r.phase == "select" and r.round_index == 3]
    assert straight_replay == resumed_replay
    for a, b in zip(straight.agents, resumed.agents):
        for pa, pb in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(pa, pb, rtol=0, atol=1e-6)
    # Round files of rounds 1-2 were written by the killed process, round 3 by the resumed one; all in one folder.
    names = sorted(p.name for p in Path(resumed.collector.replay.replay_dir).glob("iteration_*.json"))
    assert names == ["iteration_0001.json", "iteration_0002.json", "iteration_0003.json"]


def test_evaluation_uses_the_same_samples_every_round_and_reports_mean_sem_and_n(make_trainer, tmp_path):
    trainer = make_trainer("MADPOIter", tmp_path, ITER, num_iterations=2, agent_learning_rate=0.0)
    first = trainer.evaluate()
    texts = [c.completions for c in trainer.last_eval_candidates]
    for _ in range(4):
        trainer.step()  # a whole round; with lr 0 the policy is unchanged
    assert trainer.round_index == 2
    second = trainer.evaluate()
    # Common random numbers: same prompts, same seeds, same policy -> the same samples and the same reward.
    assert [c.completions for c in trainer.last_eval_candidates] == texts
    assert second == first
    rewards = [c.reward for c in trainer.last_eval_candidates]
    n = len(rewards)
    mean = sum(rewards) / n
    sem = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1) / n)
    assert first["eval/num_samples"] == n == 3
    assert first["eval/turn_1/reward_mean"] == pytest.approx(mean)
    assert first["eval/turn_1/reward_sem"] == pytest.approx(sem)


def test_evaluation_with_several_samples_per_item_keeps_the_first_and_reports_the_within_item_error(
    make_trainer, tmp_path
):
    single = make_trainer("MADPOIter", tmp_path / "one", ITER, agent_learning_rate=0.0)
    single.evaluate()
    trainer = make_trainer(
        "MADPOIter", tmp_path / "three", ITER, num_iterations=2, agent_learning_rate=0.0, eval_samples_per_item=3
    )
    metrics = trainer.evaluate()
    samples = trainer.last_eval_candidates
    assert [(c.item_index, c.candidate_index) for c in samples] == [(k, j) for k in range(3) for j in range(3)]
    # Response j of an item comes from its own per-row seed: the first of three is the one k=1 draws.
    assert [c.completions for c in samples if c.candidate_index == 0] == [
        c.completions for c in single.last_eval_candidates
    ]
    assert len({tuple(c.completions) for c in samples}) > 3
    texts = [c.completions for c in samples]
    for _ in range(4):
        trainer.step()
    assert trainer.evaluate() == metrics  # common random numbers: the same nine samples a round later
    assert [c.completions for c in trainer.last_eval_candidates] == texts
    rewards = [[c.reward for c in samples if c.item_index == k] for k in range(3)]
    flat = [r for item in rewards for r in item]
    within = sum(3 * statistics.variance(item) for item in rewards)
    assert metrics["eval/num_samples"] == 9
    assert metrics["eval/turn_1/reward_mean"] == pytest.approx(sum(flat) / 9)
    assert metrics["eval/turn_1/reward_sem"] == pytest.approx(math.sqrt(within) / 9)


def test_the_evaluate_phase_counts_its_samples_up_to_its_total(make_trainer, tmp_path):
    from comlrl_lab.trainers.preference.runtime.sink import PhaseControl

    class Recording(PhaseControl):
        def __init__(self):
            super().__init__()
            self.seen: list[tuple[str, int, int]] = []

        def advance(self, count=1, tokens=0):
            super().advance(count, tokens)
            self.seen.append((self.phase, self.done, self.total))

    trainer = make_trainer("MADPOIter", tmp_path, ITER, num_iterations=1, eval_samples_per_item=2)
    trainer.control = Recording()
    for _ in range(4):
        trainer.step()
    # 3 eval items x 2 samples, for each of the 2 agents: 12, reached as each agent's samples are drawn.
    assert [seen for seen in trainer.control.seen if seen[0] == "evaluate"] == [
        ("evaluate", 6, 12),
        ("evaluate", 12, 12),
    ]


def test_eval_samples_per_item_must_be_a_positive_integer():
    with pytest.raises(ValueError, match="eval_samples_per_item must be >= 1"):
        MADPOIterConfig(**small_config("MADPOIter", **ITER, eval_samples_per_item=0))
