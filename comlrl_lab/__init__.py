"""comlrl-lab: a workbench for preference-based RL of cooperating LLM agents (MADPO, MARLHF).

The public training API lives in ``comlrl_lab.trainers.preference`` under CoMLRL's names. Importing the package
changes nothing process-wide: it loads no native library and sets no environment, thread count or RNG state.
"""

__version__ = "0.1.0"
