"""The forking parent of `placement = "process"` (`p2pfl forked`), started before the launcher
has checked the scenario, so that its import of torch and the node code runs beside the
launcher's own (two cores, one import each at once, instead of one after the other).

`p2pfl run` calls `warm_up_for` first thing; the hosting `take`s the process when its nodes'
configs are written and hands them over on its stdin. A run that ends before (a wrong field, an
interrupted check) kills it on exit; it has done nothing but import.
"""

from __future__ import annotations

import atexit

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from p2pfl.errors import ConfigError
from p2pfl.hosting import FORKED, forks, node_env, tie_to_parent

_WARM: subprocess.Popen[bytes] | None = None


def warm_up_for(scenario: Path, overrides: Sequence[str]) -> None:
    """Start the forking parent if the scenario, as its fields read torch-free, places its nodes
    in forked processes; a scenario that cannot be read is left to the launcher's checks."""
    from p2pfl.scenario.schema import apply_overrides, read_raw

    try:
        runtime = apply_overrides(read_raw(scenario), overrides).get("runtime", {})
    except (ConfigError, OSError, ValueError):
        return
    if not isinstance(runtime, dict) or runtime.get("placement", "process") != "process":
        return
    if not forks(str(runtime.get("start_method", "auto"))):
        return
    threads = runtime.get("torch_threads", 1)
    warm_up(threads if isinstance(threads, int) and threads > 0 else 1)


def warm_up(torch_threads: int) -> None:
    global _WARM
    if _WARM is not None:
        return
    _WARM = subprocess.Popen([sys.executable, "-m", "p2pfl", FORKED, "--wait"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=node_env(torch_threads),
                             preexec_fn=tie_to_parent if sys.platform.startswith("linux") else None)
    atexit.register(_discard)


def take() -> subprocess.Popen[bytes] | None:
    """The warm forking parent, once, if it is still alive."""
    global _WARM
    proc, _WARM = _WARM, None
    return proc if proc is not None and proc.poll() is None else None


def _discard() -> None:
    proc = take()
    if proc is not None:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


__all__ = ["take", "warm_up", "warm_up_for"]
