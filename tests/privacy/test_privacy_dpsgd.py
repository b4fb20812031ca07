"""DP-SGD through `LocalTrainer`: accounting, clipping, noise, clean unwrapping, budgets."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import nn

from p2pfl.errors import ConfigError
from p2pfl.models import SplitModel, cnn, part_state
from p2pfl.privacy import DPSGDMechanism, OutputNoiseMechanism, PrivacySpec, build_privacy, prepare_model
from p2pfl.training import LocalTrainer, TrainConfig

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

DELTA = 1e-5
ACCOUNTANTS = {"rdp": RDPAccountant, "prv": PRVAccountant}


def data(n: int, seed: int = 0, shape=(3, 2, 2), classes: int = 3) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(x=torch.randn(n, *shape, generator=g), y=torch.randint(0, classes, (n,), generator=g))


def mlp(hidden: int = 8, inputs: int = 12, classes: int = 3, seed: int = 0) -> SplitModel:
    torch.manual_seed(seed)
    return SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU()), hidden, classes)


def mechanism(n: int, cfg: TrainConfig, rounds: int, seed: int = 0, **privacy) -> DPSGDMechanism:
    spec = PrivacySpec.from_dict({"mode": "dp-sgd", **privacy})
    mech = build_privacy(spec, n_train=n, batch_size=cfg.batch_size, epochs=cfg.epochs, rounds=rounds, seed=seed)
    assert isinstance(mech, DPSGDMechanism)
    return mech


def run_round(trainer: LocalTrainer, mech, model: nn.Module, split, **fit) -> None:
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer.fit(model, split, **fit)
    mech.before_publish(model, start)


def independent_epsilon(kind: str, sigma: float, q: float, steps: int) -> float:
    acc = ACCOUNTANTS[kind]()
    acc.history = [(sigma, q, steps)]
    return acc.get_epsilon(DELTA)


@pytest.mark.parametrize("kind", ["rdp", "prv"])
def test_epsilon_equals_an_independent_accountant_and_grows(kind):
    n, cfg = 40, TrainConfig(epochs=2, batch_size=8, optimizer="sgd", lr=0.1)
    mech = mechanism(n, cfg, rounds=3, noise_multiplier=1.1, accountant=kind)
    model, split = mlp(), data(n)
    trainer = LocalTrainer(cfg, seed=1, privacy=mech)
    assert mech.epsilon() == 0.0
    previous = 0.0
    for r in range(1, 4):
        run_round(trainer, mech, model, split)
        steps = r * 2 * 5  # epochs * ceil(40 / 8) Poisson draws at q = 1/5
        assert mech.steps() == steps
        expected = independent_epsilon(kind, 1.1, 0.2, steps)
        assert mech.epsilon() == pytest.approx(expected, rel=1e-6)
        assert mech.epsilon() > previous
        previous = mech.epsilon()


def test_empty_poisson_batches_are_noise_steps_and_accounted():
    n, cfg = 3, TrainConfig(epochs=3, batch_size=1, optimizer="sgd", lr=0.1)  # q = 1/3: ~30% of draws empty
    mech = mechanism(n, cfg, rounds=2, noise_multiplier=1.0)
    model, split = mlp(), data(n)
    trainer = LocalTrainer(cfg, seed=3, privacy=mech)
    for _ in range(2):
        run_round(trainer, mech, model, split)
    assert mech.empty_steps > 0, "the seed should draw some empty batches"
    assert mech.steps() == 2 * 3 * 3
    assert mech.epsilon() == pytest.approx(independent_epsilon("rdp", 1.0, 1 / 3, 18), rel=1e-9)


def test_epsilon_falls_as_noise_grows():
    n, cfg = 32, TrainConfig(epochs=1, batch_size=8, optimizer="sgd", lr=0.1)
    eps = []
    for sigma in (0.7, 1.4, 2.8):
        mech = mechanism(n, cfg, rounds=2, noise_multiplier=sigma)
        model, split, trainer = mlp(), data(n), LocalTrainer(cfg, seed=0, privacy=mech)
        for _ in range(2):
            run_round(trainer, mech, model, split)
        eps.append(mech.epsilon())
    assert eps[0] > eps[1] > eps[2] > 0


def per_sample_grads(model: nn.Module, split) -> list[torch.Tensor]:
    grads = []
    for i in range(len(split.y)):
        model.zero_grad()
        nn.functional.cross_entropy(model(split.x[i : i + 1]), split.y[i : i + 1]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return grads


@pytest.mark.parametrize("sigma", [0.0, 2.0])
def test_each_sample_gradient_is_clipped_before_it_reaches_the_update(sigma):
    """One SGD step (lr 1) on a full batch of B samples, no Poisson sampling:
    update = -(sum_i clip(g_i, C) + N(0, (sigma C)^2)) / B, with g_i computed here by plain autograd."""
    n, clip = 8, 0.05
    cfg = TrainConfig(epochs=1, batch_size=n, optimizer="sgd", lr=1.0)
    model, split = mlp(hidden=256, classes=10), data(n, classes=10)
    grads = per_sample_grads(copy.deepcopy(model), split)
    norms = torch.stack([g.norm() for g in grads])
    assert (norms > 4 * clip).all(), "the test needs gradients that clipping changes"
    clipped_mean = torch.stack([g * min(1.0, clip / (g.norm().item() + 1e-6)) for g in grads]).mean(0)
    plain_mean = torch.stack(grads).mean(0)

    mech = mechanism(n, cfg, rounds=1, noise_multiplier=sigma, max_grad_norm=clip, poisson_sampling=False)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    LocalTrainer(cfg, seed=0, privacy=mech).fit(model, split)
    update = torch.cat([p.detach().flatten() for p in model.parameters()]) - before
    residual = update + clipped_mean  # what is left once the clipped gradient is taken out: the noise / B
    if sigma == 0:
        torch.testing.assert_close(update, -clipped_mean, atol=1e-6, rtol=1e-4)
        assert update.norm() <= clip * (1 + 1e-4)  # lr * C bounds the step, per sample and so on average
        assert (update + plain_mean).norm() > clip, "an unclipped step would have been detected"
    else:
        assert residual.std().item() == pytest.approx(sigma * clip / n, rel=0.05)
        assert abs(residual.mean().item()) < 0.05 * sigma * clip / n


def hook_count(model: nn.Module) -> int:
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return sum(len(getattr(m, kind)) for m in model.modules() for kind in kinds)


def opacus_leftovers(model: nn.Module) -> list[str]:
    found = [f"param.{a}" for p in model.parameters()
             for a in ("grad_sample", "summed_grad", "_forward_counter", "_current_grad_sample") if hasattr(p, a)]
    found += [f"module.{a}" for m in model.modules()
              for a in ("activations", "max_batch_len", "autograd_grad_sample_hooks") if a in m.__dict__]
    return found


def test_repeated_rounds_leave_the_plain_module_without_hooks():
    n, cfg = 24, TrainConfig(epochs=1, batch_size=8, optimizer="adam", lr=1e-3)
    torch.manual_seed(0)
    fresh = cnn(3, 8, 4, width=4)
    keys = list(fresh.state_dict())
    mech = mechanism(n, cfg, rounds=5, noise_multiplier=1.0)
    model = prepare_model(fresh, mech)
    assert model is fresh  # nothing to fix in the project's models
    split = data(n, shape=(3, 8, 8), classes=4)
    baseline = hook_count(model)

    wrapped, _, _ = mech.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                      LocalTrainer(cfg).loader(split), 1)
    assert hook_count(model) > baseline and list(wrapped.state_dict())[0].startswith("_module.")
    mech.release(wrapped)
    assert hook_count(model) == baseline and not opacus_leftovers(model)

    trainer = LocalTrainer(cfg, seed=0, privacy=mech)
    for _ in range(5):
        run_round(trainer, mech, model, split)
        assert hook_count(model) == baseline
        assert not opacus_leftovers(model)
        assert list(part_state(model, "full")) == keys
    assert isinstance(model, SplitModel) and mech.steps() == 5 * 3  # the bare wrap above took no step


def test_regularizer_gradient_survives_private_optimizer():
    """FedProx-style term: its gradient must be applied on top of the clipped, noised data gradient."""
    n, clip, mu = 8, 1e-3, 1.0
    cfg = TrainConfig(epochs=1, batch_size=n, optimizer="sgd", lr=0.1)
    model, split = mlp(), data(n)
    anchor = {k: v.detach() + 1.0 for k, v in model.named_parameters()}

    def proximal(m: nn.Module) -> torch.Tensor:
        return mu / 2 * sum(((p - anchor[k]) ** 2).sum() for k, p in m.named_parameters())

    mech = mechanism(n, cfg, rounds=1, noise_multiplier=0.0, max_grad_norm=clip, poisson_sampling=False)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    LocalTrainer(cfg, privacy=mech).fit(model, split, regularizer=proximal)
    for k, p in model.named_parameters():  # the pull toward the anchor is lr * mu = 0.1 per coordinate
        torch.testing.assert_close(p.detach() - before[k], torch.full_like(p, cfg.lr * mu), atol=cfg.lr * clip * 1.01, rtol=0)


def test_target_epsilon_is_met_after_the_planned_rounds():
    n, rounds, target = 32, 3, 4.0
    cfg = TrainConfig(epochs=2, batch_size=8, optimizer="sgd", lr=0.05)
    mech = mechanism(n, cfg, rounds=rounds, target_epsilon=target)
    model, split, trainer = mlp(), data(n), LocalTrainer(cfg, seed=2, privacy=mech)
    for _ in range(rounds):
        run_round(trainer, mech, model, split)
    assert mech.epsilon() <= target + 1e-9
    assert mech.epsilon() == pytest.approx(target, abs=0.02)


def test_exhausted_flips_before_the_budget_is_exceeded():
    n, sigma = 32, 1.0
    cfg = TrainConfig(epochs=1, batch_size=8, optimizer="sgd", lr=0.05)
    per_round = 4
    eps2, eps3 = (independent_epsilon("rdp", sigma, 0.25, r * per_round) for r in (2, 3))
    budget = (eps2 + eps3) / 2
    mech = mechanism(n, cfg, rounds=10, noise_multiplier=sigma, epsilon_budget=budget)
    model, split, trainer = mlp(), data(n), LocalTrainer(cfg, seed=0, privacy=mech)
    done = 0
    while not mech.exhausted():
        run_round(trainer, mech, model, split)
        done += 1
        assert mech.epsilon() <= budget
        assert done < 10
    assert done == 2
    assert independent_epsilon("rdp", sigma, 0.25, (done + 1) * per_round) > budget


def test_prepare_model_fixes_batchnorm_and_names_what_cannot_be_fixed():
    torch.manual_seed(0)
    bn = SplitModel(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten()), 16, 3)
    fixed = prepare_model(bn)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fixed.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in fixed.modules())
    mech = mechanism(8, TrainConfig(epochs=1, batch_size=4, optimizer="sgd", lr=0.1), rounds=1, noise_multiplier=1.0)
    LocalTrainer(TrainConfig(epochs=1, batch_size=4, optimizer="sgd", lr=0.1), privacy=mech).fit(
        fixed, data(8, shape=(3, 4, 4)))

    class Scaled(nn.Module):  # a trainable layer with a buffer: Opacus cannot make it private
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))
            self.register_buffer("seen", torch.zeros(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.weight

    bad = SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(12, 4), Scaled()), 4, 3)
    with pytest.raises(ConfigError) as info:
        prepare_model(bad, mech)
    assert info.value.field == "privacy.mode" and "Scaled" in str(info.value)
    out = OutputNoiseMechanism(noise_multiplier=1.0, clip_norm=1.0, delta=DELTA)
    assert prepare_model(bn, out) is bn  # output noise needs no per-sample gradients
