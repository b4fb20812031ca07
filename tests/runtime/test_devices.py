"""The runtime, not the strategies, puts peer tensors where the model is.

CI has no GPU, so the model is put on PyTorch's `meta` device: like a GPU it is not where
the wire decodes (host memory), and a tensor the runtime forgot to move stays on the CPU,
which is exactly the bug that crashed most algorithms on a GPU.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from p2pfl.assembly import assemble_node, build_coordinator
from p2pfl.errors import ConfigError
from p2pfl.models import part_state
from p2pfl.runtime.config import load_node_config
from p2pfl.runtime.devices import device_of, host_snapshot, node_device
from p2pfl.runtime.node import Node
from p2pfl.runtime.node.intake import RoundChecks
from p2pfl.runtime.strategy import COORDINATOR_ID, Fetch
from p2pfl.scenario.launcher import write_run_folder
from p2pfl.scenario.schema import load_scenario

from .helpers import write_tiny

META = torch.device("meta")


def _nodes(tmp_path: Path, algorithm: str = "fedavg") -> tuple[list[Node], Path | None]:
    scenario = load_scenario(write_tiny(tmp_path, nodes=2, samples=40, algorithm=algorithm, timeout=5.0))
    paths, coordinator = write_run_folder(scenario, tmp_path / "run")
    return [assemble_node(load_node_config(p), scenario) for p in paths], coordinator


def _on_meta(node: Node) -> None:
    node.model.to(META)
    node.exchange.intake.device = META  # where arrivals are put


def assert_on_model_device(node: Node, tensors: dict[str, torch.Tensor]) -> None:
    want = device_of(node.model)
    assert tensors, "nothing arrived"
    wrong = {k: str(v.device) for k, v in tensors.items() if v.device != want}
    assert not wrong, f"the runtime handed the strategy tensors on another device than the model's ({want}): {wrong}"


def test_fetched_and_pushed_parts_arrive_on_the_model_device(tmp_path: Path) -> None:
    (a, b), _ = _nodes(tmp_path)
    state = host_snapshot(part_state(a.model, "full"))
    _on_meta(b)
    folded: list[dict[str, torch.Tensor]] = []  # FedAvg takes arrivals in as they come: what it saw
    fold = b.strategy.fold

    def recording_fold(ctx: Any, arrival: Any) -> bool:
        folded.append(dict(arrival.tensors))
        return fold(ctx, arrival)

    b.strategy.fold = recording_fold  # type: ignore[method-assign]

    async def scenario() -> None:
        await a.transport.start(a.config.host, a.config.port)
        await b.transport.start(b.config.host, b.config.port)
        try:
            await a.transport.publish(1, 1, {"full": state}, {"n_train": 5})
            arrived = await b.exchange.gather([Fetch(a.config.id, "full")], 1, RoundChecks(1))
            assert [m.sender for m in arrived] == [a.config.id]
            assert arrived[0].tensors == {}  # folded: the node keeps none of them
            assert_on_model_device(b, folded[-1])
            b.strategy.folds_arrivals = False  # type: ignore[misc]  # the whole-list path
            arrived = await b.exchange.gather([Fetch(a.config.id, "full")], 1, RoundChecks(1))
            assert_on_model_device(b, arrived[0].tensors)
            # A push answers a fetch the node is waiting for (a has not published version 2): on the
            # model's device too.
            waiting = asyncio.create_task(b.exchange.gather([Fetch(a.config.id, "full")], 2, RoundChecks(2)))
            await asyncio.sleep(0.2)
            assert await a.transport.push(b.config.id, kind="model", part="full", round_=2, version=2,
                                         tensors=state, meta={"n_train": 5}, timeout=5)
            pushed = await asyncio.wait_for(waiting, 4)
            assert [m.version for m in pushed] == [2]
            assert_on_model_device(b, pushed[0].tensors)
        finally:
            await a.transport.close()
            await b.transport.close()

    asyncio.run(scenario())


def test_coordinator_submissions_are_on_its_device(tmp_path: Path) -> None:
    (a, _), coordinator_path = _nodes(tmp_path, algorithm="fedavg_global")
    assert coordinator_path is not None
    coordinator = build_coordinator(load_node_config(coordinator_path))
    coordinator.model.to(META)
    coordinator.device = META

    async def scenario() -> None:
        await coordinator.endpoint.start(coordinator.config.host, coordinator.config.port)
        await a.transport.start(a.config.host, a.config.port)
        try:
            assert await a.transport.push(COORDINATOR_ID, kind="stats", part="full", round_=1, version=1,
                                         tensors=host_snapshot(part_state(a.model, "full")),
                                         meta={"n_train": 3}, timeout=5)
        finally:
            await a.transport.close()
            await coordinator.endpoint.close()

    asyncio.run(scenario())
    (submission,) = coordinator.submissions[1].values()
    assert {t.device for t in submission.state.values()} == {device_of(coordinator.model)}


def test_a_snapshot_of_many_tensors_is_one_buffer_with_each_tensor_as_it_was() -> None:
    g = torch.Generator().manual_seed(0)
    same = {"conv": torch.randn(4, 2, 3, 3, generator=g).permute(0, 2, 3, 1), "bias": torch.randn(4, generator=g),
            "scalar": torch.tensor(2.5), "fc": torch.randn(6, 5, generator=g).t()}
    mixed = {**same, "steps": torch.tensor([7])}
    for weights in (same, mixed):
        kept = {k: v.clone() for k, v in weights.items()}
        snapshot = host_snapshot(weights)
        for v in weights.values():
            v.add_(1)
        assert list(snapshot) == list(weights)
        for k, v in snapshot.items():
            assert torch.equal(v, kept[k]) and v.dtype == kept[k].dtype and v.is_contiguous() and v.device.type == "cpu"
    flat = host_snapshot(same)
    assert len({v.untyped_storage().data_ptr() for v in flat.values()}) == 1  # one buffer, viewed


def test_published_snapshot_is_a_host_copy_that_training_cannot_change() -> None:
    weights = {"w": torch.ones(3, 4).t()}  # not contiguous
    snapshot = host_snapshot(weights)
    weights["w"].add_(1)
    assert snapshot["w"].device.type == "cpu" and snapshot["w"].is_contiguous()
    assert torch.equal(snapshot["w"], torch.ones(4, 3))


def test_a_lent_model_serves_its_own_tensors_until_it_takes_its_storage_back() -> None:
    """`lend`: the published part is the model's own memory (no copy while the node waits for its
    peers); `take_back` gives the model fresh storage, so what was published keeps the trained
    values however the model changes next, and an optimizer built before still trains it."""
    from p2pfl.runtime.devices import lend, take_back

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    lent = lend(part_state_of(model))
    own = {k: v.untyped_storage().data_ptr() for k, v in model.state_dict().items()}
    assert {k: v.untyped_storage().data_ptr() for k, v in lent.items()} == own  # not copied
    params = list(model.parameters())
    take_back(model)
    assert list(model.parameters()) == params and all(p is q for p, q in zip(model.parameters(), params))
    assert all(v.untyped_storage().data_ptr() != own[k] for k, v in model.state_dict().items())
    for _ in range(3):  # the model changes: weights by the optimizer, running statistics by the forward pass
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    with torch.no_grad():
        model[0].weight.add_(1.0)
    for k, v in lent.items():
        assert torch.equal(v, trained[k]), k
    for k in ("0.weight", "1.weight", "1.running_mean", "1.running_var"):  # (a bias before BatchNorm has no gradient)
        assert not torch.equal(model.state_dict()[k], trained[k]), k
    not_contiguous = {"w": torch.ones(3, 4).t()}
    assert lend(not_contiguous)["w"].untyped_storage().data_ptr() != not_contiguous["w"].untyped_storage().data_ptr()


def part_state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_device_settings() -> None:
    assert node_device("cpu", 7) == torch.device("cpu")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        assert [node_device("cuda", i).index for i in range(2 * count)] == list(range(count)) * 2
        with pytest.raises(ConfigError, match="visible GPU"):
            node_device(f"cuda:{count}", 0)
    else:
        with pytest.raises(ConfigError, match="torch.cuda.is_available\\(\\) is False") as err:
            node_device("cuda", 0)
        assert err.value.field == "device"


def test_seeding_a_cpu_node_gives_the_initial_model_torch_manual_seed_gives() -> None:
    from p2pfl.models import cnn
    from p2pfl.runtime.devices import seed_torch

    torch.manual_seed(7)
    expected, state = cnn(1, 28, 10).state_dict(), torch.random.get_rng_state()
    torch.manual_seed(0)  # anything else first
    seed_torch(7, torch.device("cpu"))
    got = cnn(1, 28, 10).state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
