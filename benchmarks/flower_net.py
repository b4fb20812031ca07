"""Flower's MNIST `Net` (the CNN of McMahan et al. 2017 as Flower's examples write it: 582,026
parameters), for `benchmarks/flower_side_by_side.py --model flower_net:net`.

    PYTHONPATH=benchmarks p2pfl run SCENARIO --set 'model.name="flower_net:net"'

(`flower_net`, not `benchmarks.flower_net`: a package some dependency installs is named `benchmarks`.)

Both sides build it through this factory, so Flower and p2pfl train the very same network."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.pool = nn.MaxPool2d(2, 2)
        side = ((image_size - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(64 * side * side, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


def net(in_channels: int, image_size: int, num_classes: int) -> tuple[nn.Module, str]:
    """The p2pfl factory: the network and the name of its final linear layer (the head)."""
    return Net(in_channels, image_size, num_classes), "fc2"
