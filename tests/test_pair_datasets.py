"""Pair datasets that TRL and ``datasets`` take without glue: one schema in every format, TRL's files per agent,
the dataset card, and the chat forms that turn a rendered prompt back into messages.

Runs are built from ``store_fixtures.make_pairs`` (no model): every expected row, count and card line is worked
out from those pairs and the labels given here. ``datasets`` loads each file through its card, with a cache folder
of the test's own.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from huggingface_hub import DatasetCard
from pair_dataset_fixtures import PREFIX, SMOLLM2_TEMPLATE, SUFFIX, SYSTEM, chat_model_dir, load, tokenizer_with
from store_fixtures import make_pairs

from comlrl_lab import cli
from comlrl_lab.data.chat_form import ChatForm
from comlrl_lab.data.labels import Label
from comlrl_lab.data.records import SEED_RECORD_FIELDS
from comlrl_lab.engine.exports import export_run, run_about
from comlrl_lab.engine.spec import ExperimentSpec
from comlrl_lab.store import RunStore, export_pairs, export_trl
from comlrl_lab.store.card import CARD_MARKER
from comlrl_lab.store.dataset_schema import CSV_SCHEMA, PAIR_SCHEMA, trl_schema, yaml_features
from comlrl_lab.store.export import ExportError
from comlrl_lab.store.queries import PROVENANCE_COLUMNS
from comlrl_lab.ui.services import Workspace

datasets = pytest.importorskip("datasets")  # the datasets extra (dev installs it)

FORMATS = ("jsonl", "parquet", "csv")


def reward_run(store: RunStore, run_id: str = "r", **config) -> RunStore:
    """Rounds 1 to 3 with 4, 0 and 4 pairs of two agents, labelled by the reward function."""
    store.create_run(run_id, trainer="MADPOIter", config={"num_iterations": 3, "seed": 7, **config}, num_agents=2)
    for r in (1, 2, 3):
        store.commit_phase(run_id, r, "collect", pairs=make_pairs(r, 4 if r != 2 else 0))
    return store


#: Comparison -> its labels (labeller, verdict, side shown as A), and what the TRL files make of it.
LABELS = {
    0: [("ann", "A", "winner")],  # the reward function's winner is chosen
    1: [("ann", "A", "loser"), ("bob", "B", "winner")],  # both prefer the stored loser: chosen, gap negative
    2: [("ann", "tie", "winner")],  # tie
    3: [("ann", "both_bad", "winner"), ("bob", "both_bad", "loser")],  # both bad
    4: [("ann", "A", "winner"), ("bob", "B", "winner")],  # split
}  # comparison 5: no label yet


def labelled_run(store: RunStore, run_id: str = "h") -> RunStore:
    store.create_run(run_id, trainer="MADPOIter", config={"preference_source": "human", "seed": 1}, num_agents=2)
    store.commit_phase(run_id, 1, "collect", pairs=make_pairs(1, 6))
    store.put_labels(run_id, [Label(1, i, who, verdict, a) for i, given in LABELS.items() for who, verdict, a in given])
    return store


def card_of(folder: Path) -> DatasetCard:
    return DatasetCard.load(folder / "README.md")


# -- one schema --------------------------------------------------------------------------------------------------


def test_the_pair_schema_is_provenance_the_seed_record_labels_and_trls_columns():
    assert PAIR_SCHEMA.names == [*PROVENANCE_COLUMNS, *SEED_RECORD_FIELDS, "labels", "prompt", "chosen", "rejected"]
    assert {str(PAIR_SCHEMA.field(name).type) for name in ("round", "pair_index", "item_index")} == {"int64"}
    assert CSV_SCHEMA.names == PAIR_SCHEMA.names
    assert [str(CSV_SCHEMA.field(c).type) for c in ("prompts", "raw_rewards", "labels")] == ["string"] * 3


@pytest.mark.parametrize(
    "schema", [PAIR_SCHEMA, CSV_SCHEMA, trl_schema(False), trl_schema(True)], ids=["pairs", "csv", "trl", "chat"]
)
def test_card_features_are_what_datasets_writes_for_the_schema(schema):
    assert yaml_features(schema) == datasets.Features.from_arrow_schema(schema)._to_yaml_list()


def test_parquet_holds_the_schema_exactly(store, tmp_path):
    export_pairs(reward_run(store), "r", "parquet", tmp_path / "p" / "pairs.parquet")
    written = pq.read_schema(tmp_path / "p" / "pairs.parquet")
    assert written.names == PAIR_SCHEMA.names
    assert [f.type for f in written] == [f.type for f in PAIR_SCHEMA]  # int64 where DuckDB's INTEGER gave int32


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_loads_with_the_same_features_and_two_runs_concatenate(store, tmp_path, fmt):
    """A reward run's labels are all empty; through the card, ``datasets`` still types them as the labelled run's,
    so the two files concatenate (JSONL read alone would make them List(null))."""
    reward_run(store)
    labelled_run(store)
    export_pairs(store, "r", fmt, tmp_path / "reward" / f"pairs.{fmt}")
    export_pairs(store, "h", fmt, tmp_path / "human" / f"pairs.{fmt}")
    reward, human = load(tmp_path / "reward", tmp_path), load(tmp_path / "human", tmp_path)
    expected = datasets.Features.from_arrow_schema(CSV_SCHEMA if fmt == "csv" else PAIR_SCHEMA)
    assert reward.features == human.features == expected
    both = datasets.concatenate_datasets([reward, human])
    assert both.num_rows == 8 + 6
    labels = both["labels"][:8] + both["labels"][8:]
    if fmt == "csv":
        labels = [json.loads(text) for text in labels]
    assert labels[:8] == [[]] * 8
    assert labels[8:] == [[{"labeller": w, "verdict": v} for w, v, _ in LABELS.get(i, [])] for i in range(6)]
    assert both["round"][:8] == [1, 1, 1, 1, 3, 3, 3, 3] and both["pair_index"][8:] == list(range(6))
    # The labelled run's joint columns: a chosen side for comparisons 0 and 1 only.
    assert both["chosen"][8:10] == [
        "[Agent 1]\n"
        + make_pairs(1, 6)[0].winner_completions[0]
        + "\n[Agent 2]\n"
        + make_pairs(1, 6)[0].winner_completions[1],
        "[Agent 1]\n"
        + make_pairs(1, 6)[1].loser_completions[0]
        + "\n[Agent 2]\n"
        + make_pairs(1, 6)[1].loser_completions[1],
    ]
    assert [c or None for c in both["chosen"][10:]] == [None] * 4


def test_jsonl_carries_the_provenance_the_tables_carry(store, tmp_path):
    export_pairs(reward_run(store), "r", "jsonl", tmp_path / "j" / "pairs.jsonl")
    export_pairs(store, "r", "parquet", tmp_path / "p" / "pairs.parquet")
    lines = (tmp_path / "j" / "pairs.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == pq.read_table(tmp_path / "p" / "pairs.parquet").to_pylist()


# -- TRL's files ---------------------------------------------------------------------------------------------------


def expected_trl_rows(agent: int) -> list[dict]:
    return [
        {
            "prompt": p.prompts[agent],
            "chosen": p.winner_completions[agent],
            "rejected": p.loser_completions[agent],
            "round": p.round_index,
            "pair_index": p.item_index,  # make_pairs numbers items as it numbers pairs
            "item_index": p.item_index,
            "reward_gap": p.winner_reward - p.loser_reward,
            "labels": [],
        }
        for r in (1, 3)
        for p in make_pairs(r, 4)
    ]


def test_a_reward_run_gives_one_file_per_agent_with_each_agents_own_side(store, tmp_path):
    made = export_trl(reward_run(store), "r", tmp_path / "trl")
    assert [p.name for p in made.files] == ["agent_0.jsonl", "agent_1.jsonl"] and made.rows == 8
    assert made.card == tmp_path / "trl" / "README.md"
    assert made.left_out == {"tie": 0, "both_bad": 0, "split": 0, "awaiting_labels": 0}
    for agent in (0, 1):
        lines = (tmp_path / "trl" / f"agent_{agent}.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == expected_trl_rows(agent)
        loaded = load(tmp_path / "trl", tmp_path, f"agent_{agent}")
        assert loaded.features == datasets.Features.from_arrow_schema(trl_schema(False))
        assert loaded.to_list() == expected_trl_rows(agent)
    assert sorted(p.name for p in (tmp_path / "trl").iterdir()) == ["README.md", "agent_0.jsonl", "agent_1.jsonl"]


def test_parquet_trl_files_hold_the_same_rows(store, tmp_path):
    export_trl(reward_run(store), "r", tmp_path / "trl", file_format="parquet")
    table = pq.read_table(tmp_path / "trl" / "agent_1.parquet")
    assert table.schema.names == trl_schema(False).names
    assert [f.type for f in table.schema] == [f.type for f in trl_schema(False)]
    assert table.to_pylist() == expected_trl_rows(1)
    assert card_of(tmp_path / "trl").data.configs[1]["data_files"] == [{"split": "train", "path": "agent_1.parquet"}]


def test_a_labelled_run_keeps_the_chosen_side_and_counts_what_it_leaves_out(store, tmp_path):
    made = export_trl(labelled_run(store), "h", tmp_path / "trl")
    assert made.rows == 2 and made.left_out == {"tie": 1, "both_bad": 1, "split": 1, "awaiting_labels": 1}
    pairs = make_pairs(1, 6)
    rows = [json.loads(line) for line in (tmp_path / "trl" / "agent_1.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == [
        {
            "prompt": pairs[0].prompts[1],
            "chosen": pairs[0].winner_completions[1],
            "rejected": pairs[0].loser_completions[1],
            "round": 1,
            "pair_index": 0,
            "item_index": 0,
            "reward_gap": 0.75,
            "labels": [{"labeller": "ann", "verdict": "A"}],
        },
        {
            "prompt": pairs[1].prompts[1],
            "chosen": pairs[1].loser_completions[1],  # the labels overrule the reward function
            "rejected": pairs[1].winner_completions[1],
            "round": 1,
            "pair_index": 1,
            "item_index": 1,
            "reward_gap": -1.0,
            "labels": [{"labeller": "ann", "verdict": "A"}, {"labeller": "bob", "verdict": "B"}],
        },
    ]
    text = (tmp_path / "trl" / "README.md").read_text(encoding="utf-8")
    head = "| round | comparisons stored | rows per file | no side: tie | no side: both bad | no side: split |"
    assert head + " no side: awaiting labels |" in text
    assert "| 1 | 6 | 2 | 1 | 1 | 1 | 1 |" in text
    assert (
        "- Preference source: people's verdicts (`preference_source: human`, 1 label(s) per comparison); the side "
        "more than half of the labels prefer is chosen"
    ) in text.splitlines()


def test_a_chat_agents_rows_are_messages_with_the_system_prompt(store, tmp_path):
    form = ChatForm(PREFIX, SUFFIX, SYSTEM)
    pairs = make_pairs(1, 3)
    for pair in pairs:
        pair.prompts[1] = PREFIX + pair.prompts[1] + SUFFIX  # agent 1's prompts went through its template
    store.commit_phase("c", 1, "collect", pairs=pairs)
    made = export_trl(store, "c", tmp_path / "trl", chat_forms=[None, form])
    rows = load(tmp_path / "trl", tmp_path, "agent_1").to_list()
    originals = make_pairs(1, 3)
    assert [row["prompt"] for row in rows] == [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p.prompts[1]}] for p in originals
    ]
    assert [row["chosen"] for row in rows] == [
        [{"role": "assistant", "content": p.winner_completions[1]}] for p in originals
    ]
    assert [row["rejected"] for row in rows] == [
        [{"role": "assistant", "content": p.loser_completions[1]}] for p in originals
    ]
    assert load(tmp_path / "trl", tmp_path, "agent_0")["prompt"] == [p.prompts[0] for p in originals]
    card = card_of(tmp_path / "trl").data.to_dict()
    assert card["dataset_info"][1]["features"][0] == {
        "name": "prompt",
        "list": [{"name": "role", "dtype": "string"}, {"name": "content", "dtype": "string"}],
    }
    assert made.rows == 3


def test_a_prompt_the_template_did_not_render_is_refused_before_anything_is_written(store, tmp_path):
    pairs = make_pairs(1, 3)
    for pair in pairs[:2]:
        pair.prompts[1] = PREFIX + pair.prompts[1] + SUFFIX
    store.commit_phase("c", 1, "collect", pairs=pairs)
    with pytest.raises(ExportError, match="agent 1's prompt in round 1 pair 2 is not its chat template's rendering"):
        export_trl(store, "c", tmp_path / "trl", chat_forms=[None, ChatForm(PREFIX, SUFFIX, SYSTEM)])
    assert not (tmp_path / "trl").exists()
    with pytest.raises(ValueError, match="chat_forms has 1 entries but run 'c' has 2 actors"):
        export_trl(store, "c", tmp_path / "trl", chat_forms=[None])


def test_a_centralized_run_writes_one_file(store, tmp_path):
    store.create_run("z", trainer="MADPOIter", config={"collaboration_mode": "centralized", "num_agents": 2})
    store.commit_phase("z", 1, "collect", pairs=make_pairs(1, 2, num_agents=1))  # one actor: one joint text each
    made = export_trl(store, "z", tmp_path / "trl")
    assert [p.name for p in made.files] == ["agent_0.jsonl"] and made.rows == 2
    assert "one actor wrote every role's output in one joint completion" in (tmp_path / "trl" / "README.md").read_text()
    store.create_run("empty", trainer="MADPOIter", config={"collaboration_mode": "centralized", "num_agents": 3})
    assert [p.name for p in export_trl(store, "empty", tmp_path / "none").files] == ["agent_0.jsonl"]


def test_filters_apply_and_the_card_says_so(store, tmp_path):
    made = export_trl(reward_run(store), "r", tmp_path / "trl", round=3, winner_side="current")
    assert made.rows == 2  # items 0 and 2 of round 3 are won by the current agents
    text = (tmp_path / "trl" / "README.md").read_text(encoding="utf-8")
    assert "- Filters of this export: round=3, winner_side='current'" in text
    assert "| 1 | 4 | 0 |" in text and "| 2 | 0 | 0 |" in text and "| 3 | 4 | 2 |" in text


# -- the card --------------------------------------------------------------------------------------------------------


def test_the_card_is_the_runs_record_read_back_from_the_store_and_spec(store, tmp_path):
    spec = ExperimentSpec(
        algorithm="MADPOIter",
        task="length_ratio",
        config={"num_iterations": 3, "dpo_beta": 0.2, "seed": 9, "comparator_policy": "history"},
    )
    config = spec.build_config()
    config.output_dir = str(tmp_path / "somewhere" / "local")
    store.create_run("r", trainer="MADPOIter", config=config.to_dict(), num_agents=2)
    for r in (1, 2, 3):
        store.commit_phase("r", r, "collect", pairs=make_pairs(r, 4 if r != 2 else 0))
    made = export_run(store, "r", "trl", tmp_path / "trl", spec=spec)
    card = card_of(tmp_path / "trl")
    assert [c["config_name"] for c in card.data.configs] == ["agent_0", "agent_1"]
    assert card.data.configs[0]["default"] is True
    assert [i["features"] for i in card.data.dataset_info] == [yaml_features(trl_schema(False))] * 2
    assert card.data.size_categories == ["n<1K"] and "trl" in card.data.tags
    body = card.text
    assert body.startswith(CARD_MARKER)
    run = store.run("r")
    for line in (
        "- Run id: `r`",
        f"- Algorithm: `MADPOIter` (status {run['status']}, source {run['source']})",
        "- Model of agent 0: `comlrl-lab/tiny`",
        "- Model of agent 1: `comlrl-lab/tiny`",
        "- Task: `length_ratio`",
        "- Comparator: `history` (1 round back)",
        "- Seed: 9",
        "- Rounds: 3 collected of 3 planned (`num_iterations`)",
        "| `dpo_beta` | `0.2` |",
        "| `comparator_history_k` | `1` |",
        '| `comparator_policy` | `"history"` |',
        "| `agent_0` | `agent_0.jsonl` | 8 | TRL standard (text) |",
        "| 1 | 4 | 4 |",
        "| 2 | 0 | 0 |",
        "| 3 | 4 | 4 |",
        'pairs = load_dataset("path/to/this/folder", "agent_0", split="train")',
        'args = DPOConfig(output_dir="agent_0-dpo", beta=0.2)',
    ):
        assert line in body.splitlines(), line
    assert "| `output_dir` |" not in body and "somewhere" not in body  # a folder on the machine that ran
    assert "the task's reward function" in body
    stored = store.rounds("r")
    assert stored["num_pairs"].tolist() == [4, 0, 4] and made.count == 8
    changed = run_about(spec, json.loads(store.run("r")["config_json"]), "MADPOIter").changed_config
    # history's k, unset, takes its value when the config is validated: it differs from the default (None) too.
    assert set(changed) == {
        "num_iterations",
        "dpo_beta",
        "seed",
        "comparator_policy",
        "comparator_history_k",
        "output_dir",
    }


def test_a_card_is_written_beside_each_table_format_and_never_over_someone_elses_readme(store, tmp_path):
    reward_run(store)
    for fmt in FORMATS:
        export_pairs(store, "r", fmt, tmp_path / fmt / f"pairs.{fmt}")
        card = card_of(tmp_path / fmt)
        assert card.data.configs == [
            {
                "config_name": "default",
                "data_files": [{"split": "train", "path": f"pairs.{fmt}"}],
                "description": card.data.configs[0]["description"],
            }
        ]
        assert card.data.configs[0]["description"].startswith(f"pairs.{fmt}: 8 rows, sha256 ")
    export_pairs(store, "r", "json", tmp_path / "json" / "pairs.json")
    assert not (tmp_path / "json" / "README.md").exists()  # the seed's records alone
    export_pairs(store, "r", "jsonl", tmp_path / "jsonl" / "pairs.jsonl", round=1)  # our own card: replaced
    assert "8 rows" not in (tmp_path / "jsonl" / "README.md").read_text(encoding="utf-8")

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("# my notes\n", encoding="utf-8")
    for call in (
        lambda: export_pairs(store, "r", "parquet", mine / "pairs.parquet"),
        lambda: export_trl(store, "r", mine),
    ):
        with pytest.raises(ExportError, match="README.md exists and is not a comlrl-lab dataset card"):
            call()
    assert sorted(p.name for p in mine.iterdir()) == ["README.md"]
    assert (mine / "README.md").read_text(encoding="utf-8") == "# my notes\n"
    assert export_pairs(store, "r", "parquet", mine / "pairs.parquet", card=False) == 8
    with pytest.raises(ExportError, match="README.md is where the dataset card goes"):
        export_pairs(store, "r", "jsonl", tmp_path / "elsewhere" / "README.md")
    assert not (tmp_path / "elsewhere").exists()


def test_an_export_written_again_loads_its_new_rows_not_the_cached_ones(store, tmp_path):
    """``datasets`` caches a card's files by the card's YAML: the digest in each config's description makes a file
    written again a new entry."""
    reward_run(store)
    export_pairs(store, "r", "jsonl", tmp_path / "out" / "pairs.jsonl", round=1)
    assert load(tmp_path / "out", tmp_path)["round"] == [1] * 4
    export_pairs(store, "r", "jsonl", tmp_path / "out" / "pairs.jsonl", round=3)
    assert load(tmp_path / "out", tmp_path)["round"] == [3] * 4


# -- the command line and the workbench ----------------------------------------------------------------------------


def run_folder(tmp_path: Path) -> Path:
    """A run folder as the engine leaves it: spec.json (the embedded model, no chat template) and its store."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = ExperimentSpec(algorithm="MADPOIter", task="length_ratio", config={"num_iterations": 3, "seed": 7})
    spec.save(run_dir / "spec.json")
    with RunStore(run_dir / "run.duckdb") as store:
        store.create_run("r", trainer="MADPOIter", config=spec.build_config().to_dict(), num_agents=2)
        for r in (1, 2, 3):
            store.commit_phase("r", r, "collect", pairs=make_pairs(r, 4 if r != 2 else 0))
    return run_dir


def test_the_cli_exports_trl_files_and_cards(tmp_path, capsys):
    run_dir = run_folder(tmp_path)
    assert cli.main(["export", str(run_dir), "--format", "trl", "--dest", str(tmp_path / "trl")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "wrote agent_0.jsonl, agent_1.jsonl and README.md: 8 pairs in each; left out: none"
    assert [json.loads(line) for line in (tmp_path / "trl" / "agent_0.jsonl").read_text().splitlines()] == (
        expected_trl_rows(0)
    )
    assert "- Model of agent 1: `comlrl-lab/tiny`" in (tmp_path / "trl" / "README.md").read_text()
    args = ["--format", "trl", "--as", "parquet", "--prompt-form", "standard", "--dest", str(tmp_path / "p")]
    assert cli.main(["export", str(run_dir), *args]) == 0
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["README.md", "agent_0.parquet", "agent_1.parquet"]
    dest = tmp_path / "c" / "pairs.csv"
    assert cli.main(["export", str(run_dir), "--format", "csv", "--dest", str(dest), "--no-card"]) == 0
    assert sorted(p.name for p in dest.parent.iterdir()) == ["pairs.csv"]


def test_the_workbench_zips_the_trl_files_with_their_card(tmp_path):
    root = tmp_path / "runs"
    with RunStore(root / "pairs-1" / "run.duckdb") as pairs_store:
        reward_run(pairs_store, "pairs-1")
    ws = Workspace(root)
    try:
        archive, count = ws.export("pairs-1", "trl", {"round": 3})
        assert count == 4 and archive.suffix == ".zip" and archive.parent == root / "pairs-1" / "exports"
        with zipfile.ZipFile(archive) as zf:
            names = sorted(zf.namelist())
            assert names == [f"{archive.stem}/{n}" for n in ("README.md", "agent_0.jsonl", "agent_1.jsonl")]
            assert len(zf.read(names[1]).decode().splitlines()) == 4
        path, count = ws.export("pairs-1", "parquet", {})
        assert count == 8 and path.parent.name == path.stem and (path.parent / "README.md").is_file()
    finally:
        ws.close()


# -- chat forms ----------------------------------------------------------------------------------------------------


def test_the_chat_form_of_smollm2s_template_holds_its_system_prompt():
    from comlrl_lab.models.chat import chat_form, render_prompt

    tokenizer = tokenizer_with(SMOLLM2_TEMPLATE)
    assert chat_form(tokenizer) == ChatForm(PREFIX, SUFFIX, SYSTEM)
    assert render_prompt(tokenizer, "Write about rain.") == PREFIX + "Write about rain." + SUFFIX
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Write about rain."}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == PREFIX + "Write about rain." + SUFFIX  # what TRL renders from the exported messages


def test_templates_without_a_system_prompt_or_that_rewrite_the_message():
    from gguf_fixtures import CHAT_TEMPLATE

    from comlrl_lab.models.chat import chat_form

    assert chat_form(tokenizer_with(CHAT_TEMPLATE)) == ChatForm("<|im_start|>user\n", SUFFIX, None)
    refuses = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    assert chat_form(tokenizer_with(refuses)) == ChatForm("[user] ", "[assistant] ", None)
    shouts = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    with pytest.raises(ValueError, match="does not write the user message once as it is"):
        chat_form(tokenizer_with(shouts))


def test_agent_chat_forms_decide_as_the_trainer_does(tmp_path):
    from comlrl_lab.models.chat import agent_chat_forms

    chat = str(chat_model_dir(tmp_path))
    assert agent_chat_forms(["comlrl-lab/tiny", chat], "auto") == [None, ChatForm(PREFIX, SUFFIX, SYSTEM)]
    assert agent_chat_forms(["/nowhere/at/all", chat], "false") == [None, None]  # nothing is loaded
    with pytest.raises(ValueError, match="use_chat_template='true', but the tokenizer of 'comlrl-lab/tiny' has no"):
        agent_chat_forms(["comlrl-lab/tiny", chat], "true")


def test_a_spec_that_cannot_be_read_leaves_the_export_without_models_but_does_not_stop_it(tmp_path, capsys):
    run_dir = run_folder(tmp_path)
    (run_dir / "spec.json").write_text('{"algorithm": "MADPOIter", "no_such_key": 1}', encoding="utf-8")
    assert cli.main(["export", str(run_dir), "--format", "trl", "--dest", str(tmp_path / "trl")]) == 0
    err = capsys.readouterr().err
    assert "unknown spec key 'no_such_key'" in err and "the export goes on without the run's spec" in err
    assert "- Models: not recorded in the store" in (tmp_path / "trl" / "README.md").read_text(encoding="utf-8")
    assert len((tmp_path / "trl" / "agent_0.jsonl").read_text(encoding="utf-8").splitlines()) == 8


def test_an_imported_jsonl_export_gives_the_same_trl_rows_and_says_its_oracle_is_not_recorded(store, tmp_path):
    from comlrl_lab.store import import_pair_files

    export_pairs(reward_run(store), "r", "jsonl", tmp_path / "j" / "pairs.jsonl")
    with RunStore(tmp_path / "imported" / "run.duckdb") as imported:
        report = import_pair_files(imported, [tmp_path / "j" / "pairs.jsonl"])
        assert report.rounds == [1, 3] and report.imported_files == ["pairs.jsonl"]  # the rows' own rounds
        export_trl(imported, report.run_id, tmp_path / "trl")
    rows = [json.loads(line) for line in (tmp_path / "trl" / "agent_0.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == expected_trl_rows(0)
    text = (tmp_path / "trl" / "README.md").read_text(encoding="utf-8")
    assert "- Preference source: not recorded (pairs imported from files)" in text.splitlines()
