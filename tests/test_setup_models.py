"""Setup's model picker and presets: registered models listed, their footprint read from config.json, the fit
warning, the free-text box, the URL draft, and the real-model preset (or how to register its model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from comlrl_lab.engine.presets import smollm2_spec
from comlrl_lab.models import footprint
from comlrl_lab.models.registry import ENV_MODELS_DIR, MANIFEST
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME
from comlrl_lab.ui import model_picker, services, state

ROOT = Path(__file__).resolve().parents[1]
REAL = "Real model (SmolLM2-135M)"

# A Llama of hidden 1024, MLP 2816, 8 layers, 16 heads (head dim 64, no grouped KV), 32000 tokens, untied head.
# Its folder holds config.json only: the picker must describe it without weights.
BIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 32000,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
# Embeddings and head 2 x 32000 x 1024; per layer q, k, v, o 4 x 1024^2, MLP 3 x 1024 x 2816, two norms; final norm.
BIG_PARAMETERS = 2 * 32000 * 1024 + 8 * (4 * 1024**2 + 3 * 1024 * 2816 + 2 * 1024) + 1024
# LoRA r = 8 adds r x (in + out) per adapted layer: peft's default for Llama (q, v), or every linear layer.
BIG_LORA_QV = 8 * 2 * 8 * 2048
BIG_LORA_ALL = 8 * 8 * (4 * 2048 + 3 * (1024 + 2816))


def register(root: Path, name: str) -> Path:
    """A registered model folder as ``models add`` leaves it (its manifest), holding only the config."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(BIG), encoding="utf-8")
    manifest = {"name": name, "architecture": "LlamaForCausalLM", "parameters": BIG_PARAMETERS, "dtype": "float32"}
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    return folder


@pytest.fixture
def models_root(tmp_path, monkeypatch):
    root = tmp_path / "models"
    root.mkdir()
    monkeypatch.setenv(ENV_MODELS_DIR, str(root))
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(tmp_path / "runs"))
    services.close_all()
    st.cache_resource.clear()
    yield root
    services.close_all()
    st.cache_resource.clear()


def open_setup(query: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)  # the first footprint imports torch
    if query:
        at.query_params = query
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def lora_key() -> str:
    return state.config_field_key("MADPOIter", "lora_r")


def footprint_line(at: AppTest, agent: int) -> str:
    """The line under agent ``agent``'s picker (the embedded model's, or a footprint)."""
    lines = [c.value for c in at.caption if " parameters · " in c.value or c.value.startswith(f"`{TINY_MODEL_NAME}`:")]
    return lines[agent]


def memory_warnings(at: AppTest) -> list[str]:
    return [w.value for w in at.warning if "may not fit in memory" in w.value]


def test_the_picker_lists_the_registered_models_and_describes_the_chosen_one(models_root):
    register(models_root, "big-fixture")
    at = open_setup()
    picker = at.selectbox(key=state.agent_source_key(0))
    assert picker.options == [
        f"{TINY_MODEL_NAME} · embedded, loads offline",
        "big-fixture · registered, 168.3M",
        model_picker.OTHER,
    ]
    assert BIG_PARAMETERS == 168_313_856

    picker.select("big-fixture").run()
    # The quickstart preset fine-tunes fully: weights, gradients and two AdamW moments, 16 bytes a parameter.
    assert f"{16 * BIG_PARAMETERS / 2**30:.2f}" == "2.51"
    assert footprint_line(at, 0).startswith(
        "LlamaForCausalLM · 168.3M parameters · about 2.51 GiB per agent fully fine-tuned"
    )
    # LoRA: the frozen weights plus adapters with their gradients and moments, on the layers the form names
    # (lora_target_modules empty: peft's choice for Llama, q_proj and v_proj).
    at.number_input(key=lora_key()).set_value(8).run()
    assert f"{(4 * BIG_PARAMETERS + 16 * BIG_LORA_QV) / 2**20:.1f}" == "646.1"
    assert footprint_line(at, 0).startswith(
        "LlamaForCausalLM · 168.3M parameters · about 646.1 MiB per agent with LoRA (r = 8, 0.26M adapter parameters)"
    )
    assert footprint_line(at, 1).startswith(f"`{TINY_MODEL_NAME}`: the embedded 1M-parameter Llama")


def test_the_fit_warning_appears_only_when_the_agents_do_not_fit(models_root, monkeypatch):
    register(models_root, "big-fixture")
    monkeypatch.setattr(footprint, "available_memory_bytes", lambda: 4 * 2**30)
    at = open_setup()
    assert memory_warnings(at) == []  # the embedded model: never checked, never warned about
    for i in range(2):
        at.selectbox(key=state.agent_source_key(i)).select("big-fixture").run()
    # 2 x 16 x 168.3M bytes x 1.3 headroom = 6.5 GiB; with LoRA (on q and v) 2 x 646.1 MiB x 1.3 = 1.6 GiB.
    assert memory_warnings(at) == [
        "**The agents may not fit in memory:** 2 agents (168.3M parameters) fully fine-tuned need about 6.5 GiB of "
        "memory and 4.0 GiB is available; with LoRA (lora_r) they would need about 1.6 GiB; the run may be killed "
        "for memory."
    ]
    assert not at.button(key=state.SETUP_CREATE).disabled  # a warning, not a refusal
    at.number_input(key=lora_key()).set_value(8).run()
    assert memory_warnings(at) == []

    monkeypatch.setattr(footprint, "available_memory_bytes", lambda: 8 * 2**30)
    at.number_input(key=lora_key()).set_value(None).run()
    assert memory_warnings(at) == []


def _hub(monkeypatch, *, offline: bool) -> None:
    """The hub as the model picker finds it: HF_HUB_OFFLINE set (and nothing reachable), or reachable."""
    from comlrl_lab.models import loading

    monkeypatch.setattr(loading, "_hub_offline", lambda: offline)
    monkeypatch.setattr(loading, "hub_reachable", lambda *args, **kwargs: not offline)
    st.cache_data.clear()


def test_the_free_text_box_takes_a_folder_and_says_what_it_cannot_describe(models_root, tmp_path, monkeypatch):
    _hub(monkeypatch, offline=False)
    folder = register(tmp_path / "elsewhere", "plain-folder")
    at = open_setup()
    at.selectbox(key=state.agent_source_key(0)).select(model_picker.OTHER).run()
    box = state.agent_model_key(0)
    assert any("Agent 1: enter a folder, a .gguf file or a hub id." in w.value for w in at.warning)
    assert at.button(key=state.SETUP_CREATE).disabled

    at.text_input(key=box).input(str(folder)).run()
    assert footprint_line(at, 0).startswith("LlamaForCausalLM · 168.3M parameters · about 2.51 GiB per agent")
    assert json.loads(at.get("json")[0].proto.body)["agent_models"] == [str(folder), TINY_MODEL_NAME]
    assert not at.button(key=state.SETUP_CREATE).disabled

    at.text_input(key=box).input(str(tmp_path / "missing")).run()
    assert f"Agent 1: {tmp_path / 'missing'} does not exist." in [w.value for w in at.warning]
    assert at.button(key=state.SETUP_CREATE).disabled

    at.text_input(key=box).input("comlrl-lab-tests/never-cached").run()
    assert any(
        c.value.startswith("Its size is unknown: `comlrl-lab-tests/never-cached` is not on this machine")
        for c in at.caption
    )
    assert not at.button(key=state.SETUP_CREATE).disabled  # the run may still fetch it


def test_a_model_that_cannot_load_here_is_said_in_words_as_it_is_picked(models_root, monkeypatch):
    # Issue 49: a hub id with the hub offline was accepted until Create, which showed the loader's exception with
    # its class path; a missing path was captioned as coming "from the hub" under a "does not exist" warning.
    _hub(monkeypatch, offline=True)
    at = open_setup()
    at.selectbox(key=state.agent_source_key(0)).select(model_picker.OTHER).run()
    at.text_input(key=state.agent_model_key(0)).input("comlrl-lab-tests/never-cached").run()
    warnings = [w.value for w in at.warning if w.value.startswith("Agent 1:")]
    assert warnings == [
        "Agent 1: model 'comlrl-lab-tests/never-cached' was not found locally (not a directory, not in the Hugging "
        "Face cache) and the hub is offline (HF_HUB_OFFLINE is set). Download it on a machine with network or pass "
        "a local directory."
    ]
    assert at.button(key=state.SETUP_CREATE).disabled
    assert not any("ModelLoadError" in e.value or "comlrl_lab." in e.value for e in [*at.error, *at.warning])
    assert not any("would come from the hub" in c.value for c in at.caption)

    at.text_input(key=state.agent_model_key(0)).input("/nonexistent/model").run()
    assert "Agent 1: /nonexistent/model does not exist." in [w.value for w in at.warning]
    assert not any("hub" in c.value for c in at.caption if "/nonexistent/model" in c.value)
    assert at.button(key=state.SETUP_CREATE).disabled


def test_the_chosen_model_goes_into_the_url_and_comes_back(models_root):
    register(models_root, "big-fixture")
    at = open_setup()
    at.selectbox(key=state.agent_source_key(0)).select("big-fixture").run()
    at.selectbox(key=state.agent_source_key(1)).select(model_picker.OTHER).run()
    at.text_input(key=state.agent_model_key(1)).input("org/some-model").run()
    url = {k: v for k, v in at.query_params.items() if k.startswith("setup.agent.")}
    assert url == {
        state.agent_source_key(0): "big-fixture",
        state.agent_source_key(1): model_picker.OTHER,
        state.agent_model_key(1): "org/some-model",
    }
    reloaded = open_setup(url)
    assert reloaded.selectbox(key=state.agent_source_key(0)).value == "big-fixture"
    assert reloaded.text_input(key=state.agent_model_key(1)).value == "org/some-model"
    assert json.loads(reloaded.get("json")[0].proto.body)["agent_models"] == ["big-fixture", "org/some-model"]

    # A model no longer registered cannot be picked: the draft skips it and says so.
    (models_root / "big-fixture" / MANIFEST).unlink()
    gone = open_setup(url)
    assert gone.selectbox(key=state.agent_source_key(0)).value == TINY_MODEL_NAME
    assert any(f"{state.agent_source_key(0)}='big-fixture'" in i.value for i in gone.info)


def test_the_real_model_preset_says_how_to_register_smollm2_when_it_is_absent(models_root):
    at = open_setup()
    at.selectbox(key=state.SETUP_PRESET_PICK).select(REAL).run()
    assert [w.value for w in at.warning if "models add" in w.value] == [
        f"Model 'smollm2-135m-instruct' is not registered in {models_root}: run `comlrl-lab models add "
        f"smollm2-135m-instruct` first (or set {ENV_MODELS_DIR} to the models folder that holds it)."
    ]
    assert at.button(key=state.SETUP_LOAD_PRESET).disabled
    at.selectbox(key=state.SETUP_PRESET_PICK).select("Quickstart (embedded model)").run()
    assert not at.button(key=state.SETUP_LOAD_PRESET).disabled


def test_the_real_model_preset_loads_the_smollm2_spec(models_root):
    register(models_root, "smollm2-135m-instruct")  # a stand-in folder: the form reads only its config
    at = open_setup()
    at.selectbox(key=state.SETUP_PRESET_PICK).select(REAL).run()
    assert not at.button(key=state.SETUP_LOAD_PRESET).disabled
    at.button(key=state.SETUP_LOAD_PRESET).click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Loaded the preset Real model (SmolLM2-135M) (`examples/smollm2.yaml`)." in [s.value for s in at.success]
    shown = services.ExperimentSpec.from_dict(json.loads(at.get("json")[0].proto.body))
    preset = smollm2_spec()
    assert shown.build_config() == preset.build_config()
    assert (shown.agent_models, shown.task, shown.max_train_items, shown.max_eval_items, shown.name) == (
        ["smollm2-135m-instruct"] * 2,
        "length_ratio",
        12,
        16,
        "smollm2",
    )
    assert footprint_line(at, 1).startswith(
        "LlamaForCausalLM · 168.3M parameters · about 661.3 MiB per agent with LoRA"
    )
