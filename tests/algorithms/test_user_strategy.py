"""`algorithm.name = "package.module:Class"`: a user's Strategy subclass, validated and run like a
built-in. The module is docs/algorithms.md's "write your own strategy" example, verbatim, as `p2pfl new` writes it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from p2pfl.algorithms import build_strategy, strategy_class
from p2pfl.errors import ConfigError
from p2pfl.project import TRIMMED_MEAN


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "my_strategies.py").write_text(TRIMMED_MEAN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    yield tmp_path
    sys.modules.pop("my_strategies", None)


def test_a_user_strategy_is_validated_like_a_built_in(user_module: Path) -> None:
    assert strategy_class("my_strategies:TrimmedMean").__name__ == "TrimmedMean"
    assert build_strategy("my_strategies:TrimmedMean", {"trim": 2}).trim == 2
    with pytest.raises(ConfigError, match="algorithm.params.trimm.*it accepts \\['trim'\\]"):
        build_strategy("my_strategies:TrimmedMean", {"trimm": 2})
    with pytest.raises(ConfigError, match="not a subclass of p2pfl.runtime.strategy.Strategy"):
        strategy_class("my_strategies:Fetch")
    with pytest.raises(ConfigError, match="has no 'Nope'"):
        strategy_class("my_strategies:Nope")
    with pytest.raises(ConfigError, match="did you mean 'fedavg'"):
        strategy_class("fedavgg")


@pytest.mark.slow
def test_a_user_strategy_runs_in_node_processes(user_module: Path) -> None:
    from p2pfl.scenario.launcher import run_scenario
    from tests.runtime.helpers import write_tiny

    path = write_tiny(user_module, nodes=5, rounds=2, samples=40, algorithm="my_strategies:TrimmedMean")
    results, code = run_scenario(path, user_module / "run", progress=False, quiet=True)
    assert code == 0, results["summary"]
    assert results["algorithm"] == "my_strategies:TrimmedMean"
    for node in results["nodes"]:
        assert [r["round"] for r in node["rounds"]] == [1, 2]
        assert sorted(node["rounds"][-1]["arrived"]) == sorted(n["id"] for n in results["nodes"] if n is not node)


def test_the_example_aggregates_a_coordinate_wise_trimmed_mean(user_module: Path) -> None:
    """Against the definition: with 3 models and trim = 1, the coordinate-wise median."""
    from types import SimpleNamespace

    import torch

    from p2pfl.models import build_model, part_state
    from p2pfl.runtime.strategy import PeerModel

    torch.manual_seed(0)
    model = build_model("cnn", 1, 28, 10)
    peers = [{k: torch.randn_like(v) for k, v in part_state(model, "full").items()} for _ in range(2)]
    own = {k: v.detach().clone() for k, v in part_state(model, "full").items()}
    arrived = [PeerModel(f"node-{i}", "full", 1, 1, t, {"n_train": 10}) for i, t in enumerate(peers, 1)]
    build_strategy("my_strategies:TrimmedMean", {"trim": 1}).aggregate(SimpleNamespace(model=model), arrived)
    for k, v in part_state(model, "full").items():
        if v.is_floating_point():
            torch.testing.assert_close(v, torch.stack([own[k], peers[0][k], peers[1][k]]).median(dim=0).values)


def test_the_docs_show_this_example_verbatim() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "algorithms.md").read_text()
    assert "```python\n" + TRIMMED_MEAN + "```" in docs


UNIFORM_GLOBAL = '''
import numpy as np

from p2pfl.algorithms.di import GlobalModelStrategy
from p2pfl.algorithms.global_model import GlobalModelHalf


class PowerHalf(GlobalModelHalf):
    """Weights ∝ n_train ** power: 1 is FedAvg, 0 the plain mean whatever the nodes' data sizes."""

    name = "power_global"

    def __init__(self, env, power: float = 0.0) -> None:
        super().__init__(env)
        self.power = power

    def weights(self, round_, submissions):
        w = np.array([float(s.meta["n_train"]) for s in submissions]) ** self.power
        return w / w.sum(), {"power": self.power}


class PowerGlobal(GlobalModelStrategy):
    coordinator = PowerHalf
'''


@pytest.mark.slow
def test_a_user_strategy_brings_its_own_coordinator_half(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The optional half of item 1: a user's CoordinatorHalf, named by its Strategy, runs on the
    coordinator with its parameters validated like a built-in's."""
    from p2pfl.scenario.launcher import run_scenario
    from tests.runtime.helpers import write_tiny

    (tmp_path / "my_global.py").write_text(UNIFORM_GLOBAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    try:
        with pytest.raises(ConfigError, match="pwer"):
            run_scenario(write_tiny(tmp_path, algorithm="my_global:PowerGlobal",
                                    extra="[algorithm.params]\npwer = 0.5\n"), tmp_path / "bad", progress=False,
                         quiet=True)
        assert not (tmp_path / "bad").exists()  # refused before any process started
        path = write_tiny(tmp_path, nodes=3, rounds=2, samples=40, algorithm="my_global:PowerGlobal",
                          extra="[algorithm.params]\npower = 0.0\n")
        results, code = run_scenario(path, tmp_path / "run", progress=False, quiet=True)
        from types import SimpleNamespace

        from my_global import PowerHalf

        sizes = [SimpleNamespace(meta={"n_train": 10}), SimpleNamespace(meta={"n_train": 30})]
        assert list(PowerHalf(None, power=1.0).weights(1, sizes)[0]) == pytest.approx([0.25, 0.75])
        assert list(PowerHalf(None, power=0.0).weights(1, sizes)[0]) == pytest.approx([0.5, 0.5])
    finally:
        sys.modules.pop("my_global", None)
    assert code == 0, results["summary"]
    rounds = results["coordinator"]["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    for record in rounds:
        assert record["info"]["rule"] == "power_global" and record["info"]["power"] == 0.0
        assert record["weights"] == pytest.approx({"node-0": 1 / 3, "node-1": 1 / 3, "node-2": 1 / 3})
    docs = (Path(__file__).parents[2] / "docs" / "algorithms.md").read_text()
    assert "```python\n" + UNIFORM_GLOBAL.lstrip("\n") + "```" in docs


@pytest.mark.slow
def test_a_failing_strategy_says_why_in_the_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The terminal names each failed node and its last error line, not only "FAILED: ..."."""
    from p2pfl.scenario.launcher import run_scenario
    from tests.runtime.helpers import write_tiny

    (tmp_path / "broken_strategies.py").write_text(
        "from p2pfl.algorithms.fedavg import FedAvg\n\n"
        "class Broken(FedAvg):\n"
        "    def aggregate(self, ctx, arrived):\n"
        "        raise TypeError('momentum buffer of the wrong shape')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40, algorithm="broken_strategies:Broken")
    try:
        results, code = run_scenario(path, tmp_path / "run", progress=False)
    finally:
        sys.modules.pop("broken_strategies", None)
    assert code == 1 and sorted(results["summary"]["nodes_failed"]) == ["node-0", "node-1"]
    err = capsys.readouterr().err
    assert "FAILED: node-0, node-1" in err
    for node in ("node-0", "node-1"):
        assert f"  {node}: TypeError: momentum buffer of the wrong shape" in err
