"""The two Iter configs: the comparator and replay-buffer fields of ``MADPOIterConfig`` and ``MARLHFIterConfig``,
and the table of all four configs by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from comlrl_lab.trainers.preference.config.madpo import MADPOConfig
from comlrl_lab.trainers.preference.config.marlhf import MARLHFConfig
from comlrl_lab.trainers.preference.config.validation import (
    _API_ONLY,
    ConfigError,
    _check_dependent,
    _choose,
    _is_int,
    check_bound,
    dependents,
)


@dataclass(repr=False)
class _IterativePreferenceConfig:
    """Comparator and replay-buffer fields shared by MADPOIterConfig and MARLHFIterConfig.

    Listed first among the bases, so its ``__post_init__`` runs the base config's checks before its own.
    """

    num_iterations: int = field(
        default=6,
        metadata={"minimum": 1, "help": "Rounds of collect -> replay sample -> train.", "group": "Essentials"},
    )
    # Defaults both iterative configs override (CoMLRL's values); declared here once.
    preference_num_candidates: int = field(
        default=20, metadata={"help": "N: candidates sampled per agent per prompt (>= 2).", "group": "Essentials"}
    )
    preference_pairs_per_sample: int | None = field(
        default=4,
        metadata={
            "help": "Cap on pairs kept per task item; None keeps all (required with pair_selection='all').",
            "group": "Preference pairs",
        },
    )
    pair_selection: str = field(
        default="comparator_reward",
        metadata={
            "help": "Which current-vs-comparator pairs to keep: 'comparator_reward', 'reward_gap', 'all' or 'random'.",
            "choices": ("reward_gap", "all", "random", "comparator_reward"),
            "group": "Preference pairs",
        },
    )
    preference_replay_mode: str = field(
        default="current",
        metadata={
            "help": "Training set per round: current (this round's pairs; aliases latest, new), nearest_k (the k most recent non-empty rounds; recent_k, last_k, k), all_history, or lambda_decay (weight (1-l)l^a/(1-l^K) for age a; lambda, td_lambda).",
            "choices": ("current", "nearest_k", "all_history", "lambda_decay"),
            "aliases": {
                "latest": "current",
                "new": "current",
                "recent_k": "nearest_k",
                "last_k": "nearest_k",
                "k": "nearest_k",
                "lambda": "lambda_decay",
                "td_lambda": "lambda_decay",
                "td-lambda": "lambda_decay",
            },
            "choice_help": {
                "current": "Train on this round's pairs only.",
                "nearest_k": "Draw from the k most recent non-empty round datasets, equal weights.",
                "all_history": "Draw from every non-empty round dataset, equal weights.",
                "lambda_decay": "Draw from every round dataset with weight (1-λ)λ^age / (1-λ^K); newest has age 0.",
            },
            "group": "Replay buffer",
        },
    )
    preference_replay_k: int | None = field(
        default=None,
        metadata={
            "help": "nearest_k: number of most recent non-empty round datasets (required, >= 1). current accepts only None or 1.",
            "minimum": 1,
            "group": "Replay buffer",
            "applies_when": {"preference_replay_mode": ("nearest_k",)},
            "symbol": "k",
            "strict": True,
            "required": True,
            # CoMLRL lets k = 1 through under 'current' (one round is what current uses anyway).
            "tolerated": {"current": 1},
            "suggested": 2,
        },
    )
    preference_replay_lambda: float | None = field(
        default=None,
        metadata={
            "help": "lambda_decay: lambda in [0, 1] (required); 0 keeps the newest round only, 1 weights all equally.",
            "minimum": 0,
            "maximum": 1,
            "group": "Replay buffer",
            "applies_when": {"preference_replay_mode": ("lambda_decay",)},
            "symbol": "λ",
            "strict": True,
            "required": True,
            "suggested": 0.5,
        },
    )
    preference_replay_sample_size: int | None = field(
        default=None,
        metadata={
            "help": "Pairs drawn per round in nearest_k, all_history and lambda_decay (>= 1); None = this round's pair count, or the latest non-empty dataset's size.",
            "minimum": 1,
            "group": "Replay buffer",
            "applies_when": {"preference_replay_mode": ("nearest_k", "all_history", "lambda_decay")},
            "strict": True,
            "none_means": "this round's pair count",
        },
    )
    preference_replay_dir: str | None = field(
        default=None,
        metadata={
            "help": "Directory of the iteration_NNNN.json round files; None = <output_dir>/preference_replay.",
            "group": "Replay buffer",
        },
    )
    log_reward_distribution: bool = field(
        default=False,
        metadata={
            "help": "Log each round's candidate and selected raw-reward histograms (16 bins over reward_func.reward_range, which must be declared): <output_dir>/reward_distributions/iteration_NNNN.json, the store and the Learning page.",
            "group": "Preference pairs",
        },
    )
    policy_checkpoint_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where to save the policies at the start and after every round; set automatically for the history comparator.",
            "group": "Comparator",
        },
    )
    comparator_policy: str = field(
        default="current",
        metadata={
            "help": "Opponent of the current agents: current (live weights, own RNG stream), current_copy (a copy on comparator_devices), model (comparator_model_name or comparator_agents), history (checkpoint comparator_history_k rounds back) or api (remote endpoint).",
            "choices": ("current", "current_copy", "model", "history", "api"),
            "aliases": {
                "self": "current",
                "online": "current",
                "copy": "current_copy",
                "online_copy": "current_copy",
                "current-offload": "current_copy",
                "current_offload": "current_copy",
                "external": "model",
                "comparator": "model",
                "reference": "model",
                "ref": "model",
                "checkpoint": "history",
                "previous": "history",
                "previous_iteration": "history",
                "http": "api",
                "endpoint": "api",
            },
            "choice_help": {
                "current": "The current agents themselves, sampled with a separate random stream.",
                "current_copy": "A copy of the current weights on comparator_devices, refreshed each collection phase.",
                "model": "A fixed model: comparator_model_name for every agent, or one per agent in comparator_agents.",
                "history": "The agents as they were comparator_history_k rounds back (checkpoints are saved automatically).",
                "api": "A remote endpoint. The key is read from the environment variable named in comparator_api_key_env; it is never typed here or saved.",
            },
            "group": "Comparator",
        },
    )
    comparator_generation_mode: str = field(
        default="decentralized",
        metadata={
            "help": "'decentralized' (one comparator per agent) or 'centralized' (one comparator model writes all roles in one joint response). Forced to centralized by centralized collaboration.",
            "choices": ("decentralized", "centralized"),
            "aliases": {
                "decentralised": "decentralized",
                "multi_agent": "decentralized",
                "multi-agent": "decentralized",
                "centralised": "centralized",
                "single_agent": "centralized",
                "single-agent": "centralized",
            },
            "group": "Comparator",
        },
    )
    comparator_centralized_agent_index: int = field(
        default=0,
        metadata={
            "help": "Centralized comparator: index of the agent whose model (and tokenizer) writes the joint response.",
            "group": "Comparator",
            "applies_when": {"comparator_generation_mode": ("centralized",)},
        },
    )
    comparator_model_name: str | None = field(
        default=None,
        metadata={
            "help": "model comparator: Hugging Face id or path used for every agent.",
            "group": "Comparator",
            "applies_when": {"comparator_policy": ("model",)},
        },
    )
    comparator_agents: list[Any] | None = field(
        default=None,
        metadata={
            "help": "model comparator: one id/path or model object per agent.",
            "group": "Comparator",
            "applies_when": {"comparator_policy": ("model",)},
        },
    )
    comparator_devices: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Comparator devices: None (agent_devices, else auto), one device, or a list.",
            "group": "Comparator",
            "applies_when": {"comparator_policy": ("current_copy", "model", "history")},
            "none_means": "the agent devices",
        },
    )
    comparator_num_candidates: int | None = field(
        default=None,
        metadata={
            "help": "M: comparator candidates per agent per prompt (>= 1); None = preference_num_candidates.",
            "minimum": 1,
            "bound_allows_none": True,
            "bound_says_null": True,
            "group": "Comparator",
        },
    )
    comparator_history_k: int | None = field(
        default=None,
        metadata={
            "minimum": 1,
            "help": "history comparator: rounds back (>= 1; None -> 1, which equals the current policy).",
            "group": "Comparator",
            "applies_when": {"comparator_policy": ("history",)},
            "none_means": "1 round back",
        },
    )
    comparator_api_url: str | None = field(
        default=None,
        metadata={
            "help": "api comparator: endpoint URL (required). Userinfo and key-like query values are never saved; ${ENV_VAR} is read from the environment.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_format: str = field(
        default="generic",
        metadata={
            "help": "api comparator request format: generic, openai (openai_chat, chat), anthropic (anthropic_messages, messages) or openai_responses (responses, codex). Other names are an error that suggests the closest one.",
            "choices": ("generic", "openai", "anthropic", "openai_responses"),
            "aliases": {
                "openai_chat": "openai",
                "chat": "openai",
                "anthropic_messages": "anthropic",
                "messages": "anthropic",
                "responses": "openai_responses",
                "codex": "openai_responses",
            },
            # Differs from CoMLRL: it sends any other name as the generic format; a typo here would send requests
            # the endpoint rejects, so an unknown name is an error with a did-you-mean hint.
            "suggest": True,
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_model: str | None = field(
        default=None,
        metadata={
            "help": "api comparator: 'model' field of each request.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_max_n_per_request: int | None = field(
        default=None,
        metadata={
            "minimum": 1,
            "bound_allows_none": True,
            "help": "openai format: cap on n per request (>= 1); None = all candidates at once (1 for DeepSeek).",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_timeout: float = field(
        default=120.0,
        metadata={
            "exclusive_minimum": 0,
            "help": "api comparator: seconds per HTTP request (> 0).",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_headers: dict[str, str] | None = field(
        default=None,
        metadata={
            "help": "api comparator: extra HTTP headers. Values are never saved (written as ***) unless given as ${ENV_VAR}, which is read from the environment.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_key: str | None = field(
        default=None,
        metadata={
            "help": "api comparator: literal key, kept in memory only (never saved, unlike CoMLRL). Prefer comparator_api_key_env.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_key_env: str | None = field(
        default=None,
        metadata={
            "help": "api comparator: environment variable holding the key, read when comparator_api_key is empty.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_key_header: str = field(
        default="Authorization",
        metadata={
            "help": "api comparator: header that carries the key.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_key_prefix: str = field(
        default="Bearer",
        metadata={
            "help": "api comparator: prefix joined to the key with one space; empty sends the key alone.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_response_field: str = field(
        default="completions",
        metadata={
            "help": "generic format: dotted path of the completions in the response JSON.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_extra_body: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "api comparator: merged last into every request body (overrides).",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    # Differs from CoMLRL: it sends requests one at a time and never retries.
    comparator_api_max_concurrency: int = field(
        default=8,
        kw_only=True,
        metadata={
            "minimum": 1,
            "help": "api comparator: requests in flight at once (>= 1). CoMLRL sends one at a time.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_max_retries: int = field(
        default=3,
        kw_only=True,
        metadata={
            "minimum": 0,
            "help": "api comparator: retries of a request after HTTP 429/5xx or a timeout (>= 0). CoMLRL never retries.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_backoff_base: float = field(
        default=0.5,
        kw_only=True,
        metadata={
            "exclusive_minimum": 0,
            "help": "api comparator: first retry delay in seconds, doubled on each retry (> 0).",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_backoff_max: float = field(
        default=60.0,
        kw_only=True,
        metadata={
            "exclusive_minimum": 0,
            "help": "api comparator: longest delay in seconds between two retries of our own backoff (> 0).",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_retry_after_max: float = field(
        default=60.0,
        kw_only=True,
        metadata={
            "exclusive_minimum": 0,
            "help": "api comparator: longest Retry-After wait in seconds the server may ask for (> 0); a longer one fails the request at once, naming this cap.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_max_response_bytes: int = field(
        default=16 * 1024 * 1024,
        kw_only=True,
        metadata={
            "minimum": 1,
            "help": "api comparator: largest response body in bytes (>= 1, default 16 MiB); a larger one fails the request as soon as it passes the bound, before the rest is read. CoMLRL reads any size.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]  # MADPOConfig or MARLHFConfig, next in the MRO
        check_bound(self, "num_iterations")
        self._check_replay()

        mode = _choose(self, "comparator_generation_mode")
        if mode == "centralized":
            index = self.comparator_centralized_agent_index
            if not _is_int(index) or not 0 <= index < self.num_agents:  # type: ignore[attr-defined]
                raise ConfigError(
                    f"comparator_centralized_agent_index must be in [0, {self.num_agents}).",  # type: ignore[attr-defined]
                    field="comparator_centralized_agent_index",
                    value=index,
                )

        check_bound(self, "comparator_num_candidates")
        check_bound(self, "comparator_api_max_n_per_request")
        self._check_comparator_policy()

        # Differs from CoMLRL: the format is resolved here, once (an unknown name is an error), not at every request.
        _choose(self, "comparator_api_format")
        # Differs from CoMLRL: the timeout is checked here, not left to fail inside the HTTP client.
        check_bound(self, "comparator_api_timeout")
        check_bound(self, "comparator_api_max_concurrency")
        check_bound(self, "comparator_api_max_retries")
        check_bound(self, "comparator_api_backoff_base")
        check_bound(self, "comparator_api_backoff_max")
        check_bound(self, "comparator_api_retry_after_max")
        check_bound(self, "comparator_api_max_response_bytes")
        url = self.comparator_api_url
        if url:
            parts = urlsplit(url) if isinstance(url, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
                # The URL may hold a credential: name its scheme, never the URL itself.
                scheme = parts.scheme if parts is not None else type(url).__name__
                raise ConfigError(
                    f"comparator_api_url must be an http(s) URL with a host, got scheme {scheme!r}.",
                    field="comparator_api_url",
                )

    def _check_replay(self) -> None:
        _choose(self, "preference_replay_mode")
        # CoMLRL's order: each field's place under the mode, then its value, field by field.
        for name in dependents(type(self), "preference_replay_mode"):
            if not _check_dependent(self, name, "preference_replay_mode"):
                continue
            check_bound(self, name)

    def _check_comparator_policy(self) -> None:
        policy = _choose(self, "comparator_policy")
        has_model = self.comparator_model_name is not None or self.comparator_agents is not None
        model_only = "comparator_model_name and comparator_agents are only valid when comparator_policy='model'."
        history_only = "comparator_history_k is only valid when comparator_policy='history'."

        if policy == "model":
            if not has_model:
                raise ConfigError(
                    "comparator_model_name or comparator_agents is required when comparator_policy='model'.",
                    field="comparator_model_name",
                )
            if self.comparator_history_k is not None:
                raise ConfigError(history_only, field="comparator_history_k", value=self.comparator_history_k)
            return
        if policy == "history":
            if self.comparator_history_k is None:
                self.comparator_history_k = 1
            check_bound(self, "comparator_history_k")
        elif self.comparator_history_k is not None:
            raise ConfigError(history_only, field="comparator_history_k", value=self.comparator_history_k)
        # CoMLRL lets the api comparator carry model fields it never uses; only current/copy/history reject them.
        if policy != "api" and has_model:
            name = "comparator_model_name" if self.comparator_model_name is not None else "comparator_agents"
            raise ConfigError(model_only, field=name, value=getattr(self, name))
        if policy == "api" and not self.comparator_api_url:
            raise ConfigError(
                "comparator_api_url is required when comparator_policy='api'.", field="comparator_api_url"
            )


@dataclass(repr=False)
class MADPOIterConfig(_IterativePreferenceConfig, MADPOConfig):
    """Config of ``MADPOIterTrainer``: MADPO repeated for num_iterations rounds against a comparator."""

    num_train_epochs: int = field(
        default=1, metadata={"help": "DPO passes over each round's training set.", "group": "Essentials"}
    )


@dataclass(repr=False)
class MARLHFIterConfig(_IterativePreferenceConfig, MARLHFConfig):
    """Config of ``MARLHFIterTrainer``: each round fits a fresh reward model, then learns the policies."""

    num_train_epochs: int = field(default=2, metadata={"help": "Online-RL epochs per round.", "group": "Essentials"})
    reward_num_train_epochs: int = field(
        default=2, metadata={"help": "Bradley-Terry training epochs per round.", "group": "Reward model (MARLHF)"}
    )
    preference_scoring_reward: str = field(
        default="task",
        metadata={
            "help": "Oracle for new comparisons: 'task' (reward_func; aliases oracle, environment, env) or 'reward_model' (the latest fitted reward model, task reward until one exists; aliases model, learned).",
            "choices": ("task", "reward_model"),
            "aliases": {
                "oracle": "task",
                "environment": "task",
                "env": "task",
                "model": "reward_model",
                "learned": "reward_model",
            },
            "group": "Preference pairs",
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _choose(self, "preference_scoring_reward")


CONFIG_CLASSES: dict[str, type[MADPOConfig]] = {
    "MADPO": MADPOConfig,
    "MARLHF": MARLHFConfig,
    "MADPOIter": MADPOIterConfig,
    "MARLHFIter": MARLHFIterConfig,
}
