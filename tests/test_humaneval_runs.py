"""Runs of the humaneval task: the sandbox's capabilities logged once per run; one tiny round end to end from the
command line with a spec file and from the Python API, with every candidate's breakdown kept and the evaluation's
pass@1 and level reward recorded; the two real-model presets (SmolLM2 on a CPU, the anchor's on GPUs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from workbench_fixtures import agent_model

from comlrl_lab import cli
from comlrl_lab.data.confidence import Z975
from comlrl_lab.data.tasks import get_task
from comlrl_lab.data.tasks import humaneval as he
from comlrl_lab.data.tasks.humaneval import level_reward
from comlrl_lab.engine import ExperimentSpec
from comlrl_lab.engine import run as engine_run
from comlrl_lab.engine.run import STORE_FILE, Run
from comlrl_lab.names import metric_names as M
from comlrl_lab.sandbox import SandboxError, sandbox_capabilities
from comlrl_lab.store import RunStore
from comlrl_lab.trainers.preference import MADPOIterConfig, MADPOIterTrainer
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

ROOT = Path(__file__).resolve().parents[1]
TINY_ROUND = {"num_iterations": 1, "preference_num_candidates": 2, "max_new_tokens": 16, "eval_num_samples": 2}


def humaneval_spec(model: str, **config) -> ExperimentSpec:
    return ExperimentSpec(
        algorithm="MADPOIter",
        agent_models=[model, model],
        task="humaneval",
        config={**TINY_ROUND, **config},
        max_train_items=2,
        max_eval_items=2,
    )


def _sandbox_events(store: RunStore, run_id: str) -> list[tuple[str, str]]:
    events = store.events(run_id)
    return [(lv, m) for lv, m in zip(events["level"], events["message"]) if m.startswith("sandbox:")]


def test_a_humaneval_run_logs_what_its_sandbox_enforces_once(model_dir, tmp_path):
    run = Run.create(humaneval_spec(model_dir), tmp_path / "runs")
    capabilities = sandbox_capabilities(he.SANDBOX_LIMITS)
    level = "warning" if capabilities.not_enforced else "info"
    assert _sandbox_events(run.store, run.run_id) == [(level, capabilities.summary())]
    run_dir, run_id = run.run_dir, run.run_id
    run.close()
    reopened = Run.open(run_dir)  # once per run: opening it again logs nothing more
    assert len(_sandbox_events(reopened.store, run_id)) == 1
    reopened.close()

    words = Run.create(ExperimentSpec(agent_models=[model_dir, model_dir], task="length_ratio"), tmp_path / "runs")
    assert _sandbox_events(words.store, words.run_id) == []  # a task that runs no program
    words.close()


def test_a_host_where_no_program_can_run_says_so_in_the_runs_log(model_dir, tmp_path, monkeypatch):
    def refuse(limits=None):
        raise SandboxError("no interpreter can run sandboxed programs here: /usr/bin/python3: not found")

    monkeypatch.setattr(engine_run, "sandbox_capabilities", refuse)
    run = Run.create(humaneval_spec(model_dir), tmp_path / "runs")
    assert _sandbox_events(run.store, run.run_id) == [
        ("error", "sandbox: no program can run here: no interpreter can run sandboxed programs here: "
         "/usr/bin/python3: not found")
    ]  # fmt: skip
    run.close()


def _check_levels(details: dict) -> None:
    """A stored breakdown agrees with itself: its reward is the level arithmetic of its facts."""
    facts = {k: details[k] for k in ("defined_aux", "defined_main", "parses", "tests_passed", "tests_total")}
    facts.update({k: details[k] for k in ("uses_aux", "wrapper", "dropped_result")})
    assert details["reward"] == pytest.approx(level_reward(**facts)) and details["summary"]
    assert details["tests_total"] >= 1 and 0 <= details["tests_passed"] <= details["tests_total"]


def _wilson_high_for(passed: int, n: int) -> float:
    z2 = Z975**2
    p = passed / n
    return ((p + z2 / (2 * n)) + Z975 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))) / (1 + z2 / n)


@pytest.mark.slow
def test_one_tiny_round_from_the_command_line_keeps_every_breakdown(tmp_path, capsys):
    spec_file = tmp_path / "humaneval_tiny.yaml"
    model = agent_model(tmp_path)
    spec_file.write_text(
        "algorithm: MADPOIter\n"
        f"agent_models: [{json.dumps(model)}, {json.dumps(model)}]\n"
        "task: humaneval\nmax_train_items: 2\nmax_eval_items: 2\n"
        "config:\n" + "".join(f"  {k}: {v}\n" for k, v in TINY_ROUND.items()),
        encoding="utf-8",
    )
    assert cli.main(["run", str(spec_file), "--runs-root", str(tmp_path / "runs")]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    with RunStore(run_dir / STORE_FILE, read_only=True) as store:
        run_id = store.first_run_id()
        rows = store.readonly_sql("SELECT side, phase, raw_reward, details_json FROM candidates ORDER BY ALL")
        metrics = dict(zip(*store.metrics(run_id, [M.EVAL_CODE_PREFIX]).pipe(lambda f: (f["name"], f["value"]))))
        events = store.events(run_id)["message"].tolist()
    # 2 items x 2 candidates x (current, comparator), then 2 eval samples: every one with its levels.
    assert sorted(rows["side"]) == ["comparator"] * 4 + ["current"] * 4 + ["eval"] * 2
    details = [json.loads(text) for text in rows["details_json"]]
    for row, found in zip(rows.itertuples(), details):
        _check_levels(found)
        assert row.raw_reward == pytest.approx(found["reward"])  # the stored reward is the breakdown's
    evaluated = [d for d, side in zip(details, rows["side"]) if side == "eval"]
    passed = sum(d["tests_passed"] == d["tests_total"] for d in evaluated)
    assert metrics[M.EVAL_PASS_AT_1] == passed / 2
    assert metrics[M.EVAL_PASS_AT_1_HIGH] == pytest.approx(_wilson_high_for(passed, 2))
    assert metrics[M.EVAL_LEVEL_REWARD_MEAN] == pytest.approx(sum(d["reward"] for d in evaluated) / 2)
    assert any(message.startswith("sandbox: ") for message in events)


@pytest.mark.slow
def test_one_tiny_round_from_the_python_api_keeps_every_breakdown(tmp_path):
    task, sink = get_task("humaneval"), MemorySink()
    trainer = MADPOIterTrainer(
        agent_model=agent_model(tmp_path),
        num_agents=2,
        train_dataset=task.train_items()[:2],
        eval_dataset=task.eval_items()[:2],
        reward_func=task.reward_func,
        formatters=list(task.formatters),
        args=MADPOIterConfig(**TINY_ROUND, output_dir=str(tmp_path / "out")),
        sink=sink,
    )
    trainer.train()
    candidates = [c for phase in sink.phases for c in phase.candidates]
    assert len(candidates) == 10 and all(c.details is not None for c in candidates)
    for c in candidates:
        _check_levels(c.details)
        assert c.raw_reward == pytest.approx(c.details["reward"]) and c.reward == c.raw_reward  # no processor
    evaluated = [c.details for c in candidates if c.side == "eval"]
    assert sink.metric(M.EVAL_LEVEL_REWARD_MEAN) == [(0, pytest.approx(sum(d["reward"] for d in evaluated) / 2))]
    assert len(sink.metric(M.EVAL_PASS_AT_1)) == 1


def test_the_smollm2_preset_is_a_small_humaneval_round_on_a_cpu():
    spec = ExperimentSpec.load(ROOT / "examples" / "humaneval_smollm2.yaml")
    config = spec.build_config()
    assert (spec.task, spec.agent_models) == ("humaneval", ["smollm2-135m-instruct"] * 2)
    assert (spec.max_train_items, config.preference_num_candidates, config.max_new_tokens) == (4, 3, 128)
    assert (config.num_train_epochs, config.lora_r, config.agent_devices) == (1, 8, "cpu")
    # What the header's estimate counts: sampled tokens of one collect phase (current and comparator sides).
    assert spec.max_train_items * config.preference_num_candidates * 2 * 2 * config.max_new_tokens == 6144


def test_the_anchor_preset_mirrors_the_anchors_config_and_says_it_is_untested():
    path = ROOT / "examples" / "humaneval_anchor_gpu.yaml"
    assert path.read_text(encoding="utf-8").startswith("# UNTESTED HERE")
    spec = ExperimentSpec.load(path)
    config = spec.build_config()
    assert spec.agent_models == ["Qwen/Qwen2.5-Coder-3B"] * 2 and spec.model_config == {"dtype": "bf16"}
    assert (config.temperature, config.top_p, config.max_new_tokens, config.dpo_beta) == (0.6, 0.6, 256, 0.1)
    assert (config.preference_num_candidates, config.preference_pairs_per_sample) == (80, 16)
    assert (config.pair_selection, config.num_iterations, config.eval_num_samples) == ("reward_gap", 3, 32)
    assert (spec.max_train_items, spec.max_eval_items) == (None, None)  # the task's own splits
    task = get_task(spec.task)
    ids = [item["task_id"] for item in task.train_items()], [item["task_id"] for item in task.eval_items()]
    assert ids == ([f"HumanEval/{k}" for k in range(33, 163)], [f"HumanEval/{k}" for k in range(32)])
