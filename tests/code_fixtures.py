"""A small stored run of the humaneval task for the workbench tests, made without a model.

Known completions on HumanEval/33 (``sort_third``, the first training item) are scored by the task's real reward
through the trainers' own scoring (the sandbox runs them), paired by the trainers' own pairing and committed to a run
folder's store as the engine commits its phases, with the evaluation metrics the trainers record. No model is loaded: the run's spec names the embedded tiny
model, which only a phase to come would load.
"""

from __future__ import annotations

from pathlib import Path

from comlrl_lab.data.code_eval import code_eval_metrics
from comlrl_lab.data.records import JointCandidate
from comlrl_lab.data.rewards import RewardProcessors
from comlrl_lab.data.tasks import get_task
from comlrl_lab.engine import ExperimentSpec
from comlrl_lab.engine.run import SNAPSHOT_DIR, SPEC_FILE, STORE_FILE
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME
from comlrl_lab.names import metric_names as M
from comlrl_lab.store import RunStore, snapshot_parquet
from comlrl_lab.trainers.preference.rounds.collection import reward_summary, score_with_task_reward
from comlrl_lab.trainers.preference.rounds.pairing import iterative_pairs

RUN_ID = "humaneval-pairs"
AUX = "def aux(l):\n    return sorted(l[::3])\n"
#: The entry point using aux (every test passes: 4.0) and one returning its input (3 of 7 tests: 1.5 + 3/7).
MAIN_USES = "def sort_third(l: list):\n    l = list(l)\n    l[::3] = aux(l)\n    return l\n"
MAIN_IDENTITY = "def sort_third(l: list):\n    return l\n"
USES_SUMMARY, IDENTITY_SUMMARY = "parses · 7/7 tests · uses aux", "parses · 3/7 tests"
USES_REWARD, IDENTITY_REWARD = 4.0, 1.5 + 3 / 7
#: The evaluation: HumanEval/0 solved with aux (every test passes, 4.0), HumanEval/1 answered with prose (0.0).
EVAL_AUX = (
    "def aux(numbers):\n    s = sorted(numbers)\n    return min((b - a for a, b in zip(s, s[1:])), default=1e9)\n"
)
EVAL_MAIN = "def has_close_elements(numbers, threshold):\n    gap = aux(numbers)\n    return gap < threshold\n"
EVAL_LEVELS = (4.0, 0.0)


def code_spec() -> ExperimentSpec:
    return ExperimentSpec(
        algorithm="MADPOIter",
        agent_models=[TINY_MODEL_NAME, TINY_MODEL_NAME],
        task="humaneval",
        config={"num_iterations": 1, "preference_num_candidates": 2, "max_new_tokens": 16},
        name="humaneval",
        max_train_items=1,
        max_eval_items=2,
    )


def _candidates(side: str, mains: list[str], item: dict, prompts: list[str]) -> list[JointCandidate]:
    return [
        JointCandidate(0, j, side, list(prompts), [AUX, main], [[1], [2]], [[0], [0]]) for j, main in enumerate(mains)
    ]


def _evaluation(task) -> tuple[list[JointCandidate], dict[str, float]]:
    """The evaluate phase's candidates and metrics, as ``PreferenceTrainerBase.evaluate`` makes them."""
    items = task.eval_items()[:2]
    answers = [(EVAL_AUX, EVAL_MAIN), ("I would sort the list.", "Sorry, I cannot help.")]
    candidates = [
        JointCandidate(k, 0, "eval", task.prompts(item), list(texts), [[1], [2]], [[0], [0]])
        for k, (item, texts) in enumerate(zip(items, answers))
    ]
    score_with_task_reward(candidates, dict(enumerate(items)), task.reward_func, RewardProcessors.shift(-4))
    reward, sem, count = reward_summary(candidates)
    metrics = {M.EVAL_REWARD_MEAN: reward, M.EVAL_REWARD_SEM: sem, M.EVAL_NUM_SAMPLES: count}
    return candidates, {**metrics, **code_eval_metrics(candidates)}


def seed_code_run(root: Path) -> str:
    """The run folder ``root/RUN_ID``, one finished round: collect with current candidates (uses aux, identity) against
    comparator candidates (identity, uses aux), so pair 0 is won by the current side and pair 1 by the comparator;
    select and train with nothing in them; evaluate on HumanEval/0 and /1 (``EVAL_LEVELS``); its snapshots."""
    spec, task = code_spec(), get_task("humaneval")
    item = task.train_items()[0]
    prompts = task.prompts(item)
    current = _candidates("current", [MAIN_USES, MAIN_IDENTITY], item, prompts)
    comparator = _candidates("comparator", [MAIN_IDENTITY, MAIN_USES], item, prompts)
    score_with_task_reward(current + comparator, {0: item}, task.reward_func, RewardProcessors.shift(-4))
    pairs = iterative_pairs(current, comparator, selection="all", cap=None, rng=None, round_index=1)
    run_dir = Path(root) / RUN_ID
    run_dir.mkdir(parents=True)
    spec.save(run_dir / SPEC_FILE)
    with RunStore(run_dir / STORE_FILE) as store:
        config = spec.build_config()
        store.create_run(RUN_ID, trainer=spec.algorithm, config=config.to_dict(), num_agents=config.num_agents)
        store.commit_phase(RUN_ID, 1, "collect", candidates=current + comparator, pairs=pairs, status="running")
        store.commit_phase(RUN_ID, 1, "select", status="running")
        store.commit_phase(RUN_ID, 1, "train", status="running")
        evaluated, metrics = _evaluation(task)
        store.commit_phase(
            RUN_ID,
            1,
            "evaluate",
            candidates=evaluated,
            metrics=[{"step": 0, "name": k, "value": v} for k, v in metrics.items()],
            status="finished",
        )
        snapshot_parquet(store, RUN_ID, run_dir / SNAPSHOT_DIR)
    return RUN_ID
