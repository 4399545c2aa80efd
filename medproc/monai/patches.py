"""What :class:`~medproc.monai.PatchLoader` draws: patch centres (:class:`PosNeg`, as MONAI's
``RandCropByPosNegLabeld``) and augmentations (:class:`Augment`, as ``RandFlipd``,
``RandRotate90d``, ``RandAffined``/``RandRotated``, ``RandScaleIntensityd`` and
``RandShiftIntensityd``), with MONAI's names, units (radians) and probabilities.

Every geometric augmentation is an *index map* on the patch grid (output index -> the index of
the un-augmented patch it samples), so crop + flips + rotation + scaling compose into the one
matrix the engine executes; intensity augmentations fold into the plan's ``a * clip(x) + b``.

>>> Augment(flip_prob=0.5).flip_probs
(0.5, 0.5, 0.5)
>>> PosNeg(pos=1, neg=3).pos_ratio
0.25
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..plan import Plan, content_motion, flip_map, input_boxes

__all__ = [
    "PosNeg",
    "Augment",
    "crop_start",
    "rotation_map",
    "rot90_map",
    "draw_patches",
    "patch_size_of",
]


def _range(value, name: str) -> tuple[float, float]:
    """MONAI's convention for a random range: ``r`` means ``U(-r, r)``, ``(lo, hi)`` ``U(lo, hi)``."""
    v = np.atleast_1d(np.asarray(value, dtype=np.float64))
    if not np.isfinite(v).all():
        raise ValueError(f"{name} must be finite, got {value!r}")
    if v.size == 1:
        r = float(v[0])
        if r < 0:
            raise ValueError(f"{name} must be >= 0 (a range U(-r, r)), got {value!r}")
        return (-r, r)
    if v.shape != (2,) or not v[0] <= v[1]:
        raise ValueError(
            f"{name} must be a number r or a pair (lo, hi) with lo <= hi, got {value!r}"
        )
    return (float(v[0]), float(v[1]))


def _prob(value, name: str) -> float:
    if isinstance(value, (str, bytes)) or not np.isscalar(value):  # ("0.5" is no number)
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    p = float(value)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    return p


def patch_size_of(patch_size, batch_size: int) -> tuple[int, int, int]:
    """``patch_size`` (1 or 3 whole sizes >= 1, as MONAI's ``spatial_size``) as 3 ints, checked
    as a Spec's ``crop``; refused too if a batch of such patches (float32 images and labels)
    would take more memory than one volume may here (``patch_size=100000`` was DALI's
    ``bad_alloc``)."""
    from ..errors import UsageError
    from ..io.safety import human, max_bytes
    from ..spec import check_sizes

    patch = check_sizes(patch_size, "patch_size")
    need = int(np.prod(patch, dtype=object)) * 4 * 2 * int(batch_size)
    if need > max_bytes():
        raise UsageError(
            f"patch_size {patch!r:.80} x batch_size {batch_size}: one batch of patches and "
            f"labels would take {human(need)}, more than the {human(max_bytes())} one volume may take "
            "here (the smallest of the physical memory, ulimit -v and MEDPROC_MAX_BYTES)"
        )
    return patch


@dataclass(frozen=True)
class PosNeg:
    """Patch centres as MONAI's ``RandCropByPosNegLabeld`` chooses them.

    Each patch is centred on a foreground voxel (label > 0) with probability
    ``pos / (pos + neg)``, else on a background voxel (label == 0, and, with
    ``image_threshold``, image > threshold), uniformly among them; the crop is then moved inside
    the volume (MONAI's ``correct_crop_centers``). A volume without foreground gives background
    patches and one without background foreground patches, as in MONAI.

    Parameters
    ----------
    pos, neg : float
        Relative weights of foreground and background centres (MONAI's ``pos``, ``neg``).
    num_samples : int
        Patches drawn from a volume each time it comes up, i.e. per volume per epoch (MONAI's
        ``num_samples``); they are consecutive in the batches, as MONAI's list collation gives.
    image_threshold : float, optional
        MONAI's ``image_key`` + ``image_threshold`` (``FgBgToIndicesd(image_key=...)``):
        background centres only where the image, after the spec's intensity step, is above
        this value. ``None``: every label == 0 voxel is background.
    """

    pos: float = 1.0
    neg: float = 1.0
    num_samples: int = 1
    image_threshold: float | None = None

    def __post_init__(self):
        finite = all(np.isfinite(float(v)) for v in (self.pos, self.neg))
        if not finite or self.pos < 0 or self.neg < 0 or self.pos + self.neg == 0:
            raise ValueError(
                f"PosNeg: pos and neg must be finite, >= 0 and not both 0, got pos={self.pos}, "
                f"neg={self.neg}"
            )
        if int(self.num_samples) != self.num_samples or self.num_samples < 1:
            raise ValueError(f"PosNeg.num_samples must be an integer >= 1, got {self.num_samples}")
        object.__setattr__(self, "num_samples", int(self.num_samples))

    @property
    def pos_ratio(self) -> float:
        """Probability that a patch is centred on foreground."""
        return self.pos / (self.pos + self.neg)


@dataclass(frozen=True)
class Augment:
    """Random augmentations of each patch, in MONAI's names and units, applied in this order.

    Geometric ones are executed with the crop in one resampling of the cached volume, so a
    rotated or shrunk patch is filled with the real surroundings of the patch, where MONAI pads
    the cropped patch.

    Parameters
    ----------
    flip_prob : float or (pi, pj, pk)
        ``RandFlipd(prob=p, spatial_axis=a)`` on each axis ``a`` independently.
    rotate90_prob : float
        ``RandRotate90d(prob=p, max_k=3, spatial_axes=(0, 1))``: k in {1, 2, 3} quarter turns in
        the (i, j) plane (the patch must be square in i and j).
    affine_prob : float
        ``RandAffined(prob=p, rotate_range=(range_x, range_y, range_z), scale_range=...)``: one
        draw of rotation and scaling about the patch centre. MONAI's default, 0.1.
    range_x, range_y, range_z : float or (lo, hi)
        Rotation angles in **radians** about axes i, j, k (``r``: ``U(-r, r)``), as
        ``RandRotated``'s ``range_x/y/z`` and ``RandAffined``'s ``rotate_range``; the matrix is
        MONAI's ``create_rotate`` (``Rx @ Ry @ Rz``).
    scale_range : float, or one float or (lo, hi) per axis
        ``RandAffined``'s: each axis samples ``1 + U(-s, s)`` times as far from the centre
        (> 1 zooms out). One number applies to every axis (MONAI's ``RandAffined`` would apply
        it to the first axis only; there, write ``(s, s, s)``).
    scale_intensity_prob, intensity_factors : float; float or (lo, hi)
        ``RandScaleIntensityd(factors, prob)``: ``x * (1 + U(-f, f))``. MONAI's default prob 0.1.
    shift_intensity_prob, intensity_offsets : float; float or (lo, hi)
        ``RandShiftIntensityd(offsets, prob)``: ``x + U(-o, o)``, after the scaling. Both act
        on the image after the spec's intensity step.
    """

    flip_prob: float | tuple[float, float, float] = 0.0
    rotate90_prob: float = 0.0
    affine_prob: float = 0.1
    range_x: float | tuple[float, float] = 0.0
    range_y: float | tuple[float, float] = 0.0
    range_z: float | tuple[float, float] = 0.0
    scale_range: float | tuple = 0.0
    scale_intensity_prob: float = 0.1
    intensity_factors: float | tuple[float, float] = 0.0
    shift_intensity_prob: float = 0.1
    intensity_offsets: float | tuple[float, float] = 0.0

    def __post_init__(self):
        fp = np.atleast_1d(np.asarray(self.flip_prob, dtype=np.float64))
        if fp.size == 1:
            fp = np.repeat(fp, 3)
        if fp.shape != (3,):
            raise ValueError(
                f"Augment.flip_prob must be one probability or three, got {self.flip_prob!r}"
            )
        object.__setattr__(self, "flip_prob", tuple(_prob(p, "Augment.flip_prob") for p in fp))
        for name in (
            "rotate90_prob",
            "affine_prob",
            "scale_intensity_prob",
            "shift_intensity_prob",
        ):
            _prob(getattr(self, name), f"Augment.{name}")
        for name in ("range_x", "range_y", "range_z", "intensity_factors", "intensity_offsets"):
            _range(getattr(self, name), f"Augment.{name}")
        _ = self.scale_ranges  # validates

    @property
    def flip_probs(self) -> tuple[float, float, float]:
        """Flip probability of axes i, j, k."""
        return tuple(self.flip_prob)

    @cached_property
    def rotate_ranges(self) -> list[tuple[float, float]]:
        """(lo, hi) radians about i, j, k."""
        return [_range(getattr(self, n), f"Augment.{n}") for n in ("range_x", "range_y", "range_z")]

    @cached_property
    def scale_ranges(self) -> list[tuple[float, float]]:
        """(lo, hi) of the scale offset per axis (the factor is 1 + U(lo, hi))."""
        s = self.scale_range
        if np.ndim(s) == 0:
            return [_range(s, "Augment.scale_range")] * 3
        if len(s) != 3:
            raise ValueError(
                "Augment.scale_range must be a number s (every axis) or one s or (lo, hi) per "
                f"axis (i, j, k), got {s!r}"
            )
        return [_range(x, "Augment.scale_range") for x in s]

    @cached_property
    def geometric(self) -> bool:
        """Whether any rotation or scaling can happen (the patch is then interpolated)."""
        ranges = self.rotate_ranges + self.scale_ranges
        return self.affine_prob > 0 and any(lo != 0 or hi != 0 for lo, hi in ranges)

    def index_map(self, shape, rng: np.random.Generator) -> np.ndarray:
        """A random index map on a patch grid of ``shape`` (output index -> index of the
        un-augmented patch): flips, then a quarter turn, then rotation + scaling."""
        t = np.eye(4)
        for ax, p in enumerate(self.flip_prob):
            if p and rng.random() < p:
                t = t @ flip_map(shape, [ax])
        if self.rotate90_prob and rng.random() < self.rotate90_prob:
            t = t @ rot90_map(shape, int(rng.integers(1, 4)))
        if self.geometric and rng.random() < self.affine_prob:
            angles = [rng.uniform(lo, hi) for lo, hi in self.rotate_ranges]
            scales = [1.0 + rng.uniform(lo, hi) for lo, hi in self.scale_ranges]
            t = t @ rotation_map(shape, angles, scales)
        return t

    def intensity(self, rng: np.random.Generator) -> tuple[float, float]:
        """A random ``(scale, shift)``: the patch becomes ``x * scale + shift``."""
        scale, shift = 1.0, 0.0
        (lo, hi), (olo, ohi) = self._intensity_ranges
        if (lo or hi) and self.scale_intensity_prob and rng.random() < self.scale_intensity_prob:
            scale = 1.0 + rng.uniform(lo, hi)
        if (olo or ohi) and self.shift_intensity_prob and rng.random() < self.shift_intensity_prob:
            shift = rng.uniform(olo, ohi)
        return scale, shift

    @cached_property
    def _intensity_ranges(self):
        return (
            _range(self.intensity_factors, "Augment.intensity_factors"),
            _range(self.intensity_offsets, "Augment.intensity_offsets"),
        )


def rot90_map(shape, k: int) -> np.ndarray:
    """Index map of ``numpy.rot90(patch, k, axes=(0, 1))`` (as ``torch.rot90`` and MONAI's
    ``Rotate90``) on a grid square in (i, j).

    >>> x = np.arange(2 * 2 * 1).reshape(2, 2, 1)
    >>> t = rot90_map(x.shape, 1)
    >>> all(np.rot90(x, 1)[a, b, 0] == x[tuple((t @ [a, b, 0, 1])[:3].astype(int))]
    ...     for a in range(2) for b in range(2))
    True
    """
    if shape[0] != shape[1]:
        raise ValueError(f"a quarter turn in (i, j) needs a patch square in i and j, got {shape}")
    one = np.eye(4)
    one[:2, :2] = [[0, 1], [-1, 0]]  # out (a, b) samples (b, n - 1 - a)
    one[1, 3] = shape[0] - 1
    return np.linalg.matrix_power(one, int(k) % 4)


def rotation_map(shape, radians, scales) -> np.ndarray:
    """MONAI's ``RandAffine`` index map about the grid centre: output coordinates (centred)
    sample the input at ``R @ S @ x`` with ``R = Rx @ Ry @ Rz`` (``create_rotate``) and
    ``S = diag(scales)`` (``create_scale``)."""
    rx, ry, rz = (float(a) for a in radians)
    cx, sx, cy, sy, cz, sz = np.cos(rx), np.sin(rx), np.cos(ry), np.sin(ry), np.cos(rz), np.sin(rz)
    r_x = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    r_y = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    r_z = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    m = np.eye(4)
    m[:3, :3] = r_x @ r_y @ r_z @ np.diag(np.asarray(scales, dtype=np.float64))
    c = (np.asarray(shape[:3], dtype=np.float64) - 1) / 2
    m[:3, 3] = c - m[:3, :3] @ c
    return m


def crop_start(centre, shape, patch) -> np.ndarray:
    """Where a patch centred on ``centre`` starts once moved inside the volume, as MONAI's
    ``correct_crop_centers`` + ``SpatialCrop``: ``clip(c - p // 2, 0, n - p)``; along an axis
    shorter than the patch, the patch is centred on the volume (and filled beyond it).

    >>> crop_start([2, 50, 99], [100, 100, 100], [10, 10, 10]).tolist()
    [0, 45, 90]
    """
    c, n, p = (np.asarray(x, dtype=np.int64) for x in (centre, shape, patch))
    start = np.clip(c - p // 2, 0, np.maximum(n - p, 0))
    return np.where(n < p, (n - p) // 2, start)


def draw_patches(
    entries: Sequence,
    patch: Sequence[int],
    sampling: PosNeg,
    augment: Augment,
    rng: np.random.Generator,
    margin: int = 1,
) -> tuple[list[tuple[slice, slice, slice]], list[Plan], np.ndarray]:
    """One batch of patches of cached volumes, one patch per entry: where each reads its volume
    and its plan (crop + augmentation + intensity), re-based onto that box.

    Per sample the random draws are made in a fixed order (foreground or background, the
    centre voxel, the augmentation's index map, the intensity scale and shift); the geometry
    of the whole batch is then computed at once, ``(B, 4, 4)`` at a time, with the functions
    :meth:`Plan.input_region <medproc.plan.Plan.input_region>` and
    :meth:`Plan.augmented <medproc.plan.Plan.augmented>` use (this runs in the loader's
    background thread, where every interpreter-held millisecond is one the training loop may
    wait for).

    Parameters
    ----------
    entries : sequence of cache entries
        :class:`~medproc.monai._cache_entry.Entry` objects (their ``shape``, ``affine``,
        ``intensity`` and foreground / background indices).
    patch : (i, j, k)
        The patch size.
    sampling, augment : PosNeg, Augment
        How centres and augmentations are drawn.
    rng : numpy.random.Generator
        The loader's generator.
    margin : int
        Voxels kept around each box for interpolation.

    Returns
    -------
    regions : list of (slice, slice, slice)
        The ``(i, j, k)`` box of each volume its patch reads.
    plans : list of Plan
        Each patch's plan on its box.
    affines : ndarray (B, 4, 4)
        Where each patch voxel's content lies (the augmented patch's affine, as MONAI's
        spatial transforms leave it).
    """
    n = len(entries)
    size = np.asarray(patch, dtype=np.int64)
    flat, maps, inten = np.empty(n, np.int64), np.empty((n, 4, 4)), []
    for b, e in enumerate(entries):
        use_fg = rng.random() < sampling.pos_ratio
        if use_fg and e.fg.size == 0:
            use_fg = False
        elif not use_fg and e.n_bg == 0:
            use_fg = True
        flat[b] = e.fg_voxel(rng) if use_fg else e.bg_voxel(rng)
        maps[b] = augment.index_map(patch, rng)
        inten.append(augment.intensity(rng))
    shapes = np.array([e.shape for e in entries], dtype=np.int64)
    # the centres' (i, j, k) (flat indices, i fastest), each patch moved inside its volume
    centre = np.stack(
        [
            flat % shapes[:, 0],
            flat // shapes[:, 0] % shapes[:, 1],
            flat // (shapes[:, 0] * shapes[:, 1]),
        ],
        axis=1,
    )
    starts = crop_start(centre, shapes, size)
    vol_aff = np.stack([e.affine for e in entries]).astype(np.float64)
    crop = np.broadcast_to(np.eye(4), (n, 4, 4)).copy()
    crop[:, :3, 3] = starts
    matrix = crop @ maps  # patch index -> volume index
    lo, hi = input_boxes(matrix, size, shapes, margin)  # as Plan.input_region, batched
    rebased = matrix.copy()
    rebased[:, :3, 3] -= lo
    box_aff = vol_aff.copy()
    box_aff[:, :3, 3] += np.einsum("bij,bj->bi", vol_aff[:, :3, :3], lo)
    out_aff = vol_aff @ crop
    motion = content_motion(out_aff, maps)  # as Plan.augmented, batched
    regions, plans = [], []
    for b, e in enumerate(entries):
        regions.append(tuple(slice(int(x), int(y)) for x, y in zip(lo[b], hi[b])))
        scale, shift = inten[b]
        lo_, hi_, a, c = e.intensity if e.intensity is not None else (-np.inf, np.inf, 1.0, 0.0)
        plans.append(
            Plan(
                tuple(int(x) for x in hi[b] - lo[b]),
                box_aff[b],
                tuple(int(x) for x in size),
                out_aff[b],
                rebased[b],
                (lo_, hi_, a * scale, c * scale + shift),
                motion[b],
            )
        )
    return regions, plans, vol_aff @ matrix
