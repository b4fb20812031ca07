"""FedC2I's leave-one-out influence against the definition computed the slow way.

The references build every leave-one-out model explicitly (copy.deepcopy + load_state_dict)
and run a full forward pass per model: M of them for λ, M·C for Λ.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from p2pfl.core import influence as inf
from p2pfl.core.influence import (
    InfluenceError, class_influence, client_influence, combine_heads, combine_states, eval_features,
    influence_weights,
)
from p2pfl.models import SplitModel, cnn, part_state

CLASSES = 3


def mlp(seed: int = 0) -> SplitModel:
    torch.manual_seed(seed)
    return SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 6), nn.ReLU()), 6, CLASSES)


def perturbed(model: SplitModel, seed: int, scale: float = 0.1) -> SplitModel:
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Separable toy data: class c is a Gaussian blob around centre c (8-dimensional)."""
    g = torch.Generator().manual_seed(seed)
    centres = 3.0 * torch.randn(CLASSES, 8, generator=torch.Generator().manual_seed(123))
    y = torch.randint(CLASSES, (n,), generator=g)
    return centres[y] + 0.5 * torch.randn(n, 8, generator=g), y


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 60) -> nn.Module:
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def loss_of(model: nn.Module, state: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    clone = copy.deepcopy(model)
    clone.load_state_dict(state)
    clone.eval()
    with torch.no_grad():
        return float(F.cross_entropy(clone(x), y))


def naive_lambda(models: list[SplitModel], x: torch.Tensor, y: torch.Tensor, gamma: float) -> tuple[list[float], list[float]]:
    """Eq. 4-5 with M explicit forward passes; models[0] is node m (its head is φ_m)."""
    own = models[0].state_dict()
    losses = []
    for i in range(len(models)):
        others = [m.state_dict() for j, m in enumerate(models) if j != i]
        state = {k: (torch.stack([o[k] for o in others]).mean(0) if k.startswith("body.") else v.clone())
                 for k, v in own.items()}
        losses.append(loss_of(models[0], state, x, y))
    powered = [loss**gamma for loss in losses]
    return losses, [p / sum(powered) for p in powered]


def naive_Lambda(models: list[SplitModel], x: torch.Tensor, y: torch.Tensor, gamma: float) -> tuple[list[list[float]], list[list[float]]]:
    """Eq. 7-9 with M·C explicit forward passes (body included) on node m's model."""
    own = models[0].state_dict()
    losses = [[0.0] * CLASSES for _ in models]
    for i in range(len(models)):
        others = [m.state_dict() for j, m in enumerate(models) if j != i]
        for c in range(CLASSES):
            state = {k: v.clone() for k, v in own.items()}
            state["head.weight"][c] = torch.stack([o["head.weight"][c] for o in others]).mean(0)
            state["head.bias"][c] = torch.stack([o["head.bias"][c] for o in others]).mean(0)
            losses[i][c] = loss_of(models[0], state, x, y)
    weights = [[0.0] * CLASSES for _ in models]
    for c in range(CLASSES):
        total = sum(losses[i][c] ** gamma for i in range(len(models)))
        for i in range(len(models)):
            weights[i][c] = losses[i][c] ** gamma / total
    return losses, weights


def fast(models: list[SplitModel], x: torch.Tensor, y: torch.Tensor, gamma: float):
    own = models[0]
    lam = client_influence(own, [part_state(m, "body") for m in models], part_state(own, "head"), x, y, gamma)
    Lam = class_influence(eval_features(own.body, x), [part_state(m, "head") for m in models], y, gamma)
    return lam, Lam


@pytest.fixture(scope="module")
def trained():
    """Own model trained on the toy task, a peer trained from the same start on other samples,
    a weaker peer (fewer steps), and one whose parameters are pure noise."""
    start = mlp(0)
    x, y = blobs(96, 1)
    own = train(copy.deepcopy(start), x, y)
    good = train(copy.deepcopy(start), *blobs(96, 2))
    weak = train(copy.deepcopy(start), *blobs(96, 3), steps=10)
    noise = perturbed(mlp(5), 6, 3.0)
    return {"own": own, "good": good, "weak": weak, "noise": noise, "batch": blobs(64, 4)}


@pytest.mark.parametrize("gamma", [0.5, 1.0, 5.0])
def test_lambda_and_Lambda_equal_the_leave_one_out_definition(trained, gamma):
    # In float64, so that the comparison is not limited by float32 cross-entropies near 0
    # (the trained models reach losses of 1e-4, where float32 keeps ~3 digits and γ = 5
    # multiplies the relative error by 5).
    models = [copy.deepcopy(trained[k]).double() for k in ("own", "good", "weak", "noise")]
    x, y = trained["batch"]
    x = x.double()
    lam, Lam = fast(models, x, y, gamma)
    ref_losses, ref_w = naive_lambda(models, x, y, gamma)
    assert lam.losses.tolist() == pytest.approx(ref_losses, rel=1e-9)
    assert lam.weights.tolist() == pytest.approx(ref_w, rel=1e-8)
    ref_closses, ref_cw = naive_Lambda(models, x, y, gamma)
    assert Lam.weights.shape == (4, CLASSES)
    assert torch.allclose(Lam.losses, torch.tensor(ref_closses, dtype=torch.float64), rtol=1e-9, atol=0)
    assert torch.allclose(Lam.weights, torch.tensor(ref_cw, dtype=torch.float64), rtol=1e-8, atol=0)


def test_conv_model_under_vmap_matches_the_definition():
    """The real CNN (conv, pooling, flatten) goes through vmap without falling back."""
    base = cnn(1, 8, CLASSES)
    models = [base] + [perturbed(base, s, 0.05) for s in (1, 2, 3, 4)]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 8, 8, generator=g), torch.randint(CLASSES, (16,), generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the loop fallback warns: it must not be taken
        lam, Lam = fast(models, x, y, 5.0)
    assert lam.losses.tolist() == pytest.approx(naive_lambda(models, x, y, 5.0)[0], rel=1e-5)
    assert torch.allclose(Lam.losses, torch.tensor(naive_Lambda(models, x, y, 5.0)[0], dtype=torch.float64), rtol=1e-5)


def test_loop_fallback_gives_the_same_losses(trained, monkeypatch):
    models = [trained["own"], trained["good"], trained["noise"]]
    x, y = trained["batch"]
    batched = fast(models, x, y, 2.0)[0]

    def no_vmap(*args, **kwargs):
        raise RuntimeError("no batching rule")

    monkeypatch.setattr(inf.torch, "vmap", no_vmap)
    with pytest.warns(RuntimeWarning, match="one at a time"):
        looped = fast(models, x, y, 2.0)[0]
    assert torch.allclose(batched.losses, looped.losses, rtol=1e-6)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0, 10.0])
def test_weights_sum_to_one(trained, gamma):
    models = [trained["own"], trained["good"], trained["weak"], trained["noise"]]
    lam, Lam = fast(models, *trained["batch"], gamma)
    assert float(lam.weights.sum()) == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(Lam.weights.sum(0), torch.ones(CLASSES, dtype=torch.float64), atol=1e-12)
    assert (lam.weights >= 0).all() and (Lam.weights >= 0).all()


def test_gamma_zero_is_uniform(trained):
    models = [trained["own"], trained["good"], trained["noise"]]
    lam, Lam = fast(models, *trained["batch"], 0.0)
    assert torch.equal(lam.weights, torch.full((3,), 1 / 3, dtype=torch.float64))
    assert torch.equal(Lam.weights, torch.full((3, CLASSES), 1 / 3, dtype=torch.float64))


def test_a_noise_model_gets_less_weight_than_a_good_one(trained):
    """Leaving the good peer out (averaging in the noise) raises the loss; leaving the noise out lowers it."""
    x, y = trained["batch"]
    own, good = trained["own"], trained["good"]
    assert loss_of(own, own.state_dict(), x, y) < 0.1  # "good" is real: the toy task is learnt
    lam, Lam = fast([own, good, trained["noise"]], x, y, 5.0)
    assert lam.weights[1] > lam.weights[2]
    assert (Lam.weights[1] > Lam.weights[2]).all()
    # A larger gamma sharpens the same ranking.
    sharp = fast([own, good, trained["noise"]], x, y, 10.0)[0]
    assert sharp.weights[2] < lam.weights[2]


def test_one_model_gets_weight_one(trained):
    own = trained["own"]
    x, y = trained["batch"]
    lam, Lam = fast([own], x, y, 5.0)
    assert lam.weights.tolist() == [1.0] and lam.losses is None
    assert torch.equal(Lam.weights, torch.ones(1, CLASSES, dtype=torch.float64)) and Lam.losses is None
    body = combine_states([part_state(own, "body")], lam.weights)
    assert all(torch.equal(v, part_state(own, "body")[k]) for k, v in body.items())


def test_weights_from_zero_nan_and_negative_losses():
    assert influence_weights([0.0, 0.0, 0.0], 5.0).tolist() == pytest.approx([1 / 3] * 3)
    assert influence_weights([0.0, 1.0], 2.0).tolist() == pytest.approx([0.0, 1.0])
    assert influence_weights([1e-30, 2e-30], 1.0).tolist() == pytest.approx([1 / 3, 2 / 3])
    # Large gamma does not overflow: the quotient is computed in log space.
    assert influence_weights([200.0, 100.0], 200.0).tolist() == pytest.approx([1.0, 0.0])
    with pytest.raises(InfluenceError, match="non-finite"):
        influence_weights([1.0, float("nan")], 5.0)
    with pytest.raises(InfluenceError, match="non-finite"):
        influence_weights([1.0, float("inf")], 5.0)
    with pytest.raises(InfluenceError, match="negative"):
        influence_weights([1.0, -0.5], 5.0)
    with pytest.raises(ValueError, match="gamma"):
        influence_weights([1.0, 2.0], -1.0)


def test_combine_matches_explicit_sums(trained):
    models = [trained["own"], trained["good"], trained["noise"]]
    lam = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    Lam = torch.tensor([[0.2, 0.5, 0.6], [0.7, 0.1, 0.3], [0.1, 0.4, 0.1]], dtype=torch.float64)
    bodies = [part_state(m, "body") for m in models]
    body = combine_states(bodies, lam)
    for k in bodies[0]:
        expected = sum(float(w) * b[k].double() for w, b in zip(lam, bodies))
        assert torch.allclose(body[k].double(), expected, atol=1e-6)
    heads = [part_state(m, "head") for m in models]
    head = combine_heads(heads, Lam)
    for c in range(CLASSES):
        row = sum(float(Lam[i, c]) * heads[i]["head.weight"][c].double() for i in range(3))
        bias = sum(float(Lam[i, c]) * heads[i]["head.bias"][c].double() for i in range(3))
        assert torch.allclose(head["head.weight"][c].double(), row, atol=1e-6)
        assert float(head["head.bias"][c]) == pytest.approx(float(bias), abs=1e-6)
