"""The engine: experiments as specs, runs advanced phase by phase, and a manager that runs them in threads."""

from comlrl_lab.engine.manager import Progress, RunManager
from comlrl_lab.engine.run import Run
from comlrl_lab.engine.spec import ALGORITHMS, ExperimentSpec, build_trainer
from comlrl_lab.names.phases import InvalidTransition

__all__ = ["ALGORITHMS", "ExperimentSpec", "InvalidTransition", "Progress", "Run", "RunManager", "build_trainer"]
