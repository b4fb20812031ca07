"""Output noise (pFedSV V-B): clipping of the round update, noise scale, accounting."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import nn

from p2pfl.models import SplitModel
from p2pfl.privacy import OutputNoiseMechanism, PrivacySpec, build_privacy
from p2pfl.training import LocalTrainer, TrainConfig

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")

DELTA = 1e-5


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([v.flatten() for v in model.state_dict().values()])


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def mech(sigma: float, clip: float, **kw) -> OutputNoiseMechanism:
    return OutputNoiseMechanism(noise_multiplier=sigma, clip_norm=clip, delta=DELTA, **kw)


def test_large_update_is_clipped_to_clip_norm_and_keeps_its_direction():
    torch.manual_seed(0)
    model = SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU()), 16, 3)
    start = snapshot(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    delta = flat(model) - torch.cat([v.flatten() for v in start.values()])
    assert delta.norm() > 5
    m = mech(0.0, 0.5)
    m.before_publish(model, start)
    published = flat(model) - torch.cat([v.flatten() for v in start.values()])
    assert published.norm().item() == pytest.approx(0.5, rel=1e-5)
    assert torch.nn.functional.cosine_similarity(published, delta, dim=0).item() == pytest.approx(1.0, abs=1e-6)
    assert m.last_update_norm == pytest.approx(delta.norm().item(), rel=1e-5)


def test_small_update_is_left_alone_without_noise():
    model = nn.Linear(10, 10)
    start = snapshot(model)
    with torch.no_grad():
        model.weight[0, 0] += 0.1
    expected = flat(model).clone()
    mech(0.0, 1.0).before_publish(model, start)
    torch.testing.assert_close(flat(model), expected)


def test_noise_std_is_sigma_times_clip_norm():
    model = nn.Linear(1000, 400)  # ~400k coordinates
    start = snapshot(model)
    sigma, clip = 0.7, 1.5
    mech(sigma, clip, seed=3).before_publish(model, start)  # zero update: what moves is the noise
    noise = flat(model) - torch.cat([v.flatten() for v in start.values()])
    assert noise.std().item() == pytest.approx(sigma * clip, rel=0.01)
    assert abs(noise.mean().item()) < 0.01
    other = nn.Linear(1000, 400)
    other.load_state_dict(start)
    mech(sigma, clip, seed=4).before_publish(other, start)
    assert not torch.equal(flat(other), flat(model)), "nodes with different seeds draw different noise"


@pytest.mark.parametrize(("kind", "cls"), [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_epsilon_is_a_composition_of_gaussian_mechanisms_with_sensitivity_two_clip_norm(kind, cls):
    sigma, clip = 1.2, 1.0
    m = mech(sigma, clip, accountant=kind)
    model = nn.Linear(4, 2)
    assert m.epsilon() == 0.0
    previous = 0.0
    for r in range(1, 4):
        m.before_publish(model, snapshot(model))
        acc = cls()
        acc.history = [(sigma / 2, 1.0, r)]  # std sigma*C over sensitivity 2C
        assert m.epsilon() == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)
        assert m.epsilon() > previous
        previous = m.epsilon()
    assert mech(2 * sigma, clip, accountant=kind).epsilon() == 0.0
    louder = mech(2 * sigma, clip, accountant=kind)
    for _ in range(3):
        louder.before_publish(model, snapshot(model))
    assert louder.epsilon() < m.epsilon()


def test_budget_and_target_epsilon():
    rdp = RDPAccountant()
    rdp.history = [(0.5, 1.0, 2)]
    eps2 = rdp.get_epsilon(DELTA)
    rdp.history = [(0.5, 1.0, 3)]
    eps3 = rdp.get_epsilon(DELTA)
    m = mech(1.0, 1.0, epsilon_budget=(eps2 + eps3) / 2)
    model, published = nn.Linear(4, 2), 0
    while not m.exhausted():
        m.before_publish(model, snapshot(model))
        published += 1
        assert published < 10
    assert published == 2 and m.epsilon() <= m.epsilon_budget

    spec = PrivacySpec.from_dict({"mode": "output-noise", "target_epsilon": 6.0, "clip_norm": 2.0})
    target = build_privacy(spec, n_train=50, batch_size=10, epochs=1, rounds=5, seed=0)
    assert isinstance(target, OutputNoiseMechanism)
    for _ in range(5):
        target.before_publish(model, snapshot(model))
    assert target.epsilon() <= 6.0 + 1e-9
    assert target.epsilon() == pytest.approx(6.0, abs=0.02)


def test_through_the_trainer_the_model_is_not_wrapped_and_published_in_place():
    torch.manual_seed(0)
    model = SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU()), 8, 3)
    keys = list(model.state_dict())
    split = SimpleNamespace(x=torch.randn(16, 3, 2, 2), y=torch.randint(0, 3, (16,)))
    m = mech(0.0, 1e-3)
    trainer = LocalTrainer(TrainConfig(epochs=2, batch_size=4, optimizer="sgd", lr=0.5), privacy=m)
    start = snapshot(model)
    trainer.fit(model, split)
    assert m.last_update_norm is None
    m.before_publish(model, start)
    assert m.last_update_norm > 1e-3
    moved = flat(model) - torch.cat([v.flatten() for v in start.values()])
    assert moved.norm().item() == pytest.approx(1e-3, rel=1e-4)
    assert list(model.state_dict()) == keys
