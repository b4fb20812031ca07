"""Bring your own model and data: a factory and a loader defined right here, named in the
scenario as "module:name", run through the real launcher; mistakes are named before start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from p2pfl.cli import main
from p2pfl.errors import ConfigError
from p2pfl.models import SplitModel, build_model
from p2pfl.scenario.launcher import run_scenario
from p2pfl.scenario.schema import load_scenario

from .helpers import write_tiny

HERE = "tests.runtime.test_plugins"


def stripes() -> dict:
    """600 8x8 one-channel images of 3 classes (a bright row at 2, 4 or 6), from two "sites"."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 600)
    x = rng.integers(0, 60, (600, 1, 8, 8)).astype(np.uint8)
    x[np.arange(600), 0, 2 + 2 * y, :] = 250
    return {"x": x, "y": y, "domain": np.arange(600) % 2, "domains": ["site-a", "site-b"]}


def tiny_net(in_channels: int, image_size: int, num_classes: int) -> tuple[nn.Module, str]:
    """A plain nn.Module and the name of its final linear layer."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, 16), nn.ReLU(),
                         nn.Linear(16, num_classes)), "3"


def split_net(in_channels: int, image_size: int, num_classes: int) -> SplitModel:
    return SplitModel(nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size ** 2, 8)), 8, num_classes)


def not_a_model(in_channels: int, image_size: int, num_classes: int) -> str:
    return "resnet"


def flat_images() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((10, 64), np.uint8), np.zeros(10, np.int64)


def test_a_module_and_its_final_linear_become_body_and_head_with_weights_kept() -> None:
    torch.manual_seed(0)
    reference, _ = tiny_net(1, 8, 3)
    torch.manual_seed(0)
    model = build_model(f"{HERE}:tiny_net", 1, 8, 3)
    assert isinstance(model, SplitModel) and model.feature_dim == 16 and model.num_classes == 3
    x = torch.rand(5, 1, 8, 8)
    torch.testing.assert_close(model(x), reference(x))  # same function, now split
    assert isinstance(build_model(f"{HERE}:split_net", 1, 8, 3), SplitModel)


@pytest.mark.slow
def test_own_model_and_own_data_run_through_the_launcher(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path, nodes=2, rounds=2)
    results, code = run_scenario(scenario, tmp_path / "run", [f'model.name="{HERE}:tiny_net"', f'data.dataset="{HERE}:stripes"',
                                                              "data.samples_per_node=120", "train.lr=0.05"],
                                 progress=False, quiet=True)
    assert code == 0, [n.get("error") for n in results["nodes"]]
    assert results["summary"]["mean_acc"] > 0.6  # the stripes are easy: it learnt something
    assert {n["n_train"] for n in results["nodes"]} == {78}  # 120 capped, 65 % train


@pytest.mark.parametrize("field,value,match", [
    ("model.name", "no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    ("model.name", f"{HERE}:missing", "has no 'missing'"),
    ("model.name", f"{HERE}:HERE", "is a str, not a callable"),
    ("data.dataset", "no_such_module_xyz:load", "cannot import"),
    ("data.dataset", f"{HERE}:not_a_model", "failed: TypeError"),
    ("data.dataset", f"{HERE}:flat_images", r"x of shape \(10, 64\); expected \(N, C, H, W\)"),
])
def test_bad_references_are_named_when_the_scenario_loads(tmp_path: Path, field: str, value: str, match: str) -> None:
    scenario = write_tiny(tmp_path)
    listed = 'plugins=["no_such_module_xyz"]'  # admitted, so that its import is what fails
    with pytest.raises(ConfigError, match=match) as info:
        if field == "data.dataset":
            from p2pfl.data import build_partition

            build_partition(load_scenario(scenario, [f'{field}="{value}"', listed]).data, 3, 0, only=[])
        else:
            load_scenario(scenario, [f'{field}="{value}"', listed])
    assert info.value.field == field


@pytest.mark.parametrize("field,value", [
    ("model.name", "os:abort"), ("data.dataset", "subprocess:getoutput"), ("model.name", "builtins:exit"),
    ("runtime.transport", "shutil:rmtree"), ("model.name", "p2pfl.cli:main"),
])
def test_a_scenario_never_names_the_standard_library_or_p2pfl_listed_or_not(tmp_path: Path, field: str,
                                                                                       value: str) -> None:
    """Review finding 8: Before: `model.name = "os:abort"` killed the launcher."""
    top = value.split(":")[0].split(".")[0]
    for extra in ([], [f'plugins=["{top}"]']):
        with pytest.raises(ConfigError, match="a scenario file runs the code it names") as info:
            load_scenario(write_tiny(tmp_path), [f'{field}="{value}"', *extra])
        assert info.value.field == field


def test_a_package_runs_only_next_to_the_scenario_or_listed(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding 8."""
    elsewhere = tmp_path / "site"
    elsewhere.mkdir()
    (elsewhere / "their_models.py").write_text("from tests.runtime.test_plugins import split_net\n")
    monkeypatch.syspath_prepend(str(elsewhere))  # importable, but neither next to the scenario nor listed
    scenario = write_tiny(tmp_path)
    with pytest.raises(ConfigError, match=r'add plugins = \["their_models"\]'):
        load_scenario(scenario, ['model.name="their_models:split_net"'])
    admitted = load_scenario(scenario, ['model.name="their_models:split_net"', 'plugins=["their_models"]'])
    assert admitted.plugins == ("their_models",) and admitted.to_dict()["plugins"] == ["their_models"]
    (tmp_path / "own_models.py").write_text("from tests.runtime.test_plugins import split_net\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    nearby = load_scenario(scenario, ['model.name="own_models:split_net"'])
    assert nearby.plugins == ("own_models",)  # next to the scenario: admitted, and stored for the nodes
    assert load_scenario(scenario).to_dict()["plugins"] == []  # written, empty: none admitted


@pytest.mark.slow
def test_a_factory_returning_the_wrong_type_stops_the_run_before_start(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write_tiny(tmp_path)
    code = main(["run", str(scenario), "--out", str(tmp_path / "run"), "--no-progress",
                 "--set", f'model.name="{HERE}:not_a_model"'])
    assert code == 2
    assert "error in model.name:" in capsys.readouterr().err
    assert not (tmp_path / "run" / "logs").exists()


LOADER = '''\
import numpy as np


def load():
    return dict(np.load("missing-data.npz"))
'''


def test_a_user_function_error_keeps_its_message_and_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `FileNotFoundError(2, 'No such file or directory')`, the file name and the place lost."""
    (tmp_path / "my_loader.py").write_text(LOADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    from p2pfl.data import build_partition

    with pytest.raises(ConfigError) as info:
        build_partition(load_scenario(write_tiny(tmp_path), ['data.dataset="my_loader:load"']).data, 3, 0, only=[])
    message = str(info.value)
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'missing-data.npz'" in message
    assert f"{tmp_path / 'my_loader.py'}:5 in load" in message


@pytest.mark.slow
def test_p2pfl_run_finds_a_user_module_in_the_folder_it_runs_from(tmp_path: Path) -> None:
    """docs/data.md: run from the folder holding your module, no PYTHONPATH (before: ModuleNotFoundError)."""
    import os
    import subprocess
    import sys

    (tmp_path / "my_models.py").write_text("from tests.runtime.test_plugins import split_net\n")
    scenario = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])  # only for `tests.runtime`, which my_models re-exports
    done = subprocess.run([sys.executable, "-m", "p2pfl", "run", str(scenario), "--out", "run", "--no-progress",
                           "--set", 'model.name="my_models:split_net"'], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
