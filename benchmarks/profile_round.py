"""Where the time of a many-node run goes: py-spy on every worker process, by function.

    pip install -e '.[profile]'      # py-spy
    python benchmarks/profile_round.py [SCENARIO] [--nodes 1000] [--top 25] [--set key=value ...]

Runs the scenario (default `scenarios/scale.toml`, regular:4) with `nodes = N` in `shared`
placement and samples each worker process with `py-spy record` (100 Hz, idle samples included,
so waiting shows as waiting) from its start to its end. Printed: the share of each worker's
samples spent in a function's own code (self) and under it (total), summed over the workers,
for the functions with the largest self share; and the same by phase of a node's life, read from
the stacks: start-up (before a node's first round), rounds (train, evaluate, aggregate,
checkpoints, the wire's signing, hashing and serving; idle threads and the idle event loop apart).

    python benchmarks/profile_round.py --nodes 10000 --window 60,50 [--set key=value ...]

`--window START,SECONDS`: each worker sampled only from START seconds after launch for SECONDS,
active samples only (no idle ones) and without pausing the process (`--nonblocking`), by thread:
printed besides the share of each thread (the event loop's, the pool's, the heap trimmer's) and,
on the event loops, the share under each of the round's steps that run there (WHERE_ON_THE_LOOP).
`--keep DIR` copies py-spy's raw stacks there (one file a worker) for a closer look.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from p2pfl.runtime.run_folder import RunFolder
from p2pfl.scenario.launcher import run_loaded
from p2pfl.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[1]
# A node's life, by a function on the stack (the first that matches, leaf to root, names it);
# a thread pool's idle thread and an event loop waiting in select are idle whatever called them.
IDLE = {"_worker": "threads idle (asyncio.to_thread pool)", "select": "event loop idle", "poll": "event loop idle"}
PHASES = (("checkpoint", ("write_swapped", "save_checkpoint", "write_checkpoint")),
          ("wire (sign, hash, verify, serve)", ("encode_body", "seal_frame", "open_message", "digest", "crypto_sign",
                                               "serve_read", "seal", "authenticate_head")),
          ("train", ("fit", "_train_epoch", "backward")), ("evaluate", ("evaluate",)),
          ("aggregate", ("aggregate", "bound_update")),
          ("start-up", ("assemble_node", "warm_up", "build_partition", "load_node_config", "load_scenario", "_find_and_load")))


# The event loop's work by the first of these on a stack (the order matters: a peer's part is
# bounded inside the fetch that brought it).
WHERE_ON_THE_LOOP = (("a peer's part checked and bounded (Intake.peer_model)", "peer_model"),
                     ("a co-located peer's frame served, joined and verified (InMemory)", "_fetch_in_memory"),
                     ("a frame over HTTP (the other worker)", "transport/http"),
                     ("a fetched frame verified (Carrier.opened_answer)", "opened_answer"),
                     ("publishing (encode, sign)", "publish"),
                     ("asyncio's own scheduling", "asyncio/"))


def _workers(run: Path) -> list[int]:
    """The shared placement's worker processes, from the run folder's pids.json (node -> its
    process) once the forking parent wrote it: forked, they carry the parent's command line."""
    try:
        return sorted(set(json.loads(RunFolder(run).pids.read_text()).values()))
    except (OSError, ValueError):  # not written yet, or replaced as we read
        return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", nargs="?", default=str(ROOT / "scenarios" / "scale.toml"))
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--window", default=None, metavar="START,SECONDS",
                        help="sample from START s after launch for SECONDS, active samples by thread")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="copy py-spy's raw stacks (one file a worker) into DIR")
    args = parser.parse_args()
    window = tuple(float(v) for v in args.window.split(",")) if args.window else None
    scenario = load_scenario(args.scenario, ['runtime.topology="regular:4"', *args.overrides, f"nodes={args.nodes}",
                                             'runtime.placement="shared"'])
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.is_file():
        raise SystemExit("needs py-spy: pip install -e '.[profile]'")
    with tempfile.TemporaryDirectory() as tmp:
        recorders: list[tuple[int, subprocess.Popen[bytes], Path]] = []
        done = threading.Event()

        def attach() -> None:  # each worker from the moment it exists
            seen: set[int] = set()
            while not done.is_set():
                for pid in _workers(Path(tmp) / "run"):
                    if pid not in seen:
                        seen.add(pid)
                        out = Path(tmp) / f"{pid}.txt"
                        how = ["--idle"] if window is None else ["--threads", "--duration", str(int(window[1]))]
                        if window is not None:
                            done.wait(max(0.0, started + window[0] - time.perf_counter()))
                        recorders.append((pid, subprocess.Popen(
                            [str(spy), "record", "--pid", str(pid), "--rate", "100", *how, "--format", "raw",
                             "--output", str(out), "--nonblocking"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL), out))
                time.sleep(0.05)

        started = time.perf_counter()
        watcher = threading.Thread(target=attach, daemon=True)
        watcher.start()
        results, code = run_loaded(scenario, Path(tmp) / "run", progress=False, quiet=True, force=True)
        wall = time.perf_counter() - started
        done.set()
        watcher.join()
        for _, proc, _ in recorders:
            proc.wait(timeout=60)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            for _, _, out in recorders:
                if out.is_file():
                    shutil.copy(out, args.keep / out.name)
        own: collections.Counter[str] = collections.Counter()
        under: collections.Counter[str] = collections.Counter()
        phases: collections.Counter[str] = collections.Counter()
        other: collections.Counter[str] = collections.Counter()  # "other"'s stacks, by their last three frames
        threads: collections.Counter[str] = collections.Counter()  # --window: each thread's name
        on_loop: collections.Counter[str] = collections.Counter()  # --window: the event loops' steps
        samples = 0
        for _, _, out in recorders:
            if not out.is_file():
                continue
            for line in out.read_text().splitlines():
                stack, _, count_text = line.rpartition(" ")
                count = int(count_text)
                raw = stack.split(";")
                frames = [f.split(" (")[0] for f in raw[1 if window is not None else 0:]]
                if not frames:  # a thread in native code, no Python frame to name
                    continue
                if window is not None:  # the first frame names the thread: "thread (TID): NAME"
                    thread = raw[0].rpartition(": ")[2]
                    thread = "event loop" if thread == "MainThread" else thread.rstrip("0123456789").rstrip("_")
                    threads[thread] += count
                    if thread == "event loop":
                        on_loop[next((label for label, key in WHERE_ON_THE_LOOP if key in stack), "other")] += count
                samples += count
                own[frames[-1]] += count
                for name in set(frames):
                    under[name] += count
                phase = IDLE.get(frames[-1].rsplit(".", 1)[-1]) or next((p for p, names in PHASES for f in reversed(frames)
                                                      if any(n in f for n in names)), "other")
                phases[phase] += count
                if phase == "other":
                    other[" < ".join(reversed(frames[-3:]))] += count
    print(f"{scenario.name}: {args.nodes} nodes, {len(recorders)} workers, exit {code}, wall {wall:.1f} s, "
          f"{samples} samples (100 Hz)")
    if window is not None:
        seconds = window[1] * len(recorders)  # one thread's samples at 100 Hz: its busy share
        print(f"from {window[0]:g} s after launch for {window[1]:g} s, active samples only")
        print(f"{'thread':<40}{'share':>8}{'busy':>8}")
        names = {"event loop": 1, "p2pfl-train": 1}  # threads of that name a worker has (the pool: 1, a worker a core)
        for thread, count in threads.most_common():
            each = names.get(thread, 1) * seconds * 100
            print(f"{thread:<40}{count / max(1, samples):>8.1%}{count / each:>8.0%}")
        print("\nthe event loops' samples, by step (a share of all samples)")
        for label, count in on_loop.most_common():
            print(f"  {label:<70}{count / max(1, samples):>7.1%}")
        print()
    print(f"{'phase':<40}{'share':>8}")
    for phase, count in phases.most_common():
        print(f"{phase:<40}{count / max(1, samples):>8.1%}")
    print("\n\"other\", its largest stacks (leaf < caller < caller):")
    for stack, count in other.most_common(8):
        print(f"  {count / max(1, samples):6.1%}  {stack[:110]}")
    print(f"\n{'function':<70}{'self':>8}{'total':>8}")
    for name, count in own.most_common(args.top):
        print(f"{name[:69]:<70}{count / max(1, samples):>8.1%}{under[name] / max(1, samples):>8.1%}")


if __name__ == "__main__":
    main()
