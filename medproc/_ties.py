"""Label maps on grids where nearest-neighbour samples tie: the note that says so.

Where an output grid puts samples exactly half-way between two input voxels, nearest neighbour
has to pick one. medproc picks the upper one (higher input index), as ITK does
(:data:`medproc.pipeline.graphs.NN_TIE`), on the CPU and the GPU alike. When every sample along
an axis ties (halving the resolution of an even-sized axis on the centred grid: 0.7 -> 1.4 mm)
or every input voxel boundary falls on a sample (doubling it on MONAI's grid: 3 -> 1.5 mm), the
whole label map then lies, on average over its boundaries, half the finer of the two spacings
towards the input's lower indices of where the image puts it (doubling the resolution: every
boundary by that much; halving it: each by 0 or a whole input voxel). MONAI (torch's ``grid_sample``) rounds half to even instead: no
shift on average, but structures alternate between thicker and thinner rows. No rule avoids
both on such a grid; a grid without ties does. Where only some samples tie (3 -> 2 mm on the
centred grid: a third) the boundaries they fall on move, and a label's centre on average by
part of that.
"""

from __future__ import annotations

import numpy as np

from .geometry import axcodes
from .plan import Plan

__all__ = ["tie_axes", "tie_note", "with_tie_note"]

_OPPOSITE = {"R": "L", "L": "R", "A": "P", "P": "A", "S": "I", "I": "S"}


def tie_axes(plan: Plan) -> list[dict]:
    """Per output axis of an axis-aligned plan (an oblique grid ties on no whole row) whose
    samples tie: the input axis it reads, the fraction of its samples that fall exactly
    half-way between two input voxels, the fraction of the input's voxel boundaries within the
    grid that a sample falls on, and the shift (mm) a label map gets when either is all."""
    m = np.asarray(plan.matrix, dtype=np.float64)
    lin = m[:3, :3]
    if np.count_nonzero(np.abs(lin) > 1e-9) != 3:
        return []
    s_out = np.linalg.norm(np.asarray(plan.out_affine)[:3, :3], axis=0)
    s_in = np.linalg.norm(np.asarray(plan.in_affine)[:3, :3], axis=0)
    out = []
    for o in range(3):
        r = int(np.argmax(np.abs(lin[:, o])))  # the input axis output axis o reads
        pos = lin[r, o] * np.arange(plan.out_shape[o]) + m[r, 3]
        on = np.abs(pos - np.floor(pos) - 0.5) < 1e-6
        if not on.any():
            continue
        bounds = np.floor(pos.max() - 0.5) - np.ceil(pos.min() - 0.5) + 1  # within the grid
        hit = len(np.unique(np.floor(pos[on]))) / bounds if bounds > 0 else 0.0
        shift = min(s_in[r], s_out[o]) / 2
        out.append(dict(axis=o, input_axis=r, samples=float(on.mean()), bounds=hit, mm=shift))
    return out


def tie_note(plan: Plan) -> str | None:
    """The note for label maps resampled on ``plan``'s grid when at least a tenth of the
    samples or of the input voxel boundaries along an axis tie (see the module doc)."""
    ties = [t for t in tie_axes(plan) if max(t["samples"], t["bounds"]) >= 0.1]
    if not ties:
        return None
    codes = axcodes(plan.in_affine)

    def said(t) -> str:
        to = _OPPOSITE[codes[t["input_axis"]]]
        if max(t["samples"], t["bounds"]) > 0.9:
            return f"all, by {t['mm']:.3g} mm on average, towards {to}"
        return f"those at {t['samples']:.0%} of the samples by {t['mm']:.3g} mm towards {to}"

    return (
        "label map: on this grid nearest-neighbour samples fall exactly half-way between input "
        "voxels, and each takes the upper voxel (as ITK does), so label boundaries move from "
        f"where the image puts them: {'; '.join(said(t) for t in ties)}. A spacing or grid "
        "without half-way samples avoids it"
    )


def with_tie_note(plan: Plan) -> Plan:
    """``plan`` with :func:`tie_note` among its notes (for a resample that carries labels)."""
    from dataclasses import replace

    note = tie_note(plan)
    return plan if note is None else replace(plan, notes=(*plan.notes, note))
