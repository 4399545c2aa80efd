"""The options that decide what a case's outputs hold (the spec, the format, the NaN policy),
as recorded in each manifest row and sidecar, and what differs between two such records, in
the words of ``medproc convert``'s options; and the check of those options before any work."""

from __future__ import annotations

__all__ = ["check_options", "output_options", "options_diff"]


def output_options(spec, fmt: str, nan: str) -> dict:
    """The options that decide what a case's outputs hold: the spec, the format and the NaN
    policy (not the device, the workers or the naming template), as plain JSON values."""
    import dataclasses
    import json

    return json.loads(
        json.dumps({"spec": dataclasses.asdict(spec), "format": fmt, "nan": nan}, sort_keys=True)
    )


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}".removeprefix("spec.")] = v
    return out


def _show(v) -> str:
    if isinstance(v, list):
        return " x ".join(f"{x:.15g}" if isinstance(x, float) else str(x) for x in v)
    return "none" if v is None else str(v)


def options_diff(old: dict, new: dict) -> list[str]:
    """What differs between two :func:`output_options`, in words, each named as its option
    of ``medproc convert`` (and its argument of Spec or Intensity).

    >>> from medproc.spec import Spec
    >>> options_diff(output_options(Spec(spacing=2), "nii.gz", "error"),
    ...              output_options(Spec(spacing=1.5, orientation="RAS"), "nii.gz", "error"))
    ['orientation: none before, RAS now', 'spacing: 2 x 2 x 2 before, 1.5 x 1.5 x 1.5 now']
    """
    a, b = _flat(old), _flat(new)
    return [
        f"{k.removeprefix('intensity.')}: {_show(a.get(k))} before, {_show(b.get(k))} now"
        for k in list(b) + [k for k in a if k not in b]
        if a.get(k) != b.get(k) and not (_nan(a.get(k)) and _nan(b.get(k)))
    ]


def _nan(v) -> bool:
    """Whether ``v`` is NaN (a NaN fill is the same option on both sides)."""
    return isinstance(v, float) and v != v


def check_options(fmt: str, nan: str, workers, device: str, name: str, spec) -> None:
    """Raise :class:`UsageError` for an option ``convert`` cannot use (before any work)."""
    import numpy as np

    from .cases import check_template
    from .errors import UsageError, check_device
    from .io import FORMATS
    from .io.writers import holds_float16
    from .spec import check_args

    check_args(spec, "convert", **({} if workers == "auto" else {"workers (or 'auto')": workers}))
    if fmt not in FORMATS:
        raise UsageError(f"format must be one of {FORMATS}, got {fmt!r}")
    if str(spec.dtype) == "float16" and not holds_float16(f"x.{fmt}"):
        raise UsageError(f"--dtype float16: {fmt} files hold no float16 voxels; use --format npy")
    if nan not in ("error", "zero", "keep"):
        raise UsageError(f"nan must be 'error', 'zero' or 'keep', got {nan!r}")
    if (
        nan == "keep"
        and spec.dtype is not None
        and not np.issubdtype(np.dtype(spec.dtype), np.floating)
    ):
        raise UsageError(
            f"--nan keep keeps NaN voxels, which --dtype {spec.dtype} cannot hold (they would "
            "become 0): use a float --dtype, or --nan zero to say so"
        )
    device = check_device(device)
    check_template(name)
    if device == "gpu":
        from .pipeline.cache import gpu_visible

        if not gpu_visible():  # without importing DALI: the workers are forked after this
            raise UsageError(
                "--device gpu: DALI sees no NVIDIA GPU here (no driver, no device, or a CPU-only "
                "DALI build); use --device cpu, or see docs/gpu.md"
            )
