"""The voxel work of the MONAI transforms: jobs for the engine, forward and inverse.

Private to :mod:`medproc.monai`. Every key of a sample is resampled by one plan; how a key is
sampled is its *mode* (MONAI's names) and whether it *keeps* its dtype and values (a label map:
nearest neighbour, no intensity step) or becomes an image (the spec's dtype and intensity).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..pipeline._dtypes import _astype
from ..pipeline._dtypes import _dtype_name as _dtype
from ..plan import Plan, intensity_params
from ..spec import Spec
from ..volume import Volume

#: MONAI's interpolation names (and spline orders) -> medproc's
MODES = {
    "bilinear": "linear",
    "linear": "linear",
    "trilinear": "linear",
    1: "linear",
    "nearest": "nearest",
    "nearest-exact": "nearest",
    0: "nearest",
    "bicubic": "cubic",
    "cubic": "cubic",
    3: "cubic",
}
#: medproc's interpolation -> the name recorded for MONAI (``Invertd(nearest_interp=True)``
#: rewrites it to "nearest")
MONAI_NAME = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}


def interp_of(mode, key) -> str:
    """medproc's interpolation for a MONAI ``mode`` value of ``key``."""
    m = getattr(mode, "value", mode)
    if isinstance(m, str):
        m = m.lower()
    if m not in MODES:
        raise ValueError(
            f"mode for key {key!r} must be one of 'bilinear', 'nearest', 'bicubic' (or MONAI's "
            f"spline orders 1, 0, 3; also 'linear'/'trilinear', 'nearest-exact', 'cubic'), got "
            f"{mode!r}"
        )
    return MODES[m]


def _integer(a) -> bool:
    return np.dtype(_dtype(a)).kind in "biu"


def _cast(a, dtype: str):
    return a if _dtype(a) == dtype else _astype(a, dtype)


def _graph_dtype(a) -> str:
    """The engine's output dtype that holds ``a``'s values (DALI has no bool)."""
    return "uint8" if _dtype(a) == "bool" else _dtype(a)


def _exact_as_image(a, key) -> None:
    """An integer map sampled as an image goes through float32: exact below 2^24 only."""
    if _dtype(a) in ("bool", "uint8", "int8", "int16", "uint16") or not _integer(a):
        return
    lo, hi = (int(a.min()), int(a.max())) if int(np.prod(a.shape)) else (0, 0)
    if not (-(2**24) <= lo and hi <= 2**24):
        raise ValueError(
            f"key {key!r}: label values {lo}..{hi} cannot be resampled exactly (|v| > 2^24); "
            "relabel them to smaller integers first"
        )


def resample_arrays(
    arrays: dict, plan: Plan, roles: dict, spec: Spec, device: str, device_id=None
) -> dict:
    """Resample ``arrays`` (key -> ``(i, j, k[, C])``, all on ``plan``'s input grid): one engine
    call per image key; integer label maps ride with the first when that does not change the
    graph it takes (on the CPU an image keeps the separable resize, exact to float32, when its
    labels need the warp graph because the grid leaves the input), else they get their own.

    ``roles[key] = (interp, keep)``. ``plan.intensity`` was computed from the first image key;
    the other image keys get their own statistics. Returns key -> ``(C, i, j, k)`` (numpy on
    the CPU, CUDA tensors with ``device="gpu"``), each kept key in its own dtype.
    """
    from ..pipeline import Engine, Graph, Job

    labels = [k for k in arrays if roles[k][1] and _integer(arrays[k])]
    bare = replace(plan, intensity=None)
    runs = []  # (image key, plan, Graph arguments, label keys)
    for k, a in arrays.items():
        interp, keep = roles[k]
        if k in labels:
            continue
        if keep:
            runs.append((k, bare, dict(interp=interp, dtype=_graph_dtype(a)), []))
            continue
        p = plan
        if spec.intensity.active and any(not roles[r[0]][1] for r in runs):
            p = replace(plan, intensity=intensity_params(spec, a))
        aa = spec.antialias and interp != "nearest"
        runs.append((k, p, dict(interp=interp, dtype=spec.dtype, antialias=aa), []))
    if labels:
        if runs:  # one engine call: the image keeps its graph, labels ride along (see Graph)
            runs[0][3].extend(labels)
        else:  # the first label map carries the others
            _exact_as_image(arrays[labels[0]], labels[0])
            graph = dict(interp="nearest", dtype=_graph_dtype(arrays[labels[0]]))
            runs.append((labels[0], bare, graph, labels[1:]))
    engine = Engine(device, batch_size=1, device_id=device_id)
    out = {}
    for key, p, graph, carried in runs:
        g = Graph(fill=spec.fill, labels=len(carried), channels_first=True, **graph)
        job = Job(arrays[key], p, [arrays[k] for k in carried])
        (res,) = engine.run([job], g, as_torch=device == "gpu")
        out.update(zip([key, *carried], res))
    for k, (_, keep) in roles.items():
        if keep:
            out[k] = _cast(out[k], _dtype(arrays[k]))
    return out


def covers(plan: Plan) -> bool:
    """Whether the input grid of ``plan`` lies within one voxel of its output grid (no crop cut
    it away): the inverse then repeats the border, as MONAI's inverses do; else it fills 0."""
    n = np.array(plan.in_shape, dtype=np.float64) - 1
    corners = np.array([[a, b, c, 1.0] for a in (0, n[0]) for b in (0, n[1]) for c in (0, n[2])])
    on_out = (np.linalg.inv(plan.matrix) @ corners.T)[:3]
    hi = np.array(plan.out_shape, dtype=np.float64)[:, None]
    return bool(np.all(on_out >= -1.0 - 1e-6) and np.all(on_out <= hi + 1e-6))


def invert(
    pred: Volume,
    plan: Plan,
    nearest: bool = True,
    device: str = "cpu",
    interp: str | None = None,
    device_id: int | None = None,
) -> Volume:
    """``pred`` on ``plan``'s output grid, resampled back onto the plan's input grid.

    Parameters
    ----------
    pred : Volume or MetaTensor
        Voxels ``(i, j, k[, C])`` on ``plan.out_shape`` (numpy, or a torch tensor), or a
        channel-first MetaTensor on that grid (as :func:`to_volume` reads it).
    plan : Plan
        The plan that made the grid ``pred`` lies on.
    nearest : bool
        Nearest neighbour, keeping ``pred``'s dtype (label maps); else linear, in float32.
    device : {"cpu", "gpu"}
        DALI backend.
    interp : {"linear", "cubic", "nearest"}, optional
        Overrides ``nearest``.
    device_id : int, optional
        GPU ordinal (default: the current CUDA device).

    Returns
    -------
    Volume
        On ``plan.in_affine`` and ``plan.in_shape``. Where the plan's output did not reach (a
        crop) the voxels are 0; elsewhere the border of ``pred`` is repeated.
    """
    from ..pipeline import Engine, Graph, Job

    if not isinstance(pred, Volume):  # (a MONAI user's prediction: channel-first, on the grid)
        from monai.data import MetaTensor

        from .meta import to_volume

        if not isinstance(pred, MetaTensor):
            raise TypeError(
                f"pred must be a medproc.Volume or a MONAI MetaTensor (C, i, j, k), got a "
                f"{type(pred).__name__}: wrap an array with medproc.Volume(array, affine)"
            )
        pred = to_volume(pred, affine=plan.out_affine)
    interp = interp or ("nearest" if nearest else "linear")
    if device == "cpu":
        pred = pred.numpy()
    arr = pred.array
    if tuple(arr.shape[:3]) != tuple(plan.out_shape):
        raise ValueError(
            f"the prediction is {tuple(arr.shape[:3])} but the plan's output grid is "
            f"{tuple(plan.out_shape)}: undo what changed its size after the resample first"
        )
    if interp == "nearest":
        _exact_as_image(arr, "pred")
    graph = Graph(
        interp=interp,
        fill=None if covers(plan) else 0.0,
        dtype=_graph_dtype(arr) if interp == "nearest" else "float32",
    )
    engine = Engine(device, batch_size=1, device_id=device_id)
    ((out,),) = engine.run([Job(arr, plan.inverse())], graph, as_torch=device == "gpu")
    if interp == "nearest":
        out = _cast(out, _dtype(arr))
    return Volume(out, plan.in_affine, {**pred.meta, "inverted": True})
