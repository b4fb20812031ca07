"""A fit trains as a plain PyTorch loop does and holds no gradients after it."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch
from torch import nn

from p2pfl.models import build_model
from p2pfl.training.config import TrainConfig
from p2pfl.training.trainer import LocalTrainer


def test_a_fit_is_the_plain_loop_and_leaves_no_gradients_behind() -> None:
    torch.manual_seed(0)
    model = build_model("cnn", 1, 28, 10)
    reference = copy.deepcopy(model)
    split = SimpleNamespace(x=torch.rand(6, 1, 28, 28), y=torch.tensor([0, 1, 2, 3, 4, 5]))
    trainer = LocalTrainer(TrainConfig(epochs=2, batch_size=6), seed=0)
    trainer.fit(model, split)
    # Gradients of the last step would stay a model's size per node until the next round.
    assert all(p.grad is None for p in model.parameters())

    optimizer = torch.optim.Adam(reference.parameters(), lr=TrainConfig().lr, weight_decay=TrainConfig().weight_decay)
    reference.train()
    for _ in range(2):  # one full batch an epoch: the shuffle does not change the step
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(reference(split.x), split.y).backward()
        optimizer.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6), name
