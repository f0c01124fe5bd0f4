"""Bad input meets a clear error before any work (issue 47): one line naming the file, row, field, model or endpoint
and what was wrong; nothing written, nothing committed lost.

``CASES`` is the table, in the style of ``test_hostile.py``: one row per finding, numbered by the issue's item, with
the ``case_...`` function that sets the trap and checks the outcome. A case takes the pytest fixtures it names. Cases
that run a process of their own and send it signals have test functions of their own at the end (``SEPARATE``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from case_tables import Case, case_params, check_table, run_case
from http_stub import HttpStub, Reply
from store_fixtures import make_pairs
from tokenizers import processors
from trainer_fixtures import ITEMS
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_lab import cli
from comlrl_lab.data.labels import A_SIDE_KEY, Label, NoUsableLabels
from comlrl_lab.models.generation import SamplingSettings, sample_candidates
from comlrl_lab.store import RunStore
from comlrl_lab.trainers.preference.comparators.api import ComparatorApiError
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

# -- 2. CoMLRL's contract: errors of the constructor ----------------------------------------------------------------


class EmptyPromptAdapter:
    """A centralized adapter whose joint prompt is empty for the items whose topic is ``green``."""

    def build_prompt(self, batch_item, agent_prompts):
        return "" if batch_item.get("topic") == "green" else "\n\n".join(agent_prompts)

    def parse_completion(self, completion, batch_item, num_agents):
        return [completion] * num_agents


def case_centralized_actor_count_before_reward_func(make_trainer, tmp_path, model_dir):
    """No reward_func and two actors in a centralized run: CoMLRL's first complaint, the actor count."""
    with pytest.raises(ValueError, match=r"^Centralized collaboration requires exactly one actor model\.$"):
        make_trainer(
            "MADPO",
            tmp_path,
            collaboration_mode="centralized",
            agent_model=None,
            agents=[model_dir, model_dir],
            reward_func=None,
        )


def case_empty_joint_prompt_is_refused_before_loading(make_trainer, tmp_path):
    """An empty joint prompt (centralized) is refused in one line naming the item, before any model is loaded (the
    model path does not exist: loading it would fail differently)."""
    with pytest.raises(ValueError) as caught:
        make_trainer(
            "MADPO",
            tmp_path,
            collaboration_mode="centralized",
            centralized_comparator_adapter=EmptyPromptAdapter(),
            agent_model=str(tmp_path / "no-such-model"),
        )
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("collaboration_mode='centralized': the joint prompt of train item 2 ")
    assert "'topic': 'green'" in message and "is ''" in message and "build_prompt" in message


def case_a_prompt_with_no_tokens_is_refused_by_the_sampler(model_dir):
    """A prompt the tokenizer turns into no tokens (no BOS of its own) is refused naming the prompt, not with torch's
    "cannot reshape tensor of 0 elements"."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A", special_tokens=[])
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    settings = SamplingSettings(max_new_tokens=2)
    for row_seeds, generator in (([1, 2], None), (None, torch.Generator().manual_seed(0))):
        with pytest.raises(ValueError, match=r"^prompt 1 of 2 \(''\) has no tokens"):
            sample_candidates(model, tokenizer, ["the cat", ""], 2, settings, generator, row_seeds=row_seeds)


# -- 3. labels that cannot be mixed up -------------------------------------------------------------------------------

RUN_ID = "r-20250101-000000-ab12"


@pytest.fixture
def human_run(tmp_path) -> Path:
    """A run folder whose store holds round 1's collect of a human run: 4 comparisons waiting, shown A = winner
    for even pair indices (labels_per_comparison 1)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pairs = make_pairs(1, 4)
    for n, pair in enumerate(pairs):
        pair.extra[A_SIDE_KEY] = "winner" if n % 2 == 0 else "loser"
    with RunStore(run_dir / "run.duckdb") as store:
        store.create_run(RUN_ID, config={"labels_per_comparison": 1})
        store.commit_phase(RUN_ID, 1, "collect", pairs=pairs)
    return run_dir


def labels_in(run_dir: Path) -> list[Label]:
    with RunStore(run_dir / "run.duckdb", read_only=True) as store:
        return store.labels(RUN_ID)


def exported(run_dir: Path, capsys, fmt: str = "jsonl") -> Path:
    assert cli.main(["labels", "export", str(run_dir), "--format", fmt]) == 0
    capsys.readouterr()
    return run_dir / f"labels_waiting.{fmt}"


def import_file(capsys, run_dir: Path, path: Path, *flags: str) -> tuple[int, str, list[str]]:
    """``labels import``: (exit status, stdout, stderr lines)."""
    code = cli.main(["labels", "import", str(run_dir), str(path), *flags])
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def case_labels_csv_round_trips_through_plain_pandas_and_excel(human_run, capsys):
    """The CSV names its run and fingerprints each comparison; plain ``pd.read_csv`` reads labeller and verdict as
    text, so assigning a name works; written back with Excel's byte-order mark, it imports."""
    path = exported(human_run, capsys, "csv")
    frame = pd.read_csv(path)
    assert list(frame["run_id"].unique()) == [RUN_ID]
    assert all(f.startswith("fp-") and len(f) == 19 for f in frame["fingerprint"])
    frame.loc[0, "labeller"] = "ann"  # pandas 3 refuses a name in a float (all-NaN) column
    frame.loc[0, "verdict"] = "A"
    frame.to_csv(path, index=False, encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    code, out, err = import_file(capsys, human_run, path)
    assert code == 0 and err == [], err
    assert "imported 1 labels" in out and "3 rows not labelled yet; 0 rows skipped" in out
    assert [(x.pair_index, x.labeller, x.verdict) for x in labels_in(human_run)] == [(0, "ann", "A")]


def case_labels_of_another_run_are_refused_whole(human_run, tmp_path, capsys):
    """A file of another run (or naming no run) is refused in one line; nothing is written, good rows included."""
    rows = [json.loads(line) for line in exported(human_run, capsys).read_text().splitlines()]
    filled = [{**r, "labeller": "ann", "verdict": "A"} for r in rows]
    other = write_jsonl(tmp_path / "other.jsonl", [*filled[:2], {**filled[2], "run_id": "r-other"}])
    code, _, err = import_file(capsys, human_run, other)
    assert code == 2 and len(err) == 1, err
    assert "line 3: the row is of run 'r-other', not " + RUN_ID in err[0] and "nothing was imported" in err[0]
    unnamed = write_jsonl(tmp_path / "unnamed.jsonl", [{k: v for k, v in filled[0].items() if k != "run_id"}])
    code, _, err = import_file(capsys, human_run, unnamed)
    assert code == 2 and len(err) == 1 and "line 1: the row names no run (no run_id)" in err[0], err
    assert labels_in(human_run) == []


def case_a_label_on_another_comparison_is_refused_whole(human_run, tmp_path, capsys):
    """A row whose fingerprint is not its comparison's (rows shuffled, a pair index edited) refuses the file."""
    rows = [json.loads(line) for line in exported(human_run, capsys).read_text().splitlines()]
    filled = [{**r, "labeller": "ann", "verdict": "A"} for r in rows]
    filled[1]["pair_index"] = 2  # the verdict given on pair 1's texts would land on pair 2
    code, _, err = import_file(capsys, human_run, write_jsonl(tmp_path / "moved.jsonl", filled))
    assert code == 2 and len(err) == 1, err
    assert f"line 2: fingerprint '{rows[1]['fingerprint']}' is not that of round 1 pair 2" in err[0]
    assert labels_in(human_run) == []


def case_labels_for_a_round_past_its_label_phase_are_refused(human_run, tmp_path, capsys):
    """Once round 1's label phase (or select, train) is committed, a label for it is refused, file and all."""
    rows = [json.loads(line) for line in exported(human_run, capsys).read_text().splitlines()]
    with RunStore(human_run / "run.duckdb") as store:
        store.commit_phase(RUN_ID, 1, "label")
        store.commit_phase(RUN_ID, 1, "select")
    path = write_jsonl(tmp_path / "late.jsonl", [{**rows[0], "labeller": "ann", "verdict": "B"}])
    code, _, err = import_file(capsys, human_run, path)
    assert code == 2 and len(err) == 1, err
    assert "line 1: round 1 is past its label phase (select is committed)" in err[0]
    assert labels_in(human_run) == []


def case_conflicting_rows_of_one_labeller_are_refused_and_counted(human_run, tmp_path, capsys):
    """Two verdicts of one labeller on one comparison: neither is written, both lines named, the conflict counted;
    the same verdict twice is one label; ``--strict`` refuses the file."""
    rows = [json.loads(line) for line in exported(human_run, capsys).read_text().splitlines()]
    filled = [
        {**rows[0], "labeller": "ann", "verdict": "A"},
        {**rows[1], "labeller": "ann", "verdict": "tie"},
        {**rows[0], "labeller": "ann", "verdict": "B"},
        {**rows[1], "labeller": "ann", "verdict": "tie"},
    ]
    path = write_jsonl(tmp_path / "conflict.jsonl", filled)
    code, _, err = import_file(capsys, human_run, path, "--strict")
    assert code == 2 and len(err) == 1 and "1 rows would be skipped (--strict)" in err[0], err
    assert labels_in(human_run) == []
    code, out, err = import_file(capsys, human_run, path)
    assert code == 0
    assert err == ["skipped lines 1, 3: labeller 'ann' gives round 1 pair 0 A and B; none of them imported"]
    assert "imported 1 labels" in out and "(1 comparisons with disagreeing rows of one labeller)" in out
    assert [(x.pair_index, x.verdict) for x in labels_in(human_run)] == [(1, "tie")]


def case_non_integer_rounds_are_skipped(human_run, tmp_path, capsys):
    """Round "1.9" (text, as CSV gives it) and 1.9 (a JSON number) are not round 1; "1" and 1.0 are."""
    rows = [json.loads(line) for line in exported(human_run, capsys).read_text().splitlines()]
    filled = [
        {**rows[0], "round": "1.9", "labeller": "ann", "verdict": "A"},
        {**rows[1], "round": 1.9, "labeller": "ann", "verdict": "A"},
        {**rows[2], "round": "1", "labeller": "ann", "verdict": "A"},
        {**rows[3], "round": 1.0, "labeller": "ann", "verdict": "A"},
    ]
    code, out, err = import_file(capsys, human_run, write_jsonl(tmp_path / "rounds.jsonl", filled))
    assert code == 0 and "imported 2 labels" in out
    assert err == [
        "skipped line 1: round and pair_index must be integers, got '1.9' and 0",
        "skipped line 2: round and pair_index must be integers, got 1.9 and 1",
    ]


def case_no_label_imported_exits_non_zero(human_run, capsys):
    """The export as it was written (placeholders only): nothing imported, exit 1, said on stderr."""
    code, out, err = import_file(capsys, human_run, exported(human_run, capsys, "csv"))
    assert code == 1 and "imported 0 labels" in out and "4 rows not labelled yet" in out
    assert err == [f"comlrl-lab labels: no label was imported from {human_run / 'labels_waiting.csv'}"]


def case_many_bad_rows_print_a_few_errors_and_a_count(human_run, tmp_path, capsys):
    """50 MB of bad rows (the bound is 64 MB) print the first 10 errors and a count."""
    row = json.dumps({"run_id": RUN_ID, "round": 1, "pair_index": 999, "labeller": "ann", "verdict": "A"}) + "\n"
    count = 50_000_000 // len(row)
    path = tmp_path / "bad.jsonl"
    path.write_text(row * count, encoding="utf-8")
    code, _, err = import_file(capsys, human_run, path)
    assert code == 1
    assert err[:10] == [f"skipped line {n}: no comparison round 1 pair 999 in run {RUN_ID}" for n in range(1, 11)]
    assert err[10:] == [
        f"... and {count - 10} more rows skipped",
        f"comlrl-lab labels: no label was imported from {path}",
    ]


def case_escape_codes_in_a_labels_file_are_never_echoed_raw(human_run, tmp_path, capsys):
    """A labeller or verdict with terminal escape codes is named escaped (its repr) and skipped."""
    rows = [json.loads(line) for line in exported(human_run, capsys).read_text().splitlines()]
    filled = [
        {**rows[0], "labeller": "\x1b]0;owned\x07ann", "verdict": "A"},
        {**rows[1], "labeller": "bob", "verdict": "\x1b[2J"},
    ]
    code, out, err = import_file(capsys, human_run, write_jsonl(tmp_path / "esc.jsonl", filled))
    assert code == 1 and "\x1b" not in out + "".join(err)
    assert err[:2] == [
        "skipped line 1: labeller '\\x1b]0;owned\\x07ann' has control characters",
        "skipped line 2: verdict must be one of A, B, tie, both_bad, got '\\x1b[2J'",
    ]


# -- 5. a round that learned nothing says so -------------------------------------------------------------------------


def judge_trainer(make_trainer, tmp_path, stub: HttpStub, **overrides):
    """A MADPO judge run whose judge is ``stub``'s /judge (generic format, model "stub-judge")."""
    settings = dict(
        preference_source="judge",
        judge_api_url=stub.url("/judge"),
        judge_api_format="generic",
        judge_api_model="stub-judge",
        judge_api_timeout=5.0,
    )
    return make_trainer("MADPO", tmp_path, sink=MemorySink(), **{**settings, **overrides})


@pytest.mark.parametrize("answer", ["C", '{"winner": "A"}'])
def test_a_judge_that_leaves_no_usable_label_stops_the_run(make_trainer, tmp_path, answer):
    """Every answer a third option, or JSON (of another shape than a verdict first): the label phase stops the run
    in one line naming the judge, the counts and the likely cause; nothing of the phase is committed."""
    with HttpStub() as stub:
        stub.route("/judge", lambda request: Reply(json={"completions": [answer]}))
        trainer = judge_trainer(make_trainer, tmp_path, stub)
        trainer.step("collect")
        comparisons = len(trainer.collector.round_pairs)
        with pytest.raises(NoUsableLabels) as caught:
            trainer.step("label")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"round 1: the judge 'stub-judge' at {stub.url('/judge')} left no usable label: of ")
    assert (
        f"of {comparisons} comparisons (each asked in both orders) {comparisons} got an unparseable answer" in message
    )
    assert "likely cause: no answer began with A, B, tie or both bad (the first: " in message
    assert f"(the first: {answer!r}); judge_template must ask for one of them first" in message
    assert trainer.next_phase == "label" and len(trainer.sink.phases) == 1  # only collect was committed


@pytest.mark.slow
def test_a_judge_that_always_says_tie_or_picks_a_position_says_so(make_trainer, tmp_path):
    with HttpStub() as stub:
        stub.route("/judge", lambda request: Reply(json={"completions": ["tie"]}))
        trainer = judge_trainer(make_trainer, tmp_path, stub)
        trainer.step("collect")
        n = len(trainer.collector.round_pairs)
        with pytest.raises(NoUsableLabels, match=rf"0 got an unparseable answer, 0 inconsistent answers, {n} tie and "
                           "0 both bad; likely cause: the judge called every comparison a tie or both bad$"):  # fmt: skip
            trainer.step("label")
    with HttpStub() as stub:
        stub.route("/judge", lambda request: Reply(json={"completions": ["A"]}))
        trainer = judge_trainer(make_trainer, tmp_path / "a", stub)
        trainer.step("collect")
        with pytest.raises(NoUsableLabels, match="likely cause: every comparison was answered differently in the two "
                           "orders: a judge that prefers a position$"):  # fmt: skip
            trainer.step("label")


def test_people_who_leave_no_usable_label_stop_the_run(make_trainer, tmp_path):
    sink = MemorySink()
    trainer = make_trainer("MADPO", tmp_path, preference_source="human", sink=sink)
    trainer.step("collect")
    comparisons = trainer.collector.round_pairs
    sink.give(*(Label(1, i, "ann", "tie" if i % 2 else "both_bad", p.extra[A_SIDE_KEY]) for i, p in
                enumerate(comparisons)))  # fmt: skip
    n, ties = len(comparisons), len(comparisons) // 2
    with pytest.raises(NoUsableLabels) as caught:
        trainer.step("label")
    assert str(caught.value).startswith(
        f"round 1: the labels of 'ann' leave no usable label: {n} labels on {n} comparisons, {ties} tie and "
        f"{n - ties} both bad, none prefers a side, so select would train on nothing; relabel"
    )


@pytest.mark.slow
def test_a_cli_run_whose_judge_leaves_nothing_exits_non_zero_and_the_store_says_why(model_dir, tmp_path, capsys):
    from test_engine import small_spec

    with HttpStub() as stub:
        stub.route("/judge", lambda request: Reply(json={"completions": ["neither"]}))
        spec = small_spec(
            model_dir,
            num_iterations=1,
            preference_source="judge",
            judge_api_url=stub.url("/judge"),
            judge_api_format="generic",
            judge_api_model="stub-judge",
        )
        spec_file = tmp_path / "spec.json"
        spec.save(spec_file)
        code = cli.main(["run", str(spec_file), "--runs-root", str(tmp_path / "runs"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    errors = [line for line in err if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: NoUsableLabels: round 1: the judge 'stub-judge' at "), err
    assert "likely cause: no answer began with A, B, tie or both bad (the first: 'neither')" in errors[0]
    run_dir = next((tmp_path / "runs").iterdir())
    with RunStore(run_dir / "run.duckdb", read_only=True) as store:
        run_id = store.first_run_id()
        assert store.run(run_id)["status"] == "failed"
        assert store.committed_phases(run_id) == [(1, "collect")]
        logged = store.events(run_id, level="error")["message"].tolist()
    assert logged == [errors[0].removeprefix("error: ")]


# -- 6. clear errors before work ------------------------------------------------------------------------------------


def case_judge_key_not_set_is_refused_before_the_run_folder(model_dir, tmp_path, capsys, monkeypatch):
    """A judge whose key variable is not set: ``run`` refuses it in one line naming the judge's field and the
    variable, before a run folder exists (it used to fail after collect, leaving a failed run)."""
    from test_engine import small_spec

    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    spec = small_spec(
        model_dir,
        preference_source="judge",
        judge_api_url="http://127.0.0.1:9/judge",
        judge_api_format="openai",
        judge_api_key_env="NO_SUCH_JUDGE_KEY",
    )
    spec.save(tmp_path / "spec.json")
    runs = tmp_path / "runs"
    code = cli.main(["run", str(tmp_path / "spec.json"), "--runs-root", str(runs), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "judge_api_format='openai' needs an API key: the environment variable NO_SUCH_JUDGE_KEY" in err[0]
    assert "judge_api_key_env" in err[0] and "comparator_" not in err[0]
    assert not runs.exists() or not any(runs.iterdir())


def case_judge_errors_name_the_judges_fields(make_trainer, tmp_path):
    """The API client's errors reach the judge's user in the judge's words: no ``comparator_*`` field (which does
    nothing for the judge), no "agent 0"."""
    big = "x" * (1024 * 1024 + 10)
    for reply, expected in (
        (Reply(json={"completions": [{"verdict": "A"}]}), "Judge API returned no completions for the judge (format "),
        (Reply(body=big), "past the judge's fixed bound on a response body = 1048576"),
    ):
        with HttpStub() as stub:
            stub.route("/judge", reply)
            trainer = judge_trainer(make_trainer, tmp_path / str(len(expected)), stub, judge_api_max_retries=0)
            trainer.step("collect")
            with pytest.raises(ComparatorApiError) as caught:
                trainer.step("label")
        message = str(caught.value)
        assert expected in message and "omparator" not in message and "agent 0" not in message, message


def case_escape_codes_in_a_judge_body_are_never_echoed_raw(make_trainer, tmp_path, capsys):
    """A judge (or comparator) body with terminal escape codes: the error shows them escaped, here and in the CLI's
    one line."""
    with HttpStub() as stub:
        stub.route("/judge", Reply(status=400, body="\x1b[2J\x1b]0;owned\x07 bad request"))
        trainer = judge_trainer(make_trainer, tmp_path, stub, judge_api_max_retries=0)
        trainer.step("collect")
        with pytest.raises(ComparatorApiError) as caught:
            trainer.step("label")
    message = str(caught.value)
    assert "\x1b" not in message and "Response body: \\x1b[2J\\x1b]0;owned\\x07 bad request" in message
    assert "\x1b" not in cli.describe_error(ValueError("from a file: \x1b[31mred"))


def run_cli(capsys, spec_file: Path, runs: Path, *flags: str) -> tuple[int, list[str]]:
    """``comlrl-lab run SPEC`` in this process: (exit status, stderr lines)."""
    code = cli.main(["run", str(spec_file), "--runs-root", str(runs), "--quiet", *flags])
    return code, capsys.readouterr().err.strip().splitlines()


def case_a_cuda_cell_in_a_cpu_sweep_is_refused_up_front(model_dir, tmp_path, capsys):
    """A grid with a ``cuda:0`` cell on a machine without CUDA: ``sweep`` refuses it before any cell runs, in one line
    naming the cell, as ``run`` refuses the spec alone."""
    from test_engine import small_spec

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    small_spec(model_dir, num_iterations=1).save(tmp_path / "spec.json")
    runs = tmp_path / "runs"
    code = cli.main(
        [
            "sweep",
            str(tmp_path / "spec.json"),
            "--runs-root",
            str(runs),
            "--grid",
            "agent_devices=cpu,cuda:0",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("comlrl-lab sweep: cell 1 (agent_devices=cuda:0, seed=3): agent_devices: 'cuda:0' asks")
    assert err[0].endswith("; no cell was started")
    assert not runs.exists() or not [p for p in runs.rglob("*") if p.is_dir() and p.name != "_sweeps"]


def register_copy(models: Path, model_dir: str, name: str = "tiny-copy") -> Path:
    """A copy of the tiny model registered as ``name`` in the models folder ``models`` (a manifest beside it)."""
    import shutil

    from comlrl_lab.models.registry import MANIFEST

    folder = models / name
    shutil.copytree(model_dir, folder)
    (folder / MANIFEST).write_text(
        json.dumps({"architecture": "LlamaForCausalLM", "parameters": 1, "dtype": "float32"})
    )
    return folder


def truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


#: How a registered model's files are damaged, and what the one line says about it.
DAMAGES = [
    (lambda f: (f / "model.safetensors").unlink(), "has no weights (model.safetensors or pytorch_model.bin"),
    (lambda f: truncate(f / "model.safetensors", 4), "model.safetensors is truncated (4 bytes: not even a"),
    (lambda f: truncate(f / "model.safetensors", 4000), "model.safetensors is truncated: its tensors need"),
    (lambda f: (f / "config.json").write_text('{"model_type": "lla'), "config.json is not valid JSON (truncated"),
    (lambda f: (f / "tokenizer.json").write_bytes(b"\x00\xff garbage"), "tokenizer.json is not valid JSON"),
]


def case_a_damaged_registered_model_is_refused_before_the_run_folder(model_dir, tmp_path, capsys, monkeypatch):
    """A registered model whose weights were deleted or truncated, or whose config or tokenizer is damaged: one line
    naming the model, the file and what to do, and no run folder (no library pages, no run left "created")."""
    from test_engine import small_spec

    from comlrl_lab.models.registry import ENV_MODELS_DIR

    for k, (damage, said) in enumerate(DAMAGES):
        models = tmp_path / f"models{k}"
        monkeypatch.setenv(ENV_MODELS_DIR, str(models))
        damage(register_copy(models, model_dir))
        small_spec("tiny-copy", num_iterations=1).save(tmp_path / "spec.json")
        runs = tmp_path / f"runs{k}"
        code, err = run_cli(capsys, tmp_path / "spec.json", runs)
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith("comlrl-lab run: agent_models: model 'tiny-copy': "), err
        assert said in err[0] and err[0].endswith("register it again: comlrl-lab models add tiny-copy --force"), err
        assert not runs.exists() or not any(runs.iterdir())


def case_a_truncated_gguf_is_refused_in_one_line(model_dir, tmp_path, capsys):
    """A ``.gguf`` agent file cut short (its header, or its tensors): one line before a run folder exists; the memory
    check that used to crash on its header (struct.error, leaving the run "created") returns no warning."""
    from gguf_fixtures import write_tiny_gguf
    from test_engine import small_spec

    from comlrl_lab.engine.preflight import memory_warning

    whole = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    capsys.readouterr()  # what writing it printed
    for keep in (200, len(whole) // 2):
        cut = tmp_path / f"cut{keep}.gguf"
        cut.write_bytes(whole[:keep])
        spec = small_spec(str(cut), num_iterations=1)
        assert memory_warning(spec) is None
        spec.save(tmp_path / "spec.json")
        runs = tmp_path / f"runs{keep}"
        code, err = run_cli(capsys, tmp_path / "spec.json", runs)
        assert code == 2 and len(err) == 1, err
        assert f"agent_models: model '{cut}': {cut} is not a whole GGUF file (truncated or damaged: " in err[0]
        assert not runs.exists() or not any(runs.iterdir())


def case_one_malformed_manifest_is_skipped_with_one_warning(model_dir, tmp_path, capsys, caplog, monkeypatch):
    """A malformed manifest in the models folder: ``models list`` shows the others and one warning line naming the
    folder; a run naming another registered model passes its checks."""
    from test_engine import small_spec

    from comlrl_lab.engine.preflight import preflight
    from comlrl_lab.models.registry import ENV_MODELS_DIR, MANIFEST

    models = tmp_path / "models"
    monkeypatch.setenv(ENV_MODELS_DIR, str(models))
    register_copy(models, model_dir, "good")
    for name, text in (("bad-list", "[1, 2]"), ("bad-json", '{"architecture": '), ("bad-count", '{"parameters": "x"}')):
        (models / name).mkdir()
        (models / name / MANIFEST).write_text(text)
    with caplog.at_level("WARNING", logger="comlrl_lab.models.registry"):
        assert cli.main(["models", "list"]) == 0
        out = capsys.readouterr().out.strip().splitlines()
        spec = small_spec("good", num_iterations=1)
        preflight(spec, spec.build_config())
        assert cli.main(["models", "list"]) == 0  # said once per process
    assert [line.split()[0] for line in out] == ["name", "good"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and all(w.startswith(f"warning: skipping {models}/bad-") for w in warnings), warnings
    assert "its manifest comlrl-lab-model.json is malformed (a JSON list, not an object)" in warnings[2]
    assert all("\n" not in w for w in warnings)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_key_given_twice_in_a_spec_is_refused(model_dir, tmp_path, capsys, suffix):
    """A spec with one key written twice (which one was meant?) is refused in one line with the file and the line."""
    from test_engine import small_spec

    data = small_spec(model_dir, num_iterations=1).to_dict()
    if suffix == ".json":
        text = json.dumps(data, indent=2).replace('"seed": 3,', '"seed": 3,\n    "seed": 4,')
    else:
        import yaml

        text = yaml.safe_dump(data, sort_keys=False).replace("  seed: 3\n", "  seed: 3\n  seed: 4\n")
    path = tmp_path / f"spec{suffix}"
    path.write_text(text)
    first = text.splitlines().index(next(line for line in text.splitlines() if "seed" in line)) + 1
    code, err = run_cli(capsys, path, tmp_path / "runs")
    assert code == 2 and len(err) == 1, err
    if suffix == ".json":
        assert err[0].endswith(f"{path}: the key 'seed' is given twice in one object (written at lines {first}, "
                               f"{first + 1}); give it once")  # fmt: skip
    else:
        assert err[0].endswith(f"{path}:{first + 1}:3: the key 'seed' is given twice in one mapping (first at line "
                               f"{first}); give it once")  # fmt: skip


def case_sweep_status_tells_a_killed_cell_from_a_running_one(model_dir, tmp_path, capsys):
    """A local sweep's cell the manifest calls running: "running" while a process holds its lock (the runner takes
    it), "lost" once that process is gone (killed), as a cluster job's cell."""
    from test_engine import small_spec

    from comlrl_lab.engine.cluster import cell_lock
    from comlrl_lab.engine.sweep import Sweep, parse_grid

    spec = small_spec(model_dir, num_iterations=1)
    sweep = Sweep.create(
        spec, parse_grid(spec.config_class, ["dpo_beta=0.1,0.2"]), seeds=1, runs_root=tmp_path / "runs"
    )
    with sweep.editing() as cells:
        cells[0].status = cells[1].status = "running"

    def states() -> list[str]:
        assert cli.main(["sweep", "status", str(sweep.sweep_dir)]) == 0
        rows = capsys.readouterr().out.strip().splitlines()[2:]
        return [row.split()[1] for row in rows]

    held = cell_lock(sweep.sweep_dir, 0)
    held.acquire(timeout=0)
    try:
        assert states() == ["running", "lost"]
    finally:
        held.release()
    assert states() == ["lost", "lost"]


def case_stdout_closed_by_its_reader_is_no_error(tmp_path):
    """``comlrl-lab models list | head -0``: the reader is gone before the first line; the command still exits 0 and
    says nothing of a BrokenPipeError."""
    import subprocess
    import sys

    env = {**os.environ, "COMLRL_LAB_MODELS_DIR": str(tmp_path / "none")}
    child = subprocess.Popen(
        [sys.executable, "-m", "comlrl_lab.cli", "models", "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 0 and err == "", err


@pytest.mark.slow
def test_comlrl_lab_run_into_a_closed_pipe_finishes_its_run(model_dir, tmp_path):
    """``comlrl-lab run SPEC | head -0``: the run is done in full (it used to die at its first line, exit 2)."""
    from test_engine import small_spec

    small_spec(model_dir, num_iterations=1).save(tmp_path / "spec.json")
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "comlrl_lab.cli", "run", str(tmp_path / "spec.json"), "--runs-root", str(runs)]
    child = subprocess.Popen([*command, "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=600) == 0 and "BrokenPipe" not in err and "Exception ignored" not in err, err
    (run_dir,) = runs.iterdir()
    with RunStore(run_dir / "run.duckdb", read_only=True) as store:
        assert store.run(store.first_run_id())["status"] == "finished"


# -- the table ------------------------------------------------------------------------------------------------------


CASES = [
    Case("2 centralized: actor count before reward_func", case_centralized_actor_count_before_reward_func),
    Case("2 centralized: empty joint prompt", case_empty_joint_prompt_is_refused_before_loading),
    Case("2 a prompt with no tokens", case_a_prompt_with_no_tokens_is_refused_by_the_sampler),
    Case("3 CSV through pandas and Excel", case_labels_csv_round_trips_through_plain_pandas_and_excel),
    Case("3 labels of another run", case_labels_of_another_run_are_refused_whole),
    Case("3 a label on another comparison", case_a_label_on_another_comparison_is_refused_whole),
    Case("3 a label for a round already selected", case_labels_for_a_round_past_its_label_phase_are_refused),
    Case("3 conflicting rows of one labeller", case_conflicting_rows_of_one_labeller_are_refused_and_counted),
    Case("3 non-integer rounds", case_non_integer_rounds_are_skipped),
    Case("3 nothing imported", case_no_label_imported_exits_non_zero),
    Case("3 50 MB of bad rows", case_many_bad_rows_print_a_few_errors_and_a_count, (pytest.mark.slow,)),
    Case("6 escape codes in a labels file", case_escape_codes_in_a_labels_file_are_never_echoed_raw),
    Case("6 escape codes in a judge body", case_escape_codes_in_a_judge_body_are_never_echoed_raw),
    Case("6 judge key not set", case_judge_key_not_set_is_refused_before_the_run_folder),
    Case("6 judge errors naming comparator_* fields", case_judge_errors_name_the_judges_fields),
    Case("6 a cuda:0 cell in a CPU sweep", case_a_cuda_cell_in_a_cpu_sweep_is_refused_up_front),
    Case(
        "6 a registered model deleted, truncated or damaged",
        case_a_damaged_registered_model_is_refused_before_the_run_folder,
    ),
    Case("6 a truncated GGUF", case_a_truncated_gguf_is_refused_in_one_line),
    Case("6 one malformed model manifest", case_one_malformed_manifest_is_skipped_with_one_warning),
    Case("6 sweep status of a killed cell", case_sweep_status_tells_a_killed_cell_from_a_running_one),
    Case("6 comlrl-lab ... | head", case_stdout_closed_by_its_reader_is_no_error),
]

#: Cases with a test function of their own below.
SEPARATE: dict[str, str] = {
    "4 Ctrl-C and SIGTERM during comlrl-lab run": "test_a_signal_during_a_run_stops_it_cleanly",
    "5 a judge that leaves no usable label": "test_a_judge_that_leaves_no_usable_label_stops_the_run",
    "5 a judge always tie or by position": "test_a_judge_that_always_says_tie_or_picks_a_position_says_so",
    "5 people who leave no usable label": "test_people_who_leave_no_usable_label_stop_the_run",
    "5 the CLI and the store say the same": "test_a_cli_run_whose_judge_leaves_nothing_exits_non_zero_and_the_store_says_why",
    "6 a key given twice in a spec file": "test_a_key_given_twice_in_a_spec_is_refused",
    "6 comlrl-lab run | head finishes its run": "test_comlrl_lab_run_into_a_closed_pipe_finishes_its_run",
}


@pytest.mark.parametrize("case", case_params(CASES))
def test_bad_input(case: Case, request):
    run_case(case, request)


def test_the_table_lists_every_case_once():
    check_table(CASES, globals(), SEPARATE)


def test_items_are_the_fixtures():  # the empty-prompt case relies on item 2's topic
    assert ITEMS[2]["topic"] == "green"


# -- 4. signals end a run cleanly (a process of its own) ---------------------------------------------------------------

#: (signals, seconds after the run is announced before the first, seconds between them): while the models load, in
#: the middle of the run at several moments, and a second signal while the first is being handled. Each try is a
#: process of its own, whose start costs more than the seconds it runs, so the tries with a second signal also stand
#: for two of the moments.
SIGNAL_TRIES = [
    ((signal.SIGINT,), 0.0, 0.0),
    ((signal.SIGINT, signal.SIGINT), 2.0, 0.05),
    ((signal.SIGTERM,), 3.0, 0.0),
    ((signal.SIGTERM, signal.SIGINT), 4.5, 0.3),
]


@pytest.mark.slow
def test_a_signal_during_a_run_stops_it_cleanly(model_dir, tmp_path):
    """Ctrl-C or SIGTERM during ``comlrl-lab run``: the phase in progress is abandoned, the run is marked interrupted
    in the store, the output says how to resume, and the process exits 130 or 143; never an abort (SIGABRT,
    "terminate called without an active exception"), whatever the moment, however many signals."""
    from test_engine import small_spec

    spec_file = tmp_path / "spec.json"
    small_spec(model_dir, num_iterations=200, preference_num_candidates=6).save(spec_file)
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "comlrl_lab.cli", "run", str(spec_file), "--runs-root", str(runs), "--quiet"]
    for signals, delay, gap in SIGNAL_TRIES:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = child.stdout.readline()
        assert first.startswith("run "), first
        run_dir = Path(first.strip().split(" in ", 1)[1])
        time.sleep(delay)
        for k, number in enumerate(signals):
            time.sleep(gap if k else 0.0)
            child.send_signal(number)
        out, err = child.communicate(timeout=300)
        what = f"{[s.name for s in signals]} after {delay} s: exit {child.returncode}\n{err}"
        assert child.returncode == 128 + signals[0], what
        assert "terminate called" not in err and "Traceback" not in err, what
        name = signals[0].name
        assert f"comlrl-lab run: {name}: stopping at the next safe point" in err, what
        assert f"interrupted by {name}: stopped before " in err, what
        assert out.strip().splitlines()[-1] == f"resume with: comlrl-lab run --resume {run_dir}", what
        with RunStore(run_dir / "run.duckdb", read_only=True) as store:
            run_id = store.first_run_id()
            assert store.run(run_id)["status"] == "interrupted", what
            events = store.events(run_id)
        assert any(f"interrupted by {name}" in message for message in events["message"]), what
