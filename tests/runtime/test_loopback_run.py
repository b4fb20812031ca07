"""A whole run over the loopback carrier, or over "colocated" (memory within a worker, HTTP between
workers), is the run over HTTP: same records, same parameter bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pfl.errors import ConfigError
from p2pfl.scenario.launcher import run_scenario
from p2pfl.scenario.results import first_difference
from p2pfl.scenario.schema import RuntimeSpec

from .helpers import write_tiny

SHARED_ONE_WORKER = ('runtime.placement="shared"', "runtime.workers=1")


def _assert_the_run_over_http(tmp_path: Path, path: Path, carrier: str, placement: tuple[str, ...]) -> None:
    """The run over `carrier` has the records and parameter bytes of the same run over HTTP."""
    runs = {}
    for name in ("http", carrier):
        results, code = run_scenario(path, tmp_path / name, (*placement, f'runtime.transport="{name}"'),
                                     progress=False, quiet=True)
        assert code == 0, results["summary"]
        runs[name] = results
    assert first_difference(runs["http"], runs[carrier]) is None
    # Each carrier kind writes its own address format into the run's roster (loopback: loopback://).
    scheme = "loopback" if carrier == "loopback" else "http"
    assert f'url = "{scheme}://' in (tmp_path / carrier / "nodes" / "roster.toml").read_text()
    for a, b in zip(runs["http"]["nodes"], runs[carrier]["nodes"]):
        assert a["totals"]["param_bytes_received"] == b["totals"]["param_bytes_received"] > 0


@pytest.mark.slow
def test_a_run_over_loopback_equals_the_run_over_http(tmp_path: Path) -> None:
    _assert_the_run_over_http(tmp_path, write_tiny(tmp_path, nodes=3, rounds=2, samples=40), "loopback",
                              SHARED_ONE_WORKER)


@pytest.mark.slow
def test_a_sparse_run_over_loopback_equals_the_sparse_run_over_http(tmp_path: Path) -> None:
    """Sparse parts and their public copies (runtime.wire_sparsity) are carried alike: the same
    records and the same (sparse) parameter bytes."""
    _assert_the_run_over_http(tmp_path, write_tiny(tmp_path, nodes=3, rounds=3, samples=40), "loopback",
                              (*SHARED_ONE_WORKER, 'runtime.wire_sparsity="topk:0.05"'))


@pytest.mark.slow
def test_a_run_over_colocated_workers_equals_the_run_over_http(tmp_path: Path) -> None:
    """Two workers: each node reaches the neighbours of its own worker in memory and the others over HTTP."""
    _assert_the_run_over_http(tmp_path, write_tiny(tmp_path, nodes=4, rounds=2, samples=40), "colocated",
                              ('runtime.placement="shared"', "runtime.workers=2", 'runtime.topology="ring"'))


@pytest.mark.parametrize(("fields", "says"), [
    ({"transport": "loopback"}, "one process only"),
    ({"transport": "loopback", "placement": "shared", "workers": 2}, "one process only"),
    ({"transport": "loopback", "placement": "shared", "workers": 1, "tls": True}, "needs \"http\""),
    ({"transport": "pigeon"}, "unknown transport 'pigeon'"),
])
def test_a_carrier_that_cannot_reach_the_nodes_is_named(fields: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        RuntimeSpec(**fields)
    assert err.value.field == "runtime.transport"


def test_loopback_refuses_a_coordinator_in_its_own_process(tmp_path: Path) -> None:
    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40, algorithm="fedavg_global")
    with pytest.raises(ConfigError, match="runs a coordinator"):
        run_scenario(path, tmp_path / "run", (*SHARED_ONE_WORKER, 'runtime.transport="loopback"'), progress=False,
                     quiet=True)
