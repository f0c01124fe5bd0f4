"""Data parallelism: shards and gathers, batch-invariant sampling, concurrent agents, and torchrun on CPU (gloo).

The slow tests start ``python -m torch.distributed.run --nproc_per_node=2 --standalone`` and compare with one
process: the ranks' collected candidates taken together are the single run's, the pairs and replay draws are
the same on every rank, the weights after each round's steps match to 1e-5, and a checkpoint written by two
ranks resumes in one process as if nothing had changed. The headless CLI under torchrun fills one store with
the single-process run's pairs. Two MARLHF ranks each push part of the Bradley-Terry, reward-scoring and
policy rows and end with the single process's reward model, agents and metrics.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import dist_madpo_script
import dist_marlhf_script
import duckdb
import pytest
import torch

from comlrl_lab.models.generation import SamplingSettings, sample_candidates
from comlrl_lab.models.loading import load_model, load_tokenizer
from comlrl_lab.trainers.preference.runtime.concurrency import map_agents
from comlrl_lab.trainers.preference.runtime.distributed import DistContext, interleave

TESTS = Path(__file__).resolve().parent
SCRIPT = TESTS / "dist_madpo_script.py"


def single_process_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent), str(TESTS), env.get("PYTHONPATH", "")])
    return env


def torchrun(*args: str, cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", *args]
    proc = subprocess.run(command, cwd=cwd, env=single_process_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


# ---------------------------------------------------------------------------------------------- helpers


def test_context_reads_torchrun_environment():
    dist = DistContext.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (dist.rank, dist.world_size, dist.local_rank, dist.local_world_size) == (3, 4, 1, 2)
    assert dist.enabled and not dist.is_main
    assert DistContext.from_env({}) == DistContext() and not DistContext().enabled
    with pytest.raises(ValueError, match="inconsistent"):
        DistContext.from_env({"RANK": "2", "WORLD_SIZE": "2"})


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("count", [0, 1, 4, 7])
def test_strided_shards_are_balanced_and_interleave_back(world, count):
    values = list(range(count))
    shards = [DistContext(rank=r, world_size=world, local_world_size=world).shard(values) for r in range(world)]
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert interleave(shards) == values


def test_single_rank_helpers_are_no_ops():
    dist = DistContext()
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.grad.clone()
    dist.sum_gradients(model.parameters())
    dist.broadcast_parameters(model.parameters())
    dist.barrier()
    assert torch.equal(model.weight.grad, before)
    assert dist.gather_objects({"a": 1}) == [{"a": 1}] and dist.broadcast_object(5) == 5
    assert dist.all_reduce_sum([1, 2.5]) == [1.0, 2.5]


def test_agents_on_distinct_gpus_run_concurrently_and_cpu_agents_in_order():
    # Two calls that each wait for the other can only finish when they run at the same time.
    both = threading.Barrier(2, timeout=5)
    threads = []

    def work(i):
        threads.append(threading.current_thread().name)
        both.wait()
        return i * 10

    assert map_agents(work, [torch.device("cuda", 0), torch.device("cuda", 1)]) == [0, 10]
    assert all(name.startswith("comlrl-lab-agent") for name in threads)
    order = []
    assert map_agents(lambda i: order.append(i) or i, ["cpu", "cpu", "cpu"]) == [0, 1, 2]
    assert order == [0, 1, 2]
    assert (
        map_agents(lambda i: threading.current_thread().name, ["cuda:0", "cuda:0"])
        == [threading.current_thread().name] * 2
    )


def test_cpu_agents_run_concurrently_with_the_torch_threads_split_only_when_asked(monkeypatch):
    from comlrl_lab.trainers.preference.runtime import concurrency

    monkeypatch.setattr(concurrency, "available_cores", lambda: 4)
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        both = threading.Barrier(2, timeout=5)

        def work(i):
            both.wait()  # only returns when the other agent's call runs at the same time
            return threading.current_thread().name, torch.get_num_threads()

        seen = map_agents(work, ["cpu", "cpu"], concurrent_cpu=True)
        assert all(name.startswith("comlrl-lab-agent") for name, _ in seen)
        assert [threads for _, threads in seen] == [2, 2]  # 4 intra-op threads split between 2 agents
        assert torch.get_num_threads() == 4  # and given back
        main = threading.current_thread().name
        assert map_agents(lambda i: threading.current_thread().name, ["cpu", "cpu"]) == [main, main]
        monkeypatch.setattr(concurrency, "available_cores", lambda: 1)  # one core: nothing to overlap
        assert map_agents(lambda i: threading.current_thread().name, ["cpu"] * 2, concurrent_cpu=True) == [main] * 2
    finally:
        torch.set_num_threads(before)


class SecondRankAlone(DistContext):
    """Rank 1 of 2 with the collectives short-circuited: what this rank computes and writes, without rank 0."""

    def init_process_group(self, **_):
        return None

    def gather_objects(self, obj):
        return [obj, []]  # rank 0 collected nothing: only this rank's shard comes back

    def broadcast_object(self, obj, src=0):
        return obj

    def barrier(self):
        return None

    def all_reduce_sum(self, values):
        return [float(v) for v in values]

    def sum_gradients(self, parameters, bucket_numel=0):
        return None

    def broadcast_parameters(self, tensors, src=0):
        return None


def test_ranks_other_than_zero_write_nothing(make_trainer, tmp_path, monkeypatch):
    from comlrl_lab.trainers.preference.runtime import distributed
    from comlrl_lab.trainers.preference.runtime.sink import MemorySink

    monkeypatch.setattr(
        distributed.DistContext, "from_env", classmethod(lambda cls, env=None: SecondRankAlone(1, 2, 1, 2))
    )
    sink = MemorySink()
    trainer = make_trainer(
        "MADPOIter", tmp_path, dist_madpo_script.DIST, sink=sink, num_iterations=1, comparator_policy="current"
    )
    trainer.checkpoint_dir = tmp_path / "ckpt"
    trainer.train()
    trainer.save_model(tmp_path / "saved")
    assert trainer.finished and trainer.updates_seen > 0
    assert sink.phases == [] and trainer.collector.replay.replay_dir is None
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "saved").exists()
    assert not (tmp_path / "out").exists()  # no replay files
    # Its shard of the 5 items is items 1 and 3.
    assert {p.item_index for p in trainer.collector.replay.round_pairs(1)} <= {1, 3}


# ------------------------------------------------------------------------------ batch-invariant sampling


def test_row_seeded_samples_do_not_depend_on_batching(model_dir):
    model = load_model(model_dir, device="cpu")
    tokenizer = load_tokenizer(model_dir)
    prompts = ["the red cat", "a dog", "the big blue moon up", "one"]
    seeds = [11, 22, 33, 44]
    for top_k, top_p in [(None, 1.0), (5, 0.8)]:
        small = SamplingSettings(max_new_tokens=6, temperature=0.7, top_p=top_p, top_k=top_k, batch_size=3)
        large = SamplingSettings(max_new_tokens=6, temperature=0.7, top_p=top_p, top_k=top_k, batch_size=64)
        everything = sample_candidates(model, tokenizer, prompts, 3, small, None, row_seeds=seeds)
        subset = sample_candidates(model, tokenizer, prompts[2:0:-1], 3, large, None, row_seeds=seeds[2:0:-1])
        ids = [[s.completion_ids for s in row] for row in everything]
        assert ids[1:3] == [[s.completion_ids for s in row] for row in subset][::-1]
        assert len({tuple(i) for row in ids for i in row}) > 6  # candidates of one prompt differ


def test_row_seeded_sampler_draws_from_the_model_distribution(model_dir):
    model = load_model(model_dir, device="cpu")
    tokenizer = load_tokenizer(model_dir)
    prompt = "the red cat"
    settings = SamplingSettings(max_new_tokens=1, temperature=1.0, top_p=1.0, top_k=None, batch_size=512)
    draws = 3000
    samples = sample_candidates(model, tokenizer, [prompt], draws, settings, None, row_seeds=[5])[0]
    counts = torch.bincount(torch.tensor([s.completion_ids[0] for s in samples]), minlength=len(tokenizer)).float()
    with torch.no_grad():
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        probs = torch.softmax(model(input_ids=ids).logits[0, -1].float(), dim=-1)[: len(tokenizer)]
    expected = probs * draws
    kept = expected > 5
    chi2 = float((((counts[kept] - expected[kept]) ** 2) / expected[kept]).sum())
    assert chi2 < 2.0 * int(kept.sum()) + 30, chi2  # ~ df on average; far above it means a biased sampler
    assert counts[probs == 0].sum() == 0


# ------------------------------------------------------------------------------------------------ torchrun


def _dist_files(directory: Path) -> list[dict]:
    return [torch.load(directory / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _assert_weights_close(a: list[dict], b: list[dict], atol: float = 1e-5) -> None:
    for agent_a, agent_b in zip(a, b):
        assert agent_a.keys() == agent_b.keys()
        for name in agent_a:
            torch.testing.assert_close(
                agent_a[name], agent_b[name], rtol=0, atol=atol, msg=lambda detail, name=name: f"{name}: {detail}"
            )


@pytest.mark.slow
def test_torchrun_two_ranks_equal_one_rank_and_resume_with_one(model_dir, tmp_path):
    torchrun(str(SCRIPT), model_dir, str(tmp_path / "k2"), "--copy-checkpoint-after", "1", cwd=tmp_path)
    ranks = _dist_files(tmp_path / "k2")
    single = dist_madpo_script.run(model_dir, tmp_path / "k1")
    assert [r["world_size"] for r in ranks] == [2, 2] and single["world_size"] == 1
    for round_index in (1, 2):
        # What the two ranks sampled and scored themselves, taken together, is what one process samples.
        local = [r["local_rows"][round_index] for r in ranks]
        assert local[0] and local[1] and not set(local[0]) & set(local[1])
        assert sorted(local[0] + local[1]) == sorted(single["local_rows"][round_index])
        # After the gather every rank pairs and draws the same, in the same order, as the single process.
        assert single["pairs"][round_index]
        assert ranks[0]["pairs"][round_index] == ranks[1]["pairs"][round_index] == single["pairs"][round_index]
        assert ranks[0]["drawn"][round_index] == ranks[1]["drawn"][round_index] == single["drawn"][round_index]
        # Gradients summed over the slices give the single process's steps on the combined batches.
        for rank in ranks:
            _assert_weights_close(rank["weights"][round_index], single["weights"][round_index])
    # Only rank 0 wrote replay files.
    assert ranks[0]["replay_dir"] is not None and ranks[1]["replay_dir"] is None
    assert sorted(p.name for p in Path(ranks[0]["replay_dir"]).glob("iteration_*.json")) == [
        "iteration_0001.json",
        "iteration_0002.json",
    ]

    # The checkpoint two ranks wrote after round 1 resumes in one process: round 2 as in the straight run.
    shutil.copytree(tmp_path / "k2" / "round1", tmp_path / "resumed")
    resumed = dist_madpo_script.run(model_dir, tmp_path / "resumed", resume=tmp_path / "resumed" / "ckpt")
    assert list(resumed["pairs"]) == [2]
    assert resumed["pairs"][2] == single["pairs"][2] and resumed["drawn"][2] == single["drawn"][2]
    _assert_weights_close(resumed["weights"][2], single["weights"][2])


CLI_SPEC = """
algorithm: MADPOIter
name: dp
agent_models: [{model}, {model}]
task: length_ratio
max_train_items: 5
max_eval_items: 3
config:
  num_iterations: 2
  preference_num_candidates: 3
  preference_pairs_per_sample: 2
  max_new_tokens: 5
  temperature: 1.0
  top_p: 1.0
  top_k: null
  train_batch_size: 3
  eval_num_samples: 3
  agent_learning_rate: 1.0e-3
  agent_devices: cpu
  seed: 3
"""


def _store_rows(runs_root: Path):
    (run_dir,) = [p for p in runs_root.iterdir() if p.is_dir()]
    with duckdb.connect(str(run_dir / "run.duckdb"), read_only=True) as con:
        pairs = con.execute(
            "select round, item_index, winner_side, winner_candidate_index, winner_completions::varchar, "
            "loser_completions::varchar from pairs order by all"
        ).fetchall()
        candidates = con.execute("select count(*) from candidates").fetchone()[0]
        evals = con.execute(
            "select step, value from metrics where name = 'eval/turn_1/reward_mean' order by all"
        ).fetchall()
    return run_dir, pairs, candidates, evals


@pytest.mark.slow
def test_headless_runner_under_torchrun_fills_one_store_like_one_process(model_dir, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(CLI_SPEC.format(model=model_dir), encoding="utf-8")
    proc = torchrun("-m", "comlrl_lab.cli", "run", str(spec), "--runs-root", str(tmp_path / "k2"), cwd=tmp_path)
    assert "round 2 evaluate: done" in proc.stdout and "finished: 2 ranks" in proc.stdout
    single = subprocess.run(
        [sys.executable, "-m", "comlrl_lab.cli", "run", str(spec), "--runs-root", str(tmp_path / "k1"), "--quiet"],
        cwd=tmp_path,
        env=single_process_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    run_dir, pairs, candidates, evals = _store_rows(tmp_path / "k2")
    _, single_pairs, single_candidates, single_evals = _store_rows(tmp_path / "k1")
    assert pairs and pairs == single_pairs
    assert candidates == single_candidates
    assert [s for s, _ in evals] == [s for s, _ in single_evals]
    assert [v for _, v in evals] == pytest.approx([v for _, v in single_evals], abs=1e-9)
    assert list((run_dir / "checkpoint").glob("checkpoint-*/state.json"))
    assert sorted(p.name for p in (run_dir / "preference_replay").glob("iteration_*.json")) == [
        "iteration_0001.json",
        "iteration_0002.json",
    ]


@pytest.mark.slow
def test_torchrun_marlhf_two_ranks_split_the_fit_the_rollouts_and_the_rl_and_equal_one_process(model_dir, tmp_path):
    torchrun(str(TESTS / "dist_marlhf_script.py"), model_dir, str(tmp_path / "k2"), cwd=tmp_path)
    ranks = _dist_files(tmp_path / "k2")
    single = dist_marlhf_script.run(model_dir, tmp_path / "k1")
    assert [r["world_size"] for r in ranks] == [2, 2] and single["world_size"] == 1
    assert single["num_pairs"] >= 4
    # Each rank pushed its share of the rows through the fit, the rollout sampling and scoring, and the policy
    # forwards.
    for key in ("bt_pairs", "rollout_items", "reward_rows", "policy_rows"):
        shares = [r["counts"][key] for r in ranks]
        assert single["counts"][key] > 0 and sum(shares) == single["counts"][key], key
        assert max(shares) - min(shares) <= single["counts"][key] // 2, key
        assert max(shares) < single["counts"][key], key
    # The reward model, the agents and every metric of the train phase are the single process's.
    for rank in ranks:
        # R(w) - R(l) does not see the head's bias, so its true gradient is 0 and AdamW moves it by about the
        # learning rate in the direction of rounding noise (4 steps at 1e-2 here); every other weight matches.
        bias = "head.bias"
        shift = float(rank["reward_model"][bias] - single["reward_model"][bias])
        assert abs(shift) <= 4 * 1e-2
        _assert_weights_close(
            [{k: v for k, v in rank["reward_model"].items() if k != bias}],
            [{k: v for k, v in single["reward_model"].items() if k != bias}],
        )
        # That bias reaches the group-normalised advantages as rounding, and AdamW divides each update by its own
        # gradient scale, so a weight whose gradient is near 0 can move by a small part of a step (1.7e-5 of a
        # 1e-2 step was seen on one CPU): allow 1% of one step, far below the whole step a wrong shard would cost.
        _assert_weights_close(
            rank["agents"], single["agents"], atol=0.01 * dist_marlhf_script.DIST["agent_learning_rate"]
        )
        assert [(s, n) for s, n, _ in rank["metrics"]] == [(s, n) for s, n, _ in single["metrics"]]
        # The reward level moves with that bias; the advantages (group-normalised) and so the agents do not.
        level = ("rl/reward_model_mean", "turn_1/reward_mean", "turn_1/expected_return", "round/rl/reward_model_mean")
        expected = [v + shift if n in level else v for _, n, v in single["metrics"]]
        # Metrics after the first policy update come from those weights, so they carry their small part of a step.
        first = min(s for s, _, _ in single["metrics"])
        got = {(s, n): v for s, n, v in rank["metrics"]}
        off = [
            (s, n, got[s, n], want)
            for (s, n, _), want in zip(single["metrics"], expected, strict=True)
            if got[s, n] != pytest.approx(want, rel=1e-4 if s == first else 1e-3, abs=1e-5, nan_ok=True)
        ]
        assert off == []
