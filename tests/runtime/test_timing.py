"""The phase clock charges every second to one phase; the warm-up changes nothing."""

from __future__ import annotations


import pytest
import torch

from p2pfl.data import Split
from p2pfl.models import cnn
from p2pfl.runtime.timing import PhaseClock, compute_fraction
from p2pfl.training import LocalTrainer, TrainConfig
from p2pfl.training import trainer as trainer_module


def test_phase_clock_charges_the_running_phase_and_syncs_at_each_switch() -> None:
    syncs: list[int] = []
    ticks = iter([10.0, 10.05, 10.07, 10.08])  # an injected clock: start, two switches, stop
    clock = PhaseClock("train", sync=lambda: syncs.append(1), now=lambda: next(ticks))
    clock.switch("exchange")
    clock.switch("train")
    seconds = clock.stop()
    assert seconds["train_s"] == pytest.approx(0.06) and seconds["exchange_s"] == pytest.approx(0.02)
    assert seconds["privacy_s"] == seconds["publish_s"] == 0
    assert sum(seconds.values()) == pytest.approx(10.08 - 10.0)  # every second charged to one phase
    assert len(syncs) == 3  # leaving train, exchange, train
    with pytest.raises(ValueError, match="unknown phase 'gpu'"):
        PhaseClock("train").switch("gpu")
    with pytest.raises(ValueError, match="unknown phase 'idle'"):
        PhaseClock("idle")


def test_compute_fraction_is_compute_phases_over_wall() -> None:
    rounds = [
        {"wall_s": 2.0, "time": {"train_s": 1.0, "evaluate_s": 0.2, "aggregate_s": 0.3, "exchange_s": 0.5}},
        {"wall_s": 1.0, "time": {"train_s": 0.5, "exchange_s": 0.5}},
        {"wall_s": 9.0},  # no time record: not counted
    ]
    assert compute_fraction(rounds) == pytest.approx(2.0 / 3.0)
    assert compute_fraction([]) is None


def test_warm_up_changes_neither_parameters_nor_gradients(monkeypatch) -> None:
    monkeypatch.setattr(trainer_module, "_WARMED", set())  # else a test before it may have warmed these shapes
    torch.manual_seed(0)
    model = cnn(1, 28, 10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    split = Split(torch.rand(50, 1, 28, 28), torch.randint(0, 10, (50,)))
    passes = []
    model.register_forward_hook(lambda module, args, out: passes.append(args[0].shape[0]))
    LocalTrainer(TrainConfig()).warm_up(model, split, split)
    assert passes == [32, 50]  # a training batch, then an evaluation one
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_warm_up_runs_once_a_process_for_each_set_of_shapes(monkeypatch) -> None:
    """A worker's nodes share a few shapes: the one-off costs are the process's, paid once each."""
    monkeypatch.setattr(trainer_module, "_WARMED", set())
    passes = []

    def node(samples: int, seed: int) -> None:
        torch.manual_seed(seed)
        model = cnn(1, 28, 10)
        model.register_forward_hook(lambda module, args, out: passes.append(args[0].shape[0]))
        split = Split(torch.rand(samples, 1, 28, 28), torch.randint(0, 10, (samples,)))
        LocalTrainer(TrainConfig()).warm_up(model, split, split)

    node(5, 0)
    node(5, 1)  # another node of the same shapes: nothing runs
    node(7, 2)  # other batch shapes: warmed up
    assert passes == [5, 5, 7, 7]
