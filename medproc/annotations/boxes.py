"""Lesions placed on a grid as boxes in MONAI's detection format."""

from __future__ import annotations

import numpy as np

__all__ = ["lesion_boxes"]


def lesion_boxes(placed: list[dict], mode: str = "xyzxyz"):
    """Lesions placed on a grid (``Lesions.on_grid`` dicts) as MONAI detection boxes.

    Returns ``(boxes_voxel, boxes_world, labels)``: float32 ``(N, 6)`` arrays in ``mode``
    (``"xyzxyz"``: corners, MONAI's ``StandardMode``; ``"cccwhd"``: centre and size), in voxel
    ``(i, j, k)`` and world RAS mm coordinates, and int64 ``(N,)`` labels.
    """
    if mode not in ("xyzxyz", "cccwhd"):
        raise ValueError(f"box mode must be 'xyzxyz' or 'cccwhd', got {mode!r}")
    vox = np.zeros((len(placed), 6), np.float32)
    world = np.zeros((len(placed), 6), np.float32)
    for n, p in enumerate(placed):
        for out, c, s in (
            (vox, p["center_voxel"], p["size_voxels"]),
            (world, p["center_world_ras"], p["size_mm"]),
        ):
            c, s = np.asarray(c, np.float64), np.asarray(s, np.float64)
            out[n] = np.r_[c - s / 2, c + s / 2] if mode == "xyzxyz" else np.r_[c, s]
    return vox, world, np.array([p["label"] for p in placed], np.int64)
