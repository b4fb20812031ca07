from __future__ import annotations

import os

import torch

# Tests share 2 cores with the node processes they start.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
