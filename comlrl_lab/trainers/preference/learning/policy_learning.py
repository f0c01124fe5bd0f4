"""MARLHF policy learning against a frozen reward model: six backends (magrpo ... iac) behind one table.

Per buffer of ``rollout_buffer_size`` task items: every agent samples G = ``num_generations`` responses to
its own prompt, candidate j of every agent forms joint response j, the frozen reward model scores each joint
response once, and agent i's return is R'_i = R - coef · KL_i (reference KL, when enabled). Advantages come
from ``losses.py``: a group baseline per item (MAGRPO family) or a critic (maac: one centralised critic over
the joint history; iac: one critic per agent, a separate model or a value head on the actor). The buffer is
then shuffled and cut into ``train_batch_size`` items, one optimiser step per agent per chunk, with the loss
mean_j -A_j · Σ_t log π_i(y_t) over every sampled token and no padding.

It does not fit the reward model, pair candidates or evaluate (``marlhf.py`` and ``base.py`` do), and it never
sees the task reward.

Deliberate deviations from CoMLRL (each also in docs/differences_from_comlrl.md):
- advantage normalisation divides by the std only (no re-centring), so magrpo, mareinforce, marloo and
  maremax stay distinct (``losses.group_advantages``);
- padding is never scored and the last real token (the EOS, when one was sampled) is; log-probs come from
  one padded forward per micro-batch, not a per-token Python loop;
- the reference KL is one batched forward per micro-batch through the policy and the reference;
- maac's shared critic takes one step per update on the agents' mean return, not one step per agent;
- critics and value heads persist across MARLHFIter rounds (and in checkpoints) instead of being rebuilt;
- critics sit on the agents' devices unless ``critic_devices`` says otherwise.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from comlrl_lab.data.records import JointCandidate
from comlrl_lab.models.devices import resolve_devices
from comlrl_lab.models.generation import SamplingSettings
from comlrl_lab.models.loading import load_model, load_once, load_tokenizer
from comlrl_lab.models.lora import reference_scoring
from comlrl_lab.models.reference import frozen_references
from comlrl_lab.models.scoring import set_mode, token_logps_and_mask
from comlrl_lab.names import metric_names as M
from comlrl_lab.seeding import RandomStreams
from comlrl_lab.trainers.preference.learning.losses import (
    NonFiniteLossError,
    actor_critic_advantages,
    check_finite,
    group_advantages,
    kl_k3,
    kl_penalized_returns,
    policy_gradient_loss,
    value_loss,
)
from comlrl_lab.trainers.preference.learning.optim import build_adamw
from comlrl_lab.trainers.preference.learning.reward_model import ScalarHeadLM, hidden_size, pooled_hidden, scalar_head
from comlrl_lab.trainers.preference.rounds.collection import agent_prompts, sample_joint_candidates
from comlrl_lab.trainers.preference.runtime.distributed import DistContext

RL_GENERATION_STREAM = "rl_generation"
RL_SHUFFLE_STREAM = "rl_shuffle"
CRITIC_INIT_STREAM = "critic_init"

#: The reward model's scores for a list of joint candidates (one float each).
RewardFn = Callable[[list[JointCandidate]], list[float]]


@dataclass(frozen=True)
class RLBackend:
    """What an ``rl_algorithm`` means: a group baseline (``advantage_mode``) or a critic layout."""

    name: str
    advantage_mode: str | None = None  # mean / raw / rloo / max for the MAGRPO family
    critic: str | None = None  # "central" (maac) or "independent" (iac)


#: ``rl_algorithm`` -> backend, resolved once per trainer.
RL_BACKENDS: dict[str, RLBackend] = {
    "magrpo": RLBackend("magrpo", advantage_mode="mean"),
    "mareinforce": RLBackend("mareinforce", advantage_mode="raw"),
    "marloo": RLBackend("marloo", advantage_mode="rloo"),
    "maremax": RLBackend("maremax", advantage_mode="max"),
    "maac": RLBackend("maac", critic="central"),
    "iac": RLBackend("iac", critic="independent"),
}


def resolve_backend(rl_algorithm: str) -> RLBackend:
    """The backend of the config's ``rl_algorithm`` (canonical already: the config resolved its aliases)."""
    return RL_BACKENDS[rl_algorithm]


def uses_critic_models(backend: RLBackend, use_separate_critic: bool) -> bool:
    """maac always has a critic model; iac has one per agent unless it uses value heads on the actors."""
    return backend.critic == "central" or (backend.critic == "independent" and bool(use_separate_critic))


def resolve_critic_sources(
    config: Any,
    agent_sources: Sequence[str | None],
    *,
    critics: Sequence[Any] | None = None,
    critic_model: Any = None,
) -> list[Any]:
    """Where each critic comes from (a name/path or a model object): ``critics``, ``critic_model``,
    ``critic_model_name``, else the agents' own sources. One entry for maac, one per agent for iac; [] when the
    backend has no critic model. Raises CoMLRL's message when only model objects without a name are known."""
    backend = resolve_backend(config.rl_algorithm)
    if not uses_critic_models(backend, config.use_separate_critic):
        return []
    count = len(agent_sources) if backend.critic == "independent" else 1
    if critics is not None:
        sources = list(critics)
        if len(sources) == 1:
            sources = sources * count
        if len(sources) < count:
            raise ValueError(f"critics must hold 1 or {count} critic models, got {len(sources)}.")
        sources = sources[:count]
    elif critic_model is not None:
        sources = [critic_model] * count
    elif config.critic_model_name:
        sources = [config.critic_model_name] * count
    else:
        sources = list(agent_sources[:count])
    if any(s is None for s in sources):
        raise ValueError("critic_model_name must be provided for MARLHF with MAAC/IAC when agent models are objects.")
    return sources


def compute_advantages(backend: RLBackend, returns: Tensor, values: Tensor | None, normalize: bool) -> Tensor:
    """Advantages (A, K, G) from returns (A, K, G) (agents, items, generations) and, for critics, values.

    MAGRPO family: ``group_advantages`` over each agent's G returns of one item. maac/iac: A = R' - V over each
    agent's whole buffer, divided by its std when ``normalize``.
    """
    A, K, G = returns.shape
    # Differs from CoMLRL: normalisation divides by the std without re-centring (losses.py), so the four
    # MAGRPO-family baselines give four different advantage vectors instead of one.
    if backend.advantage_mode is not None:
        out = torch.empty_like(returns)
        for i in range(A):
            for k in range(K):
                out[i, k] = group_advantages(returns[i, k], backend.advantage_mode, normalize)
        return out
    if values is None:
        raise ValueError(f"{backend.name} needs critic values.")
    return torch.stack(
        [actor_critic_advantages(returns[i].reshape(-1), values[i].reshape(-1), normalize).view(K, G) for i in range(A)]
    )


def central_critic_text(prompts: Sequence[str], completions: Sequence[str] | None = None) -> str:
    """The maac critic's view of the joint history: every prompt (V), plus every action for Q."""
    blocks = [f"[Agent {k}] {p}" for k, p in enumerate(prompts, start=1)]
    if completions is not None:
        blocks.append("[Joint Action]")
        blocks += [f"[Agent {k} action]\n{c}" for k, c in enumerate(completions, start=1)]
    return "\n\n".join(blocks)


@dataclass
class Rollout:
    """One buffer of sampled joint responses and what policy learning derives from them."""

    candidates: list[list[JointCandidate]]  # [k][j]: item k, generation j
    rewards: Tensor  # (K, G) reward-model scores
    kl: Tensor  # (A, K, G) reference KL estimates (zeros when disabled)
    returns: Tensor  # (A, K, G) R - coef · KL
    values: Tensor | None  # (A, K, G) critic values before the update; None for the MAGRPO family
    advantages: Tensor  # (A, K, G)
    metrics: dict[str, float]


class PolicyLearner:
    """Online multi-agent RL on the trainer's agents and optimisers, with its own critics and references."""

    def __init__(
        self,
        *,
        config: Any,
        agents: Sequence[Any],
        tokenizers: Sequence[Any],
        optimizers: Sequence[torch.optim.Optimizer],
        formatters: Sequence[Callable[[dict], str]],
        agent_devices: Sequence[torch.device],
        streams: RandomStreams,
        sampling: SamplingSettings,
        critic_sources: Sequence[Any] = (),
        model_config: dict | None = None,
        pad_token_ids: Sequence[int] | None = None,
        reference_devices: Sequence[torch.device] | None = None,
        critic_devices: Sequence[torch.device] | None = None,
        dist: DistContext | None = None,
    ):
        self.config = config
        self.dist = dist if dist is not None else DistContext()
        self.backend = resolve_backend(config.rl_algorithm)
        self.agents = list(agents)
        self.tokenizers = list(tokenizers)
        self.optimizers = list(optimizers)
        self.formatters = list(formatters)
        self.agent_devices = list(agent_devices)
        # Resolved by the trainer's DeviceLayout; None resolves the config fields here (standalone use).
        self.reference_devices = None if reference_devices is None else list(reference_devices)
        self.critic_devices = None if critic_devices is None else list(critic_devices)
        self.streams = streams
        self.sampling = sampling
        self.num_agents = len(self.agents)
        self.model_config = dict(model_config or {})
        self.pad_token_ids = list(pad_token_ids) if pad_token_ids is not None else [_pad_id(t) for t in self.tokenizers]
        self.num_generations = int(config.num_generations)
        self.micro = max(1, int(config.scoring_batch_size))
        # Differs from CoMLRL: a prompt's candidates are scored from one packed row (the prompt runs once) where the
        # model allows it; CoMLRL runs the prompt once per candidate.
        self.packed = bool(config.pack_pair_scoring)
        self.critic_lr = float(config.critic_learning_rate or config.agent_learning_rate)

        self.references = self._build_references() if config.reference_kl_enabled else []
        self.critics: list[ScalarHeadLM] = []
        self.critic_optimizers: list[torch.optim.Optimizer] = []
        self.value_heads: list[torch.nn.Module] = []
        self.value_head_optimizers: list[torch.optim.Optimizer] = []
        if uses_critic_models(self.backend, config.use_separate_critic):
            self._build_critics(list(critic_sources))
        elif self.backend.critic == "independent":
            self._build_value_heads()

    # ------------------------------------------------------------------------------------------ building
    def _build_references(self) -> list[Any]:
        """Frozen copies of the agents as they are now (the fixed reference), on ``reference_devices``."""
        # Differs from CoMLRL: its maac/iac children re-anchor the reference to the current agents every
        # MARLHFIter round; here every backend keeps the reference fixed at the initial agents.
        spec = self.config.reference_devices
        devices = self.reference_devices
        if devices is None:
            devices = (
                self.agent_devices
                if spec is None
                else resolve_devices(spec, self.num_agents, field_name="reference_devices")
            )
        return frozen_references(self.agents, self.agent_devices, devices)

    def _critic_devices(self, count: int) -> list[torch.device]:
        if self.critic_devices is not None:
            return self.critic_devices[:count]
        spec = self.config.critic_devices
        if spec is None:
            # Differs from CoMLRL: critics follow the agents (CoMLRL resolves "auto" independently).
            return self.agent_devices[:count]
        return resolve_devices(spec, self.num_agents, field_name="critic_devices")[:count]

    def _build_critics(self, sources: list[Any]) -> None:
        generator = self.streams.torch(CRITIC_INIT_STREAM, "cpu")
        devices = self._critic_devices(len(sources))
        dtype = self.model_config.get("dtype", self.model_config.get("torch_dtype"))
        loaded: dict[int, Any] = {}
        # A critic model named for several agents is read once and copied (load_once); one tokenizer per name.
        backbones = load_once(
            sources,
            devices,
            lambda source, device: load_model(
                source,
                device=device,
                dtype=dtype,
                model_kwargs=self.model_config.get("critic_model_kwargs") or self.model_config.get("model_kwargs"),
                attn_implementation=self.model_config.get("attn_implementation", "sdpa"),
            ),
        )
        tokenizers: dict[str, Any] = {}
        for index, (source, device) in enumerate(zip(sources, devices)):
            if isinstance(source, str):
                backbone = backbones[index]
                if source not in tokenizers:
                    tokenizers[source] = load_tokenizer(source)
                tokenizer = tokenizers[source]
            else:
                # A critic object shared by several agents is copied, so each agent's critic learns on its own.
                backbone = copy.deepcopy(source) if id(source) in loaded else source
                loaded[id(source)] = source
                backbone = backbone.to(device)
                tokenizer = self.tokenizers[min(index, self.num_agents - 1)]
            head = scalar_head(
                hidden_size(backbone), self.config.critic_value_head_hidden_dim, generator=generator, init="normal"
            )
            critic = ScalarHeadLM(backbone, tokenizer, head)
            critic.eval()
            self.critics.append(critic)
            self.critic_optimizers.append(
                build_adamw(critic.trainable_parameters(), self.critic_lr, self.config.adamw_implementation)
            )

    def _build_value_heads(self) -> None:
        generator = self.streams.torch(CRITIC_INIT_STREAM, "cpu")
        for agent, device in zip(self.agents, self.agent_devices):
            head = scalar_head(
                hidden_size(agent), self.config.value_head_hidden_dim, generator=generator, init="normal"
            )
            head = head.to(device)
            self.value_heads.append(head)
            self.value_head_optimizers.append(
                build_adamw(head.parameters(), self.critic_lr, self.config.adamw_implementation)
            )

    # ------------------------------------------------------------------------------------------- rollout
    def rollout(
        self,
        items: Sequence[dict],
        item_indices: Sequence[int],
        reward_fn: RewardFn,
        row_seeds: Sequence[Sequence[int] | None] | None = None,
    ) -> Rollout:
        """Sample G joint responses per item, score them with the frozen reward model, compute advantages.

        ``row_seeds[i]`` (one seed per item for agent i, from ``batch_invariant_sampling``) makes each item's
        draws its own, so under torchrun each rank samples only its strided share of the items and the buffer
        is gathered; without them every rank samples the whole buffer from the shared stream.
        """
        G = self.num_generations
        row_seeded = row_seeds is not None and all(seeds is not None for seeds in row_seeds)
        positions = self.dist.shard(range(len(items))) if row_seeded else list(range(len(items)))
        prompts = agent_prompts(self.formatters, [items[k] for k in positions])
        generators = [self.streams.torch(RL_GENERATION_STREAM, device) for device in self.agent_devices]
        sampled = sample_joint_candidates(
            self.agents,
            self.tokenizers,
            prompts,
            [item_indices[k] for k in positions],
            G,
            self.sampling,
            generators,
            side="current",
            row_seeds=[[seeds[k] for k in positions] for seeds in row_seeds] if row_seeded else None,
            devices=self.agent_devices,
        )
        joint = self.dist.gather_shards(sampled) if row_seeded else sampled
        K = len(joint)
        flat = [c for row in joint for c in row]  # item-major: index k * G + j
        # Every rank now holds the whole buffer; each scores a strided share of it, and the gathered scores are
        # the same on every rank.
        local = self.dist.shard(flat)
        rewards = torch.tensor(self.dist.gather_shards(reward_fn(local) if local else []), dtype=torch.float32)
        rewards = rewards.view(K, G)  # (K, G)
        kl_local = self._reference_kl(local).t().tolist()  # (n_local, A)
        kl = torch.tensor(self.dist.gather_shards(kl_local), dtype=torch.float32).reshape(len(flat), self.num_agents)
        kl = kl.t().contiguous().view(self.num_agents, K, G)  # (A, K, G), laid out as before: the same sums
        coef = float(self.config.reference_kl_coef) if self.config.reference_kl_enabled else 0.0
        returns = kl_penalized_returns(rewards.unsqueeze(0).expand(self.num_agents, K, G), kl, coef)  # (A, K, G)
        values = self._values(joint, grad=False) if self.backend.critic else None
        values = None if values is None else values.detach().cpu()
        advantages = compute_advantages(self.backend, returns, values, bool(self.config.advantage_normalization))
        metrics = {
            M.RL_REWARD_MODEL_MEAN: float(rewards.mean()),
            M.RL_REWARD_MODEL_STD: float(rewards.std(correction=0)),
            M.REWARD_MEAN: float(rewards.mean()),
            M.EXPECTED_RETURN: float(returns.mean()),
            M.RL_ADVANTAGE_ABS_MEAN: float(advantages.abs().mean()),
            M.RL_COMPLETION_TOKENS_MEAN: sum(sum(c.token_counts) for c in flat) / max(1, len(flat) * self.num_agents),
        }
        if self.config.reference_kl_enabled:
            metrics[M.REFERENCE_KL_MEAN] = float(kl.mean())
            metrics[M.REFERENCE_KL_PENALTY_MEAN] = coef * float(kl.mean())
            for i in range(self.num_agents):
                metrics[M.name(M.AGENT_REFERENCE_KL_MEAN, agent=i)] = float(kl[i].mean())
        if values is not None:
            metrics[M.RL_VALUE_MEAN] = float(values.mean())
        return Rollout(joint, rewards, kl, returns, values, advantages, metrics)

    def _reference_kl(self, flat: list[JointCandidate]) -> Tensor:
        """Σ_t k3 per agent and sequence, (A, N), on the CPU; zeros when the reference KL is disabled."""
        kl = torch.zeros(self.num_agents, len(flat))
        if not self.references or not flat:
            return kl
        with torch.no_grad():
            for i, (agent, reference) in enumerate(zip(self.agents, self.references)):
                prompt_ids = [c.prompt_ids[i] for c in flat]
                completion_ids = [c.completion_ids[i] for c in flat]
                was_training = agent.training
                set_mode(agent, False)
                policy, mask = token_logps_and_mask(
                    agent,
                    prompt_ids,
                    completion_ids,
                    pad_token_id=self.pad_token_ids[i],
                    micro_batch_size=self.micro,
                    packed=self.packed,
                )
                set_mode(agent, was_training)
                with reference_scoring(reference):
                    ref, _ = token_logps_and_mask(
                        reference,
                        prompt_ids,
                        completion_ids,
                        pad_token_id=self.pad_token_ids[i],
                        micro_batch_size=self.micro,
                        packed=self.packed,
                    )
                kl[i] = kl_k3(policy.cpu(), ref.cpu(), mask.cpu())
        return kl

    # ------------------------------------------------------------------------------------------- critics
    def _values(self, joint: list[list[JointCandidate]], *, grad: bool, agents: Sequence[int] | None = None) -> Tensor:
        """Critic values (A, K, G) for the items of ``joint``; V(prompt) is shared by an item's G generations."""
        K, G = len(joint), self.num_generations
        rows = []
        for i in agents if agents is not None else range(self.num_agents):
            with torch.set_grad_enabled(grad):
                rows.append(self._agent_values(i, joint).reshape(K, -1).expand(K, G))
        return torch.stack([r.to(rows[0].device) for r in rows])

    def _agent_values(self, i: int, joint: list[list[JointCandidate]]) -> Tensor:
        """(K,) for critic_type v, (K·G,) for q, on the critic's device."""
        q = self.config.critic_type == "q"
        if self.backend.critic == "central":
            if q:
                texts = [central_critic_text(c.prompts, c.completions) for row in joint for c in row]
            else:
                texts = [central_critic_text(row[0].prompts) for row in joint]
            return self.critics[0].score_texts(texts, micro_batch_size=self.micro)
        if self.critics:
            if q:
                texts = [c.prompts[i] + c.completions[i] for row in joint for c in row]
            else:
                texts = [row[0].prompts[i] for row in joint]
            return self.critics[i].score_texts(texts, micro_batch_size=self.micro)
        # Value head on the actor: the actor's own tokens, its last hidden state.
        if q:
            ids = [c.prompt_ids[i] + c.completion_ids[i] for row in joint for c in row]
        else:
            ids = [row[0].prompt_ids[i] for row in joint]
        return self._head_values(i, ids)

    def _head_values(self, i: int, sequences: list[list[int]]) -> Tensor:
        parts = []
        for start in range(0, len(sequences), self.micro):
            chunk = sequences[start : start + self.micro]
            input_ids, attention_mask = _right_pad(chunk, self.pad_token_ids[i], self.agent_devices[i])
            parts.append(self.value_heads[i](pooled_hidden(self.agents[i], input_ids, attention_mask)).squeeze(-1))
        return torch.cat(parts)

    # -------------------------------------------------------------------------------------------- update
    def update(self, rollout: Rollout) -> list[dict[str, float]]:
        """Shuffle the buffer's items, one optimiser step per agent (and critic) per ``train_batch_size`` items."""
        K = len(rollout.candidates)
        order = list(range(K))
        self.streams.python(RL_SHUFFLE_STREAM).shuffle(order)
        batch = int(self.config.train_batch_size)
        # Modes are switched once per update call, not per chunk; everything is left in eval mode.
        try:
            return [self._update_chunk(rollout, order[start : start + batch]) for start in range(0, K, batch)]
        finally:
            for model in (*self.agents, *self.critics):
                set_mode(model, False)

    def _update_chunk(self, rollout: Rollout, chunk: list[int]) -> dict[str, float]:
        G = self.num_generations
        joint = [rollout.candidates[k] for k in chunk]
        flat = [c for row in joint for c in row]  # (len(chunk) · G) sequences, item-major
        metrics: dict[str, float] = {}
        losses = []
        for i, (agent, optimizer) in enumerate(zip(self.agents, self.optimizers)):
            optimizer.zero_grad(set_to_none=True)
            # Gradient checkpointing acts only in train mode; dropout is zeroed at load when disabled.
            set_mode(
                agent, not self.config.disable_dropout or bool(getattr(self.config, "gradient_checkpointing", False))
            )
            advantages = rollout.advantages[i, chunk].reshape(-1)  # (n,)
            policy_loss = self._policy_gradients(i, agent, flat, advantages)
            if self.value_heads:
                metrics[M.name(M.RL_AGENT_VALUE_LOSS, agent=i)] = self._value_head_step(i, rollout, chunk, joint)
            if self.config.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(agent.parameters(), self.config.max_grad_norm)
            optimizer.step()
            if self.value_heads:
                self.value_head_optimizers[i].step()
            losses.append(policy_loss)
            metrics[M.name(M.RL_AGENT_LOSS, agent=i)] = policy_loss
        metrics[M.RL_LOSS] = sum(losses) / len(losses)
        if self.critics:
            metrics.update(self._critic_step(rollout, chunk, joint))
        metrics[M.RL_ITEMS_PER_UPDATE] = float(len(chunk))
        metrics[M.RL_SEQUENCES_PER_UPDATE] = float(len(chunk) * G)
        return metrics

    def _policy_gradients(self, i: int, agent: Any, flat: list[JointCandidate], advantages: Tensor) -> float:
        """Backward of agent i's policy loss over ``flat`` (one update's sequences); the loss, summed over ranks.

        Under torchrun each rank scores a strided share of the sequences (the loss is normalised by all ``n`` of
        them) and the gradients are summed, so every rank holds the gradient one process computes.
        """
        n = len(flat)
        positions = self.dist.shard(list(range(n)))
        policy_loss = 0.0
        failure = None
        try:
            for start in range(0, len(positions), self.micro):
                index = positions[start : start + self.micro]
                part = [flat[p] for p in index]
                token_logps, mask = token_logps_and_mask(
                    agent,
                    [c.prompt_ids[i] for c in part],
                    [c.completion_ids[i] for c in part],
                    pad_token_id=self.pad_token_ids[i],
                    micro_batch_size=self.micro,
                    packed=self.packed,
                )
                # Differs from CoMLRL: its loss scores the padded completion tensor (trailing pad/EOS included)
                # and skips the last real token; here every sampled token counts and padding never does.
                logps = (token_logps * mask).sum(dim=-1)  # (b,) Σ_t log π over real tokens only
                adv = advantages[index].to(logps.device, logps.dtype)
                loss = policy_gradient_loss(logps, adv, count=n)  # mean_j -A_j log π(y_j) over the chunk
                check_finite(loss, f"MARLHF policy loss of agent {i} (update)")
                if loss.requires_grad:
                    loss.backward()
                policy_loss += float(loss.detach())
        except NonFiniteLossError as error:
            if not self.dist.enabled:
                raise
            failure = error  # raised below on every rank, so no rank waits in a collective
        if self.dist.enabled:
            policy_loss, failed = self.dist.all_reduce_sum([policy_loss, failure is not None])
            if failed > 0:
                raise failure or NonFiniteLossError(
                    f"MARLHF policy loss of agent {i} (update) is not finite on another rank; training stopped."
                )
            self.dist.sum_gradients(agent.parameters())
        return policy_loss

    def _value_head_step(self, i: int, rollout: Rollout, chunk: list[int], joint) -> float:
        """Clipped value loss of agent i's value head; its gradient joins the policy gradient (one backward)."""
        self.value_head_optimizers[i].zero_grad(set_to_none=True)
        values = self._values(joint, grad=True, agents=[i])[0]  # (k, G)
        targets = rollout.returns[i, chunk].to(values.device)
        old = rollout.values[i, chunk].to(values.device)
        # Value clipping around the rollout-time value, only for heads on the actors (as CoMLRL).
        loss = value_loss(values, targets, old, self.config.value_clip_range, coef=float(self.config.value_loss_coef))
        check_finite(loss, f"MARLHF value loss of agent {i}")
        loss.backward()
        return float(loss.detach())

    def _critic_step(self, rollout: Rollout, chunk: list[int], joint) -> dict[str, float]:
        """One step per critic model: iac fits agent i's returns, maac the agents' mean return."""
        metrics = {}
        coef = float(self.config.value_loss_coef)
        for index, (critic, optimizer) in enumerate(zip(self.critics, self.critic_optimizers)):
            optimizer.zero_grad(set_to_none=True)
            set_mode(critic, not self.config.disable_dropout)
            agent = 0 if self.backend.critic == "central" else index
            values = self._values(joint, grad=True, agents=[agent])[0]  # (k, G)
            if self.backend.critic == "central":
                # Differs from CoMLRL: one step on the team's mean return instead of one step per agent.
                targets = rollout.returns[:, chunk].mean(dim=0)
            else:
                targets = rollout.returns[index, chunk]
            loss = value_loss(values, targets.to(values.device), coef=coef)
            check_finite(loss, f"MARLHF critic loss {index}")
            loss.backward()
            if self.config.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(critic.trainable_parameters(), self.config.max_grad_norm)
            optimizer.step()
            metrics[M.name(M.RL_CRITIC_VALUE_LOSS, critic=index)] = float(loss.detach())
        metrics[M.RL_VALUE_LOSS] = sum(metrics.values()) / len(metrics)
        return metrics

    # --------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Critics, value heads and their optimisers (the references are fixed copies of the initial agents)."""
        return {
            "critics": [_cpu_state(c) for c in self.critics],
            "critic_optimizers": [o.state_dict() for o in self.critic_optimizers],
            "value_heads": [_cpu_state(h) for h in self.value_heads],
            "value_head_optimizers": [o.state_dict() for o in self.value_head_optimizers],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for modules, key in ((self.critics, "critics"), (self.value_heads, "value_heads")):
            saved = state.get(key, [])
            if len(saved) != len(modules):
                raise ValueError(f"checkpoint holds {len(saved)} {key}, this trainer has {len(modules)}.")
            for module, weights in zip(modules, saved):
                module.load_state_dict(weights)
        for optimizers, key in (
            (self.critic_optimizers, "critic_optimizers"),
            (self.value_head_optimizers, "value_head_optimizers"),
        ):
            for optimizer, opt_state in zip(optimizers, state.get(key, [])):
                optimizer.load_state_dict(opt_state)


def _cpu_state(module: torch.nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def _pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _right_pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    width = max(1, max(len(r) for r in rows))
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (b, T)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        input_ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[b, : len(row)] = 1
    return input_ids.to(device), attention_mask.to(device)
