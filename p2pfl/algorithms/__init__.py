"""Algorithms as strategies, registered by name.

Each module defines one small `Strategy` subclass and decorates it with `@register`.
Scenario parameters (`[algorithm.params]`) are checked against the class's `__init__`
signature, so a misspelt parameter fails before any node starts.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any, TypeVar

from p2pfl.errors import ConfigError
from p2pfl.runtime.strategy import Strategy

ALGORITHMS: dict[str, type[Strategy]] = {}
_MODULES = ("local", "fedavg", "fedprox", "fedrep", "fedc2i", "pfedsv", "fedfomo", "di")

S = TypeVar("S", bound=type[Strategy])


def register(cls: S) -> S:
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} needs a `name`")
    ALGORITHMS[cls.name] = cls
    return cls


def _load_all() -> None:
    for module in _MODULES:
        try:
            importlib.import_module(f"p2pfl.algorithms.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"p2pfl.algorithms.{module}":
                raise


def available() -> list[str]:
    _load_all()
    return sorted(ALGORITHMS)


def strategy_class(name: str) -> type[Strategy]:
    _load_all()
    if name not in ALGORITHMS:
        raise ConfigError("algorithm.name", f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


def build_strategy(name: str, params: Mapping[str, Any] | None = None) -> Strategy:
    cls = strategy_class(name)
    params = dict(params or {})
    signature = inspect.signature(cls.__init__)
    accepted = {
        k
        for k, p in signature.parameters.items()
        if k != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    for key in params:
        if key not in accepted:
            raise ConfigError(f"algorithm.params.{key}", f"{name} has no parameter {key!r}; it accepts {sorted(accepted) or 'none'}")
    try:
        return cls(**params)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError("algorithm.params", f"{name}: {exc}") from exc
