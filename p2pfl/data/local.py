"""Loaders for datasets the user already has on disk (nothing is ever downloaded).

* ``fashion_mnist``: the 70,000 Fashion-MNIST images (60,000 train + 10,000 t10k) as idx
  files, from Debian's ``dataset-fashion-mnist`` folder or the one ``data.path`` names.
* ``idx``: MNIST / Fashion-MNIST (or any idx-format image set), files
  ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte`` (required) and
  ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (optional), each optionally
  ``.gz``-compressed; ``train-images.idx3-ubyte`` spellings and a ``raw/`` subfolder
  (torchvision's layout) are accepted too.
* ``cifar10`` / ``cifar100``: the official "python version" batches
  (``data_batch_1..5`` + ``test_batch``, or ``train`` + ``test``), from the given folder or
  its ``cifar-10-batches-py`` / ``cifar-100-python`` subfolder.

The CIFAR batches are Python pickles. Unpickling is acceptable here only because they are
files the user put on their own disk; they are read with a restricted unpickler that only
admits dicts, lists, strings/bytes, numbers and numpy arrays. Never point this at data that
came from the network or from another peer.

Train and test files are pooled; the partitioner then gives every node its own
train/val/test split.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np

from p2pfl.errors import ConfigError

FIELD = "data.path"

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _folder(path: str | Path | None, what: str) -> Path:
    if path is None or str(path).strip() == "":
        raise ConfigError(FIELD, f"dataset {what!r} needs the folder that holds its files")
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(FIELD, f"folder {str(p)!r} does not exist (dataset {what!r}; nothing is downloaded)")
    if not p.is_dir():
        raise ConfigError(FIELD, f"{str(p)!r} is not a folder (dataset {what!r})")
    return p


# ---------------------------------------------------------------------------- idx
def read_idx(path: str | Path) -> np.ndarray:
    """Read one idx file (optionally .gz). Raises ConfigError naming data.path if it is malformed."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ConfigError(FIELD, f"cannot read {str(path)!r}: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        raise ConfigError(FIELD, f"{str(path)!r} is not an idx file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ConfigError(FIELD, f"{str(path)!r}: truncated idx header")
    dims = tuple(int(v) for v in np.frombuffer(raw, ">u4", ndim, 4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(dims))
    if len(raw) != header + count * dtype.itemsize:
        raise ConfigError(
            FIELD, f"{str(path)!r}: idx header says {dims} ({count * dtype.itemsize} bytes) but the file holds {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype, count, header).reshape(dims).astype(dtype.newbyteorder("="))


def _find_idx(folder: Path, stem: str, kind: str) -> Path | None:
    names = [f"{stem}-{kind}-ubyte", f"{stem}.{kind}-ubyte"]
    for d in (folder, folder / "raw"):
        for n in names:
            for cand in (d / n, d / f"{n}.gz"):
                if cand.is_file():
                    return cand
    return None


def load_idx(path: str | Path | None) -> tuple[np.ndarray, np.ndarray, int]:
    """MNIST-style idx files from ``path``: uint8 (N, 1, H, W), int64 (N,), num_classes (>= 10)."""
    folder = _folder(path, "idx")
    xs, ys = [], []
    for prefix, required in (("train", True), ("t10k", False)):
        fi, fl = _find_idx(folder, f"{prefix}-images", "idx3"), _find_idx(folder, f"{prefix}-labels", "idx1")
        if fi is None and fl is None and not required:
            continue
        for f, n in ((fi, f"{prefix}-images-idx3-ubyte"), (fl, f"{prefix}-labels-idx1-ubyte")):
            if f is None:
                raise ConfigError(FIELD, f"{n}[.gz] is missing from {str(folder)!r} (idx needs the train images and labels)")
        x, y = read_idx(fi), read_idx(fl)
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise ConfigError(FIELD, f"{fi.name} {x.shape} and {fl.name} {y.shape} do not match (want (N, H, W) images and N labels)")
        if x.shape[1] != x.shape[2] or (xs and xs[0].shape[2:] != x.shape[1:]):
            # the models are built for square images of one size (Partition.image_size)
            raise ConfigError(FIELD, f"{fi.name} holds {x.shape[1]}x{x.shape[2]} images; idx needs square images of one size")
        if x.dtype != np.uint8:
            x = np.clip(x, 0, 255).astype(np.uint8)
        xs.append(x[:, None])
        ys.append(y.astype(np.int64))
    x, y = np.concatenate(xs), np.concatenate(ys)
    if len(y) == 0 or y.min() < 0:
        raise ConfigError(FIELD, f"idx labels in {str(folder)!r} are empty or negative")
    return x, y, max(10, int(y.max()) + 1)


def load_fashion_mnist(path: str | Path | None) -> tuple[np.ndarray, np.ndarray, int]:
    """Fashion-MNIST's train and t10k idx files, pooled: both must be there (70,000 images), so a
    run's split is the same on every machine that has the data set."""
    from .spec import FASHION_MNIST_FOLDER

    folder = Path(path or FASHION_MNIST_FOLDER).expanduser()
    missing = [n for n in ("train-images", "train-labels", "t10k-images", "t10k-labels")
               if _find_idx(folder, n, "idx3" if n.endswith("images") else "idx1") is None]
    if missing:
        where = "Debian's folder " if path is None else ""
        raise ConfigError(FIELD, f"Fashion-MNIST's {', '.join(missing)} idx files are not in {where}{str(folder)!r}: "
                                 "install them with 'apt-get install dataset-fashion-mnist' (Debian/Ubuntu), or set "
                                 "data.path to a folder holding train-/t10k-images-idx3-ubyte[.gz] and -labels-idx1-ubyte[.gz]")
    x, y, _ = load_idx(folder)
    if int(y.max()) > 9:
        raise ConfigError(FIELD, f"{str(folder)!r} holds labels up to {int(y.max())}; Fashion-MNIST has 10 classes")
    return x, y, 10


# ---------------------------------------------------------------------------- cifar
class _RestrictedUnpickler(pickle.Unpickler):
    """Admits only what a CIFAR batch contains: builtin containers and numpy arrays."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
        ("copy_reg", "_reconstructor"),
        ("copyreg", "_reconstructor"),
        ("__builtin__", "object"),
        ("builtins", "object"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            obj = _RestrictedUnpickler(fh, encoding="bytes").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError) as e:
        raise ConfigError(FIELD, f"cannot read CIFAR batch {str(path)!r}: {e}") from None
    if not isinstance(obj, dict):
        raise ConfigError(FIELD, f"{str(path)!r} is not a CIFAR batch (expected a pickled dict)")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in obj.items()}


CIFAR_LAYOUT = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels", 10),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels", 100),
}


def load_cifar(path: str | Path | None, which: str = "cifar10") -> tuple[np.ndarray, np.ndarray, int]:
    """CIFAR-10/100 python batches from ``path``: uint8 (N, 3, 32, 32), int64 (N,), num_classes."""
    sub, train, test, key, k = CIFAR_LAYOUT[which]
    folder = _folder(path, which)
    if not (folder / train[0]).is_file() and (folder / sub).is_dir():
        folder = folder / sub
    missing = [n for n in train if not (folder / n).is_file()]
    if missing:
        raise ConfigError(FIELD, f"{which} file(s) {', '.join(missing)} missing from {str(folder)!r}")
    names = train + [n for n in test if (folder / n).is_file()]
    xs, ys = [], []
    for n in names:
        d = _unpickle(folder / n)
        if "data" not in d or key not in d:
            raise ConfigError(FIELD, f"{str(folder / n)!r} lacks 'data' or '{key}' (is it a {which} batch?)")
        data = np.asarray(d["data"])
        labels = np.asarray(d[key], dtype=np.int64)
        if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
            raise ConfigError(FIELD, f"{str(folder / n)!r}: data {data.shape} / labels {labels.shape} are not CIFAR-shaped")
        if labels.size and (labels.min() < 0 or labels.max() >= k):
            raise ConfigError(FIELD, f"{str(folder / n)!r}: labels outside 0..{k - 1}")
        xs.append(data.astype(np.uint8).reshape(-1, 3, 32, 32))
        ys.append(labels)
    return np.concatenate(xs), np.concatenate(ys), k
