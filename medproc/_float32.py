"""The float32 range rule: DALI resamples in float32, so wider float values beyond its range
would silently become inf. One check, for the readers (naming the file) and the engine."""

from __future__ import annotations

import numpy as np

_F32_MAX = float(np.finfo(np.float32).max)


def beyond_float32(a) -> str | None:
    """Why the finite values of ``a`` (a numpy array or torch tensor) cannot become float32
    (a sentence), or None when they can: float types wider than float32 only, NaN and inf
    ignored (they stay NaN and inf), a value is beyond when float32 rounds it to inf."""
    torch_like = hasattr(a, "to") and not isinstance(a, np.ndarray)
    if torch_like:
        if str(a.dtype) != "torch.float64" or not a.numel():
            return None
        lo, hi = float(a.min()), float(a.max())
        if not (np.isfinite(lo) and np.isfinite(hi)):  # NaN/inf somewhere: finite ones only
            fin = a[a.isfinite()]
            lo, hi = (float(fin.min()), float(fin.max())) if fin.numel() else (0.0, 0.0)
    else:
        a = np.asarray(a)
        if a.dtype.kind != "f" or a.dtype.itemsize <= 4 or not a.size:
            return None
        lo, hi = float(a.min()), float(a.max())
        if not (np.isfinite(lo) and np.isfinite(hi)):
            fin = np.isfinite(a)
            lo = float(np.min(a, where=fin, initial=0.0))
            hi = float(np.max(a, where=fin, initial=0.0))
    big = max(-lo, hi)
    with np.errstate(over="ignore"):
        if np.isfinite(np.float32(big)):
            return None
    return (
        f"{_name(a)} values reach {big:.3g}, beyond float32's range ({_F32_MAX:.4g}) that "
        "medproc resamples in (DALI computes in float32): they would become inf; rescale them"
    )


def _name(a) -> str:
    return str(a.dtype).replace("torch.", "")
