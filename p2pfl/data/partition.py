"""Seeded partitioners and `build_partition` / `prepare`.

Pipeline (all numpy, on indices; tensors are made at the very end):

1. load the *pool* of samples (uint8 images, labels, domain of each sample);
2. move the held-out domain (if any) to a global held-out test split;
3. assign the remaining samples to nodes: ``iid`` | ``dirichlet`` | ``pathological`` | ``domain``;
4. cap every node at ``samples_per_node`` (class-stratified subsample);
5. split every node stratified by class into train / val / test;
6. with ``test_samples_per_node``, top each node's test split up to that size with samples
   of the node's own share that the cap left out (class-stratified; train and val unchanged);
7. with a ``test_split`` other than ``own_distribution``, draw each node's test images anew from
   the pooled test splits of every node (`test_sets`; train and val unchanged).

Steps 3-5 use independent random streams spawned from ``seed``, so e.g. changing
the cap does not change which samples a node was assigned.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Collection

import numpy as np
import torch

from p2pfl.errors import ConfigError
from p2pfl.plugins import call, is_reference

from . import digits, local
from .spec import TEST_SPLITS, DataSpec, validate_num_nodes
from .types import NodeData, Partition, Split, split_stats

MAX_DIRICHLET_DRAWS = 1000


@dataclass
class Pool:
    x: np.ndarray  # uint8 (N, C, H, W)
    y: np.ndarray  # int64 (N,)
    d: np.ndarray  # int16 (N,) index into `domains`
    domains: tuple[str, ...]
    num_classes: int


def load_pool(spec: DataSpec) -> Pool:
    """All samples the spec uses, built/cached or read from the user's folder; read once per
    process, so nodes sharing a worker share one copy (each takes only its own slice of it)."""
    return _pool(spec.dataset, spec.resolved_domains(), spec.path)


@functools.lru_cache(maxsize=4)
def _pool(dataset: str, domains: tuple[str, ...], path: str | None) -> Pool:
    spec = DataSpec(dataset=dataset, domains=domains, path=path)
    if is_reference(dataset):
        return user_pool(dataset)
    if spec.dataset == "mnist":
        x, y = digits.load_mnist()
        k = 10
        parts = [(x, y)]
    elif spec.dataset == "digits":
        parts = [digits.load_domain(name) for name in spec.resolved_domains()]
        k = 10
    elif spec.dataset == "idx":
        x, y, k = local.load_idx(spec.path)
        parts = [(x, y)]
    elif spec.dataset == "fashion_mnist":
        x, y, k = local.load_fashion_mnist(spec.path)
        parts = [(x, y)]
    else:
        x, y, k = local.load_cifar(spec.path, spec.dataset)
        parts = [(x, y)]
    x = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts]).astype(np.int64)
    d = np.concatenate([np.full(len(p[1]), i, np.int16) for i, p in enumerate(parts)])
    for array in (x, y, d):
        array.flags.writeable = False  # shared by every node of the process
    return Pool(x, y, d, spec.resolved_domains(), k)


def user_pool(reference: str) -> Pool:
    """The pool a user's loader returns: `(x, y)` or `{"x", "y", "domain", "domains"}`, with x as
    (N, C, H, W) uint8 images (scaled by 1/255 like the built-ins) or floats used as given,
    y as N integer labels, and optionally each sample's domain index and the domains' names."""
    def bad(message: str) -> ConfigError:
        return ConfigError("data.dataset", f"{reference} returned {message}")

    got = call(reference, "data.dataset")
    if isinstance(got, tuple) and len(got) == 2:
        got = {"x": got[0], "y": got[1]}
    if not isinstance(got, dict) or "x" not in got or "y" not in got:
        raise bad(f"a {type(got).__name__}; expected (x, y) or a dict with 'x' and 'y'")
    x = np.asarray(got["x"].numpy() if isinstance(got["x"], torch.Tensor) else got["x"])
    y = np.asarray(got["y"].numpy() if isinstance(got["y"], torch.Tensor) else got["y"])
    if x.ndim != 4 or x.shape[2] != x.shape[3]:
        raise bad(f"x of shape {tuple(x.shape)}; expected (N, C, H, W) square images")
    if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise bad(f"y of shape {tuple(y.shape)} and dtype {y.dtype}; expected {len(x)} integer labels >= 0")
    if x.dtype != np.uint8:
        x = x.astype(np.float32)
        if not np.isfinite(x).all():
            raise bad("x with NaN or infinite values")
    domains = tuple(got.get("domains") or (reference,))
    d = np.asarray(got.get("domain", np.zeros(len(y))), dtype=np.int16)
    if d.shape != y.shape or (len(d) and not 0 <= d.min() <= d.max() < len(domains)):
        raise bad(f"domain indices that do not fit the {len(domains)} domain names")
    return Pool(x, y.astype(np.int64), d, domains, int(y.max()) + 1 if len(y) else 0)


# ---------------------------------------------------------------------------- helpers
def apportion(counts: np.ndarray, total: int, at_least_one: bool = False) -> np.ndarray:
    """Split ``total`` over classes proportionally to ``counts`` (largest remainder), never above counts.

    With ``at_least_one`` every non-empty class gets >= 1 when ``total`` allows it.
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = int(min(total, counts.sum()))
    if total <= 0 or counts.sum() == 0:
        return np.zeros_like(counts)
    base = np.zeros_like(counts)
    if at_least_one and total >= int((counts > 0).sum()):
        base = (counts > 0).astype(np.int64)
    rest, room = total - base.sum(), counts - base
    quota = room * (rest / max(room.sum(), 1))
    alloc = np.minimum(np.floor(quota).astype(np.int64), room)
    left = rest - alloc.sum()
    order = np.argsort(-(quota - alloc), kind="stable")
    for i in order:
        if left <= 0:
            break
        if alloc[i] < room[i]:
            alloc[i] += 1
            left -= 1
    i = 0
    while left > 0:  # only if rounding starved: fill any class with room
        if alloc[i % len(alloc)] < room[i % len(alloc)]:
            alloc[i % len(alloc)] += 1
            left -= 1
        i += 1
    return base + alloc


def _by_class(ids: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Shuffled index arrays per class present in ``ids``."""
    out = {}
    for c in np.unique(y[ids]):
        sel = ids[y[ids] == c]
        out[int(c)] = rng.permutation(sel)
    return out


# ---------------------------------------------------------------------------- partitioners
def partition_iid(ids: np.ndarray, num_nodes: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(p) for p in np.array_split(rng.permutation(ids), num_nodes)]


def partition_dirichlet(
    ids: np.ndarray, y: np.ndarray, num_nodes: int, alpha: float, min_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Per-class Dirichlet(alpha) label skew (Hsu et al. 2019), redrawn until every node has >= min_size.

    As in the reference implementation (FedMA / FedML), a node already holding more than
    its fair share N/num_nodes gets no more of the current class, which makes ``min_size``
    reachable even for small alpha.
    """
    if num_nodes * min_size > len(ids):
        raise ConfigError(
            "data.min_size",
            f"{num_nodes} nodes x min_size {min_size} exceeds the {len(ids)} available samples",
        )
    classes = _by_class(ids, y, rng)
    fair = len(ids) / num_nodes
    for _ in range(MAX_DIRICHLET_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_nodes)]
        sizes = np.zeros(num_nodes, np.int64)
        for c in rng.permutation(list(classes)):
            idx_c = rng.permutation(classes[int(c)])
            p = rng.dirichlet(np.full(num_nodes, alpha))
            p = p * (sizes < fair)
            p = p / p.sum() if p.sum() > 0 else np.full(num_nodes, 1.0 / num_nodes)
            cuts = (np.cumsum(p) * len(idx_c)).astype(np.int64)[:-1]
            for j, chunk in enumerate(np.split(idx_c, cuts)):
                parts[j].append(chunk)
                sizes[j] += len(chunk)
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]
    raise ConfigError(
        "data.min_size",
        f"no Dirichlet(alpha={alpha}) draw in {MAX_DIRICHLET_DRAWS} gave every one of {num_nodes} nodes "
        f">= {min_size} samples; lower min_size, raise alpha or use fewer nodes",
    )


def partition_dirichlet_per_node(
    ids: np.ndarray, y: np.ndarray, num_nodes: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each node draws its own class mix q ~ Dirichlet(alpha) and gets an equal share of the
    samples, drawn by q without replacement (Hsu et al. 2019's per-client form). Unlike the
    per-class form, no node can come out empty, so it reaches many nodes on little data (100
    nodes at alpha = 0.1 on 5000 samples). When a class runs out, the node's remaining draws
    follow q over the classes left (uniform if none of its classes is left)."""
    classes = _by_class(ids, y, rng)
    labels = sorted(classes)
    pools = [list(rng.permutation(classes[c])) for c in labels]
    quotas = [len(p) for p in np.array_split(np.arange(len(ids)), num_nodes)]
    parts: list[np.ndarray] = [np.zeros(0, np.int64)] * num_nodes
    for node in rng.permutation(num_nodes):
        q = rng.dirichlet(np.full(len(labels), alpha))
        taken: list[int] = []
        while len(taken) < quotas[node]:
            left = np.array([len(p) for p in pools], dtype=np.float64)
            weights = q * (left > 0)
            weights = weights / weights.sum() if weights.sum() > 0 else (left > 0) / (left > 0).sum()
            counts = rng.multinomial(quotas[node] - len(taken), weights)
            for c, k in enumerate(counts):
                k = min(int(k), len(pools[c]))
                taken += pools[c][:k]
                del pools[c][:k]
        parts[node] = np.sort(np.asarray(taken, dtype=np.int64))
    return parts


def partition_pathological(
    ids: np.ndarray, y: np.ndarray, num_nodes: int, m: int, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[list[int]]]:
    """Each node gets exactly ``m`` classes; classes are dealt round-robin over a random class order
    (so every class is held by floor or ceil(num_nodes*m/K) nodes) and each class's samples are
    cut into equal shards among its holders. Returns the parts and the class assignment."""
    classes = _by_class(ids, y, rng)
    present = np.array(sorted(classes))
    k = len(present)
    if m > k:
        raise ConfigError("data.classes_per_node", f"the data has {k} classes; classes_per_node must be <= {k}, got {m}")
    if num_nodes * m < k:
        raise ConfigError(
            "data.classes_per_node",
            f"{num_nodes} nodes x {m} classes cannot cover all {k} classes; need nodes * classes_per_node >= {k}",
        )
    order = rng.permutation(present)
    assigned = [sorted(int(order[(i * m + j) % k]) for j in range(m)) for i in range(num_nodes)]
    holders: dict[int, list[int]] = {int(c): [] for c in present}
    for i, cs in enumerate(assigned):
        for c in cs:
            holders[c].append(i)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_nodes)]
    for c, hs in holders.items():
        if len(classes[c]) < len(hs):
            raise ConfigError(
                "data.classes_per_node",
                f"class {c} has {len(classes[c])} samples but {len(hs)} nodes would share it; use fewer nodes or classes",
            )
        for node, shard in zip(hs, np.array_split(classes[c], len(hs))):
            parts[node].append(shard)
    return [np.sort(np.concatenate(p)) for p in parts], assigned


def partition_domain(
    ids: np.ndarray, dom: np.ndarray, domain_order: list[int], per_domain: int, rng: np.random.Generator,
    *, y: np.ndarray | None = None, alpha: float | None = None, min_size: int = 0,
) -> list[np.ndarray]:
    """Node ``i*per_domain + j`` gets the j-th share of domain ``domain_order[i]``: iid shares, or
    with ``alpha`` (and labels ``y``) per-class Dirichlet(alpha) shares inside the domain, so
    nodes differ in features across domains and in labels within one."""
    parts = []
    for di in domain_order:
        sel = ids[dom[ids] == di]
        if alpha is None or per_domain == 1:
            parts.extend(np.sort(p) for p in np.array_split(rng.permutation(sel), per_domain))
        else:
            assert y is not None
            parts.extend(partition_dirichlet(sel, y, per_domain, alpha, min_size, rng))
    return parts


def cap(ids: np.ndarray, y: np.ndarray, limit: int | None, rng: np.random.Generator) -> np.ndarray:
    """Class-stratified subsample of ``ids`` down to ``limit`` (every class kept while limit allows)."""
    if limit is None or len(ids) <= limit:
        return ids
    classes = _by_class(ids, y, rng)
    keys = sorted(classes)
    alloc = apportion(np.array([len(classes[c]) for c in keys]), limit, at_least_one=True)
    return np.sort(np.concatenate([classes[c][:a] for c, a in zip(keys, alloc)]))


def split_node(
    ids: np.ndarray, y: np.ndarray, val_fraction: float, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stratified train / val / test of one node's samples (exact totals; val/test non-empty when n >= 3)."""
    n = len(ids)
    n_test, n_val = int(round(n * test_fraction)), int(round(n * val_fraction))
    if n >= 3:
        n_test = max(n_test, 1) if test_fraction > 0 else 0
        n_val = max(n_val, 1) if val_fraction > 0 else 0
    while n_test + n_val >= n and n > 0 and (n_test or n_val):  # keep >= 1 training sample
        if n_val >= n_test and n_val > 0:
            n_val -= 1
        else:
            n_test -= 1
    classes = _by_class(ids, y, rng)
    keys = sorted(classes)
    counts = np.array([len(classes[c]) for c in keys], np.int64)
    t_alloc = apportion(counts, n_test)
    v_alloc = apportion(counts - t_alloc, n_val)
    tr, va, te = [], [], []
    for c, t, v in zip(keys, t_alloc, v_alloc):
        s = classes[c]
        te.append(s[:t])
        va.append(s[t : t + v])
        tr.append(s[t + v :])

    def cat(xs: list[np.ndarray]) -> np.ndarray:
        return rng.permutation(np.concatenate(xs)) if xs else np.zeros(0, np.int64)

    return cat(tr), cat(va), cat(te)


# ---------------------------------------------------------------------------- entry points
def _split(pool: Pool, ids: np.ndarray) -> Split:
    x = torch.from_numpy(np.ascontiguousarray(pool.x[ids])).to(torch.float32)
    if pool.x.dtype == np.uint8:  # images as bytes; a user's float pool is used as given
        x.div_(255.0)
    return Split(x=x, y=torch.from_numpy(pool.y[ids].astype(np.int64)))


def assign(spec: DataSpec, pool: Pool, num_nodes: int, seed: int) -> dict:
    """Index-level partition: ``{"nodes": [(train, val, test), ...], "raw": [...], "held_out": ids|None, "assigned": ...}``.

    ``raw`` are the node index sets before the cap (disjoint, covering all non-held-out samples
    for iid / dirichlet / pathological).
    """
    spec.validate()
    validate_num_nodes(spec, num_nodes)
    # spawn(5)'s first children are spawn(3)'s and spawn(4)'s: a later stream changes no earlier draw
    *streams, test_seeds = np.random.SeedSequence(int(seed)).spawn(5)
    r_assign, r_cap, r_split, r_top_up = (np.random.default_rng(s) for s in streams)
    all_ids = np.arange(len(pool.y), dtype=np.int64)
    held = None
    if spec.held_out_domain is not None:
        hd = pool.domains.index(spec.held_out_domain)
        held = all_ids[pool.d == hd]
        all_ids = all_ids[pool.d != hd]
    if num_nodes > len(all_ids):
        raise ConfigError("nodes", f"{num_nodes} nodes but only {len(all_ids)} samples")
    assigned = None
    if spec.partition == "iid":
        raw = partition_iid(all_ids, num_nodes, r_assign)
    elif spec.partition == "dirichlet":
        raw = partition_dirichlet(all_ids, pool.y, num_nodes, spec.alpha, spec.min_size, r_assign)
    elif spec.partition == "dirichlet_per_node":
        raw = partition_dirichlet_per_node(all_ids, pool.y, num_nodes, spec.alpha, r_assign)
    elif spec.partition == "pathological":
        raw, assigned = partition_pathological(all_ids, pool.y, num_nodes, spec.classes_per_node, r_assign)
    else:
        order = [pool.domains.index(d) for d in spec.node_domains()]
        skew = spec.alpha if spec.domain_split == "dirichlet" else None
        raw = partition_domain(all_ids, pool.d, order, spec.nodes_per_domain, r_assign,
                               y=pool.y, alpha=skew, min_size=spec.min_size)
    capped = [cap(ids, pool.y, spec.samples_per_node, r_cap) for ids in raw]
    splits = [split_node(ids, pool.y, spec.val_fraction, spec.test_fraction, r_split) for ids in capped]
    if spec.test_samples_per_node is not None:
        splits = [(tr, va, top_up_test(te, np.setdiff1d(r, c), pool.y, spec.test_samples_per_node, r_top_up))
                  for (tr, va, te), r, c in zip(splits, raw, capped)]
    # One stream per reading: its images are the same whether it is the test_split or an extra one.
    reading_seeds = dict(zip(TEST_SPLITS, test_seeds.spawn(len(TEST_SPLITS))))
    readings = {r: test_sets(r, splits, pool.y, np.random.default_rng(reading_seeds[r]))
                for r in (spec.test_split, *spec.extra_test_splits)}
    extra = {r: readings[r] for r in spec.extra_test_splits}
    splits = [(tr, va, te) for (tr, va, _), te in zip(splits, readings[spec.test_split])]
    return {"nodes": splits, "extra_tests": extra, "raw": raw, "held_out": held, "assigned": assigned}


def top_up_test(test: np.ndarray, left_out: np.ndarray, y: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``test`` and a class-stratified draw from ``left_out`` (samples of the node's share that no
    split holds) until ``size`` samples, or every left-out sample where there are fewer."""
    need = size - len(test)
    if need <= 0 or len(left_out) == 0:
        return test
    return rng.permutation(np.concatenate([test, cap(left_out, y, need, rng)]))


def test_sets(reading: str, splits: list[tuple[np.ndarray, np.ndarray, np.ndarray]], y: np.ndarray,
              rng: np.random.Generator) -> list[np.ndarray]:
    """Each node's test images under `reading` (`p2pfl.data.spec.TEST_SPLITS`), drawn without
    replacement from the pooled test splits of every node, so never an image any node trains or
    validates on; each node's test set keeps the size its own split had.

    * ``own_classes_balanced``: the classes the node trains on (at least one training image), the
      same number of each (LG-FedAvg's per-client test of the client's own classes);
    * ``global``: one balanced set of every class, the same images for every node.

    A class with fewer pooled images than its share caps the share of every class, so a set stays
    balanced. ``own_distribution``: each node's own test split, as it is."""
    if reading == "own_distribution":
        return [te for _, _, te in splits]
    pooled = np.sort(np.concatenate([te for _, _, te in splits]))
    by_class = {int(c): rng.permutation(pooled[y[pooled] == c]) for c in np.unique(y[pooled])}

    def balanced(classes: list[int], size: int) -> np.ndarray:
        classes = [c for c in classes if c in by_class]
        if not classes:
            return np.zeros(0, np.int64)
        per = max(1, min(size // len(classes), min(len(by_class[c]) for c in classes)))
        return rng.permutation(np.concatenate([rng.choice(by_class[c], min(per, len(by_class[c])), replace=False)
                                               for c in classes]))

    if reading == "global":
        shared = balanced(sorted(by_class), int(round(np.mean([len(te) for _, _, te in splits]))))
        return [shared for _ in splits]
    if reading == "own_classes_balanced":
        return [balanced(sorted(int(c) for c in np.unique(y[tr])), len(te)) for tr, _, te in splits]
    raise ValueError(f"unknown test split {reading!r}")


def node_ground_truth(spec: DataSpec, pool: Pool, a: dict) -> list[dict]:
    """Ground-truth entry of every node, from the index-level partition (no image tensors needed)."""
    multi = spec.dataset == "digits"
    out = []
    for i, (tr, va, te) in enumerate(a["nodes"]):
        all_ids = np.concatenate([tr, va, te])
        doms = np.unique(pool.d[all_ids])
        domain = pool.domains[int(doms[0])] if multi and len(doms) == 1 else None
        ys = [Split(torch.empty(0), torch.from_numpy(pool.y[s])) for s in (tr, va, te)]
        stats = split_stats(i, domain, *ys, pool.num_classes)
        if multi:
            cnt = np.bincount(pool.d[all_ids], minlength=len(pool.domains))
            stats["domain_counts"] = {name: int(c) for name, c in zip(pool.domains, cnt)}
        if a["assigned"] is not None:
            stats["assigned_classes"] = a["assigned"][i]
        out.append(stats)
    return out


@functools.lru_cache(maxsize=4)
def _assignment(spec: DataSpec, num_nodes: int, seed: int) -> tuple[dict, list[dict]]:
    """`assign` and `node_ground_truth`, once per process: the 500 nodes of a worker would each
    otherwise partition the whole data set and describe every node (O(N) each, O(N^2) a run).
    Both depend only on (spec, num_nodes, seed); callers read them and never change them."""
    pool = load_pool(spec)
    a = assign(spec, pool, num_nodes, seed)
    return a, node_ground_truth(spec, pool, a)


def read_ahead(spec: DataSpec, num_nodes: int, seed: int) -> None:
    """Read the data set and make its assignment now, into this process's caches, running no torch
    operation: a forking parent calls it so that its children take their nodes' slices from one
    copy, shared copy-on-write (the arrays are read-only), instead of each reading its own."""
    _assignment(spec, num_nodes, seed)


def release_loaded() -> None:
    """Forget the data sets and assignments this process read (`load_pool`'s and `build_partition`'s
    caches): for a process that checked a partition but hosts no node, such as the launcher."""
    _pool.cache_clear()
    _assignment.cache_clear()


def build_partition(
    spec: DataSpec, num_nodes: int, seed: int, *, only: Collection[int] | None = None
) -> Partition:
    """Deterministic partition of ``spec``'s data over ``num_nodes`` nodes.

    Every node process may call this and take its own node: the result depends only on
    ``(spec, num_nodes, seed)`` (and, for digits, on the cached build). ``only`` (optional)
    materialises the tensors of just those node indices - ``Partition.nodes`` then holds
    only them, while ``ground_truth()`` still covers every node - so that a node process
    does not hold everybody's images in memory.
    """
    spec.validate()
    validate_num_nodes(spec, num_nodes)
    if only is not None:
        only = sorted(set(int(i) for i in only))
        bad = [i for i in only if not 0 <= i < num_nodes]
        if bad:
            raise ConfigError("nodes", f"node indices {bad} are outside 0..{num_nodes - 1}")
    pool = load_pool(spec)
    a, node_meta = _assignment(spec, num_nodes, seed)
    # The asked nodes only, not a scan of all: a worker builds thousands of nodes one at a time.
    nodes = [
        NodeData(i, _split(pool, tr), _split(pool, va), _split(pool, te), node_meta[i]["domain"],
                 {r: _split(pool, sets[i]) for r, sets in a["extra_tests"].items()})
        for i in (range(len(a["nodes"])) if only is None else only)
        for tr, va, te in (a["nodes"][i],)
    ]
    held_out = _split(pool, a["held_out"]) if a["held_out"] is not None else None
    meta = {
        "dataset": spec.dataset,
        "partition": spec.partition,
        "seed": int(seed),
        "num_nodes": int(num_nodes),
        "domains": list(spec.node_domains()) if spec.dataset == "digits" else [spec.dataset],
    }
    if spec.partition in ("dirichlet", "dirichlet_per_node"):
        meta["alpha"] = float(spec.alpha)
    if spec.partition == "pathological":
        meta["classes_per_node"] = int(spec.classes_per_node)
    if spec.samples_per_node is not None:  # a scan of every node's share: only where a cap asks for it
        largest = max((len(r) for r in a["raw"]), default=0)
        if spec.samples_per_node > largest:
            meta["largest_share"] = int(largest)  # the cap changes nothing: said, not hidden
    return Partition(
        nodes=nodes,
        num_classes=pool.num_classes,
        in_channels=int(pool.x.shape[1]),
        image_size=int(pool.x.shape[2]),
        held_out=held_out,
        held_out_domain=spec.held_out_domain,
        meta=meta,
        node_meta=node_meta,
    )


def prepare(spec: DataSpec) -> None:
    """Build and cache everything ``spec`` needs (or check the user's files); call once before spawning nodes."""
    spec.validate()
    load_pool(spec)
