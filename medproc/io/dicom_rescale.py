"""DICOM's RescaleSlope/Intercept, the one rule of the CPU reader and the GPU decoder: integer
voxels where the result is integral (12-bit CT becomes int16 HU without a copy), float32
otherwise, and never a value beyond float32's range (an error naming the file instead)."""

from __future__ import annotations

import numpy as np

from .._float32 import F32_MAX
from ..errors import ReadError

__all__ = ["rescale", "rescaled_dtype"]


def rescaled_dtype(smin: int, smax: int, slopes: np.ndarray, intercepts: np.ndarray):
    """The integer dtype that holds ``stored * slope + intercept`` exactly for stored values in
    [smin, smax], or None when the result needs float32 (varying or fractional slopes, fractional
    intercepts). Shared by the CPU reader and the GPU decoder."""
    if not (
        np.all(slopes == slopes[0])
        and float(slopes[0]).is_integer()
        and np.all(np.mod(intercepts, 1) == 0)
    ):
        return None
    m = int(slopes[0])
    lo = min(smin * m, smax * m) + int(intercepts.min())
    hi = max(smin * m, smax * m) + int(intercepts.max())
    for dt in (np.int16, np.int32, np.int64):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return np.dtype(dt)
    return None


def _check_each_slice(stored, slopes, intercepts, paths) -> None:
    """A ReadError naming the first slice whose rescale takes its own stored values beyond
    float32's range (NaN and inf stored values are left to the NaN policy)."""
    a = stored.detach().cpu().numpy() if hasattr(stored, "detach") else stored
    for n in range(a.shape[0]):
        v = np.abs(a[n].astype(np.float64))
        top = float(v[np.isfinite(v)].max(initial=0.0))
        if abs(slopes[n]) * top + abs(intercepts[n]) > F32_MAX:
            raise ReadError(
                f"RescaleSlope {slopes[n]:g} and RescaleIntercept {intercepts[n]:g} take its "
                f"stored values (up to {top:g}) beyond float32's range: fix the file",
                paths[n] if paths is not None else None,
            )


def rescale(stored, slopes: np.ndarray, intercepts: np.ndarray, paths=None):
    """Apply RescaleSlope/Intercept per slice (``stored`` is slice-first, numpy or torch);
    integer output when the result is integral (:func:`rescaled_dtype`), else float32. The one
    rule for the CPU reader and the GPU decoder. A rescale that takes stored values beyond
    float32's range is a :class:`ReadError` naming the slice's file (``paths``, per slice).

    ``stored`` is owned by the caller and may be reused in place (no copy of a whole series
    when, e.g., 12-bit unsigned CT becomes int16 HU)."""
    if np.all(slopes == 1) and np.all(intercepts == 0):
        return stored
    tensor = not isinstance(stored, np.ndarray)
    shape = (-1,) + (1,) * (stored.ndim - 1)

    def cast(x, dt):
        if not tensor:
            return x.astype(dt)
        import torch

        return x.to(getattr(torch, np.dtype(dt).name))

    def per_slice(v, dt):
        v = np.ascontiguousarray(v, dtype=dt).reshape(shape)
        if not tensor:
            return v
        import torch

        return torch.from_numpy(v).to(stored.device)

    integer = (not stored.is_floating_point()) if tensor else stored.dtype.kind in "iu"
    if integer:
        smin, smax = int(stored.min()), int(stored.max())
    else:
        smin, smax = float(stored.min()), float(stored.max())
    reach = np.abs(slopes) * max(abs(smin), abs(smax)) + np.abs(intercepts)
    if not np.all(reach <= F32_MAX):  # (inf and NaN in the output otherwise, said nowhere)
        _check_each_slice(stored, slopes, intercepts, paths)  # (the bound above is the whole's)
    if integer:
        dt = rescaled_dtype(smin, smax, slopes, intercepts)
        if dt is not None:
            info = np.iinfo(dt)
            if (
                not tensor
                and dt.itemsize == stored.dtype.itemsize
                and smin >= info.min
                and smax <= info.max
            ):
                out = stored.view(dt)  # same bits, same values: reinterpret, no copy
            else:
                out = cast(stored, dt)
            m = int(slopes[0])
            if m != 1:
                out *= m
            if np.all(intercepts == intercepts[0]):
                out += int(intercepts[0])
            else:
                out += per_slice(intercepts, dt)
            return out
    out = cast(stored, np.float32)
    out *= per_slice(slopes, np.float32)
    out += per_slice(intercepts, np.float32)
    return out
