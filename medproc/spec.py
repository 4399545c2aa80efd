"""The declarative preprocessing spec: what the output should look like, not how to get there.

Axis order: ``spacing``, ``shape`` and ``crop`` are given in NIfTI order ``(i, j, k)`` of the
*output* (like MONAI's ``pixdim``), the order of ``Volume.shape`` and ``Volume.spacing``;
orientation codes name axes ``(i, j, k)`` (``"RAS"``: i -> Right, j -> Anterior, k -> Superior).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace

import numpy as np

from ._float32 import F32_MAX
from .errors import UsageError

__all__ = ["Intensity", "Spec", "INTERPOLATIONS", "GRIDS"]

INTERPOLATIONS = ("linear", "cubic", "nearest")
#: output grid conventions for ``spacing=`` (see :class:`Spec`)
GRIDS = ("centred", "monai")
_VALID_CODES = set("RLAPSI")


def _triple(value, name: str, positive: bool = True, integer: bool = False):
    """``value`` (one number or three, for axes (i, j, k)) as a tuple of three, each checked
    as :func:`_number` checks one; None stays None."""
    if value is None:
        return None
    try:
        many = np.ndim(value) > 0 and not isinstance(value, str)
    except ValueError:  # (a ragged sequence)
        many = True
    items = list(value) if many else [value]
    what = "one number or three (i, j, k)"
    if len(items) not in (1, 3):
        raise UsageError(f"{name} must be {what}, got {value!r}")
    try:
        v = np.array([_number(x, name, what) for x in items] * (3 // len(items)))
    except UsageError:
        raise UsageError(f"{name} must be {what}, got {value!r}") from None
    if positive and np.any(v <= 0):
        raise UsageError(f"{name} must be > 0, got {value!r}")
    if integer:
        if np.any(v != np.round(v)):
            raise UsageError(f"{name} must be whole numbers of voxels, got {value!r}")
        return tuple(int(x) for x in v)
    return tuple(float(x) for x in v)


def _number(value, name: str, what: str, minimum: float | None = None) -> float:
    """``value`` as one finite real number (>= ``minimum``), or a UsageError naming ``name``:
    bools, strings and arrays of them, complex numbers and sequences are refused."""
    try:
        arr = np.asarray(value)
        ok = (
            arr.ndim == 0
            and (
                arr.dtype.kind in "iuf"
                or (arr.dtype.kind == "O" and isinstance(value, numbers.Real))
            )
            and not isinstance(value, bool)
        )
        v = float(value) if ok else None
    except (TypeError, ValueError, OverflowError):
        v = None
    if v is None or not np.isfinite(v) or (minimum is not None and v < minimum):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise UsageError(f"{name} must be {what}, got {shown}")
    return v


#: output dtypes the pipelines write (numpy names)
OUTPUT_DTYPES = (
    "float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
)  # fmt: skip


def _flag(v, name: str) -> None:
    """A switch must be True or False ('no' would be true)."""
    if not isinstance(v, (bool, np.bool_)):
        raise UsageError(f"{name} must be True or False, got {v!r}")


@dataclass(frozen=True)
class Intensity:
    """Intensity steps, applied in this order after resampling.

    Parameters
    ----------
    clip : (lo, hi), optional
        Fixed window, e.g. ``(-1000, 400)`` HU.
    percentiles : (lo, hi), optional
        nnU-Net style: clip to these percentiles of the volume's intensities (e.g.
        ``(0.5, 99.5)``), computed per volume on the CPU (on at most ~4M voxels, strided).
    scale : (lo, hi), optional
        Map the clip window (or the input volume's min/max when nothing clips) linearly to
        this range (the output's extremes may then fall a little inside it: interpolation
        smooths).
    zscore : bool
        Subtract the mean and divide by the standard deviation of the clipped *input* volume,
        computed before resampling (so the output's deviation is a little under 1; MONAI's
        ``NormalizeIntensityd`` after resampling uses the output's).
    """

    clip: tuple[float, float] | None = None
    percentiles: tuple[float, float] | None = None
    scale: tuple[float, float] | None = None
    zscore: bool = False

    def __post_init__(self):
        for name in ("clip", "percentiles", "scale"):
            v = getattr(self, name)
            if v is not None:
                what = "(lo, hi) with lo < hi, two finite numbers within float32's range"
                bad = UsageError(f"Intensity.{name} must be {what}, got {v!r}")
                if isinstance(v, str) or np.ndim(v) != 1 or len(v) != 2:
                    raise bad
                try:
                    v = tuple(_number(x, f"Intensity.{name}", what) for x in v)
                except UsageError:
                    raise bad from None
                if not v[0] < v[1] or max(abs(v[0]), abs(v[1])) > F32_MAX:
                    raise bad
                object.__setattr__(self, name, v)
        _flag(self.zscore, "Intensity.zscore")
        if self.clip and self.percentiles:
            raise UsageError("Intensity: give clip or percentiles, not both")
        if self.scale and self.zscore:
            raise UsageError("Intensity: give scale or zscore, not both")
        if self.percentiles and not (0 <= self.percentiles[0] and self.percentiles[1] <= 100):
            raise UsageError(f"Intensity.percentiles must lie in [0, 100], got {self.percentiles}")

    @property
    def active(self) -> bool:
        """Whether any intensity step is set."""
        return bool(self.clip or self.percentiles or self.scale or self.zscore)


@dataclass(frozen=True)
class Spec:
    """What the output should look like.

    Parameters
    ----------
    spacing : float or (si, sj, sk), optional
        Target voxel spacing in mm. ``None`` keeps the input spacing.
    shape : (ni, nj, nk), optional
        Target grid size instead of a spacing (the field of view is kept exactly).
    orientation : str, optional
        Target axis codes such as ``"RAS"`` or ``"LPS"``; the axes are permuted/flipped to the
        closest match (an oblique volume stays oblique, as in MONAI's Orientation). ``None`` keeps.
    interp : {"linear", "cubic", "nearest"}
        Image interpolation. Labels always use nearest neighbour and are never antialiased.
    antialias : bool
        Low-pass filter images when downsampling (needs an axis-aligned plan).
    crop : (ni, nj, nk), optional
        Crop/pad the output grid to this size, centred.
    crop_foreground : float, optional
        Crop the output grid to the bounding box of input voxels above this value.
    margin : float
        Margin in mm around the foreground box.
    intensity : Intensity
        Clip / percentile clip / scale / z-score.
    dtype : str
        Output dtype of images (labels keep theirs).
    fill : float, optional
        Value outside the input grid; ``None`` repeats the border voxel (the only choice with
        cubic interpolation or antialiasing).
    grid : {"centred", "monai"}
        Where a ``spacing=`` grid lies (see Notes). ``"centred"`` (the default) is medproc's
        rule; ``"monai"`` reproduces MONAI's ``Orientationd`` + ``Spacingd`` grid exactly.

    Notes
    -----
    medproc's output grid rule (``grid="centred"``), held exactly: along each output axis
    ``n_out = max(1, floor(n_in * s_in / s_out + 1/2))`` and the output grid is centred on the
    input grid's centre (the field-of-view centre is preserved, so the rule is symmetric under
    flips). With ``shape`` the spacing is ``n_in * s_in / n_out`` and the field of view is
    identical (the ``align_corners=False`` convention of torch's interpolate).

    ``grid="monai"`` is the grid of MONAI's ``Spacingd(pixdim=spacing)`` (``diagonal=False``,
    ``scale_extent=False``) after ``Orientationd(axcodes=orientation)``: the first voxel centre
    of the reoriented input stays where it is and ``n_out = round((n_in - 1) * s_in / s_out +
    1)`` (numpy's round, half to even). Both grids are exact in world coordinates; they differ
    in where the voxels lie and sometimes in size (pyradiomics' lung1, 0.57 x 0.57 x 5 mm, at
    1.5 mm: 195 x 195 x 160 centred, 195 x 195 x 158 MONAI, first voxels 1.75 mm apart along
    k). ``shape=`` and an unchanged spacing give the same grid under both (MONAI's ``Resized``
    keeps the field of view, as medproc does).
    """

    spacing: tuple[float, float, float] | None = None
    shape: tuple[int, int, int] | None = None
    orientation: str | None = None
    interp: str = "linear"
    antialias: bool = False
    crop: tuple[int, int, int] | None = None
    crop_foreground: float | None = None
    margin: float = 0.0
    intensity: Intensity = field(default_factory=Intensity)
    dtype: str = "float32"
    fill: float | None = None
    grid: str = "centred"

    def __post_init__(self):
        object.__setattr__(self, "spacing", _triple(self.spacing, "spacing"))
        if self.spacing is not None:
            from .io.safety import SPACING_RANGE_MM, spacings_outside

            lo, hi = SPACING_RANGE_MM  # (what the readers accept: outputs must read back)
            if spacings_outside(self.spacing):
                raise UsageError(f"spacing must be {lo:g} to {hi:g} mm, got {self.spacing}")
        object.__setattr__(self, "shape", _triple(self.shape, "shape", integer=True))
        object.__setattr__(self, "crop", _triple(self.crop, "crop", integer=True))
        if self.crop_foreground is not None:
            fg = _number(self.crop_foreground, "crop_foreground", "one finite threshold")
            object.__setattr__(self, "crop_foreground", fg)
        margin = 0.0 if self.margin is None else self.margin  # (None: no margin)
        margin = _number(margin, "margin", "one finite number of mm >= 0", minimum=0.0)
        object.__setattr__(self, "margin", margin)
        if self.spacing and self.shape:
            raise UsageError("Spec: give spacing or shape, not both")
        if self.orientation is not None and not isinstance(self.orientation, str):
            raise UsageError(
                f"orientation must be a string such as 'RAS', got {self.orientation!r}"
            )
        if self.orientation is not None:
            o = self.orientation.upper()
            pairs = [{"R", "L"}, {"A", "P"}, {"S", "I"}]
            if len(o) != 3 or set(o) - _VALID_CODES or any(len(p & set(o)) != 1 for p in pairs):
                raise UsageError(
                    f"orientation must be three codes, one of R/L, A/P and S/I each (e.g. 'RAS'), "
                    f"got {self.orientation!r}"
                )
            object.__setattr__(self, "orientation", o)
        if self.grid not in GRIDS:
            hint = " (medproc spells it 'centred')" if self.grid == "centered" else ""
            raise UsageError(f"grid must be one of {GRIDS}, got {self.grid!r}{hint}")
        if self.interp not in INTERPOLATIONS:
            raise UsageError(f"interp must be one of {INTERPOLATIONS}, got {self.interp!r}")
        try:
            name = np.dtype(self.dtype).name
        except TypeError:
            raise UsageError(f"dtype {self.dtype!r} is not a numpy dtype") from None
        if name not in OUTPUT_DTYPES:
            raise UsageError(f"dtype must be one of {', '.join(OUTPUT_DTYPES)}, got {self.dtype!r}")
        object.__setattr__(self, "dtype", name)  # one spelling ("f4" is "float32"): recorded
        _flag(self.antialias, "antialias")
        if self.fill is not None:  # (float32 holds it: 1e40 became NaN in the padding)
            ok = isinstance(self.fill, (int, float, np.integer, np.floating))
            ok = ok and not isinstance(self.fill, bool)
            if not ok or abs(float(self.fill)) > float(np.finfo(np.float32).max):
                raise UsageError(  # (NaN marks the padding: allowed)
                    f"fill must be a number float32 holds (or NaN), got {self.fill!r}"
                )
            if isinstance(self.fill, np.generic):  # (recorded as JSON with the options)
                object.__setattr__(self, "fill", self.fill.item())
            if np.isnan(self.fill) and np.dtype(name).kind in "iu":  # (the padding became 0)
                raise UsageError(
                    f"fill=NaN cannot mark the padding of an output of dtype {name} (integers hold no "
                    "NaN); give a number, or a float dtype"
                )
            if self.interp == "cubic" or self.antialias:  # (DALI's RuntimeError; ignored)
                what = "interp=cubic" if self.interp == "cubic" else "antialias"
                raise UsageError(
                    f"fill={self.fill!r} with {what}: only DALI's resize has cubic "
                    "interpolation and antialiasing, and it repeats the border; give fill=None "
                    "(the border repeated), or interp='linear' and antialias=False to pad with "
                    "a value"
                )
        if isinstance(self.intensity, dict):
            object.__setattr__(self, "intensity", Intensity(**self.intensity))
        if not isinstance(self.intensity, Intensity):
            raise UsageError(
                f"intensity must be a medproc.Intensity (e.g. Intensity(zscore=True)), got "
                f"{self.intensity!r}"
            )

    def replace(self, **kw) -> Spec:
        """A copy with the given fields changed (validated again)."""
        return replace(self, **kw)

    @property
    def needs_array(self) -> bool:
        """Whether planning needs the voxels, not only the geometry: foreground crops and
        intensity statistics (percentiles, z-score, scale without a clip window)."""
        it = self.intensity
        return bool(
            self.crop_foreground is not None
            or it.percentiles
            or it.zscore
            or (it.scale and not it.clip)
        )


def whole_number(v) -> bool:
    """Whether ``v`` is an integer (numpy's too), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_args(spec, who: str, **counts) -> None:
    """Refuse, naming the argument, a ``spec`` that is not a :class:`Spec` and counts (e.g.
    ``batch_size=...``) that are not whole numbers >= 1 (0 or -1 gave empty batches, or DALI's
    errors from deep inside)."""
    from .errors import UsageError

    if not isinstance(spec, Spec):
        raise UsageError(f"{who}: spec must be a medproc.Spec, got {type(spec).__name__}")
    for name, v in counts.items():
        if not whole_number(v) or v < 1:
            raise UsageError(f"{who}: {name} must be a whole number >= 1, got {v!r}")


def check_sizes(value, name: str) -> tuple[int, int, int]:
    """``value`` (one whole size >= 1, or three: i, j, k) as three ints, checked as a Spec's
    ``crop`` is (``patch_size``: NaN, 7.5, "8", True or None refused by name)."""
    if value is None:
        raise UsageError(f"{name} must be one number or three (i, j, k), got None")
    return _triple(value, name, integer=True)


def check_types(who: str, **given) -> None:
    """Refuse, naming it, an argument of another type (``with_label="yes"`` would be true;
    ``seed="x"`` failed deep in numpy)."""
    from .errors import UsageError

    for name, (value, kind) in given.items():
        kinds = (int, np.integer) if kind is int else kind
        if kind is int and isinstance(value, bool) or not isinstance(value, kinds):
            raise UsageError(f"{who}: {name} must be {_kind_name(kind)}, got {value!r}")


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {bool: "True or False", int: "a whole number", type(None): "None"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)
