"""What a stored resolved scenario (a run folder's `scenario.json`, the `scenario` of its
results.json) meant in the format it was written in, as today's format says it.

Format 1 is every run folder written before scenarios carried a number. It left out runtime
fields at their defaults, and whole tables that were off (attack, churn, plugins, the
safeguard). Format 2 writes every field (`Scenario.to_dict`), with `"format": 2`.

Two kinds of rule turn an older scenario into today's:

* a runtime field declares, beside its default, what its absence meant (`setting(...,
  absent=...)` in `p2pfl.scenario.schema`): a field added after runs were published adds one
  declaration, and every older folder still matches a run made without it. A field declared
  without one was unknown before it was stored: it stays absent, and `unrecorded` names it (a
  comparison refuses such a run rather than guess);
* everything else that changed between two formats is one step below, `_format_1_to_2`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from p2pfl.errors import ConfigError

FORMAT = 2

# An n_train cap was on in every run stored before the cap was recorded, at this factor (its
# default then). Only what a table says the run ran: a comparison still refuses such a run.
WEIGHT_CAP_BEFORE_RECORDED = 4.0


def _format_1_to_2(stored: dict[str, Any]) -> dict[str, Any]:
    """Format 1 left out what was off, and predates `data.test_split` (each node was scored on its
    own held-out share)."""
    if isinstance(stored.get("data"), dict):
        stored["data"].setdefault("test_split", "own_distribution")
    algorithm = stored.get("algorithm")
    if isinstance(algorithm, dict):
        algorithm.setdefault("safeguard", False)
        algorithm.setdefault("safeguard_level", None)
    stored.setdefault("attack", {"kind": "none", "nodes": [], "scale": 1.0, "start_round": 1})
    stored.setdefault("churn", {})
    stored.setdefault("plugins", [])
    return stored


STEPS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _format_1_to_2}  # from format N to N + 1


def format_of(stored: Mapping[str, Any]) -> int:
    """The format a stored scenario was written in (1 where it names none); ConfigError where it is
    not a format this version reads."""
    number = stored.get("format", 1)
    if type(number) is not int or number < 1:
        raise ConfigError("format", f"expected a format number >= 1, got {number!r}")
    if number > FORMAT:
        raise ConfigError("format", f"this scenario was written in format {number} by a newer p2pfl; this one "
                                    f"reads formats 1 to {FORMAT} (upgrade p2pfl-influence)")
    return number


def upgrade(stored: Mapping[str, Any], runtime_absent: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `stored` in today's format: every step from its format on, then each absent runtime
    field set to what its absence meant (`runtime_absent`, as the fields declare it:
    `p2pfl.scenario.schema.as_today`). Fields nobody can know stay absent."""
    out = json.loads(json.dumps(stored))
    for number in range(format_of(out), FORMAT):
        out = STEPS[number](out)
    runtime = out.get("runtime")
    if isinstance(runtime, dict):
        for name, meant in runtime_absent.items():
            runtime.setdefault(name, meant)
    if out:
        out["format"] = FORMAT
    return out


def unrecorded(stored: Mapping[str, Any], runtime_fields: Iterable[str]) -> list[str]:
    """The dotted runtime fields an upgraded scenario lacks: made before they were stored, and
    declared without a meaning for their absence."""
    runtime = stored.get("runtime")
    if not isinstance(runtime, Mapping):
        return []
    return [f"runtime.{name}" for name in runtime_fields if name not in runtime]
