"""The same FedAvg in Flower's simulation engine and in p2pfl: wall per round and peak memory.

    python benchmarks/flower_side_by_side.py [--clients 1000] [--fraction 0.1] [--rounds 4]
        [--model cnn | --model flower_net:net] [--flower-python PATH] [--set key=value ...]

Both sides take `scenarios/scale.toml` with `nodes = CLIENTS`: the same data (the 5000 MNIST
samples, iid), the same partition (p2pfl's `build_partition`, node i = Flower's partition i),
the same model and local training (one epoch, batch 32, Adam 1e-3).

* Flower: `flwr.simulation.run_simulation`, Ray backend, `FedAvg(fraction_train=F,
  fraction_evaluate=F)`: per round F of the clients train and F evaluate, and the server
  averages. Flower's clients are tasks the engine starts for a round and drops after it.
* p2pfl: shared placement, `runtime.participation = F` on a `regular:4` graph: every node is
  a serving process-resident peer with keys, and F of them train per round and average with
  their neighbours. Its rounds overlap (a node goes on once its neighbours' versions are
  there, and one that sits a round out goes on at once), so its wall per round is the span of
  all its rounds over their number, the first included; Flower's is the median time from one
  round's start to the next after the first (which includes Ray's start). Its round's start
  model waits in memory, the runtime's default (`runtime.round_start`; scale.toml puts it on
  disk for 5000 nodes and more, where it saves 1.4-1.7 GB): `--set 'runtime.round_start="disk"'`
  measures the scenario as written.

Flower runs in its own interpreter (`--flower-python`, default this one), so that
`flwr[simulation]` never enters p2pfl's environment: it is a dependency of this script only
(`pip install "flwr[simulation]"` into that interpreter, beside `pip install -e .`); p2pfl runs
as `p2pfl run` (its own interpreter too). Printed: each side's wall per round (above), the first
round, the run's wall (Flower: `run_simulation`, Ray's start included; p2pfl: as the launcher
counts it, from its call of `run_loaded` to the results, its node processes' start and imports
included), the whole process (each command from its start to its exit, imports included), peak
RSS summed over every process the side started, and the ratios p2pfl / Flower. `--json FILE`
appends each pair's figures to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import PeakMemory  # noqa: E402  (benchmarks/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "scale.toml"

# The Flower side, run as `python -c FLOWER_SIDE ARGS_JSON` in Flower's interpreter.
FLOWER_SIDE = r'''
import json, statistics, sys, time
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from p2pfl.data import build_partition
from p2pfl.models import build_model
from p2pfl.scenario.schema import load_scenario
from p2pfl.training import LocalTrainer

args = json.loads(sys.argv[1])
sc = load_scenario(args["scenario"], args["overrides"])


def model_and_data(pid):
    torch.set_num_threads(1)
    part = build_partition(sc.data, sc.nodes, sc.seed, only=[pid])
    torch.manual_seed(sc.seed)
    model = build_model(sc.model.name, part.in_channels, part.image_size, part.num_classes)
    return model, part.node(pid)


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    model, data = model_and_data(pid)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    fit = LocalTrainer(sc.train, seed=sc.seed + pid).fit(model, data.train)
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"train_loss": float(fit.loss), "num-examples": len(data.train)})})
    return Message(content=content, reply_to=msg)


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    model, data = model_and_data(pid)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    acc, loss = LocalTrainer(sc.train).evaluate(model, data.test)
    return Message(content=RecordDict({"metrics": MetricRecord({"acc": acc, "loss": loss,
                                                                "num-examples": len(data.test)})}), reply_to=msg)


starts = []


class TimedFedAvg(FedAvg):
    def configure_train(self, server_round, arrays, config, grid):
        starts.append(time.perf_counter())
        return super().configure_train(server_round, arrays, config, grid)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    model, _ = model_and_data(0)
    k = max(2, round(args["fraction"] * sc.nodes))
    strategy = TimedFedAvg(fraction_train=args["fraction"], fraction_evaluate=args["fraction"], min_train_nodes=k,
                           min_evaluate_nodes=k, min_available_nodes=sc.nodes)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=sc.rounds)
    starts.append(time.perf_counter())


began = time.perf_counter()
run_simulation(server_app=server, client_app=client, num_supernodes=sc.nodes,
               backend_config={"client_resources": {"num_cpus": 1}})
rounds = [b - a for a, b in zip(starts, starts[1:])]
print("FLOWER " + json.dumps({"rounds": rounds, "wall_s": time.perf_counter() - began}))
'''


def run_flower(python: str, overrides: list[str], fraction: float) -> dict[str, float]:
    payload = json.dumps({"scenario": str(SCENARIO), "overrides": overrides, "fraction": fraction})
    with PeakMemory() as memory:
        began = time.perf_counter()
        done = subprocess.run([python, "-c", FLOWER_SIDE, payload], capture_output=True, text=True, cwd=ROOT)
        process_s = time.perf_counter() - began
    lines = [line for line in done.stdout.splitlines() if line.startswith("FLOWER ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the Flower side failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    out = json.loads(lines[-1][len("FLOWER "):])
    return {**_summary(out["rounds"], out["wall_s"], memory.peak), "process_s": process_s}


# The runtime's default, where scale.toml keeps the round's start model on disk for the curve to
# 10,000 nodes (1.4-1.7 GB less there, 0.3-1.0 s a round more at 1000 nodes); a --set overrides it.
ROUND_START = 'runtime.round_start="memory"'


def run_p2pfl(overrides: list[str], fraction: float) -> dict[str, float]:
    """`p2pfl run` as a user runs it (its own interpreter): the run's wall as the launcher counts
    it (from its call of `run_loaded`, imports done, to the results), and the whole process."""
    sets = [ROUND_START, *overrides, f"runtime.participation={fraction}", 'runtime.topology="regular:4"']
    with tempfile.TemporaryDirectory() as tmp, PeakMemory() as memory:
        out = Path(tmp) / "run"
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "p2pfl", "run", str(SCENARIO), "--out", str(out), "--no-progress",
                               *(arg for s in sets for arg in ("--set", s))], capture_output=True, text=True, cwd=ROOT)
        process_s = time.perf_counter() - began
        results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else None
    if done.returncode != 0 or results is None:
        raise SystemExit(f"the p2pfl side failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    rounds = results["scenario"]["rounds"]
    # p2pfl's rounds have no common boundary: a node goes on as soon as its neighbours' versions
    # are there, and one that sits a round out goes on at once, so rounds overlap. Its round is
    # the span of all rounds (first start to last end) over their number, its first included.
    spans = [(r["started_at"], r["started_at"] + r["wall_s"]) for node in results["nodes"] for r in node["rounds"]]
    span = max(e for _, e in spans) - min(s for s, _ in spans)
    first = [(s, e) for node in results["nodes"] for r in node["rounds"][:1] for s, e in
             [(r["started_at"], r["started_at"] + r["wall_s"])] if r.get("participated", True)]
    first_s = max(e for _, e in first) - min(s for s, _ in first) if first else float("nan")
    return {"first_s": first_s, "round_s": span / rounds, "wall_s": results["summary"]["wall_s"],
            "process_s": process_s, "peak_gb": memory.peak / 1e9}


def _summary(rounds: list[float], wall_s: float, peak: int) -> dict[str, float]:
    later = rounds[1:] or rounds
    return {"first_s": rounds[0] if rounds else float("nan"), "round_s": statistics.median(later) if later else float("nan"),
            "wall_s": wall_s, "peak_gb": peak / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--model", default=None, help="model.name for both sides (default: the scenario's cnn)")
    parser.add_argument("--flower-python", default=sys.executable, help="the interpreter with flwr[simulation]")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", help="append this pair's figures to this JSON-lines file")
    args = parser.parse_args()
    # Both sides, and the node workers p2pfl starts, import `flower_net` from this folder.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent),
                                                          os.environ.get("PYTHONPATH")) if p)
    overrides = [*args.overrides, f"nodes={args.clients}", f"rounds={args.rounds}"]
    if args.model:
        overrides.append(f'model.name="{args.model}"')
    print(f"{args.clients} clients, {args.fraction:.0%} per round, {args.rounds} rounds, {os.cpu_count()} cores; "
          f"model {args.model or 'cnn'}", flush=True)
    flower = run_flower(args.flower_python, overrides, args.fraction)
    ours = run_p2pfl(overrides, args.fraction)
    print(f"{'':<8}{'first round s':>15}{'s / round':>11}{'wall s':>9}{'process s':>11}{'peak GB':>9}")
    for name, m in (("Flower", flower), ("p2pfl", ours)):
        print(f"{name:<8}{m['first_s']:>15.1f}{m['round_s']:>11.1f}{m['wall_s']:>9.1f}{m['process_s']:>11.1f}"
              f"{m['peak_gb']:>9.2f}")
    print(f"p2pfl / Flower: {ours['round_s'] / flower['round_s']:.2f}x per round, "
          f"{ours['wall_s'] / flower['wall_s']:.2f}x the run, {ours['process_s'] / flower['process_s']:.2f}x the "
          f"process, {ours['peak_gb'] / flower['peak_gb']:.2f}x peak memory")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps({"clients": args.clients, "fraction": args.fraction, "rounds": args.rounds,
                                 "model": args.model or "cnn", "flower": flower, "p2pfl": ours}) + "\n")


if __name__ == "__main__":
    main()
