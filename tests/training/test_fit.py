"""A fit trains as a plain PyTorch loop does and holds no gradients after it."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from p2pfl.models import build_model
from p2pfl.training.config import TrainConfig
from p2pfl.training.trainer import LocalTrainer


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_fit_is_the_plain_loop_and_leaves_no_gradients_behind(optimizer: str) -> None:
    torch.manual_seed(0)
    model = build_model("cnn", 1, 28, 10)
    reference = copy.deepcopy(model)
    split = SimpleNamespace(x=torch.rand(6, 1, 28, 28), y=torch.tensor([0, 1, 2, 3, 4, 5]))
    config = TrainConfig(epochs=3, batch_size=6, optimizer=optimizer, lr=0.05, momentum=0.9, weight_decay=1e-3)
    trainer = LocalTrainer(config, seed=0)
    trainer.fit(model, split)
    # Gradients of the last step would stay a model's size per node until the next round.
    assert all(p.grad is None for p in model.parameters())

    # The plain loop, with torch's default per-parameter step on the CPU (foreach off): the
    # trainer's one-call step must give the same parameters to the bit.
    if optimizer == "adam":
        plain = torch.optim.Adam(reference.parameters(), lr=config.lr, weight_decay=config.weight_decay, foreach=False)
    else:
        plain = torch.optim.SGD(reference.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay, foreach=False)
    reference.train()
    batches = LocalTrainer(config, seed=0)  # the same shuffles, so that every sum runs in the same order
    for _ in range(3):
        for xb, yb in batches.loader(split):
            plain.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(reference(xb), yb).backward()
            plain.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize(("n", "batch_size"), [(7, 3), (3, 32), (6, 6), (1, 1)])
def test_an_epoch_is_the_loaders_batches_with_the_same_draws(n: int, batch_size: int) -> None:
    """A fit batches without a DataLoader: the same batches, and the generator left where the
    loader leaves it, epoch after epoch (every later round's shuffle depends on it)."""
    split = SimpleNamespace(x=torch.randn(n, 2, 3), y=torch.arange(n))
    config = TrainConfig(batch_size=batch_size)
    direct, reference = LocalTrainer(config, seed=5), LocalTrainer(config, seed=5)
    for _ in range(3):
        ours, theirs = list(direct.epoch(split)), list(reference.loader(split))
        assert len(ours) == len(theirs) == -(-n // batch_size)
        for (x, y), (x_ref, y_ref) in zip(ours, theirs):
            assert torch.equal(x, x_ref) and torch.equal(y, y_ref) and x.is_contiguous()
        assert torch.equal(direct.generator.get_state(), reference.generator.get_state())
    assert sorted(int(v) for _, y in ours for v in y) == list(range(n))


def test_an_epoch_of_an_empty_split_fails_as_the_loader_does() -> None:
    split = SimpleNamespace(x=torch.zeros(0, 2), y=torch.zeros(0, dtype=torch.long))
    trainer = LocalTrainer(TrainConfig(), seed=0)
    with pytest.raises(ValueError, match="num_samples"):
        list(trainer.loader(split))
    with pytest.raises(ValueError, match="num_samples"):
        list(trainer.epoch(split))
