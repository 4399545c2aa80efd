"""QC pictures: orthogonal mid-slices before and after, with labels and lesions overlaid.

Slices are shown in the closest RAS axes of each volume (so before/after line up even when the
conversion reoriented), with in-plane aspect from the voxel spacing. Needs matplotlib.
"""

from __future__ import annotations

import numpy as np

from .volume import Volume

__all__ = ["qc_figure"]

_VIEWS = (("axial", 2), ("coronal", 1), ("sagittal", 0))  # RAS axis held fixed


def _canonical(vol: Volume, array=None):
    """The array in (R, A, S) index order and its affine (flips/transposes only)."""
    from nibabel.orientations import apply_orientation, inv_ornt_aff, io_orientation

    arr = vol.array if array is None else array
    if arr.ndim == 4:
        arr = arr[..., 0]
    aff = vol.affine
    ornt = io_orientation(aff)
    out = apply_orientation(arr, ornt)
    return out, aff @ inv_ornt_aff(ornt, arr.shape)


def _window(arr, modality):
    if modality == "CT" or (arr.min() < -500 and arr.max() > 200):
        return -1000.0, 400.0
    lo, hi = np.percentile(arr, [1, 99])
    return float(lo), float(hi) if hi > lo else float(lo) + 1


def qc_figure(
    before: Volume,
    after: Volume,
    path: str,
    label_before: Volume | None = None,
    label_after: Volume | None = None,
    lesions=(),
    title: str = "",
) -> str:
    """Write a PNG: mid-slices of ``before`` (top row) and ``after`` (bottom row).

    ``lesions`` is a sequence of ``(center_ras_mm, diameter_mm)``; each is drawn as a circle on
    every view whose slice cuts it, at its world position on each grid.
    """
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Circle
    except ImportError:
        raise ImportError("QC pictures need matplotlib: pip install 'medproc[qc]'") from None

    from .io import atomic_write

    modality = before.meta.get("modality")
    # a Figure of its own (no pyplot): the caller's matplotlib backend and figures are untouched
    fig = Figure(figsize=(12, 8.4), facecolor="black")
    axes = fig.subplots(2, 3)
    centre = before.voxel_to_world((np.array(before.shape) - 1) / 2.0)  # same world point on both
    for row, (vol, lab, name) in enumerate(
        ((before, label_before, "before"), (after, label_after, "after"))
    ):
        data, aff = _canonical(vol)
        ldata = _canonical(lab)[0] if lab is not None else None
        sp = np.sqrt((aff[:3, :3] ** 2).sum(0))
        c_idx = np.round(np.linalg.solve(aff[:3, :3], centre - aff[:3, 3])).astype(int)
        c_idx = np.clip(c_idx, 0, np.array(data.shape) - 1)
        lo, hi = _window(data, modality)
        for col, (view, fixed) in enumerate(_VIEWS):
            ax = axes[row, col]
            sl = [slice(None)] * 3
            sl[fixed] = c_idx[fixed]
            img = data[tuple(sl)].T  # rows: the higher free axis
            free = [a for a in range(3) if a != fixed]
            ax.imshow(
                img,
                cmap="gray",
                vmin=lo,
                vmax=hi,
                origin="lower",
                aspect=sp[free[1]] / sp[free[0]],
                interpolation="nearest",
            )
            if ldata is not None and ldata[tuple(sl)].any():
                ax.contour(ldata[tuple(sl)].T > 0, levels=[0.5], colors="lime", linewidths=0.8)
            inv = np.linalg.inv(aff)
            for c_ras, diam in lesions:
                ijk = inv[:3, :3] @ np.asarray(c_ras, float) + inv[:3, 3]
                d = (ijk[fixed] - c_idx[fixed]) * sp[fixed]
                r = diam / 2.0
                if abs(d) < r:
                    rr = np.sqrt(r * r - d * d)
                    ax.add_patch(
                        Circle(
                            (ijk[free[0]], ijk[free[1]]),
                            rr / sp[free[0]],
                            fill=False,
                            edgecolor="red",
                            linewidth=1.2,
                        )
                    )
            ax.set_title(
                f"{name} {view}  {vol.shape} @ {' x '.join(f'{s:.2f}' for s in vol.spacing)} mm",
                color="white",
                fontsize=8,
            )
            ax.axis("off")
    fig.suptitle(title, color="white", fontsize=10)
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, dpi=80, facecolor="black", format="png")
    return path
