"""The field specs and the one text <-> value codec: every field of every config class reads back what it wrote."""

from __future__ import annotations

import pytest

from comlrl_lab.trainers.preference.config import CONFIG_CLASSES, ConfigError, MADPOIterConfig, MARLHFIterConfig
from comlrl_lab.trainers.preference.config import fields as F

SAMPLES = {
    F.BOOL: [True, False],
    F.INT: [0, 1, 7, -3, 10**9],
    F.FLOAT: [0.0, 0.5, 1e-6, 3.25, -2.0, 1e12],
    F.TEXT: ["x", "a b", "org/model", " padded ", "with, comma", "[bracket"],
    F.ONE_OR_LIST: ["cpu", "all-linear", ["cpu"], ["cpu", "cuda:1"], ["a,b", "c"], []],
    F.LIST: [["m"], ["org/a", "org/b"], [], ["with, comma"], ["[x"]],
    F.JSON: [{}, {"k": "v", "n": [1, 2], "é": None}],
}


def _samples(spec: F.FieldSpec) -> list:
    values = [spec.default, *SAMPLES.get(spec.kind, [])]
    if spec.suggested is not None:
        values.append(spec.suggested)
    if spec.kind == F.CHOICE:
        values += list(spec.choices)
    if spec.kind == F.MULTICHOICE:
        values += [[c] for c in spec.choices] + [list(spec.choices[:2]), []]
    if spec.optional:
        values.append(None)
    return values


def _every_field():
    for cls_name, cls in CONFIG_CLASSES.items():
        for name, spec in F.field_specs(cls).items():
            yield pytest.param(spec, id=f"{cls_name}.{name}")


@pytest.mark.parametrize("spec", list(_every_field()))
def test_every_field_reads_back_what_it_writes(spec):
    for value in _samples(spec):
        text = F.encode(spec, value)
        assert isinstance(text, str)
        back = F.decode(spec, text)
        assert back == value and type(back) is type(value), (spec.name, value, text, back)
        assert F.encode(spec, back) == text  # and the text is stable


@pytest.mark.parametrize("spec", list(_every_field()))
def test_every_alias_and_spelling_of_a_choice_reads_as_the_canonical_value(spec):
    if spec.kind != F.CHOICE:
        return
    for choice in spec.choices:
        spellings = [choice] if spec.metadata.get("exact") else [choice, f" {choice.upper()} "]
        assert {F.decode(spec, s) for s in spellings} == {choice}
    for alias, canonical in spec.metadata.get("aliases", {}).items():
        assert F.decode(spec, alias) == canonical


def test_kinds_come_from_the_types_and_the_metadata():
    specs = F.field_specs(MARLHFIterConfig)
    kinds = {name: (spec.kind, spec.optional) for name, spec in specs.items()}
    assert kinds["score_final_token"] == (F.BOOL, False)
    assert kinds["top_k"] == (F.INT, True)
    assert kinds["preference_replay_lambda"] == (F.FLOAT, True)
    assert kinds["comparator_policy"] == (F.CHOICE, False)
    assert kinds["report_to"] == (F.MULTICHOICE, True)
    assert kinds["agent_devices"] == kinds["lora_target_modules"] == (F.ONE_OR_LIST, True)
    assert kinds["comparator_agents"] == (F.LIST, True)
    assert kinds["comparator_api_headers"] == (F.JSON, True)
    assert kinds["reward_model_name"] == (F.TEXT, True)
    assert kinds["comparator_api_key_header"] == (F.TEXT, False)


def test_text_forms_people_write():
    specs = F.field_specs(MADPOIterConfig)
    assert F.decode(specs["preference_replay_k"], "none") is None
    assert F.decode(specs["preference_replay_k"], " NULL ") is None
    assert F.decode(specs["preference_replay_k"], "") is None
    assert F.decode(specs["agent_learning_rate"], "1e-3") == 0.001
    assert F.decode(specs["score_final_token"], "Yes") is True and F.decode(specs["score_final_token"], "0") is False
    assert F.decode(specs["preference_replay_mode"], "TD-Lambda") == "lambda_decay"
    assert F.decode(specs["agent_devices"], "cpu, cuda:0") == ["cpu", "cuda:0"]
    assert F.decode(specs["agent_devices"], '["cpu"]') == ["cpu"]
    assert F.decode(specs["lora_target_modules"], "all-linear") == "all-linear"  # peft's keyword, not a list
    assert F.decode(specs["report_to"], "none") == ["none"]  # the tracker choice, not None
    assert F.decode(specs["report_to"], "") is None
    assert F.decode(specs["comparator_api_headers"], '{"X-T": "${TOKEN}"}') == {"X-T": "${TOKEN}"}
    assert F.decode(specs["advantage_mode"], "custom") == "custom"  # CoMLRL never checks it
    assert F.encode(specs["comparator_agents"], ["a", "b"]) == "a, b"
    assert F.encode(specs["agent_devices"], ["cpu"]) == '["cpu"]'


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("num_train_epochs", "two", "'two' is not an int"),
        ("score_final_token", "maybe", "'maybe' is not a bool (true or false)"),
        ("dpo_beta", "nan", "'nan' is not a finite number"),
        ("comparator_api_headers", "{bad", "'{bad' is not a JSON object (Expecting property name"),
        ("comparator_api_headers", "[1]", "'[1]' is not a JSON object"),
        ("agent_devices", "[1, 2]", "'[1, 2]' is not a JSON list of strings"),
        ("num_train_epochs", " ", "' ' is not an int"),  # None is not a value of a field that takes no None
        ("preference_replay_mode", "sometimes", "preference_replay_mode must be one of: current, nearest_k"),
        ("comparator_api_format", "antropic", "did you mean 'anthropic'?"),
        ("collaboration_mode", "Centralized", "collaboration_mode must be decentralized or centralized."),
    ],
)
def test_text_that_spells_no_value_is_refused_naming_the_field(name, text, message):
    spec = F.field_specs(MADPOIterConfig)[name]
    with pytest.raises(ConfigError) as error:
        F.decode(spec, text)
    assert message in str(error.value) and error.value.field == name


def test_an_assignment_names_a_known_field():
    assert F.parse_assignment(MADPOIterConfig, "preference_replay_mode=lambda") == (
        "preference_replay_mode",
        "lambda_decay",
    )
    assert F.parse_assignment(MADPOIterConfig, " top_k = none") == ("top_k", None)
    with pytest.raises(ConfigError, match=r"^MADPOIterConfig has no field 'dpo_bta'; did you mean 'dpo_beta'\?$"):
        F.parse_assignment(MADPOIterConfig, "dpo_bta=0.2")
    with pytest.raises(ValueError, match="expected FIELD=VALUE"):
        F.parse_assignment(MADPOIterConfig, "dpo_beta")


def test_strings_of_a_spec_file_are_decoded_where_they_spell_a_value():
    values = {"agent_learning_rate": "1e-3", "num_train_epochs": "two", "comparator_model_name": "1e-3", "seed": 3}
    assert F.decode_strings(MADPOIterConfig, values) == {
        "agent_learning_rate": 0.001,
        "num_train_epochs": "two",  # left for the config to refuse in its own words
        "comparator_model_name": "1e-3",  # a text field keeps its text
        "seed": 3,
    }


def test_collect_errors_reports_every_failing_field_once():
    config, errors = F.collect_errors(
        MADPOIterConfig,
        {"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 1.5, "comparator_num_candidates": 0},
    )
    assert config is None
    assert [(e.field, str(e)) for e in errors] == [
        ("preference_replay_lambda", "preference_replay_lambda must be in [0, 1]."),
        ("comparator_num_candidates", "comparator_num_candidates must be >= 1 or null."),
    ]
    config, errors = F.collect_errors(MADPOIterConfig, {"dpo_beta": 0.5})
    assert errors == [] and config.dpo_beta == 0.5
