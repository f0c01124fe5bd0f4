"""``MADPOConfig``: the fields every preference trainer shares (CoMLRL's, then ours, keyword-only), and their
checks."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields
from typing import Any

from comlrl_lab.trainers.preference.config import credentials
from comlrl_lab.trainers.preference.config.validation import (
    DEFAULT_JUDGE_TEMPLATE,
    DEFAULT_LABEL_GUIDELINE,
    JUDGE_PLACEHOLDERS,
    MAGRPO_FAMILY_ADVANTAGE_MODE,
    MASK,
    SECRET_FIELDS,
    ConfigError,
    _check_dependent,
    _choose,
    _clean,
    _is_int,
    _is_number,
    _jsonable,
    check_bound,
    check_field_names,
    field_multi_choices,
)


@dataclass(repr=False)
class MADPOConfig:
    """Config of ``MADPOTrainer``; every other preference config inherits these fields and checks."""

    num_train_epochs: int = field(
        default=20,
        metadata={
            "minimum": 1,
            "help": "MADPO: passes of DPO over the pair set (per round in MADPOIter). MARLHF: online-RL epochs over the train dataset.",
            "group": "Essentials",
        },
    )
    agent_learning_rate: float = field(
        default=5e-6,
        metadata={"help": "Learning rate of each agent's AdamW optimiser (weight decay 0.01).", "group": "Training"},
    )
    logging_steps: int = field(
        default=50,
        metadata={
            "minimum": 1,
            "help": "Minimum gap in environment steps between two training-metric logs.",
            "group": "Training",
        },
    )
    num_agents: int = field(
        default=2,
        metadata={
            "minimum": 1,
            "help": "Number of agent roles. Centralized collaboration requires it to equal the trainer's num_agents.",
            "group": "Devices and collaboration",
        },
    )
    # CoMLRL compares collaboration_mode exactly: no aliases, no case folding.
    collaboration_mode: str = field(
        default="decentralized",
        metadata={
            "help": "'decentralized' (one model per agent) or 'centralized' (one model writes every role's output).",
            "choices": ("decentralized", "centralized"),
            "exact": True,
            "refusal": "{name} must be {alternatives}.",
            "group": "Devices and collaboration",
        },
    )
    parallel_training: str = field(
        default="none",
        metadata={
            "help": "'none' or 'mp' (one worker thread per agent when agents sit on different devices; needs agent_devices). 'null' means none.",
            "choices": ("none", "mp"),
            "aliases": {"null": "none", "": "none"},
            "refusal": "{name} only supports: {choices}.",
            "group": "Devices and collaboration",
        },
    )
    agent_devices: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Agent devices: None or 'auto' (cuda:i per agent if enough GPUs, else cuda:0, else cpu), one device for all, or a list of 1 or num_agents devices.",
            "group": "Devices and collaboration",
            "none_means": "automatic",
        },
    )
    max_new_tokens: int = field(
        default=256,
        metadata={
            "minimum": 1,
            "help": "Maximum number of generated tokens per response (also sent to the comparator API).",
            "group": "Essentials",
        },
    )
    temperature: float = field(
        default=0.6,
        metadata={
            "exclusive_minimum": 0,
            "help": "Sampling temperature (generation always samples, one beam).",
            "group": "Generation",
        },
    )
    top_p: float = field(default=0.6, metadata={"help": "Nucleus-sampling probability mass.", "group": "Generation"})
    top_k: int | None = field(
        default=50,
        metadata={
            "minimum": 0,
            "bound_allows_none": True,
            "help": "Top-k sampling cut-off; None disables it.",
            "group": "Generation",
            "none_means": "no cut-off",
        },
    )
    num_turns: int = field(
        default=1,
        metadata={
            "minimum": 1,
            "help": "Dialogue turns per episode; preference training supports exactly 1.",
            "group": "Multi-turn (fixed for preference training)",
        },
    )
    discount: float = field(
        default=1.0,
        metadata={
            "help": "Return discount; unused by preference training, passed on to MARLHF actor-critic.",
            "group": "Policy learning (MARLHF)",
        },
    )
    joint_mode: str = field(
        default="aligned",
        metadata={
            "help": "How candidates of different agents form joint responses; preference training requires 'aligned' (checked when training).",
            "group": "Multi-turn (fixed for preference training)",
        },
    )
    early_termination_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Multi-turn early-termination reward threshold; unused with one turn.",
            "group": "Multi-turn (fixed for preference training)",
        },
    )
    external_prompt_passthrough: bool = field(
        default=False,
        metadata={
            "help": "Multi-turn prompt passthrough; unused with one turn.",
            "group": "Multi-turn (fixed for preference training)",
        },
    )
    eval_interval: int = field(
        default=16,
        metadata={
            "minimum": 0,
            "help": "MADPO: evaluate before an update when updates_seen % eval_interval == 0. MARLHF RL: every eval_interval prompts. 0 disables.",
            "group": "Evaluation",
        },
    )
    eval_num_samples: int = field(
        default=4, metadata={"minimum": 0, "help": "Number of eval items per evaluation.", "group": "Evaluation"}
    )
    eval_batch_size: int = field(
        default=1, metadata={"minimum": 1, "help": "Eval items per evaluation batch.", "group": "Evaluation"}
    )
    rollout_buffer_size: int = field(
        default=2,
        metadata={
            "minimum": 1,
            "help": "MARLHF RL: prompts buffered per agent before an update.",
            "group": "Policy learning (MARLHF)",
        },
    )
    train_batch_size: int | None = field(
        default=None,
        metadata={
            "minimum": 1,
            "help": "MADPO: pairs per optimiser step. MARLHF RL: samples per step. None -> rollout_buffer_size.",
            "group": "Training",
        },
    )
    advantage_normalization: bool = field(
        default=True,
        metadata={"help": "MARLHF RL: normalise advantages within each group.", "group": "Policy learning (MARLHF)"},
    )
    # CoMLRL never checks advantage_mode (MARLHF configs overwrite it), so an unknown name is kept as given.
    advantage_mode: str = field(
        default="mean",
        metadata={
            "help": "Advantage baseline of MARLHF's MAGRPO family; MARLHF configs overwrite it from rl_algorithm.",
            "choices": tuple(MAGRPO_FAMILY_ADVANTAGE_MODE.values()),
            "checked": False,
            "group": "Policy learning (MARLHF)",
        },
    )
    reference_kl_enabled: bool = field(
        default=False,
        metadata={
            "help": "Load frozen reference models and subtract a sampled KL penalty from MARLHF policy-learning rewards. No effect on the MADPO loss.",
            "group": "Reference KL",
        },
    )
    reference_kl_coef: float = field(
        default=0.1, metadata={"help": "Coefficient of the reference KL penalty (>= 0).", "group": "Reference KL"}
    )
    reference_devices: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Devices of the reference models: None (the agent devices), one device, or a list of 1 or num_agents devices.",
            "group": "Reference KL",
            "none_means": "the agent devices",
        },
    )
    preference_num_candidates: int = field(
        default=80,
        metadata={"minimum": 2, "help": "N: candidates sampled per agent per prompt (>= 2).", "group": "Essentials"},
    )
    preference_pairs_per_sample: int | None = field(
        default=16,
        metadata={
            "help": "Cap on pairs kept per task item; None keeps all (required with pair_selection='all').",
            "group": "Preference pairs",
        },
    )
    pair_selection: str = field(
        default="reward_gap",
        metadata={
            "help": "Which pairs to keep: 'reward_gap' (largest gaps first), 'all' or 'random'; Iter configs add 'comparator_reward'.",
            "choices": ("reward_gap", "all", "random"),
            "group": "Preference pairs",
        },
    )
    dpo_beta: float = field(
        default=0.1,
        metadata={
            "exclusive_minimum": 0,
            "help": "eta in the joint-margin DPO loss -log sigma(eta * sum_i Delta_i) (> 0).",
            "group": "Training",
        },
    )
    use_environment_step: bool = field(
        default=True,
        metadata={"help": "Whether DPO updates advance the environment-step counter.", "group": "Training"},
    )
    environment_steps_per_pair: int = field(
        default=2,
        metadata={"minimum": 1, "help": "Environment steps added per pair in each DPO update.", "group": "Training"},
    )
    # Differs from CoMLRL: fields of our own (see the help texts), keyword-only so CoMLRL's positional order holds.
    seed: int = field(
        default=42,
        kw_only=True,
        metadata={
            "minimum": 0,
            "help": "Seed of every random stream (generation, pairing, replay sampling, comparator). Same seed, same pairs. CoMLRL is unseeded.",
            "group": "Essentials",
        },
    )
    disable_dropout: bool = field(
        default=True,
        kw_only=True,
        metadata={
            "help": "Turn dropout off in every model while generating and scoring. CoMLRL scores in train mode, with dropout noise.",
            "group": "Training",
        },
    )
    score_final_token: bool = field(
        default=False,
        kw_only=True,
        metadata={
            "help": "Decentralized MADPO: also score the last completion token, including the EOS that ended it. False scores as CoMLRL (last token dropped).",
            "group": "Training",
        },
    )
    generation_batch_size: int | None = field(
        default=None,
        kw_only=True,
        metadata={
            "minimum": 1,
            "bound_allows_none": True,
            "help": "Sequences per generate call when sampling candidates (>= 1). None: 64, and for batch-invariant sampling as many more, up to 256, as keep a call's KV cache within 1 GiB (its tokens do not depend on the batching).",
            "group": "Generation",
            "none_means": "64, or more within 1 GiB KV",
        },
    )
    scoring_batch_size: int = field(
        default=16,
        kw_only=True,
        metadata={
            "minimum": 1,
            "help": "Pairs per scoring micro-batch (winner and loser in one forward; >= 1).",
            "group": "Training",
        },
    )
    pack_pair_scoring: bool = field(
        default=True,
        kw_only=True,
        metadata={
            "help": "Score sequences that share their first tokens from one row [shared tokens | each continuation] with a block-causal mask, so the shared part runs once: MADPO's pairs after their prompt; MARLHF's candidates after their prompt in the policy update, and in its reward model the pairs it fits on and the candidates it scores (their header and agent 1's prompt). The same values up to float rounding (with dropout on, other noise draws). Used where the model takes custom masks (sdpa or eager attention) and has no sliding window; False, or other models, score one row per sequence.",
            "group": "Training",
        },
    )
    output_dir: str | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "Run directory for replay files, checkpoints and the store; None -> ./runs/<run id>. A run never overwrites another run's files.",
            "group": "Training",
        },
    )
    madpo_reference: str = field(
        default="none",
        kw_only=True,
        metadata={
            "help": "MADPO only. 'none' (CoMLRL): reference-free margins. 'initial': each agent's margin is measured against a frozen copy of its initial policy, as in standard DPO (log-probs taken once when a pair is collected; with LoRA the frozen base, at no memory cost).",
            "choices": ("none", "initial"),
            "group": "MADPO stabilisers",
        },
    )
    madpo_length_normalize: bool = field(
        default=False,
        kw_only=True,
        metadata={
            "help": "MADPO only. Margins from the mean per-token log-prob instead of the sum (SimPO-style), so a longer winner is not penalised for its length. False = CoMLRL.",
            "group": "MADPO stabilisers",
        },
    )
    madpo_nll_weight: float = field(
        default=0.0,
        kw_only=True,
        metadata={
            "help": "MADPO only. Adds this weight times the winner's per-token negative log-likelihood to each agent's loss (as in RPO), so the winner's likelihood cannot fall (>= 0; 0 = CoMLRL).",
            "group": "MADPO stabilisers",
        },
    )
    eval_samples_per_item: int = field(
        default=1,
        kw_only=True,
        metadata={
            "minimum": 1,
            "help": "Responses sampled per eval item in each evaluation (>= 1; 1 = CoMLRL). Every round draws the same per-item seeds; with 2 or more the reported standard error is the within-item (stratified) one: the sampling error for this fixed eval set.",
            "group": "Evaluation",
        },
    )
    max_grad_norm: float | None = field(
        default=None,
        kw_only=True,
        metadata={
            "exclusive_minimum": 0,
            "bound_allows_none": True,
            "help": "Clip each agent's gradient norm to this value (> 0); None = no clipping, as CoMLRL.",
            "group": "Training",
        },
    )
    report_to: list[str] | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "Trackers that receive each round's metrics besides the store: wandb (project, entity, name and tags from the trainer's wandb_config; pip install comlrl-lab[wandb]), tensorboard (event files in <output_dir>/tensorboard; pip install comlrl-lab[tensorboard]) or none. None = wandb when a wandb_config is given, else none.",
            "group": "Logging",
            "multi_choices": ("wandb", "tensorboard", "none"),
        },
    )
    batch_invariant_sampling: bool = field(
        default=True,
        kw_only=True,
        metadata={
            "help": "Sample every (round, item, agent, candidate) row from its own seed, so batch size, batching order and the number of torchrun ranks never change a row's random draws (nor its tokens, unless the logits themselves shift with the batch shape). False samples each agent's rows from one stream, so the tokens depend on the batching.",
            "group": "Generation",
        },
    )
    use_chat_template: str = field(
        default="auto",
        kw_only=True,
        metadata={
            "help": "Send each agent's prompt as one user message through its tokenizer's chat template (apply_chat_template with add_generation_prompt=True) and stop a response at the template's end-of-turn token; the rendered prompt is what pairs and exports keep. 'auto': when the tokenizer has a template (instruction-tuned models; the embedded tiny model has none), 'true': always (an error without a template), 'false': never, as CoMLRL.",
            "choices": ("auto", "true", "false"),
            "group": "Generation",
        },
    )
    lora_r: int | None = field(
        default=None,
        kw_only=True,
        metadata={
            "minimum": 1,
            "bound_allows_none": True,
            "help": "LoRA rank (>= 1): train peft LoRA adapters on each agent instead of all weights; checkpoints, snapshots and save_model keep adapters only. None trains every weight (needs peft).",
            "group": "Large models",
        },
    )
    lora_alpha: float = field(
        default=16.0,
        kw_only=True,
        metadata={
            "exclusive_minimum": 0,
            "help": "LoRA scaling alpha (> 0); used when lora_r is set.",
            "group": "Large models",
        },
    )
    lora_dropout: float = field(
        default=0.0,
        kw_only=True,
        metadata={"help": "Dropout on the LoRA input, in [0, 1); used when lora_r is set.", "group": "Large models"},
    )
    lora_target_modules: str | list[str] | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "Module names that get LoRA adapters (e.g. ['q_proj', 'v_proj'] or 'all-linear'); None lets peft choose for the architecture.",
            "group": "Large models",
        },
    )
    save_strategy: str = field(
        default="phase",
        kw_only=True,
        metadata={
            "help": "When a checkpoint is written (given a checkpoint_dir): 'phase' after every phase, 'round' after each round's last phase, 'no' never. Weights are written only when training changed them.",
            "choices": ("phase", "round", "no"),
            "aliases": {"epoch": "round", "none": "no"},
            "group": "Training",
        },
    )
    concurrent_cpu_agents: bool = field(
        default=False,
        kw_only=True,
        metadata={
            "help": "Agents all on the CPU (two or more, on a machine with two or more cores): sample, evaluate and score each agent in its own thread, torch's intra-op threads split between them (the count is process-wide, so another run in the same process sees the split while they run). The same samples from the same weights; with more than one torch thread the split can change how torch sums in the last bits, so later rounds' pairs can differ from a run without it. Off by default: see docs/differences_from_comlrl.md for the measurement.",
            "group": "Devices and collaboration",
        },
    )
    keep_freed_host_memory: bool = field(
        default=True,
        kw_only=True,
        metadata={
            "help": "Agents on the CPU, Linux (glibc) only: from the first phase on, the process keeps freed blocks below 32 MiB for reuse (malloc's mmap threshold fixed at 32 MiB, its trim threshold at 64 MiB) instead of unmapping them and faulting fresh pages in at the next step, and hands its free pages back when the run ends. Training results are identical either way (see docs/differences_from_comlrl.md for the measurement). Process-wide: once set it stays for the process, and a later run with this off does not undo it. Skipped where malloc is not glibc's or the user chose or tuned it (GLIBC_TUNABLES, any MALLOC_* variable, another allocator in LD_PRELOAD).",
            "group": "Devices and collaboration",
        },
    )
    gc_freeze_during_steps: bool = field(
        default=True,
        kw_only=True,
        metadata={
            "help": "While each step (a phase, its commit and checkpoint) runs, and over the whole of train(), Python's garbage collector leaves alone the objects that existed before it (gc.freeze, undone after), so its full passes walk only what the step made instead of the hundreds of thousands of objects torch and transformers leave: one pass of about 0.3 s in a 7.5 s 32-item tiny-model run. What is computed is identical. Cyclic garbage among the older objects waits for a full pass outside every step (between the workbench's steps, after train()), and a gc.collect() during a step does not reach it. Process-wide while a step runs; CPython 3.10-3.13 with the GIL only (3.14's collector is incremental); skipped where the process has frozen objects itself.",
            "group": "Devices and collaboration",
        },
    )
    cpu_matmul: str = field(
        default="torch",
        kw_only=True,
        metadata={
            "help": "Agents on the CPU, fp32: which kernels run their large linear products (at least 20 M multiply-adds; smaller ones always use torch's BLAS). 'torch' (torch's BLAS, MKL in the PyPI wheels) or 'onednn' (the oneDNN kernels inside the same torch). On an AMD EPYC with AVX-512, MKL keeps its generic kernels, which ran fp32 at under half the CPU's speed, and 'onednn' took a third off SmolLM2-135M's sampling; on an Intel CPU MKL runs its own AVX-512 kernels and 'onednn' is no faster. Measure first (benchmarks/cpu_gemm.py). Agents on GPUs, other dtypes and CPU autocast are unaffected; the agents' nn.Linear layers change class in place (model objects passed in too, and the copies made of them), while comparator, reward and critic models keep torch's BLAS. oneDNN sums in another order: the same maths, other last bits.",
            "choices": ("torch", "onednn"),
            "group": "Devices and collaboration",
        },
    )
    save_total_limit: int | None = field(
        default=None,
        kw_only=True,
        metadata={
            "minimum": 1,
            "bound_allows_none": True,
            "help": "Keep at most this many checkpoints (checkpoint-NNNNNN folders under the checkpoint dir), deleting the oldest once a newer one is committed; the newest, which a resume uses, is always kept. None keeps all. train(checkpoint_total_limit=N) sets it too.",
            "group": "Training",
        },
    )
    save_in_background: bool = field(
        default=False,
        kw_only=True,
        metadata={
            "help": "Write each checkpoint in a background thread from a copy, so the next phase starts at once; a checkpoint counts only once its write has finished, so a killed run resumes from the one before. Costs one copy of the weights and optimiser state in memory.",
            "group": "Training",
        },
    )
    adamw_implementation: str = field(
        default="fused",
        kw_only=True,
        metadata={
            "help": "How each AdamW step runs: 'fused' (one kernel; 'foreach' where torch has none for the device), 'foreach' (multi-tensor ops) or 'for_loop' (per-tensor loop, CoMLRL's). The same update, rounded in a different order.",
            "choices": ("fused", "foreach", "for_loop"),
            "aliases": {"multi_tensor": "foreach", "loop": "for_loop", "single_tensor": "for_loop"},
            "group": "Training",
        },
    )
    gradient_checkpointing: bool = field(
        default=False,
        kw_only=True,
        metadata={
            "help": "Recompute each agent's activations in its backward pass (DPO and RL updates) to save memory, at about a third more compute.",
            "group": "Large models",
        },
    )

    # Differs from CoMLRL: its oracle is always the reward function; people and a judge model are ours (issue 26).
    preference_source: str = field(
        default="reward",
        kw_only=True,
        metadata={
            "help": "Who decides which of two joint responses is better: the reward function (CoMLRL's oracle), people (a label phase after collect waits for their verdicts, given in the Pairs page or with comlrl-lab labels import) or a judge model asked through an API in both orders.",
            "choices": ("reward", "human", "judge"),
            "choice_help": {
                "reward": "the task's reward function, as CoMLRL",
                "human": "people label blinded comparisons in the Pairs page (A / B / tie / both bad)",
                "judge": "an LLM judge, asked in both orders; kept only when both orders agree",
            },
            "group": "Preference source",
        },
    )
    labels_per_comparison: int = field(
        default=1,
        kw_only=True,
        metadata={
            "minimum": 1,
            "help": "human: how many labellers must label each comparison before the round goes on (>= 1); the pair's winner is the side more than half of them prefer, otherwise the comparison is dropped.",
            "group": "Preference source",
            "applies_when": {"preference_source": ("human",)},
        },
    )
    label_guideline: str = field(
        default=DEFAULT_LABEL_GUIDELINE,
        kw_only=True,
        metadata={
            "help": "human: the guideline the labelling view shows above each comparison.",
            "group": "Preference source",
            "applies_when": {"preference_source": ("human",)},
            "multiline": True,
        },
    )
    judge_api_url: str | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "judge: endpoint URL of the judge model (required). Credentials in it are never saved; ${ENV_VAR} is read from the environment.",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
            "strict": True,
            "required": True,
        },
    )
    judge_api_format: str = field(
        default="openai",
        kw_only=True,
        metadata={
            "help": "judge request format, as the api comparator's: generic, openai (chat completions), anthropic (Messages) or openai_responses.",
            "choices": ("generic", "openai", "anthropic", "openai_responses"),
            "aliases": {
                "openai_chat": "openai",
                "chat": "openai",
                "anthropic_messages": "anthropic",
                "messages": "anthropic",
                "responses": "openai_responses",
            },
            "suggest": True,
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )
    judge_api_model: str | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "judge: 'model' field of each request; also the labeller name of the judge's verdicts ('judge' when empty).",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )
    judge_api_key_env: str | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "judge: environment variable holding the API key (None: the format's, OPENAI_API_KEY or ANTHROPIC_API_KEY; empty: no key). The key itself is never a setting, so it is never saved.",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
            "none_means": "the format's variable",
        },
    )
    judge_template: str = field(
        default=DEFAULT_JUDGE_TEMPLATE,
        kw_only=True,
        metadata={
            "help": "judge: the prompt sent for one comparison; {prompt}, {response_a} and {response_b} are replaced by the item's prompts and the two joint responses (every agent's part). The judge's answer must begin with A, B, tie or both bad.",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
            "multiline": True,
        },
    )
    judge_max_new_tokens: int = field(
        default=16,
        kw_only=True,
        metadata={
            "minimum": 1,
            "help": "judge: most tokens of one answer (>= 1).",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )
    judge_api_timeout: float = field(
        default=60.0,
        kw_only=True,
        metadata={
            "exclusive_minimum": 0,
            "help": "judge: seconds per HTTP request (> 0); a timed-out request is retried.",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )
    judge_api_max_retries: int = field(
        default=3,
        kw_only=True,
        metadata={
            "minimum": 0,
            "help": "judge: retries of a request after HTTP 429/5xx or a timeout (>= 0), honouring Retry-After.",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )
    judge_api_max_concurrency: int = field(
        default=8,
        kw_only=True,
        metadata={
            "minimum": 1,
            "help": "judge: requests in flight at once (>= 1).",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )

    def __post_init__(self) -> None:
        if _choose(self, "collaboration_mode") == "centralized":
            # Only the Iter configs have comparator fields; a centralized run has a single actor, index 0.
            index = getattr(self, "comparator_centralized_agent_index", 0)
            if index != 0:
                raise ConfigError(
                    "Centralized collaboration has only actor index 0.",
                    field="comparator_centralized_agent_index",
                    value=index,
                )
            if hasattr(self, "comparator_generation_mode"):
                self.comparator_generation_mode = "centralized"

        self._check_report_to()
        check_bound(self, "num_train_epochs")
        check_bound(self, "num_agents")
        check_bound(self, "rollout_buffer_size")
        check_bound(self, "eval_interval")
        check_bound(self, "eval_num_samples")
        check_bound(self, "eval_batch_size")
        check_bound(self, "num_turns")
        check_bound(self, "logging_steps")

        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        check_bound(self, "train_batch_size")

        if _choose(self, "parallel_training") == "mp" and self.agent_devices is None:
            raise ConfigError(
                "parallel_training='mp' requires explicit agent_devices.",
                field="parallel_training",
                value=self.parallel_training,
            )

        if not _is_number(self.reference_kl_coef) or self.reference_kl_coef < 0:
            raise ConfigError(
                "reference_kl_coef must be >= 0.", field="reference_kl_coef", value=self.reference_kl_coef
            )
        if self.reference_kl_enabled and self.reference_devices is not None:
            self._check_device_list("reference_devices", self.reference_devices)

        if self.num_turns != 1:
            raise ConfigError("MADPO currently supports num_turns=1 only.", field="num_turns", value=self.num_turns)

        check_bound(self, "preference_num_candidates")
        if self.preference_pairs_per_sample is not None and (
            not _is_int(self.preference_pairs_per_sample) or self.preference_pairs_per_sample < 1
        ):
            raise ConfigError(
                "preference_pairs_per_sample must be >= 1 or null.",
                field="preference_pairs_per_sample",
                value=self.preference_pairs_per_sample,
            )

        check_bound(self, "dpo_beta")
        _choose(self, "madpo_reference")
        if not isinstance(self.madpo_length_normalize, bool):
            raise ConfigError(
                f"madpo_length_normalize must be true or false, got {self.madpo_length_normalize!r}.",
                field="madpo_length_normalize",
                value=self.madpo_length_normalize,
            )
        if not _is_number(self.madpo_nll_weight) or self.madpo_nll_weight < 0 or math.isinf(self.madpo_nll_weight):
            raise ConfigError(
                "madpo_nll_weight must be a finite number >= 0.", field="madpo_nll_weight", value=self.madpo_nll_weight
            )
        check_bound(self, "environment_steps_per_pair")

        selection = _choose(self, "pair_selection")
        if selection == "all" and self.preference_pairs_per_sample is not None:
            raise ConfigError(
                "preference_pairs_per_sample must be null when pair_selection='all'.",
                field="preference_pairs_per_sample",
                value=self.preference_pairs_per_sample,
            )

        # Differs from CoMLRL: these fail here, by name, not after the models have loaded (or never).
        if str(self.joint_mode).strip().lower() not in ("aligned", "align"):
            family = type(self).__name__.removesuffix("Config")
            raise ConfigError(
                f"{family} preference generation currently supports aligned joint_mode only.",
                field="joint_mode",
                value=self.joint_mode,
            )
        check_bound(self, "max_new_tokens")
        check_bound(self, "temperature")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}.", field="top_p", value=self.top_p)
        check_bound(self, "top_k")
        if not _is_number(self.agent_learning_rate) or self.agent_learning_rate < 0:
            raise ConfigError(
                f"agent_learning_rate must be a number >= 0, got {self.agent_learning_rate!r}.",
                field="agent_learning_rate",
                value=self.agent_learning_rate,
            )

        # Our fields, checked after CoMLRL's so a CoMLRL config fails with CoMLRL's message first.
        check_bound(self, "seed")
        check_bound(self, "eval_samples_per_item")
        check_bound(self, "generation_batch_size")
        check_bound(self, "scoring_batch_size")
        check_bound(self, "max_grad_norm")
        _choose(self, "adamw_implementation")
        _choose(self, "cpu_matmul")
        _choose(self, "save_strategy")
        _choose(self, "use_chat_template")
        check_bound(self, "save_total_limit")
        check_bound(self, "lora_r")
        check_bound(self, "lora_alpha")
        if not _is_number(self.lora_dropout) or not 0 <= self.lora_dropout < 1:
            raise ConfigError(
                f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}.",
                field="lora_dropout",
                value=self.lora_dropout,
            )
        targets = self.lora_target_modules
        if targets is not None and not (
            (isinstance(targets, str) and targets.strip())
            or (
                isinstance(targets, (list, tuple))
                and targets
                and all(isinstance(t, str) and t.strip() for t in targets)
            )
        ):
            raise ConfigError(
                f"lora_target_modules must be None, a module name or a non-empty list of module names, got {targets!r}.",
                field="lora_target_modules",
                value=targets,
            )
        self._check_preference_source()

    def _check_preference_source(self) -> None:
        """``preference_source`` and the label and judge settings it brings."""
        _choose(self, "preference_source")
        check_bound(self, "labels_per_comparison")
        if not isinstance(self.label_guideline, str):
            raise ConfigError("label_guideline must be a string.", field="label_guideline", value=self.label_guideline)
        _check_dependent(self, "judge_api_url", "preference_source")
        _choose(self, "judge_api_format")
        if not isinstance(self.judge_template, str):
            raise ConfigError("judge_template must be a string.", field="judge_template", value=self.judge_template)
        missing = [p for p in JUDGE_PLACEHOLDERS if p not in self.judge_template]
        if missing and self.preference_source == "judge":
            raise ConfigError(
                f"judge_template must contain {', '.join(missing)}: the judge would not see what it compares.",
                field="judge_template",
            )
        check_bound(self, "judge_max_new_tokens")
        check_bound(self, "judge_api_timeout")
        check_bound(self, "judge_api_max_retries")
        check_bound(self, "judge_api_max_concurrency")

    def _check_report_to(self) -> None:
        """``report_to`` as a list of known tracker names (a single name is accepted); "none" stands alone."""
        value = self.report_to
        if value is None:
            return
        names = [value] if isinstance(value, str) else value
        allowed = field_multi_choices(type(self), "report_to")
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ConfigError(
                f"report_to must be a list of tracker names ({', '.join(allowed)}), got {value!r}.",
                field="report_to",
                value=value,
            )
        cleaned = list(dict.fromkeys(_clean(n) for n in names))
        unknown = [n for n in cleaned if n not in allowed]
        if unknown:
            raise ConfigError(
                f"report_to entries must be one of: {', '.join(allowed)}; got {unknown[0]!r}.",
                field="report_to",
                value=value,
            )
        if "none" in cleaned and len(cleaned) > 1:
            raise ConfigError(
                "report_to: 'none' cannot be combined with other trackers.", field="report_to", value=value
            )
        self.report_to = cleaned

    def _check_device_list(self, name: str, spec: Any) -> None:
        """Shape check of a device spec without torch: a string, or a list of 1 or actor-count entries."""
        actor_count = 1 if self.collaboration_mode == "centralized" else self.num_agents
        if isinstance(spec, str):
            return
        if not isinstance(spec, (list, tuple)) or not all(isinstance(d, (str, int)) for d in spec):
            raise ConfigError(
                f"{name} must be a device string or a list of device strings, got {spec!r}.", field=name, value=spec
            )
        if len(spec) not in (1, actor_count):
            raise ConfigError(f"{name} length ({len(spec)}) must be 1 or {actor_count}.", field=name, value=spec)

    # ---- serialisation: the API key never leaves memory -------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe field values; ``comparator_api_key`` is left out, header values and URL credentials masked.

        Use this, not ``dataclasses.asdict``, which copies the key. Model objects in ``comparator_agents``
        are written as the id they were loaded from.
        """
        values = credentials.public_config({f.name: getattr(self, f.name) for f in fields(self)})
        return {name: _jsonable(value, name, name) for name, value in values.items() if name not in SECRET_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MADPOConfig:
        """Build and validate a config from ``to_dict`` output (or any subset); unknown keys are an error."""
        check_field_names(cls, data)
        return cls(**data)

    @classmethod
    def field_help(cls) -> dict[str, str]:
        """Field name -> help text, in declaration order: the one text for UI tooltips, CLI help and docs."""
        return {f.name: f.metadata["help"] for f in fields(cls)}

    def __repr__(self) -> str:
        shown = credentials.public_config({f.name: getattr(self, f.name) for f in fields(self)})
        parts = []
        for f in fields(self):
            value = MASK if f.name in SECRET_FIELDS and getattr(self, f.name) else shown.get(f.name)
            parts.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def __getstate__(self) -> dict[str, Any]:
        # Differs from CoMLRL, which saved the key into checkpoint configs: pickles (torch.save, multiprocessing)
        # drop it, and a restored config reads comparator_api_key_env again.
        state = dict(self.__dict__)
        for name in SECRET_FIELDS & state.keys():
            state[name] = None
        public = credentials.public_config(state)
        for name in (credentials.HEADERS_FIELD, credentials.URL_FIELD):
            if name in state:
                state[name] = public[name]
        return state

    def __copy__(self) -> MADPOConfig:
        # copy and deepcopy stay in memory, so they keep the key that __getstate__ would drop.
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> MADPOConfig:
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            new.__dict__[name] = copy.deepcopy(value, memo)
        return new
