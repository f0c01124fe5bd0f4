"""Suite-wide settings: one torch thread.

The models in the suite are tiny; with torch's default thread count the two cores of these machines spend
more time synchronising threads than computing, and a busy neighbour makes that many times worse (a notebook
went from 14 s to 181 s). Subprocesses (torchrun, the CLI, notebook kernels) inherit the environment variable.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402  (after the environment is set, so the first import sees it)

torch.set_num_threads(1)
