"""Algorithms as strategies, registered by name: one registration per algorithm.

Each module defines one small `Strategy` subclass and decorates it with `@register`. An
algorithm with a global step names its coordinator half in the class (`coordinator = ...`,
a `CoordinatorHalf`); there is no second registry. Scenario parameters (`[algorithm.params]`)
are checked against the `__init__` signatures of both halves, so a misspelt parameter fails
before any node starts; each half receives the parameters its own signature names.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from typing import Any, TypeVar

from p2pfl.errors import ConfigError
from p2pfl.plugins import is_reference, resolve
from p2pfl.runtime.coordinator_half import CoordinatorEnv, CoordinatorHalf
from p2pfl.runtime.strategy import Strategy

ALGORITHMS: dict[str, type[Strategy]] = {}

S = TypeVar("S", bound=type[Strategy])


def register(cls: S) -> S:
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} needs a `name`")
    ALGORITHMS[cls.name] = cls
    return cls


@functools.cache
def _load_all() -> None:
    """Import every module of this package, once: an algorithm is one file that calls `register`
    (listed again for every node, it was 4.6 % of a 1000-node worker's start-up)."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


def available() -> list[str]:
    _load_all()
    return sorted(ALGORITHMS)


def strategy_class(name: str) -> type[Strategy]:
    """A built-in algorithm by its name, or a user's Strategy subclass by `"package.module:Class"`."""
    if is_reference(name):
        cls = resolve(name, "algorithm.name")
        if not (isinstance(cls, type) and issubclass(cls, Strategy)):
            raise ConfigError("algorithm.name", f"{name!r} is not a subclass of p2pfl.runtime.strategy.Strategy")
        if cls.coordinator is not None and not (isinstance(cls.coordinator, type)
                                                and issubclass(cls.coordinator, CoordinatorHalf)):
            raise ConfigError("algorithm.name", f"{name}.coordinator is not a CoordinatorHalf subclass")
        return cls
    _load_all()
    if name not in ALGORITHMS:
        import difflib

        close = difflib.get_close_matches(name, ALGORITHMS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError("algorithm.name", f"unknown algorithm {name!r}{hint}; choose one of {sorted(ALGORITHMS)}, "
                                            "or name your own Strategy as 'package.module:Class'")
    return ALGORITHMS[name]


def _accepted(init: Any, skip: tuple[str, ...]) -> set[str]:
    return {
        k
        for k, p in inspect.signature(init).parameters.items()
        if k not in skip and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _split_params(name: str, params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the strategy's parameters, the coordinator half's); unknown names are a ConfigError."""
    cls = strategy_class(name)
    node = _accepted(cls.__init__, ("self",))
    half = _accepted(cls.coordinator.__init__, ("self", "env")) if cls.coordinator is not None else set()
    for key in params:
        if key not in node | half:
            raise ConfigError(f"algorithm.params.{key}",
                              f"{name} has no parameter {key!r}; it accepts {sorted(node | half) or 'none'}")
    return {k: v for k, v in params.items() if k in node}, {k: v for k, v in params.items() if k in half}


def _construct(name: str, build: Any) -> Any:
    try:
        return build()
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError("algorithm.params", f"{name}: {exc}") from exc


def build_strategy(name: str, params: Mapping[str, Any] | None = None) -> Strategy:
    """The node half, from the scenario's name and parameters (both halves' are validated)."""
    node_params, half_params = _split_params(name, dict(params or {}))
    cls = strategy_class(name)
    strategy = _construct(name, lambda: cls(**node_params))
    if cls.coordinator is not None and strategy.needs_coordinator:
        _check_half(cls.coordinator, half_params, name)
    return strategy


def _check_half(half: type[CoordinatorHalf], params: Mapping[str, Any], name: str) -> None:
    validate = getattr(half, "validate", None)
    if validate is not None:
        _construct(name, lambda: validate(**params))


def build_coordinator_half(name: str, params: Mapping[str, Any] | None, env: CoordinatorEnv) -> CoordinatorHalf:
    """The coordinator half of `name`, bound to the run."""
    cls = strategy_class(name)
    if cls.coordinator is None:
        raise ConfigError("algorithm.name", f"{name} has no coordinator half")
    _, half_params = _split_params(name, dict(params or {}))
    return _construct(name, lambda: cls.coordinator(env, **half_params))


def needs_coordinator(name: str, params: Mapping[str, Any] | None = None) -> bool:
    """Whether a run of `name` with these parameters starts a coordinator."""
    return build_strategy(name, params).needs_coordinator
