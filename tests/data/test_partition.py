"""Partitioners: disjoint cover, pathological class counts, Dirichlet skew, seeds, splits, held-out domain."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from p2pfl.data import DataSpec, build_partition
from p2pfl.data.partition import assign, load_pool

from .helpers import assert_disjoint_cover, label_tv


def node_ids(a: dict, i: int) -> np.ndarray:
    return np.concatenate(a["nodes"][i])


# ---------------------------------------------------------------------------- disjoint cover
@pytest.mark.parametrize(
    "spec",
    [
        DataSpec(dataset="mnist", partition="iid"),
        DataSpec(dataset="mnist", partition="dirichlet", alpha=0.3, min_size=50),
        DataSpec(dataset="mnist", partition="pathological", classes_per_node=2),
        DataSpec(dataset="mnist", partition="dirichlet_per_node", alpha=0.1),
    ],
    ids=["iid", "dirichlet", "pathological", "dirichlet_per_node"],
)
def test_partition_is_disjoint_and_covers_the_data(mnist_pool, spec):
    a = assign(spec, mnist_pool, 7, seed=3)
    assert len(a["raw"]) == 7 and a["held_out"] is None
    assert_disjoint_cover(a["raw"], np.arange(len(mnist_pool.y)))
    # no cap: every node's train/val/test together are exactly its raw share
    for i, raw in enumerate(a["raw"]):
        assert_disjoint_cover(a["nodes"][i], raw)


def test_iid_shares_are_equal_and_look_like_the_whole(mnist_pool):
    a = assign(DataSpec(dataset="mnist", partition="iid"), mnist_pool, 8, seed=0)
    sizes = [len(r) for r in a["raw"]]
    assert max(sizes) - min(sizes) <= 1
    assert max(label_tv(mnist_pool.y[r], mnist_pool.y, 10) for r in a["raw"]) < 0.1


def test_domain_partition_gives_each_node_one_domain_and_covers_it():
    spec = DataSpec(dataset="digits", domains=("mnist", "uci", "usps"), partition="domain", nodes_per_domain=2)
    pool = load_pool(spec)
    a = assign(spec, pool, 6, seed=1)
    assert_disjoint_cover(a["raw"], np.arange(len(pool.y)))
    for di, name in enumerate(spec.node_domains()):
        shares = a["raw"][2 * di : 2 * di + 2]
        assert all(np.all(pool.d[s] == pool.domains.index(name)) for s in shares), name
        assert_disjoint_cover(shares, np.nonzero(pool.d == pool.domains.index(name))[0])
        assert abs(len(shares[0]) - len(shares[1])) <= 1
    part = build_partition(spec, 6, seed=1)
    assert [n.domain for n in part.nodes] == ["mnist", "mnist", "uci", "uci", "usps", "usps"]
    gt = part.ground_truth()
    assert [n["domain"] for n in gt["nodes"]] == ["mnist", "mnist", "uci", "uci", "usps", "usps"]
    assert gt["nodes"][2]["domain_counts"] == {"mnist": 0, "uci": gt["nodes"][2]["n_train"] + gt["nodes"][2]["n_val"]
                                              + gt["nodes"][2]["n_test"], "usps": 0}


def test_dirichlet_domain_split_skews_labels_inside_each_domain_and_covers_it():
    spec = DataSpec(dataset="digits", domains=("mnist", "uci"), partition="domain", nodes_per_domain=3,
                    domain_split="dirichlet", alpha=0.3, min_size=20)
    pool = load_pool(spec)
    a = assign(spec, pool, 6, seed=2)
    assert_disjoint_cover(a["raw"], np.arange(len(pool.y)))
    iid = assign(DataSpec(**{**spec.__dict__, "domain_split": "iid"}), pool, 6, seed=2)
    for di, name in enumerate(spec.node_domains()):
        shares = a["raw"][3 * di: 3 * di + 3]
        members = np.nonzero(pool.d == pool.domains.index(name))[0]
        assert_disjoint_cover(shares, members)
        assert min(len(s) for s in shares) >= 20
        skew = max(label_tv(pool.y[s], pool.y[members], 10) for s in shares)
        flat = max(label_tv(pool.y[s], pool.y[members], 10) for s in iid["raw"][3 * di: 3 * di + 3])
        assert skew > 0.2 > flat, (name, skew, flat)
    with pytest.raises(ValueError, match="data.domain_split"):
        DataSpec.from_dict({"dataset": "digits", "partition": "domain", "domain_split": "pathological"})


def test_partition_tensors_are_the_assigned_samples(mnist_pool):
    spec = DataSpec(dataset="mnist", partition="dirichlet", alpha=0.5, samples_per_node=120)
    a = assign(spec, mnist_pool, 4, seed=5)
    part = build_partition(spec, 4, seed=5)
    assert (part.num_classes, part.in_channels, part.image_size) == (10, 1, 28)
    for node, (tr, va, te) in zip(part.nodes, a["nodes"]):
        for split, ids in ((node.train, tr), (node.val, va), (node.test, te)):
            assert split.x.dtype == torch.float32 and split.y.dtype == torch.int64
            assert split.x.shape == (len(ids), 1, 28, 28)
            assert 0.0 <= float(split.x.min()) and float(split.x.max()) <= 1.0
            assert torch.equal(split.y, torch.from_numpy(mnist_pool.y[ids]))
            assert torch.equal(split.x, torch.from_numpy(mnist_pool.x[ids]).float() / 255.0)
    # only= materialises a subset, identical to the full build, and the ground truth still covers all nodes
    some = build_partition(spec, 4, seed=5, only=[2])
    assert [n.index for n in some.nodes] == [2]
    assert torch.equal(some.node(2).train.x, part.node(2).train.x)
    assert some.ground_truth() == part.ground_truth()
    with pytest.raises(KeyError):
        some.node(0)


# ---------------------------------------------------------------------------- pathological
@pytest.mark.parametrize(("nodes", "m"), [(5, 2), (10, 3), (4, 7)])
def test_pathological_gives_exactly_m_classes_and_records_them(mnist_pool, nodes, m):
    spec = DataSpec(dataset="mnist", partition="pathological", classes_per_node=m, samples_per_node=60)
    a = assign(spec, mnist_pool, nodes, seed=2)
    holders = np.zeros(10, int)
    for i, raw in enumerate(a["raw"]):
        classes = sorted(np.unique(mnist_pool.y[raw]).tolist())
        assert len(classes) == m
        assert classes == a["assigned"][i]
        holders[classes] += 1
    assert holders.min() >= 1, "some class is held by no node"
    assert holders.max() - holders.min() <= 1, "classes are not dealt evenly"
    part = build_partition(spec, nodes, seed=2)
    gt = part.ground_truth()
    assert gt["partition"] == "pathological" and gt["classes_per_node"] == m
    for node, entry in zip(part.nodes, gt["nodes"]):
        labels = torch.cat([node.train.y, node.val.y, node.test.y])
        assert sorted(torch.unique(labels).tolist()) == entry["assigned_classes"] == entry["classes"]
        assert len(entry["classes"]) == m
        # the cap (60) keeps every assigned class in the training split
        assert sum(c > 0 for c in entry["train_class_counts"]) == m
        assert len(labels) == 60


# ---------------------------------------------------------------------------- dirichlet
def mean_tv(pool, parts) -> float:
    return float(np.mean([label_tv(pool.y[p], pool.y, 10) for p in parts]))


def test_dirichlet_small_alpha_is_skewed_and_large_alpha_near_uniform(mnist_pool):
    iid = [mean_tv(mnist_pool, assign(DataSpec(dataset="mnist"), mnist_pool, 10, s)["raw"]) for s in range(3)]
    small = [mean_tv(mnist_pool, assign(DataSpec(dataset="mnist", partition="dirichlet", alpha=0.1), mnist_pool, 10, s)["raw"])
             for s in range(3)]
    large = [mean_tv(mnist_pool, assign(DataSpec(dataset="mnist", partition="dirichlet", alpha=100.0), mnist_pool, 10, s)["raw"])
             for s in range(3)]
    # measured (mnist, 10 nodes, seeds 0-2): iid ~0.05 (sampling noise), alpha=100 ~0.04, alpha=0.1 ~0.67-0.73
    assert max(iid) < 0.08
    assert min(small) > 0.5, small
    assert max(large) < 0.08, large
    assert min(small) > 8 * max(large)


def test_dirichlet_per_node_gives_100_equal_skewed_nodes_where_the_per_class_form_cannot(mnist_pool):
    from p2pfl.errors import ConfigError

    n = len(mnist_pool.y)
    with pytest.raises(ConfigError, match="data.min_size"):
        assign(DataSpec(dataset="mnist", partition="dirichlet", alpha=0.1, min_size=10), mnist_pool, 100, seed=0)
    for seed in range(3):
        raw = assign(DataSpec(dataset="mnist", partition="dirichlet_per_node", alpha=0.1), mnist_pool, 100, seed)["raw"]
        assert_disjoint_cover(raw, np.arange(n))
        assert {len(r) for r in raw} <= {n // 100, n // 100 + 1}
        # alpha = 0.1 puts most of a node's samples in one or two classes
        top2 = [np.sort(np.bincount(mnist_pool.y[r], minlength=10))[-2:].sum() / len(r) for r in raw]
        assert np.median(top2) > 0.8, np.median(top2)
        large = assign(DataSpec(dataset="mnist", partition="dirichlet_per_node", alpha=100.0), mnist_pool, 10, seed)["raw"]
        assert mean_tv(mnist_pool, large) < 0.1


def test_dirichlet_min_size_is_met_or_refused(mnist_pool):
    a = assign(DataSpec(dataset="mnist", partition="dirichlet", alpha=0.05, min_size=200), mnist_pool, 10, seed=0)
    assert min(len(r) for r in a["raw"]) >= 200
    from p2pfl.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        assign(DataSpec(dataset="mnist", partition="dirichlet", min_size=600), mnist_pool, 10, seed=0)
    assert info.value.field == "data.min_size"


# ---------------------------------------------------------------------------- seeds
@pytest.mark.parametrize(
    "spec",
    [
        DataSpec(dataset="mnist", partition="iid", samples_per_node=100),
        DataSpec(dataset="mnist", partition="dirichlet", alpha=0.5, samples_per_node=100),
        DataSpec(dataset="mnist", partition="pathological", classes_per_node=2, samples_per_node=100),
    ],
    ids=["iid", "dirichlet", "pathological"],
)
def test_same_seed_same_partition_different_seed_different(mnist_pool, spec):
    def flat(a):
        return [ids for node in a["nodes"] for ids in node]

    a1, a2, b = (assign(spec, mnist_pool, 5, s) for s in (7, 7, 8))
    assert all(np.array_equal(u, v) for u, v in zip(flat(a1), flat(a2)))
    assert not all(np.array_equal(u, v) for u, v in zip(flat(a1), flat(b)))
    assert not any(np.array_equal(u, v) for u, v in zip(a1["raw"], b["raw"]))
    p1, p2, q = (build_partition(spec, 5, s) for s in (7, 7, 8))
    assert all(torch.equal(u.train.x, v.train.x) and torch.equal(u.test.y, v.test.y) for u, v in zip(p1.nodes, p2.nodes))
    assert p1.ground_truth() == p2.ground_truth()
    assert not all(torch.equal(u.train.y, v.train.y) for u, v in zip(p1.nodes, q.nodes))


def test_cap_and_fractions_do_not_change_who_gets_what(mnist_pool):
    base = assign(DataSpec(dataset="mnist", partition="dirichlet", alpha=0.3), mnist_pool, 6, seed=4)
    other = assign(DataSpec(dataset="mnist", partition="dirichlet", alpha=0.3, samples_per_node=50, test_fraction=0.3),
                   mnist_pool, 6, seed=4)
    assert all(np.array_equal(u, v) for u, v in zip(base["raw"], other["raw"]))
    for i, raw in enumerate(other["raw"]):
        ids = node_ids(other, i)
        assert len(ids) == 50 and np.isin(ids, raw).all()


# ---------------------------------------------------------------------------- splits
@pytest.mark.parametrize(
    "spec",
    [
        DataSpec(dataset="mnist", partition="dirichlet", alpha=0.3, val_fraction=0.15, test_fraction=0.25),
        DataSpec(dataset="mnist", partition="pathological", classes_per_node=3, samples_per_node=200,
                 val_fraction=0.1, test_fraction=0.3),
    ],
    ids=["dirichlet", "pathological"],
)
def test_train_val_test_are_disjoint_and_follow_the_node_distribution(mnist_pool, spec):
    a = assign(spec, mnist_pool, 6, seed=11)
    for tr, va, te in a["nodes"]:
        ids = np.concatenate([tr, va, te])
        assert len(np.unique(ids)) == len(ids), "a sample is in two splits"
        n = len(ids)
        assert len(te) == round(n * spec.test_fraction) and len(va) == round(n * spec.val_fraction)
        node_counts = np.bincount(mnist_pool.y[ids], minlength=10)
        node_classes = set(np.nonzero(node_counts)[0].tolist())
        for split, frac in ((te, spec.test_fraction), (va, spec.val_fraction)):
            counts = np.bincount(mnist_pool.y[split], minlength=10)
            assert set(np.nonzero(counts)[0].tolist()) <= node_classes
            # stratified: each class's share of the split is its share of the node, up to rounding
            assert np.abs(counts - frac * node_counts).max() <= 2, (counts, node_counts)
        train_counts = np.bincount(mnist_pool.y[tr], minlength=10)
        assert label_tv(mnist_pool.y[tr], mnist_pool.y[ids], 10) < 0.02
        assert set(np.nonzero(train_counts)[0].tolist()) == node_classes


def test_held_out_domain_goes_only_to_the_held_out_split():
    spec = DataSpec(dataset="digits", domains=("mnist", "uci", "usps"), partition="iid", held_out_domain="uci",
                    samples_per_node=300)
    pool = load_pool(spec)
    uci = pool.domains.index("uci")
    a = assign(spec, pool, 4, seed=0)
    assert np.array_equal(np.sort(a["held_out"]), np.nonzero(pool.d == uci)[0])
    assert_disjoint_cover(a["raw"], np.nonzero(pool.d != uci)[0])
    for i in range(4):
        assert not np.any(pool.d[node_ids(a, i)] == uci)

    part = build_partition(spec, 4, seed=0)
    assert part.held_out_domain == "uci" and len(part.held_out) == int((pool.d == uci).sum()) == 1797
    assert torch.equal(part.held_out.y, torch.from_numpy(pool.y[pool.d == uci]))
    gt = part.ground_truth()
    assert gt["held_out_domain"] == "uci" and gt["n_held_out"] == 1797
    assert gt["domains"] == ["mnist", "usps"]
    for entry in gt["nodes"]:
        assert entry["domain_counts"]["uci"] == 0
        assert entry["domain"] is None  # iid over mnist + usps: mixed nodes
        assert entry["domain_counts"]["mnist"] > 0 and entry["domain_counts"]["usps"] > 0

    dom = DataSpec(dataset="digits", domains=("mnist", "uci", "usps"), partition="domain", held_out_domain="mnist")
    a = assign(dom, pool, 2, seed=0)
    assert [set(pool.d[r].tolist()) for r in a["raw"]] == [{uci}, {pool.domains.index("usps")}]
    assert np.all(pool.d[a["held_out"]] == pool.domains.index("mnist")) and len(a["held_out"]) == 5000


def test_ground_truth_counts_match_the_tensors(mnist_pool):
    spec = DataSpec(dataset="mnist", partition="dirichlet", alpha=0.2, samples_per_node=80)
    part = build_partition(spec, 5, seed=9)
    gt = part.ground_truth()
    import json

    assert json.loads(json.dumps(gt)) == gt  # JSON-able, as written to results.json
    assert (gt["dataset"], gt["partition"], gt["seed"], gt["num_nodes"], gt["alpha"]) == ("mnist", "dirichlet", 9, 5, 0.2)
    for node, entry in zip(part.nodes, gt["nodes"]):
        assert entry["index"] == node.index
        assert entry["train_class_counts"] == torch.bincount(node.train.y, minlength=10).tolist()
        assert (entry["n_train"], entry["n_val"], entry["n_test"]) == (len(node.train), len(node.val), len(node.test))
        assert entry["n_train"] + entry["n_val"] + entry["n_test"] == 80


# ---------------------------------------------------------------------------- larger test splits
@pytest.mark.parametrize("spec", [
    DataSpec(dataset="mnist", partition="iid", samples_per_node=300),
    DataSpec(dataset="digits", partition="domain", domains=("mnist", "uci", "usps"), samples_per_node=1500,
             val_fraction=0.15, test_fraction=0.25),
], ids=["mnist_iid", "digits_domain"])
def test_test_samples_per_node_tops_the_test_split_up_and_leaves_training_alone(spec, mnist_pool):
    from dataclasses import replace

    pool = load_pool(spec)
    nodes = 3
    before = assign(spec, pool, nodes, seed=4)
    after = assign(replace(spec, test_samples_per_node=1000), pool, nodes, seed=4)
    for i in range(nodes):
        (tr0, va0, te0), (tr1, va1, te1) = before["nodes"][i], after["nodes"][i]
        assert np.array_equal(tr0, tr1) and np.array_equal(va0, va1)  # training data unchanged
        assert set(te0) <= set(te1)  # the old test samples stay, more are added
        used = set(tr1) | set(va1)
        assert not used & set(te1) and len(set(te1)) == len(te1)
        assert set(te1) <= set(before["raw"][i])  # only the node's own share
        left_out = len(before["raw"][i]) - len(tr0) - len(va0)
        assert len(te1) == min(1000, left_out)  # 1000, or every sample the node's share has left
        # stratified: the added samples follow the left-out samples' class mix
        added = np.setdiff1d(te1, te0)
        assert label_tv(pool.y[added], pool.y[np.setdiff1d(before["raw"][i], np.concatenate([tr0, va0, te0]))], 10) < 0.05
    tests = [set(after["nodes"][i][2]) for i in range(nodes)]
    assert not any(tests[i] & tests[j] for i in range(nodes) for j in range(i + 1, nodes))


def test_digits_domain_test_sizes_with_1000_per_node():
    """uci has 1797 samples, so a 1500-sample uci node can test on 672 at most (375 + the 297 left)."""
    spec = DataSpec(dataset="digits", partition="domain", domains=("mnist", "uci"), samples_per_node=1500,
                    val_fraction=0.15, test_fraction=0.25, test_samples_per_node=1000)
    part = build_partition(spec, 2, seed=0)
    assert [len(n.train) for n in part.nodes] == [900, 900]
    assert [meta["n_test"] for meta in part.node_meta] == [1000, 672]


def test_test_samples_per_node_needs_the_cap():
    from p2pfl.errors import ConfigError

    with pytest.raises(ConfigError, match="samples_per_node") as info:
        DataSpec.from_dict({"dataset": "mnist", "test_samples_per_node": 1000})
    assert info.value.field == "data.test_samples_per_node"
    with pytest.raises(ConfigError):
        DataSpec.from_dict({"dataset": "mnist", "samples_per_node": 10, "test_samples_per_node": 0})
