"""Algorithms on capped links: the same scenario with every node on its own host (a network
namespace, `p2pfl.testbed`), each link capped by `tc tbf`, per method and wire precision.

    sudo python benchmarks/links.py [SCENARIO] [--rates 1000,100,10] [--rows ROWS]
        [--out runs/links] [--set key=value ...]

ROWS are compare rows (`p2pfl compare` syntax; a dotted key overrides the scenario), default:
fedavg, fedavg at float16 and int8, pfedsv (dynamic top-k), pfedsv[D+C] and
fedc2i[variant=Lambda/l] (heads only). Nodes are deployed as on a LAN: `p2pfl lan` writes the
keys, roster and configs, and one `p2pfl node` runs per namespace. Each run's folder under
--out holds the nodes' results, merged into `results.json` as `p2pfl report` would.

Printed per rate and row: wall per round and exchange seconds per round (means over nodes and
rounds, from the round timings), MiB each node receives per round (parameters plus metadata;
what it sends is what its peers receive), and the mean final accuracy after training and
after aggregation. Needs root and iproute2; a table in markdown at the end.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from p2pfl.report import merge_node_results
from p2pfl.runtime.config import node_ids
from p2pfl.runtime.run_folder import row_slug
from p2pfl.scenario.compare import parse_algorithms, row_raw
from p2pfl.scenario.launcher import uses_coordinator, write_lan_configs
from p2pfl.scenario.schema import apply_overrides, read_raw, scenario_from_dict
from p2pfl.testbed import NetnsHosts, available

DEFAULT_ROWS = ("fedavg,fedavg[runtime.wire_precision=float16],fedavg[runtime.wire_precision=int8],"
                "pfedsv[k=2,k_min=2],pfedsv[k=2,k_min=2,variant=D+C],fedc2i[variant=Lambda/l]")
PORT = 9000


def run_on_links(raw: dict[str, Any], rate_mbit: float, out: Path, timeout_s: float) -> dict[str, Any]:
    """One run of the scenario `raw` with each node in its own namespace behind a `rate_mbit`
    link; the merged results."""
    out.mkdir(parents=True, exist_ok=True)
    scenario_path = out / "scenario.json"
    scenario_path.write_text(json.dumps(raw, indent=1))
    scenario = scenario_from_dict(raw, source=str(scenario_path))
    ids = node_ids(scenario.nodes)
    with NetnsHosts(ids + ["coordinator"], rate_mbit=rate_mbit) as bed:
        coordinator = f"{bed.address('coordinator')}:{PORT}"
        configs = write_lan_configs(scenario_path, [f"{bed.address(i)}:{PORT}" for i in ids], out / "lan", coordinator
                                    if uses_coordinator(scenario) else None)
        procs = []
        for config in configs:
            host = config.stem
            verb = "coordinator" if host == "coordinator" else "node"
            procs.append(bed.spawn(host, [sys.executable, "-m", "p2pfl", verb, str(config)], log=out / f"{host}.log"))
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    run = out / "lan" / "run"
    if not merge_node_results(run):
        raise RuntimeError(f"no node wrote a result under {run}; see the logs in {out}")
    return json.loads((run / "results.json").read_text())


def summarize(results: dict[str, Any]) -> dict[str, float]:
    rounds = [r for n in results["nodes"] for r in n["rounds"] if r.get("participated", True)]
    finals = [n["rounds"][-1] for n in results["nodes"] if n["rounds"]]
    return {
        "wall_s": statistics.fmean(r["wall_s"] for r in rounds),
        "exchange_s": statistics.fmean(r["time"]["exchange_s"] for r in rounds),
        "mib_per_round": statistics.fmean(r["bytes_received"] for r in rounds) / 2**20,
        "acc": statistics.fmean(r["test_acc"] for r in finals),
        "acc_aggregated": statistics.fmean(r["test_acc_aggregated"] for r in finals),
        "failed": sum(n["status"] != "ok" for n in results["nodes"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", type=Path, nargs="?", default=Path("scenarios/links.toml"))
    parser.add_argument("--rates", default="1000,100,10", help="link caps in Mbit/s, comma-separated")
    parser.add_argument("--rows", default=DEFAULT_ROWS)
    parser.add_argument("--out", type=Path, default=Path("runs/links"))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    args = parser.parse_args()
    # A kill must still remove the namespaces: SystemExit unwinds the `with` that made them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ok, why = available()
    if not ok:
        print(f"links.py {why}", file=sys.stderr)
        return 2
    base = apply_overrides(read_raw(args.scenario), args.overrides)
    rows = parse_algorithms(args.rows)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    for row in rows:  # every row's scenario is valid before the first run
        scenario_from_dict(row_raw(base, row), source=str(args.scenario))
    table = []
    for rate in rates:
        for row in rows:
            started = time.perf_counter()
            results = run_on_links(row_raw(base, row), rate, args.out / f"{rate:g}mbit" / row_slug(row.label),
                                   args.timeout)
            s = summarize(results)
            table.append((rate, row.label, s))
            print(f"{rate:>6g} Mbit/s  {row.label:<44} wall {s['wall_s']:6.2f} s/round  exchange {s['exchange_s']:6.2f} s  "
                  f"{s['mib_per_round']:6.2f} MiB in/node/round  acc {100 * s['acc']:.1f} % "
                  f"({100 * s['acc_aggregated']:.1f} % aggregated)  [{time.perf_counter() - started:.0f} s"
                  + (f", {s['failed']} nodes failed]" if s["failed"] else "]"), flush=True)
    print("\n| link | method | wall s/round | exchange s/round | MiB in/node/round | acc % | acc % aggregated |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for rate, label, s in table:
        print(f"| {rate:g} Mbit/s | `{label}` | {s['wall_s']:.2f} | {s['exchange_s']:.2f} | {s['mib_per_round']:.2f} "
              f"| {100 * s['acc']:.1f} | {100 * s['acc_aggregated']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
