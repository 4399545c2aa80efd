"""Label maps on grids where nearest-neighbour samples tie: the note that says so.

Where an output grid puts samples exactly half-way between two input voxels (MONAI's grid when
the spacing is halved, 4 mm -> 1.5 mm on a centred grid, ...), nearest neighbour has to pick
one. medproc picks the upper voxel, as ITK does (:data:`medproc.pipeline.graphs.NN_TIE`): a
label boundary on such a row then lies half an output voxel towards lower indices of where the
image puts it (halving the spacing: every boundary, the whole label shifts). MONAI (torch's
``grid_sample``) rounds half to even instead: no shift on average, but structures alternate
between thicker and thinner rows. No rule removes both on such a grid; a
grid without ties does.
"""

from __future__ import annotations

import numpy as np

from .plan import Plan

__all__ = ["tie_note", "with_tie_note"]

_AXES = "ijk"


def tie_axes(plan: Plan) -> list[tuple[int, float, float]]:
    """The output axes on which nearest-neighbour samples fall exactly on the boundaries between
    input voxels (axis-aligned plans; an oblique grid ties on no whole row):
    ``(axis, output spacing, fraction of the input's voxel boundaries within the grid that a
    sample falls on)``, for the axes where that fraction is at least a tenth."""
    m = np.asarray(plan.matrix, dtype=np.float64)
    lin = m[:3, :3]
    if np.count_nonzero(np.abs(lin) > 1e-9) != 3:
        return []
    spacing = np.linalg.norm(np.asarray(plan.out_affine)[:3, :3], axis=0)
    out = []
    for o in range(3):
        r = int(np.argmax(np.abs(lin[:, o])))  # the input axis output axis o reads
        pos = lin[r, o] * np.arange(plan.out_shape[o]) + m[r, 3]
        on = np.abs(pos - np.floor(pos) - 0.5) < 1e-6
        bounds = np.floor(pos.max() - 0.5) - np.ceil(pos.min() - 0.5) + 1  # within the grid
        hit = len(np.unique(np.floor(pos[on]))) / bounds if bounds > 0 else 0.0
        if hit >= 0.1:
            out.append((o, float(spacing[o]), float(hit)))
    return out


def tie_note(plan: Plan) -> str | None:
    """The note for label maps resampled on ``plan``'s grid when every input voxel boundary
    along some axis falls on a sample (the whole label shifts); None otherwise (where only some
    do, some boundaries move by half an output voxel, as in ITK: not said per case)."""
    ties = [(o, s) for o, s, hit in tie_axes(plan) if hit > 0.9]
    if not ties:
        return None
    where = ", ".join(f"{_AXES[o]} by {s / 2:.3g} mm" for o, s in ties)
    return (
        "label map: on this grid every boundary between input voxels falls exactly on an "
        "output sample, which nearest neighbour gives to the upper voxel (as ITK does): the "
        f"label lies half an output voxel towards lower indices of where the image puts it, "
        f"along {where}. A spacing that does not divide the input's evenly avoids it"
    )


def with_tie_note(plan: Plan) -> Plan:
    """``plan`` with :func:`tie_note` among its notes (for a resample that carries labels)."""
    from dataclasses import replace

    note = tie_note(plan)
    return plan if note is None else replace(plan, notes=(*plan.notes, note))
