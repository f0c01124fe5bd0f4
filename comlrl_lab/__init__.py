"""comlrl-lab: a workbench for preference-based RL of cooperating LLM agents (MADPO, MARLHF).

The public training API lives in ``comlrl_lab.trainers.preference`` under CoMLRL's names.
"""

from comlrl_lab import mkl_dispatch

# Differs from CoMLRL: on an AMD CPU with AVX-512, MKL gets its AVX-512 kernels (mkl_dispatch.py). Before anything
# imports torch: MKL decides its kernels when torch loads.
mkl_dispatch.enable()

__version__ = "0.1.0"
