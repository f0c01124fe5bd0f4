"""The house's single-source rules, checked over the whole code: each thing is defined in one place.

- The vocabulary: a choice field's allowed values, aliases and notes live in its metadata; validation, the codec,
  the Setup form and the docs read them; one dispatch table per field that needs behaviour per value.
- The config is the only validator: no module below it refuses a config value again, and its messages are spelled
  in config.py only. Every text entry point reads a value through the one field codec.
- A replay mode is its metadata plus one entry in ``replay.REPLAY_MODES``: no other place names one.
- Names: algorithm names in one table, run ids from one module, export formats in the store's table, the store's
  run id read by the store only, the phase order in one module, session-state keys in ``ui/state.py``.

Each scan has a test that it finds what it looks for in a file written to fool it, so a scan that silently matches
nothing fails. To add a rule, add its scan, its known-answer test and a line above.
"""

from __future__ import annotations

import ast
import re
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from comlrl_lab.data.records import Side
from comlrl_lab.names.run_ids import new_run_id, random_hex, safe_stem
from comlrl_lab.trainers.preference.config import (
    CONFIG_CLASSES,
    ConfigError,
    MADPOIterConfig,
    field_aliases,
    field_choices,
    field_multi_choices,
    resolve_choice,
)
from comlrl_lab.trainers.preference.config import fields as field_codec
from comlrl_lab.ui import state

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "comlrl_lab"
CONFIG_PACKAGE = PACKAGE / "trainers" / "preference" / "config"
#: The product: the package, the pages and the app (not tests, benchmarks or scripts).
PRODUCT = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "pages").glob("*.py"), ROOT / "app.py"])


def _modules(*, skip: tuple[str, ...] = ()) -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).as_posix() not in skip]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def _metadata_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``field(..., metadata={...})``: the one place a field's values may be listed."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "field":
            for keyword in node.keywords:
                if keyword.arg == "metadata":
                    inside.update(id(n) for n in ast.walk(keyword.value))
    return inside


# -- the vocabulary of choice fields --------------------------------------------------------------------------

# Extra values some fields need before a choice is valid (comparator_policy="model" needs a model).
NEEDS = {
    ("comparator_policy", "model"): {"comparator_model_name": "m"},
    ("comparator_policy", "api"): {"comparator_api_url": "http://localhost/x"},
    ("preference_source", "judge"): {"judge_api_url": "http://localhost/x"},
    ("pair_selection", "all"): {"preference_pairs_per_sample": None},
    ("preference_replay_mode", "nearest_k"): {"preference_replay_k": 2},
    ("preference_replay_mode", "lambda_decay"): {"preference_replay_lambda": 0.5},
    ("parallel_training", "mp"): {"agent_devices": "cpu"},
    ("collaboration_mode", "centralized"): {"num_agents": 1},
}


def _choice_fields():
    for cls_name, cls in CONFIG_CLASSES.items():
        for f in fields(cls):
            if "choices" in f.metadata:
                yield pytest.param(cls, f, id=f"{cls_name}.{f.name}")


def _build(cls, name, value, canonical):
    return cls(**{name: value, **NEEDS.get((name, canonical), {})})


def test_every_field_has_help_and_a_group():
    for cls in CONFIG_CLASSES.values():
        for f in fields(cls):
            assert f.metadata.get("help") and f.metadata.get("group"), f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize(("cls", "f"), list(_choice_fields()))
def test_validation_accepts_exactly_the_metadata_choices(cls, f):
    choices = field_choices(cls, f.name)
    assert choices and len(set(choices)) == len(choices)
    assert f.default in choices, "the default must be one of the choices"
    assert set(f.metadata.get("choice_help", {})) <= set(choices)
    unchecked = f.metadata.get("checked") is False
    for choice in choices:
        config = _build(cls, f.name, choice, choice)
        # MARLHF configs overwrite the unchecked advantage_mode from rl_algorithm, so only acceptance is checked.
        assert unchecked or getattr(config, f.name) == choice
    unknown = "no-such-" + f.name
    if unchecked:
        cls(**{f.name: unknown})
    else:
        with pytest.raises(ConfigError, match=rf"^{f.name} ") as error:
            cls(**{f.name: unknown})
        assert error.value.field == f.name and error.value.value == unknown


@pytest.mark.parametrize(("cls", "f"), list(_choice_fields()))
def test_aliases_map_to_canonical_values(cls, f):
    for alias, canonical in field_aliases(cls, f.name).items():
        assert canonical in field_choices(cls, f.name)
        assert alias not in field_choices(cls, f.name), "a canonical name is not its own alias"
        for spelling in {alias, f" {alias.upper()} "}:
            assert resolve_choice(cls, f.name, spelling) == canonical
            if f.metadata.get("checked") is not False:
                assert getattr(_build(cls, f.name, spelling, canonical), f.name) == canonical


def test_rejection_messages_list_the_metadata_choices():
    # CoMLRL's wording, with the list of names taken from the metadata.
    cases = {
        "pair_selection": "pair_selection must be one of: reward_gap, all, random, comparator_reward.",
        "comparator_policy": "comparator_policy must be one of: current, current_copy, model, history, api.",
        "preference_replay_mode": "preference_replay_mode must be one of: current, nearest_k, all_history, lambda_decay.",
        "comparator_generation_mode": "comparator_generation_mode must be one of: decentralized, centralized.",
        "collaboration_mode": "collaboration_mode must be decentralized or centralized.",
        "parallel_training": "parallel_training only supports: none, mp.",
    }
    for name, message in cases.items():
        with pytest.raises(ConfigError) as error:
            MADPOIterConfig(**{name: "bogus"})
        assert str(error.value) == message


def test_unknown_api_format_lists_the_table_and_suggests_the_closest():
    # Differs from CoMLRL, which sends any unknown name as generic.
    with pytest.raises(ConfigError) as error:
        MADPOIterConfig(comparator_api_format="antropic")
    assert str(error.value) == (
        "comparator_api_format 'antropic' is not one of: generic, openai, anthropic, openai_responses "
        "(aliases: openai_chat, chat, anthropic_messages, messages, responses, codex); did you mean 'anthropic'?"
    )
    assert error.value.suggestion == "anthropic"
    with pytest.raises(ConfigError, match=r"did you mean 'anthropic_messages'\?$"):
        MADPOIterConfig(comparator_api_format="anthropic-messages")
    with pytest.raises(ConfigError, match=r"\(aliases: [a-z_, ]+\)\.$") as error:
        MADPOIterConfig(comparator_api_format="something-else")  # nothing close: no suggestion
    assert error.value.suggestion is None


@pytest.mark.parametrize("algorithm", list(CONFIG_CLASSES))
def test_the_field_specs_and_the_codec_read_the_metadata_choices(algorithm):
    cls = CONFIG_CLASSES[algorithm]
    for name, spec in field_codec.field_specs(cls).items():
        multi = field_multi_choices(cls, name)
        assert spec.choices == (field_choices(cls, name) or multi), name
        expected = "multichoice" if multi else "choice" if field_choices(cls, name) else spec.kind
        assert spec.kind == expected, name
        assert spec.group == cls.__dataclass_fields__[name].metadata["group"]
        for alias, canonical in field_aliases(cls, name).items():
            assert field_codec.decode(spec, alias) == canonical


def test_setup_form_groups_come_from_the_metadata():
    from comlrl_lab.ui import forms

    groups = {f.name: f.metadata["group"] for cls in CONFIG_CLASSES.values() for f in fields(cls)}
    for group, names in [
        ("Essentials", forms.ESSENTIALS),
        ("Comparator", forms.COMPARATOR_FIELDS),
        ("API comparator", forms.API_FIELDS),
        ("Replay buffer", forms.REPLAY_FIELDS),
    ]:
        assert set(names) == {n for n, g in groups.items() if g == group}
    for algorithm, cls in CONFIG_CLASSES.items():
        for title, _, names in forms.grouped_fields(algorithm):
            assert all(cls.__dataclass_fields__[n].metadata["group"] == title for n in names)


def test_docs_show_the_metadata_choices():
    text = (ROOT / "docs" / "config_reference.md").read_text(encoding="utf-8")
    for cls in CONFIG_CLASSES.values():
        for f in fields(cls):
            choices = field_choices(cls, f.name)
            if choices:
                assert "Choices: " + ", ".join(f"`{c}`" for c in choices) + "." in text, f.name


#: Other vocabularies that share words with choice fields: not lists of a field's allowed values.
OTHER_VOCABULARIES = {
    "a pair's winner side (data.records.Side)": set(typing.get_args(Side)),
    "the codec's spellings of None": {"", "none", "null"},
}


def _vocabularies() -> list[tuple[set[str], set[str]]]:
    """Every choice field's (canonical values, aliases)."""
    out = []
    for cls in CONFIG_CLASSES.values():
        for f in fields(cls):
            if "choices" in f.metadata:
                out.append((set(field_choices(cls, f.name)), set(field_aliases(cls, f.name))))
    return out


def _strings(nodes) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _is_dispatch(node: ast.Dict) -> bool:
    """A table from values to behaviour (classes, functions, objects built per value), not a list of values."""
    return bool(node.values) and not any(isinstance(v, ast.Constant) for v in node.values)


def _own_lists(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    allowed = _metadata_nodes(tree)
    vocabularies = _vocabularies()
    found = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            candidates = [set(_strings(node.elts))]
        elif isinstance(node, ast.Dict) and not _is_dispatch(node):
            # Its keys alone (notes per choice), or keys and values together (an alias table).
            candidates = [set(_strings(node.keys)), set(_strings(node.keys) + _strings(node.values))]
        else:
            continue
        # A list of allowed values: names of one field only, and either all its choices or some of its aliases.
        # A table keyed by a few of the choices (behaviour for some formats, say) is not a list of them.
        for names in candidates:
            if len(names) < 2 or any(names <= other for other in OTHER_VOCABULARIES.values()):
                continue
            if any(
                names <= choices | aliases and (names >= choices or names & aliases)
                for choices, aliases in vocabularies
            ):
                found.append(f"{path.name}:{node.lineno}: {sorted(names)}")
                break
    return found


@pytest.mark.parametrize("path", [*PRODUCT, ROOT / "scripts" / "gen_config_reference.py"], ids=_rel)
def test_no_module_lists_allowed_values_outside_the_metadata(path):
    assert _own_lists(path) == []


def test_the_scan_finds_a_list_of_its_own(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        'CRITICS = ["v", "q"]\n'
        'FORMAT_ALIASES = {"chat": "openai", "codex": "openai_responses"}\n'
        'NOTES = {"current": "this round", "nearest_k": "k rounds", "all_history": "all", "lambda_decay": "decay"}\n'
        'ONE_PER_REQUEST = ("anthropic", "openai_responses")\n'
        'UNRELATED = ("chat", "completions")\n'
        'DISPATCH = {"v": value_critic, "q": q_critic}\n'
        'SIDES = ("current", "comparator")\n'
    )
    assert [line.split(":")[1] for line in _own_lists(sneaky)] == ["1", "2", "3"]


def test_every_dispatch_table_has_one_entry_per_choice():
    from comlrl_lab.trainers.preference.comparators import COMPARATORS
    from comlrl_lab.trainers.preference.learning.policy_learning import RL_BACKENDS
    from comlrl_lab.trainers.preference.rounds.replay import REPLAY_MODES

    for table, name in ((REPLAY_MODES, "preference_replay_mode"), (COMPARATORS, "comparator_policy")):
        assert list(table) == list(field_choices(MADPOIterConfig, name))
    assert set(RL_BACKENDS) == set(field_choices(CONFIG_CLASSES["MARLHF"], "rl_algorithm"))


# -- a replay mode: metadata plus one dispatch entry ----------------------------------------------------------

REPLAY_MODE_NAMES = set(field_choices(MADPOIterConfig, "preference_replay_mode"))
#: "current" is also a comparator policy and a winner side, so the places scan looks for the other modes (the
#: dispatch table holds all four: ``test_every_dispatch_table_has_one_entry_per_choice``).
SCANNED_MODE_NAMES = REPLAY_MODE_NAMES - {"current"}


def _places_naming(path: Path, names: set[str]) -> list[str]:
    """Where ``path`` enumerates or dispatches on one of ``names`` outside field metadata: as a dict key, an item of
    a tuple, list or set, or a side of a comparison. A name given as a value (a preset's chosen mode) is a use."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _metadata_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Dict):
            places = node.keys
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            places = node.elts
        elif isinstance(node, ast.Compare):
            places = [node.left, *node.comparators]
        else:
            continue
        found += [f"{_rel(path)}:{node.lineno}: {name}" for name in _strings(places) if name in names]
    return found


def test_a_replay_mode_is_named_in_the_metadata_and_one_dispatch_entry_only():
    from comlrl_lab.trainers.preference.rounds import replay

    places = [place for path in PRODUCT for place in _places_naming(path, SCANNED_MODE_NAMES)]
    table = ast.parse(Path(replay.__file__).read_text(encoding="utf-8"))
    line = next(n.lineno for n in ast.walk(table) if isinstance(n, ast.AnnAssign) and n.target.id == "REPLAY_MODES")
    # The dispatch table's keys, and nothing else: validation, the form, the Replay page and the docs derive the rest.
    assert sorted(places) == sorted(
        f"comlrl_lab/trainers/preference/rounds/replay.py:{line}: {mode}" for mode in SCANNED_MODE_NAMES
    )


def test_the_replay_mode_scan_finds_a_place_of_its_own(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        'LABELS = {"nearest_k": "k"}\n'
        'if mode == "lambda_decay": pass\n'
        'DRAWS = ("all_history",)\n'
        'PRESET = {"preference_replay_mode": "lambda_decay"}\n'
        'x = field(metadata={"applies_when": {"preference_replay_mode": ("nearest_k",)}})\n'
    )
    assert [p.split(":")[1] for p in _places_naming(sneaky, SCANNED_MODE_NAMES)] == ["1", "2", "3"]


def test_the_fields_of_a_mode_come_from_the_metadata():
    from comlrl_lab.trainers.preference.rounds.replay import REPLAY_FIELDS

    specs = field_codec.field_specs(MADPOIterConfig)
    assert REPLAY_FIELDS[0] == "preference_replay_mode"
    for name in REPLAY_FIELDS[1:]:
        assert set(specs[name].applies_when["preference_replay_mode"]) <= REPLAY_MODE_NAMES, name
    assert set(specs["preference_replay_mode"].choice_help) == REPLAY_MODE_NAMES


# -- the config is the only validator ------------------------------------------------------------------------

CONFIG_FIELDS = sorted({f.name for cls in CONFIG_CLASSES.values() for f in fields(cls)}, key=len, reverse=True)
#: A message refusing a config value, as only config.py words them.
REFUSAL = re.compile(
    r"^(?:\{?)(" + "|".join(map(re.escape, CONFIG_FIELDS)) + r")\b[^ ]* (must|is required|is only valid|only supports)"
)

#: Checks below the config that name a config field and stay, each for a reason the config cannot see.
RUNTIME_CHECKS = {
    "comlrl_lab/trainers/preference/learning/losses.py": "a NaN loss, and CoMLRL's unchecked advantage_mode",
    "comlrl_lab/trainers/preference/base.py": "joint_mode checked again as training starts (trainer owner)",
    "comlrl_lab/trainers/preference/marlhf.py": "model objects without a name (constructor arguments)",
    "comlrl_lab/trainers/preference/learning/policy_learning.py": "critic sources from constructor arguments",
    "comlrl_lab/trainers/preference/comparators/local.py": "comparator_agents given to the trainer's constructor",
    "comlrl_lab/trainers/preference/rounds/replay.py": "a replay directory on disk",
    "comlrl_lab/trainers/preference/rounds/judge.py": "the judge's API key variable unset in the environment",
    "comlrl_lab/trainers/preference/runtime/tracking.py": "a tracker package not installed",
    "comlrl_lab/data/formatters.py": "formatters given to the trainer's constructor",
    "comlrl_lab/data/user_tasks.py": "a user task module's NUM_AGENTS",
    "comlrl_lab/models/loading.py": "agents given to the trainer's constructor",
    "comlrl_lab/models/generation.py": "SamplingSettings, the models layer's own API (it cannot import the config)",
    "comlrl_lab/models/chat.py": "use_chat_template='true' with a tokenizer that has no chat template",
    "comlrl_lab/models/cpu_matmul.py": "cpu_matmul='onednn' with a torch built without oneDNN",
    "comlrl_lab/trainers/preference/comparators/api.py": "an API key missing from the environment",
    "comlrl_lab/engine/sweep.py": "the grid: seed is swept with --seeds",
    "comlrl_lab/engine/preflight.py": "comparator_model_name's files on this machine, deleted or damaged",
}


def _refusals(path: Path) -> list[str]:
    """``raise`` statements of ``path`` whose message names a config field, and refusal messages it spells."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            text = " ".join(_strings(ast.walk(node.exc)))
            if any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", text) for n in CONFIG_FIELDS):
                found.append(f"{_rel(path)}:{node.lineno}: raise")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and REFUSAL.match(node.value):
            found.append(f"{_rel(path)}:{node.lineno}: {node.value[:60]!r}")
    return found


@pytest.mark.parametrize(
    "path", [p for p in PRODUCT if CONFIG_PACKAGE not in p.parents and _rel(p) not in RUNTIME_CHECKS], ids=_rel
)
def test_no_module_below_the_config_checks_a_config_value_again(path):
    assert _refusals(path) == []


def test_the_runtime_checks_listed_are_still_there():
    # An entry whose check has gone must leave the list, so the list never hides a new re-check.
    assert [rel for rel in RUNTIME_CHECKS if not _refusals(ROOT / rel)] == []


def test_the_refusal_scan_finds_a_check_of_its_own(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        'if lam > 1:\n    raise ValueError("preference_replay_lambda out of range")\n'
        "REQUIRED = \"preference_replay_k is required when preference_replay_mode='nearest_k'.\"\n"
        'OK = "the lambda_decay weights"\n'
        'if x:\n    raise RuntimeError("no completions")\n'
    )
    assert [line.split(":")[1] for line in _refusals(sneaky)] == ["2", "3"]


CODEC_CASES = [
    ("agent_learning_rate", "1e-3", 0.001),
    ("num_train_epochs", "3", 3),
    ("score_final_token", "false", False),
    ("preference_replay_mode", "lambda", "lambda_decay"),
    ("preference_replay_k", "none", None),
    ("adamw_implementation", "loop", "for_loop"),
]


@pytest.mark.parametrize(("name", "text", "value"), CODEC_CASES)
def test_every_text_entry_point_reads_a_value_as_the_codec_does(name, text, value, tmp_path):
    from repo_scripts import load_repo_script

    from comlrl_lab.engine import ExperimentSpec
    from comlrl_lab.engine.sweep import parse_grid
    from comlrl_lab.ui import draft

    spec = field_codec.field_specs(MADPOIterConfig)[name]
    assert field_codec.decode(spec, text) == value
    assert parse_grid(MADPOIterConfig, [f"{name}={text}"]) == {name: [value]}  # comlrl-lab sweep --grid
    assert field_codec.parse_assignment(MADPOIterConfig, f"{name}={text}") == (name, value)  # run --set
    benchmark = load_repo_script("benchmarks/field_args.py", "field_args_for_architecture")
    assert benchmark.field_arg(MADPOIterConfig)(f"{name}={text}") == (name, value)  # learning.py --set
    read = ExperimentSpec.from_dict({"algorithm": "MADPOIter", "config": {name: text}})  # a spec file's text
    assert read.config[name] == value
    assert draft.widget_value(spec, text) == draft.forms.to_widget(spec, value)  # the URL draft


# -- names defined once --------------------------------------------------------------------------------------


def test_algorithm_table_agrees_with_configs_and_trainers():
    from comlrl_lab.engine import ALGORITHMS
    from comlrl_lab.trainers import preference
    from comlrl_lab.trainers.preference.algorithms import ALGORITHM_TABLE, algorithm_name

    assert {name: row.config_class for name, row in ALGORITHM_TABLE.items()} == CONFIG_CLASSES
    for name, row in ALGORITHM_TABLE.items():
        trainer = getattr(preference, row.trainer_class_name)
        assert trainer.algorithm_name == name and ALGORITHMS[name] == (row.config_class, trainer)
        assert algorithm_name(row.family, row.iterative) == name
        assert row.iterative == hasattr(row.config_class(), "num_iterations")


def test_no_module_parses_algorithm_names():
    offenders = []
    for path in PRODUCT:
        text = path.read_text(encoding="utf-8")
        for needle in ('endswith("Iter")', "'Iter' if", '"Iter" if', 'startswith("MARLHF")', 'startswith("MADPO")'):
            if needle in text:
                offenders.append(f"{_rel(path)}: {needle}")
    assert offenders == []


STAMP = r"\d{8}-\d{6}"


def test_run_id_formats():
    assert re.fullmatch(rf"MADPOIter-{STAMP}-[0-9a-f]{{4}}", new_run_id("MADPOIter"))
    assert re.fullmatch(rf"{STAMP}-[0-9a-f]{{6}}", new_run_id(digits=6))
    assert re.fullmatch(
        rf"import-preference_replay-{STAMP}-[0-9a-f]{{4}}", new_run_id("preference_replay", prefix="import")
    )
    assert re.fullmatch(rf"import-pairs-{STAMP}-[0-9a-f]{{4}}", new_run_id("?!", prefix="import", fallback="pairs"))
    assert re.fullmatch(r"[0-9a-f]{12}", random_hex(12))


def test_a_stem_is_one_safe_path_component():
    assert safe_stem("my run / v2", "run") == "my-run-v2"
    assert safe_stem("..hidden.", "run") == "hidden"
    assert safe_stem("", "run") == safe_stem(None, "run") == "run"
    assert safe_stem("pairs-r0001-current", "run") == "pairs-r0001-current"


def _makes_ids(path: Path) -> list[str]:
    """Lines that import uuid or format a time stamp: the ways a second run-id maker starts."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name == "uuid" for a in node.names):
            found.append(f"{path.name}:{node.lineno}: import uuid")
        elif isinstance(node, ast.ImportFrom) and node.module == "uuid":
            found.append(f"{path.name}:{node.lineno}: from uuid import")
        elif isinstance(node, ast.Attribute) and node.attr == "strftime":
            found.append(f"{path.name}:{node.lineno}: strftime")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "%Y%m%d" in node.value:
            found.append(f"{path.name}:{node.lineno}: stamp format")
    return found


def test_only_the_run_id_module_makes_ids():
    offenders = [hit for path in _modules(skip=("names/run_ids.py",)) for hit in _makes_ids(path)]
    assert offenders == []


def test_the_id_scan_finds_a_maker_of_its_own(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text('import time\nimport uuid\nrun_id = time.strftime("%Y%m%d") + uuid.uuid4().hex\n')
    assert len(_makes_ids(sneaky)) == 3


def test_cli_and_workbench_offer_the_store_table():
    from comlrl_lab import cli
    from comlrl_lab.store.formats import EXPORT_FORMATS, FOLDER_FORMATS, PAIR_FORMATS, ROUND_FILES, TRL_FILES
    from comlrl_lab.ui import services

    assert services.EXPORT_FORMATS is EXPORT_FORMATS and services.ROUND_FILES == ROUND_FILES
    assert FOLDER_FORMATS == (ROUND_FILES, TRL_FILES)
    parser = cli.build_parser()
    for name in EXPORT_FORMATS:
        assert parser.parse_args(["export", "run", "--dest", "out", "--format", name]).format == name
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "run", "--dest", "out", "--format", "xml"])
    assert [*PAIR_FORMATS, *FOLDER_FORMATS] == list(EXPORT_FORMATS)
    assert all(spec.suffix.startswith(".") and spec.label and spec.mime for spec in EXPORT_FORMATS.values())


def _lists_export_formats(path: Path) -> list[str]:
    """Literal collections naming export formats, and the table's labels written out again.

    Readers of data and of imports take json, jsonl and csv too, so a list counts only when it names a format
    nothing but an export writes (parquet, rounds, trl).
    """
    from comlrl_lab.store.formats import EXPORT_FORMATS

    export_only = {"parquet", "rounds", "trl"}
    labels = {spec.label for spec in EXPORT_FORMATS.values()}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            elts = node.keys if isinstance(node, ast.Dict) else node.elts
            names = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in EXPORT_FORMATS}
            if len(names) >= 2 and names & export_only:
                found.append(f"{path.name}:{node.lineno}: {sorted(names)}")
        elif isinstance(node, ast.Constant) and node.value in labels:
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_lists_export_formats_outside_the_table():
    paths = [p for p in PRODUCT if _rel(p) != "comlrl_lab/store/formats.py"]
    assert [hit for path in paths for hit in _lists_export_formats(path)] == []


def test_the_format_scan_finds_a_table_of_its_own(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        'FORMATS = ("json", "jsonl", "parquet", "csv", "rounds")\n'
        'LABELS = {"csv": "CSV (records + provenance)"}\n'
        'UPLOADS = ["jsonl", "json", "csv"]\n'
    )
    assert [line.split(":")[1] for line in _lists_export_formats(sneaky)] == ["1", "2"]


def test_first_run_id_is_the_oldest_run(tmp_path):
    from comlrl_lab.store import RunStore

    with RunStore(tmp_path / "store" / "run.duckdb") as store:
        assert store.first_run_id() is None
        store.create_run("a-first", trainer="MADPO")
        store.create_run("b-second", trainer="MADPO")
        assert store.first_run_id() == "a-first"


def test_only_the_store_reads_a_run_id_out_of_it():
    paths = [*PRODUCT, *sorted((ROOT / "tests").glob("*.py"))]
    needles = ('["run_id"].iloc', "['run_id'].iloc", "SELECT run_id FROM runs")
    offenders = [
        f"{_rel(path)}: {needle}"
        for path in paths
        if path.name not in ("queries.py", "test_architecture.py")
        for needle in needles
        if needle in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_check_next_phase():
    from comlrl_lab.engine import InvalidTransition as EngineInvalidTransition
    from comlrl_lab.names.phases import InvalidTransition, check_next_phase

    assert EngineInvalidTransition is InvalidTransition
    check_next_phase("select", 2, "select")
    with pytest.raises(InvalidTransition, match="^cannot run 'train' now: the next phase of round 2 is 'select'$"):
        check_next_phase("train", 2, "select")


def test_only_the_phase_module_checks_the_order():
    offenders = [
        path.relative_to(ROOT).as_posix()
        for path in _modules(skip=("names/phases.py",))
        if "cannot run '" in path.read_text(encoding="utf-8")
        or "class InvalidTransition" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


# -- session-state keys are named in ui/state.py -------------------------------------------------------------

STATE_FILE = ROOT / "comlrl_lab" / "ui" / "state.py"
UI_FILES = sorted([ROOT / "app.py", *(ROOT / "pages").glob("*.py"), *(ROOT / "comlrl_lab" / "ui").glob("*.py")])
KEY_PATTERN = re.compile(r"^[a-z]+(\.[A-Za-z0-9_]+)+$")  # a varying part may be a name such as MADPOIter


def _is_session_state(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "session_state"


def _spelled_out(node: ast.AST | None) -> bool:
    """A key written in place: a string literal, an f-string, or a literal glued to something else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    if isinstance(node, ast.JoinedStr):
        return True
    return isinstance(node, ast.BinOp) and (_spelled_out(node.left) or _spelled_out(node.right))


def literal_keys(source: str) -> list[tuple[int, str]]:
    """(line, code) of every key spelled out in ``source`` instead of taken from ``comlrl_lab.ui.state``.

    Looks at ``key=`` arguments, ``st.session_state[...]``, ``st.session_state.get/pop/setdefault(...)`` and
    ``... in st.session_state``.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        candidates: list[ast.AST | None] = []
        if isinstance(node, ast.Call):
            candidates += [kw.value for kw in node.keywords if kw.arg == "key"]
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in ("get", "pop", "setdefault")
                and _is_session_state(func.value)
            ):
                candidates += node.args[:1]
        elif isinstance(node, ast.Subscript) and _is_session_state(node.value):
            candidates.append(node.slice)
        elif isinstance(node, ast.Compare) and any(_is_session_state(c) for c in node.comparators):
            candidates.append(node.left)
        found += [(c.lineno, ast.unparse(c)) for c in candidates if _spelled_out(c)]
    return found


def test_the_scan_finds_every_way_of_spelling_a_key_in_place():
    source = """
st.button("Go", key="go")
st.container(key=f"box-{i}")
st.session_state["run_id"] = 1
st.session_state.get("a.b")
st.session_state.pop("x" + suffix, None)
if "seen" in st.session_state: pass
st.button("Go", key=state.SETUP_CREATE)
st.session_state[state.RUN_ID] = 1
st.session_state.get(state.agent_model_key(0))
"""
    assert [line for line, _ in literal_keys(source)] == [2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("path", [p for p in UI_FILES if p != STATE_FILE], ids=_rel)
def test_pages_and_ui_modules_take_every_key_from_ui_state(path):
    found = literal_keys(path.read_text(encoding="utf-8"))
    assert not found, f"{_rel(path)} spells keys in place; name them in comlrl_lab/ui/state.py: {found}"


def test_ui_state_keys_follow_one_convention_and_never_collide():
    keys = {name: value for name, value in vars(state).items() if name.isupper() and isinstance(value, str)}
    keys.update(
        {
            "config_field_key": state.config_field_key("MADPOIter", "dpo_beta"),
            "agent_source_key": state.agent_source_key(0),
            "agent_model_key": state.agent_model_key(0),
            "agent_footprint_key": state.agent_footprint_key(0),
            "upload_key": state.upload_key(state.SETUP_USER_TRAIN),
            "phase_button_key": state.phase_button_key("collect"),
            "learning_chart_key": state.learning_chart_key("loss"),
            "pair_agent_key": state.pair_agent_key(0),
            "pair_agent_key winner": state.pair_agent_key(0, "winner"),
        }
    )
    for filters in (state.PAIRS_FILTERS, state.EXPORT_FILTERS):
        keys[f"{filters.box} box"] = filters.box
    bad = {name: value for name, value in keys.items() if not KEY_PATTERN.match(value)}
    assert not bad, f"keys must be '<area>.<name>': {bad}"
    by_value: dict[str, list[str]] = {}
    for name, value in keys.items():
        by_value.setdefault(value, []).append(name)
    assert not {v: n for v, n in by_value.items() if len(n) > 1}, "two names for one key"


# -- the house a newcomer reads ---------------------------------------------------------------------------------


def test_no_module_of_the_package_is_longer_than_one_sitting():
    long = {_rel(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > 900}
    assert long == {}


def test_every_part_of_the_trainers_says_its_one_job_first():
    parts = sorted(p for p in (PACKAGE / "trainers" / "preference").iterdir() if (p / "__init__.py").is_file())
    assert [p.name for p in parts] == ["comparators", "config", "learning", "rounds", "runtime"]
    for part in parts:
        doc = ast.get_docstring(ast.parse((part / "__init__.py").read_text(encoding="utf-8")))
        assert doc and doc.splitlines()[0].endswith("."), part.name


def test_importing_the_package_loads_no_native_library_and_the_wheel_is_pure_python():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "def libraries():\n"
        "    return {line.split()[-1] for line in open('/proc/self/maps') if line.rstrip().endswith('.so') "
        "or '.so.' in line}\n"
        "before = libraries()\n"
        "import comlrl_lab\n"
        "print(sorted(libraries() - before))\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    out = done.stdout.split("\n")
    assert out[:2] == ["[]", "False"]
    assert not (ROOT / "setup.py").exists()
    assert not [p for p in PACKAGE.rglob("*") if p.suffix in {".c", ".cpp", ".pyx", ".so"}]
