"""What several strategies do with the parts that arrived: keep each sender's newest, average
a part by sample count, and evaluate averages of many states without loading them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from p2pfl.core.influence import weighted_average
from p2pfl.models import load_part, part_state
from p2pfl.runtime.strategy import PeerModel, RoundContext
from p2pfl.training.trainer import CPU_EVAL_BATCH, evaluate_logits, scores_faster_channels_last


def latest_parts(arrived: list[PeerModel], part: str) -> list[PeerModel]:
    """One model per sender for `part`, the newest version, in arrival order."""
    best: dict[str, PeerModel] = {}
    for m in arrived:
        if m.part == part and (m.sender not in best or m.version > best[m.sender].version):
            best[m.sender] = m
    return list(best.values())



def average_part_by_count(ctx: RoundContext, part: str, members: list[PeerModel]) -> None:
    """Load into `ctx.model` the sample-count-weighted mean of its own `part` and `members`' (one per peer).

    A no-op when no member arrived.
    """
    if not members:
        return
    states = [part_state(ctx.model, part)] + [m.tensors for m in members]
    counts = [float(len(ctx.data.train))] + [float(m.n_train) for m in members]
    load_part(ctx.model, weighted_average(states, counts))


class ModelPool:
    """Several states of one architecture, stacked per tensor.

    Averages of any subset are one indexed mean per tensor, and `functional_call` evaluates
    them on the template module without loading anything into it, so a coalition game of
    hundreds of subsets never copies a state dict into the node's model.
    """

    def __init__(self, template: nn.Module, states: Sequence[dict[str, torch.Tensor]]) -> None:
        if not states:
            raise ValueError("a model pool needs at least one state")
        self.template = template
        self.keys = list(states[0])
        self.stacked = {k: torch.stack([s[k].detach() for s in states]) for k in self.keys}
        self.size = len(states)
        self.channels_last = scores_faster_channels_last(template)

    def average(self, members: Sequence[int]) -> dict[str, torch.Tensor]:
        """Uniform average of `members` (indices into the pool); non-float tensors from the first."""
        index = torch.as_tensor(list(members), dtype=torch.long)
        return {
            k: v[index].mean(0) if v.is_floating_point() else v[index[0]]
            for k, v in self.stacked.items()
        }

    def distances(self, reference: int) -> np.ndarray:
        """||theta_j - theta_ref||_2 over all float tensors, for every member j."""
        total: torch.Tensor | float = 0.0
        for v in self.stacked.values():
            if v.is_floating_point():
                diff = (v - v[reference]).to(torch.float64).reshape(self.size, -1)
                total = total + (diff * diff).sum(1)
        if isinstance(total, float):
            return np.zeros(self.size)
        return total.sqrt().cpu().numpy()

    def scorer(self, members: Sequence[int], batch_size: int = 1024) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
        """The forward pass of the average of `members` and the batch size to run it at: as
        `LocalTrainer.evaluate` scores, channels-last in small batches where that is faster (a
        coalition game's forward passes were most of a pFedSV round; `benchmarks/evaluation.py`)."""
        state = self.average(members)
        if not self.channels_last:
            return lambda xb: functional_call(self.template, state, (xb,)), batch_size
        state = {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in state.items()}

        def forward(xb: torch.Tensor) -> torch.Tensor:
            if xb.dim() == 4:
                xb = xb.contiguous(memory_format=torch.channels_last)
            return functional_call(self.template, state, (xb,))

        return forward, CPU_EVAL_BATCH

    @torch.no_grad()
    def evaluate(self, members: Sequence[int], split: Any, batch_size: int = 1024) -> tuple[float, float]:
        """(accuracy, mean cross-entropy) of the average of `members` on `split`."""
        forward, batch_size = self.scorer(members, batch_size)
        return evaluate_logits(forward, self.template, split, batch_size)
