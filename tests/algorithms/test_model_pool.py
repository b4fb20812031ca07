"""ModelPool: averages of stacked states, scored without loading them into the node's model."""

from __future__ import annotations

import pytest
import torch

from p2pfl.algorithms.common import ModelPool
from p2pfl.data import Split
from p2pfl.models import cnn, lenet, load_part
from p2pfl.training.trainer import CPU_EVAL_BATCH


def stored_layout_scores(model: torch.nn.Module, split: Split) -> tuple[float, float]:
    """Accuracy and mean cross-entropy by plain forward passes of the whole split at once."""
    with torch.no_grad():
        model.eval()
        logits = model(split.x)
    return float((logits.argmax(1) == split.y).float().mean()), float(torch.nn.functional.cross_entropy(logits, split.y))


@pytest.mark.parametrize("factory", [cnn, lenet])
def test_a_pool_scores_an_average_as_the_loaded_average_scores(factory) -> None:
    torch.manual_seed(0)
    models = [factory(1, 28, 10) for _ in range(4)]
    n = 3 * CPU_EVAL_BATCH + 5  # several channels-last batches and a short last one
    split = Split(torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,)))
    template = factory(1, 28, 10)
    before = {k: v.clone() for k, v in template.state_dict().items()}
    pool = ModelPool(template, [m.state_dict() for m in models])
    assert pool.channels_last
    for members in ([0], [1, 3], [0, 1, 2, 3]):
        loaded = factory(1, 28, 10)
        load_part(loaded, {k: torch.stack([models[i].state_dict()[k] for i in members]).mean(0)
                           for k in loaded.state_dict()})
        accuracy, loss = pool.evaluate(members, split)
        expected_accuracy, expected_loss = stored_layout_scores(loaded, split)
        assert accuracy == pytest.approx(expected_accuracy, abs=1.5 / n)  # at most one near-tie flips
        assert loss == pytest.approx(expected_loss, rel=1e-5)
    for k, v in template.state_dict().items():  # the template is read, never converted or loaded
        assert torch.equal(v, before[k]) and v.is_contiguous()


def test_a_pool_without_convolutions_scores_in_the_stored_layout() -> None:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    states = [{k: torch.randn_like(v) for k, v in mlp.state_dict().items()} for _ in range(2)]
    pool = ModelPool(mlp, states)
    assert not pool.channels_last
    split = Split(torch.randn(100, 1, 4, 4), torch.randint(0, 3, (100,)))
    mlp.load_state_dict({k: (states[0][k] + states[1][k]) / 2 for k in states[0]})
    assert pool.evaluate([0, 1], split) == pytest.approx(stored_layout_scores(mlp, split), rel=1e-6)
