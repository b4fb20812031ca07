"""A checkpoint's file step: over the previous one in place, against the swap file emptied after each exchange.

    python benchmarks/checkpoint_write.py [--model flower_net:net] [--nodes 100] [--writes 600]

Each node of a run rewrites its checkpoint after the rounds it takes part in. `write_swapped`
(p2pfl.runtime.checkpoint) writes the new checkpoint over the swap file, which holds the previous
one, and exchanges the two; before, the swap file was emptied after each exchange and the next
write filled it again, so each write freed the file's blocks and cached pages and allocated new
ones. Both are timed here on the same signed frame of the model's size, round-robin over
`--nodes` files as a worker's nodes write theirs, interleaved in blocks: CPU time of this process
(the kernel's share of it included) and wall time per write, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # flower_net, for --model flower_net:net

from p2pfl.models import build_model  # noqa: E402
from p2pfl.runtime.files import _exchange, write_swapped  # noqa: E402
from p2pfl.wire import NodeKey  # noqa: E402
from p2pfl.wire.body import encode_body  # noqa: E402
from p2pfl.wire.envelope import seal_frame  # noqa: E402

Write = Callable[[Path, Sequence[bytes | memoryview]], None]


def emptied_after_exchange(path: Path, chunks: Sequence[bytes | memoryview]) -> None:
    """The file step as it was: the swap file truncated on open and emptied after the exchange."""
    swap = path.with_name(f".{path.name}.swap")
    fd = os.open(swap, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.writelines(chunks)
    if path.exists() and _exchange(swap, path):
        os.truncate(swap, 0)
    else:
        os.replace(swap, path)


def in_place(path: Path, chunks: Sequence[bytes | memoryview]) -> None:
    write_swapped(path, chunks, durable=False)


def timed(write: Write, folder: Path, chunks: Sequence[bytes | memoryview], nodes: int, first: int,
          count: int) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(first, first + count):
        write(folder / f"node-{i % nodes:04d}.p2pfl", chunks)
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="flower_net:net", help="model.name (default: Flower's Net, 2.3 MB)")
    parser.add_argument("--nodes", type=int, default=100, help="files written round-robin")
    parser.add_argument("--writes", type=int, default=600, help="timed writes per way")
    parser.add_argument("--blocks", type=int, default=6, help="interleaved blocks per way")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_model(args.model, 1, 28, 10)
    body = encode_body({k: v.detach() for k, v in model.state_dict().items()})
    frame = seal_frame(key=NodeKey.generate(), kind="checkpoint", sender="node-0", recipient="node-0", round=1,
                       version=1, seq=1, part="full", meta={}, body=body)
    ways: dict[str, Write] = {"emptied after exchange (before)": emptied_after_exchange, "over the previous, in place": in_place}
    totals = {name: [0.0, 0.0] for name in ways}
    per_block = max(1, args.writes // args.blocks)
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        folders = {name: Path(tmp) / str(i) for i, name in enumerate(ways)}
        for name, write in ways.items():  # every file written twice before timing: both ways in their steady state
            folders[name].mkdir()
            timed(write, folders[name], frame.chunks, args.nodes, 0, 2 * args.nodes)
        for block in range(args.blocks):
            for name, write in ways.items():
                cpu, wall = timed(write, folders[name], frame.chunks, args.nodes, block * per_block, per_block)
                totals[name][0] += cpu
                totals[name][1] += wall
    writes = per_block * args.blocks
    print(f"{args.model}: {frame.nbytes / 1e6:.2f} MB a checkpoint, {writes} writes a way over {args.nodes} files, "
          f"{os.cpu_count()} cores")
    print(f"{'':<34}{'CPU ms / write':>16}{'wall ms / write':>17}")
    for name, (cpu, wall) in totals.items():
        print(f"{name:<34}{cpu / writes * 1e3:>16.3f}{wall / writes * 1e3:>17.3f}")
    (base_cpu, base_wall), (cpu, wall) = totals.values()
    print(f"in place / before: {cpu / base_cpu:.2f}x CPU, {wall / base_wall:.2f}x wall")


if __name__ == "__main__":
    main()
