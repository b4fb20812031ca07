"""Strategy parameters that name an earlier run (`Strategy.reads_runs`): read here, in the layer
that knows run folders, and handed to the strategy as `RunResults`, so no algorithm reads files."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from p2pfl.errors import ConfigError
from p2pfl.runtime.strategy import RunResults


def resolve_run_inputs(name: str, params: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """`params` with every path a `reads_runs` parameter names (its "{seed}" set to `seed`) read."""
    from p2pfl.algorithms import strategy_class

    resolved = dict(params)
    for key in strategy_class(name).reads_runs:
        value = resolved.get(key)
        if not isinstance(value, str):
            continue
        path = value.replace("{seed}", str(seed))
        try:
            document = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"algorithm.params.{key}", f"cannot read {path}: {exc}") from None
        if not isinstance(document, dict):
            raise ConfigError(f"algorithm.params.{key}", f"{path} is not a run's results.json (not a JSON object)")
        resolved[key] = RunResults(path, document)
    return resolved
