"""DataSpec validation: every bad field is a ConfigError that names it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from p2pfl.data import DataSpec, validate_num_nodes
from p2pfl.errors import ConfigError

BAD = [
    ({"colour": "red"}, "data.colour"),
    ({"dataset": "svhn"}, "data.dataset"),
    ({"dataset": 3}, "data.dataset"),
    ({"partition": "shards"}, "data.partition"),
    ({"partition": "domain"}, "data.partition"),  # needs dataset digits
    ({"dataset": "idx"}, "data.path"),
    ({"dataset": "cifar10", "path": "  "}, "data.path"),
    ({"dataset": "cifar100", "path": 5}, "data.path"),
    ({"dataset": "mnist", "path": "/data"}, "data.path"),
    ({"dataset": "digits", "domains": "mnist"}, "data.domains"),
    ({"dataset": "digits", "domains": ["mnist", 1]}, "data.domains"),
    ({"dataset": "digits", "domains": ["svhn"]}, "data.domains"),
    ({"dataset": "digits", "domains": ["mnist", "mnist"]}, "data.domains"),
    ({"dataset": "mnist", "domains": ["mnist"]}, "data.domains"),
    ({"dataset": "mnist", "held_out_domain": "usps"}, "data.held_out_domain"),
    ({"dataset": "digits", "domains": ["mnist", "usps"], "held_out_domain": "synth"}, "data.held_out_domain"),
    ({"dataset": "digits", "domains": ["usps"], "held_out_domain": "usps"}, "data.held_out_domain"),
    ({"dataset": "digits", "held_out_domain": 1}, "data.held_out_domain"),
    ({"alpha": 0}, "data.alpha"),
    ({"alpha": -1.0}, "data.alpha"),
    ({"alpha": "0.5"}, "data.alpha"),
    ({"alpha": math.nan}, "data.alpha"),
    ({"alpha": math.inf}, "data.alpha"),
    ({"alpha": True}, "data.alpha"),
    ({"min_size": -1}, "data.min_size"),
    ({"min_size": 2.5}, "data.min_size"),
    ({"classes_per_node": 0}, "data.classes_per_node"),
    ({"partition": "pathological", "classes_per_node": 11}, "data.classes_per_node"),
    ({"dataset": "cifar100", "path": "/x", "partition": "pathological", "classes_per_node": 101}, "data.classes_per_node"),
    ({"nodes_per_domain": 0}, "data.nodes_per_domain"),
    ({"nodes_per_domain": "2"}, "data.nodes_per_domain"),
    ({"val_fraction": 1.0}, "data.val_fraction"),
    ({"val_fraction": -0.1}, "data.val_fraction"),
    ({"test_fraction": 1}, "data.test_fraction"),
    ({"val_fraction": 0.5, "test_fraction": 0.45}, "data.test_fraction"),
    ({"samples_per_node": 0}, "data.samples_per_node"),
    ({"samples_per_node": 10.0}, "data.samples_per_node"),
    ({"samples_per_node": False}, "data.samples_per_node"),
]


@pytest.mark.parametrize(("table", "field"), BAD, ids=[f"{f}:{t}" for t, f in BAD])
def test_bad_field_is_a_config_error_naming_it(table, field):
    with pytest.raises(ConfigError) as info:
        DataSpec.from_dict(table)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert info.value.message  # says what is wrong


def test_the_prefix_is_used_in_the_field_name():
    with pytest.raises(ConfigError) as info:
        DataSpec.from_dict({"alpha": 0}, prefix="scenario.data")
    assert info.value.field == "scenario.data.alpha"
    with pytest.raises(ConfigError) as info:
        DataSpec.from_dict(["not", "a", "table"])
    assert info.value.field == "data"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (DataSpec(alpha=0.0), "data.alpha"),
        (DataSpec(min_size=-3), "data.min_size"),
        (DataSpec(samples_per_node=0), "data.samples_per_node"),
        (DataSpec(dataset="digits", domains=("nope",)), "data.domains"),
        (DataSpec(dataset="idx"), "data.path"),
    ],
)
def test_direct_construction_is_checked_by_validate(spec, field):
    with pytest.raises(ConfigError) as info:
        spec.validate()
    assert info.value.field == field


def test_good_tables_build_the_spec():
    spec = DataSpec.from_dict({"dataset": "digits", "domains": ["mnist", "usps"], "partition": "domain",
                               "held_out_domain": "usps", "alpha": 1, "samples_per_node": 50})
    assert spec.domains == ("mnist", "usps") and isinstance(spec.alpha, float)
    assert spec.resolved_domains() == ("mnist", "usps") and spec.node_domains() == ("mnist",)
    assert DataSpec.from_dict({"dataset": "digits"}).resolved_domains() == ("mnist", "uci", "synth", "mnistm", "usps")
    assert DataSpec.from_dict({"dataset": "idx", "path": Path("/some/where")}).path == "/some/where"


@pytest.mark.parametrize(
    ("table", "nodes", "field"),
    [
        ({"dataset": "digits", "partition": "domain"}, 7, "nodes"),
        ({"dataset": "digits", "partition": "domain"}, 10, "data.nodes_per_domain"),
        ({"dataset": "digits", "partition": "domain", "nodes_per_domain": 2}, 5, "nodes"),
        ({"dataset": "digits", "partition": "domain", "held_out_domain": "uci"}, 5, "nodes"),
        ({"partition": "pathological", "classes_per_node": 2}, 4, "data.classes_per_node"),
        ({}, 0, "nodes"),
    ],
)
def test_node_count_checks_name_the_field(table, nodes, field):
    spec = DataSpec.from_dict(table)
    with pytest.raises(ConfigError) as info:
        validate_num_nodes(spec, nodes)
    assert info.value.field == field


def test_node_count_fits():
    validate_num_nodes(DataSpec.from_dict({"dataset": "digits", "partition": "domain", "held_out_domain": "uci"}), 4)
    validate_num_nodes(DataSpec.from_dict({"partition": "pathological", "classes_per_node": 2}), 5)
