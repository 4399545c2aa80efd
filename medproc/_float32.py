"""The float32 range rule: DALI resamples in float32, so wider float values beyond its range
would silently become inf. One check, for the readers (naming the file) and the engine."""

from __future__ import annotations

import numpy as np

#: the largest float32 (the pipelines compute in float32)
F32_MAX = float(np.finfo(np.float32).max)


def beyond_float32(a) -> str | None:
    """Why the finite values of ``a`` (a numpy array or torch tensor) cannot become float32
    (a sentence), or None when they can: float types wider than float32 only, NaN and inf
    ignored (they stay NaN and inf), a value is beyond when float32 rounds it to inf."""
    torch_like = hasattr(a, "to") and not isinstance(a, np.ndarray)
    if torch_like:
        if str(a.dtype) != "torch.float64" or not a.numel():
            return None
        fin = a if bool(a.isfinite().all()) else a[a.isfinite()]  # (NaN/inf stay as they are)
        if not fin.numel():
            return None
        lo, hi = np.float64(fin.min().item()), np.float64(fin.max().item())
    else:
        a = np.asarray(a)
        if a.dtype.kind != "f" or a.dtype.itemsize <= 4 or not a.size:
            return None
        lo, hi = a.min(), a.max()  # (scalars of a's own type: a longdouble stays one)
        if not (np.isfinite(lo) and np.isfinite(hi)):
            fin = np.isfinite(a)
            lo = np.min(a, where=fin, initial=a.dtype.type(0))
            hi = np.max(a, where=fin, initial=a.dtype.type(0))
    big = max(-lo, hi)
    with np.errstate(over="ignore"):
        if np.isfinite(np.float32(big)):
            return None
    show = np.format_float_scientific(big, precision=8, trim="-")
    return (
        f"{_name(a)} values reach {show}, beyond float32's range ({F32_MAX:.8e}) that "
        "medproc resamples in (DALI computes in float32): they would become inf; rescale them"
    )


def _name(a) -> str:
    return str(a.dtype).replace("torch.", "")
