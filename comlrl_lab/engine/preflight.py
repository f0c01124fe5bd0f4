"""What a spec names, checked on this machine before a run directory exists: the task with its module and data
files, model paths, and every device field. A mistake costs no run directory and no model load.

The config itself has been validated by then (``ExperimentSpec.build_config``); this module does not build
trainers or load model weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from comlrl_lab.engine.spec import ExperimentSpec, inside_run_dir, resolve_task


def preflight(spec: ExperimentSpec, config: Any) -> None:
    """Check what ``spec`` (with its validated ``config``) names here: the run folders, the task, model paths,
    devices."""
    # torch comes in with these two: the workbench imports the engine without it.
    from comlrl_lab.models.loading import check_available, resolve_model_source
    from comlrl_lab.trainers.preference.devices import resolve_layout

    inside_run_dir(config)
    resolve_task(spec)
    for model in spec.agent_models:
        if not isinstance(model, str):
            continue
        source = resolve_model_source(model)
        if source.startswith((".", "~", "/")) and not Path(source).exists():
            raise ValueError(f"agent_models: {model!r} is not a folder on this machine (no such path)")
        check_available(model, "agent_models:")
    count = 1 if config.collaboration_mode == "centralized" else int(config.num_agents)
    resolve_layout(config, count, model_config=spec.model_config)
