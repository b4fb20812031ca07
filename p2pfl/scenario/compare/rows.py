"""A comparison's rows as `--algorithms` writes them: `fedavg,fedc2i[gamma=1],fedc2i[gamma=0.5|1|2]`
(a sweep row is one row per value, chosen among on validation), and each row's raw scenario."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from p2pfl.errors import ConfigError
from p2pfl.runtime.run_folder import row_slug
from p2pfl.scenario.schema import apply_values, parse_override


@dataclass(frozen=True)
class Row:
    """One table row: an algorithm, its parameters, and scenario overrides (keys with a dot)."""

    label: str
    algorithm: str
    params: Mapping[str, Any] = field(default_factory=dict)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    # A sweep row (`gamma=0.5|1|2`): the swept key and one row per value, chosen among on validation.
    sweep_key: str | None = None
    candidates: tuple[Row, ...] = ()

    @property
    def slug(self) -> str:
        return row_slug(self.label)

    def runs(self) -> tuple[Row, ...]:
        """The rows whose runs this row needs: its candidates, or itself."""
        return self.candidates or (self,)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_algorithms(text: str) -> list[Row]:
    """`fedavg,fedc2i[gamma=1,variant=-lambda],pfedsv[privacy.noise_multiplier=1]` -> rows.

    Inside brackets a plain key is an algorithm parameter; a dotted key overrides the
    scenario for that row (privacy noise, data split, ...), and a key set to an inline table
    replaces that whole table of the scenario: `local[privacy={mode="none"}]` is Local with
    privacy off, whatever `[privacy]` the scenario has.
    """
    return [_parse_row(token) for token in _split_top_level(text)]


def _is_sweep(item: str) -> bool:
    value = item.split("=", 1)[1].strip() if "=" in item else ""
    return "|" in value and not value.startswith(("\"", "'", "[", "{"))


def _parse_row(token: str) -> Row:
    # A built-in's name, or a user's strategy as "package.module:Class".
    match = re.fullmatch(r"([A-Za-z0-9_+-]+|[A-Za-z_][\w.]*:[A-Za-z_]\w*)(?:\[(.*)\])?", token)
    if not match:
        raise ConfigError("--algorithms", f"cannot parse {token!r}; expected name, package.module:Class, "
                                          "or either with [key=value,...]")
    name, items = match.group(1), _split_top_level(match.group(2) or "")
    swept = [i for i, item in enumerate(items) if _is_sweep(item)]
    if len(swept) > 1:
        raise ConfigError("--algorithms", f"{token!r} sweeps {len(swept)} keys; a row sweeps one hyperparameter "
                                          "(write one row per setting of the others)")
    if swept:
        key, alternatives = items[swept[0]].split("=", 1)
        values = [v.strip() for v in alternatives.split("|")]
        if len(values) < 2 or not all(values) or len(set(values)) != len(values):
            raise ConfigError("--algorithms", f"{token!r}: a sweep lists two or more distinct values, "
                                              f"like {key.strip()}=0.5|1|2")
        candidates = tuple(_parse_row(f"{name}[{','.join(items[:swept[0]] + [f'{key.strip()}={v}'] + items[swept[0] + 1:])}]")
                           for v in values)
        return Row(token, name, sweep_key=key.strip(), candidates=candidates)
    params, overrides = {}, {}
    for item in items:
        path, value = parse_override(item)
        (overrides if len(path) > 1 or isinstance(value, dict) else params)[".".join(path)] = value
    return Row(token, name, params, overrides)


def label_algorithm(label: str) -> str:
    """The algorithm of a row label: `local[privacy={mode="none"}]` -> `local`."""
    return label.split("[", 1)[0]


def baseline_label(labels: Sequence[str], algorithm: str = "local") -> str | None:
    """The row the `worst vs local` columns measure against: the row labelled `local`, else the one
    row of algorithm `local` (`local[privacy={mode="none"}]` in a privacy sweep); None if neither."""
    if algorithm in labels:
        return algorithm
    candidates = [label for label in labels if label_algorithm(label) == algorithm]
    return candidates[0] if len(candidates) == 1 else None


def row_raw(base: Mapping[str, Any], row: Row) -> dict[str, Any]:
    """The raw scenario of one row: the base with the row's algorithm, parameters and overrides
    (the base's algorithm parameters carry over only to a row of the same algorithm)."""
    raw = json.loads(json.dumps(base))
    base_algorithm = base.get("algorithm", {}).get("name", "fedavg")
    params = dict(raw.get("algorithm", {}).get("params", {})) if row.algorithm == base_algorithm else {}
    raw["algorithm"] = {"name": row.algorithm, "params": params}
    return apply_values(raw, [(["algorithm", "params", k], v) for k, v in row.params.items()]
                        + [(k.split("."), v) for k, v in row.overrides.items()])
