"""What a received model, or two versions of it, give away of the images behind it.

* `class_inversion`: ART's `MIFace` (Fredrikson et al. 2015, the model inversion attack pFedSV
  runs in its Fig. 11): per class, gradient descent on an input until the model calls it that
  class; the picture is what the model learned that class looks like.
* `update_inversion` (written here: ART has no gradient inversion for PyTorch models): the
  cosine-similarity attack of Geiping et al. 2020. A peer's update between two versions of its
  part, θ_start − θ_end, is lr times the sum of the gradients of its local steps; dummy images
  are optimised until the gradient they cause points the same way (plus a total-variation prior).
  With one image and one step this recovers the image; a whole round of several epochs over
  hundreds of images is far from one gradient, which is what the measured similarity shows.
  Labels come from the head's bias (iDLG, Zhao et al. 2020): a class whose bias grew was trained on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call


def class_inversion(model: nn.Module, classes: Sequence[int], shape: tuple[int, ...], num_classes: int, *,
                    max_iter: int = 500, learning_rate: float = 0.1) -> np.ndarray:
    """One image per class in `classes`, (len(classes), *shape) in [0, 1]."""
    from art.attacks.inference.model_inversion import MIFace
    from art.estimators.classification import PyTorchClassifier

    classifier = PyTorchClassifier(model=model.eval(), loss=nn.CrossEntropyLoss(), input_shape=shape,
                                   nb_classes=num_classes, clip_values=(0.0, 1.0), device_type="cpu")
    attack = MIFace(classifier, max_iter=max_iter, window_length=100, threshold=0.99, learning_rate=learning_rate,
                    batch_size=len(classes), verbose=False)
    start = np.zeros((len(classes), *shape), dtype=np.float32)
    return attack.infer(start, y=np.asarray(classes, dtype=np.int64))


def trained_labels(start: Mapping[str, torch.Tensor], end: Mapping[str, torch.Tensor], bias: str, n: int) -> list[int]:
    """The n labels the update most likely trained on: classes by how much their bias grew, cycled."""
    grown = (end[bias] - start[bias]).double()
    ranked = [int(c) for c in torch.argsort(grown, descending=True) if grown[c] > 0] or [int(torch.argmax(grown))]
    return [ranked[i % len(ranked)] for i in range(n)]


def _total_variation(x: torch.Tensor) -> torch.Tensor:
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


def update_inversion(model: nn.Module, start: Mapping[str, torch.Tensor], end: Mapping[str, torch.Tensor],
                     labels: Sequence[int], shape: tuple[int, ...], *, iterations: int = 1000, lr: float = 0.1,
                     tv: float = 1e-4, seed: int = 0) -> np.ndarray:
    """Images (len(labels), *shape) in [0, 1] whose gradient at `start` best matches start − end in
    direction, over the floating parameters both hold."""
    names = [n for n, p in model.named_parameters() if n in start and n in end]
    if not names:
        raise ValueError("the two versions share no parameter of the model: nothing to invert")
    params = {n: start[n].detach().float().clone().requires_grad_(True) for n in names}
    buffers = {n: b for n, b in model.named_buffers()}
    target = torch.cat([(start[n] - end[n]).detach().float().flatten() for n in names])
    if float(target.norm()) == 0:
        raise ValueError("the two versions are equal: the update is zero")
    y = torch.as_tensor(list(labels), dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    latent = torch.randn((len(labels), *shape), generator=generator).mul_(0.5).requires_grad_(True)
    optimizer = torch.optim.Adam([latent], lr=lr)
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, [int(iterations * f) for f in (0.375, 0.625, 0.875)], 0.1)
    model.eval()  # batch statistics of dummy images would be the attacker's invention
    for _ in range(iterations):
        optimizer.zero_grad()
        x = torch.sigmoid(latent)
        loss = F.cross_entropy(functional_call(model, ({**params, **buffers}), (x,)), y)
        grads = torch.autograd.grad(loss, [params[n] for n in names], create_graph=True)
        flat = torch.cat([g.flatten() for g in grads])
        objective = 1 - F.cosine_similarity(flat, target, dim=0) + tv * _total_variation(x)
        objective.backward()
        optimizer.step()
        schedule.step()
    return torch.sigmoid(latent).detach().numpy()


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two images in [0, 1] (∞ when equal)."""
    from skimage.metrics import peak_signal_noise_ratio

    return float(peak_signal_noise_ratio(np.asarray(b, np.float64), np.asarray(a, np.float64), data_range=1.0))


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Structural similarity of two (C, H, W) or (H, W) images in [0, 1]."""
    from skimage.metrics import structural_similarity

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim == 3:
        return float(np.mean([structural_similarity(a[c], b[c], data_range=1.0) for c in range(a.shape[0])]))
    return float(structural_similarity(a, b, data_range=1.0))


def nearest(reconstruction: np.ndarray, images: np.ndarray) -> tuple[int, float]:
    """The index of the image closest to `reconstruction` (mean squared error) and the PSNR to it."""
    errors = ((images.reshape(len(images), -1) - reconstruction.reshape(1, -1)) ** 2).mean(axis=1)
    best = int(np.argmin(errors))
    return best, psnr(reconstruction, images[best])
