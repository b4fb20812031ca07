"""The digits domains: built offline, cached where P2PFL_DATA_CACHE says, deterministic, and really different."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.data.helpers import mnist_to_all_domains

from p2pfl.data import DIGIT_DOMAINS, DOMAIN_SIZES, cache_dir, clear_cache, load_domain
from p2pfl.data import digits
from p2pfl.data.cache import cached


def test_synth_fonts_come_from_the_folders_p2pfl_font_dirs_names(tmp_path, monkeypatch):
    monkeypatch.delenv(digits.FONT_DIRS_ENV, raising=False)
    assert digits.font_dirs() == digits.FONT_DIRS
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "sub").mkdir(parents=True)
    b.mkdir()
    (a / "sub" / "One.TTF").write_bytes(b"1")
    (b / "Two.otf").write_bytes(b"22")
    (b / "notes.txt").write_bytes(b"not a font")
    monkeypatch.setenv(digits.FONT_DIRS_ENV, f"{a}{os.pathsep}{b}")
    assert digits._font_files() == sorted([str(a / "sub" / "One.TTF"), str(b / "Two.otf")])
    both = digits.font_fingerprint()
    monkeypatch.setenv(digits.FONT_DIRS_ENV, str(a))
    assert digits._font_files() == [str(a / "sub" / "One.TTF")]
    assert digits.font_fingerprint() != both  # another font set is other synth data: another cache file
    assert digits.data_fingerprint(["mnist", "synth"]) == {"synth": digits.cache_name("synth")}
    assert digits.cache_name("synth").endswith(digits.font_fingerprint())


def test_cache_lives_in_the_folder_the_env_var_names(data_cache):
    assert cache_dir() == data_cache
    x, y = load_domain("mnist")
    assert (data_cache / f"{digits.cache_name('mnist')}.npz").is_file()
    x2, y2 = load_domain("mnist")
    assert np.array_equal(x, x2) and np.array_equal(y, y2)


@pytest.mark.parametrize("domain", DIGIT_DOMAINS)
def test_every_domain_has_its_documented_shape_and_balanced_labels(domain):
    x, y = load_domain(domain)
    n = DOMAIN_SIZES[domain]
    assert x.shape == (n, 3, 28, 28) and x.dtype == np.uint8
    assert y.shape == (n,) and y.dtype == np.int64
    counts = np.bincount(y, minlength=10)
    assert len(counts) == 10 and counts.min() >= 0.08 * n  # every digit present, roughly balanced
    assert x.std() > 20  # not blank
    if domain in digits.GREY_DOMAINS:
        assert np.array_equal(x[:, 0], x[:, 1]) and np.array_equal(x[:, 0], x[:, 2])
    else:
        assert not np.array_equal(x[:, 0], x[:, 1])


def test_domains_are_deterministic_and_derived_ones_share_the_mnist_labels():
    x, y = load_domain("mnistm")
    bx, by = digits.build_mnistm()  # rebuilt now, not read from the cache
    assert np.array_equal(x, bx) and np.array_equal(y, by)
    _, ym = load_domain("mnist")
    assert np.array_equal(y, ym)
    assert not np.array_equal(digits.build_mnistm(seed=1)[0], x)


def test_cache_rebuilds_missing_or_corrupt_files_and_clear_removes_them(tmp_path, monkeypatch):
    monkeypatch.setenv("P2PFL_DATA_CACHE", str(tmp_path / "c"))
    calls = []

    def build():
        calls.append(1)
        return {"x": np.arange(6, dtype=np.uint8).reshape(2, 3)}

    assert np.array_equal(cached("t", build)["x"], np.arange(6).reshape(2, 3))
    assert np.array_equal(cached("t", build)["x"], np.arange(6).reshape(2, 3))
    assert len(calls) == 1
    (tmp_path / "c" / "t.npz").write_bytes(b"not an npz")
    assert np.array_equal(cached("t", build)["x"], np.arange(6).reshape(2, 3))
    assert len(calls) == 2
    (tmp_path / "c" / "keep.txt").write_text("not ours")
    clear_cache()
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["keep.txt"]
    cached("t", build)
    assert len(calls) == 3


def test_a_model_trained_on_mnist_loses_accuracy_on_the_other_domains():
    """Feature shift is real: a small CNN trained on 600 mnist samples is good on mnist, poor elsewhere."""
    acc = mnist_to_all_domains(model_seed=0)
    # measured with this seed: mnist ~0.93, usps ~0.3, uci ~0.3, mnistm ~0.15, synth ~0.1 (chance 0.1)
    assert acc["mnist"] > 0.8, acc
    for other in ("mnistm", "synth"):
        assert acc[other] < 0.4 and acc["mnist"] - acc[other] > 0.4, acc
    for other in ("usps", "uci"):
        assert acc["mnist"] - acc[other] > 0.2, acc
