"""What planning reads from the voxels themselves: the foreground box of ``crop_foreground``
and the intensity statistics (percentiles, z-score, scale without a window); numpy arrays and
torch tensors alike."""

from __future__ import annotations

import numpy as np

from .spec import Spec

__all__ = ["intensity_params", "foreground_box", "nothing_above", "dtype_clips"]


def nothing_above(array, threshold: float) -> str:
    """The note when :func:`foreground_box` finds nothing: the whole grid is kept (a wrong
    threshold looks like this)."""
    where = " of channel 0" if array.ndim == 4 else ""
    return f"crop_foreground: no voxel{where} is above {threshold}: not cropped"


def dtype_clips(array, spec: Spec) -> str | None:
    """Why an integer output ``spec.dtype`` saturates this volume's values, or None: the values
    reaching the cast are the intensity step's range (scale, else clip), else the input's
    (interpolation stays inside it); z-scores and percentiles are not known here."""
    dt = np.dtype(spec.dtype)
    if dt.kind not in "iu":
        return None
    it = spec.intensity
    if it is not None and (it.zscore or it.percentiles) and not (it.scale or it.clip):
        return None
    if it is not None and (it.scale or it.clip):
        lo, hi = it.scale or it.clip
    elif _fits(array, dt):  # (no pass over the voxels: int16 CT to int16, say)
        return None
    else:
        lo, hi = float(array.min()), float(array.max())
    info = np.iinfo(dt)
    if lo >= info.min and hi <= info.max:
        return None
    return (
        f"values {lo:g}..{hi:g} reach the {dt.name} output, whose range is {info.min}.."
        f"{info.max}: those outside are clipped (scale or clip the intensities, or choose a "
        "wider dtype: --scale, --clip, --dtype)"
    )


def _fits(array, dt: np.dtype) -> bool:
    """Every value ``array`` (numpy or torch) can hold is one of ``dt``'s."""
    from .pipeline._dtypes import _dtype_name

    try:
        return np.can_cast(np.dtype(_dtype_name(array)), dt, "safe")
    except TypeError:
        return False


def foreground_box(array, threshold: float):
    """(lo, hi) voxel indices of the box around voxels above ``threshold`` (channel 0), or None.
    Works on numpy arrays and torch tensors (on their device: only 3 small vectors come back)."""
    a = array[..., 0] if array.ndim == 4 else array
    m = a > threshold
    lo, hi = [], []
    for ax in range(3):
        others = tuple(x for x in range(3) if x != ax)
        line = m.any(axis=others) if isinstance(m, np.ndarray) else m.amax(dim=others).cpu().numpy()
        idx = np.flatnonzero(line)
        if idx.size == 0:
            return None
        lo.append(idx[0])
        hi.append(idx[-1])
    return np.array(lo), np.array(hi)


def _sample(array, max_voxels: int = 4_000_000) -> np.ndarray:
    """A strided sample of at most ~``max_voxels`` voxels, as float64 numpy (from the GPU too),
    its finite values only: a NaN or inf voxel (``load(..., nan="keep")``) would make every
    statistic, and so every output voxel, NaN or 0."""
    n = int(np.prod(array.shape))
    step = max(1, int(np.ceil((n / max_voxels) ** (1 / 3))))
    s = array[::step, ::step, ::step]
    s = (s.cpu().numpy() if hasattr(s, "cpu") else np.asarray(s)).astype(np.float64).ravel()
    s = s[np.isfinite(s)]
    if s.size == 0:
        from .errors import MedprocError

        raise MedprocError(
            "the intensity statistics (--percentiles, --zscore, --scale) found no finite voxel "
            "in the volume: every voxel is NaN or inf"
        )
    return s


def _flat(values) -> bool:
    """Whether the (clipped) sample holds one value only: its z-score or scaling is undefined.
    Exact, by its minimum and maximum (a deviation computed in float32 need not be 0 there; a
    relative threshold took 1000 and 1000.001 for one value)."""
    return values.size == 0 or bool(values.min() == values.max())


def intensity_params(spec: Spec, array) -> tuple[float, float, float, float]:
    """(lo, hi, a, b): the executor computes ``a * clamp(x, lo, hi) + b``."""
    it = spec.intensity
    lo, hi = -np.inf, np.inf
    needs_stats = it.percentiles or it.zscore or (it.scale and not it.clip)
    if needs_stats and array is None:
        raise ValueError("percentile clipping, z-score and scale without clip need the array")
    sample = _sample(array) if needs_stats else None
    if it.clip:
        lo, hi = it.clip
    elif it.percentiles:
        lo, hi = (float(x) for x in np.percentile(sample, it.percentiles))
    a, b = 1.0, 0.0
    if it.zscore:
        clipped = np.clip(sample, lo, hi)
        mean, std = float(clipped.mean()), float(clipped.std())
        if _flat(clipped):  # (a constant volume: 0, as MONAI's NormalizeIntensity gives;
            a, b = 0.0, 0.0  # dividing by ~0 blew interpolation's rounding up to 8192)
        else:
            a, b = 1.0 / std, -mean / std
    elif it.scale:
        wlo, whi = (lo, hi) if np.isfinite(lo) else (float(sample.min()), float(sample.max()))
        if whi <= wlo or not np.isfinite(lo) and _flat(sample):  # (constant, or a percentile
            # window that collapsed: the range's low end; a clip window has lo < hi, checked)
            a, b = 0.0, float(it.scale[0])
        else:
            a = (it.scale[1] - it.scale[0]) / (whi - wlo)
            b = it.scale[0] - a * wlo
    return float(lo), float(hi), float(a), float(b)
