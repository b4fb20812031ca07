"""Loaders for user files: MNIST-style idx (raw and gzip) and CIFAR-10/100 python batches, written here in their real formats."""

from __future__ import annotations

import gzip
import io
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from p2pfl.data import DataSpec, build_partition, load_cifar, load_idx, prepare, read_idx
from p2pfl.errors import ConfigError


# ---------------------------------------------------------------------------- writers (real formats)
def idx_bytes(a: np.ndarray) -> bytes:
    """An idx file: magic 0x0000 <type> <ndim>, big-endian uint32 dims, then the data big-endian."""
    code = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D}[a.dtype]
    return bytes([0, 0, code, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.tobytes()


def write_idx_set(folder: Path, prefix: str, x: np.ndarray, y: np.ndarray, gz: bool, dotted: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    sep = "." if dotted else "-"
    for kind, tag, arr in (("images", "idx3", x), ("labels", "idx1", y)):
        data = idx_bytes(arr)
        name = f"{prefix}-{kind}{sep}{tag}-ubyte"
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)


def tiny_mnist(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), (np.arange(n) % 10).astype(np.uint8)


class Py2Pickler(pickle._Pickler):
    """Writes pickles the way the official CIFAR files were written (Python 2 cPickle, protocol 2):
    strings as py2 ``str`` (BINSTRING opcodes) and numpy globals under ``numpy.core``."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _py2str(self, b: bytes) -> None:
        n = len(b)
        self.write((pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING + struct.pack("<i", n)) + b)

    def save_bytes(self, obj):
        self._py2str(obj)
        self.memoize(obj)

    def save_str(self, obj):
        self._py2str(obj.encode("ascii"))
        self.memoize(obj)

    def save_global(self, obj, name=None):
        module = obj.__module__.replace("numpy._core", "numpy.core")
        self.write(pickle.GLOBAL + f"{module}\n{name or obj.__qualname__}\n".encode())
        self.memoize(obj)

    dispatch[bytes] = save_bytes
    dispatch[str] = save_str


def py2_pickle(obj) -> bytes:
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def cifar_images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 3072), dtype=np.uint8)


def write_cifar10(folder: Path, per_batch: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """cifar-10-batches-py/: data_batch_1..5, test_batch, batches.meta (uint8 (n, 3072) rows R..G..B, list labels)."""
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for i, name in enumerate([f"data_batch_{j}" for j in range(1, 6)] + ["test_batch"]):
        x = cifar_images(per_batch, i)
        y = [(i * per_batch + j) % 10 for j in range(per_batch)]
        batch = {b"batch_label": f"batch {i}".encode(), b"labels": y, b"data": x,
                 b"filenames": [f"img_{i}_{j}.png".encode() for j in range(per_batch)]}
        (folder / name).write_bytes(py2_pickle(batch))
        xs.append(x)
        ys.extend(y)
    (folder / "batches.meta").write_bytes(py2_pickle({b"label_names": [b"airplane"] * 10, b"num_cases_per_batch": per_batch,
                                                       b"num_vis": 3072}))
    return np.concatenate(xs), np.array(ys)


def write_cifar100(folder: Path, n_train: int = 200, n_test: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """cifar-100-python/: train, test, meta with fine_labels (0..99) and coarse_labels (0..19)."""
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for i, (name, n) in enumerate((("train", n_train), ("test", n_test))):
        x = cifar_images(n, 10 + i)
        fine = [(7 * j + i) % 100 for j in range(n)]
        batch = {b"filenames": [b"f.png"] * n, b"batch_label": name.encode(), b"fine_labels": fine,
                 b"coarse_labels": [f // 5 for f in fine], b"data": x}
        (folder / name).write_bytes(py2_pickle(batch))
        xs.append(x)
        ys.extend(fine)
    (folder / "meta").write_bytes(py2_pickle({b"fine_label_names": [b"x"] * 100, b"coarse_label_names": [b"y"] * 20}))
    return np.concatenate(xs), np.array(ys)


# ---------------------------------------------------------------------------- idx
@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzip"])
def test_idx_train_and_test_files_load_through_the_partition(tmp_path, gz):
    xtr, ytr = tiny_mnist(40, 0)
    xte, yte = tiny_mnist(10, 1)
    write_idx_set(tmp_path, "train", xtr, ytr, gz)
    write_idx_set(tmp_path, "t10k", xte, yte, gz)
    x, y, k = load_idx(tmp_path)
    assert x.shape == (50, 1, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64 and k == 10
    assert np.array_equal(x[:40, 0], xtr) and np.array_equal(x[40:, 0], xte)
    assert np.array_equal(y, np.concatenate([ytr, yte]))

    spec = DataSpec.from_dict({"dataset": "idx", "path": str(tmp_path), "partition": "iid"})
    prepare(spec)
    part = build_partition(spec, 2, seed=0)
    assert (part.num_classes, part.in_channels, part.image_size) == (10, 1, 28)
    assert sum(len(s) for n in part.nodes for s in (n.train, n.val, n.test)) == 50
    # every sample comes through unchanged (as float in [0, 1]) with its label
    want = {(bytes(img.tobytes()), int(lab)) for img, lab in zip(x, y)}
    got = {(bytes((s.x[i] * 255).round().to(torch.uint8).numpy().tobytes()), int(s.y[i]))
           for n in part.nodes for s in (n.train, n.val, n.test) for i in range(len(s))}
    assert got == want


def test_idx_accepts_torchvision_layout_and_dotted_names_without_test_files(tmp_path):
    xtr, ytr = tiny_mnist(30, 2)
    write_idx_set(tmp_path / "raw", "train", xtr, ytr, gz=False, dotted=True)
    x, y, k = load_idx(tmp_path)
    assert x.shape == (30, 1, 28, 28) and np.array_equal(y, ytr) and k == 10


def test_idx_labels_beyond_nine_raise_the_class_count(tmp_path):
    x, _ = tiny_mnist(24, 3)
    write_idx_set(tmp_path, "train", x, (np.arange(24) % 12).astype(np.uint8), gz=True)
    assert load_idx(tmp_path)[2] == 12
    assert build_partition(DataSpec(dataset="idx", path=str(tmp_path)), 2, seed=0).num_classes == 12


def test_read_idx_reads_big_endian_types(tmp_path):
    a = np.arange(-6, 6, dtype=">i4").reshape(3, 4)
    (tmp_path / "a.idx").write_bytes(idx_bytes(a))
    got = read_idx(tmp_path / "a.idx")
    assert got.dtype == np.int32 and np.array_equal(got, np.arange(-6, 6).reshape(3, 4))


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (lambda b: b"\x01" + b[1:], "not an idx file"),
        (lambda b: b[:-5], "header says"),
        (lambda b: b[:6], "truncated"),
    ],
    ids=["magic", "short-data", "short-header"],
)
def test_malformed_idx_is_a_config_error_on_data_path(tmp_path, corrupt, match):
    x, y = tiny_mnist(10, 0)
    write_idx_set(tmp_path, "train", x, y, gz=False)
    f = tmp_path / "train-images-idx3-ubyte"
    f.write_bytes(corrupt(f.read_bytes()))
    with pytest.raises(ConfigError, match=match) as info:
        load_idx(tmp_path)
    assert info.value.field == "data.path"


@pytest.mark.parametrize(("train_hw", "test_hw"), [((20, 30), None), ((28, 28), (32, 32))], ids=["non-square", "mixed-sizes"])
def test_idx_images_the_models_cannot_take_are_refused_early(tmp_path, train_hw, test_hw):
    rng = np.random.default_rng(0)
    write_idx_set(tmp_path, "train", rng.integers(0, 256, (10, *train_hw), dtype=np.uint8), np.arange(10, dtype=np.uint8), gz=False)
    if test_hw:
        write_idx_set(tmp_path, "t10k", rng.integers(0, 256, (10, *test_hw), dtype=np.uint8), np.arange(10, dtype=np.uint8), gz=False)
    with pytest.raises(ConfigError, match="square images of one size") as info:
        prepare(DataSpec(dataset="idx", path=str(tmp_path)))
    assert info.value.field == "data.path"


def test_idx_missing_labels_names_the_file(tmp_path):
    x, y = tiny_mnist(10, 0)
    write_idx_set(tmp_path, "train", x, y, gz=False)
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(ConfigError, match="train-labels-idx1-ubyte") as info:
        build_partition(DataSpec(dataset="idx", path=str(tmp_path)), 2, seed=0)
    assert info.value.field == "data.path"


# ---------------------------------------------------------------------------- cifar
# error: an unclosed file handle per batch (ResourceWarning) fails the test
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning", "error::ResourceWarning")
@pytest.mark.parametrize("sub", [True, False], ids=["parent-folder", "batches-folder"])
def test_cifar10_batches_load_through_the_partition(tmp_path, sub):
    folder = tmp_path / "cifar-10-batches-py" if sub else tmp_path
    data, labels = write_cifar10(folder)
    x, y, k = load_cifar(tmp_path, "cifar10")
    assert x.shape == (36, 3, 32, 32) and x.dtype == np.uint8 and k == 10
    assert np.array_equal(y, labels)
    # rows are R(1024) G(1024) B(1024), each row-major 32x32
    assert np.array_equal(x[0, 0], data[0, :1024].reshape(32, 32)) and np.array_equal(x[0, 2, 31], data[0, 3040:3072])

    spec = DataSpec.from_dict({"dataset": "cifar10", "path": str(tmp_path), "partition": "pathological",
                               "classes_per_node": 2, "val_fraction": 0.0, "test_fraction": 0.25})
    part = build_partition(spec, 5, seed=0)
    assert (part.num_classes, part.in_channels, part.image_size) == (10, 3, 32)
    assert [len(n["assigned_classes"]) for n in part.ground_truth()["nodes"]] == [2] * 5
    assert sum(len(n.train) + len(n.test) for n in part.nodes) == 36


def test_cifar100_uses_fine_labels(tmp_path):
    data, fine = write_cifar100(tmp_path / "cifar-100-python")
    x, y, k = load_cifar(tmp_path, "cifar100")
    assert x.shape == (300, 3, 32, 32) and k == 100 and np.array_equal(y, fine)
    assert np.array_equal(x[5].reshape(-1), data[5])
    part = build_partition(DataSpec(dataset="cifar100", path=str(tmp_path)), 3, seed=1)
    assert part.num_classes == 100
    assert sum(sum(n["train_class_counts"]) + n["n_val"] + n["n_test"] for n in part.ground_truth()["nodes"]) == 300


def test_cifar_modern_pickles_load_too(tmp_path):
    x = cifar_images(4, 0)
    for name in [f"data_batch_{j}" for j in range(1, 6)]:
        (tmp_path / name).write_bytes(pickle.dumps({"data": x, "labels": [0, 1, 2, 3]}, protocol=4))
    got, y, _ = load_cifar(tmp_path, "cifar10")
    assert got.shape == (20, 3, 32, 32) and y.tolist() == [0, 1, 2, 3] * 5


def test_cifar_refuses_pickles_that_run_code(tmp_path):
    data_batch_1 = pickle.dumps({b"data": __import__("os").system, b"labels": []}, protocol=2)
    for j in range(1, 6):
        (tmp_path / f"data_batch_{j}").write_bytes(data_batch_1)
    with pytest.raises(ConfigError, match="refusing") as info:
        load_cifar(tmp_path, "cifar10")
    assert info.value.field == "data.path"


def test_cifar_missing_batch_is_named(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(ConfigError, match="data_batch_3") as info:
        prepare(DataSpec(dataset="cifar10", path=str(tmp_path)))
    assert info.value.field == "data.path"


@pytest.mark.parametrize("dataset", ["idx", "cifar10", "cifar100"])
def test_missing_folder_is_a_clear_config_error(tmp_path, dataset):
    missing = tmp_path / "nowhere"
    spec = DataSpec.from_dict({"dataset": dataset, "path": str(missing)})  # valid spec: the folder is read later
    with pytest.raises(ConfigError) as info:
        build_partition(spec, 2, seed=0)
    assert info.value.field == "data.path"
    assert str(missing) in info.value.message and "does not exist" in info.value.message
    assert str(info.value).startswith("data.path:")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a folder") as info:
        prepare(DataSpec(dataset=dataset, path=str(tmp_path / "file")))
    assert info.value.field == "data.path"


# ---------------------------------------------------------------------------- fashion_mnist
def test_fashion_mnist_reads_a_named_folder_and_partitions_it(tmp_path: Path) -> None:
    from p2pfl.data import load_fashion_mnist

    write_idx_set(tmp_path / "fm", "train", *tiny_mnist(60, 1), gz=True)
    write_idx_set(tmp_path / "fm", "t10k", *tiny_mnist(20, 2), gz=True)
    x, y, k = load_fashion_mnist(tmp_path / "fm")
    assert x.shape == (80, 1, 28, 28) and k == 10 and sorted(set(y.tolist())) == list(range(10))
    spec = DataSpec.from_dict({"dataset": "fashion_mnist", "path": str(tmp_path / "fm"), "partition": "pathological",
                               "classes_per_node": 2})
    part = build_partition(spec, 5, seed=0)
    assert sum(len(n.train.y) + len(n.val.y) + len(n.test.y) for n in part.nodes) == 80
    assert all(len(set(n.train.y.tolist())) <= 2 for n in part.nodes)


def test_fashion_mnist_without_its_files_says_how_to_get_them(tmp_path: Path) -> None:
    from p2pfl.data import load_fashion_mnist

    write_idx_set(tmp_path / "half", "train", *tiny_mnist(10, 1), gz=False)  # no t10k: not all 70,000
    with pytest.raises(ConfigError, match="t10k-images, t10k-labels.*apt-get install dataset-fashion-mnist") as info:
        load_fashion_mnist(tmp_path / "half")
    assert info.value.field == "data.path"
    with pytest.raises(ConfigError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="data.dataset"):
        DataSpec.from_dict({"dataset": "fashion-mnist"})


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="Debian's dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_from_debians_package_is_all_70000_images() -> None:
    from p2pfl.data import load_fashion_mnist

    x, y, k = load_fashion_mnist(None)
    assert x.shape == (70_000, 1, 28, 28) and x.dtype == np.uint8 and k == 10
    assert np.bincount(y).tolist() == [7000] * 10
