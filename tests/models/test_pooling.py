"""`MaxPool2`: the pooling of the built-in CNN and LeNet, by strided maxima when scoring on the
CPU; the same values as torch's kernel, whatever the shape, ties, infinities or NaN."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pfl.models import MaxPool2, build_model


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 3), channels=st.integers(1, 4), height=st.integers(2, 9), width=st.integers(2, 9),
       levels=st.sampled_from([2, 5, None]), seed=st.integers(0, 2**16), double=st.booleans())
def test_scoring_pools_the_values_torch_pools(batch: int, channels: int, height: int, width: int,
                                              levels: int | None, seed: int, double: bool) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, height, width, generator=generator, dtype=torch.float64 if double else torch.float32)
    if levels is not None:  # few distinct values: windows full of ties
        x = (x * levels).round() / levels
    with torch.no_grad():
        assert torch.equal(MaxPool2()(x), F.max_pool2d(x, 2))
        assert torch.equal(MaxPool2()(x[0]), F.max_pool2d(x[0], 2))  # one image, no batch dimension


def test_infinities_and_nan_pool_as_torch_pools_them() -> None:
    x = torch.tensor([[[[1.0, float("nan"), float("-inf"), float("-inf")],
                        [0.0, 2.0, float("-inf"), float("inf")]]]])
    with torch.no_grad():
        torch.testing.assert_close(MaxPool2()(x), F.max_pool2d(x, 2), equal_nan=True)


@pytest.mark.parametrize("name", ["cnn", "lenet"])
def test_a_model_scores_and_trains_as_with_torchs_pooling(name: str) -> None:
    """The built-in models' logits without gradients are bitwise those of `nn.MaxPool2d(2)`, and
    training (with gradients) runs torch's kernel itself: same gradients, ties included."""
    torch.manual_seed(0)
    model = build_model(name, 1, 28, 10)
    reference = build_model(name, 1, 28, 10)
    reference.load_state_dict(model.state_dict())
    for i, module in enumerate(reference.body):
        if isinstance(module, MaxPool2):
            reference.body[i] = torch.nn.MaxPool2d(2)
    x = torch.rand(16, 1, 28, 28)
    x[:, :, :10] = 0  # a blank background: equal activations, tied windows
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
    y = torch.randint(0, 10, (16,))
    for m in (model, reference):
        F.cross_entropy(m(x), y).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), reference.parameters()))
