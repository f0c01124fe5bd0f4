"""The docs a team starts from stay true: the config reference, the README's commands, links and example code.

- docs/config_reference.md lists every field of the four configs with its help text, and matches what
  scripts/gen_config_reference.py writes today;
- the README's set-up, app and test commands are the ones CI runs; its Python example runs;
- docs/cluster.md's "Beyond one machine" says how to start a torchrun run once the trainers and tests have one;
- every relative link in the README and docs/*.md points at a file inside the repository;
- every examples/*.yaml is a valid experiment spec;
- the usage example in each public trainer's docstring runs and prints what it shows.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
from repo_scripts import load_repo_script

from comlrl_lab.trainers.preference.config import CONFIG_CLASSES

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "config_reference.md"
README = ROOT / "README.md"


def load_script(name: str):
    return load_repo_script(f"scripts/{name}.py", name)


def table_rows(text: str) -> dict[str, list[str]]:
    """Field name -> every reference-table row that starts with it."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"\| `([a-z_][a-z0-9_]*)` \|", line)
        if match:
            rows.setdefault(match.group(1), []).append(line)
    return rows


def as_markdown_cell(text: str) -> str:
    # Pipes would end the cell; "<word ...>" would be read as an HTML tag.
    return text.replace("|", "\\|").replace("<", "&lt;")


@pytest.mark.parametrize("name", list(CONFIG_CLASSES))
def test_every_config_field_appears_in_the_reference_with_its_help_text(name):
    cls = CONFIG_CLASSES[name]
    rows = table_rows(REFERENCE.read_text(encoding="utf-8"))
    helps = cls.field_help()
    assert list(helps) == [f.name for f in fields(cls)]
    missing = [f for f, text in helps.items() if not any(as_markdown_cell(text) in row for row in rows.get(f, []))]
    assert missing == [], f"{name}: fields without their help text in docs/config_reference.md: {missing}"


def test_reference_marks_our_keyword_only_fields_and_only_those():
    rows = table_rows(REFERENCE.read_text(encoding="utf-8"))
    for cls in CONFIG_CLASSES.values():
        for f in fields(cls):
            marked = [" | comlrl-lab | " in row for row in rows[f.name]]
            assert all(marked) if f.kw_only else not any(marked), f"{cls.__name__}.{f.name}"
    assert "CoMLRL, [differs]" in rows["reward_model_device"][0]


def test_reference_is_up_to_date_with_its_generator():
    generator = load_script("gen_config_reference")
    assert REFERENCE.read_text(encoding="utf-8") == generator.render(), (
        "docs/config_reference.md is out of date: run python scripts/gen_config_reference.py"
    )


def test_metrics_reference_is_up_to_date_with_metric_names():
    generator = load_script("gen_metrics_reference")
    assert (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8") == generator.render(), (
        "docs/metrics.md is out of date: run python scripts/gen_metrics_reference.py"
    )


def test_readme_commands_are_the_ones_ci_runs():
    readme = README.read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for command in ("bash scripts/setup.sh", "streamlit run app.py", 'python -m pytest -q -m "not benchmark"'):
        assert command in readme
    assert "bash scripts/setup.sh" in ci and 'python -m pytest -q -m "not benchmark"' in ci
    for check in ("ruff check .", "ruff format --check .", "lint-imports", "vulture"):
        assert f"\n{check}\n" in ci and f"`{check}`" in readme
    for benchmark in ("collection", "madpo_round", "store", "api_concurrency", "vs_comlrl"):
        assert f"python benchmarks/{benchmark}.py" in readme
        assert (ROOT / "benchmarks" / f"{benchmark}.py").is_file()


@pytest.mark.parametrize("doc", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_local_links_point_at_files_inside_the_repository(doc):
    # A link into a checkout next to ours (../shared/...) works on the author's machine and nowhere else.
    text = doc.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(target)
    assert broken == [], f"{doc.name}: links that do not resolve to a file in the repository: {broken}"


def test_readme_names_real_device_fields_and_cli_commands():
    readme = README.read_text(encoding="utf-8")
    all_fields = {f.name for cls in CONFIG_CLASSES.values() for f in fields(cls)}
    for name in ("agent_devices", "comparator_devices", "reference_devices", "reward_model_device", "critic_devices"):
        assert f"`{name}`" in readme and name in all_fields
    from comlrl_lab.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # run, export, import
    for command in re.findall(r"^comlrl-lab (\w+)", readme, flags=re.M):
        assert command in commands


def test_beyond_one_machine_section_matches_the_code():
    """A tripwire: once torchrun runs are wired into the trainers and tested, docs/cluster.md must say how to start one."""
    cluster = (ROOT / "docs" / "cluster.md").read_text(encoding="utf-8")
    section = cluster.split("## Beyond one machine", 1)[1].split("\n## ", 1)[0]
    users = [
        ROOT / "comlrl_lab" / "cli.py",
        *(ROOT / "comlrl_lab" / "engine").glob("*.py"),
        *(ROOT / "comlrl_lab" / "trainers" / "preference").glob("[bm]*.py"),  # base, madpo, marlhf
    ]
    wired = any("DistContext" in p.read_text(encoding="utf-8") for p in users)
    tested = any((ROOT / "tests").glob("test_distributed*.py"))
    available = wired and tested
    assert ("not available yet" in section) != available, "update the 'Beyond one machine' section of docs/cluster.md"
    if available:
        assert "torchrun" in section


def test_example_spec_file_is_a_valid_experiment():
    from comlrl_lab.engine import ExperimentSpec
    from comlrl_lab.engine.spec import resolve_task

    spec = ExperimentSpec.load(ROOT / "examples" / "madpo_iter_tiny.yaml")
    config = spec.build_config()
    assert spec.algorithm == "MADPOIter" and config.preference_replay_mode == "lambda_decay"
    assert len(resolve_task(spec).train_items()) >= spec.max_train_items


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_spec_is_a_valid_experiment(path):
    from comlrl_lab.engine import ExperimentSpec
    from comlrl_lab.engine.spec import resolve_task

    spec = ExperimentSpec.load(path)  # reads and validates: a mistake is a SpecError naming file, line and field
    spec.build_config()
    task = resolve_task(spec)
    assert len(task.train_items()) >= (spec.max_train_items or 1)


@pytest.mark.slow
def test_readme_python_example_runs(tmp_path, monkeypatch):
    import torch

    if not (ROOT / "comlrl_lab" / "models" / "tiny" / "config.json").is_file():
        pytest.fail("the embedded tiny model is missing: python scripts/train_tiny_lm.py")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    example = blocks[0]
    assert "from comlrl_lab.trainers.preference import" in example and "trainer.train()" in example
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model gains nothing from more; a shared CPU loses a lot (test_notebooks.py)
    try:
        exec(compile(example, "README.md", "exec"), {"__name__": "readme_example"})
    finally:
        torch.set_num_threads(threads)
    round_files = sorted(p.name for p in tmp_path.glob("runs/*/preference_replay/iteration_*.json"))
    assert round_files == ["iteration_0001.json", "iteration_0002.json", "iteration_0003.json"]
    assert (tmp_path / "out" / "madpo_iter" / "agent_1" / "config.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MADPOTrainer", "MADPOIterTrainer", "MARLHFTrainer", "MARLHFIterTrainer"])
def test_trainer_docstring_example_runs(name, tmp_path, monkeypatch):
    import doctest
    import tempfile

    import torch

    from comlrl_lab.trainers import preference

    trainer_class = getattr(preference, name)
    tests = doctest.DocTestFinder(recurse=False).find(trainer_class, name, globs={})
    assert len(tests) == 1 and len(tests[0].examples) > 5, f"{name} has no usage example in its docstring"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the example's output_dir=tempfile.mkdtemp()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(tests[0])
    finally:
        torch.set_num_threads(threads)
    assert result.failed == 0
