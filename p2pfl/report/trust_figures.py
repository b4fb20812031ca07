"""Trust over one run (results.json's `trust`, `p2pfl.scenario.trust`): where each node places each
peer, as a picture (trust.png) and as a table (trust.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from p2pfl.report.style import save_figure
from p2pfl.scenario.trust import places, trust_places

MAX_SHOWN = 60  # past this many nodes a node-by-peer picture is unreadable: the table has them all


def trust_matrix(trust: Mapping[str, Any]) -> tuple[list[str], np.ndarray]:
    """Every node id, and `p2pfl.scenario.trust.trust_places` over them as an array (NaN where
    the node did not judge the peer)."""
    ids = sorted(set(trust["nodes"]) | set(trust["federation"]), key=_natural)
    return ids, np.array(trust_places(trust, ids), dtype=float)


def _natural(node_id: str) -> tuple[str, int]:
    head, _, tail = node_id.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (node_id, -1)


def plot_trust(results: Mapping[str, Any], out: Path) -> Path | None:
    trust = results.get("trust")
    if not trust or len(trust["nodes"]) > MAX_SHOWN:
        return None
    ids, places = trust_matrix(trust)
    short = [nid.replace("node-", "") for nid in ids]
    federation = trust["federation"]
    fig, (ax, side) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    im = ax.imshow(places, cmap="RdYlGn_r", vmin=0, vmax=1)
    ax.set_xticks(range(len(ids)), short, fontsize=7)
    ax.set_yticks(range(len(ids)), short, fontsize=7)
    ax.set_xlabel("peer")
    ax.set_ylabel("node")
    ax.set_title("each node's ranking of its peers\n(0 most trusted, 1 least; blank: not judged)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
    judged = [nid for nid in ids if nid in federation]
    mean_place = [federation[nid]["mean_place"] for nid in judged]
    side.barh(range(len(judged)), mean_place, color=plt.get_cmap("RdYlGn_r")(np.array(mean_place)))
    side.set_yticks(range(len(judged)), [nid.replace("node-", "") for nid in judged], fontsize=7)
    side.invert_yaxis()
    side.set_xlim(0, 1)
    side.set_xlabel("mean place over the nodes that judged it")
    side.set_title("the federation's view of each peer", fontsize=9)
    return save_figure(fig, out / "trust.png")


def trust_table(results: Mapping[str, Any], out: Path) -> Path | None:
    """trust.md: each node's least and most trusted peer with the evidence, then the
    federation's view, least trusted first."""
    trust = results.get("trust")
    if not trust:
        return None
    lines = ["# Trust over the run", "",
             "Each node ranks the peers its strategy scored by their mean score (pFedSV: relevance, FedC2I: "
             "influence λ; a strategy that scores no peer: by conduct), and separately by conduct: the geometric "
             "mean over the rounds a peer answered of the share of its update taken (1 as sent, 1/factor "
             "pulled back within runtime.update_bound, 1/10 refused).", "",
             "| node | least trusted | its score | its conduct | bounded rounds (counts) | refused | silent | worst conduct | "
             "its conduct |", "|---|---|---|---|---|---|---|---|---|"]
    for nid in sorted(trust["nodes"], key=_natural):
        view = trust["nodes"][nid]
        if not view["ranking"]:
            continue
        last, worst = view["ranking"][-1], (view["conduct_ranking"] or [None])[-1]
        t = view["peers"][last]
        worst_conduct = "–" if worst is None else view["peers"][worst]["conduct"]
        tied = [p for p, place in places(view["peers"]).items() if place == places(view["peers"])[last]]
        # A tie at the bottom names nobody (FedAvg: every honest peer's conduct is 1).
        named = last if len(tied) == 1 else f"none: {len(tied)} peers alike"
        lines.append(f"| {nid} | {named} | {_num(t['score'])} | {_num(t['conduct'])} | {t['bounded']} ({t.get('bounded_counts', t['bounded'])}) | "
                     f"{t['refused']} | {t['silent']} | {worst or '–'} | {_num(worst_conduct)} |")
    lines += ["", "| peer | mean place (0 most trusted, 1 least) | ranked by |", "|---|---|---|"]
    for peer, view in sorted(trust["federation"].items(), key=lambda kv: -kv[1]["mean_place"]):
        lines.append(f"| {peer} | {view['mean_place']:.2f} | {view['ranked_by']} |")
    path = out / "trust.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def attacker_rank_table(runs: Mapping[str, list[Mapping[str, Any]]]) -> str | None:
    """trust_ranking.md, for a compare folder whose runs have an [attack]: per row, at how many
    honest nodes an attacker is the least trusted peer (strictly), by the strategy's scores and
    by conduct, each seed's count and all seeds together. None when no run has an attack."""
    from p2pfl.scenario.trust import ranked_last

    rows = []
    for label, results in runs.items():
        attacked = [r for r in results if (r["scenario"].get("attack") or {}).get("kind", "none") != "none"]
        if not attacked:
            continue
        counts: dict[str, list[tuple[int, int]]] = {"score": [], "conduct": []}
        for run in attacked:
            attackers = {run["nodes"][i]["id"] for i in run["scenario"]["attack"]["nodes"]}
            views = (run.get("trust") or {}).get("nodes", {})
            honest = [views.get(n["id"], {}).get("peers", {}) for n in run["nodes"] if n["id"] not in attackers]
            for by in counts:
                counts[by].append((sum(ranked_last(t, attackers, by) for t in honest), len(honest)))
        cells = []
        for by in ("score", "conduct"):
            hit, total = sum(c[0] for c in counts[by]), sum(c[1] for c in counts[by])
            cells.append(f"{hit} of {total} ({100 * hit / max(total, 1):.0f} %); by seed "
                         + ", ".join(f"{c[0]}/{c[1]}" for c in counts[by]))
        rows.append(f"| {label} | {cells[0]} | {cells[1]} | {len(attacked)} |")
    if not rows:
        return None
    return "\n".join(["| row | attacker least trusted, by the strategy's scores | by conduct | seeds |",
                      "|---|---|---|---|", *rows])
