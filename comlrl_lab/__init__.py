"""comlrl-lab: a workbench for preference-based RL of cooperating LLM agents (MADPO, MARLHF).

The public training API lives in ``comlrl_lab.trainers.preference`` under CoMLRL's names.
"""

from comlrl_lab import mkl_dispatch

# Before anything imports torch: MKL decides its kernels when torch loads (mkl_dispatch.py).
mkl_dispatch.enable()

__version__ = "0.1.0"
