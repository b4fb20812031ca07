"""Membership inference against one received model: is this image in the peer's training set?

Two attacks give every candidate a score (higher: more likely a member), which
`p2pfl.core.leakage` turns into AUC, advantage, TPR at 1 % FPR and a proven ε:

* `loss_scores`: the target's loss on the candidate (Yeom et al. 2018), as a logit-scaled
  confidence: training pulls its own images' loss down. Needs nothing but the model.
* `ShadowAttack`: ART's black-box attack (`MembershipInferenceBlackBox`, a random forest over the
  target's softmax and the label) trained on shadow models (Shokri et al. 2017): copies of the
  target's architecture that the attacker trains on halves of its *own*
  data, so it sees how members and non-members of a model like the target look. The attacker holds
  no peer's data: in a non-IID federation its classes may not be the peer's, which weakens this
  attack where the loss attack does not care.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

BATCH = 512


@torch.no_grad()
def predictions(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Softmax outputs, in batches, on the CPU."""
    model.eval()
    return torch.cat([F.softmax(model(x[i:i + BATCH]), dim=1) for i in range(0, len(x), BATCH)]).cpu()


@torch.no_grad()
def loss_scores(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """log(p_y / (1 − p_y)) from the logits, in float64: it orders candidates as the negative loss
    does, without the ties a loss that rounds to 0 in float32 leaves among confident predictions
    (the logit-scaled confidence of Carlini et al. 2022)."""
    model.eval()
    out = []
    for i in range(0, len(x), BATCH):
        logits = model(x[i:i + BATCH]).double()
        own = logits.gather(1, y[i:i + BATCH, None]).squeeze(1)
        others = logits.scatter(1, y[i:i + BATCH, None], float("-inf")).logsumexp(1)
        out.append(own - others)
    return torch.cat(out).cpu().numpy()


def _art_classifier(model: nn.Module, x: torch.Tensor, num_classes: int) -> object:
    from art.estimators.classification import PyTorchClassifier

    return PyTorchClassifier(model=model, loss=nn.CrossEntropyLoss(), input_shape=tuple(x.shape[1:]),
                             nb_classes=num_classes, clip_values=(0.0, 1.0), device_type="cpu", channels_first=True)


def train_shadow(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float,
                 generator: torch.Generator) -> nn.Module:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for i in range(0, len(x), 32):
            batch = order[i:i + 32]
            optimizer.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return model


class ShadowAttack:
    """ART's black-box attack fitted on shadow models trained on the attacker's own data only: each
    on a random half (its members), the other half its non-members. Fitted once, it scores any
    target of the same architecture (`scores`)."""

    def __init__(self, fresh_model: Callable[[], nn.Module], own_x: torch.Tensor, own_y: torch.Tensor,
                 num_classes: int, *, shadows: int = 2, epochs: int = 20, lr: float = 1e-3, seed: int = 0) -> None:
        from art.attacks.inference.membership_inference import MembershipInferenceBlackBox

        generator = torch.Generator().manual_seed(seed)
        self.onehot = np.eye(num_classes, dtype=np.float32)
        rows: dict[bool, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {True: [], False: []}
        for _ in range(shadows):
            order = torch.randperm(len(own_x), generator=generator)
            halves = {True: order[: len(order) // 2], False: order[len(order) // 2:]}
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
            model = train_shadow(fresh_model(), own_x[halves[True]], own_y[halves[True]], epochs, lr, generator)
            for member, index in halves.items():
                x = own_x[index]
                rows[member].append((x.cpu().numpy(), self.onehot[own_y[index].cpu().numpy()],
                                     predictions(model, x).numpy()))
        member, nonmember = ([np.concatenate(c) for c in zip(*rows[k])] for k in (True, False))
        # ART asks for an estimator; it is only asked for predictions, which `scores` hands it
        self.attack = MembershipInferenceBlackBox(_art_classifier(fresh_model(), own_x, num_classes),
                                                  attack_model_type="rf")
        self.attack.attack_model.set_params(random_state=seed)
        self.attack.fit(x=member[0], y=member[1], test_x=nonmember[0], test_y=nonmember[1], pred=member[2],
                        test_pred=nonmember[2])

    def scores(self, target: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        pred = predictions(target, x).numpy()
        return self.attack.infer(x.cpu().numpy(), self.onehot[y.cpu().numpy()], pred=pred,
                                 probabilities=True)[:, 0].astype(np.float64)  # P(member), one column
