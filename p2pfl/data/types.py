"""Containers handed to the runtime: `Split`, `NodeData`, `Partition`."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Split:
    """One split of one node: images float32 (N, C, H, W) in [0, 1], labels int64 (N,)."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass
class NodeData:
    """A node's own train / val / test splits, all drawn from that node's distribution."""

    index: int
    train: Split
    val: Split
    test: Split
    domain: str | None  # the node's domain when all its samples come from one digits domain, else None
    # data.extra_test_splits: reading -> the test images the node is also scored on
    extra_tests: dict[str, Split] = field(default_factory=dict)


def split_stats(index: int, domain: str | None, train: Split, val: Split, test: Split, num_classes: int) -> dict[str, Any]:
    """The ground-truth entry of one node, derived from its tensors."""
    ys = torch.cat([train.y, val.y, test.y])
    return {
        "index": int(index),
        "domain": domain,
        "classes": sorted(int(c) for c in torch.unique(ys).tolist()),
        "train_class_counts": [int(v) for v in torch.bincount(train.y, minlength=num_classes).tolist()],
        "n_train": len(train),
        "n_val": len(val),
        "n_test": len(test),
    }


@dataclass
class Partition:
    """The data of every node of a scenario (or of the nodes asked for with ``build_partition(..., only=...)``).

    ``nodes`` is ordered by index; use :meth:`node` to look a node up by its index
    (needed when only some nodes were materialised). ``meta`` and ``node_meta`` are
    filled by :func:`build_partition` and make :meth:`ground_truth` cover all nodes
    even when only some were materialised; a hand-built Partition leaves them empty and
    its ground truth is derived from the tensors.
    """

    nodes: list[NodeData]
    num_classes: int
    in_channels: int
    image_size: int
    held_out: Split | None = None  # test split of the held-out domain (leave-one-domain-out), else None
    held_out_domain: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, repr=False)
    node_meta: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def node(self, index: int) -> NodeData:
        for n in self.nodes:
            if n.index == index:
                return n
        raise KeyError(f"node {index} is not in this partition (materialised: {[n.index for n in self.nodes]})")

    def ground_truth(self) -> dict[str, Any]:
        """JSON-able truth of the partition, to score relevance/influence estimates against.

        ``{"num_classes", "held_out_domain", "nodes": [{"index", "domain", "classes",
        "train_class_counts", "n_train", "n_val", "n_test", ...}], ...}``; nodes may carry
        ``domain_counts`` (digits) and ``assigned_classes`` (pathological); top level adds
        ``dataset``, ``partition``, ``seed``, ``domains``, ``n_held_out`` when known.
        """
        if self.node_meta:
            nodes = copy.deepcopy(self.node_meta)
        else:
            nodes = [split_stats(n.index, n.domain, n.train, n.val, n.test, self.num_classes) for n in self.nodes]
        gt: dict[str, Any] = {"num_classes": int(self.num_classes), "held_out_domain": self.held_out_domain}
        gt.update(copy.deepcopy(self.meta))
        gt["n_held_out"] = len(self.held_out) if self.held_out is not None else 0
        gt["nodes"] = nodes
        return gt
