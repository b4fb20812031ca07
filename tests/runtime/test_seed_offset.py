"""`train.seed_offset` changes the initial model and training draws, never the data split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from p2pfl.errors import ConfigError
from p2pfl.scenario.schema import load_scenario

from .helpers import build_in_process, write_tiny


def test_seed_offset_keeps_the_partition_and_changes_the_model_and_the_draws(tmp_path: Path) -> None:
    path = write_tiny(tmp_path, nodes=2, samples=40)
    base, _ = build_in_process(path, tmp_path / "a")
    shifted, _ = build_in_process(path, tmp_path / "b", ("train.seed_offset=1",))
    same, _ = build_in_process(path, tmp_path / "c", ("train.seed_offset=0",))
    for a, b, c in zip(base, shifted, same):
        assert torch.equal(a.ctx.data.train.x, b.ctx.data.train.x) and torch.equal(a.ctx.data.test.y, b.ctx.data.test.y)
        weights = [(pa, pb, pc) for pa, pb, pc in zip(a.model.parameters(), b.model.parameters(), c.model.parameters())]
        assert any(not torch.equal(pa, pb) for pa, pb, _ in weights)
        assert all(torch.equal(pa, pc) for pa, _, pc in weights)
        assert a.ctx.rng.random() != b.ctx.rng.random()
    # every node still starts from one model
    assert all(torch.equal(p, q) for p, q in zip(shifted[0].model.parameters(), shifted[1].model.parameters()))


@pytest.mark.parametrize("value", ["-1", "1.5", "true"])
def test_a_bad_seed_offset_names_the_field(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="train.seed_offset"):
        load_scenario(write_tiny(tmp_path), [f"train.seed_offset={value}"])
