"""Dtypes: numpy <-> DALI, and the dtypes the engine feeds DALI in."""

import numpy as np


def to_dali(dtype):
    """DALI's type for an output dtype of :data:`medproc.spec.OUTPUT_DTYPES` (the one list)."""
    from nvidia.dali import types

    from ..spec import OUTPUT_DTYPES

    name = np.dtype(dtype).name
    if name not in OUTPUT_DTYPES:
        raise ValueError(f"output dtype {dtype} is not supported by the pipeline")
    return getattr(types, "FLOAT" if name == "float32" else name.upper())


def _dtype_name(a) -> str:
    return str(a.dtype).replace("torch.", "")


#: the dtypes both DALI resamplers (warp_affine, resize) take, on the CPU and the GPU
_DALI_DTYPES = ("uint8", "int16", "float32")


def _is_torch(a) -> bool:
    return hasattr(a, "to") and not isinstance(a, np.ndarray)


def _astype(a, dtype: str):
    if _is_torch(a):
        import torch

        return a.to(getattr(torch, dtype))
    return a.astype(dtype)


def _feed_dtype(a, label: bool, fill=None) -> str:
    """The dtype ``a`` is fed to DALI in: its own when DALI takes it; otherwise, exactly,
    int16 for integer labels that fit, else float32; integers beyond +-2^24 (where float32
    is no longer exact) are refused. An image is fed as float32 when its own type cannot hold
    the ``fill`` value exactly (DALI casts the fill to the input's type: NaN, 0.5 or 4e4 would
    pad int16 with 0, 1, 32767). The one rule of the engine and of the DALI Proxy route."""
    got = _feed_dtype_of(a, label)
    return got if label or _holds(got, fill) else "float32"


def _holds(dtype: str, value) -> bool:
    """Whether ``dtype`` holds ``value`` (a fill value, None: none) exactly."""
    if value is None or "int" not in dtype:
        return True
    import math

    info = np.iinfo(dtype)
    return math.isfinite(value) and value == int(value) and info.min <= value <= info.max


def _feed_dtype_of(a, label: bool) -> str:
    name = _dtype_name(a)
    if label and "float" in name:  # label maps stored as floats (float32, float64): whole
        return _whole_float_label(a, name)  # numbers, fed as float32
    if name in _DALI_DTYPES:
        return name
    if name == "bool":
        return "uint8"
    if label and "complex" in name:
        raise ValueError(f"label maps must hold integers, got {name}")
    if not label:
        from .._float32 import beyond_float32

        why = beyond_float32(a)
        if why:
            raise ValueError(f"image {why}")
    if "int" not in name or (not label and name in ("int8", "uint16")):
        return "float32"  # (these fit float32 exactly)
    n = a.numel() if _is_torch(a) else a.size
    if _is_torch(a) and a.device.type == "cpu":  # (torch has no min/max of uint16/32/64)
        a = a.numpy()
    lo, hi = (int(a.min()), int(a.max())) if n else (0, 0)
    if label and -(2**15) <= lo and hi < 2**15:
        return "int16"
    if -(2**24) <= lo and hi <= 2**24:
        return "float32"
    from ..errors import MedprocError

    what = "label values" if label else f"{name} image values"
    raise MedprocError(
        f"{what} {lo}..{hi} cannot be resampled exactly: DALI computes in float32, exact for "
        "|v| <= 2^24 only; rescale them, or cast to float32 yourself if rounding is acceptable"
    )


def _whole_float_label(a, name: str) -> str:
    """float32 for a float label map whose values are whole numbers within +-2^24 (exact in
    float32); an error naming the first value that is not."""
    if _is_torch(a):
        import torch

        bad = ~torch.isfinite(a) | (a != torch.round(a)) | (a.abs() > 2**24)
        first = a[bad][:1].tolist()
    else:
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(a) | (a != np.round(a)) | (np.abs(a) > 2**24)
        first = a[bad][:1].tolist()
    if first:
        raise ValueError(
            f"label maps must hold whole numbers (within +-2^24), got the {name} value "
            f"{first[0]}: is this a label map?"
        )
    return "float32"
