"""FedAMP (Huang et al., AAAI 2021), peer to peer: the paper's cloud server, run by each node.

In the paper the server computes, for each client i, a personalised cloud model u_i from every
client's uploaded model by attentive message passing (`p2pfl.core.attention`: models close to
w_i weigh more), and client i then trains on L_i(w) + λ/(2 α_k) ‖w − u_i‖² starting from u_i.
Decentralised (ours): node i computes u_i itself over its own trained model and the trained
models of the neighbours it reads this round (`full` parts, as FedAvg), and trains the next
round from u_i with FedProx's proximal term at μ = λ / α_k anchored at u_i (the round's start).
The coefficients are recorded each round (`attention`: peer -> ξ_ij, `self`: ξ_ii). Defaults
α_k = 1, λ = 1, σ = 1 are a starting point; `p2pfl compare` sweeps them on validation data.
"""

from __future__ import annotations

from p2pfl.algorithms import register
from p2pfl.algorithms.fedprox import FedProx
from p2pfl.core.attention import attention_weights
from p2pfl.core.influence import weighted_average
from p2pfl.models import load_part, part_state
from p2pfl.runtime.strategy import PeerModel, RoundContext


@register
class FedAMP(FedProx):
    name = "fedamp"
    folds_arrivals = False  # the weights need every arrived model's distance to the own one

    def __init__(self, alpha_k: float = 1.0, lam: float = 1.0, sigma: float = 1.0) -> None:
        if not (lam >= 0 and lam != float("inf")):
            raise ValueError(f"lam must be a finite number >= 0, got {lam}")
        attention_weights({}, [], alpha_k, sigma)  # the range checks, before the first round
        super().__init__(mu=lam / alpha_k)
        self.folds_arrivals = False
        self.alpha_k, self.lam, self.sigma = alpha_k, lam, sigma

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        models = [m for m in arrived if m.part == "full" and m.tensors]
        own = part_state(ctx.model, "full")
        own_weight, weights = attention_weights(own, [m.tensors for m in models], self.alpha_k, self.sigma)
        if models:
            load_part(ctx.model, weighted_average([own, *(m.tensors for m in models)], [own_weight, *weights]))
        ctx.artefacts.record("attention", {"self": own_weight, **{m.sender: w for m, w in zip(models, weights)}})
        ctx.artefacts.record("aggregated_from", [m.sender for m in models])
