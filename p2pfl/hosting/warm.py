"""The forking parent of `placement = "process"` and `"shared"` (`p2pfl forked`), started before
the launcher has checked the scenario, so that its import of torch and the node code runs beside
the launcher's own (two cores, one import each at once, instead of one after the other).

`p2pfl run` calls `warm_up` first thing when the scenario forks (`commands/run.py`), and
`run_loaded` once the run has passed its checks (`warm_up_for`) when nobody did; the hosting
`take`s the process when its nodes' configs are written and hands them over on its stdin. A run
that ends before (a wrong field, an interrupted check) kills it when the command returns
(`discard`); it has done nothing but import.
"""

from __future__ import annotations

import atexit
import subprocess
import sys

from p2pfl.hosting import FORKED, node_env, tie_to_parent

_WARM: subprocess.Popen[bytes] | None = None


def warm_up(torch_threads: int) -> None:
    global _WARM
    if _WARM is not None:
        return
    _WARM = subprocess.Popen([sys.executable, "-m", "p2pfl", FORKED, "--wait"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=node_env(torch_threads),
                             preexec_fn=tie_to_parent if sys.platform.startswith("linux") else None)
    atexit.register(discard)


def warm_up_for(placement: object, start_method: object, torch_threads: object) -> None:
    """`warm_up` if `runtime.placement` (as read, perhaps not yet checked) forks its processes."""
    from p2pfl.hosting import forks

    if placement not in ("process", "shared") or not forks(str(start_method)):
        return
    warm_up(torch_threads if isinstance(torch_threads, int) and torch_threads > 0 else 1)


def take() -> subprocess.Popen[bytes] | None:
    """The warm forking parent, once, if it is still alive."""
    global _WARM
    proc, _WARM = _WARM, None
    return proc if proc is not None and proc.poll() is None else None


def discard() -> None:
    """Kill the warm forking parent nobody took (it has done nothing but import)."""
    proc = take()
    if proc is not None:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


__all__ = ["discard", "take", "warm_up", "warm_up_for"]
