"""Where a many-node run's CPU goes: each step of a node's round, timed in every worker.

    python benchmarks/round_cpu.py [--nodes 1000] [--set KEY=VALUE ...]

Runs `p2pfl run scenarios/scale.toml --set nodes=N --set runtime.topology="regular:4"` (plus any
`--set`) with the steps below wrapped in each worker process (a `sitecustomize` on PYTHONPATH
that the launcher and spawned workers act on; forked workers inherit it), and prints per step its calls, the CPU time of the thread that
ran it (`time.thread_time`: the step's own work, page faults included, not the threads it waited
for), microseconds a call and milliseconds a node-round. The workers' whole CPU (start-up
included) is printed beside them, and the run's slowest mean round as `benchmarks/scale.py`
reports it. Steps marked "within" run inside one of the steps above them (the signatures inside
publishing, fetching and checkpointing; the bounds inside a peer's part): do not add them up.

Wrapping costs about a microsecond a call; a round's steps take hundreds. The run folder is
deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (module, attribute path, within another step)
STEPS: list[tuple[str, str, bool]] = [
    ("p2pfl.training.trainer", "LocalTrainer.fit", False),
    ("p2pfl.runtime.node.scoring", "Scorer.scored", False),
    ("p2pfl.runtime.node.state", "NodeState.write", False),
    ("p2pfl.runtime.transport.base", "Carrier.opened_answer", False),
    ("p2pfl.runtime.transport.loopback", "InMemory.serve_read", False),
    ("p2pfl.runtime.node.intake", "Intake.peer_model", False),
    ("p2pfl.algorithms.fedavg", "FedAvg.fold", False),
    ("p2pfl.algorithms.fedavg", "FedAvg.aggregate", False),
    ("p2pfl.runtime.node.round", "Round.refuse_non_finite", False),
    ("p2pfl.runtime.files", "RecordAppender.append", False),
    ("p2pfl.wire.keys", "NodeKey.sign", True),
    ("p2pfl.wire.keys", "Roster.verify", True),
    ("p2pfl.wire.body", "encode_body", True),
    ("p2pfl.runtime.peer_claims", "check_magnitude", True),
    ("p2pfl.runtime.peer_claims", "bound_update", True),
    ("p2pfl.runtime.checkpoint", "write_swapped", True),
]

SITECUSTOMIZE = '''
import atexit, functools, importlib, json, os, sys, time
# `python -m p2pfl worker ...` (spawned), or `p2pfl run ...`, whose forking parent and workers are
# forked from it: wrapped there, before the fork, and each forked worker tallies its own steps.
if "worker" in sys.argv[:3] or "run" in sys.argv[:3]:
    _tally = {}
    def _wrap(module, path):
        owner = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        original = getattr(owner, name)
        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                entry = _tally.setdefault(path, [0, 0.0])
                entry[0] += 1
                entry[1] += time.thread_time() - start
        setattr(owner, name, timed)
        if not outer:  # a function: also where other modules imported it by name
            for loaded in list(sys.modules.values()):
                if getattr(loaded, "__name__", "").startswith("p2pfl") and getattr(loaded, name, None) is original:
                    setattr(loaded, name, timed)
    for _module, _path in STEPS:
        _wrap(_module, _path)
    def _dump():
        with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as fh:
            json.dump({"steps": _tally, "cpu_s": time.process_time()}, fh)
    if "worker" in sys.argv[:3]:
        atexit.register(_dump)
    else:  # a forked child ends with os._exit, past atexit: its host's entry dumps its tally
        import p2pfl.forked
        _child = p2pfl.forked._child
        def _tallied_child(*args, **kwargs):
            _tally.clear()  # the launcher's, copied by the fork
            try:
                return _child(*args, **kwargs)
            finally:
                _dump()
        p2pfl.forked._child = _tallied_child
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more scenario overrides")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="round_cpu_") as tmp:
        site, tallies = Path(tmp) / "site", Path(tmp) / "tallies"
        site.mkdir()
        tallies.mkdir()
        steps = [(m, p) for m, p, _ in STEPS]
        (site / "sitecustomize.py").write_text(f"STEPS = {steps!r}\nOUT = {str(tallies)!r}\n" + SITECUSTOMIZE)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
        out = Path(tmp) / "run"
        overrides = [f"nodes={args.nodes}", 'runtime.topology="regular:4"', *args.set]
        command = [sys.executable, "-m", "p2pfl", "run", str(ROOT / "scenarios/scale.toml"), "--out", str(out)]
        for override in overrides:
            command += ["--set", override]
        subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        results = json.loads((out / "results.json").read_text())
        node_rounds = sum(len(n["rounds"]) for n in results["nodes"])
        slowest = max(statistics.fmean(r["wall_s"] for r in n["rounds"]) for n in results["nodes"] if n["rounds"])
        totals: dict[str, list[float]] = {}
        workers_cpu = 0.0
        for path in tallies.glob("*.json"):
            tally = json.loads(path.read_text())
            workers_cpu += tally["cpu_s"]
            for step, (calls, seconds) in tally["steps"].items():
                entry = totals.setdefault(step, [0, 0.0])
                entry[0] += calls
                entry[1] += seconds
        shutil.rmtree(out, ignore_errors=True)
    print(f"scale.toml, {' '.join(overrides)}: {node_rounds} node-rounds, slowest mean round {slowest:.2f} s, "
          f"workers' CPU {workers_cpu:.1f} s (start-up included)")
    print(f"{'step':<32}{'calls':>8}{'CPU s':>8}{'µs / call':>11}{'ms / node-round':>17}")
    within = {p for _, p, inner in STEPS if inner}
    for step, (calls, seconds) in sorted(totals.items(), key=lambda kv: (kv[0] in within, -kv[1][1])):
        name = f"  within: {step}" if step in within else step
        print(f"{name:<32}{int(calls):>8}{seconds:>8.2f}{seconds / max(calls, 1) * 1e6:>11.1f}"
              f"{seconds / max(node_rounds, 1) * 1e3:>17.3f}")


if __name__ == "__main__":
    main()
