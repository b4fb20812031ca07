"""Bring your own model and data: `"package.module:name"` in a scenario names a callable.

    [model]  name = "mypkg.models:resnet"      # (in_channels, image_size, num_classes) -> SplitModel,
                                               # or -> (nn.Module, "name of its final nn.Linear")
    [data]   dataset = "mypkg.data:load"       # () -> (x, y) or {"x", "y", "domain", "domains"}

The module must be importable where the nodes run (installed, or on PYTHONPATH). Errors name
the scenario field: a module that does not import, a name it lacks, a wrong return type.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from p2pfl.errors import ConfigError


def is_reference(name: str) -> bool:
    return ":" in name


def resolve(reference: str, field: str) -> Callable[..., Any]:
    """The callable `module:attribute` names; a ConfigError for `field` when there is none."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigError(field, f"expected 'package.module:name', got {reference!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import error inside the user's module is theirs to read
        raise ConfigError(field, f"cannot import {module_name!r}: {exc!r}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(field, f"module {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(field, f"{reference!r} is a {type(target).__name__}, not a callable")
    return target


def call(reference: str, field: str, **kwargs: Any) -> Any:
    """Resolve `reference` and call it; its own failure becomes a ConfigError naming `field`."""
    function = resolve(reference, field)
    try:
        return function(**kwargs)
    except Exception as exc:
        raise ConfigError(field, f"{reference} failed: {exc!r}") from None
