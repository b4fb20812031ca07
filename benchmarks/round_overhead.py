"""p2pfl's wall time against the compute floor of the same nodes.

    python benchmarks/round_overhead.py [SCENARIO] [--set key=value ...] [--cores N]

The floor: the scenario's nodes built exactly as `p2pfl node` builds them (same data, model,
seed, trainer, strategy, torch threads), their rounds run back to back in this one process
with no network: every node fits and is evaluated, then every node aggregates the others'
models (handed over in memory) and is evaluated again. Only fit, evaluation and aggregation
are timed. The floor's seconds are divided by the parallelism a real run has on this
machine, min(cores, nodes x torch_threads), because the real run's node processes share
the cores; the undivided sum is printed too.

The real run: `p2pfl run` of the same scenario. Its wall is the rounds' wall, the slowest
node's sum of per-round `wall_s` (process start-up and the final linger excluded); the
whole launcher time, start-up included, is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from p2pfl.assembly import assemble_node
from p2pfl.models import part_state
from p2pfl.runtime.config import load_node_config
from p2pfl.runtime.devices import host_snapshot, to_device
from p2pfl.runtime.strategy import PeerModel
from p2pfl.scenario.launcher import run_loaded, write_run_folder
from p2pfl.scenario.schema import Scenario, load_scenario


def compute_floor(scenario: Scenario, folder: Path) -> tuple[float, dict[str, float]]:
    """Seconds of fit + evaluate + aggregate for all nodes and rounds, run back to back; `spent`
    also has the seconds the nodes took to build (`build`, not in the sum)."""
    paths, _ = write_run_folder(scenario, folder)
    started = time.perf_counter()
    nodes = [assemble_node(load_node_config(p), scenario) for p in paths]
    built_s = time.perf_counter() - started
    spent = {"train": 0.0, "evaluate": 0.0, "aggregate": 0.0}

    def timed(phase: str, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        spent[phase] += time.perf_counter() - start
        return out

    for node in nodes:
        node.strategy.setup(node.ctx)
    for r in range(1, scenario.rounds + 1):
        for node in nodes:
            node.ctx.round = r
            node.ctx.round_start = {k: v.detach().clone() for k, v in node.model.state_dict().items()}
            timed("train", node.strategy.fit, node.ctx)
            timed("evaluate", node.parts.trainer.evaluate, node.model, node.parts.data.test)
        shared = {
            node.config.id: {p: host_snapshot(part_state(node.model, p)) for p in node.strategy.shared_parts}
            for node in nodes
        }
        n_train = {node.config.id: len(node.parts.data.train) for node in nodes}
        for node in nodes:
            fetches = node.strategy.configure_fetch(node.ctx)
            arrived = [
                PeerModel(f.peer, f.part, r, r, to_device(shared[f.peer][f.part], node.parts.device),
                          {"n_train": n_train[f.peer]})
                for f in fetches if f.part in shared.get(f.peer, {})
            ]
            timed("aggregate", node.strategy.aggregate, node.ctx, arrived)
            timed("evaluate", node.parts.trainer.evaluate, node.model, node.parts.data.test)
    return sum(spent.values()), {**spent, "build": built_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", nargs="?", default="scenarios/round_overhead.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores the real run may use")
    parser.add_argument("--floor-only", action="store_true",
                        help="the floor alone, without the real run (thousands of nodes: the run is memory_curve.py's)")
    args = parser.parse_args()
    scenario = load_scenario(args.scenario, args.overrides)
    threads = scenario.runtime.torch_threads
    parallel = max(1, min(args.cores, scenario.nodes * threads)) if scenario.device == "cpu" else 1
    with tempfile.TemporaryDirectory() as tmp:
        floor_s, parts = compute_floor(scenario, Path(tmp) / "floor")
        if args.floor_only:
            results, code = None, 0
        else:
            results, code = run_loaded(scenario, Path(tmp) / "run", progress=False, quiet=True)
    floor_wall = floor_s / parallel
    if results is None:
        print(f"{scenario.name}: {scenario.nodes} nodes, {scenario.model.name}, {scenario.rounds} round(s), "
              f"{scenario.algorithm.name}, {args.cores} cores -> parallelism {parallel}; torch {torch.__version__}")
        print(f"building the nodes, one process                {parts['build']:8.2f} s   ({parts['build'] / parallel:.2f} / {parallel})")
        print(f"compute floor, one process, back to back     {floor_s:8.2f} s   ({floor_wall:.2f} / {parallel}; "
              f"train {parts['train']:.2f}, evaluate {parts['evaluate']:.2f}, aggregate {parts['aggregate']:.2f})")
        return
    if code != 0:
        raise SystemExit(f"the real run failed: {results['summary'].get('nodes_failed')}")
    rounds_wall = max(sum(r["wall_s"] for r in n["rounds"]) for n in results["nodes"])
    launcher_wall = results["summary"]["wall_s"]
    print(f"{scenario.name}: {scenario.nodes} nodes, {scenario.model.name}, {scenario.rounds} rounds, "
          f"{scenario.algorithm.name}, device {scenario.device}, {threads} torch thread(s) per node, "
          f"{args.cores} cores -> parallelism {parallel}; torch {torch.__version__}")
    print()
    print(f"compute floor, one process, back to back   {floor_s:8.2f} s   "
          f"(train {parts['train']:.2f}, evaluate {parts['evaluate']:.2f}, aggregate {parts['aggregate']:.2f})")
    print(f"compute floor / parallelism {parallel}             {floor_wall:8.2f} s")
    print(f"p2pfl rounds wall (slowest node)            {rounds_wall:8.2f} s   "
          f"compute fraction {results['summary']['compute_fraction']:.2f}")
    print(f"p2pfl launcher wall (start-up, linger)      {launcher_wall:8.2f} s")
    print()
    print(f"ratio p2pfl rounds wall / compute floor     {rounds_wall / floor_wall:8.2f}   (target <= 1.25)")
    print(f"ratio p2pfl launcher wall / compute floor   {launcher_wall / floor_wall:8.2f}")


if __name__ == "__main__":
    main()
