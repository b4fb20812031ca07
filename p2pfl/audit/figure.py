"""The audit's pictures: report/audit.png (one row of images per finding) and report/audit-images.npz
(the arrays, for a figure across runs; `np.load(..., allow_pickle=False)` reads them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from p2pfl.report.style import plt, save_figure


def _show(ax: Any, image: np.ndarray, title: str) -> None:
    ax.imshow(np.transpose(image, (1, 2, 0)) if image.shape[0] == 3 else image[0], cmap="gray", vmin=0, vmax=1)
    ax.set_title(title, fontsize=7)
    ax.axis("off")


def audit_figure(doc: dict[str, Any], pictures: dict[str, dict[str, np.ndarray]], report: Path) -> Path | None:
    """The first attacked peer's pictures: its class means beside what model inversion drew of them,
    then the images an update inversion recovered beside the nearest true training images."""
    peer = next((p for p, images in pictures.items() if "class_inversion" in images), None)
    if peer is None:
        return None
    report.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(report / "audit-images.npz",
                        **{f"{p}/{k}": v for p, images in pictures.items() for k, v in images.items()})
    images, found = pictures[peer], doc["peers"][peer]
    classes = [int(c) for c in images["class_means_classes"]]
    updates = len(images.get("update_inversion", []))
    columns = max(len(classes), updates, 1)
    rows = 2 + (2 if updates else 0)
    fig, axes = plt.subplots(rows, columns, figsize=(1.2 * columns, 1.35 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for j, c in enumerate(classes):
        _show(axes[0, j], images["class_means"][j], f"class {c}: mean")
        _show(axes[1, j], images["class_inversion"][c],
              f"MIFace, SSIM {found['model_inversion']['ssim_to_class_mean'][j]:.2f}")
    for j in range(updates):
        _show(axes[2, j], images["update_inversion"][j], f"update inv., label {found['update_inversion']['labels'][j]}")
        _show(axes[3, j], images["update_nearest"][j],
              f"nearest, PSNR {found['update_inversion']['psnr_to_nearest'][j]:.1f}")
    loss = found["membership"]["loss"]
    fig.suptitle(f"{doc['node']} auditing {peer} ({found['part']}, round {found['round']}; {doc['algorithm']}, "
                 f"privacy {doc['privacy']}): membership AUC {loss['auc']:.2f}", fontsize=8)
    return save_figure(fig, report / "audit.png")
