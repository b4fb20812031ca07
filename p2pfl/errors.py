"""Errors shared across layers. Kept dependency-free so every package may import it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


class ConfigError(ValueError):
    """A scenario or node-config value is wrong. `field` is the dotted path of the bad field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def check_table(table: object, allowed: Iterable[str], prefix: str) -> Mapping[str, Any]:
    """`table` as a mapping whose keys are all in `allowed`, else a ConfigError naming the field.

    `prefix` is the dotted path of the table itself ("" for the top level), so an unknown key
    `k` is reported as `prefix.k`: every scenario and node-config table is checked alike.
    """
    if not isinstance(table, Mapping):
        raise ConfigError(prefix, f"expected a table, got {type(table).__name__}")
    names = sorted(allowed)
    for key in table:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{prefix}.{key}" if prefix else str(key), f"unknown field; {hint}allowed fields are {names}")
    return table
