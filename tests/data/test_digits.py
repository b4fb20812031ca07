"""The digits domains: built offline, cached where P2PFL_DATA_CACHE says, deterministic, and really different."""

from __future__ import annotations

import hashlib
import os
import shutil

import numpy as np
import pytest

from tests.data.helpers import mnist_to_all_domains

from p2pfl.data import DIGIT_DOMAINS, DOMAIN_SIZES, cache_dir, clear_cache, load_domain
from p2pfl.data import digits
from p2pfl.data.cache import cached


# The synth data this package renders with the pinned Pillow (FreeType inside its wheel) and
# matplotlib's fonts: the same on every machine, whatever fonts its system has.
SYNTH_FONT_FINGERPRINT = "91a8e46c90"
SYNTH_FIRST_40_SHA1 = "f91049caf5ce530f55fbb39503886c4b2db27e1f"


def _pinned_renderer() -> bool:
    import importlib.metadata

    return importlib.metadata.version("pillow") == "13.0.0"


def _synth_digest(n: int = 40) -> str:
    x, y = digits.build_synth(n=n)
    return hashlib.sha1(x.tobytes() + y.tobytes()).hexdigest()


def test_synth_renders_from_the_packages_fonts_only(monkeypatch):
    monkeypatch.delenv(digits.FONT_DIRS_ENV, raising=False)
    import matplotlib

    files = digits._font_files()
    assert len(files) == len(digits.BUNDLED_FONTS)
    assert all(f.startswith(matplotlib.get_data_path()) for f in files)
    assert len(digits._usable_fonts()) == len(digits.BUNDLED_FONTS) + 1  # and Pillow's own


@pytest.mark.skipif(not _pinned_renderer(), reason="the golden values belong to the Pillow version pyproject.toml pins")
def test_synth_fingerprint_and_images_unchanged_when_the_system_has_extra_fonts(tmp_path, monkeypatch):
    """A machine with more fonts (system-wide, per user, or a fontconfig folder) renders the same
    synth: the fingerprint and the images are the pinned golden values, before and after."""
    monkeypatch.delenv(digits.FONT_DIRS_ENV, raising=False)
    assert digits.font_fingerprint() == SYNTH_FONT_FINGERPRINT
    assert _synth_digest() == SYNTH_FIRST_40_SHA1
    extra = tmp_path / "fonts"
    extra.mkdir()
    shutil.copy(digits.bundled_font_files()[0], extra / "ExtraSans.ttf")
    (extra / "fonts.conf").write_text(f"<fontconfig><dir>{extra}</dir></fontconfig>")
    for var in ("XDG_DATA_HOME", "FONTCONFIG_PATH", "FONTCONFIG_FILE"):  # where font libraries look
        monkeypatch.setenv(var, str(extra / "fonts.conf" if var == "FONTCONFIG_FILE" else extra))
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".fonts").symlink_to(extra)
    assert digits.font_fingerprint() == SYNTH_FONT_FINGERPRINT
    assert digits.data_fingerprint(["mnist", "synth"]) == {"synth": digits.cache_name("synth")}
    assert digits.cache_name("synth").endswith(SYNTH_FONT_FINGERPRINT)
    assert _synth_digest() == SYNTH_FIRST_40_SHA1


def test_p2pfl_font_dirs_adds_the_users_fonts_as_an_opt_in(tmp_path, monkeypatch):
    monkeypatch.delenv(digits.FONT_DIRS_ENV, raising=False)
    assert digits.user_font_dirs() == ()
    bundled = digits._font_files()
    alone = digits.font_fingerprint()
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "sub").mkdir(parents=True)
    b.mkdir()
    (a / "sub" / "One.TTF").write_bytes(b"1")
    (b / "Two.otf").write_bytes(b"22")
    (b / "notes.txt").write_bytes(b"not a font")
    monkeypatch.setenv(digits.FONT_DIRS_ENV, f"{a}{os.pathsep}{b}")
    assert digits._font_files() == bundled + [str(a / "sub" / "One.TTF"), str(b / "Two.otf")]
    both = digits.font_fingerprint()
    monkeypatch.setenv(digits.FONT_DIRS_ENV, str(a))
    assert digits._font_files() == bundled + [str(a / "sub" / "One.TTF")]
    assert len({alone, both, digits.font_fingerprint()}) == 3  # another font set is other synth data
    assert digits.cache_name("synth").endswith(digits.font_fingerprint())


def test_the_fingerprint_hashes_font_bytes_not_paths(tmp_path, monkeypatch):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "F.ttf").write_bytes(b"same bytes")
    (two / "F.ttf").write_bytes(b"same bytes")
    monkeypatch.setenv(digits.FONT_DIRS_ENV, str(one))
    first = digits.font_fingerprint()
    monkeypatch.setenv(digits.FONT_DIRS_ENV, str(two))
    assert digits.font_fingerprint() == first  # another machine's folder, the same fonts


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
