"""The node's model scored: test accuracy and loss, validation accuracy, and what the safeguard
deploys. The last scores are kept until the model changes: a round sat out scores nothing again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from p2pfl.data import NodeData
from p2pfl.models import SplitModel
from p2pfl.runtime.safeguard import Deployment, Safeguard
from p2pfl.training.trainer import LocalTrainer


@dataclass(frozen=True)
class Scores:
    test_acc: float
    test_loss: float
    val_acc: float | None
    test_acc_by_split: Mapping[str, float] = field(default_factory=dict)  # data.extra_test_splits


@dataclass(frozen=True)
class Scored:
    """A model's scores and what the safeguard deploys given them."""

    scores: Scores
    deployed: Deployment


class Scorer:
    def __init__(self, model: SplitModel, data: NodeData, trainer: LocalTrainer, safeguard: Safeguard) -> None:
        self.model, self.data, self.trainer, self.safeguard = model, data, trainer, safeguard
        self.last: Scores | None = None  # of the model as it is; None once it may have changed unscored

    def model_scores(self) -> Scores:
        """One pass over the test split (and the validation split, together, where there is one)."""
        if len(self.data.val) == 0:
            (test_acc, test_loss), val_acc = self.trainer.evaluate(self.model, self.data.test), None
        else:
            (test_acc, test_loss), (val_acc, _) = self.trainer.evaluate_together(self.model, [self.data.test, self.data.val])
        extra = self.data.extra_tests
        if not extra:
            return Scores(test_acc, test_loss, val_acc)
        # a pass of their own: the test and validation scores stay those of a run without them
        scores = self.trainer.evaluate_together(self.model, list(extra.values()))
        return Scores(test_acc, test_loss, val_acc, {name: acc for name, (acc, _) in zip(extra, scores)})

    def scored(self) -> Scored:
        scores = self.model_scores()
        return Scored(scores, self.deploy(scores))

    def deploy(self, scores: Scores) -> Deployment:
        """Which model the node deploys now, and its test score (`p2pfl.runtime.safeguard`)."""
        return self.safeguard.deploy(self.model, self.data.test, self.data.val, scores.test_acc, scores.test_loss)
