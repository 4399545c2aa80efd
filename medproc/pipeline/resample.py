"""Execute resampling plans in a DALI pipeline, batched, on the GPU or DALI's CPU backend.

Two graphs, chosen per batch from the plans:

- ``warp``: ``fn.warp_affine`` with each sample's 3x4 matrix and output size (any plan:
  oblique, orientation + spacing + crop in one matrix). Linear or nearest.
- ``resize``: ``fn.resize`` with a per-sample ROI (axis-aligned plans: respacing with flips and
  crops, the common case). Separable, so much faster on the CPU; supports cubic and
  antialiasing.

Both are fed by ``fn.external_source``. Images are sampled in float32, then
``a * clamp(x, lo, hi) + b`` (the plan's intensity step) and a cast; labels use nearest
neighbour, no antialiasing, and keep their dtype. On the GPU, host arrays are staged in pinned
memory and copied on a side stream while DALI works on the previous batch.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ..plan import Plan

__all__ = ["Resampler", "dali_available", "gpu_available", "dali_matrix", "resize_roi"]

_INSTALL = "pip install nvidia-dali-cuda120"


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    if not dali_available():
        return False
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return GetCUDADeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


def dali_matrix(plan: Plan) -> np.ndarray:
    """The plan's index map in DALI's warp convention: (x, y, z) = (W, H, D), pixel centres at
    +0.5, destination -> source, 3x4 float32."""
    perm = np.eye(4)[[2, 1, 0, 3]]
    c = np.eye(4)
    c[:3, 3] = 0.5
    m = perm @ c @ plan.matrix @ np.linalg.inv(c) @ perm.T
    return np.ascontiguousarray(m[:3], dtype=np.float32)


def resize_roi(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(roi_start, roi_end) in input pixel coordinates (D, H, W) for ``fn.resize``: output
    index o samples input index ``m*o + b``; a flipped axis has roi_end < roi_start."""
    m = np.diag(plan.matrix[:3, :3])
    b = plan.matrix[:3, 3]
    start = b + 0.5 - 0.5 * m
    end = start + m * np.array(plan.out_shape)
    return start.astype(np.float32), end.astype(np.float32)


def _interp(name: str):
    from nvidia.dali import types

    return {"linear": types.INTERP_LINEAR, "nearest": types.INTERP_NN, "cubic": types.INTERP_CUBIC}[name]


class Resampler:
    """A reusable DALI resampling pipeline.

    Parameters
    ----------
    device : {"cpu", "gpu"}
        DALI backend. ``"gpu"`` needs an NVIDIA GPU.
    batch_size : int
        Largest batch fed at once.
    interp : {"linear", "cubic", "nearest"}
        Image interpolation (cubic needs axis-aligned plans: DALI's warp has no cubic).
    antialias : bool
        Antialias images when downsampling (axis-aligned plans).
    dtype : str
        Output dtype of images.
    fill : float, optional
        Value outside the input; None repeats the border.
    with_label : bool
        Also resample a label map per sample (nearest neighbour, dtype kept).
    num_threads : int, optional
        DALI CPU threads (default: all cores).
    mode : {"auto", "warp", "resize"}
        Which graph executes the plans (auto: resize for axis-aligned plans on the CPU or for
        cubic/antialias, warp otherwise).
    device_id : int
        GPU ordinal.
    """

    def __init__(self, device="cpu", batch_size=4, interp="linear", antialias=False,
                 dtype="float32", fill=None, with_label=False, num_threads=None, device_id=0,
                 host_feed=False, channels_first=False, prefetch=1, mode="auto"):
        if not dali_available():
            raise ImportError(f"medproc's pipelines need NVIDIA DALI: {_INSTALL}")
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
        if device == "gpu" and not gpu_available():
            raise RuntimeError("device='gpu' but DALI sees no NVIDIA GPU here; use device='cpu'")
        self.device = device
        self.batch_size = int(batch_size)
        self.interp = interp
        self.antialias = bool(antialias)
        self.dtype = np.dtype(dtype)
        self.fill = fill
        self.with_label = with_label
        self.num_threads = num_threads or int(os.environ.get("MEDPROC_DALI_THREADS", 0)) or min(os.cpu_count() or 1, 16)
        self.device_id = device_id
        #: external sources take host arrays even on the GPU (DALI Proxy feeds from workers)
        self.host_feed = host_feed
        #: outputs (C, D, H, W) instead of (D, H, W, C)
        self.channels_first = channels_first
        self.prefetch = prefetch
        if mode not in ("auto", "warp", "resize"):
            raise ValueError(f"mode must be 'auto', 'warp' or 'resize', got {mode!r}")
        #: "auto" picks per batch (see mode_for); "warp" forces the general graph
        self.mode = mode
        self._pipes: dict[str, object] = {}
        self._stream = None
        self._pinned: list[list] = [[], [], []]  # a ring of staging buffers, one set per batch
        self._ring = 0

    # graph -------------------------------------------------------------------------------
    def _build(self, mode: str, intensity: bool):
        from nvidia.dali import fn, math, pipeline_def, types

        from . import _dtypes

        feed_dev = "gpu" if self.device == "gpu" and not self.host_feed else "cpu"
        out_type = _dtypes.to_dali(self.dtype)

        @pipeline_def(batch_size=self.batch_size, num_threads=self.num_threads,
                      device_id=self.device_id if self.device == "gpu" else None,
                      exec_dynamic=True, prefetch_queue_depth=self.prefetch)
        def graph():
            img = fn.external_source(name="img", device=feed_dev, layout="DHWC")
            if self.device == "gpu" and feed_dev == "cpu":
                img = img.gpu()
            size = fn.external_source(name="size", device="cpu", dtype=types.FLOAT)
            labs = []
            if self.with_label:
                labs = [fn.external_source(name="lab", device=feed_dev, layout="DHWC")]
                if self.device == "gpu" and feed_dev == "cpu":
                    labs = [labs[0].gpu()]
            if mode == "warp":
                mat = fn.external_source(name="mat", device="cpu", dtype=types.FLOAT)
                kw = {} if self.fill is None else {"fill_value": float(self.fill)}
                x = fn.warp_affine(img, matrix=mat, size=size, interp_type=_interp(self.interp),
                                   dtype=types.FLOAT, **kw)
                labs = [fn.warp_affine(lb, matrix=mat, size=size, interp_type=types.INTERP_NN, **kw)
                        for lb in labs]
            else:
                r0 = fn.external_source(name="roi_start", device="cpu", dtype=types.FLOAT)
                r1 = fn.external_source(name="roi_end", device="cpu", dtype=types.FLOAT)
                x = fn.resize(img, size=size, roi_start=r0, roi_end=r1,
                              roi_relative=False, interp_type=_interp(self.interp),
                              antialias=self.antialias, dtype=types.FLOAT)
                labs = [fn.resize(lb, size=size, roi_start=r0, roi_end=r1, roi_relative=False,
                                  interp_type=types.INTERP_NN, antialias=False) for lb in labs]
                if self.fill is not None:
                    pass  # resize clamps at the border; plans with fill use the warp graph
            if intensity:
                inten = fn.external_source(name="inten", device="cpu", dtype=types.FLOAT)
                lo, hi, a, b = inten[0], inten[1], inten[2], inten[3]
                if self.device == "gpu":
                    lo, hi, a, b = lo.gpu(), hi.gpu(), a.gpu(), b.gpu()
                x = math.clamp(x, lo, hi) * a + b
            if out_type != types.FLOAT:
                x = fn.cast(x, dtype=out_type)
            if self.channels_first:
                x = fn.transpose(x, perm=[3, 0, 1, 2])
                labs = [fn.transpose(lb, perm=[3, 0, 1, 2]) for lb in labs]
            return (x, *labs)

        pipe = graph()
        pipe.build()
        return pipe

    def pipeline(self, mode: str = "warp", intensity: bool = False):
        """The built DALI pipeline of ``mode`` (for DALI Proxy's server, which feeds it)."""
        return self._pipe(mode, intensity)

    def _pipe(self, mode: str, intensity: bool):
        key = (mode, intensity)
        if key not in self._pipes:
            self._pipes[key] = self._build(mode, intensity)
        return self._pipes[key]

    def mode_for(self, plans: Sequence[Plan]) -> str:
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
        # measured on the H200 (docs/benchmarks.md): warp beats resize on the GPU; on the CPU the
        # separable resize is several times faster. Cubic and antialiasing exist only in resize.
        if aligned and self.fill is None and (self.device == "cpu" or self.interp == "cubic" or self.antialias):
            return "resize"
        return "warp"

    # feeding -----------------------------------------------------------------------------
    def _to_device(self, arrays: list[np.ndarray], ring: list | None = None, offset: int = 0) -> list:
        """Host arrays -> CUDA tensors: staged in pinned memory, copied on a side stream."""
        import torch

        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device_id)
        # staging buffers are reused every third batch: by then the copy that read them is done
        # (run_batches waits for batch i's outputs before it feeds batch i + 2)
        if ring is None:
            ring = self._next_ring()
        out = []
        with torch.cuda.stream(self._stream):
            for n, a in enumerate(arrays, offset):
                t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
                if t.device.type == "cpu" and not t.is_pinned():
                    nbytes = t.numel() * t.element_size()
                    if n >= len(ring) or ring[n].numel() < nbytes:
                        buf = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, pin_memory=True)
                        ring[n:n + 1] = [buf]
                    staged = ring[n][:nbytes].view(t.dtype).view(t.shape)
                    staged.copy_(t)
                    t = staged
                out.append(t.to(f"cuda:{self.device_id}", non_blocking=True))
        return out

    def _next_ring(self) -> list:
        ring = self._pinned[self._ring]
        self._ring = (self._ring + 1) % len(self._pinned)
        return ring

    def _feed(self, pipe, mode, intensity, images, plans, labels):
        f32 = np.float32
        if self.device == "gpu":
            ring = self._next_ring()  # one staging set per batch, images then labels
            dev_imgs = self._to_device(images, ring)
            imgs = [t.unsqueeze(-1) if t.dim() == 3 else t for t in dev_imgs]
            pipe.feed_input("img", imgs, layout="DHWC", cuda_stream=self._stream.cuda_stream)
            if self.with_label:
                labs = [t.unsqueeze(-1) for t in self._to_device(labels, ring, len(images))]
                pipe.feed_input("lab", labs, layout="DHWC", cuda_stream=self._stream.cuda_stream)
        else:
            pipe.feed_input("img", [np.asarray(a)[..., None] if np.ndim(a) == 3 else np.asarray(a)
                                    for a in images], layout="DHWC")
            if self.with_label:
                pipe.feed_input("lab", [np.asarray(a)[..., None] for a in labels], layout="DHWC")
        if intensity:
            inten = [np.array(p.intensity if p.intensity else (-np.inf, np.inf, 1.0, 0.0), f32) for p in plans]
            pipe.feed_input("inten", inten)
        pipe.feed_input("size", [np.array(p.out_shape, f32) for p in plans])
        if mode == "warp":
            pipe.feed_input("mat", [dali_matrix(p) for p in plans])
        else:
            rois = [resize_roi(p) for p in plans]
            pipe.feed_input("roi_start", [r[0] for r in rois])
            pipe.feed_input("roi_end", [r[1] for r in rois])

    # running -----------------------------------------------------------------------------
    def run(self, images, plans, labels=None, as_torch: bool = False):
        """Resample one batch. Returns a list per sample: array, or (array, label)."""
        return next(self.run_batches([(images, plans, labels)], as_torch=as_torch))

    def run_batches(self, batches: Iterable, as_torch: bool = False) -> Iterator[list]:
        """Resample a stream of ``(images, plans, labels)`` batches, yielding per-sample outputs.

        The next batch is fed (its host->device copy started) while DALI runs the current one.
        With ``as_torch`` GPU outputs stay on the GPU as torch tensors; otherwise numpy arrays.
        """
        it = iter(batches)
        nxt = next(it, None)
        if nxt is None:
            return
        pipe, n = self._start(*nxt)
        while True:
            after = next(it, None)
            outs = pipe.outputs()  # waits for the batch in flight
            result = self._collect(outs, n, as_torch)
            if after is not None:
                pipe, n = self._start(*after)
            yield result
            if after is None:
                return

    def _start(self, images, plans, labels):
        images = list(images)
        plans = list(plans)
        if len(images) != len(plans) or not 0 < len(images) <= self.batch_size:
            raise ValueError(f"a batch needs 1..{self.batch_size} images with one plan each, got "
                             f"{len(images)} images and {len(plans)} plans")
        if self.with_label and (labels is None or len(labels) != len(images)):
            raise ValueError("this Resampler was built with_label=True: pass one label per image")
        for img, p in zip(images, plans):
            if tuple(img.shape[:3]) != tuple(p.in_shape):
                raise ValueError(f"image shape {tuple(img.shape)} does not match its plan's input "
                                 f"shape {p.in_shape}")
        mode = self.mode_for(plans)
        intensity = any(p.intensity is not None for p in plans)
        pipe = self._pipe(mode, intensity)
        self._feed(pipe, mode, intensity, images, plans, labels)
        pipe.schedule_run()
        return pipe, len(images)

    def _collect(self, outs, n, as_torch):
        res = []
        for i in range(n):
            arrs = [self._out(o[i], as_torch) for o in outs]
            if not self.channels_first:
                arrs = [a[..., 0] if a.shape[-1] == 1 else a for a in arrs]
            res.append(arrs[0] if len(arrs) == 1 else tuple(arrs))
        return res

    def _out(self, t, as_torch):
        if self.device == "cpu":
            a = np.array(t)
            if as_torch:
                import torch

                return torch.from_numpy(a)
            return a
        import torch
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        dst = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=f"cuda:{self.device_id}")
        feed_ndarray(t, dst, cuda_stream=torch.cuda.current_stream(self.device_id))
        return dst if as_torch else dst.cpu().numpy()
