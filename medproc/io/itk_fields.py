"""The geometry fields of NRRD and MetaImage text headers, checked before SimpleITK reads
them: numbers that must be finite, NRRD space directions of length 0, and NRRD axes given no
voxel size (which SimpleITK reads as 1 mm without a word)."""

from __future__ import annotations

import math
import re

from ..errors import ReadError

__all__ = ["check_finite", "check_directions", "nrrd_unsized"]

#: the geometry fields (lower case) whose numbers must be finite: SimpleITK reads NaN in them as
#: 0 (a MetaImage's TransformMatrix/ElementSpacing) or a made-up 1 mm (a NRRD's spacings)
_GEOMETRY_FIELDS = (
    # NRRD
    "space directions",
    "space origin",
    "spacings",
    "axis mins",
    "axis maxs",
    # MetaImage
    "elementspacing",
    "elementsize",
    "offset",
    "origin",
    "position",
    "transformmatrix",
    "rotation",
    "orientation",
    "centerofrotation",
)
#: NRRD per-axis fields, where ``nan`` marks an axis without that quantity (the NRRD format):
#: allowed only on an axis that is not spatial (its ``kinds`` entry; without one, beyond 3)
_NRRD_PER_AXIS = ("spacings", "axis mins", "axis maxs")
_SPATIAL_KINDS = ("domain", "space", "time")


def check_finite(fields: dict[str, str], path: str) -> None:
    """Every number of a geometry field is finite (``none`` is a word, skipped), but for the
    ``nan`` of a NRRD axis that is not spatial."""
    kinds = fields.get("kinds", "").split()
    for key in _GEOMETRY_FIELDS:
        val = fields.get(key)
        if val is None:
            continue
        for axis, tok in enumerate(re.findall(r"[^\s(),]+", val)):
            try:
                x = float(tok)
            except ValueError:
                continue
            if math.isfinite(x):
                continue
            spatial = kinds[axis].lower() in _SPATIAL_KINDS if axis < len(kinds) else axis < 3
            if math.isnan(x) and key in _NRRD_PER_AXIS and not spatial:
                continue
            raise ReadError(
                f"its {key!r} field holds {tok!r} ({val[:80]!r}): the geometry must be "
                "finite numbers (the header is damaged)",
                path,
            )


def check_directions(dirs: str, path: str) -> None:
    """A NRRD space direction of length 0 (SimpleITK reads it as a NaN direction, which was
    reported as a non-finite affine): named with its axis."""
    for axis, vec in enumerate(re.findall(r"\(([^)]*)\)|none", dirs)):
        try:
            zero = bool(vec) and all(float(x) == 0 for x in vec.split(","))
        except ValueError:
            continue  # (not numbers: SimpleITK's own error says so)
        if zero:
            raise ReadError(
                f"its 'space directions' give axis {axis} the vector ({vec}): a voxel size of "
                "0 mm (the header is damaged)",
                path,
            )


def nrrd_unsized(fields: dict[str, str], n: int) -> list[str]:
    """A note when a NRRD gives a spatial axis no size (SimpleITK makes it 1 mm, unsaid)."""
    dirs, what = fields.get("space directions"), "the header has no 'space directions'"
    if dirs is not None:
        none = [i for i, d in enumerate(re.findall(r"\([^)]*\)|none", dirs)) if d == "none"]
        if not none or n - len(none) >= 3:
            return []  # (all axes sized, or 3 spatial ones beside a channel or time axis)
        what = f"axis {', '.join(map(str, none))} has no direction ('none')"
    elif "spacings" in fields:
        return []
    return [f"{what}: its voxel size is unknown and read as 1 mm; check the geometry"]
