"""Files a process may be killed while writing, at any byte, and that stay readable.

* JSON documents are written whole (`write_json_atomic`: a temporary file, renamed over);
* JSON-lines files are appended a line per write (`append_record`, `RecordAppender`), after a
  newline that ends whatever a killed writer left, and every reader (`read_records`) skips a
  line that is not a whole record;
* a file rewritten often (a checkpoint) is replaced whole at every moment (`write_swapped`): the
  new content goes to a swap file beside it and the two are exchanged in one step (Linux
  `renameat2(RENAME_EXCHANGE)`; elsewhere a rename over it).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


def dumps_readable(document: Any, indent: int = 1, levels: int = 2) -> str:
    """JSON with its first `levels` levels a line an item (a run's results: a node a line), each
    item below them on its line as `json.dumps` writes it, in C: `json.dumps(indent=...)`
    encodes in Python (a 1000-node run's results.json: 0.16 s against 0.05 s)."""
    def encode(value: Any, level: int) -> str:
        if level >= levels or not value or not isinstance(value, (dict, list)) or \
                (isinstance(value, dict) and not all(isinstance(k, str) for k in value)):
            return json.dumps(value)
        pad, end = " " * (indent * (level + 1)), " " * (indent * level)
        if isinstance(value, dict):
            items = [f"{pad}{json.dumps(k)}: {encode(v, level + 1)}" for k, v in value.items()]
            return "{\n" + ",\n".join(items) + f"\n{end}}}"
        return "[\n" + ",\n".join(pad + encode(v, level + 1) for v in value) + f"\n{end}]"

    return encode(document, 0)


def write_json_atomic(path: Path, document: Any, indent: int | None = 1) -> None:
    """`path` holds the old document or the new one, whenever the writer is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(document) if indent is None else dumps_readable(document, indent))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _open_for_records(path: Path) -> tuple[int, bytes]:
    """An appending descriptor of `path`, and what the next line must start with: a newline
    where a killed writer left its last line unfinished, so that it spoils only itself."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        return fd, b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b""
    except BaseException:
        os.close(fd)
        raise


def append_record(path: Path, record: Mapping[str, Any]) -> None:
    """One JSON line, in one write (after ending a line a killed writer left unfinished)."""
    fd, lead = _open_for_records(path)
    try:
        os.write(fd, lead + (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


class RecordAppender:
    """`append_record` to one file that stays open between records: a worker of a thousand
    nodes appends a round record per node and round, and opening the file each time was most of
    the cost. The file is opened (made) at once, with the node, not by its first round's record:
    a thousand files made in round 1 were a share of its CPU. Closed by `close` (and as a context
    manager); appending after that opens it again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None
        self._fd, self._lead = _open_for_records(path)

    def append(self, record: Mapping[str, Any]) -> None:
        if self._fd is None:
            self._fd, self._lead = _open_for_records(self.path)
        os.write(self._fd, self._lead + (json.dumps(record) + "\n").encode())
        self._lead = b""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RecordAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: Path, required: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """The whole records of a JSON-lines file: lines that parse as an object with `required`
    keys; a half-written line (a killed writer, or one being written now) is skipped."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and all(k in record for k in required):
            yield record


def write_swapped(path: Path, chunks: Sequence[bytes | memoryview], *, durable: bool) -> None:
    """Replace the file at `path` by `chunks`, whole at every moment to a reader.

    One writer per file at a time (a node, its checkpoint). The new content is written to a swap
    file next to it and the two are exchanged in one step; the swap file then holds the previous
    content, and the next write goes over it in place. Renamed over the file instead, every write
    made a new inode and freed one (ext4's search for a free inode among those just freed was 6 %
    of a 1000-node run's CPU, `perf record -a`); emptied after each exchange, every write freed
    the file's blocks and page cache and allocated them again (`python benchmarks/checkpoint_write.py`)."""
    swap = swap_path(path)
    try:
        fd = os.open(swap, os.O_WRONLY | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
        try:
            os.ftruncate(fd, _write_all(fd, chunks))  # what is left of a longer previous content
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        first = not path.exists()
        if first or not _exchange(swap, path):  # the first write, or no renameat2 exchange
            os.replace(swap, path)
            if first and _renameat2() is not None:  # made now, so that the next write (in a round) makes no file
                swap.touch(mode=0o600)  # as private as the file it will become
    except BaseException:
        swap.unlink(missing_ok=True)
        raise


def _write_all(fd: int, chunks: Sequence[bytes | memoryview]) -> int:
    """Write `chunks` one after another at `fd`'s offset; the bytes written. One `writev` call
    for them all where the system has it (a file object wrote each chunk with a call of its
    own: a checkpoint is a dozen buffers, one per tensor)."""
    views = [view for view in (memoryview(chunk).cast("B") for chunk in chunks) if view.nbytes]
    total = sum(view.nbytes for view in views)
    writev = getattr(os, "writev", None)
    while views:
        done = writev(fd, views[:_IOV_MAX]) if writev is not None else os.write(fd, views[0])
        if done <= 0:  # a file takes bytes or raises; never wait on one that does neither
            raise OSError(errno.EIO, "a write to the checkpoint file took no bytes")
        while views and done >= views[0].nbytes:  # a short write goes on where it stopped
            done -= views[0].nbytes
            views.pop(0)
        if done:
            views[0] = views[0][done:]
    return total


_IOV_MAX = 1024  # POSIX's least IOV_MAX on Linux and the BSDs


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux `renameat2(RENAME_EXCHANGE)`); False where the system or
    the file system cannot, and nothing was changed."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(b))


@functools.cache
def _renameat2() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28, or not Linux
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def swap_path(path: Path) -> Path:
    """Where `write_swapped` keeps the previous content of `path`."""
    return path.with_name(f".{path.name}.swap")
