"""`DataSpec`: the scenario's ``[data]`` table, with strict validation."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

from p2pfl.errors import ConfigError, check_table
from p2pfl.plugins import is_reference

DATASETS = ("mnist", "digits", "fashion_mnist", "idx", "cifar10", "cifar100")
PARTITIONS = ("iid", "dirichlet", "dirichlet_per_node", "pathological", "domain")
DOMAIN_SPLITS = ("iid", "dirichlet")
DIGIT_DOMAINS = ("mnist", "uci", "synth", "mnistm", "usps")
LOCAL_DATASETS = ("idx", "cifar10", "cifar100")
# Which test images a node is scored on (p2pfl.data.partition.test_sets; docs/data.md, "Test splits"):
# its own held-out share (drawn with its training label proportions), the pooled held-out images of
# the classes it holds, the same number per class, or one balanced set shared by every node.
TEST_SPLITS = ("own_distribution", "own_classes_balanced", "global")

# Number of classes known before any data is read (idx: at least 10, see local.py).
KNOWN_NUM_CLASSES = {"mnist": 10, "digits": 10, "fashion_mnist": 10, "cifar10": 10, "cifar100": 100}
# Where Debian's `dataset-fashion-mnist` puts the 70,000 images; `data.path` names another folder.
FASHION_MNIST_FOLDER = "/usr/share/datasets/fashion-mnist"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(float(v))


@dataclass(frozen=True)
class DataSpec:
    """What data a scenario uses and how it is split across nodes.

    Build it with :meth:`from_dict` (validates everything and names the bad field), or
    construct it directly and call :meth:`validate`.
    """

    dataset: str = "mnist"  # "mnist" | "digits" | "fashion_mnist" | "idx" | "cifar10" | "cifar100" | "package.module:loader"
    path: str | None = None  # folder for idx / cifar; fashion_mnist: default FASHION_MNIST_FOLDER
    domains: tuple[str, ...] = ()  # for digits: which domains (default all five)
    partition: str = "iid"  # "iid" | "dirichlet" | "dirichlet_per_node" | "pathological" | "domain"
    alpha: float = 0.5
    min_size: int = 10
    classes_per_node: int = 2
    nodes_per_domain: int = 1
    domain_split: str = "iid"  # how a domain is shared by its nodes: "iid" | "dirichlet" (alpha, min_size)
    held_out_domain: str | None = None
    val_fraction: float = 0.15
    test_fraction: float = 0.2
    samples_per_node: int | None = None
    # At least this many test samples per node: the node's test_fraction share, topped up with
    # samples of its own share that the samples_per_node cap left out (training data unchanged).
    test_samples_per_node: int | None = None
    test_split: str = "own_distribution"  # one of TEST_SPLITS: which test images each node is scored on
    # Readings each node is also scored on every round (ours, for calibration): the training and the
    # test_split's scores are those of a run without them; each reading's scores are those of a run
    # with that test_split, at no extra training.
    extra_test_splits: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("domains", "extra_test_splits"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if isinstance(self.path, os.PathLike):
            object.__setattr__(self, "path", os.fspath(self.path))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], prefix: str = "data") -> "DataSpec":
        """Build and validate a spec from a (TOML) table; errors are ``ConfigError(f"{prefix}.<field>", ...)``."""
        check_table(d, [f.name for f in fields(cls)], prefix)
        kw: dict[str, Any] = {}
        for key, value in d.items():
            f = f"{prefix}.{key}"
            if key in ("dataset", "partition", "domain_split", "test_split"):
                if not isinstance(value, str):
                    raise ConfigError(f, f"must be a string, got {type(value).__name__}")
            elif key in ("path", "held_out_domain"):
                if isinstance(value, os.PathLike):
                    value = os.fspath(value)
                if value is not None and not isinstance(value, str):
                    raise ConfigError(f, f"must be a string, got {type(value).__name__}")
            elif key in ("domains", "extra_test_splits"):
                what = "domain names" if key == "domains" else "test split names"
                if isinstance(value, str) or not isinstance(value, (list, tuple)):
                    raise ConfigError(f, f"must be a list of {what}, got {type(value).__name__}")
                for item in value:
                    if not isinstance(item, str):
                        raise ConfigError(f, f"must be a list of strings, found {item!r}")
                value = tuple(value)
            elif key in ("alpha", "val_fraction", "test_fraction"):
                if not _is_number(value):
                    raise ConfigError(f, f"must be a finite number, got {value!r}")
                value = float(value)
            elif key in ("min_size", "classes_per_node", "nodes_per_domain"):
                if not _is_int(value):
                    raise ConfigError(f, f"must be an integer, got {value!r}")
            elif key in ("samples_per_node", "test_samples_per_node"):
                if value is not None and not _is_int(value):
                    raise ConfigError(f, f"must be an integer, got {value!r}")
            kw[key] = value
        spec = cls(**kw)
        spec.validate(prefix)
        return spec

    # ------------------------------------------------------------------ validation
    def validate(self, prefix: str = "data") -> "DataSpec":
        """Check ranges and cross-field rules; returns self. Raises ConfigError naming the field."""

        def err(name: str, msg: str) -> ConfigError:
            return ConfigError(f"{prefix}.{name}", msg)

        if self.dataset not in DATASETS and not is_reference(self.dataset):
            raise err("dataset", f"unknown dataset {self.dataset!r}; allowed: {', '.join(DATASETS)} "
                                 "or 'package.module:loader'")
        if self.partition not in PARTITIONS:
            raise err("partition", f"unknown partition {self.partition!r}; allowed: {', '.join(PARTITIONS)}")

        # path
        if self.dataset in LOCAL_DATASETS:
            if not isinstance(self.path, str) or not self.path.strip():
                raise err("path", f"dataset {self.dataset!r} reads files you already have: set path to their folder")
        elif self.path is not None and self.dataset != "fashion_mnist":
            raise err("path", f"only used by datasets {', '.join(LOCAL_DATASETS)} and fashion_mnist; "
                              f"dataset {self.dataset!r} ships with the package")
        elif self.dataset == "fashion_mnist" and self.path is not None and not self.path.strip():
            raise err("path", "is empty: leave it out for Debian's folder, or name the folder with the idx files")

        # domains
        if not isinstance(self.domains, tuple):
            raise err("domains", "must be a list of domain names")
        if self.domains and self.dataset != "digits":
            raise err("domains", f"only used by dataset 'digits', not {self.dataset!r}")
        for name in self.domains:
            if name not in DIGIT_DOMAINS:
                raise err("domains", f"unknown domain {name!r}; allowed: {', '.join(DIGIT_DOMAINS)}")
        if len(set(self.domains)) != len(self.domains):
            raise err("domains", "lists a domain twice")

        # held-out domain
        if self.held_out_domain is not None:
            if self.dataset != "digits":
                raise err("held_out_domain", f"needs the multi-domain dataset 'digits', not {self.dataset!r}")
            if self.held_out_domain not in self.resolved_domains():
                raise err(
                    "held_out_domain",
                    f"{self.held_out_domain!r} is not one of the domains in use: {', '.join(self.resolved_domains())}",
                )
            if len(self.resolved_domains()) < 2:
                raise err("held_out_domain", "holding out the only domain leaves no data for the nodes")

        if self.test_split not in TEST_SPLITS:
            raise err("test_split", f"unknown test split {self.test_split!r}; allowed: {', '.join(TEST_SPLITS)} "
                                    "(docs/data.md, 'Test splits')")
        if self.test_split != "own_distribution" and self.test_fraction == 0:
            raise err("test_split", f"{self.test_split!r} draws from the pooled test shares of every node: "
                                    "set test_fraction > 0")
        if not isinstance(self.extra_test_splits, tuple):
            raise err("extra_test_splits", "must be a list of test split names")
        for name in self.extra_test_splits:
            if name not in TEST_SPLITS:
                raise err("extra_test_splits", f"unknown test split {name!r}; allowed: {', '.join(TEST_SPLITS)}")
            if name == self.test_split:
                raise err("extra_test_splits", f"{name!r} is already the test_split every node is scored on")
        if len(set(self.extra_test_splits)) != len(self.extra_test_splits):
            raise err("extra_test_splits", "lists a test split twice")
        if self.extra_test_splits and self.test_fraction == 0:
            raise err("extra_test_splits", "the readings draw from the nodes' test shares: set test_fraction > 0")
        if self.domain_split not in DOMAIN_SPLITS:
            raise err("domain_split", f"must be one of {', '.join(DOMAIN_SPLITS)}, got {self.domain_split!r}")
        if self.partition == "domain" and self.dataset != "digits":
            raise err("partition", f"'domain' needs the multi-domain dataset 'digits', not {self.dataset!r}")

        # numbers
        if not _is_number(self.alpha) or self.alpha <= 0:
            raise err("alpha", f"must be a number > 0 (small = skewed, large = near iid), got {self.alpha!r}")
        if not _is_int(self.min_size) or self.min_size < 0:
            raise err("min_size", f"must be an integer >= 0, got {self.min_size!r}")
        if not _is_int(self.classes_per_node) or self.classes_per_node < 1:
            raise err("classes_per_node", f"must be an integer >= 1, got {self.classes_per_node!r}")
        k = KNOWN_NUM_CLASSES.get(self.dataset)
        if self.partition == "pathological" and k is not None and self.classes_per_node > k:
            raise err("classes_per_node", f"dataset {self.dataset!r} has {k} classes; classes_per_node must be <= {k}")
        if not _is_int(self.nodes_per_domain) or self.nodes_per_domain < 1:
            raise err("nodes_per_domain", f"must be an integer >= 1, got {self.nodes_per_domain!r}")
        for name in ("val_fraction", "test_fraction"):
            v = getattr(self, name)
            if not _is_number(v) or not 0.0 <= v < 1.0:
                raise err(name, f"must be a number in [0, 1), got {v!r}")
        if self.val_fraction + self.test_fraction >= 0.95:
            raise err("test_fraction", "val_fraction + test_fraction must be < 0.95 so that nodes keep training data")
        if self.samples_per_node is not None and (not _is_int(self.samples_per_node) or self.samples_per_node < 1):
            raise err("samples_per_node", f"must be an integer >= 1 (or left out for no cap), got {self.samples_per_node!r}")
        if self.test_samples_per_node is not None:
            if not _is_int(self.test_samples_per_node) or self.test_samples_per_node < 1:
                raise err("test_samples_per_node", f"must be an integer >= 1 (or left out), got {self.test_samples_per_node!r}")
            if self.samples_per_node is None:
                raise err("test_samples_per_node", "tops the test split up with the samples the samples_per_node cap "
                                                   "leaves out: set samples_per_node too")
        return self

    # ------------------------------------------------------------------ helpers
    def resolved_domains(self) -> tuple[str, ...]:
        """Domains that make up the dataset (held-out one included), in order."""
        if self.dataset == "digits":
            return self.domains or DIGIT_DOMAINS
        return (self.dataset,)

    def node_domains(self) -> tuple[str, ...]:
        """Domains the nodes train on (the held-out domain removed)."""
        return tuple(d for d in self.resolved_domains() if d != self.held_out_domain)


def validate_num_nodes(spec: DataSpec, num_nodes: int, prefix: str = "data", nodes_field: str = "nodes") -> None:
    """Checks of the node count that need no data. Raises ConfigError naming `nodes` or `<prefix>.<field>`."""
    if not _is_int(num_nodes) or num_nodes < 1:
        raise ConfigError(nodes_field, f"must be an integer >= 1, got {num_nodes!r}")
    if spec.partition == "domain":
        doms = spec.node_domains()
        need = len(doms) * spec.nodes_per_domain
        if num_nodes != need:
            if spec.nodes_per_domain > 1 or num_nodes % len(doms) != 0:
                raise ConfigError(
                    nodes_field,
                    f"partition 'domain' with {len(doms)} domains ({', '.join(doms)}) x "
                    f"nodes_per_domain={spec.nodes_per_domain} needs exactly {need} nodes, got {num_nodes}",
                )
            raise ConfigError(
                f"{prefix}.nodes_per_domain",
                f"{num_nodes} nodes over {len(doms)} domains ({', '.join(doms)}) needs "
                f"nodes_per_domain = {num_nodes // len(doms)}, got {spec.nodes_per_domain}",
            )
    if spec.partition == "pathological":
        k = KNOWN_NUM_CLASSES.get(spec.dataset)
        if k is not None and num_nodes * spec.classes_per_node < k:
            raise ConfigError(
                f"{prefix}.classes_per_node",
                f"{num_nodes} nodes x {spec.classes_per_node} classes cannot cover all {k} classes; "
                f"need nodes * classes_per_node >= {k}",
            )
