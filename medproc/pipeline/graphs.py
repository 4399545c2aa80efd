"""The DALI graphs the engine runs, and how plans become their per-sample arguments.

Private to :mod:`medproc.pipeline`: callers go through :class:`~medproc.pipeline.Engine`.

Memory layout: medproc arrays are indexed ``(i, j, k[, C])`` with i fastest in memory (NIfTI and
DICOM files are stored that way), so the same bytes seen C-ordered are ``(k, j, i[, C])`` =
DALI's ``DHWC``, and DALI's warp coordinates ``(x, y, z) = (W, H, D)`` are exactly ``(i, j, k)``.
Feeding is a transpose (a view); no axis order is translated anywhere else.

Two resampling graphs:

- ``warp``: ``fn.warp_affine`` with each sample's 3x4 matrix and output size (any plan:
  oblique, orientation + spacing + crop in one matrix). Linear or nearest.
- ``resize``: ``fn.resize`` with a per-sample ROI (axis-aligned plans: respacing with flips and
  crops, the common case). Separable, so much faster on the CPU; cubic and antialiasing.

Images are sampled in float32, then ``a * clamp(x, lo, hi) + b`` (the plan's intensity step)
and a cast; labels use nearest neighbour, no antialiasing, and keep their dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan import Plan

__all__ = ["Graph", "dali_matrix", "resize_roi", "misses_input", "build_resample", "to_dhwc"]

MODES = ("auto", "warp", "resize")
INTERPS = ("linear", "cubic", "nearest")


@dataclass(frozen=True)
class Graph:
    """What a resampling pipeline computes (the engine builds one pipeline per distinct Graph).

    Parameters
    ----------
    interp : {"linear", "cubic", "nearest"}
        Image interpolation (cubic needs axis-aligned plans: DALI's warp has no cubic).
    antialias : bool
        Low-pass images when downsampling (axis-aligned plans).
    dtype : str
        Output dtype of images.
    fill : float, optional
        Value outside the input grid; None repeats the border voxel.
    labels : int
        Label maps per sample, resampled with nearest neighbour (dtype kept) beside the image.
    channels_first : bool
        Outputs ``(C, i, j, k)`` contiguous (for stacking into MONAI batches) instead of
        ``(i, j, k[, C])``.
    mode : {"auto", "warp", "resize"}
        ``auto``: resize for axis-aligned plans on the CPU or for cubic/antialias, else warp.
    """

    interp: str = "linear"
    antialias: bool = False
    dtype: str = "float32"
    fill: float | None = None
    labels: int = 0
    channels_first: bool = False
    mode: str = "auto"

    def __post_init__(self):
        if self.interp not in INTERPS:
            raise ValueError(f"interp must be one of {INTERPS}, got {self.interp!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        object.__setattr__(self, "dtype", str(np.dtype(self.dtype)))
        object.__setattr__(self, "fill", None if self.fill is None else float(self.fill))

    @classmethod
    def from_spec(cls, spec, labels: int = 0, **kw) -> Graph:
        """The graph that executes plans made from ``spec`` (a :class:`~medproc.Spec`)."""
        return cls(
            interp=spec.interp,
            antialias=spec.antialias,
            dtype=spec.dtype,
            fill=spec.fill,
            labels=labels,
            **kw,
        )

    @property
    def needs_nn(self) -> bool:
        """Whether anything is sampled with nearest neighbour (labels, or interp="nearest")."""
        return bool(self.labels) or self.interp == "nearest"

    def mode_for(self, plans, device: str) -> str:
        """Which graph executes this batch of plans: ``"warp"``, ``"resize"`` (see the module
        doc) or ``"mixed"`` (the image resized, its labels warped)."""
        aligned = all(p.axis_aligned for p in plans)
        if self.mode == "warp":
            if self.interp == "cubic" or self.antialias:
                raise ValueError("mode='warp' has no cubic interpolation or antialiasing")
            return "warp"
        if self.mode == "resize" and not aligned:
            raise ValueError("mode='resize' needs axis-aligned plans")
        if self.interp == "cubic" and not aligned:
            raise ValueError(
                "interp='cubic' needs axis-aligned plans (respacing, flips, crops); this batch "
                "has an oblique or permuting plan and DALI's warp_affine has no cubic: use "
                "interp='linear'"
            )
        if self.antialias and not aligned:
            raise ValueError("antialias needs axis-aligned plans; use antialias=False here")
        # measured (docs/benchmarks.md): warp beats resize on the GPU; on the CPU the separable
        # resize is several times faster. Cubic and antialiasing exist only in resize.
        resize = self.mode == "resize" or (
            aligned
            and self.fill is None
            and (device == "cpu" or self.interp == "cubic" or self.antialias)
        )
        if not resize:
            return "warp"
        # DALI 2.4's resize kills the process (SIGSEGV; on the GPU too, measured) when a
        # sample's region lies wholly beyond its input along an axis (found as a slab of a
        # volume centre-cropped far past itself; slabs.split no longer makes such slabs): warp
        # repeats the border as resize would, but has no cubic or antialiasing
        if any(misses_input(p) for p in plans):
            from ..errors import UsageError

            if self.mode == "resize" or self.interp == "cubic" or self.antialias:
                why = "mode='resize'" if self.mode == "resize" else "cubic or antialiasing"
                raise UsageError(
                    "this output grid lies wholly outside its input along an axis, where only "
                    f"DALI's warp graph can sample it, and warp cannot do {why}: use "
                    "interp='linear', antialias=False and mode='auto' for it"
                )
            return "warp"
        if self.mode == "resize":
            return "resize"
        # DALI's nearest-neighbour resize (labels, interp="nearest") reads past the input where
        # the sampled region leaves it (garbage label values): there nearest neighbour takes
        # the warp graph, while an interpolated image keeps the (more exact) resize: "mixed"
        outside = max((_outside(p) for p in plans), default=0.0)
        if outside > 1e-4:
            if self.interp == "nearest":
                return "warp"
            if self.labels:
                return "mixed"
        return "resize"


def _region(plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, n) per axis (k, j, i): the region an axis-aligned plan samples, in input
    voxel coordinates, and the input's size."""
    start, end = resize_roi(plan)
    n = np.array(plan.in_shape[::-1], dtype=np.float64)
    return np.minimum(start, end), np.maximum(start, end), n


def _outside(plan: Plan) -> float:
    """How far (input voxels) an axis-aligned plan samples beyond its input grid (0: inside)."""
    lo, hi, n = _region(plan)
    return float(max(0.0, -lo.min(), (hi - n).max()))


def misses_input(plan: Plan) -> bool:
    """Whether an axis-aligned plan samples a region lying wholly beyond its input along some
    axis: DALI 2.4's resize crashes on one (measured on 4 input slices: on the CPU region
    (-2, -1) or (6, 5) crashed, (-1, -0.01) and (4, 8) did not; on the GPU (-30, -20) crashed,
    (-2, -1) did not; this test is stricter than the crashes)."""
    lo, hi, n = _region(plan)
    return bool(((hi <= 0) | (lo >= n)).any())


def to_dhwc(a, contiguous: bool = True):
    """An ``(i, j, k[, C])`` array or tensor as DALI's DHWC: the transposed view, made
    contiguous (no copy when i is fastest in memory, as readers return it). ``contiguous=False``
    leaves host arrays a view (for a caller that copies them anyway); tensors are always made
    contiguous (CUDA tensors are fed as they are)."""
    if a.ndim == 3:
        a = a[..., None]
    if hasattr(a, "permute"):
        return a.permute(2, 1, 0, 3).contiguous()
    a = np.asarray(a).transpose(2, 1, 0, 3)
    return np.ascontiguousarray(a) if contiguous else a


def dali_matrix(plan: Plan) -> np.ndarray:
    """The plan's index map in DALI's warp convention: (x, y, z) = (i, j, k), voxel centres at
    +0.5, destination -> source, 3x4 float32."""
    c = np.eye(4)
    c[:3, 3] = 0.5
    m = c @ plan.matrix @ np.linalg.inv(c)
    return np.ascontiguousarray(m[:3], dtype=np.float32)


def dali_size(plan: Plan) -> np.ndarray:
    """The output size in DALI's (D, H, W) = (k, j, i) order."""
    return np.array(plan.out_shape[::-1], np.float32)


def resize_roi(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(roi_start, roi_end) in input voxel coordinates, (D, H, W) = (k, j, i) order, for
    ``fn.resize``: output index o samples input index ``m*o + b``; a flipped axis has
    roi_end < roi_start."""
    m = np.diag(plan.matrix[:3, :3])
    b = plan.matrix[:3, 3]
    start = b + 0.5 - 0.5 * m
    end = start + m * np.array(plan.out_shape)
    return start[::-1].astype(np.float32), end[::-1].astype(np.float32)


def _interp(name: str):
    from nvidia.dali import types

    return {"linear": types.INTERP_LINEAR, "nearest": types.INTERP_NN, "cubic": types.INTERP_CUBIC}[
        name
    ]


def build_resample(
    graph: Graph,
    mode: str,
    intensity: bool,
    device: str,
    batch_size: int,
    num_threads: int,
    device_id: int | None,
    host_feed: bool = False,
    prefetch: int = 1,
):
    """Build the DALI pipeline for ``graph`` in ``mode``. Inputs: ``img`` (and ``lab0``...)
    DHWC, ``size`` and ``mat`` or ``roi_start``/``roi_end``, ``inten`` when ``intensity``."""
    from nvidia.dali import fn, math, pipeline_def, types

    from ._dtypes import to_dali

    feed_dev = "gpu" if device == "gpu" and not host_feed else "cpu"
    out_type = to_dali(graph.dtype)
    # DALI's CPU backend reads the fed volumes in place (the runner keeps them alive until
    # their batch is collected): a copy of each volume less per run
    in_place = device == "cpu"

    @pipeline_def(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id if device == "gpu" else None,
        exec_dynamic=True,
        prefetch_queue_depth=prefetch,
    )
    def pipe():
        ins = [fn.external_source(name="img", device=feed_dev, layout="DHWC", no_copy=in_place)]
        ins += [
            fn.external_source(name=f"lab{n}", device=feed_dev, layout="DHWC", no_copy=in_place)
            for n in range(graph.labels)
        ]
        if device == "gpu" and feed_dev == "cpu":
            ins = [x.gpu() for x in ins]
        img, labs = ins[0], ins[1:]
        size = fn.external_source(name="size", device="cpu", dtype=types.FLOAT)
        nn = graph.needs_nn
        if mode == "mixed":  # the image through resize, its labels through warp (NN)
            r0 = fn.external_source(name="roi_start", device="cpu", dtype=types.FLOAT)
            r1 = fn.external_source(name="roi_end", device="cpu", dtype=types.FLOAT)
            mat_nn = fn.external_source(name="mat_nn", device="cpu", dtype=types.FLOAT)
            kw = {} if graph.fill is None else {"fill_value": graph.fill}
            x = fn.resize(
                img,
                size=size,
                roi_start=r0,
                roi_end=r1,
                roi_relative=False,
                interp_type=_interp(graph.interp),
                antialias=graph.antialias,
                dtype=types.FLOAT,
            )
            labs = [
                fn.warp_affine(lb, matrix=mat_nn, size=size, interp_type=types.INTERP_NN, **kw)
                for lb in labs
            ]
        elif mode == "warp":
            mat = fn.external_source(name="mat", device="cpu", dtype=types.FLOAT)
            mat_nn = (
                fn.external_source(name="mat_nn", device="cpu", dtype=types.FLOAT) if nn else None
            )
            kw = {} if graph.fill is None else {"fill_value": graph.fill}
            x = fn.warp_affine(
                img,
                matrix=mat_nn if graph.interp == "nearest" else mat,
                size=size,
                interp_type=_interp(graph.interp),
                dtype=types.FLOAT,
                **kw,
            )
            labs = [
                fn.warp_affine(lb, matrix=mat_nn, size=size, interp_type=types.INTERP_NN, **kw)
                for lb in labs
            ]
        else:  # resize clamps at the border: plans with a fill value take the warp graph
            r0 = fn.external_source(name="roi_start", device="cpu", dtype=types.FLOAT)
            r1 = fn.external_source(name="roi_end", device="cpu", dtype=types.FLOAT)
            if nn:
                n0 = fn.external_source(name="roi_start_nn", device="cpu", dtype=types.FLOAT)
                n1 = fn.external_source(name="roi_end_nn", device="cpu", dtype=types.FLOAT)
            x = fn.resize(
                img,
                size=size,
                roi_start=n0 if graph.interp == "nearest" else r0,
                roi_end=n1 if graph.interp == "nearest" else r1,
                roi_relative=False,
                interp_type=_interp(graph.interp),
                antialias=graph.antialias,
                dtype=types.FLOAT,
            )
            labs = [
                fn.resize(
                    lb,
                    size=size,
                    roi_start=n0,
                    roi_end=n1,
                    roi_relative=False,
                    interp_type=types.INTERP_NN,
                    antialias=False,
                )
                for lb in labs
            ]
        if intensity:
            inten = fn.external_source(name="inten", device="cpu", dtype=types.FLOAT)
            lo, hi, a, b = inten[0], inten[1], inten[2], inten[3]
            if device == "gpu":
                lo, hi, a, b = lo.gpu(), hi.gpu(), a.gpu(), b.gpu()
            x = math.clamp(x, lo, hi) * a + b
        if out_type != types.FLOAT:
            x = fn.cast(x, dtype=out_type)
        outs = [x, *labs]
        if graph.channels_first:  # DHWC = (k, j, i, C) -> (C, i, j, k)
            outs = [fn.transpose(o, perm=[3, 2, 1, 0]) for o in outs]
        return tuple(outs)

    p = pipe()
    p.build()
    return p


#: nearest-neighbour sampling is nudged by this many voxels towards +index, so that a sample
#: exactly half-way between two voxels takes the upper one, as ITK rounds (half up), whatever
#: float32 rounding DALI's CPU or GPU arithmetic does (1e-3 voxel: far above float32's error at
#: indices up to ~4000, far below anything visible)
NN_TIE = 1e-3


def plan_inputs(plans, mode: str, intensity: bool, graph: Graph = Graph()) -> dict:
    """The per-sample argument inputs of a batch of plans (fed beside the voxels): the sampling
    of interpolated images (``mat`` or ``roi_start``/``roi_end``) and of nearest-neighbour ones
    (``mat_nn`` or ``roi_*_nn``: ties broken half up, see :data:`NN_TIE`), as the graph uses them."""
    f32 = np.float32
    feed = {"size": [dali_size(p) for p in plans]}
    smooth = graph.interp != "nearest"
    if mode in ("warp", "mixed"):
        mats = [dali_matrix(p) for p in plans]
        if smooth and mode == "warp":
            feed["mat"] = mats
        if graph.needs_nn:
            feed["mat_nn"] = [m + np.array([0, 0, 0, NN_TIE], f32) for m in mats]
    if mode in ("resize", "mixed"):
        rois = [resize_roi(p) for p in plans]
        if smooth:
            feed["roi_start"] = [r[0] for r in rois]
            feed["roi_end"] = [r[1] for r in rois]
        if graph.needs_nn and mode == "resize":
            feed["roi_start_nn"] = [r[0] + f32(NN_TIE) for r in rois]
            feed["roi_end_nn"] = [r[1] + f32(NN_TIE) for r in rois]
    if intensity:
        feed["inten"] = [
            np.array(p.intensity if p.intensity else (-np.inf, np.inf, 1.0, 0.0), f32)
            for p in plans
        ]
    return feed
