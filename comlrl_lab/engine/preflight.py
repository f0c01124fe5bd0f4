"""What a spec names, checked on this machine before a run directory exists: the task with its module and data
files, model paths and whether their files are whole, the judge's key, and every device field (`preflight`), and whether the agents fit in memory (`memory_warning`). A mistake costs no run directory and no model load.

The config itself was validated when the spec was made (``ExperimentSpec.validated_config``); this module does not build
trainers or load model weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from comlrl_lab.engine.spec import ExperimentSpec, inside_run_dir, resolve_task


def preflight(spec: ExperimentSpec, config: Any) -> Any:
    """Check what ``spec`` (with its validated ``config``) names here: the run folders, the task, model paths,
    devices; return the task."""
    # torch comes in with these two: the workbench imports the engine without it.
    from comlrl_lab.models.loading import ModelLoadError, check_available, check_model_whole, resolve_model_source
    from comlrl_lab.trainers.preference.runtime.devices import resolve_layout

    inside_run_dir(config)
    task = resolve_task(spec)
    for model in spec.agent_models:
        if not isinstance(model, str):
            continue
        try:
            source = resolve_model_source(model)
        except ModelLoadError as exc:  # a registry name that is not registered here
            raise ValueError(f"agent_models: {exc}") from None
        if source.startswith((".", "~", "/")) and not Path(source).exists():
            raise ValueError(f"agent_models: {model!r} is not a folder or .gguf file on this machine (no such path)")
        check_available(model, "agent_models:")
        try:
            check_model_whole(model)
        except ModelLoadError as exc:  # files deleted, truncated or damaged since the model was added
            raise ValueError(f"agent_models: {exc}") from None
    comparator = getattr(config, "comparator_model_name", None)
    if isinstance(comparator, str) and comparator.strip():
        try:
            check_model_whole(comparator)
        except ModelLoadError as exc:
            raise ValueError(f"comparator_model_name: {exc}") from None
    count = 1 if config.collaboration_mode == "centralized" else int(config.num_agents)
    resolve_layout(config, count, model_config=spec.model_config)
    if config.preference_source == "judge":
        from comlrl_lab.trainers.preference.rounds.judge import Judge

        Judge(config)  # reads the judge's key: one that is not set is refused here, not after the first collect
    return task


def memory_warning(spec: Any, describe: Callable[..., Any] | None = None) -> str | None:
    """A one-line warning when the spec's agents will not fit in the memory available now (``footprint``); None when
    they fit, or when a model's size is unknown here (a config that cannot be read: the run's own loading says why).

    ``describe(model, dtype=, lora_r=, lora_target_modules=)`` gives a model's ``Footprint`` or None when it is
    unknown; by default ``footprint.describe_model`` (the Setup page passes its cached ``model_picker.footprint``)."""
    from comlrl_lab.models.footprint import describe_model, memory_check

    describe = describe or describe_model
    config = spec.validated_config()
    models = list(spec.agent_models)
    if len(models) == 1:
        models = models * int(config.num_agents)
    lora = config.lora_r is not None
    dtype = spec.model_config.get("dtype", spec.model_config.get("torch_dtype"))
    try:
        footprints = {
            m: describe(m, dtype=dtype, lora_r=config.lora_r or 8, lora_target_modules=config.lora_target_modules)
            for m in set(models)
        }
    except Exception:  # a config that cannot be read now (a cut GGUF gives struct.error): loading reports why
        return None
    if any(f is None for f in footprints.values()):
        return None
    warning = memory_check([footprints[m] for m in models], lora=lora)
    return f"{warning}; the run may be killed for memory" if warning else None
