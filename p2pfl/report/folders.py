"""`p2pfl report DIR` over what DIR holds: a run, a compare, or a LAN run's per-node results."""

from __future__ import annotations

import json
from pathlib import Path


from p2pfl.report.compare_figures import report_compare
from p2pfl.report.run_figures import report_run
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.runtime.config import node_ids


def make_report(folder: Path) -> list[Path]:
    folder = Path(folder)
    if (folder / "compare.json").is_file():
        paths = report_compare(folder)
        for run in sorted(folder.glob("*/seed*/results.json")):
            paths += report_run(run.parent)
        return paths
    if (folder / "results.json").is_file():
        return report_run(folder)
    if merge_node_results(folder):
        return report_run(folder)
    raise FileNotFoundError(f"{folder} holds neither results.json (a run), nor compare.json (a compare), nor "
                            "scenario.json with nodes/*.result.json (a LAN run's per-node results)")


def merge_node_results(folder: Path) -> bool:
    """A LAN run has no launcher: each node wrote `nodes/<id>.result.json` (and `scenario.json`)
    into its own run folder. Copied into one folder, they become the `results.json` a launcher
    would have written; False when the folder holds no such files."""
    from p2pfl.data import build_partition
    from p2pfl.scenario.results import write_results
    from p2pfl.scenario.schema import as_today, scenario_from_dict

    run = RunFolder(folder)
    results = sorted((folder / "nodes").glob("*.result.json"))
    if not run.scenario.is_file() or not results:
        return False
    scenario = scenario_from_dict(as_today(json.loads(run.scenario.read_text())), source=str(run.scenario))
    walls = [json.loads(p.read_text()).get("wall_s", 0.0) for p in results]
    partition = build_partition(scenario.data, scenario.nodes, scenario.seed, only=[])
    write_results(scenario, folder, {}, max(walls), partition.ground_truth(), ids=run.ids_here(node_ids(scenario.nodes)))
    return True
