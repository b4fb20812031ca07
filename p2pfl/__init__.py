"""p2pfl: asynchronous peer-to-peer federated learning with influence-based aggregation.

`p2pfl.run` and `p2pfl.compare` run scenarios from Python and return `Results` / `Comparison`
objects (see `p2pfl.api`); `p2pfl ...` on the command line does the same.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Comparison", "Results", "compare", "compare_async", "run", "run_async"]


def __getattr__(name: str) -> Any:
    # The API imports the launcher and torch; `import p2pfl` for the version or a submodule stays light.
    if name in __all__:
        from p2pfl import api

        return getattr(api, name)
    raise AttributeError(f"module 'p2pfl' has no attribute {name!r}")
