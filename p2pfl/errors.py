"""Errors shared across layers. Kept dependency-free so every package may import it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A scenario or node-config value is wrong. `field` is the dotted path of the bad field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")
