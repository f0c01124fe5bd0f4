"""One source for the vocabulary: the allowed values and aliases of the config fields live in their metadata.

Validation, the API client, the Setup form and docs/config_reference.md must all read ``metadata["choices"]``,
``["aliases"]``; these tests fail when one of them lists values of its own. The comparator_api_format cases pin
aliases resolving case-insensitively, and (unlike CoMLRL) any other name failing with a did-you-mean hint.
"""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from comlrl_lab.trainers.preference.comparators.api import ApiComparatorSettings, normalize_api_format
from comlrl_lab.trainers.preference.config import (
    CONFIG_CLASSES,
    MADPOIterConfig,
    field_aliases,
    field_choices,
    field_multi_choices,
    resolve_choice,
)

ROOT = Path(__file__).resolve().parents[1]
# Extra values some fields need before a choice is valid (comparator_policy="model" needs a model).
NEEDS = {
    ("comparator_policy", "model"): {"comparator_model_name": "m"},
    ("comparator_policy", "api"): {"comparator_api_url": "http://localhost/x"},
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
    unchecked = f.metadata.get("checked") is False
    for choice in choices:
        config = _build(cls, f.name, choice, choice)
        # MARLHF configs overwrite the unchecked advantage_mode from rl_algorithm, so only acceptance is checked.
        assert unchecked or getattr(config, f.name) == choice
    unknown = "no-such-" + f.name
    if unchecked:
        cls(**{f.name: unknown})
    else:
        with pytest.raises(ValueError, match=rf"^{f.name} "):
            cls(**{f.name: unknown})


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
        with pytest.raises(ValueError) as error:
            MADPOIterConfig(**{name: "bogus"})
        assert str(error.value) == message


# -- the API client agrees with the config (the 'antropic' drift) --------------------------------------------


def _api_format_spellings():
    cls = MADPOIterConfig
    spellings = list(field_choices(cls, "comparator_api_format")) + list(field_aliases(cls, "comparator_api_format"))
    return spellings + ["antropic", "anthropic-messages", "OpenAI ", "", "something-else"]


def _outcome(make):
    try:
        return make()
    except ValueError as error:
        return ("error", str(error))


@pytest.mark.parametrize("spelling", _api_format_spellings())
def test_api_client_and_config_agree_on_every_format_spelling(spelling):
    from_config = _outcome(lambda: MADPOIterConfig(comparator_api_format=spelling).comparator_api_format)
    assert _outcome(lambda: normalize_api_format(spelling)) == from_config
    settings = _outcome(lambda: ApiComparatorSettings(url="http://localhost/x", api_format=spelling).api_format)
    assert settings == from_config


def test_unknown_api_format_lists_the_table_and_suggests_the_closest():
    # Differs from CoMLRL, which sends any unknown name as generic.
    with pytest.raises(ValueError) as error:
        MADPOIterConfig(comparator_api_format="antropic")
    assert str(error.value) == (
        "comparator_api_format 'antropic' is not one of: generic, openai, anthropic, openai_responses "
        "(aliases: openai_chat, chat, anthropic_messages, messages, responses, codex); did you mean 'anthropic'?"
    )
    with pytest.raises(ValueError, match=r"did you mean 'anthropic_messages'\?$"):
        normalize_api_format("anthropic-messages")
    with pytest.raises(ValueError, match=r"\(aliases: [a-z_, ]+\)\.$"):
        normalize_api_format("something-else")  # nothing close: no suggestion
    assert normalize_api_format(None) == "generic"


# -- the Setup form and the docs derive from the metadata ----------------------------------------------------


@pytest.mark.parametrize("algorithm", list(CONFIG_CLASSES))
def test_setup_form_options_are_the_metadata_choices(algorithm):
    from comlrl_lab.ui import forms

    cls = CONFIG_CLASSES[algorithm]
    for name, spec in forms.field_specs(cls).items():
        multi = field_multi_choices(cls, name)
        assert spec.choices == (field_choices(cls, name) or multi), name
        assert spec.kind == ("multichoice" if multi else "choice" if spec.choices else spec.kind), name
        assert (spec.kind in ("choice", "multichoice")) == bool(spec.choices), name
        assert spec.group == cls.__dataclass_fields__[name].metadata["group"]
        for alias, canonical in field_aliases(cls, name).items():
            assert forms.canonical_choice(spec, alias) == canonical


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


# -- no module keeps a list of its own -----------------------------------------------------------------------

SCANNED = [
    "comlrl_lab/trainers/preference/config.py",
    "comlrl_lab/trainers/preference/comparators/api.py",
    "comlrl_lab/ui/forms.py",
    "comlrl_lab/trainers/preference/replay.py",
    "scripts/gen_config_reference.py",
]


def _vocabularies() -> list[tuple[set[str], set[str]]]:
    """Every choice field's (canonical values, aliases)."""
    out = []
    for cls in CONFIG_CLASSES.values():
        for f in fields(cls):
            if "choices" in f.metadata:
                out.append((set(field_choices(cls, f.name)), set(field_aliases(cls, f.name))))
    return out


def _metadata_dicts(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``field(..., metadata={...})``: the one place values may be listed."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "field":
            for keyword in node.keywords:
                if keyword.arg == "metadata":
                    inside.update(id(n) for n in ast.walk(keyword.value))
    return inside


def _own_lists(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    allowed = _metadata_dicts(tree)
    vocabularies = _vocabularies()
    found = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        elif isinstance(node, ast.Dict):
            values = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            values += [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        else:
            continue
        # A list of allowed values: names of one field only, and either all its choices or some of its aliases.
        # A table keyed by a few of the choices (dispatch on the format, say) is behaviour, not a list.
        names = set(values)
        if len(names) >= 2 and any(
            names <= choices | aliases and (names >= choices or names & aliases) for choices, aliases in vocabularies
        ):
            found.append(f"{path.name}:{node.lineno}: {sorted(set(values))}")
    return found


@pytest.mark.parametrize("relative", SCANNED)
def test_no_module_lists_allowed_values_outside_the_metadata(relative):
    assert _own_lists(ROOT / relative) == []


def test_the_scan_finds_a_list_of_its_own(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        'CRITICS = ["v", "q"]\n'
        'FORMAT_ALIASES = {"chat": "openai", "codex": "openai_responses"}\n'
        'ONE_PER_REQUEST = ("anthropic", "openai_responses")\n'
        'UNRELATED = ("chat", "completions")\n'
    )
    assert [line.split(":")[1] for line in _own_lists(sneaky)] == ["1", "2"]


# -- algorithm names: one table ------------------------------------------------------------------------------


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
    for path in [*(ROOT / "comlrl_lab").rglob("*.py"), *(ROOT / "app_pages").rglob("*.py"), ROOT / "app.py"]:
        text = path.read_text(encoding="utf-8")
        for needle in ('endswith("Iter")', "'Iter' if", '"Iter" if', 'startswith("MARLHF")', 'startswith("MADPO")'):
            if needle in text:
                offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert offenders == []
