"""The names of every metric a trainer records, with what each one means: the one list of them.

The trainers write metrics under these names, the workbench groups and labels its charts by their ``kind``,
and ``docs/metrics.md`` is generated from ``METRICS`` (``scripts/gen_metrics_reference.py``). A name with
``{agent}``, ``{critic}``, ``{phase}`` or ``{key}`` in it is a template: ``name(template, agent=0)`` fills it.
This module only names things; it computes nothing and imports neither torch nor the store. It lives in
``comlrl_lab.names`` because the trainers write these names, the store queries them and the workbench draws them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Prefix of a metric that is the mean over one train phase of a per-update metric (``round/madpo/loss``).
ROUND_PREFIX = "round/"
#: Prefix of every metric of the evaluate phase.
EVAL_PREFIX = "eval/"


@dataclass(frozen=True)
class Metric:
    """One metric name (or template), the family a chart puts it in, and what it means."""

    name: str
    kind: str  # one of KINDS
    help: str
    # "all", "MADPO" (both MADPO trainers), "MARLHF" (both MARLHF trainers), "iterative" or "single" (MADPO, MARLHF)
    algorithms: str = "all"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def pattern(self) -> re.Pattern[str]:
        """A regex matching every concrete name of this template."""
        parts = re.split(r"(\{[a-z]+\})", self.name)
        body = "".join(
            (r"[^/]+" if part == "{key}" else r"[A-Za-z0-9_]+") if part.startswith("{") else re.escape(part)
            for part in parts
        )
        return re.compile(rf"(?:{re.escape(ROUND_PREFIX)})?{body}")


#: The families charts group metrics in.
KINDS = (
    "reward",
    "dpo_loss",
    "bt_loss",
    "nll",
    "rl_loss",
    "margin",
    "reward_margin",
    "accuracy",
    "share",
    "logp",
    "kl",
    "count",
    "time",
    "other",
)

# -- collection (every trainer) ------------------------------------------------------------------------------
REWARD_MEAN = "turn_1/reward_mean"
EXPECTED_RETURN = "turn_1/expected_return"
COLLECTED_PAIRS = "pairs/collected"
COLLECT_TOKENS_PER_SECOND = "collect/tokens_per_second"
COMPARATOR_REWARD_MEAN = "collect/comparator_reward_mean"
UNPARSED_COMPARATOR_CANDIDATES = "collect/unparsed_comparator_candidates"
CURRENT_WIN_SHARE = "collect/current_win_share"
CURRENT_ITERATION = "iter/current_iteration"
CURRENT_PREFERENCE_PAIRS = "iter/current_preference_pairs"
TOTAL_PREFERENCE_PAIRS = "iter/total_preference_pairs"
TRAIN_PREFERENCE_PAIRS = "iter/train_preference_pairs"
# log_reward_distribution: CoMLRL's summary of each round's file ({key}: see the help texts below)
REWARD_DISTRIBUTION = "iter/reward_distribution/{key}"
SELECTED_REWARD_DISTRIBUTION = "iter/selected_reward_distribution/{key}"
# -- label phase (preference_source human or judge) ------------------------------------------------------------
LABEL_COMPARISONS = "label/comparisons"
LABEL_COUNT = "label/labels"
LABEL_KAPPA_VS_REWARD = "label/kappa_vs_reward"
LABEL_AGREEMENT_VS_REWARD = "label/agreement_vs_reward"
LABEL_FLEISS_KAPPA = "label/fleiss_kappa"
LABEL_KRIPPENDORFF_ALPHA = "label/krippendorff_alpha"
JUDGE_VERDICTS = "label/judge_verdicts"
JUDGE_INCONSISTENT = "label/judge_inconsistent"
JUDGE_UNPARSEABLE = "label/judge_unparseable"
LABELLED_PAIRS = "label/pairs_kept"
LABELLED_DROPPED = "label/comparisons_dropped"
LABELLED_OVERRULED = "label/pairs_overruling_reward"
# -- MADPO updates -------------------------------------------------------------------------------------------
MADPO_LOSS = "madpo/loss"
MADPO_JOINT_MARGIN = "madpo/joint_margin"
MADPO_PAIR_ACCURACY = "madpo/pair_accuracy"
MADPO_AGENT_MARGIN = "madpo/agent_{agent}/margin"
MADPO_WINNER_NLL = "madpo/agent_{agent}/winner_nll"
WINNER_LOGPS = "logps/agent_{agent}/winner"
LOSER_LOGPS = "logps/agent_{agent}/loser"
#: The per-update MADPO metrics that also get a ``round/`` mean at the end of each train phase.
MADPO_ROUND_SUMMARY = (MADPO_LOSS, MADPO_JOINT_MARGIN, MADPO_PAIR_ACCURACY)
# -- MARLHF: the Bradley-Terry fit ---------------------------------------------------------------------------
BT_LOSS = "bt/loss"
BT_ACCURACY = "bt/accuracy"
BT_MARGIN = "bt/margin"
BT_VAL_LOSS = "bt/val_loss"
BT_VAL_ACCURACY = "bt/val_accuracy"
BT_VAL_MARGIN = "bt/val_margin"
BT_EPOCH = "bt/epoch"
BT_TRAIN_PAIRS = "bt/train_pairs"
BT_VAL_PAIRS = "bt/val_pairs"
# -- MARLHF: policy learning ---------------------------------------------------------------------------------
RL_LOSS = "rl/loss"
RL_AGENT_LOSS = "rl/agent_{agent}/loss"
RL_REWARD_MODEL_MEAN = "rl/reward_model_mean"
RL_REWARD_MODEL_STD = "rl/reward_model_std"
RL_ADVANTAGE_ABS_MEAN = "rl/advantage_abs_mean"
RL_COMPLETION_TOKENS_MEAN = "rl/completion_tokens_mean"
RL_VALUE_MEAN = "rl/value_mean"
RL_VALUE_LOSS = "rl/value_loss"
RL_AGENT_VALUE_LOSS = "rl/agent_{agent}/value_loss"
RL_CRITIC_VALUE_LOSS = "rl/critic_{critic}/value_loss"
RL_ITEMS_PER_UPDATE = "rl/items_per_update"
RL_SEQUENCES_PER_UPDATE = "rl/sequences_per_update"
RL_CALLBACK = "rl/{key}"
REFERENCE_KL_MEAN = "turn_1/reference_kl_mean"
REFERENCE_KL_PENALTY_MEAN = "turn_1/reference_kl_penalty_mean"
AGENT_REFERENCE_KL_MEAN = "turn_1/agent_{agent}/reference_kl_mean"
#: The per-update policy-learning metrics that also get a ``round/`` mean at the end of each train phase.
RL_ROUND_SUMMARY = (RL_LOSS, RL_REWARD_MODEL_MEAN)
# -- evaluation and timing -----------------------------------------------------------------------------------
EVAL_REWARD_MEAN = EVAL_PREFIX + REWARD_MEAN
EVAL_EXPECTED_RETURN = EVAL_PREFIX + EXPECTED_RETURN
EVAL_REWARD_SEM = EVAL_PREFIX + "turn_1/reward_sem"
EVAL_NUM_SAMPLES = EVAL_PREFIX + "num_samples"
EVAL_AGGREGATED = EVAL_PREFIX + "{key}"
# A code task (a reward whose breakdowns count tests: humaneval): what a coder reports of the evaluation.
EVAL_CODE_PREFIX = EVAL_PREFIX + "code/"
EVAL_PASS_AT_1 = EVAL_CODE_PREFIX + "pass_at_1"
EVAL_PASS_AT_1_LOW = EVAL_CODE_PREFIX + "pass_at_1_ci_low"
EVAL_PASS_AT_1_HIGH = EVAL_CODE_PREFIX + "pass_at_1_ci_high"
EVAL_LEVEL_REWARD_MEAN = EVAL_CODE_PREFIX + "level_reward_mean"
EVAL_LEVEL_REWARD_LOW = EVAL_CODE_PREFIX + "level_reward_ci_low"
EVAL_LEVEL_REWARD_HIGH = EVAL_CODE_PREFIX + "level_reward_ci_high"
PHASE_SECONDS = "time/{phase}_seconds"
# Named after the phase, as the phase times are: train and evaluate share a step, and a name is one per step.
CHECKPOINT_PREFIX = "checkpoint/"
CHECKPOINT_SECONDS = CHECKPOINT_PREFIX + "{phase}_seconds"
CHECKPOINT_BACKGROUND_SECONDS = CHECKPOINT_PREFIX + "{phase}_background_seconds"
CHECKPOINT_BYTES = CHECKPOINT_PREFIX + "{phase}_bytes"

METRICS: tuple[Metric, ...] = (
    Metric(
        REWARD_MEAN,
        "reward",
        "Mean processed task reward of the current agents' candidates (collect), of the batch's pairs (MADPO update) or reward-model score of the rollouts (MARLHF update), as CoMLRL logs it.",
    ),
    Metric(
        EXPECTED_RETURN,
        "reward",
        "CoMLRL's single-turn expected return: equal to turn_1/reward_mean except in MARLHF updates, where it is the KL-penalised return.",
    ),
    Metric(COLLECTED_PAIRS, "count", "Non-tied preference pairs made in the collect phase.", "single"),
    Metric(COLLECT_TOKENS_PER_SECOND, "other", "Sampled tokens per second of the collect phase (both sides)."),
    Metric(COMPARATOR_REWARD_MEAN, "reward", "Mean processed reward of the comparator's candidates.", "iterative"),
    Metric(
        UNPARSED_COMPARATOR_CANDIDATES,
        "count",
        "Comparator outputs that could not be parsed (centralized or API) and were skipped.",
        "iterative",
    ),
    Metric(
        CURRENT_WIN_SHARE,
        "share",
        "Share of the round's pairs whose winner is the current agents' candidate. In a run labelled by people "
        "or a judge (preference_source) it is taken at collect, from the reward function's ordering of the "
        "comparisons, not from the labels.",
        "iterative",
    ),
    Metric(CURRENT_ITERATION, "count", "The round (CoMLRL's iteration) the collect phase belongs to.", "iterative"),
    Metric(
        CURRENT_PREFERENCE_PAIRS,
        "count",
        "Pairs made in this round's collect phase (CoMLRL's iter/current_preference_pairs).",
        "iterative",
    ),
    Metric(TOTAL_PREFERENCE_PAIRS, "count", "Pairs made in all rounds so far.", "iterative"),
    Metric(
        TRAIN_PREFERENCE_PAIRS,
        "count",
        "Pairs the select phase chose to train on (the replay sample B^(ν) in the iterative trainers).",
    ),
    Metric(LABEL_COMPARISONS, "count", "Comparisons the collect phase made for people or the judge to label."),
    Metric(LABEL_COUNT, "count", "Verdicts the label phase gathered (people's or the judge's kept ones)."),
    Metric(
        LABEL_KAPPA_VS_REWARD,
        "other",
        "Cohen's kappa of the round's verdicts against the reward function's preference (tie and both bad: none).",
    ),
    Metric(LABEL_AGREEMENT_VS_REWARD, "share", "Share of the round's verdicts that agree with the reward function."),
    Metric(
        LABEL_FLEISS_KAPPA,
        "other",
        "Fleiss' kappa between labellers, over comparisons with labels_per_comparison labels.",
    ),
    Metric(
        LABEL_KRIPPENDORFF_ALPHA,
        "other",
        "Krippendorff's alpha (nominal) between labellers, every comparison with two or more labels.",
    ),
    Metric(JUDGE_VERDICTS, "count", "Comparisons the judge gave the same verdict in both orders (kept)."),
    Metric(
        JUDGE_INCONSISTENT,
        "count",
        "Comparisons whose two orders the judge answered differently (dropped: position bias).",
    ),
    Metric(
        JUDGE_UNPARSEABLE,
        "count",
        "Comparisons with a judge answer that does not begin with A, B, tie or both bad (dropped).",
    ),
    Metric(LABELLED_PAIRS, "count", "Pairs the select phase made from the round's labels."),
    Metric(
        LABELLED_DROPPED,
        "count",
        "Comparisons without a side most labels prefer (tie, both bad, split, unlabelled): no pair.",
    ),
    Metric(LABELLED_OVERRULED, "count", "Labelled pairs whose winner the reward function ranked lower or equal."),
    Metric(
        REWARD_DISTRIBUTION,
        "other",
        "log_reward_distribution: the round's candidate rewards as CoMLRL sums them up: current_iteration, "
        "target_sample_count, comparator_sample_count, target_mean, comparator_mean (target = current agents).",
        "iterative",
    ),
    Metric(
        SELECTED_REWARD_DISTRIBUTION,
        "other",
        "log_reward_distribution: the same for the raw rewards of the pairs the select phase drew, plus pair_count.",
        "iterative",
    ),
    Metric(MADPO_LOSS, "dpo_loss", "Joint-margin DPO loss -log σ(β Δ) of the update, mean over its pairs.", "MADPO"),
    Metric(
        MADPO_JOINT_MARGIN,
        "margin",
        "Joint log-prob margin Δ = Σ_i [log π_i(w_i) - log π_i(l_i)], mean over the update's pairs.",
        "MADPO",
    ),
    Metric(MADPO_PAIR_ACCURACY, "accuracy", "Share of the update's pairs with a positive joint margin Δ.", "MADPO"),
    Metric(
        MADPO_AGENT_MARGIN,
        "margin",
        "Agent i's log-prob margin Δ_i = log π_i(w_i) - log π_i(l_i), mean over the update's pairs.",
        "MADPO",
    ),
    Metric(
        MADPO_WINNER_NLL,
        "nll",
        "Agent i's per-token negative log-likelihood of the winner's completion, mean over the update's pairs; "
        "recorded when madpo_nll_weight > 0.",
        "MADPO",
    ),
    Metric(
        WINNER_LOGPS,
        "logp",
        "Agent i's summed log-prob of the winner's completion, mean over the update's pairs.",
        "MADPO",
    ),
    Metric(
        LOSER_LOGPS,
        "logp",
        "Agent i's summed log-prob of the loser's completion, mean over the update's pairs.",
        "MADPO",
    ),
    Metric(
        BT_LOSS,
        "bt_loss",
        "Bradley-Terry loss -log σ(R(w) - R(l)) of the reward-model fit, mean over the epoch's batches.",
        "MARLHF",
    ),
    Metric(
        BT_ACCURACY, "accuracy", "Share of training pairs the reward model orders correctly, over the epoch.", "MARLHF"
    ),
    Metric(
        BT_MARGIN,
        "reward_margin",
        "Mean reward-model score margin R(w) - R(l) on the training pairs, over the epoch.",
        "MARLHF",
    ),
    Metric(
        BT_VAL_LOSS,
        "bt_loss",
        "Bradley-Terry loss on the held-out pairs (bt_validation_fraction) after the epoch; NaN without them.",
        "MARLHF",
    ),
    Metric(
        BT_VAL_ACCURACY,
        "accuracy",
        "Share of held-out pairs the reward model orders correctly after the epoch.",
        "MARLHF",
    ),
    Metric(
        BT_VAL_MARGIN,
        "reward_margin",
        "Mean reward-model score margin on the held-out pairs after the epoch.",
        "MARLHF",
    ),
    Metric(BT_EPOCH, "count", "The Bradley-Terry epoch (1-based) within the round's fit.", "MARLHF"),
    Metric(BT_TRAIN_PAIRS, "count", "Pairs the reward model was fitted on.", "MARLHF"),
    Metric(BT_VAL_PAIRS, "count", "Pairs held out from the fit.", "MARLHF"),
    Metric(RL_LOSS, "rl_loss", "Policy-gradient loss of the update, mean over agents.", "MARLHF"),
    Metric(RL_AGENT_LOSS, "rl_loss", "Agent i's policy-gradient loss of the update.", "MARLHF"),
    Metric(RL_REWARD_MODEL_MEAN, "reward", "Mean reward-model score of the rollout buffer.", "MARLHF"),
    Metric(RL_REWARD_MODEL_STD, "reward", "Std of the reward-model scores of the rollout buffer.", "MARLHF"),
    Metric(RL_ADVANTAGE_ABS_MEAN, "other", "Mean absolute advantage of the rollout buffer.", "MARLHF"),
    Metric(
        RL_COMPLETION_TOKENS_MEAN,
        "count",
        "Mean completion length in tokens per agent in the rollout buffer.",
        "MARLHF",
    ),
    Metric(RL_VALUE_MEAN, "other", "Mean critic value of the rollout buffer (maac, iac).", "MARLHF"),
    Metric(RL_VALUE_LOSS, "rl_loss", "Critic value loss, mean over critics (maac, iac).", "MARLHF"),
    Metric(RL_AGENT_VALUE_LOSS, "rl_loss", "Agent i's value-head loss (maac, iac with value heads).", "MARLHF"),
    Metric(RL_CRITIC_VALUE_LOSS, "rl_loss", "One critic's value loss (maac, iac with separate critics).", "MARLHF"),
    Metric(RL_ITEMS_PER_UPDATE, "count", "Task items in one policy update.", "MARLHF"),
    Metric(RL_SEQUENCES_PER_UPDATE, "count", "Sampled joint responses in one policy update.", "MARLHF"),
    Metric(
        REFERENCE_KL_MEAN,
        "kl",
        "k3 estimate of KL(π || π_ref) per sequence, mean over agents and rollouts (reference_kl_enabled).",
        "MARLHF",
    ),
    Metric(REFERENCE_KL_PENALTY_MEAN, "kl", "reference_kl_coef · KL, subtracted from the returns.", "MARLHF"),
    Metric(AGENT_REFERENCE_KL_MEAN, "kl", "Agent i's k3 KL estimate, mean over rollouts.", "MARLHF"),
    Metric(RL_CALLBACK, "other", "A value returned by the trainer's metrics_callback, under its own key.", "MARLHF"),
    Metric(
        EVAL_REWARD_MEAN,
        "reward",
        "Mean processed task reward of fresh samples from the current policy (evaluate phase).",
    ),
    Metric(
        EVAL_EXPECTED_RETURN,
        "reward",
        "CoMLRL's single-turn expected return of the evaluation samples (equal to the reward mean).",
    ),
    Metric(
        EVAL_REWARD_SEM,
        "reward",
        "Standard error of eval/turn_1/reward_mean. With eval_samples_per_item = 1: the sample std of the n rewards over sqrt(n), which counts both the spread between eval items and the sampling of responses. With k >= 2 samples per item: the stratified (within-item) error, sqrt(sum_i m_i s_i^2) / n with s_i^2 item i's sample variance over its m_i scored samples: the sampling error on this fixed eval set, the one that matters when rounds are compared on the same items.",
    ),
    Metric(
        EVAL_NUM_SAMPLES,
        "count",
        "n: how many evaluation samples were scored, eval items times eval_samples_per_item (unparsed ones are left out).",
    ),
    Metric(EVAL_AGGREGATED, "other", "A value returned by the user's eval_aggregator, under its own key."),
    Metric(
        EVAL_PASS_AT_1,
        "share",
        "Code tasks (humaneval): pass@1, the share of the evaluation's programs that pass every test of their problem "
        "(one sample per item by default; with eval_samples_per_item = k, the share of all n = items x k samples, "
        "which is the mean over items of c_i / k, the unbiased pass@1 estimate). From the breakdowns the task "
        "reward stored.",
    ),
    Metric(
        EVAL_PASS_AT_1_LOW,
        "share",
        "Lower end of pass@1's 95% confidence interval: Wilson's score interval over the n programs, which stays "
        "inside [0, 1] and keeps a width at 0 or n passes (0 of 32: 0 to 0.107). With k >= 2 samples per item it "
        "takes the n samples as independent draws, wider than the sampling error on the fixed items alone.",
    ),
    Metric(EVAL_PASS_AT_1_HIGH, "share", "Upper end of pass@1's 95% confidence interval (Wilson)."),
    Metric(
        EVAL_LEVEL_REWARD_MEAN,
        "reward",
        "Code tasks (humaneval): mean level reward of the evaluation's programs, 0 to 4, before the reward_processor "
        "(the anchor's shift -4 is not applied here, so it reads as in the anchor's tables).",
    ),
    Metric(
        EVAL_LEVEL_REWARD_LOW,
        "reward",
        "Lower end of the mean level reward's 95% confidence interval: mean - t_{0.975, n-1} SE, with the standard "
        "error computed as eval/turn_1/reward_sem's (stratified by item with k >= 2 samples per item).",
    ),
    Metric(EVAL_LEVEL_REWARD_HIGH, "reward", "Upper end of the mean level reward's 95% confidence interval."),
    Metric(PHASE_SECONDS, "time", "Wall-clock seconds of one phase (collect, select, train, evaluate)."),
    Metric(
        CHECKPOINT_SECONDS,
        "time",
        "Seconds the checkpoint after a phase held up training: the whole write, or with save_in_background the copy and the wait for the write before.",
    ),
    Metric(
        CHECKPOINT_BACKGROUND_SECONDS,
        "time",
        "Seconds the background thread took to write and commit the checkpoint after a phase (save_in_background only).",
    ),
    Metric(
        CHECKPOINT_BYTES,
        "count",
        "Bytes written for the checkpoint after a phase: the state file, plus the weights when training changed them (unchanged weights are linked, not written).",
    ),
)

_BY_NAME = {metric.name: metric for metric in METRICS}


def name(template: str, **parts: object) -> str:
    """A concrete metric name from a template: ``name(MADPO_AGENT_MARGIN, agent=1)`` is ``madpo/agent_1/margin``."""
    return template.format(**parts)


def round_summary(metric_name: str) -> str:
    """The name of the per-round mean of a per-update metric."""
    return ROUND_PREFIX + metric_name


def lookup(metric_name: str) -> Metric | None:
    """The ``Metric`` a recorded name belongs to (a ``round/`` summary belongs to its per-update metric)."""
    exact = _BY_NAME.get(metric_name.removeprefix(ROUND_PREFIX))
    if exact is not None:
        return exact
    # Catch-all templates ({key}) last, so a specific name never falls into them.
    ordered = sorted(METRICS, key=lambda metric: "{key}" in metric.name)
    return next((metric for metric in ordered if metric.pattern.fullmatch(metric_name)), None)


#: Kinds the Learning page draws in its loss, margin and accuracy panels.
#: Preference losses (near log 2) and policy-learning losses (often far larger) are drawn apart, and so are
#: log-prob margins and reward-model margins: different quantities on different scales.
PREFERENCE_LOSS_KINDS = ("dpo_loss", "bt_loss")
NLL_KINDS = ("nll",)
RL_LOSS_KINDS = ("rl_loss",)
LOGPROB_MARGIN_KINDS = ("margin",)
REWARD_MARGIN_KINDS = ("reward_margin",)
ACCURACY_KINDS = ("accuracy",)


def kind_of(metric_name: str) -> str:
    """The chart family of a recorded name; names no trainer declares are ``other``."""
    metric = lookup(metric_name)
    return metric.kind if metric is not None else "other"
