"""The statistics of benchmarks/learning.py against hand-computed answers, and one tiny run of its loop."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from repo_scripts import load_repo_script

ROOT = Path(__file__).resolve().parents[1]


def load_learning():
    return load_repo_script("benchmarks/learning.py", "learning_benchmark")


def test_mean_ci_uses_student_t():
    learning = load_learning()
    interval = learning.mean_ci([1.0, 2.0, 3.0])  # mean 2, s = 1, t(0.975, 2) = 4.303
    assert interval.mean == 2.0 and interval.n == 3
    assert interval.half_width == pytest.approx(4.303 / math.sqrt(3))
    assert not interval.excludes_zero()  # 2 < 2.484
    assert learning.mean_ci([1.0, 1.1, 0.9]).excludes_zero()  # s = 0.1: 1 ± 0.248
    single = learning.mean_ci([0.5])
    assert single.n == 1 and math.isnan(single.half_width) and not single.excludes_zero()
    assert str(learning.mean_ci([0.1, 0.3])) == f"+0.200 ± {12.706 * math.sqrt(0.02) / math.sqrt(2):.3f}"


def test_summarise_gives_per_round_intervals_and_the_rise():
    learning = load_learning()
    per_round, rise = learning.summarise([[0.2, 0.3, 0.5], [0.4, 0.4, 0.6]])
    assert [r.mean for r in per_round] == pytest.approx([0.3, 0.35, 0.55])
    assert rise.mean == pytest.approx(0.25) and rise.n == 2  # rises 0.3 and 0.2
    assert rise.half_width == pytest.approx(12.706 * math.sqrt(0.005) / math.sqrt(2))


def test_by_field_splits_the_eval_reward_per_item_value_and_rises_per_value_over_seeds():
    from comlrl_lab.data.records import JointCandidate

    learning = load_learning()
    items = [{"stance": "positive"}, {"stance": "negative"}, {"topic": "no stance"}]

    def scored(item_index, reward):
        return JointCandidate(item_index, 0, "eval", ["p", "q"], ["a", "b"], [[5], [6]], [[1], [2]], reward=reward)

    samples = [scored(0, 0.2), scored(0, 0.4), scored(1, 0.9), scored(2, 5.0), scored(1, math.nan)]
    assert learning.group_means(samples, items, "stance") == pytest.approx({"negative": 0.9, "positive": 0.3})
    # Two seeds: positive 0.3 -> 0.5 and 0.1 -> 0.5 (rises 0.2, 0.4); negative 0.9 -> 0.6 and 0.7 -> 0.6.
    runs = [
        [{"negative": 0.9, "positive": 0.3}, {"negative": 0.6, "positive": 0.5}],
        [{"negative": 0.7, "positive": 0.1}, {"negative": 0.6, "positive": 0.5}],
    ]
    negative, positive = learning.group_lines("stance", runs)
    t = 12.706 / math.sqrt(2)
    assert (
        negative
        == f"    stance=negative: round 0 +0.800 ± {t * math.sqrt(0.02):.3f}, last +0.600 ± 0.000, rise -0.200 ± {t * math.sqrt(0.02):.3f}"
    )
    assert positive.startswith("    stance=positive: round 0 +0.200 ± ") and positive.endswith(
        f"rise +0.300 ± {t * math.sqrt(0.02):.3f}"
    )
    assert learning.group_lines(None, runs) == [] and learning.group_lines("stance", []) == []


@pytest.mark.slow
def test_one_short_curve_per_setting_runs(capsys):
    learning = load_learning()
    assert (
        learning.main(
            [
                "--tasks",
                "length_ratio",
                "--settings",
                "seed,combined",
                "--seeds",
                "1",
                "--rounds",
                "1",
                "--items",
                "4",
                "--eval-items",
                "4",
                "--eval-samples-per-item",
                "2",
                "--candidates",
                "2",
                "--max-new-tokens",
                "6",
                "--epochs",
                "1",
                "--set",
                "pair_selection=reward_gap",
                "--by",
                "stance",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "length_ratio      seed" in out and "length_ratio      combined" in out
    assert "4 eval items × 2 samples" in out and out.count("eval SE 0.") == 2
    assert "3 seeds" not in out and "1 seeds, pair_selection=reward_gap;" in out


def test_examples_quickstart_is_the_preset_and_a_valid_experiment():
    from comlrl_lab.engine import ExperimentSpec
    from comlrl_lab.engine.presets import quickstart_spec

    from_file = ExperimentSpec.load(ROOT / "examples" / "quickstart.yaml")
    assert from_file.to_dict() == quickstart_spec().to_dict()
    config = from_file.build_config()
    assert (config.madpo_reference, config.madpo_length_normalize, config.madpo_nll_weight) == ("initial", True, 0.2)


def test_examples_smollm2_is_the_real_model_preset_with_lora_on_both_agents():
    from comlrl_lab.engine import ExperimentSpec
    from comlrl_lab.engine.presets import QUICKSTART_CONFIG, SMOLLM2_MODEL_NAME, smollm2_spec

    from_file = ExperimentSpec.load(ROOT / "examples" / "smollm2.yaml")
    assert from_file.to_dict() == smollm2_spec().to_dict()
    assert from_file.agent_models == [SMOLLM2_MODEL_NAME] * 2 == ["smollm2-135m-instruct"] * 2
    config = from_file.build_config()
    assert (config.lora_r, config.lora_target_modules, config.use_chat_template) == (8, "all-linear", "auto")
    stabilisers = ("madpo_reference", "madpo_length_normalize", "madpo_nll_weight")
    assert all(getattr(config, name) == QUICKSTART_CONFIG[name] for name in stabilisers)
    # learning.py --model smollm2-135m-instruct takes this preset's sizes as its defaults.
    learning = load_learning()
    assert learning.PRESETS["smollm2-135m-instruct"]().max_train_items == from_file.max_train_items == 12


def test_the_combined_setting_is_the_presets_stabilisers():
    learning = load_learning()
    from comlrl_lab.engine.presets import QUICKSTART_CONFIG

    assert learning.SETTINGS["combined"] == {
        name: QUICKSTART_CONFIG[name] for name in ("madpo_reference", "madpo_length_normalize", "madpo_nll_weight")
    }


def test_examples_marlhf_quickstart_is_the_preset_and_the_setup_form_starts_marlhf_from_it():
    from comlrl_lab.engine import ExperimentSpec
    from comlrl_lab.engine.presets import (
        MARLHF_QUICKSTART_CONFIG,
        MARLHF_QUICKSTART_TRAIN_ITEMS,
        QUICKSTART_EVAL_ITEMS,
        preset_config,
    )
    from comlrl_lab.trainers.preference import MARLHFConfig

    from_file = ExperimentSpec.load(ROOT / "examples" / "marlhf_quickstart.yaml")
    assert (from_file.algorithm, from_file.task, from_file.agent_models) == (
        "MARLHFIter",
        "length_ratio",
        ["comlrl-lab/tiny", "comlrl-lab/tiny"],
    )
    assert (from_file.max_train_items, from_file.max_eval_items) == (
        MARLHF_QUICKSTART_TRAIN_ITEMS,
        QUICKSTART_EVAL_ITEMS,
    )
    assert from_file.config == MARLHF_QUICKSTART_CONFIG
    config = from_file.build_config()
    # CoMLRL's defaults are 256 tokens, 20 candidates and a learning rate of 5e-6.
    assert (config.max_new_tokens, config.preference_num_candidates, config.agent_learning_rate) == (16, 8, 5e-4)
    assert preset_config("MARLHFIter") == MARLHF_QUICKSTART_CONFIG
    # The non-iterative trainer takes the preset's fields it has (no replay buffer, no rounds).
    single = preset_config("MARLHF")
    assert "preference_replay_mode" not in single and single["agent_learning_rate"] == 5e-4
    MARLHFConfig(**single)
