"""Differential privacy for a node: DP-SGD through Opacus, or pFedSV's output noise.

    spec = PrivacySpec.from_dict(raw["privacy"])             # the scenario's [privacy] table
    mech = build_privacy(spec, n_train=..., batch_size=..., epochs=..., rounds=..., seed=...)
    model = prepare_model(model, mech)                       # once, on the fresh model
    trainer = LocalTrainer(cfg, privacy=mech)
    each round: if mech.exhausted(): stop
                trainer.fit(model, split)                    # make_private / release around it
                mech.before_publish(model, round_start)      # output noise; closes the round
                mech.epsilon()                               # cumulative, at the run's delta

Both mechanisms keep one Opacus accountant per node for the whole run. `epsilon()` is 0.0
before any private step and inf with noise_multiplier = 0.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from p2pfl.errors import ConfigError
from p2pfl.privacy.spec import ACCOUNTANTS, MODES, PrivacySpec

if TYPE_CHECKING:
    from torch import nn

    from p2pfl.privacy.dpsgd import DPSGDMechanism
    from p2pfl.privacy.output_noise import OutputNoiseMechanism

log = logging.getLogger("p2pfl.privacy")

# Opacus takes seconds to import: scenario validation, the launcher and reports only need
# PrivacySpec, so the mechanisms are imported on first use.
_LAZY = {
    "DPSGDMechanism": "dpsgd", "planned_round": "dpsgd", "strip_opacus": "dpsgd",
    "OutputNoiseMechanism": "output_noise", "SENSITIVITY_FACTOR": "output_noise", "clip_and_noise": "output_noise",
    "epsilon_of": "accounting", "noise_for_target": "accounting",
}

__all__ = ["ACCOUNTANTS", "MODES", "PrivacySpec", "build_privacy", "prepare_model", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"p2pfl.privacy.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'p2pfl.privacy' has no attribute {name!r}")


def build_privacy(
    spec: PrivacySpec | None, *, n_train: int, batch_size: int, epochs: int, rounds: int, seed: int
) -> DPSGDMechanism | OutputNoiseMechanism | None:
    """The node's mechanism, or None for mode "none". With `target_epsilon`, sigma is chosen
    (Opacus' `get_noise_multiplier`) so that epsilon after `rounds` planned rounds is at most
    the target (and within 0.01 of it)."""
    if spec is None or spec.mode == "none":
        return None
    from p2pfl.privacy.dpsgd import DPSGDMechanism, planned_round
    from p2pfl.privacy.output_noise import SENSITIVITY_FACTOR, OutputNoiseMechanism

    if spec.mode == "dp-sgd":
        sample_rate, round_steps = planned_round(n_train, batch_size, epochs, spec.poisson_sampling)
        sigma = spec.noise_multiplier
        if sigma is None:
            sigma = _noise_for_target(spec, sample_rate, rounds * round_steps)
        if n_train > 0 and spec.delta >= 1 / n_train:
            log.warning("privacy.delta = %g is not below 1/n_train = %g: the guarantee is weak", spec.delta, 1 / n_train)
        return DPSGDMechanism(
            noise_multiplier=sigma, max_grad_norm=spec.max_grad_norm, delta=spec.delta, accountant=spec.accountant,
            epsilon_budget=spec.epsilon_budget, poisson_sampling=spec.poisson_sampling,
            sample_rate=sample_rate, round_steps=round_steps, seed=seed,
        )
    if spec.mode == "output-noise":
        sigma = spec.noise_multiplier
        if sigma is None:
            sigma = SENSITIVITY_FACTOR * _noise_for_target(spec, 1.0, rounds)
        return OutputNoiseMechanism(
            noise_multiplier=sigma, clip_norm=spec.clip_norm, delta=spec.delta, accountant=spec.accountant,
            epsilon_budget=spec.epsilon_budget, seed=seed,
        )
    raise ConfigError("privacy.mode", f"unknown mode {spec.mode!r}; choose one of {list(MODES)}")


def _noise_for_target(spec: PrivacySpec, sample_rate: float, steps: int) -> float:
    from p2pfl.privacy.accounting import noise_for_target

    assert spec.target_epsilon is not None
    try:
        return noise_for_target(spec.target_epsilon, spec.delta, sample_rate, steps, spec.accountant)
    except ValueError as exc:
        raise ConfigError("privacy.target_epsilon", f"cannot derive noise_multiplier: {exc}") from exc


def prepare_model(model: nn.Module, mechanism: object | None = None) -> nn.Module:
    """Make a fresh model Opacus-compatible, once, before the first round.

    Runs `ModuleValidator.fix` (BatchNorm -> GroupNorm, LSTM -> DPLSTM, ...; this changes the
    state-dict keys, identically on every node) only when the model needs it, then checks
    the result with Opacus' validators and raises `ConfigError("privacy.mode", ...)` naming
    every offending layer. Returns the model to use (the same object when nothing changed).
    With a mechanism that is not DP-SGD the model is returned untouched; without one
    (`mechanism=None`) DP-SGD compatibility is assumed to be wanted.
    """
    if mechanism is not None and getattr(mechanism, "mode", None) != "dp-sgd":
        return model
    from opacus.grad_sample import GradSampleModule
    from opacus.validators import ModuleValidator

    model.train()
    if ModuleValidator.validate(model, strict=False):
        fixed = ModuleValidator.fix(model)
        log.info("ModuleValidator.fix replaced layers Opacus cannot train privately")
    else:
        fixed = model
    problems = [str(e) for e in ModuleValidator.validate(fixed, strict=False)]
    problems += [str(e) for e in GradSampleModule.validate(fixed, strict=False)]
    if problems:
        raise ConfigError(
            "privacy.mode",
            "the model cannot be trained with DP-SGD, even after opacus' ModuleValidator.fix: " + "; ".join(problems),
        )
    return fixed
