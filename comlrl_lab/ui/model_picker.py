"""Setup's model picker: one agent's model (the embedded one, a registered one, or any folder, ``.gguf`` file or hub
id typed in), with what the chosen model is and what training it costs in memory.

The registered models are listed from the models folder's manifests (``models.registry``: no torch import, so the
first render of Setup stays fast). What a model is and costs comes from ``models.footprint``, read from its config
without loading weights, and only for a model the user picked other than the embedded one (whose 1M parameters fit
anywhere); whether a run fits in memory is ``engine.preflight.memory_warning``, the check ``comlrl-lab run`` makes.
A hub id that is not in the local cache has an unknown size: nothing here touches the network.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import streamlit as st

from comlrl_lab.engine.preflight import memory_warning
from comlrl_lab.models import registry
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME, is_tiny_model_name
from comlrl_lab.ui import state

#: The picker's last choice: the box for a folder, a ``.gguf`` file or a hub id.
OTHER = "Other: a folder, a .gguf file or a hub id"
_HELP = (
    "The embedded model needs no network. A registered model was converted once into the models folder "
    f"(`comlrl-lab models add NAME`; the folder is ${registry.ENV_MODELS_DIR}, else ~/.cache/comlrl-lab/models). "
    "Other: a save_pretrained folder, a .gguf file (dequantised on every load), or a hub id, loaded from the "
    "Hugging Face cache or the hub."
)


def registered() -> dict[str, registry.RegisteredModel]:
    """The registered models by name, read from their manifests."""
    return {m.name: m for m in registry.registered_models()}


def options(models: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The picker's choices: the embedded model, the registered models, then the free-text box."""
    return (TINY_MODEL_NAME, *(registered() if models is None else models), OTHER)


def choice_for(model: str) -> tuple[str, str | None]:
    """The picker's choice and free text that name ``model`` (a spec's agent model)."""
    if is_tiny_model_name(model):
        return TINY_MODEL_NAME, None
    if model in registered() and not Path(model).expanduser().exists():
        return model, None
    return OTHER, model


def _label(choice: str, models: Mapping[str, registry.RegisteredModel]) -> str:
    if choice == TINY_MODEL_NAME:
        return f"{TINY_MODEL_NAME} · embedded, loads offline"
    if choice in models:
        model = models[choice]
        return f"{choice} · registered, {model.parameters / 1e6:.1f}M"  # the line below names the architecture
    return choice


def _is_missing_path(value: str) -> bool:
    return value.startswith((".", "/", "~")) and not Path(value).expanduser().exists()


@st.cache_data(ttl=30, max_entries=64, show_spinner="Checking the hub…")
def hub_problem(source: str) -> str | None:
    """Why the hub id ``source`` cannot be loaded now (not on this machine, and the hub offline or out of reach), in
    the words loading would use; None when it is here or the hub answers. The hub probe takes up to a few seconds:
    its answer is kept for 30 s."""
    from comlrl_lab.models.loading import ModelLoadError, check_available

    try:
        check_available(source, "model")
    except ModelLoadError as error:
        return str(error)
    return None


def _free_text_problem(agent: int, value: str) -> str | None:
    if not value:
        return f"Agent {agent}: enter a folder, a .gguf file or a hub id."
    if _is_missing_path(value):
        return f"Agent {agent}: {value} does not exist."
    try:
        registry.check_model_name(value)
    except registry.RegistryError as error:
        return f"Agent {agent}: {error}."
    # Said as the model is picked, not when Create fails with the loader's exception.
    problem = hub_problem(value)
    return f"Agent {agent}: {problem}" if problem else None


def model_picker(i: int, models: Mapping[str, registry.RegisteredModel]) -> tuple[str, str | None]:
    """Agent ``i``'s picker over the registered ``models`` (``registered()``, read once for all the agents);
    returns (the model name or path, the form's problem with it or None)."""
    choices = options(models)
    key = state.agent_source_key(i)
    if st.session_state.get(key, TINY_MODEL_NAME) not in choices:  # a model removed from the registry since
        st.session_state[key], st.session_state[state.agent_model_key(i)] = OTHER, st.session_state[key]
    left, right = st.columns([2, 3], vertical_alignment="bottom")
    with left:
        choice = st.selectbox(
            f"Agent {i + 1} model",
            choices,
            key=key,
            persist_state="session",
            format_func=lambda c: _label(c, models),
            help=_HELP,
        )
    if choice != OTHER:
        return choice, None
    with right:
        value = st.text_input(
            f"Agent {i + 1} model",
            key=state.agent_model_key(i),
            persist_state="session",
            placeholder="/path/to/folder, /path/to/model.gguf or org/model-name",
            label_visibility="collapsed",
        ).strip()
    return value, _free_text_problem(i + 1, value)


@st.cache_data(max_entries=64, show_spinner=False)
def _footprint_at(path: str, dtype: str | None, lora_r: int, lora_target_modules: Any) -> Any:
    from comlrl_lab.models.footprint import describe_model

    return describe_model(path, dtype=dtype, lora_r=lora_r, lora_target_modules=lora_target_modules)


def footprint(
    source: str, *, dtype: str | None = None, lora_r: int = 8, lora_target_modules: Any = "all-linear"
) -> Any:
    """``footprint.describe_model`` of ``source``, cached by the folder or file it resolves to
    (``loading.local_source``); None when the model is not on this machine, whose size only the hub could tell."""
    from comlrl_lab.models.loading import local_source

    path = local_source(source)
    return None if path is None else _footprint_at(path, dtype, lora_r, lora_target_modules)


def _size(count: float) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def describe(source: str, values: Mapping[str, Any]) -> str:
    """One line on what ``source`` is and costs per agent under the form's LoRA fields (``values``)."""
    if is_tiny_model_name(source):
        return f"`{TINY_MODEL_NAME}`: the embedded 1M-parameter Llama; it loads offline and fits anywhere."
    if _is_missing_path(source):  # the warning below the form says so; a hub is no part of it
        return f"`{source}` is a path, and nothing is there."
    lora_r, targets = values.get("lora_r"), values.get("lora_target_modules")
    try:
        with st.spinner("Reading the model's config…"):
            found = footprint(source, lora_r=lora_r or 8, lora_target_modules=targets)
    except (OSError, ValueError) as error:  # a folder without a readable config, an unregistered name
        return f"Its size is unknown: {error}"
    if found is None and hub_problem(source):
        return f"Its size is unknown: `{source}` is not on this machine, and the hub cannot give it now (see below)."
    if found is None:
        return (
            f"Its size is unknown: `{source}` is not on this machine (not in the Hugging Face cache); its config "
            "would come from the hub when the run loads it."
        )
    if lora_r:
        cost = (
            f"about {_size(found.lora_bytes)} per agent with LoRA (r = {lora_r}, {found.lora_parameters / 1e6:.2f}M "
            "adapter parameters)"
        )
    else:
        cost = f"about {_size(found.full_fine_tuning_bytes)} per agent fully fine-tuned (set lora_r for LoRA)"
    return (
        f"{found.architecture} · {found.parameters / 1e6:.1f}M parameters · {cost}: weights, gradients and AdamW's "
        "moments, activations not counted."
    )


def fit_warning(spec: Any) -> str | None:
    """``memory_warning`` for the spec the form builds, unless every agent is the embedded model."""
    if all(isinstance(m, str) and is_tiny_model_name(m) for m in spec.agent_models):
        return None
    try:
        return memory_warning(spec, describe=footprint)
    except ValueError:  # the config is invalid: the form says so above
        return None
