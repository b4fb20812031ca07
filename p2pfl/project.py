"""`p2pfl new NAME`: a project folder that runs as written, with a scenario, your own data
loader, model and strategy, each a small module to edit (like `flwr new`)."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from p2pfl.errors import ConfigError

SCENARIO = '''\
# {name}: your own data, model and strategy, run by p2pfl.
#   p2pfl run scenario.toml --out runs/first        # from this folder
#   p2pfl report runs/first                         # figures and tables
# Each `"module:name"` below is a file of this folder; p2pfl puts the folder on the path.
name = "{name}"
nodes = 4
seed = 0
rounds = 5

[data]
dataset = "data:load"          # data.py: () -> (x, y)
partition = "dirichlet"        # label skew between the nodes; "iid" for none
alpha = 0.5

[model]
name = "model:build"           # model.py: (in_channels, image_size, num_classes) -> (nn.Module, head name)

[algorithm]
name = "strategy:TrimmedMean"  # strategy.py: your Strategy subclass; or a built-in such as "fedavg"

[algorithm.params]
trim = 1

[train]
epochs = 2
batch_size = 32
lr = 0.003
'''

DATA = '''\
"""The data every node's slice is cut from: scikit-learn's 1797 handwritten 8x8 digits (they ship
inside the package, nothing is downloaded). Replace `load` with your own: x as (N, C, H, W)
uint8 images (or floats used as they are), y as N integer labels."""

import numpy as np
from sklearn.datasets import load_digits


def load():
    digits = load_digits()
    x = (digits.images * (255 / 16)).astype(np.uint8)[:, None]  # (1797, 1, 8, 8), 0..255
    return x, digits.target.astype(np.int64)
'''

MODEL = '''\
"""The model every node trains. p2pfl splits it at the named final linear layer into a body (the
features) and a head (the classifier), so that every algorithm can share either part."""

from torch import nn


def build(in_channels, image_size, num_classes):
    model = nn.Sequential()
    model.add_module("flatten", nn.Flatten())
    model.add_module("hidden", nn.Linear(in_channels * image_size * image_size, 64))
    model.add_module("relu", nn.ReLU())
    model.add_module("classifier", nn.Linear(64, num_classes))
    return model, "classifier"
'''

# docs/algorithms.md's "write your own strategy", verbatim (tests/algorithms/test_user_strategy.py checks it).
TRIMMED_MEAN = '''\
import torch

from p2pfl.models import load_part, part_state
from p2pfl.runtime.strategy import Fetch, Strategy


class TrimmedMean(Strategy):
    """Every node: the coordinate-wise mean of all models (its own included) without the `trim` largest and smallest."""
    shared_parts = ("full",)

    def __init__(self, trim: int = 1) -> None:
        self.trim = trim

    def configure_fetch(self, ctx):
        return [Fetch(peer, "full") for peer in ctx.peers]

    def aggregate(self, ctx, arrived):
        states = [part_state(ctx.model, "full")] + [m.tensors for m in arrived if m.part == "full"]
        if len(states) > 2 * self.trim:
            stacked = {k: torch.stack([s[k].float() for s in states]).sort(dim=0).values for k in states[0]}
            load_part(ctx.model, {k: v[self.trim:len(states) - self.trim].mean(0).to(states[0][k].dtype)
                                  for k, v in stacked.items()})
'''

STRATEGY = '''\
"""How a node learns from its peers: the coordinate-wise mean of every model (its own included)
without the `trim` largest and smallest values, robust to a peer that sends nonsense."""

''' + TRIMMED_MEAN

README = '''\
# {name}

A p2pfl project: {nodes} nodes, each its own process, learn from each other with your strategy.

```bash
p2pfl run scenario.toml --out runs/first     # about a minute on a laptop
p2pfl report runs/first                      # runs/first/report/: accuracy, bytes, relevance
p2pfl compare scenario.toml --algorithms 'strategy:TrimmedMean,fedavg,local' --seeds 0,1,2 --out runs/cmp
```

| file | what to change |
|---|---|
| `scenario.toml` | nodes, rounds, the partition, training; every field is in p2pfl's docs/scenarios.md |
| `data.py` | `load()`: your data as (x, y) |
| `model.py` | `build(in_channels, image_size, num_classes)`: your model and the name of its final linear layer |
| `strategy.py` | your algorithm: what to fetch from peers (`configure_fetch`) and how to combine it (`aggregate`) |

Run the commands from this folder: p2pfl puts it on the path for itself and its node processes.
'''

FILES = {"scenario.toml": SCENARIO, "data.py": DATA, "model.py": MODEL, "strategy.py": STRATEGY, "README.md": README}


def new_project(name: str, parent: Path) -> Path:
    """Write the project folder `parent / name`; refuses a name that is not a plain folder name,
    and a folder that exists (nothing of it is touched)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name) or keyword.iskeyword(name):
        raise ConfigError("NAME", f"{name!r}: use letters, digits, '_' and '-', starting with a letter")
    folder = parent / name
    if folder.exists():
        raise ConfigError("NAME", f"{folder} exists; choose another name or remove it")
    folder.mkdir(parents=True)
    for filename, template in FILES.items():
        (folder / filename).write_text(template.format(name=name, nodes=4) if "{name}" in template else template)
    return folder
