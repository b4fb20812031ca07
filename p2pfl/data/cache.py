"""On-disk cache of generated datasets (.npz files).

Default folder ``~/.cache/p2pfl/data``; override with the environment variable
``P2PFL_DATA_CACHE``. Clearing it is always safe (``rm -rf`` the folder or call
:func:`clear_cache`); the next use rebuilds what it needs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

ENV_VAR = "P2PFL_DATA_CACHE"


def cache_dir() -> Path:
    """The cache folder, read from the environment at every call (so tests can redirect it)."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "p2pfl" / "data"


def clear_cache() -> None:
    """Delete every cached dataset file (only the generated .npz/.lock files of this package)."""
    d = cache_dir()
    if not d.is_dir():
        return
    for p in d.iterdir():
        if p.is_file() and p.suffix in (".npz", ".lock", ".tmp"):
            p.unlink(missing_ok=True)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Inter-process lock so that concurrently started nodes build a file once."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: fall back to atomic rename only
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _load(path: Path) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError):
        return None


def cached(name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Return the arrays stored under ``name`` (file ``<cache>/<name>.npz``), building them first if absent.

    Writes are atomic (temp file + rename) and serialised by a lock file, so
    several processes may call this at once.
    """
    d = cache_dir()
    path = d / f"{name}.npz"
    if path.is_file():
        arrays = _load(path)
        if arrays is not None:
            return arrays
    d.mkdir(parents=True, exist_ok=True)
    with _lock(d / f"{name}.lock"):
        if path.is_file():  # another process built it while we waited
            arrays = _load(path)
            if arrays is not None:
                return arrays
        arrays = build()
        fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **arrays)  # uncompressed: loads in milliseconds
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; make it readable like a normal file
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return arrays
