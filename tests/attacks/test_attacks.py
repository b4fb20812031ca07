"""The [attack] table: validated like every other table; each attack poisons exactly what it says."""

from __future__ import annotations

import pytest
import torch

from p2pfl.attacks import Attack, AttackSpec, build_attack
from p2pfl.data import NodeData, Split
from p2pfl.errors import ConfigError
from p2pfl.report.tables import _stop_rounds


@pytest.mark.parametrize(("table", "field"), [
    ({"kind": "flood"}, "attack.kind"),
    ({"kind": "noise"}, "attack.nodes"),
    ({"kind": "noise", "nodes": [10]}, "attack.nodes"),
    ({"kind": "noise", "nodes": "0"}, "attack.nodes"),
    ({"kind": "noise", "nodes": [0], "scale": 0}, "attack.scale"),
    ({"kind": "noise", "nodes": [0], "start_round": 0}, "attack.start_round"),
    ({"kind": "noise", "nodes": [0], "when": 3}, "attack.when"),
])
def test_a_wrong_attack_field_is_named(table: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        AttackSpec.from_dict(table, nodes=10)
    assert err.value.field == field


def test_only_the_chosen_nodes_attack() -> None:
    spec = AttackSpec.from_dict({"kind": "sign-flip", "nodes": [2, 5]}, nodes=10)
    assert [i for i in range(10) if build_attack(spec, i, seed=0) is not None] == [2, 5]
    assert build_attack(AttackSpec(), 2, seed=0) is None


def test_sign_flip_publishes_the_reversed_update() -> None:
    start = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor([3])}
    trained = {"full": {"w": torch.tensor([1.5, 1.0]), "n": torch.tensor([3])}}
    attack = Attack(AttackSpec("sign-flip", (0,), 2.0, start_round=2), seed=0)
    assert torch.equal(attack.published(trained, start, 1)["full"]["w"], trained["full"]["w"])  # not yet
    out = attack.published(trained, start, 2)["full"]
    assert torch.equal(out["w"], torch.tensor([0.0, 4.0]))  # 1 - 2 * 0.5, 2 - 2 * (-1)
    assert torch.equal(out["n"], start["n"])  # integer tensors pass unchanged


def test_noise_has_the_honest_tensors_shape_and_scaled_spread() -> None:
    torch.manual_seed(0)
    honest = {"body": {"w": torch.randn(200, 50) * 0.1, "b": torch.zeros(50)}}
    out = Attack(AttackSpec("noise", (0,), 3.0), seed=1).published(honest, {}, 1)["body"]
    assert out["w"].shape == (200, 50) and not torch.equal(out["w"], honest["body"]["w"])
    assert float(out["w"].std()) == pytest.approx(3 * float(honest["body"]["w"].std()), rel=0.05)
    assert float(out["b"].std()) == pytest.approx(3.0, rel=0.2)  # an all-zero tensor gets unit spread


def test_label_flip_poisons_training_labels_only() -> None:
    def split(y: list[int]) -> Split:
        return Split(torch.zeros(len(y), 1, 2, 2), torch.tensor(y))

    data = NodeData(0, split([0, 1, 9]), split([2]), split([3]), None)
    flipped = Attack(AttackSpec("label-flip", (0,)), seed=0).training_data(data, num_classes=10)
    assert flipped.train.y.tolist() == [9, 8, 0]
    assert flipped.val.y.tolist() == [2] and flipped.test.y.tolist() == [3]


def test_stop_round_is_one_past_the_last_round_any_honest_node_took_the_attacker() -> None:
    def node(nid: str, arrived: list[list[str]]) -> dict:
        return {"id": nid, "rounds": [{"round": r + 1, "arrived": a} for r, a in enumerate(arrived)]}

    results = {"nodes": [
        node("node-0", [["node-1"], ["node-1"], ["node-1"]]),       # the attacker
        node("node-1", [["node-0", "node-2"], ["node-0"], ["node-2"]]),
        node("node-2", [["node-0"], ["node-1"], ["node-1"]]),
    ]}
    assert _stop_rounds(results, {0}) == (3, 0.0)
    results["nodes"][2]["rounds"][2]["arrived"] = ["node-0"]
    assert _stop_rounds(results, {0}) == (4, 0.5)
