"""Runs of the humaneval task: the sandbox's capabilities logged once per run."""

from __future__ import annotations

from comlrl_lab.data.tasks import humaneval as he
from comlrl_lab.engine import ExperimentSpec
from comlrl_lab.engine import run as engine_run
from comlrl_lab.engine.run import Run
from comlrl_lab.sandbox import SandboxError, sandbox_capabilities
from comlrl_lab.store import RunStore

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
