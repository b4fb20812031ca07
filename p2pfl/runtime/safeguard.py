"""The safeguard: no node worse off for joining. Two kinds, chosen by `algorithm.safeguard`:

* `true` (or `"mix"`): after aggregation a node scores mixes `w * aggregate + (1 - w) * own`
  of the aggregate and its own freshly trained model on its validation split, for w on a
  small grid (0 is its own model, 1 the aggregate), and keeps the best: highest validation
  accuracy, then lowest loss, then the largest w (on a tie the node keeps learning from its
  peers). The kept model is what the node trains and shares next.
* `"local"`: the node also trains the model it would have alone (`LocalReference`: Local's
  own initial weights and training draws, never shared, so it needs no privacy noise), and
  deploys the federated model only where the validation split gives evidence that it is
  better (`prefer_federated`, a one-sided sign test at level `algorithm.safeguard_level` on
  the samples the two models disagree on); otherwise it deploys its Local model. Only what the
  node deploys (and is scored on) changes: the federated model trains, is shared and
  aggregated exactly as without it.

Knows no algorithm: it only sees models, state dicts and scoring functions, so it applies to
every strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from p2pfl.core.evidence import DEFAULT_LEVEL, disagreements, evidence_z, prefer_federated
from p2pfl.models import part_spec
from p2pfl.training.trainer import LocalTrainer, correct_per_sample, rng_state_from_hex, rng_state_hex

GRID = (0.0, 0.25, 0.5, 0.75, 1.0)

State = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class SafeguardChoice:
    weight: float  # of the aggregate in the kept model
    scores: dict[float, tuple[float, float]]  # weight -> (validation accuracy, loss)

    @property
    def kept_own(self) -> bool:
        return self.weight == 0.0


def mix(own: State, aggregate: State, weight: float) -> dict[str, torch.Tensor]:
    """`weight * aggregate + (1 - weight) * own` for floating tensors; integer buffers (BatchNorm's
    counter) from whichever side has the larger weight."""
    out = {}
    for name, a in aggregate.items():
        o = own[name]
        if a.is_floating_point():
            out[name] = torch.lerp(o, a, weight) if 0.0 < weight < 1.0 else (a if weight == 1.0 else o).clone()
        else:
            out[name] = (a if weight >= 0.5 else o).clone()
    return out


def choose(own: State, aggregate: State, score: Callable[[Mapping[str, torch.Tensor]], tuple[float, float]],
           grid: Sequence[float] = GRID) -> SafeguardChoice:
    """The best mix on `grid` by `score(state) -> (accuracy, loss)`."""
    scores = {w: score(mix(own, aggregate, w)) for w in grid}
    best = max(scores, key=lambda w: (scores[w][0], -scores[w][1], w))
    return SafeguardChoice(best, scores)


class LocalReference:
    """The model this node would have without peers, trained beside the federated one.

    Built from the same initial weights and a trainer with the same seed as the node's own,
    it follows the run of `algorithm.name = "local"` draw for draw: same batches, same
    updates, so a node that deploys it is exactly its Local self. Never published.
    """

    def __init__(self, model: nn.Module, trainer: LocalTrainer) -> None:
        self.model, self.trainer = model, trainer
        self._scores: LocalScores | None = None

    def fit(self, split: Any) -> None:
        self.trainer.fit(self.model, split)
        self._scores = None

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)
        self._scores = None

    def scores(self, test: Any, val: Any) -> LocalScores:
        """Its test score and per-sample validation correctness, computed once per model: a
        round compares it twice (after training, after aggregation), and it changes only in `fit`."""
        if self._scores is None:
            acc, loss = self.trainer.evaluate(self.model, test)
            self._scores = LocalScores(acc, loss, correct_per_sample(self.model, val))
        return self._scores


@dataclass(frozen=True)
class LocalScores:
    test_acc: float
    test_loss: float
    val_correct: torch.Tensor  # bool per validation sample


# ---- the safeguard as the node sees it: one object, called at fixed points of a round ----------

LOCAL_REFERENCE_PREFIX = "local_reference/"  # the Local model's tensors' names in a checkpoint


@dataclass(frozen=True)
class Deployment:
    kept_local: bool  # the Local model (algorithm.safeguard = "local") instead of the federated one
    acc: float        # test accuracy of the deployed model
    loss: float
    local_acc: float | None = None  # the Local model's, when there is one
    evidence: tuple[int, int] | None = None  # the federated model's validation (wins, losses) against Local


class Safeguard:
    """No safeguard: the federated model is deployed as it is. The hooks, in a round's order:
    `after_train`, `deploy` (after training), `after_aggregate`, `deploy` (after aggregation),
    `round_record`; and what a checkpoint keeps of it."""

    trains = False  # whether `after_train` trains a model of its own (its time counts as training)

    def after_train(self, train: Any) -> None:
        """The node trained its federated model on `train` this round."""

    def after_aggregate(self, model: nn.Module, own: State, evaluate_val: Callable[[nn.Module], tuple[float, float]]
                        ) -> dict[str, Any]:
        """`model` holds the aggregate, `own` the node's trained model; returns fields for the round's record."""
        return {}

    def deploy(self, model: nn.Module, test: Any, val: Any, federated_acc: float, federated_loss: float) -> Deployment:
        return Deployment(False, federated_acc, federated_loss)

    def round_record(self, federated_acc: float, federated_acc_aggregated: float, trained: Deployment,
                     aggregated: Deployment) -> dict[str, Any]:
        return {}

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def checkpoint_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {}

    def rng_state(self) -> dict[str, str]:
        return {}

    def check_restorable(self, rng: Mapping[str, Any]) -> None:
        """Raise KeyError/ValueError when a checkpoint's `rng` states do not fit (nothing is changed)."""

    def restore(self, tensors: Mapping[str, torch.Tensor], rng: Mapping[str, Any], device: torch.device) -> None:
        """Load what `checkpoint_tensors` and `rng_state` saved."""


class MixSafeguard(Safeguard):
    """`algorithm.safeguard = true`: keep the mix of own and aggregate that validates best (`choose`)."""

    def after_aggregate(self, model: nn.Module, own: State, evaluate_val: Callable[[nn.Module], tuple[float, float]]
                        ) -> dict[str, Any]:
        aggregate = {k: v.detach().clone() for k, v in model.state_dict().items()}

        def score(state: Mapping[str, torch.Tensor]) -> tuple[float, float]:
            model.load_state_dict(state)
            return evaluate_val(model)

        choice = choose(own, aggregate, score)
        model.load_state_dict(mix(own, aggregate, choice.weight))
        return {"safeguard_kept_own": choice.kept_own, "safeguard_weight": choice.weight}


class LocalSafeguard(Safeguard):
    """`algorithm.safeguard = "local"`: deploy the node's Local model unless the validation split
    gives evidence (`prefer_federated` at `level`) that the federated one is better."""

    trains = True

    def __init__(self, reference: LocalReference, level: float = DEFAULT_LEVEL) -> None:
        self.reference = reference
        self.z = evidence_z(level)

    def after_train(self, train: Any) -> None:
        self.reference.fit(train)

    def deploy(self, model: nn.Module, test: Any, val: Any, federated_acc: float, federated_loss: float) -> Deployment:
        local = self.reference.scores(test, val)
        evidence = disagreements(correct_per_sample(model, val), local.val_correct)
        if prefer_federated(*evidence, z=self.z):
            return Deployment(False, federated_acc, federated_loss, local.test_acc, evidence)
        return Deployment(True, local.test_acc, local.test_loss, local.test_acc, evidence)

    def round_record(self, federated_acc: float, federated_acc_aggregated: float, trained: Deployment,
                     aggregated: Deployment) -> dict[str, Any]:
        """What each model scored besides the one deployed, and the validation evidence (wins,
        losses), so that another level can be judged from the records."""
        return {"test_acc_federated": federated_acc, "test_acc_federated_aggregated": federated_acc_aggregated,
                "test_acc_local": trained.local_acc, "safeguard_kept_own_trained": trained.kept_local,
                "safeguard_kept_own": aggregated.kept_local, "safeguard_evidence_trained": trained.evidence,
                "safeguard_evidence": aggregated.evidence}

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        return {LOCAL_REFERENCE_PREFIX + k: v for k, v in self.reference.model.state_dict().items()}

    def checkpoint_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {LOCAL_REFERENCE_PREFIX + k: v for k, v in part_spec(self.reference.model, "full").items()}

    def rng_state(self) -> dict[str, str]:
        return {"local_reference": rng_state_hex(self.reference.trainer.generator.get_state())}

    def check_restorable(self, rng: Mapping[str, Any]) -> None:
        rng_state_from_hex(rng["local_reference"])

    def restore(self, tensors: Mapping[str, torch.Tensor], rng: Mapping[str, Any], device: torch.device) -> None:
        n = len(LOCAL_REFERENCE_PREFIX)
        local = {k[n:]: v.to(device) for k, v in tensors.items() if k.startswith(LOCAL_REFERENCE_PREFIX)}
        if local:  # none in a checkpoint of the models as built (checkpoint.AS_BUILT): Local's is as built too
            self.reference.load_state_dict(local)
        self.reference.trainer.generator.set_state(rng_state_from_hex(rng["local_reference"]))
