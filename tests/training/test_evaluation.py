"""Scoring through the channels-last copy gives the stored layout's scores and leaves the model as it was."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from p2pfl.models import build_model
from p2pfl.training.config import TrainConfig
from p2pfl.training.trainer import LocalTrainer, correct_per_sample


def _reference(model: nn.Module, split: SimpleNamespace) -> tuple[float, float, torch.Tensor]:
    """Accuracy, mean cross-entropy and per-sample hits by explicit forward passes, one sample at a time."""
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(split.x[i : i + 1]) for i in range(len(split.y))])
    hits = logits.argmax(1) == split.y
    return int(hits.sum()) / len(split.y), float(nn.functional.cross_entropy(logits, split.y)), hits


def test_scores_match_one_sample_forward_passes_and_the_model_keeps_its_layout_and_mode() -> None:
    torch.manual_seed(0)
    model = build_model("lenet", 3, 28, 10)
    split = SimpleNamespace(x=torch.randn(150, 3, 28, 28), y=torch.randint(0, 10, (150,)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    acc, loss = LocalTrainer(TrainConfig()).evaluate(model, split)
    hits = correct_per_sample(model, split)
    model.train()  # _reference switches to eval; compare in the mode evaluate left behind first
    ref_acc, ref_loss, ref_hits = _reference(model, split)
    assert acc == ref_acc
    assert abs(loss - ref_loss) < 1e-5
    assert torch.equal(hits, ref_hits)
    conv = model.body[0].weight
    assert conv.is_contiguous() and not conv.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_evaluate_leaves_a_training_model_in_training_mode() -> None:
    model = build_model("cnn", 1, 28, 10)
    model.train()
    split = SimpleNamespace(x=torch.randn(100, 1, 28, 28), y=torch.randint(0, 10, (100,)))
    LocalTrainer(TrainConfig()).evaluate(model, split)
    assert model.training


def test_splits_scored_together_match_one_sample_forward_passes_and_leave_the_mode() -> None:
    torch.manual_seed(1)
    model = build_model("cnn", 1, 28, 10)
    model.train()
    trainer = LocalTrainer(TrainConfig())
    small = [SimpleNamespace(x=torch.randn(n, 1, 28, 28), y=torch.randint(0, 10, (n,))) for n in (1, 3, 7)]
    large = [SimpleNamespace(x=torch.randn(n, 1, 28, 28), y=torch.randint(0, 10, (n,))) for n in (40, 30)]  # > 64 together
    empty = SimpleNamespace(x=torch.zeros(0, 1, 28, 28), y=torch.zeros(0, dtype=torch.long))
    for splits in (small, large, [small[0], empty]):
        scores = trainer.evaluate_together(model, splits)
        assert model.training  # eval mode only meanwhile
        assert len(scores) == len(splits)
        for (acc, loss), split in zip(scores, splits):
            if len(split.y) == 0:
                assert acc != acc and loss != loss  # NaN, as `evaluate` scores an empty split
                continue
            ref_acc, ref_loss, _ = _reference(model, split)
            model.train()
            assert acc == ref_acc and abs(loss - ref_loss) < 1e-5
