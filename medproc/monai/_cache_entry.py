"""PatchLoader's cache entries: one case resampled to the spec, in compact dtypes, with what
patch sampling needs (:mod:`._cache_disk` writes it to and reads it from ``cache_dir``).

Private to :mod:`medproc.monai` (:mod:`._patch_cache` builds the entries). An :class:`Entry`
holds

- the image resampled to the spec's grid before the spec's intensity line (clipped to its
  window), in int16 (or uint8) when the source holds integers that fit, else float32; the label
  in uint8 (int16 when it needs);
- the flat indices (i fastest) of the foreground (label > 0) and a bitmap of the background
  (label == 0, and image > ``image_threshold`` when given; 1 bit per voxel, or an index list
  when the background is under 1/64 of the volume) to draw negative centres from by rejection;
- host ``(i, j, k)`` arrays (memory-mapped from ``cache_dir``), or ``(k, j, i)`` contiguous
  torch tensors (on the GPU: patch boxes are sliced there).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..plan import make_plan, say_notes

__all__ = ["Entry", "VERSION", "SPARSE"]

VERSION = "patch-cache-3"  # (3: entries carry samples of their bytes)
#: background sparser than this share of the volume is stored as an index list, not a bitmap
SPARSE = 1 / 64


@dataclass
class Entry:
    """One case of the cache (see the module doc)."""

    case: dict
    shape: tuple[int, int, int]
    affine: np.ndarray
    intensity: tuple[float, float, float, float] | None
    image: object  # host: (i, j, k) numpy; device: (k, j, i) contiguous torch tensor (CUDA)
    label: object | None
    fg: np.ndarray  # flat (i fastest) indices of label > 0
    bg_bits: np.ndarray | None  # packed background bitmap (little bit order), or
    bg_index: np.ndarray | None  # the background's flat indices when it is sparse
    n_bg: int

    @property
    def on_device(self) -> bool:
        """Whether the voxels are torch tensors ``(k, j, i)`` (the GPU route), not host arrays."""
        return hasattr(self.image, "element_size")

    @property
    def on_gpu(self) -> bool:
        return self.on_device and self.image.is_cuda

    @property
    def nbytes(self) -> int:
        n = int(np.prod(self.shape))
        return n * (
            _itemsize(self.image) + (_itemsize(self.label) if self.label is not None else 0)
        )

    def voxel(self, flat: int) -> np.ndarray:
        """(i, j, k) of a flat index."""
        return np.array(np.unravel_index(int(flat), self.shape, order="F"))

    def fg_voxel(self, rng: np.random.Generator) -> int:
        return int(self.fg[rng.integers(self.fg.size)])

    def bg_voxel(self, rng: np.random.Generator) -> int:
        """A background voxel, uniformly: by rejection on the bitmap (each candidate is a
        uniform voxel; the first that is background is uniform over the background)."""
        if self.bg_index is not None:
            return int(self.bg_index[rng.integers(self.bg_index.size)])
        n = int(np.prod(self.shape))
        for _ in range(0 if self.n_bg == 0 else 1 + 64 * n // self.n_bg):  # (never for ever)
            cand = rng.integers(0, n, 64)
            hit = np.flatnonzero((self.bg_bits[cand >> 3] >> (cand & 7).astype(np.uint8)) & 1)
            if hit.size:
                return int(cand[hit[0]])
        raise RuntimeError(  # (the loader checks an entry's bitmap against n_bg as it loads)
            f"case {self.case['image']}: no background voxel found in its cached bitmap "
            f"({self.n_bg} expected): delete its cache entry to rebuild it"
        )

    def is_background(self, flat) -> np.ndarray:
        """Whether flat indices are background (for tests and checks)."""
        flat = np.asarray(flat, dtype=np.int64)
        if self.bg_index is not None:
            return np.isin(flat, self.bg_index)
        return ((self.bg_bits[flat >> 3] >> (flat & 7).astype(np.uint8)) & 1).astype(bool)

    def host_image(self) -> np.ndarray:
        """The cached image as an (i, j, k) numpy array (a copy from the GPU)."""
        return _ijk_host(self.image)

    def host_label(self) -> np.ndarray | None:
        return None if self.label is None else _ijk_host(self.label)

    def prefault(self) -> None:
        """Map a memory-mapped entry's pages now (``MADV_POPULATE_READ``, Linux 5.14+; a no-op
        elsewhere), for entries held in memory (``/dev/shm``): the first read of each page
        otherwise faults in the loader's thread, batch after batch (a host-cached box read
        took ~1.4 ms on first touch against ~0.5 ms mapped)."""
        from .._proxy_arena import populate

        for a in (self.image, self.label):
            mm = getattr(a, "_mmap", None) if a is not None else None  # numpy.memmap's map
            if mm is not None:
                populate(mm)

    def on_host(self) -> Entry:
        """This entry with (i, j, k) host arrays."""
        if not self.on_device:
            return self
        return replace(self, image=self.host_image(), label=self.host_label())


def _ijk_host(a) -> np.ndarray:
    if hasattr(a, "element_size"):  # a (k, j, i) tensor
        return a.cpu().numpy().transpose(2, 1, 0)
    return np.asarray(a)


def _itemsize(a) -> int:
    return a.element_size() if hasattr(a, "element_size") else a.dtype.itemsize


def _cache_dtype(a, fill) -> str:
    """int16 (uint8) for integer sources that fit, else float32: the cache keeps the
    resampled values before the intensity step, rounded to the source's own precision."""
    name = str(a.dtype).replace("torch.", "")
    kind = np.dtype(name).kind
    if kind == "b" or name == "uint8":
        small = "uint8"
    elif kind in "iu":
        small = "int16"
    else:
        return "float32"
    info = np.iinfo(small)
    n = int(np.prod(a.shape))
    lo, hi = (int(a.min()), int(a.max())) if n else (0, 0)
    if fill is not None and (fill != int(fill) or not info.min <= fill <= info.max):
        return "float32"
    if not (info.min <= lo and hi <= info.max):
        return "float32" if kind != "b" else small
    return small


def _label_array(a, path) -> np.ndarray:
    """A label map in the smallest integer dtype that holds it (float files holding integers
    are accepted, as MONAI reads them)."""
    a = np.asarray(a)
    if a.ndim == 4 and a.shape[3] == 1:
        a = a[..., 0]
    if a.ndim != 3:
        raise ValueError(f"label {path}: expected one label map (i, j, k), got shape {a.shape}")
    if a.dtype.kind == "b":
        return a.astype(np.uint8)
    lo, hi = (a.min(), a.max()) if a.size else (0, 0)
    if a.dtype.kind == "f":
        if not np.array_equal(a, np.round(a)):
            raise ValueError(
                f"label {path}: holds non-integer values ({a.dtype}); a label map holds class "
                "numbers (round or threshold it first)"
            )
    for dt in ("uint8", "int16"):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return a if a.dtype == dt else a.astype(dt, order="K")
    if -(2**24) <= lo and hi <= 2**24:
        return a.astype(np.float32, order="K")  # the engine resamples it exactly
    raise ValueError(f"label {path}: values {lo}..{hi} do not fit 24 bits; relabel them")


def _clip_bounds(intensity, dtype) -> tuple[float, float] | None:
    """The spec's clip window as the cache stores it: values are clipped at build time, so
    that a rotated or scaled patch interpolates clipped values, as MONAI's
    ``ScaleIntensityRanged(clip=True)`` before ``RandAffined`` does (integer caches clip to the
    integers inside the window)."""
    if intensity is None or not (np.isfinite(intensity[0]) or np.isfinite(intensity[1])):
        return None
    lo, hi = float(intensity[0]), float(intensity[1])
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        lo = float(np.ceil(lo)) if np.isfinite(lo) else float(info.min)
        hi = float(np.floor(hi)) if np.isfinite(hi) else float(info.max)
        lo, hi = max(lo, info.min), min(hi, info.max)
    return lo, hi


def _indices_np(lab, img, intensity, image_threshold):
    """:func:`_indices` for (i, j, k) numpy arrays (no torch: this runs in forked workers)."""
    n = int(np.prod(img.shape))
    idx_dtype = np.int32 if n < 2**31 else np.int64
    if lab is not None:
        flat = np.asarray(lab).ravel(order="F")
        fg = np.flatnonzero(flat).astype(idx_dtype)
        bg = flat == 0
    else:
        fg = np.zeros(0, idx_dtype)
        bg = np.ones(n, bool)
    if image_threshold is not None:
        x = np.asarray(img).ravel(order="F").astype(np.float32)
        if intensity is not None:
            lo, hi, a, b = intensity
            x = np.clip(x, lo, hi) * np.float32(a) + np.float32(b)
        bg &= x > np.float32(image_threshold)
        del x
    n_bg = int(np.count_nonzero(bg))
    if 0 < n_bg < SPARSE * n:
        return fg, None, np.flatnonzero(bg).astype(idx_dtype), n_bg
    return fg, np.packbits(bg, bitorder="little"), None, n_bg


def _packbits(mask):
    """``numpy.packbits(mask, bitorder="little")`` of a flat bool tensor, computed where it is
    (on the GPU only the packed bits, 1/8 of the voxels, come back)."""
    import torch

    if mask.device.type == "cpu" and not _FORCE_TORCH_PACK:
        return np.packbits(mask.numpy(), bitorder="little")
    b8 = torch.nn.functional.pad(mask.to(torch.uint8), (0, (-mask.numel()) % 8)).view(-1, 8)
    weights = 2 ** torch.arange(8, device=mask.device, dtype=torch.int32)
    return (b8.to(torch.int32) * weights).sum(1).to(torch.uint8).cpu().numpy()


_FORCE_TORCH_PACK = False  # tests run the GPU branch on the CPU


def _indices(lab_kji, img_kji, intensity, image_threshold):
    """(fg flat indices, background bitmap or None, background index list or None, count),
    computed where the tensors are (torch, CPU or CUDA), flat index = i + ni * (j + nj * k)."""
    import torch

    n = img_kji.numel()
    if lab_kji is not None:
        flat = lab_kji.reshape(-1)
        fg = torch.nonzero(flat > 0).squeeze(1)
        bg = flat == 0
    else:
        fg = torch.zeros(0, dtype=torch.int64, device=img_kji.device)
        bg = torch.ones(n, dtype=torch.bool, device=img_kji.device)
    if image_threshold is not None:
        x = img_kji.reshape(-1).float()
        if intensity is not None:
            lo, hi, a, b = intensity
            x = x.clamp(lo, hi) * a + b
        bg &= x > float(image_threshold)
        del x
    n_bg = int(bg.sum())
    idx_dtype = torch.int32 if n < 2**31 else torch.int64
    fg = fg.to(idx_dtype).cpu().numpy()
    if 0 < n_bg < SPARSE * n:
        return fg, None, torch.nonzero(bg).squeeze(1).to(idx_dtype).cpu().numpy(), n_bg
    bits = _packbits(bg)
    return fg, bits, None, n_bg


def _check_sampling(e: Entry, image_threshold) -> None:
    if e.fg.size == 0 and e.n_bg == 0:
        cond = "" if image_threshold is None else f" with image > {image_threshold}"
        raise ValueError(
            f"case {e.case['image']}: no voxel to centre a patch on (no foreground and no "
            f"background{cond})"
        )


def _plan(case, img_vol, lab_vol, spec):
    """(image array, label array or None, plan without intensity, intensity, graph)."""
    from ..pipeline import Graph

    if lab_vol is not None:
        from ..resample import check_label_grid

        check_label_grid(img_vol, lab_vol, f"label {case['label']}", str(case["image"]))
    arr = img_vol.array
    if arr.ndim == 4:
        if arr.shape[3] != 1:
            raise ValueError(
                f"image {case['image']}: PatchLoader takes one channel, got {arr.shape[3]}"
            )
        arr = arr[..., 0]
    plan = make_plan(
        arr.shape,
        img_vol.affine,
        spec,
        arr if spec.needs_array else None,
        labels=lab_vol is not None,
    )
    say_notes(plan, str(case["image"]))
    intensity, plan = plan.intensity, replace(plan, intensity=None)
    lab = None
    if lab_vol is not None:
        la = lab_vol.array
        lab = _label_array(la.cpu().numpy() if hasattr(la, "cpu") else la, case["label"])
    graph = Graph(
        interp=spec.interp,
        antialias=spec.antialias,
        dtype=_cache_dtype(arr, spec.fill),
        fill=spec.fill,
        labels=0 if lab is None else 1,
    )
    return arr, lab, plan, intensity, graph
