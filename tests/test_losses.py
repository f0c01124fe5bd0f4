"""Loss math against hand-computed answers: MADPO values and gradients, Bradley-Terry, advantages, KL, values."""

from __future__ import annotations

import math

import pytest
import torch

from comlrl_lab.trainers.preference.learning.losses import (
    NonFiniteLossError,
    actor_critic_advantages,
    bradley_terry_loss,
    check_finite,
    group_advantages,
    kl_k3,
    kl_penalized_returns,
    madpo_agent_loss,
    madpo_losses,
    madpo_margin,
    madpo_pair_losses,
    policy_gradient_loss,
    value_loss,
    winner_nll,
)

DTYPE = torch.float64


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def neg_log_sigmoid(x: float) -> float:
    return math.log1p(math.exp(-x))


# ------------------------------------------------------------------------------------------------- MADPO
DELTA_1 = [0.5, -1.0, 2.0]
DELTA_2 = [1.5, 0.25, -3.0]
BETA = 0.5


def test_madpo_two_agent_values_and_gradients():
    d1 = torch.tensor(DELTA_1, dtype=DTYPE, requires_grad=True)
    d2 = torch.tensor(DELTA_2, dtype=DTYPE, requires_grad=True)
    (loss_1, loss_2), joint = madpo_losses([d1, d2], BETA)

    joint_by_hand = [a + b for a, b in zip(DELTA_1, DELTA_2)]  # [2.0, -0.75, -1.0]
    expected = sum(neg_log_sigmoid(BETA * x) for x in joint_by_hand) / 3
    assert loss_1.item() == pytest.approx(expected, abs=1e-12)
    assert loss_2.item() == pytest.approx(expected, abs=1e-12)
    assert joint.tolist() == pytest.approx(joint_by_hand) and not joint.requires_grad

    # dL_i/dΔ_i(p) = -β σ(-β Δ(p)) / B; the other agent's margin gets no gradient from L_i.
    expected_grad = [-BETA * sigmoid(-BETA * x) / 3 for x in joint_by_hand]
    g11, g12 = torch.autograd.grad(loss_1, [d1, d2], allow_unused=True, retain_graph=True)
    g22, g21 = torch.autograd.grad(loss_2, [d2, d1], allow_unused=True)
    assert g11.tolist() == pytest.approx(expected_grad, abs=1e-12)
    assert g22.tolist() == pytest.approx(expected_grad, abs=1e-12)
    assert g12 is None and g21 is None


def test_madpo_summed_backward_gives_each_agent_its_own_gradient():
    d1 = torch.tensor(DELTA_1, dtype=DTYPE, requires_grad=True)
    d2 = torch.tensor(DELTA_2, dtype=DTYPE, requires_grad=True)
    losses, _ = madpo_losses([d1, d2], BETA)
    sum(losses).backward()
    expected = [-BETA * sigmoid(-BETA * (a + b)) / 3 for a, b in zip(DELTA_1, DELTA_2)]
    assert d1.grad.tolist() == pytest.approx(expected, abs=1e-12)
    assert d2.grad.tolist() == pytest.approx(expected, abs=1e-12)


def test_madpo_is_stable_for_large_margins():
    d1 = torch.tensor([-1e4, 1e4], requires_grad=True)
    d2 = torch.tensor([-1e4, 1e4])
    (loss_1, _), _ = madpo_losses([d1, d2], 0.1)
    assert torch.isfinite(loss_1)
    assert loss_1.item() == pytest.approx(2e3 / 2, rel=1e-6)  # -log σ(-2000) ≈ 2000, -log σ(2000) ≈ 0
    loss_1.backward()
    assert d1.grad.tolist() == pytest.approx([-0.1 / 2, 0.0], abs=1e-9)


def test_madpo_single_agent_is_plain_reference_free_dpo():
    d = torch.tensor([0.3, -0.2], dtype=DTYPE)
    (loss,), joint = madpo_losses([d], 1.0)
    assert loss.item() == pytest.approx((neg_log_sigmoid(0.3) + neg_log_sigmoid(-0.2)) / 2)
    assert joint.tolist() == pytest.approx([0.3, -0.2])
    with pytest.raises(ValueError):
        madpo_losses([], 1.0)


class TinyPolicy(torch.nn.Module):
    """A 'policy' whose log-prob of a feature vector is log σ(w·x + b): smooth, nonlinear, two parameters."""

    def __init__(self, dim: int, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.linear = torch.nn.Linear(dim, 1).to(DTYPE)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(1, dim, generator=generator, dtype=DTYPE))
            self.linear.bias.copy_(torch.randn(1, generator=generator, dtype=DTYPE))

    def logp(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.logsigmoid(self.linear(x)).squeeze(-1)  # (B, D) -> (B,)


def test_madpo_policy_gradient_is_team_weighted_own_gradient():
    eta, B, D = 0.7, 4, 3
    generator = torch.Generator().manual_seed(0)
    policies = [TinyPolicy(D, seed=1), TinyPolicy(D, seed=2)]
    winners = [torch.randn(B, D, generator=generator, dtype=DTYPE) for _ in policies]
    losers = [torch.randn(B, D, generator=generator, dtype=DTYPE) for _ in policies]

    margins = [pol.logp(w) - pol.logp(lo) for pol, w, lo in zip(policies, winners, losers)]
    losses, joint = madpo_losses(margins, eta)
    for policy in policies:
        policy.zero_grad()
    sum(losses).backward()

    weight = torch.sigmoid(-eta * joint)  # (B,) the team's σ(-ηΔ)
    for i, policy in enumerate(policies):
        # By hand: -∇L_i = mean_p σ(-ηΔ(p)) · η · ∇Δ_i(p), with ∇Δ_i taken pair by pair.
        expected = [torch.zeros_like(p) for p in policy.parameters()]
        for p in range(B):
            delta_ip = policy.logp(winners[i][p : p + 1]) - policy.logp(losers[i][p : p + 1])
            grads = torch.autograd.grad(delta_ip.sum(), list(policy.parameters()))
            for acc, g in zip(expected, grads):
                acc += weight[p] * eta * g / B
        for param, exp in zip(policy.parameters(), expected):
            torch.testing.assert_close(-param.grad, exp, rtol=1e-10, atol=1e-12)

    # Same gradients as CoMLRL's procedure: every margin under no_grad first, then each agent's own margin
    # with grad plus the frozen sum of the others.
    with torch.no_grad():
        frozen = [pol.logp(w) - pol.logp(lo) for pol, w, lo in zip(policies, winners, losers)]
    for i, policy in enumerate(policies):
        own = policy.logp(winners[i]) - policy.logp(losers[i])
        others = sum(f for k, f in enumerate(frozen) if k != i)
        grads = torch.autograd.grad(madpo_agent_loss(own, others, eta), list(policy.parameters()))
        for param, g in zip(policy.parameters(), grads):
            torch.testing.assert_close(param.grad, g, rtol=1e-10, atol=1e-12)


def test_madpo_pair_losses_are_the_joint_loss_per_pair():
    # margins: agent 0 [1, -1], agent 1 [0.5, 3]; joint [1.5, 2]
    d1 = torch.tensor([1.0, -1.0], dtype=DTYPE, requires_grad=True)
    d2 = torch.tensor([0.5, 3.0], dtype=DTYPE, requires_grad=True)
    losses, joint = madpo_losses([d1, d2], 0.1)
    per_pair = madpo_pair_losses(joint, 0.1)
    assert per_pair.tolist() == pytest.approx([neg_log_sigmoid(0.15), neg_log_sigmoid(0.2)], abs=1e-12)
    # With others detached every agent's loss has the joint value: the mean of the per-pair losses.
    assert [loss.item() for loss in losses] == pytest.approx([per_pair.mean().item()] * 2, abs=1e-12)


def test_madpo_mixed_dtypes_sum_the_joint_margin_in_the_widest():
    d1 = torch.tensor([0.1], dtype=torch.float32, requires_grad=True)
    d2 = torch.tensor([1e-9], dtype=DTYPE, requires_grad=True)
    (loss_1, loss_2), joint = madpo_losses([d1, d2], 1.0)
    assert joint.dtype == DTYPE and joint.item() == pytest.approx(float(torch.tensor(0.1)) + 1e-9, abs=1e-15)
    assert loss_1.dtype == torch.float32 and loss_2.dtype == DTYPE


def test_madpo_margin_with_reference_and_length_normalisation_by_hand():
    w = torch.tensor([-6.0, -2.0], dtype=DTYPE)  # summed log π(w) over 3 and 1 scored tokens
    lo = torch.tensor([-4.0, -9.0], dtype=DTYPE)  # over 2 and 3 tokens
    ref_w = torch.tensor([-5.0, -3.0], dtype=DTYPE)
    ref_lo = torch.tensor([-5.0, -6.0], dtype=DTYPE)
    w_n, lo_n = torch.tensor([3, 1]), torch.tensor([2, 3])
    assert madpo_margin(w, lo).tolist() == [-2.0, 7.0]  # the seed: log π(w) - log π(l)
    # DPO: [log π(w) - log π_ref(w)] - [log π(l) - log π_ref(l)] = [-1 - 1, 1 - (-3)]
    assert madpo_margin(w, lo, reference_winner_logps=ref_w, reference_loser_logps=ref_lo).tolist() == [-2.0, 4.0]
    # SimPO-style: per-token means, -6/3 - (-4/2) = 0 and -2/1 - (-9/3) = 1
    assert madpo_margin(w, lo, winner_counts=w_n, loser_counts=lo_n).tolist() == [0.0, 1.0]
    both = madpo_margin(
        w, lo, reference_winner_logps=ref_w, reference_loser_logps=ref_lo, winner_counts=w_n, loser_counts=lo_n
    )
    assert both.tolist() == pytest.approx([-1 / 3 - 1 / 2, 1.0 - (-1.0)], abs=1e-15)  # (-1/3 - 1/2), (1/1 + 3/3)


def test_winner_nll_is_the_per_token_mean_and_pushes_the_winner_up():
    w = torch.tensor([-6.0, -2.0], dtype=DTYPE, requires_grad=True)
    nll = winner_nll(w, torch.tensor([3, 1]))
    assert nll.item() == pytest.approx((6 / 3 + 2 / 1) / 2)
    nll.backward()
    assert w.grad.tolist() == pytest.approx([-1 / 6, -1 / 2])  # descending raises every winner's log-prob


# ------------------------------------------------------------------------------------------ Bradley-Terry
def test_bradley_terry_loss():
    winner = torch.tensor([2.0, 0.0, 1.0], dtype=DTYPE, requires_grad=True)
    loser = torch.tensor([1.0, 1.0, 1.0], dtype=DTYPE)
    loss, accuracy, margin = bradley_terry_loss(winner, loser)
    assert loss.item() == pytest.approx((neg_log_sigmoid(1) + neg_log_sigmoid(-1) + math.log(2)) / 3)
    assert accuracy.item() == pytest.approx(1 / 3) and margin.item() == pytest.approx(0.0)
    assert not accuracy.requires_grad and not margin.requires_grad
    loss.backward()
    assert winner.grad.tolist() == pytest.approx([-sigmoid(-m) / 3 for m in (1.0, -1.0, 0.0)])


# ----------------------------------------------------------------------------------------------- baselines
RETURNS = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 9.0], dtype=DTYPE)
STD = math.sqrt(40 / 6)  # deviations -3,-2,-1,0,1,5 from the mean 4: Σ² = 40, biased std


@pytest.mark.parametrize(
    ("mode", "by_hand"),
    [
        ("mean", [-3, -2, -1, 0, 1, 5]),
        ("raw", [1, 2, 3, 4, 5, 9]),
        ("max", [-8, -7, -6, -5, -4, 0]),
        ("rloo", [-3.6, -2.4, -1.2, 0, 1.2, 6]),  # R_j - mean of the other five, e.g. 1 - 23/5
    ],
)
def test_group_advantages_known_answers(mode, by_hand):
    assert group_advantages(RETURNS, mode, normalize=False).tolist() == pytest.approx(by_hand)
    assert group_advantages(RETURNS, mode, normalize=True).tolist() == pytest.approx([x / STD for x in by_hand])


def test_group_advantages_stay_distinct_when_normalized():
    vectors = {m: tuple(group_advantages(RETURNS, m, normalize=True).tolist()) for m in ("mean", "raw", "max", "rloo")}
    assert len(set(vectors.values())) == 4
    # "mean" matches CoMLRL's normalised vector for these returns (its section 6.3).
    assert vectors["mean"] == pytest.approx([-1.162, -0.775, -0.387, 0.0, 0.387, 1.936], abs=1e-3)


def test_group_advantages_edge_cases():
    one = torch.tensor([3.0])
    assert group_advantages(one, "rloo", normalize=True).tolist() == [0.0]  # G = 1 falls back to mean
    assert group_advantages(one, "raw", normalize=True).tolist() == [3.0]
    flat = torch.tensor([2.0, 2.0, 2.0])
    assert group_advantages(flat, "raw", normalize=True).tolist() == [2.0, 2.0, 2.0]  # no spread: not rescaled
    assert group_advantages(flat, "mean", normalize=True).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="advantage_mode must be one of"):
        group_advantages(RETURNS, "median", normalize=False)


def test_actor_critic_advantages_and_policy_gradient():
    returns = torch.tensor([1.0, 0.0, 2.0], dtype=DTYPE)
    values = torch.tensor([0.5, 0.5, 0.5], dtype=DTYPE, requires_grad=True)
    raw = actor_critic_advantages(returns, values, normalize=False)
    assert raw.tolist() == pytest.approx([0.5, -0.5, 1.5]) and not raw.requires_grad
    std = math.sqrt(((0.5 - 0.5) ** 2 + (-0.5 - 0.5) ** 2 + (1.5 - 0.5) ** 2) / 3)
    assert actor_critic_advantages(returns, values, normalize=True).tolist() == pytest.approx(
        [0.5 / std, -0.5 / std, 1.5 / std]
    )
    logps = torch.tensor([-1.0, -2.0, -0.5], dtype=DTYPE, requires_grad=True)
    loss = policy_gradient_loss(logps, raw)
    assert loss.item() == pytest.approx(-(0.5 * -1.0 + -0.5 * -2.0 + 1.5 * -0.5) / 3)
    loss.backward()
    assert logps.grad.tolist() == pytest.approx([-0.5 / 3, 0.5 / 3, -1.5 / 3])


def test_value_loss_plain_and_clipped():
    values = torch.tensor([1.0, 2.0], dtype=DTYPE, requires_grad=True)
    targets = torch.tensor([2.0, 0.0], dtype=DTYPE)
    assert value_loss(values, targets, coef=0.5).item() == pytest.approx(0.5 * (1 + 4) / 2)
    old = torch.tensor([0.5, 2.5], dtype=DTYPE)
    # clipped V = [0.7, 2.3]: squared errors max(1, 1.69) and max(4, 5.29)
    clipped = value_loss(values, targets, old, 0.2, coef=0.5)
    assert clipped.item() == pytest.approx(0.5 * (1.69 + 5.29) / 2)
    clipped.backward()
    # the clipped branch is active and saturated at the clip bound: no gradient through it
    assert values.grad.tolist() == pytest.approx([0.0, 0.0])
    assert value_loss(values, targets, old, None, coef=0.5).item() == pytest.approx(1.25)


# ----------------------------------------------------------------------------------------------------- KL
def test_kl_k3_and_penalized_returns():
    policy = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, float("-inf")]], dtype=DTYPE, requires_grad=True)
    reference = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.0, 0.0]], dtype=DTYPE)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    kl = kl_k3(policy, reference, mask)
    by_hand = (math.exp(-0.5) + 0.5 - 1) + (math.exp(1.0) - 1.0 - 1)  # r = -0.5, 1; the third is masked
    assert kl.tolist() == pytest.approx([by_hand, 0.0])
    assert torch.isfinite(kl).all()  # an inf in a masked position never leaks
    assert (kl >= 0).all()
    kl.sum().backward()
    assert torch.isfinite(policy.grad).all() and policy.grad[:, 2].tolist() == [0.0, 0.0]
    penalized = kl_penalized_returns(torch.tensor([1.0, 2.0], dtype=DTYPE), torch.tensor([0.5, 1.0], dtype=DTYPE), 0.1)
    assert penalized.tolist() == pytest.approx([0.95, 1.9])


# ------------------------------------------------------------------------------------------------- finite
def test_check_finite():
    loss = torch.tensor(0.25)
    assert check_finite(loss, "MADPO loss of agent 0") is loss
    with pytest.raises(NonFiniteLossError, match="MADPO loss of agent 1 is not finite") as info:
        check_finite(torch.tensor(float("nan")), "MADPO loss of agent 1")
    assert isinstance(info.value, FloatingPointError)
    with pytest.raises(NonFiniteLossError, match="inf"):
        check_finite(torch.tensor([1.0, float("inf")]), "Bradley-Terry loss")
