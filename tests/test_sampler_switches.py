"""The benchmarks' ``--no-<saving>`` switches reach the sampler: each one turns its SamplingSettings field off."""

from __future__ import annotations

import dataclasses
import json

from repo_scripts import load_repo_script

from comlrl_lab.models.generation import SamplingSettings

switches = load_repo_script("benchmarks/sampler_switches.py", "sampler_switches")
collection = load_repo_script("benchmarks/collection.py", "collection_benchmark")


def test_every_switch_names_a_sampling_setting_that_is_on_by_default():
    defaults = {field.name: field.default for field in dataclasses.fields(SamplingSettings)}
    assert switches.SAMPLER_SAVINGS and all(defaults[name] is True for name in switches.SAMPLER_SAVINGS)


def test_collection_hands_every_switch_to_the_settings_it_samples_with(monkeypatch, capsys):
    built = []

    def recording(**values):
        built.append(values)
        return SamplingSettings(**values)

    monkeypatch.setattr(collection, "SamplingSettings", recording)
    flags = [f"--no-{name.replace('_', '-')}" for name in switches.SAMPLER_SAVINGS]
    tiny = ["--items", "1", "--candidates", "2", "--max-new-tokens", "2", "--batch-size", "2", "--repeats", "1"]

    assert collection.main([*tiny, *flags, "--json"]) == 0

    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # sides_in_one_pass is the benchmark's own choice of call, not a setting of the sampler.
    settings_fields = {field.name for field in dataclasses.fields(SamplingSettings)}
    for name in switches.SAMPLER_SAVINGS:
        assert result[name] is False
        if name in settings_fields and name != "sides_in_one_pass":
            assert built and all(values[name] is False for values in built), name
