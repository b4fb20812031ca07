"""results.json: the resolved scenario, every node's rounds, a summary, and the partition's ground truth."""

from __future__ import annotations

import functools
import json
import math
import statistics
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from p2pfl.runtime.config import node_ids
from p2pfl.runtime.status import ENDED_BADLY
from p2pfl.scenario.deaths import read_death
from p2pfl.scenario.membership import has_churn, membership_timeline
from p2pfl.runtime.peer_claims import FAR_BOUND_FACTOR
from p2pfl.scenario.trust import run_trust
from p2pfl.runtime.files import read_records, write_json_atomic
from p2pfl.runtime.run_folder import RunFolder, load_artefacts
from p2pfl.runtime.strategy import COORDINATOR_ID
from p2pfl.runtime.topology import Topology
from p2pfl.runtime.timing import compute_fraction
from p2pfl.runtime.node.records import PARTICIPATED, TEST_ACC, TEST_ACC_AGGREGATED


STOPPED = -15  # the exit status the launcher gives a node it stopped (as Popen reports SIGTERM)

# More unanswered downloads than this share, over a run's second half, gets a warning. A run
# alone on its machine answers nearly all of them after its first rounds (the 100-node pFedSV
# runs on 2 cores: at most 3 % unanswered); two made beside another 100-node run lost 28 and
# 50 % to fetch_timeout_s (docs/experiments.md).
UNANSWERED_WARN_SHARE = 0.1


def download_health(nodes: list[Mapping[str, Any]]) -> dict[str, Any]:
    """How many of the downloads the nodes asked for went unanswered, over the run and over its
    second half of rounds (the first rounds wait on peers still training their first model).
    A round counts each peer asked for once; `unanswered` leaves out peers that had said
    goodbye (records made before it was kept count every peer that did not answer)."""
    last = max((r["round"] for n in nodes for r in n.get("rounds", [])), default=0)
    asked = missing = asked_late = missing_late = 0
    for n in nodes:
        for r in n.get("rounds", []):
            n_asked = int(r.get("asked") or 0)
            n_missing = int(r["unanswered"]) if "unanswered" in r else n_asked - len(set(r.get("arrived") or []))
            asked, missing = asked + n_asked, missing + n_missing
            if 2 * r["round"] > last:
                asked_late, missing_late = asked_late + n_asked, missing_late + n_missing
    return {"asked": asked, "unanswered": missing, "asked_second_half": asked_late,
            "unanswered_second_half": missing_late,
            "unanswered_share_second_half": missing_late / asked_late if asked_late else None}


def download_warning(health: Mapping[str, Any]) -> str | None:
    """A line saying that peers often did not answer in the run's second half, or None."""
    share = health.get("unanswered_share_second_half")
    if share is None or share <= UNANSWERED_WARN_SHARE:
        return None
    return (f"warning: {100 * share:.0f} % of the downloads asked for in the second half of the rounds went "
            f"unanswered ({health['unanswered_second_half']} of {health['asked_second_half']}): peers that "
            "died, or a machine too loaded to answer within runtime.fetch_timeout_s; the nodes learned from "
            "fewer peers than the scenario says, so do not compare this run with one where they answered")


def refused_peers(nodes: list[Mapping[str, Any]], key: str = "peers_refused",
                  counts_if: Callable[[Any], bool] = lambda _: True) -> dict[str, int]:
    """Per peer, in how many node-rounds its part was refused for a claim over a bound
    (`peers_refused` in the round records, `p2pfl.runtime.peer_claims`), or with
    `key="peers_bounded"` pulled back within `runtime.update_bound`; only the node-rounds whose
    recorded value `counts_if` accepts."""
    counts: dict[str, int] = {}
    for n in nodes:
        for r in n.get("rounds", []):
            named = r.get(key) or {}
            for peer in named:
                if counts_if(named[peer] if isinstance(named, Mapping) else None):
                    counts[peer] = counts.get(peer, 0) + 1
    return dict(sorted(counts.items()))




def far_bounded_peers(nodes: list[Mapping[str, Any]], factor: float = FAR_BOUND_FACTOR) -> dict[str, int]:
    """Per peer, in how many node-rounds its part lay at least `factor` times over the bound."""
    return refused_peers(nodes, "peers_bounded_factor",
                         lambda over: isinstance(over, (int, float)) and over >= factor)


LISTED_PEERS = 10  # peers a warning names before "and N more"


def bounded_warning(bounded: Mapping[str, int], node_rounds: int,
                    far: Mapping[str, int] | None = None) -> str | None:
    """Lines on the peers whose parts were pulled back within runtime.update_bound, or None: a
    warning for those far over it (`far`, node-rounds per peer), a note for the rest."""
    far = far or {}
    lines = []

    def listing(counts: Mapping[str, int]) -> str:
        """The most frequent peers first; at a thousand nodes the whole list is a page (results.json has it)."""
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{peer} ({count} of {node_rounds} node-rounds)" for peer, count in ranked[:LISTED_PEERS])
        rest = len(ranked) - LISTED_PEERS
        return shown + (f" and {rest} more peers (results.json's summary lists them all)" if rest > 0 else "")

    if far:
        listed = listing(far)
        lines.append(f"warning: parts at least {FAR_BOUND_FACTOR:g} times over runtime.update_bound of the "
                     f"receiving node's own update, pulled back: {listed}; a poisoning peer, or a model far from "
                     "all its neighbours: the round records' `peers_bounded` say how far")
    near = {peer: count for peer, count in bounded.items() if peer not in far}
    if near:
        listed = listing(near)
        lines.append(f"note: parts pulled back within runtime.update_bound, less than {FAR_BOUND_FACTOR:g} times "
                     f"over: {listed}; usual between honest nodes whose data differ (docs/security.md)")
    return "\n".join(lines) or None


def degraded_warning(degraded: Mapping[str, list[int]]) -> str | None:
    """A line naming the nodes that received nothing in some rounds, or None."""
    if not degraded:
        return None
    listed = "; ".join(f"{nid} in rounds {', '.join(map(str, rounds[:8]))}{' ...' if len(rounds) > 8 else ''}"
                       for nid, rounds in degraded.items())
    return (f"warning: nodes received nothing from any peer they asked ({listed}): status \"degraded\"; "
            "their logs name the peers that did not answer")


def fell_back(nodes: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Node-rounds in which the strategy fell back (`fell_back` in its round artefacts: a robust
    rule with too few models kept the node's own), their count per node and the first reason."""
    counts: dict[str, int] = {}
    reason = None
    for n in nodes:
        for r in n.get("rounds", []):
            why = (r.get("strategy") or {}).get("fell_back")
            if why:
                counts[n["id"]] = counts.get(n["id"], 0) + 1
                reason = reason or str(why)
    return {"node_rounds": sum(counts.values()), "nodes": counts, "reason": reason} if counts else {}


def fallback_warning(fallbacks: Mapping[str, Any], node_rounds: int) -> str | None:
    if not fallbacks:
        return None
    return (f"warning: the strategy fell back in {fallbacks['node_rounds']} of {node_rounds} node-rounds "
            f"({fallbacks['reason']}; nodes: {', '.join(sorted(fallbacks['nodes']))}): those rounds did not run "
            "the named rule; the round records' `strategy.fell_back` say which")


def refusal_warning(refused: Mapping[str, int]) -> str | None:
    """A line naming the peers whose parts were refused, or None."""
    if not refused:
        return None
    listed = ", ".join(f"{peer} ({count} node-rounds)" for peer, count in refused.items())
    return (f"warning: parts refused for claims over runtime.max_weight_ratio / max_norm_ratio / update_refuse: "
            f"{listed}; the round records' `peers_refused` say why")


# What two runs of one seed must agree on, per node and round. Bytes and times are left out: a
# peer's reads land in whichever of its rounds they arrive, and wall time is never the same.
SAME_RUN_KEYS = (PARTICIPATED, TEST_ACC, TEST_ACC_AGGREGATED, "train_loss", "asked", "arrived", "stale")


def first_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[int, list[str]] | None:
    """The first round in which two runs' node records differ (in SAME_RUN_KEYS, or in which
    rounds there are), with the nodes that differ in it; None when the runs are the same."""
    nodes_a = {n["id"]: {r["round"]: r for r in n.get("rounds", [])} for n in a["nodes"]}
    nodes_b = {n["id"]: {r["round"]: r for r in n.get("rounds", [])} for n in b["nodes"]}
    first: dict[str, int] = {}
    for nid in sorted(set(nodes_a) | set(nodes_b)):
        rounds_a, rounds_b = nodes_a.get(nid, {}), nodes_b.get(nid, {})
        for r in sorted(set(rounds_a) | set(rounds_b)):
            ra, rb = rounds_a.get(r), rounds_b.get(r)
            if ra is None or rb is None or any(ra.get(k) != rb.get(k) for k in SAME_RUN_KEYS):
                first[nid] = r
                break
    if not first:
        return None
    earliest = min(first.values())
    return earliest, sorted(nid for nid, r in first.items() if r == earliest)


def _mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.pstdev(values) if len(values) > 1 else 0.0)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The code a run was made with: the package version and, in a git checkout, the commit
    (with "+changes" when the working tree differs from it), so that a table names its code."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        made = f"p2pfl-influence {version('p2pfl-influence')}"
    except PackageNotFoundError:
        made = "p2pfl-influence (not installed)"
    source = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--short=10", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no", "--", "p2pfl"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return made
    return f"{made} at {commit}" + ("+changes" if changed else "")


def recorded_rounds(out: Path, nid: str) -> list[dict[str, Any]]:
    """The rounds a node that left no result recorded as it went, one per round, in order."""
    by_round = {r["round"]: r for r in read_records(RunFolder(out).node_rounds(nid), ("round",))}
    return [by_round[r] for r in sorted(by_round)]


def build_results(scenario: Any, out: Path, exit_codes: Mapping[str, int], wall_s: float,
                  ground_truth: Mapping[str, Any], ids: Sequence[str] | None = None) -> dict[str, Any]:
    """`ids`: the nodes whose results to gather (default the scenario's `node-i`; a federation's
    merge names its members)."""
    nodes = []
    for nid in ids if ids is not None else node_ids(scenario.nodes):
        path = RunFolder(out).node_result(nid)
        if path.is_file():
            result = json.loads(path.read_text())
        elif exit_codes.get(nid) == STOPPED:
            result = {"id": nid, "status": "stopped", "error": "stopped before its last round (Ctrl-C or SIGTERM); "
                      "--resume goes on from its last checkpoint", "rounds": recorded_rounds(out, nid),
                      "final_test_acc": None}
        elif (death := read_death(out, nid)) is not None:  # named by the launcher as it died
            result = {"id": nid, "status": "failed", "error": f"{death['cause']} after round {death['after_round']}; "
                      f"resume it: {death['resume']}", "rounds": recorded_rounds(out, nid), "final_test_acc": None}
        else:
            result = {"id": nid, "status": "failed", "error": f"no result file (exit code {exit_codes.get(nid)})",
                      "rounds": [], "final_test_acc": None}
        result["exit_code"] = exit_codes.get(nid)
        nodes.append(result)
    coordinator = None
    coord_path = RunFolder(out).node_result(COORDINATOR_ID)
    if coord_path.is_file():
        coordinator = json.loads(coord_path.read_text())
    finished = [n for n in nodes if n.get("final_test_acc") is not None]
    accs = [n["final_test_acc"] for n in finished]
    mean_acc, std_acc = _mean_std(accs)
    agg_mean, _ = _mean_std([n.get("final_test_acc_aggregated") for n in finished])
    n_test = [n.get("n_test", 0) for n in finished]
    weighted = sum(a * w for a, w in zip(accs, n_test)) / sum(n_test) if sum(n_test) else float("nan")
    total_bytes = sum(n.get("totals", {}).get("bytes_sent", 0) for n in nodes)
    total_param = sum(n.get("totals", {}).get("param_bytes_sent", 0) for n in nodes)
    if coordinator is not None:
        total_bytes += coordinator.get("totals", {}).get("bytes_sent", 0)
        total_param += coordinator.get("totals", {}).get("param_bytes_sent", 0)
    eps = [float(n["final_epsilon"]) for n in finished if n.get("final_epsilon") is not None]
    summary = {
        "mean_acc": mean_acc,
        "std_acc": std_acc,
        "weighted_acc": weighted,
        "mean_acc_aggregated": agg_mean,
        "total_bytes": total_bytes,
        "total_param_bytes": total_param,
        "wall_s": wall_s,
        "max_epsilon": (("inf" if math.isinf(max(eps)) else max(eps)) if eps else None),
        "compute_fraction": compute_fraction(r for n in nodes for r in n.get("rounds", [])),
        "nodes_ok": sum(1 for n in nodes if n.get("status") == "ok"),
        # By each node's own status: a worker's exit code covers all its nodes, good or bad.
        "nodes_failed": [n["id"] for n in nodes if n.get("status") in ENDED_BADLY],
        "nodes_stopped": [n["id"] for n in nodes if n.get("status") == "stopped"],
        # Ended, but with rounds in which they received nothing from any peer they asked.
        "nodes_degraded": {n["id"]: n.get("rounds_alone") for n in nodes if n.get("status") == "degraded"},
        "downloads": download_health(nodes),
        "peers_refused": refused_peers(nodes),
        "peers_bounded": refused_peers(nodes, "peers_bounded"),
        "peers_bounded_far": far_bounded_peers(nodes),
        "fell_back": fell_back(nodes),
    }
    if coordinator is not None and coordinator.get("rounds"):
        held = [r.get("held_out_acc") for r in coordinator["rounds"] if r.get("held_out_acc") is not None]
        if held:
            summary["held_out_acc"] = held[-1]
            summary["held_out_acc_best"] = max(held)
    out = {
        "scenario": scenario.to_dict(),
        "algorithm": scenario.algorithm.name,
        "nodes": nodes,
        "coordinator": coordinator,
        "summary": summary,
        "topology": topology_record(scenario),
        "ground_truth": dict(ground_truth),
        "code_version": code_version(),
    }
    if scenario.churn.active or has_churn(nodes):
        out["membership"] = membership_timeline(nodes, scenario.rounds)
    trust = run_trust(nodes)
    if trust is not None:
        out["trust"] = trust
    indices = client_indices(nodes, coordinator)
    if indices is not None:
        out["client2vec"] = indices
    return out


REASON_CHARS = 800  # room for a damaged checkpoint's two paths and the command that puts the previous one back


def failure_lines(results: Mapping[str, Any], out: Path) -> list[str]:
    """One line per node that ended badly, under its id: the last line of its error (a
    traceback's is the exception), else the last line of its log."""
    lines = []
    for node in results.get("nodes") or []:
        if node.get("status") not in ENDED_BADLY:
            continue
        error = [line.strip() for line in str(node.get("error") or "").splitlines() if line.strip()]
        reason = error[-1] if error else ""
        if not reason or reason.startswith("no result file"):
            log = RunFolder(out).log(node["id"])  # a process of its own (placement "process") logs under its id
            tail = [line.strip() for line in log.read_text(errors="replace").splitlines()[-50:] if line.strip()] \
                if log.is_file() else []
            reason = tail[-1] if tail else reason or "no error recorded"
        lines.append(f"  {node['id']}: {reason[:REASON_CHARS]}")
    return lines


def scenario_data_fingerprint(scenario: Any) -> dict[str, str]:
    """What the scenario's data depends on on this machine (p2pfl.data.data_fingerprint)."""
    from p2pfl.data import data_fingerprint

    return data_fingerprint(scenario.data.resolved_domains()) if scenario.data.dataset == "digits" else {}


def write_results(scenario: Any, out: Path, exit_codes: Mapping[str, int], wall_s: float,
                  ground_truth: Mapping[str, Any], *, started_at: float | None = None,
                  ids: Sequence[str] | None = None) -> dict[str, Any]:
    """`results.json` of the run in `out`, written whole, the same for every placement, a stopped
    run and a LAN run's merge: `build_results` with the data fingerprint and relevance scores."""
    from p2pfl.scenario.relevance import score_run

    results = build_results(scenario, out, exit_codes, wall_s, ground_truth, ids)
    results["data_fingerprint"] = scenario_data_fingerprint(scenario)
    if started_at is not None:  # how long the nodes took to start: until the first round began after the launch
        # (a resumed run's earlier rounds began before it: they are not its start-up)
        firsts = [r["started_at"] for n in results["nodes"] for r in n.get("rounds") or []
                  if isinstance(r.get("started_at"), (int, float)) and r["started_at"] >= started_at]
        if firsts:
            results["summary"]["startup_s"] = min(firsts) - started_at
    scores = score_run(load_artefacts(out), results["ground_truth"], [n["id"] for n in results["nodes"]])
    if scores is not None:
        results["relevance_scores"] = scores
    write_json_atomic(RunFolder(out).results, results)
    return results


def client_indices(nodes: list[dict[str, Any]], coordinator: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Client2Vec's indices, gathered from the nodes' setup records: {"strategy", "indices",
    "feature_indices", "seconds" (the slowest node's setup, the coordinator's training included),
    "coordinator_seconds"}; None for other algorithms."""
    records = {n["id"]: ((n.get("setup") or {}).get("strategy") or {}).get("client2vec") for n in nodes}
    records = {k: v for k, v in records.items() if v}
    if not records:
        return None
    setup = (coordinator or {}).get("setup") or {}
    return {
        "strategy": next(iter(records.values()))["strategy"],
        "indices": {k: v["index"] for k, v in records.items()},
        "feature_indices": {k: v["feature_index"] for k, v in records.items()},
        "seconds": max(float(v["seconds"]) for v in records.values()),
        "coordinator_seconds": (setup.get("info") or {}).get("seconds"),
    }


def topology_record(scenario: Any) -> dict[str, Any]:
    """The graph the nodes used, as each of them computed it: spec and adjacency by node id."""
    ids = node_ids(scenario.nodes)
    neighbours = Topology.parse(scenario.runtime.topology).neighbours(scenario.nodes, scenario.seed)
    return {"spec": scenario.runtime.topology, "adjacency": {ids[i]: [ids[j] for j in ns] for i, ns in enumerate(neighbours)}}


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value == "inf":
        return "inf"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def active_defences(scenario: Mapping[str, Any]) -> list[str]:
    """The runtime defences that change what an honest run computes, as on in this (resolved,
    stored) scenario: what a row named "fedavg" ran besides FedAvg."""
    from p2pfl.scenario.migrations import WEIGHT_CAP_BEFORE_RECORDED
    from p2pfl.scenario.schema import as_today

    runtime = as_today(scenario).get("runtime") or {}
    on = []
    if runtime.get("update_bound"):
        on.append(f"bound {runtime['update_bound']:g}")
    cap = runtime.get("max_weight_ratio", WEIGHT_CAP_BEFORE_RECORDED)
    if cap:
        on.append(f"weight cap {cap:g}")
    if ((scenario.get("algorithm") or {}).get("params") or {}).get("fallback"):
        on.append("own model where too few models arrive")
    return on


def format_summary(results: Mapping[str, Any]) -> str:
    """The table `p2pfl run` prints: accuracies in percent, as in `compare` and `report`
    (results.json keeps fractions)."""
    header = (f"{'node':<10} {'domain':<8} {'status':<16} {'n_train':>7} {'acc %':>6} {'agg %':>6} {'epsilon':>8} "
              f"{'sent':>10} {'received':>10}")
    lines = [header, "-" * len(header)]
    for n in results["nodes"]:
        totals = n.get("totals", {})
        lines.append(
            f"{n['id']:<10} {str(n.get('domain') or '-'):<8} {n.get('status', '?'):<16} {n.get('n_train', 0):>7} "
            f"{_pct(n.get('final_test_acc')):>6} {_pct(n.get('final_test_acc_aggregated')):>6} "
            f"{_fmt(n.get('final_epsilon'), '.2f'):>8} {human_bytes(totals.get('bytes_sent', 0)):>10} "
            f"{human_bytes(totals.get('bytes_received', 0)):>10}"
        )
    s = results["summary"]
    lines.append("-" * len(header))
    lines.append(
        f"{' + '.join([results['algorithm'], *active_defences(results.get('scenario') or {})])}: "
        f"mean acc {_pct(s['mean_acc'])} % (std {_pct(s['std_acc'])}), weighted {_pct(s['weighted_acc'])} %, "
        f"after aggregation {_pct(s.get('mean_acc_aggregated'))} %, epsilon {_fmt(s.get('max_epsilon'), '.2f')}, "
        f"bytes {human_bytes(s['total_bytes'])}, wall {s['wall_s']:.1f} s"
        + (f" (start-up {s['startup_s']:.1f} s)" if isinstance(s.get("startup_s"), (int, float)) else "")
        + f", compute fraction {_fmt(s.get('compute_fraction'), '.2f')}"
    )
    if "held_out_acc" in s:
        lines.append(f"held-out domain accuracy (global model): {_pct(s['held_out_acc'])} % (best round {_pct(s['held_out_acc_best'])} %)")
    if s.get("nodes_failed"):
        lines.append(f"nodes that failed or ended isolated: {', '.join(s['nodes_failed'])}")
    coordinator = results.get("coordinator") or {}
    short = {x["round"]: x["missing_live"] for x in coordinator.get("rounds") or [] if x.get("missing_live")}
    if short:
        lines.append("warning: the coordinator aggregated rounds without members that were still live (their "
                     "submissions did not arrive): " + "; ".join(f"round {r}: {', '.join(m)}" for r, m in short.items()))
    restarted = {n["id"]: [r.get("after_round") for r in n.get("restarts") or []] for n in results["nodes"]
                 if n.get("restarts")}
    if restarted:
        lines.append("nodes restarted from their checkpoint (--resume, or a crash in [churn]): " + "; ".join(
            f"{nid} after round{'s' if len(after) > 1 else ''} {', '.join(map(str, after))}"
            for nid, after in restarted.items()))
    replaced = sum(len((r.get("neighbours") or {}).get("replaced") or {}) for n in results["nodes"]
                   for r in n.get("rounds", []))
    if replaced:
        lines.append(f"note: neighbours replaced {replaced} times (a neighbour that left, or was silent two rounds "
                     "running, gave way to a stand-in from the roster): the nodes did not all learn from the "
                     "topology's neighbours; each round's record lists the changes under `neighbours`")
    node_rounds = sum(1 for n in results["nodes"] for r in n.get("rounds", []) if r.get("participated", True))
    for warning in (download_warning(s["downloads"]), refusal_warning(s.get("peers_refused") or {}),
                    bounded_warning(s.get("peers_bounded") or {}, node_rounds, s.get("peers_bounded_far")),
                    degraded_warning(s.get("nodes_degraded") or {}), fallback_warning(s.get("fell_back") or {}, node_rounds)):
        if warning is not None:
            lines.append(warning)
    return "\n".join(lines)


def _pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * float(value):.1f}"
