"""The scenario's `[privacy]` table.

    mode              "none" | "dp-sgd" | "output-noise"                        default "none"
    noise_multiplier  sigma: noise std / sensitivity (DP-SGD: / max_grad_norm;
                      output noise: the std is sigma * clip_norm)              default unset
    target_epsilon    epsilon for the whole run; sigma is derived from it        default unset
    delta             the run's delta                                           default 1e-5
    accountant        "rdp" | "prv" (Opacus accountants)                        default "rdp"
    epsilon_budget    a node stops before a round that would exceed it          default unset
    max_grad_norm     DP-SGD per-sample clipping bound C                        default 1.0
    clip_norm         output noise: L2 bound on the published update            default 1.0
    poisson_sampling  DP-SGD batches drawn by Poisson sampling                  default true

A private mode needs exactly one of `noise_multiplier` and `target_epsilon`. With mode
"none", setting `noise_multiplier`, `target_epsilon` or `epsilon_budget` is an error (it
would silently do nothing). Fields that belong to the other mode are accepted (so a
resolved scenario, which lists every field, loads again) and ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from p2pfl.errors import ConfigError, check_table

MODES = ("none", "dp-sgd", "output-noise")
ACCOUNTANTS = ("rdp", "prv")


@dataclass(frozen=True)
class PrivacySpec:
    mode: str = "none"
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    delta: float = 1e-5
    accountant: str = "rdp"
    epsilon_budget: float | None = None
    max_grad_norm: float = 1.0
    clip_norm: float = 1.0
    poisson_sampling: bool = True

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @classmethod
    def from_dict(cls, d: Any, prefix: str = "privacy") -> PrivacySpec:
        check_table(d, [f.name for f in fields(cls)], prefix)

        def where(key: str) -> str:
            return f"{prefix}.{key}"

        def number(key: str, *, optional: bool) -> float | None:
            if key not in d or (optional and d[key] is None):
                return None
            value = d[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(where(key), f"expected a number, got {type(value).__name__} {value!r}")
            value = float(value)
            if not math.isfinite(value):
                raise ConfigError(where(key), f"must be finite, got {value}")
            return value

        def choice(key: str, options: tuple[str, ...], default: str) -> str:
            value = d.get(key, default)
            if not isinstance(value, str):
                raise ConfigError(where(key), f"expected a string, got {type(value).__name__} {value!r}")
            if value not in options:
                raise ConfigError(where(key), f"unknown value {value!r}; choose one of {list(options)}")
            return value

        mode = choice("mode", MODES, cls.mode)
        accountant = choice("accountant", ACCOUNTANTS, cls.accountant)
        noise = number("noise_multiplier", optional=True)
        target = number("target_epsilon", optional=True)
        budget = number("epsilon_budget", optional=True)
        delta = number("delta", optional=False)
        max_grad_norm = number("max_grad_norm", optional=False)
        clip_norm = number("clip_norm", optional=False)
        poisson = d.get("poisson_sampling", cls.poisson_sampling)
        if not isinstance(poisson, bool):
            raise ConfigError(where("poisson_sampling"), f"expected a boolean, got {type(poisson).__name__} {poisson!r}")

        if noise is not None and noise < 0:
            raise ConfigError(where("noise_multiplier"), f"must be >= 0, got {noise}")
        if target is not None and not target > 0:
            raise ConfigError(where("target_epsilon"), f"must be > 0, got {target}")
        if budget is not None and not budget > 0:
            raise ConfigError(where("epsilon_budget"), f"must be > 0, got {budget}")
        if delta is None:
            delta = cls.delta
        elif not 0 < delta < 1:
            raise ConfigError(where("delta"), f"must be in (0, 1), got {delta}")
        if max_grad_norm is None:
            max_grad_norm = cls.max_grad_norm
        elif not max_grad_norm > 0:
            raise ConfigError(where("max_grad_norm"), f"must be > 0, got {max_grad_norm}")
        if clip_norm is None:
            clip_norm = cls.clip_norm
        elif not clip_norm > 0:
            raise ConfigError(where("clip_norm"), f"must be > 0, got {clip_norm}")

        if mode == "none":
            for key, value in (("noise_multiplier", noise), ("target_epsilon", target), ("epsilon_budget", budget)):
                if value is not None:
                    raise ConfigError(where(key), f"has no effect with {prefix}.mode = 'none'; set {prefix}.mode too")
        else:
            if noise is None and target is None:
                raise ConfigError(where("noise_multiplier"), f"mode {mode!r} needs noise_multiplier or target_epsilon")
            if noise is not None and target is not None:
                raise ConfigError(where("target_epsilon"), "set noise_multiplier or target_epsilon, not both")
        return cls(
            mode=mode, noise_multiplier=noise, target_epsilon=target, delta=delta, accountant=accountant,
            epsilon_budget=budget, max_grad_norm=max_grad_norm, clip_norm=clip_norm, poisson_sampling=poisson,
        )
