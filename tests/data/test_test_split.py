"""`data.test_split`: which test images each node is scored on (issue 62). A small idx data set is
written here with each image's index in its first pixels, so the images a node's tensors hold are
read back and checked: the classes, the balance, no overlap with any node's training or validation
images, and training data the same under every reading."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from p2pfl.data import DataSpec, build_partition
from p2pfl.data.partition import assign, load_pool
from p2pfl.errors import ConfigError

from .test_local import write_idx_set

N, NODES = 1200, 4


@pytest.fixture
def idx_spec(tmp_path: Path) -> DataSpec:
    """1200 images of 10 classes, uneven (class c has about (c + 1) / 55 of them); pixels 0 and 1
    hold the image's index (high and low byte)."""
    rng = np.random.default_rng(7)
    y = rng.choice(10, N, p=np.arange(1, 11) / 55).astype(np.uint8)
    x = rng.integers(0, 256, (N, 8, 8), dtype=np.uint8)
    x[:, 0, 0], x[:, 0, 1] = np.arange(N) // 256, np.arange(N) % 256
    write_idx_set(tmp_path / "idx", "train", x, y, gz=False)
    return DataSpec(dataset="idx", path=str(tmp_path / "idx"), partition="dirichlet", alpha=0.3, min_size=20,
                    val_fraction=0.15, test_fraction=0.2)


def image_ids(images) -> np.ndarray:
    pixels = (images[:, 0, 0, :2] * 255).round().long().numpy()
    return pixels[:, 0] * 256 + pixels[:, 1]


def readings(spec: DataSpec) -> dict[str, dict]:
    pool = load_pool(spec)
    return {r: assign(replace(spec, test_split=r), pool, NODES, seed=3)
            for r in ("own_distribution", "own_classes_balanced", "global")}


def test_training_and_validation_are_the_same_under_every_reading(idx_spec: DataSpec) -> None:
    by_reading = readings(idx_spec)
    own = by_reading["own_distribution"]["nodes"]
    for reading, a in by_reading.items():
        for (tr, va, _), (tr0, va0, _) in zip(a["nodes"], own):
            assert np.array_equal(tr, tr0) and np.array_equal(va, va0), reading


@pytest.mark.parametrize("reading", ["own_classes_balanced", "global"])
def test_a_reading_draws_from_the_pooled_test_shares_only(idx_spec: DataSpec, reading: str) -> None:
    pool = load_pool(idx_spec)
    own = readings(idx_spec)["own_distribution"]["nodes"]
    pooled = set(np.concatenate([te for _, _, te in own]).tolist())
    trained = set(np.concatenate([np.concatenate([tr, va]) for tr, va, _ in own]).tolist())
    part = build_partition(replace(idx_spec, test_split=reading), NODES, seed=3)
    for node, (tr, _, te) in zip(part.nodes, own):
        ids = image_ids(node.test.x)
        assert len(set(ids.tolist())) == len(ids)  # no image twice in a node's test set
        assert set(ids.tolist()) <= pooled and not set(ids.tolist()) & trained
        assert np.array_equal(pool.y[ids], node.test.y.numpy())  # the tensors are the images drawn
        counts = np.bincount(node.test.y.numpy(), minlength=10)
        held = counts[counts > 0]
        assert len(set(held.tolist())) == 1  # balanced: the same number of every class it holds
        if reading == "own_classes_balanced":
            assert set(np.flatnonzero(counts)) == set(np.unique(pool.y[tr]))  # exactly the classes it trains on
            # its own split's size shared by its classes, unless the rarest of them has fewer pooled images
            pooled_counts = np.bincount(pool.y[sorted(pooled)], minlength=10)
            classes = np.unique(pool.y[tr])
            assert held[0] == min(len(te) // len(classes), pooled_counts[classes].min())
    if reading == "global":
        first = image_ids(part.nodes[0].test.x)
        assert all(np.array_equal(image_ids(n.test.x), first) for n in part.nodes)  # one set for every node
        assert set(pool.y[first].tolist()) == set(range(10))


def test_own_classes_balanced_differs_from_own_distribution_where_the_mix_is_skewed(idx_spec: DataSpec) -> None:
    """Under Dirichlet 0.3 a node's own test share follows its skew; the balanced reading does not."""
    pool = load_pool(idx_spec)
    by_reading = readings(idx_spec)
    skewed = [np.bincount(pool.y[te], minlength=10) for _, _, te in by_reading["own_distribution"]["nodes"]]
    assert any(len(set(c[c > 0].tolist())) > 1 for c in skewed)


def test_an_unknown_reading_is_named_and_a_pooled_one_needs_test_data() -> None:
    with pytest.raises(ConfigError, match="own_classes_balanced") as info:
        DataSpec.from_dict({"dataset": "mnist", "test_split": "own_classes"})
    assert info.value.field == "data.test_split"
    with pytest.raises(ConfigError, match="test_fraction") as info:
        DataSpec.from_dict({"dataset": "mnist", "test_split": "global", "test_fraction": 0})
    assert info.value.field == "data.test_split"


def test_reuse_refuses_a_run_made_with_another_reading_and_takes_one_made_before_the_field(tmp_path: Path) -> None:
    from p2pfl.runtime.run_folder import RunFolder
    from p2pfl.scenario.compare.runs import _stored_run
    from p2pfl.scenario.schema import scenario_from_dict

    raw = {"name": "split", "nodes": 3, "rounds": 1, "data": {"dataset": "mnist", "test_split": "global"},
           "algorithm": {"name": "fedavg"}}
    made = scenario_from_dict(raw).to_dict()
    assert made["data"]["test_split"] == "global"  # recorded in the run's resolved scenario
    RunFolder(tmp_path).results.parent.mkdir(parents=True, exist_ok=True)
    RunFolder(tmp_path).results.write_text(json.dumps({"scenario": made, "summary": {}}))
    assert _stored_run(tmp_path, scenario_from_dict(raw), "fedavg") is not None
    other = scenario_from_dict({**raw, "data": {"dataset": "mnist", "test_split": "own_classes_balanced"}})
    with pytest.raises(ConfigError, match="data.test_split"):
        _stored_run(tmp_path, other, "fedavg")
    before = {k: v for k, v in made["data"].items() if k != "test_split"}  # a run folder from before the field
    format_1 = {k: v for k, v in made.items() if k != "format"}  # which named no format
    RunFolder(tmp_path).results.write_text(json.dumps({"scenario": {**format_1, "data": before}, "summary": {}}))
    assert _stored_run(tmp_path, scenario_from_dict({**raw, "data": {"dataset": "mnist"}}), "fedavg") is not None
    with pytest.raises(ConfigError, match="data.test_split"):
        _stored_run(tmp_path, scenario_from_dict(raw), "fedavg")
