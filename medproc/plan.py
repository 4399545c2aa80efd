"""Plan a resample on the CPU, in float64: output grid, output affine, and the one matrix.

Orientation change + respacing + crop/pad compose into one matrix ``M`` that maps an output
index to an input index (``in = M @ out``, homogeneous 4x4); the executor (a DALI pipeline, or
any reference resampler) only has to sample the input at ``M @ out``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from nibabel.orientations import axcodes2ornt, io_orientation, ornt_transform

from .geometry import apply_affine, as_affine, is_orthogonal, spacing_of
from .plan_values import foreground_box, intensity_params, nothing_above
from .spec import Spec

__all__ = [
    "Plan",
    "make_plan",
    "say_notes",
    "intensity_params",
    "flip_map",
    "affine_map",
    "monai_grid",
    "input_boxes",
    "content_motion",
]


def flip_map(shape, axes) -> np.ndarray:
    """Index map of a flip of voxel ``axes`` (0, 1, 2 = i, j, k) on a grid of ``shape``
    (x -> n - 1 - x).

    >>> flip_map((4, 5, 6), [0])[0].tolist()
    [-1.0, 0.0, 0.0, 3.0]
    """
    t = np.eye(4)
    for a in np.atleast_1d(axes):
        t[a, a] = -1.0
        t[a, 3] = shape[a] - 1
    return t


def affine_map(
    shape, spacing, rotate_deg=(0.0, 0.0, 0.0), scale=(1.0, 1.0, 1.0), translate_mm=(0.0, 0.0, 0.0)
) -> np.ndarray:
    """Index map of a rotation (degrees about voxel axes i, j, k, applied in that order),
    scaling and translation of the content about the grid centre, in millimetres.

    The content moves by ``R @ S`` (then ``translate_mm``); the returned map is its inverse in
    index space: output index -> where to sample the un-augmented output.
    """
    sp = np.asarray(spacing, dtype=np.float64)
    c = (np.asarray(shape[:3], dtype=np.float64) - 1) / 2
    r = np.eye(3)
    for axis, ang in enumerate(np.radians(rotate_deg)):
        if ang:
            a, b = [x for x in range(3) if x != axis]
            g = np.eye(3)
            g[a, a] = g[b, b] = np.cos(ang)
            g[a, b], g[b, a] = -np.sin(ang), np.sin(ang)
            r = g @ r
    fwd = np.eye(4)  # content motion in mm about the centre
    fwd[:3, :3] = r @ np.diag(np.asarray(scale, dtype=np.float64))
    fwd[:3, 3] = translate_mm
    to_mm = np.eye(4)
    to_mm[:3, :3] = np.diag(sp)
    to_mm[:3, 3] = -sp * c
    return np.linalg.inv(to_mm) @ np.linalg.inv(fwd) @ to_mm


def input_boxes(matrix, out_shape, in_shape, margin: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The box ``[lo, hi)`` of input indices that outputs of ``out_shape`` read through
    ``matrix`` (output index -> input index): the output grid's corners mapped, ``margin``
    voxels around them for interpolation, clipped to ``in_shape``. Batched: ``matrix``
    ``(..., 4, 4)`` and ``in_shape`` ``(..., 3)`` give ``lo``, ``hi`` ``(..., 3)``.

    >>> lo, hi = input_boxes(np.eye(4), (4, 4, 4), (10, 10, 10))
    >>> lo.tolist(), hi.tolist()
    ([0, 0, 0], [5, 5, 5])
    """
    m = np.asarray(matrix, dtype=np.float64)
    o = np.asarray(out_shape, dtype=np.float64) - 1
    corners = np.array([[a, b, c] for a in (0, o[0]) for b in (0, o[1]) for c in (0, o[2])])
    src = np.einsum("...ij,cj->...ci", m[..., :3, :3], corners) + m[..., None, :3, 3]
    src = np.round(src, 9)  # 3 - 1e-16 is 3: floor and ceil not moved by rounding noise
    n = np.asarray(in_shape, dtype=np.int64)
    lo = np.clip(np.floor(src.min(-2)).astype(np.int64) - margin, 0, n - 1)
    hi = np.clip(np.ceil(src.max(-2)).astype(np.int64) + margin + 1, lo + 1, n)
    return lo, hi


def content_motion(out_affine, index_map) -> np.ndarray:
    """The world (RAS mm) motion of the content that an augmentation ``index_map`` on a grid of
    ``out_affine`` makes (see :meth:`Plan.augmented`); batched over leading axes."""
    a = np.asarray(out_affine, dtype=np.float64)
    return a @ np.linalg.inv(np.asarray(index_map, dtype=np.float64)) @ np.linalg.inv(a)


@dataclass
class Plan:
    """A per-volume plan: where the output grid lies and where each output voxel samples the input.

    Shapes are ``(ni, nj, nk)``; affines map voxel ``(i, j, k)`` to RAS mm; ``matrix`` maps an
    output index to an input index (homogeneous 4x4, float64).
    """

    in_shape: tuple[int, int, int]
    in_affine: np.ndarray
    out_shape: tuple[int, int, int]
    out_affine: np.ndarray
    matrix: np.ndarray  # 4x4, output index -> input index
    intensity: tuple[float, float, float, float] | None = None  # lo, hi, a, b: clip then a*x+b
    #: world-space motion of the content by augmentation (identity for plain resampling):
    #: annotations move by it, exactly as the voxels do
    motion: np.ndarray = field(default_factory=lambda: np.eye(4))
    #: what planning has to say about this volume in words (e.g. crop_foreground found no
    #: voxel above its threshold); callers say them (:func:`say_notes`) or record them
    notes: tuple[str, ...] = ()

    def augmented(self, index_map: np.ndarray) -> Plan:
        """This plan followed by an augmentation on its output grid.

        ``index_map`` (4x4) maps an output index to the index the un-augmented output would be
        sampled at (see :func:`flip_map`, :func:`affine_map`). The composed plan still samples
        the input once (``matrix @ index_map``), keeps the output grid and affine, and records
        the content's world motion so that annotations follow it.
        """
        t = as_affine(index_map, "the augmentation's index map (augment's result)")
        world = content_motion(self.out_affine, t)
        return replace(self, matrix=self.matrix @ t, motion=world @ self.motion)

    def input_region(self, margin: int = 1) -> tuple[tuple[slice, slice, slice], Plan]:
        """The part of the input this plan reads, and the plan re-based onto that part.

        Move only the bytes you need: a crop (or patch) of a big volume touches a small box of
        the input; slicing the input to ``region`` and executing the returned plan gives the same
        output. ``margin`` voxels are kept around the box for interpolation.
        """
        lo, hi = input_boxes(self.matrix, self.out_shape, self.in_shape, margin)
        shift = np.eye(4)
        shift[:3, 3] = -lo
        region_affine = self.in_affine @ np.linalg.inv(shift)
        plan = replace(
            self,
            in_shape=tuple(int(x) for x in hi - lo),
            in_affine=region_affine,
            matrix=shift @ self.matrix,
        )
        return tuple(slice(int(a), int(b)) for a, b in zip(lo, hi)), plan

    def output_slab(self, k0: int, k1: int) -> Plan:
        """The part of this plan that makes output slices ``k0:k1`` (its output grid, and where
        those voxels sample the same input), for running one big volume as several samples."""
        shift = np.eye(4)
        shift[2, 3] = k0
        return replace(
            self,
            out_shape=(*self.out_shape[:2], int(k1 - k0)),
            out_affine=self.out_affine @ shift,
            matrix=self.matrix @ shift,
        )

    def inverse(self) -> Plan:
        """The plan that maps this plan's output grid back onto its input grid (for putting a
        prediction back where the image came from). Intensity and motion are not inverted."""
        return Plan(
            tuple(self.out_shape),
            self.out_affine.copy(),
            tuple(self.in_shape),
            self.in_affine.copy(),
            np.linalg.inv(self.matrix),
        )

    def lesions_on_grid(self, lesions) -> list[dict]:
        """Where ``lesions`` (world RAS) land in this plan's output (see Lesions.on_grid)."""
        if not hasattr(lesions, "on_grid"):
            hint = (
                ": a table of all cases (read_luna_csv/read_json without series=/image=); "
                "pass this case's entry"
                if isinstance(lesions, dict)
                else ""
            )
            raise TypeError(
                f"lesions must be a medproc.annotations.Lesions, got {type(lesions).__name__}"
                + hint
            )
        moved = lesions if np.allclose(self.motion, np.eye(4)) else lesions.transformed(self.motion)
        return moved.on_grid(self.out_affine, self.out_shape)

    @property
    def axis_aligned(self) -> bool:
        """True when output axis a samples only input axis a (scale/flip/shift: separable)."""
        m = self.matrix[:3, :3]
        return bool(np.all(np.abs(m - np.diag(np.diag(m))) < 1e-9) and np.all(np.diag(m) != 0))

    @property
    def identity(self) -> bool:
        """True when the plan maps its input grid onto itself (nothing to resample)."""
        return self.in_shape == self.out_shape and np.allclose(self.matrix, np.eye(4), atol=1e-9)

    def map_points(self, ijk_in) -> np.ndarray:
        """Input array indices -> output array indices (for annotations)."""
        return apply_affine(np.linalg.inv(self.matrix), ijk_in)


def _orthonormalise(dirs: np.ndarray) -> np.ndarray:
    """Gram-Schmidt in axis order i, j, k, each axis keeping its side."""
    out = np.empty_like(dirs)
    out[:, 0] = dirs[:, 0] / np.linalg.norm(dirs[:, 0])
    v = dirs[:, 1] - (dirs[:, 1] @ out[:, 0]) * out[:, 0]
    out[:, 1] = v / np.linalg.norm(v)
    n = np.cross(out[:, 0], out[:, 1])
    out[:, 2] = n if n @ dirs[:, 2] > 0 else -n
    return out


def _round_half_up(x):
    return np.floor(np.asarray(x) + 0.5).astype(int)


def make_plan(
    shape,
    affine,
    spec: Spec,
    array: np.ndarray | None = None,
    source: str | None = None,
    *,
    labels: bool = False,
) -> Plan:
    """Plan the resample of a volume of ``shape`` ``(ni, nj, nk)`` on ``affine`` to ``spec``.

    ``array`` (numpy or torch) is needed only when ``spec.needs_array``: for ``crop_foreground``
    and the intensity statistics (percentiles, z-score, scale without a window). What planning
    has to say about the volume is in ``plan.notes`` (see :func:`say_notes`); ``source`` is
    deprecated (it named the volume in warnings make_plan no longer gives). ``labels``: the
    resample carries label maps (nearest neighbour): where the grid puts samples half-way
    between input voxels, a note says how far label boundaries move (:mod:`medproc._ties`).

    Examples
    --------
    >>> p = make_plan((100, 100, 40), np.diag([1.0, 1.0, 2.5, 1.0]), Spec(spacing=2.0))
    >>> p.out_shape
    (50, 50, 50)
    """
    if source is not None:
        import warnings

        warnings.warn(
            "make_plan(source=...) is deprecated: planning's notes are in plan.notes; say them "
            "with medproc.plan.say_notes(plan, source)",
            DeprecationWarning,
            stacklevel=2,
        )
    shape = tuple(int(s) for s in shape[:3])
    A = as_affine(affine, "make_plan's affine")
    s_in = spacing_of(A)
    dirs = A[:3, :3] / s_in  # unit column per array axis
    if not is_orthogonal(A):
        # a sheared input (gantry tilt): the output is an orthogonal grid. Axis i keeps its
        # direction, j its plane with i (a DICOM slice's rows and columns stay), k becomes their
        # normal; each axis's spacing is its step across the planes of the axes before it (the
        # diagonal of the frame's QR), so that n steps span the input's extent: for a gantry
        # tilt the slice distance, for a shear inside the i-j plane j's step normal to i too
        dirs = _orthonormalise(dirs)
        s_in = np.abs(np.diag(dirs.T @ A[:3, :3]))
    # 1) orientation: which input axis (and sign) feeds each output axis
    src = np.arange(3)
    sign = np.ones(3)
    if spec.orientation:
        target = axcodes2ornt(tuple(spec.orientation))
        t = ornt_transform(io_orientation(A), target)  # per input axis: (output axis, flip)
        for i in range(3):
            src[int(t[i, 0])] = i
            sign[int(t[i, 0])] = t[i, 1]
    n_in = np.array(shape, dtype=np.float64)[src]
    s_src = s_in[src]
    # 2) spacing / shape
    if spec.grid == "monai" and spec.spacing is not None:
        s_out = np.array(spec.spacing, dtype=np.float64)
        out, n_out = monai_grid(shape, A, src, sign, s_out)
    else:
        if spec.shape is not None:
            n_out = np.array(spec.shape, dtype=int)
            s_out = n_in * s_src / n_out
        elif spec.spacing is not None:
            s_out = np.array(spec.spacing, dtype=np.float64)
            n_out = np.maximum(1, _round_half_up(n_in * s_src / s_out))
        else:
            s_out, n_out = s_src.copy(), n_in.astype(int)
        out = np.eye(4)
        out[:3, :3] = dirs[:, src] * sign * s_out
        centre = apply_affine(A, (np.array(shape) - 1) / 2.0)
        out[:3, 3] = centre - out[:3, :3] @ ((n_out - 1) / 2.0)
    # 3) crop / pad on the output grid
    notes: list[str] = []
    start = np.zeros(3, dtype=int)
    size = n_out.copy()
    if spec.crop_foreground is not None:
        if array is None:
            raise ValueError("crop_foreground needs the array to find the foreground")
        box = foreground_box(array, spec.crop_foreground)
        if box is None:  # (the whole grid is kept: say so, a wrong threshold looks like this)
            notes.append(nothing_above(array, spec.crop_foreground))
        else:
            lo, hi = box
            corners = np.array(
                [[a, b, c] for a in (lo[0], hi[0]) for b in (lo[1], hi[1]) for c in (lo[2], hi[2])],
                dtype=np.float64,
            )
            m_in2out = np.linalg.inv(out) @ A
            oc = apply_affine(m_in2out, corners)
            margin = spec.margin / s_out
            # (clipped to the grid in float first: a huge margin keeps the whole grid)
            start = np.floor(np.clip(oc.min(0) - margin, 0, n_out - 1)).astype(int)
            stop = np.ceil(np.clip(oc.max(0) + margin, 0, n_out - 1)).astype(int)
            size = stop - start + 1
    if spec.crop is not None:
        want = np.array(spec.crop, dtype=int)
        start = start + (size - want) // 2
        size = want
    out[:3, 3] = out[:3, 3] + out[:3, :3] @ start
    matrix = np.linalg.inv(A) @ out
    plan = Plan(shape, A.copy(), tuple(int(x) for x in size), out, matrix, notes=tuple(notes))
    if spec.intensity.active:
        plan.intensity = intensity_params(spec, array)
    if labels:
        from ._ties import with_tie_note

        plan = with_tie_note(plan)
    return plan


def say_notes(plan: Plan, source: str | None = None) -> None:
    """Say ``plan.notes`` as :class:`~medproc.errors.MedprocWarning` s naming ``source``."""
    if plan.notes:
        import warnings

        from .errors import MedprocWarning

        for note in plan.notes:
            warnings.warn(f"{source}: {note}" if source else note, MedprocWarning, stacklevel=3)


def monai_grid(shape, affine, src, sign, spacing) -> tuple[np.ndarray, np.ndarray]:
    """The output affine and shape of MONAI's ``Orientationd`` + ``Spacingd`` (``diagonal=False``,
    ``scale_extent=False``), computed as MONAI does, in float64.

    ``src[o]`` is the input axis that feeds output axis ``o`` and ``sign[o]`` whether it is
    flipped (the orientation step); ``spacing`` the target spacing along the output axes.
    MONAI reorients the input (a flipped axis starts at its last voxel), keeps the directions
    (re-orthogonalised in axis order when the input is sheared), and lays the new grid from the
    corner that is lowest along every new axis (the first voxel centre, for an orthogonal
    input; the centres of the two grids are aligned when no corner is lowest along all axes).
    Along each axis ``n_out = round(extent / spacing + 1)``, with ``extent`` the span of the
    input's voxel centres (numpy's round: half to even).

    >>> out, n = monai_grid((100, 100, 36), np.diag([3.0, 3, 2, 1]), [0, 1, 2], [1, 1, 1], [2.0] * 3)
    >>> n.tolist(), out[:3, 3].tolist()
    ([150, 150, 36], [0.0, 0.0, 0.0])
    """
    shape = np.asarray(shape[:3])
    reorient = np.zeros((4, 4))  # reoriented index -> input index
    reorient[3, 3] = 1.0
    for o in range(3):
        reorient[src[o], o] = sign[o]
        if sign[o] < 0:
            reorient[src[o], 3] = shape[src[o]] - 1
    a_r = np.asarray(affine, dtype=np.float64) @ reorient
    n_r = shape[np.asarray(src)].astype(np.float64)
    q, r = np.linalg.qr(a_r[:3, :3])  # directions, each axis kept on its side
    out = np.eye(4)
    out[:3, :3] = q * np.sign(np.diag(r)) * np.asarray(spacing, dtype=np.float64) + 0.0
    ends = [(0.0, n - 1.0) for n in n_r]
    corners = np.array([[a, b, c, 1.0] for a in ends[0] for b in ends[1] for c in ends[2]]).T
    on_out = np.linalg.solve(out, a_r) @ corners
    n_out = np.round(np.ptp(on_out[:3], axis=1) + 1.0).astype(int)
    world = a_r @ corners
    for c in range(corners.shape[1]):
        if np.allclose(np.min(on_out[:3] - on_out[:3, c : c + 1], axis=1), 0.0):
            out[:3, 3] = world[:3, c]
            break
    else:  # MONAI aligns the two grids' centres (as shape / 2, its convention)
        out[:3, 3] = a_r[:3, :3] @ (n_r / 2.0) + a_r[:3, 3] - out[:3, :3] @ (n_out / 2.0)
    return out, n_out
