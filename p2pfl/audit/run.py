"""`p2pfl audit RUN --node ID`: one node's seat, every peer it read, every attack, one audit.json.

The attacks see the `Seat` only (the parts the node read, its own data and models). The truth
they are scored against, each peer's training images (members) and held-out images of the same
distribution (non-members: its validation split, and its test split where that is drawn from its
own distribution), is built apart from the seat, once for every peer attacked; an attack gets from
it only the candidate images it is asked about, and the pictures are scored against it afterwards.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from p2pfl.audit.inversion import class_inversion, nearest, ssim, trained_labels, update_inversion
from p2pfl.audit.membership import ShadowAttack, loss_scores
from p2pfl.audit.seat import Received, Seat
from p2pfl.core.leakage import leakage
from p2pfl.data.types import NodeData
from p2pfl.runtime.files import write_json_atomic
from p2pfl.runtime.run_folder import RunFolder

ATTACKED_PARTS = ("full", "body", "head")  # a model's parts; setup parts and statistics are not models


@dataclass(frozen=True)
class AuditSettings:
    members: int = 500             # at most this many of a peer's training images are challenged
    shadows: int = 2               # shadow models for ART's black-box attack
    shadow_epochs: int = 20
    inversion_iterations: int = 300  # MIFace's and the update inversion's optimisation steps
    inversion_peers: int = 1       # the peers (in id order) both inversions run on: each costs a minute on a core
    update_images: int = 4         # dummy images an update is inverted into
    delta: float = 1e-5
    seed: int = 0


def _latest(parts: list[Received]) -> Received | None:
    models = [r for r in parts if r.part in ATTACKED_PARTS]
    if not models:
        return None
    last = max(r.round for r in models)
    return sorted((r for r in models if r.round == last), key=lambda r: ATTACKED_PARTS.index(r.part))[0]


def _challenge(seat: Seat, data: NodeData, cap: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A peer's candidates: up to `cap` of its training images (members), then its held-out
    images of the same distribution (non-members)."""
    held = [data.val] + ([data.test] if seat.scenario.data.test_split == "own_distribution" else [])
    x = torch.cat([s.x for s in held])[:cap]
    y = torch.cat([s.y for s in held])[:cap]
    keep = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(seed))[:cap]
    return torch.cat([data.train.x[keep], x]), torch.cat([data.train.y[keep], y])


def audit_peer(seat: Seat, shadow: ShadowAttack, peer: str, data: NodeData, settings: AuditSettings,
               invert: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """`data`: the peer's own splits, the truth its attacks are scored against (the scorer's, not the seat's)."""
    latest = _latest(seat.received[peer])
    if latest is None:
        return {"skipped": "no model part was read from it"}, {}
    target = seat.assembled(latest)
    cx, cy = _challenge(seat, data, settings.members, settings.seed)
    n_members = min(settings.members, len(data.train))
    # the attacks, from the seat: scores for the candidates, pictures
    scores = {"loss": loss_scores(target, cx, cy), "shadow": shadow.scores(target, cx, cy)}
    out: dict[str, Any] = {"part": latest.part, "round": latest.round, "membership": {
        name: leakage(s[:n_members], s[n_members:], settings.delta).as_dict() for name, s in scores.items()}}
    if not invert:
        return out, {}
    classes = list(range(seat.num_classes))
    pictures = class_inversion(target, classes, seat.shape, seat.num_classes, max_iter=settings.inversion_iterations)
    images: dict[str, np.ndarray] = {"class_inversion": pictures}
    # scored against the truth
    held_classes = [c for c in classes if int((data.train.y == c).sum()) > 0]
    means = np.stack([data.train.x[data.train.y == c].mean(0).numpy() for c in held_classes])
    out["model_inversion"] = {"classes": held_classes, "ssim_to_class_mean": [
        ssim(pictures[c], m) for c, m in zip(held_classes, means)]}
    images["class_means"], images["class_means_classes"] = means, np.asarray(held_classes)
    out["update_inversion"], update_images = _update_inversion(seat, peer, latest, data, settings)
    images.update(update_images)
    return out, images


def _update_inversion(seat: Seat, peer: str, latest: Received, data: NodeData,
                      settings: AuditSettings) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    if latest.round - 1 not in seat.own:
        return {"skipped": f"no own aggregate of round {latest.round - 1} to start the peer's round from"}, {}
    start_model = seat.own_model(latest.round - 1)
    start = {k: v.detach() for k, v in start_model.state_dict().items()}
    end = {**start, **{k: v for k, v in latest.tensors().items() if k in start}}
    biases = [k for k, v in latest.tensors().items() if k.endswith("bias") and v.shape == (seat.num_classes,)]
    if not biases:
        return {"skipped": f"its {latest.part} part holds no classifier bias to read the labels from"}, {}
    labels = trained_labels(start, end, biases[-1], settings.update_images)
    recovered = update_inversion(start_model, start, end, labels, seat.shape,
                                 iterations=settings.inversion_iterations, seed=settings.seed)
    train = data.train.x.numpy()
    found = [nearest(r, train) for r in recovered]
    return ({"start": f"own aggregate of round {latest.round - 1}", "labels": labels,
             "psnr_to_nearest": [p for _, p in found]},
            {"update_inversion": recovered, "update_nearest": train[[i for i, _ in found]]})


def audit_run(run: Path, node: str, settings: AuditSettings = AuditSettings()) -> dict[str, Any]:
    """Audit every peer `node` read from; writes RUN/audit.json and RUN/report/audit.png."""
    seat = Seat.open(run, node)
    folder = RunFolder(run)
    results = json.loads(folder.results.read_text()) if folder.results.is_file() else {"nodes": []}
    index_of = {n["id"]: int(n["index"]) for n in results["nodes"]}
    accounted = {n["id"]: n.get("final_epsilon") for n in results["nodes"]}
    torch.manual_seed(settings.seed)
    own = seat.data
    shadow = ShadowAttack(seat.fresh_model, torch.cat([own.train.x, own.val.x]), torch.cat([own.train.y, own.val.y]),
                          seat.num_classes, shadows=settings.shadows, epochs=settings.shadow_epochs, seed=settings.seed)
    peers, pictures = {}, {}
    nodes = [p for p in seat.received if p in index_of]
    from p2pfl.data.partition import build_partition  # the truth, built once for every peer attacked

    truth = build_partition(seat.scenario.data, seat.scenario.nodes, seat.scenario.seed,
                            only=[index_of[p] for p in nodes])
    for peer in seat.received:
        if peer not in index_of:  # the coordinator's global model: no training data of its own
            peers[peer] = {"skipped": "not a node of the run: it holds no training data"}
            continue
        peers[peer], pictures[peer] = audit_peer(seat, shadow, peer, truth.node(index_of[peer]), settings,
                                                 invert=nodes.index(peer) < settings.inversion_peers)
        peers[peer]["accounted_epsilon"] = accounted.get(peer)
    doc = {"node": node, "scenario": seat.scenario.name, "algorithm": seat.scenario.algorithm.name,
           "privacy": seat.scenario.privacy.mode, "settings": settings.__dict__, "peers": peers,
           "summary": summarize(peers)}
    write_json_atomic(folder.audit, doc)
    from p2pfl.audit.figure import audit_figure

    audit_figure(doc, pictures, folder.report)
    return doc


def summarize(peers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    done = [p for p in peers.values() if "membership" in p]

    def mean(values: list[float]) -> float | None:
        values = [v for v in values if v is not None and math.isfinite(v)]
        return statistics.fmean(values) if values else None

    eps = [p["accounted_epsilon"] for p in done if isinstance(p.get("accounted_epsilon"), (int, float))]
    return {
        "peers_attacked": len(done),
        "membership_auc_loss": mean([p["membership"]["loss"]["auc"] for p in done]),
        "membership_auc_shadow": mean([p["membership"]["shadow"]["auc"] for p in done]),
        "membership_advantage": mean([max(a["advantage"] for a in p["membership"].values()) for p in done]),
        "epsilon_lower_bound": max([a["epsilon_lower_bound"] for p in done for a in p["membership"].values()],
                                   default=None),
        "accounted_epsilon": max(eps) if eps else None,
        "inversion_ssim": mean([v for p in done for v in p.get("model_inversion", {}).get("ssim_to_class_mean", [])]),
        "update_psnr": mean([v for p in done for v in p.get("update_inversion", {}).get("psnr_to_nearest", [])]),
    }
