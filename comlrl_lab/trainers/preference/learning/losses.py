"""Pure tensor math of the preference trainers: joint-margin DPO, Bradley-Terry, baselines, KL estimate.

Inputs are tensors that callers computed (per-sequence log-probabilities, reward-model scores, returns,
values); nothing here runs a model, moves data between devices or touches an optimiser. Every function works
on whatever device and dtype it is given.

Deliberate deviations from CoMLRL 1.4.3 (each also in docs/differences_from_comlrl.md):
* advantage normalisation divides by the group std only and never re-centres, so the four MAGRPO-family
  baselines stay distinct;
* a non-finite loss raises ``NonFiniteLossError`` instead of being replaced by 0.1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from comlrl_lab.trainers.preference.config import MADPOConfig, field_choices

#: Below this std a group or buffer counts as having no spread and is not rescaled.
STD_EPS = 1e-6
#: CoMLRL never checks advantage_mode (the config keeps any name), so the baselines refuse one they do not know.
ADVANTAGE_MODES: tuple[str, ...] = field_choices(MADPOConfig, "advantage_mode")


class NonFiniteLossError(FloatingPointError):
    """A loss came out NaN or infinite; training stops with the model and optimiser state untouched."""


def check_finite(loss: Tensor, what: str) -> Tensor:
    """Return ``loss`` unchanged, or raise ``NonFiniteLossError`` naming ``what`` if any element is NaN/inf.

    Call it before ``backward()``, so a diverged step never reaches the weights.
    """
    # Differs from CoMLRL: it silently replaces a NaN/inf loss by a constant 0.1 (its section 8.12).
    if not bool(torch.isfinite(loss.detach()).all()):
        value = loss.detach().float().cpu()
        shown = value.item() if value.numel() == 1 else value.tolist()
        raise NonFiniteLossError(
            f"{what} is not finite ({shown}); training stopped before the optimiser step. "
            "Lower the learning rate or dpo_beta, or check the rewards and log-probabilities for inf/NaN."
        )
    return loss


# ------------------------------------------------------------------------------------------------- MADPO
def madpo_margin(
    winner_logps: Tensor,
    loser_logps: Tensor,
    *,
    reference_winner_logps: Tensor | None = None,
    reference_loser_logps: Tensor | None = None,
    winner_counts: Tensor | None = None,
    loser_counts: Tensor | None = None,
) -> Tensor:
    """One agent's margin Δ_i (B,) from summed completion log-probs (B,), with the opt-in stabilisers.

    Seed (all options off): Δ_i = log π_i(w) - log π_i(l), reference-free.
    With references (``madpo_reference="initial"``), as in standard DPO:
    Δ_i = [log π_i(w) - log π_ref,i(w)] - [log π_i(l) - log π_ref,i(l)].
    With token counts (``madpo_length_normalize``, SimPO-style), every log-prob, the reference's too, is divided
    by its completion's number of scored tokens first, so a longer winner is not penalised for its length.
    """
    # Differs from CoMLRL: references and length normalisation are opt-in; with neither this is its margin.
    if reference_winner_logps is not None:
        winner_logps = winner_logps - reference_winner_logps.to(winner_logps.device, winner_logps.dtype)
        loser_logps = loser_logps - reference_loser_logps.to(loser_logps.device, loser_logps.dtype)
    if winner_counts is not None:
        winner_logps = winner_logps / winner_counts.to(winner_logps.device, winner_logps.dtype).clamp(min=1)
        loser_logps = loser_logps / loser_counts.to(loser_logps.device, loser_logps.dtype).clamp(min=1)
    return winner_logps - loser_logps


def winner_nll(winner_logps: Tensor, winner_counts: Tensor) -> Tensor:
    """Mean over pairs of the winner's per-token negative log-likelihood, -log π_i(w) / |w| (B,) -> ().

    ``madpo_nll_weight`` · this is added to agent i's loss (RPO), so the winner's likelihood cannot fall while
    the margin grows.
    """
    counts = winner_counts.to(winner_logps.device, winner_logps.dtype).clamp(min=1)
    return (-winner_logps / counts).mean()


def madpo_agent_loss(own_margin: Tensor, others_margin: Tensor, beta: float) -> Tensor:
    """L_i = mean_p -log σ(β (Δ_i(p) + sg[Σ_{k≠i} Δ_k(p)])) for one agent; both inputs (B,).

    The other agents' margin sum is detached here, so the gradient flows only through Δ_i while its weight
    σ(-βΔ) depends on the team's joint margin: dL_i/dΔ_i(p) = -β σ(-β Δ(p)) / B.
    """
    # logsigmoid is stable for large |x|; -log(sigmoid(x)) underflows to inf for x << 0.
    return -F.logsigmoid(beta * (own_margin + others_margin.detach())).mean()


def madpo_losses(own_margins: Sequence[Tensor], beta: float) -> tuple[list[Tensor], Tensor]:
    """Per-agent MADPO losses and the detached joint margin Δ (B,), from every agent's margin Δ_i (B,) with grad.

    Reference-free joint DPO (reference section 5): Δ_i = log π_i(w_i) - log π_i(l_i), Δ = Σ_i Δ_i,
    L = -log σ(β Δ). Agent i's loss sees the others' margins detached, so ``sum(losses).backward()`` gives each
    agent exactly its own gradient: the simultaneous update CoMLRL gets by scoring every pair twice, from a
    single scoring pass. Agents may sit on different devices and dtypes: Δ is summed on the CPU in at least
    float32 (float64 when an agent is float64), and each agent's loss is computed on its own device.
    """
    if len(own_margins) == 0:
        raise ValueError("madpo_losses needs at least one agent's margins")
    dtype = torch.float32
    for margin in own_margins:
        dtype = torch.promote_types(dtype, margin.dtype)
    detached = torch.stack([m.detach().to("cpu", dtype) for m in own_margins])  # (A, B)
    joint = detached.sum(dim=0)  # (B,) Δ
    losses = [
        madpo_agent_loss(margin, (joint - detached[i]).to(margin.device, margin.dtype), beta)
        for i, margin in enumerate(own_margins)
    ]
    return losses, joint


def madpo_pair_losses(joint: Tensor, beta: float) -> Tensor:
    """The joint loss of each pair, -log σ(β Δ) (B,): what ``madpo/loss`` reports, averaged."""
    return -F.logsigmoid(beta * joint)


# ------------------------------------------------------------------------------------------ reward model
def bradley_terry_loss(winner_scores: Tensor, loser_scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """-mean log σ(R(w) - R(l)) over pairs, with the pair accuracy and mean score margin (both detached)."""
    margin = winner_scores - loser_scores  # (B,)
    loss = -F.logsigmoid(margin).mean()
    detached = margin.detach()
    return loss, (detached > 0).float().mean(), detached.mean()


# --------------------------------------------------------------------------------------- policy learning
def kl_k3(policy_token_logps: Tensor, reference_token_logps: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence KL estimate Σ_t k3, k3 = exp(r) - r - 1 with r = ℓ_ref - ℓ_pol; inputs (B, T) -> (B,).

    Positions where ``mask`` is false contribute exactly 0, even if they hold inf/NaN padding values.
    """
    log_ratio = reference_token_logps - policy_token_logps  # (B, T)
    # Zero r before exp, not k3 after it: inf - inf in padding would otherwise give NaN gradients through where.
    log_ratio = torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio))
    return (torch.expm1(log_ratio) - log_ratio).sum(dim=-1)  # expm1: no cancellation when r ≈ 0


def kl_penalized_returns(returns: Tensor, kl: Tensor, coef: float) -> Tensor:
    """R' = R - coef · KL, applied before the baseline and normalisation (reference section 6.4)."""
    return returns - coef * kl


def group_advantages(returns: Tensor, mode: str, normalize: bool) -> Tensor:
    """Advantages of one group of G returns (G,) for ``advantage_mode``.

    mean: R - mean(R) (magrpo); raw: R (mareinforce); max: R - max(R) (maremax); rloo: R_j minus the mean of
    the other G-1 returns (marloo; G = 1 falls back to mean). With ``normalize`` and G > 1 the result is
    divided by the biased std of the group's returns; a group with no spread (std < 1e-6) is left unscaled.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage_mode must be one of: {', '.join(ADVANTAGE_MODES)}. Got {mode!r}.")
    G = returns.shape[0]
    if mode == "raw":
        advantages = returns.clone()
    elif mode == "max":
        advantages = returns - returns.max()
    elif mode == "rloo" and G > 1:
        advantages = (G * returns - returns.sum()) / (G - 1)  # R_j - (ΣR - R_j)/(G-1)
    else:
        advantages = returns - returns.mean()
    if normalize and G > 1:
        # Differs from CoMLRL: it re-centres (A - mean A) / std A, which maps all four modes to the same
        # vector (its section 8.3). Dividing by the returns' std keeps each baseline, only rescaled.
        advantages = advantages / _spread(returns.std(correction=0))
    return advantages


def actor_critic_advantages(returns: Tensor, values: Tensor, normalize: bool) -> Tensor:
    """A = r - V (maac, iac) over a whole buffer (N,), divided by the buffer's biased std when ``normalize``."""
    advantages = returns - values.detach()
    if normalize and advantages.numel() > 1:
        # Differs from CoMLRL: scale only, no re-centring (same rule as group_advantages).
        advantages = advantages / _spread(advantages.std(correction=0))
    return advantages


def policy_gradient_loss(sequence_logps: Tensor, advantages: Tensor, count: int | None = None) -> Tensor:
    """REINFORCE with a baseline: -Σ_j A_j · log π(y_j) / count, with the advantages treated as constants. (N,) -> ().

    ``count`` defaults to N (the mean). A micro-batch of a larger update passes the update's size, so the
    micro-batch losses add up to the update's mean.
    """
    count = sequence_logps.numel() if count is None else count
    return -(advantages.detach() * sequence_logps).sum() / count


def value_loss(
    values: Tensor,
    targets: Tensor,
    old_values: Tensor | None = None,
    clip_range: float | None = None,
    *,
    coef: float,
) -> Tensor:
    """coef · mean (target - V)², with PPO-style clipping around ``old_values`` when both are given.

    Clipped: V_clip = V_old + clamp(V - V_old, -ε, ε) and the element-wise max of both squared errors, so the
    critic cannot move further than ε from its old estimate to reduce the loss.
    """
    targets = targets.detach()
    squared = (targets - values) ** 2
    if clip_range is not None and old_values is not None:
        old_values = old_values.detach()
        clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
        squared = torch.maximum(squared, (targets - clipped) ** 2)
    return coef * squared.mean()


def _spread(std: Tensor) -> Tensor:
    """The divisor for std normalisation: the std, or 1 when it is below STD_EPS (no spread).

    CoMLRL clamps the std at 1e-6. Without re-centring, that clamp would blow a constant group of raw returns
    up by 1e6 (CoMLRL's re-centring hides this by zeroing them), so such a group is left unscaled instead.
    """
    return torch.where(std < STD_EPS, torch.ones_like(std), std)
