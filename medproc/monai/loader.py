"""``PatchLoader``: MONAI training batches of random patches, sampled as MONAI samples them.

The MONAI recipe it replaces, with MONAI's names and units::

    CacheDataset(datalist, [LoadImaged, Orientationd, Spacingd, ScaleIntensityRanged, ...])
    RandCropByPosNegLabeld(spatial_size, pos, neg, num_samples)       -> sampling=PosNeg(...)
    RandFlipd / RandRotate90d / RandAffined / RandRotated             -> augment=Augment(...)
    RandScaleIntensityd / RandShiftIntensityd                         -> augment=Augment(...)

1. **Cache (deterministic, once, in parallel).** Each case is decoded (worker processes),
   resampled to the spec (orientation, spacing, crop) in the engine, on the GPU with
   ``device="gpu"``, and kept in compact dtypes (int16 images before the intensity step, uint8
   labels) with its foreground indices and a background bitmap: on the GPU (``cache="gpu"``,
   or ``"auto"`` within a memory budget) or on the host (memory-mapped from ``cache_dir``,
   where a later run finds it). See :mod:`medproc.monai._patch_cache` and docs/loader.md.
2. **Per batch (host, small).** Centres are drawn as ``RandCropByPosNegLabeld`` draws them
   (background = label 0 only), augmentations as MONAI's transforms draw them; crop +
   augmentation become one index map, and only the box of the cached volume that the patch
   reads is sliced (on the GPU for GPU-cached volumes: no host -> device copy per patch).
3. **Per batch (the engine).** One resampling per patch executes crop + augmentation +
   intensity (the spec's step and the random scale/shift) for the image (linear) and the label
   (nearest), batched, in MONAI's (C, i, j, k) layout. Steps 2 and 3 run in the engine's
   background thread, ``prefetch`` batches ahead of the training loop.

Batches are dicts: ``"image"`` and ``"label"`` MetaTensors ``(B, 1, i, j, k)`` on the device,
with per-sample affines ``(B, 4, 4)`` as MONAI collates them, ``"case"`` (the datalist entries)
and ``"lesions"`` (per sample, on the patch grid, when the datalist has them). As after MONAI's
``RandFlipd``/``RandAffined`` on MetaTensors, a patch's affine maps each voxel ``(i, j, k)``
to where its content lies in RAS mm: flips, turns, rotations and scaling are in the affine.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from monai.data import MetaTensor

from ..errors import check_device
from ..pipeline import stacked
from ..spec import Spec, check_args
from ._columns import gathered, one_dtype
from ._datalist import read_datalist
from ._patch_cache import GPU_CACHE_FRACTION, Builder, Entry
from .meta import store
from .patches import Augment, PosNeg, draw_patches, patch_size_of

__all__ = ["PatchLoader", "PosNeg", "Augment", "GPU_CACHE_FRACTION"]

CACHES = ("auto", "gpu", "host")


def _shard(shard_id, num_shards) -> tuple[int, int]:
    """(shard_id, num_shards): as given, else this rank of ``torch.distributed`` when it is
    initialised (as ``DistributedSampler`` does), else (0, 1)."""
    if shard_id is None and num_shards is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if shard_id is None or num_shards is None:
        raise ValueError("give shard_id and num_shards together (or neither)")
    if not 0 <= int(shard_id) < int(num_shards):
        raise ValueError(f"shard_id must be in [0, {num_shards}), got {shard_id}")
    return int(shard_id), int(num_shards)


class PatchLoader:
    """Random-patch training loader (see the module doc).

    Parameters
    ----------
    datalist : list of dict, or str
        MONAI's datalist, ``[{"image": path, "label": path}, ...]`` (other keys are passed on
        in ``batch["case"]``; ``"lesions"``, a :class:`~medproc.annotations.Lesions`, follows
        the patches), or a decathlon ``dataset.json`` (its ``"training"`` list, read with
        ``monai.data.load_decathlon_datalist``; for another list, call that yourself).
    spec : Spec
        The deterministic preprocessing (orientation, spacing, crop, intensity), as MONAI's
        ``Orientationd`` + ``Spacingd`` + ``ScaleIntensityRanged`` + ... before the cache.
    patch_size : int or (i, j, k)
        MONAI's ``spatial_size`` (one int: a cube).
    batch_size : int
        Patches per batch (MONAI's ``DataLoader(batch_size=b)`` with ``num_samples=n`` gives
        ``b * n``).
    sampling : PosNeg
        Patch centres (``RandCropByPosNegLabeld``'s ``pos``, ``neg``, ``num_samples``,
        ``image_threshold``).
    augment : Augment
        Random flips, quarter turns, rotation + scaling (radians) and intensity scale/shift,
        each with MONAI's ``prob``.
    device : {"cpu", "gpu"}
        Where patches are made and delivered; ``"gpu"`` is the current CUDA device
        (``torch.cuda.set_device``).
    cache : {"auto", "gpu", "host"}
        Where the resampled volumes live. ``"gpu"``: all on the GPU (nothing crosses the host
        -> device link per patch); ``"host"``: host memory, built on the CPU cores (the GPU
        holds only each batch's patch boxes: the choice for a training loop that needs the GPU's
        memory for the model; patch boxes are copied per batch);
        ``"auto"``: on the GPU while they fit in ``GPU_CACHE_FRACTION`` (a quarter) of its
        memory and half of what is free, the rest on the host; always the host on the CPU.
    cache_dir : str, optional
        A folder where the resampled volumes are also written (``.npy``, memory-mapped on the
        host) and found again by later runs. ``None``: built in memory for this loader only.
    shard_id, num_shards : int, optional
        Data parallelism: this loader takes the cases ``shard_id::num_shards`` (cached on this
        rank only). Default: the rank and world size of ``torch.distributed`` when it is
        initialised, else all cases. Every shard gives the same number of batches per epoch
        (``len(datalist) // num_shards`` volumes; a larger shard leaves a different case out
        each epoch), so DDP ranks stay in step; no case is in two shards.
    seed : int
        Seeds the sampling (with the shard id).
    num_threads : int, optional
        CPU threads: DALI's, and the workers that build the cache. Default
        :func:`medproc.pipeline.threads.default_threads` (this process's share of the cores when
        ``LOCAL_WORLD_SIZE`` ranks share the machine).
    prefetch : int
        Batches prepared ahead of the training loop in the engine's background thread. On the
        GPU the thread is paced (:mod:`medproc.pipeline.pace`) while two or more are ready, so
        ``prefetch=1`` turns pacing off.
    """

    def __init__(
        self,
        datalist,
        spec: Spec,
        patch_size: int | Sequence[int],
        batch_size: int = 2,
        *,
        sampling: PosNeg = PosNeg(),
        augment: Augment = Augment(),
        device: str = "cpu",
        cache: str = "auto",
        cache_dir: str | None = None,
        shard_id: int | None = None,
        num_shards: int | None = None,
        seed: int = 0,
        num_threads: int | None = None,
        prefetch: int = 4,
    ):
        from ..pipeline import Engine, Graph
        from ..pipeline.pace import Pacer, pace_fraction
        from ..pipeline.threads import check_threads

        if not isinstance(sampling, PosNeg):
            raise TypeError(f"sampling must be a PosNeg(...), got {type(sampling).__name__}")
        if not isinstance(augment, Augment):
            raise TypeError(f"augment must be an Augment(...), got {type(augment).__name__}")
        device = check_device(device)
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
        if cache == "gpu" and device != "gpu":
            raise ValueError("cache='gpu' needs device='gpu'; use cache='host' on the CPU")
        if device == "gpu" and not torch.cuda.is_available():
            from ..errors import DeviceError

            raise DeviceError("device='gpu' but PyTorch sees no CUDA GPU here; use device='cpu'")
        datalist = read_datalist(datalist)
        self.shard_id, self.num_shards = _shard(shard_id, num_shards)
        self.cases = datalist[self.shard_id :: self.num_shards]
        if len(datalist) < self.num_shards:
            raise ValueError(
                f"{len(datalist)} cases cannot fill {self.num_shards} shards: give each rank "
                "at least one case"
            )
        self.spec = spec
        check_args(spec, "PatchLoader", batch_size=batch_size, prefetch=prefetch)
        threads = check_threads(num_threads, "PatchLoader:")  # (None: the cores' share)
        self.patch = patch_size_of(patch_size, batch_size)
        if augment.rotate90_prob and self.patch[0] != self.patch[1]:
            raise ValueError(
                f"Augment.rotate90_prob turns patches in the (i, j) plane: patch_size must be "
                f"square in i and j, got {self.patch}"
            )
        self.batch_size = int(batch_size)
        self.sampling, self.augment = sampling, augment
        self.device = device
        self.device_id = torch.cuda.current_device() if device == "gpu" else 0
        self.prefetch = prefetch
        #: GPU: the engine's thread makes a batch in the loop's waits (:mod:`..pipeline.pace`;
        #: ``MEDPROC_PACE``); None on the CPU
        self.pacer = Pacer(pace_fraction()) if device == "gpu" else None
        self.rng = np.random.default_rng([seed, self.shard_id])
        self.epoch = 0
        #: volumes per epoch: the same on every shard
        self.per_epoch = (
            len(self.cases) if self.num_shards == 1 else len(datalist) // self.num_shards
        )
        self._engine = Engine(
            device, batch_size=self.batch_size, num_threads=threads, device_id=self.device_id
        )
        interp = "nearest" if spec.interp == "nearest" else "linear"
        self._graph = Graph(
            interp=interp, dtype=spec.dtype, fill=spec.fill, labels=1, channels_first=True
        )
        t = time.perf_counter()
        self.entries: list[Entry] = Builder(
            spec,
            device=device,
            device_id=self.device_id,
            where="host" if device == "cpu" else cache,
            cache_dir=cache_dir,
            image_threshold=sampling.image_threshold,
            workers=threads,
        ).build(self.cases)
        #: seconds the cache took to build (or read)
        self.build_seconds = time.perf_counter() - t
        #: host seconds spent drawing and slicing patches, and batches made (for benchmarks)
        self.host_seconds, self.batches_made = 0.0, 0
        self._copy_stream = None
        self._keep: deque = deque(maxlen=4)  # GPU boxes DALI may still be copying from
        self._feed = None  # the engine's stream of batches, epoch after epoch (see __iter__)
        self._left = self._given = 0  # batches of the current epoch not yet / handed out
        self._closed = (None, 0, None)  # the feed close() ended last, batches given, by whom
        self._token = 0  # which iterator is the current epoch's (older ones raise)
        self._owner = None  # the thread iterating the current epoch (until it ends or is left)

    def __repr__(self) -> str:
        gpu = sum(e.on_gpu for e in self.entries)
        return (
            f"PatchLoader({len(self.entries)} cases ({gpu} cached on the GPU), patch "
            f"{self.patch}, batch {self.batch_size}, device={self.device!r}, shard "
            f"{self.shard_id}/{self.num_shards})"
        )

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-self.per_epoch * self.sampling.num_samples // self.batch_size)

    def _boxes(self, entries: list[Entry], regions: list) -> tuple[list, list]:
        """The image and label boxes of a batch, (i, j, k) indexed: views of host arrays, or
        copies made on the GPU (on a side stream, complete when this returns)."""
        gpu = any(e.on_gpu for e in entries)
        if gpu and self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=self.device_id)
        imgs, labs = [], []
        with torch.cuda.stream(self._copy_stream) if gpu else contextlib.nullcontext():
            for e, r in zip(entries, regions):
                if e.on_device:  # (k, j, i) tensors: the box (copied below), seen as (i, j, k)
                    kji = (r[2], r[1], r[0])
                    imgs.append(e.image[kji])
                    if e.label is not None:
                        labs.append(e.label[kji])
                    else:
                        shape = tuple(s.stop - s.start for s in kji)
                        labs.append(torch.zeros(shape, dtype=torch.uint8, device=e.image.device))
                else:
                    imgs.append(e.image[r])
                    labs.append(
                        e.label[r] if e.label is not None else np.zeros(imgs[-1].shape, np.uint8)
                    )
            imgs = gathered(one_dtype(imgs, ("float32",)))
            labs = gathered(one_dtype(labs, ("int16", "float32")))
        if gpu:
            # the engine's DALI feed reads these on its own stream: finished, and kept alive
            # until DALI has copied them (two batches are in flight at most)
            self._copy_stream.synchronize()
            self._keep.append((imgs, labs))
        return imgs, labs

    def _epoch_order(self) -> list[list[int]]:
        """The entries of each batch of the next epoch (the shard's volumes in a random order,
        each ``num_samples`` times in a row)."""
        n = self.sampling.num_samples
        order = self.rng.permutation(len(self.entries))[: self.per_epoch]
        items = [int(v) for v in order for _ in range(n)]
        return [items[b : b + self.batch_size] for b in range(0, len(items), self.batch_size)]

    def _item(self, indices: list[int]) -> tuple:
        """The engine item ``(jobs, graph, (affines, cases, lesions))`` of one batch."""
        from ..pipeline import Job

        t = time.perf_counter()
        entries = [self.entries[v] for v in indices]
        regions, plans, affines = draw_patches(
            entries, self.patch, self.sampling, self.augment, self.rng
        )
        imgs, labs = self._boxes(entries, regions)
        jobs = [Job(img, p, (lab,)) for img, lab, p in zip(imgs, labs, plans)]
        lesions = [
            e.case["lesions"].on_grid(a, self.patch) if e.case.get("lesions") is not None else []
            for a, e in zip(affines, entries)
        ]
        self.host_seconds += time.perf_counter() - t
        self.batches_made += 1
        return jobs, self._graph, (affines, [e.case for e in entries], lesions)

    def __iter__(self) -> Iterator[dict]:
        """One epoch: ``len(self)`` batches. The engine's thread runs on into the next epoch
        (``prefetch`` batches ahead, across the boundary too): it starts without a wait. An epoch
        left early (``break``) drops the batches made ahead for it; the next starts afresh (with
        a seed, runs that break early are not reproducible draw for draw). One epoch's iterator
        at a time: an older one raises, and so does another thread's during an epoch."""
        me, owner = threading.current_thread(), self._owner and self._owner()  # (a weakref:
        if owner is not None and owner is not me and owner.is_alive():  # idents are reused)
            raise RuntimeError(  # (the other thread's epoch goes on)
                "PatchLoader: another thread is iterating this loader now; a loader gives one "
                "epoch at a time, to one thread: make a loader per thread (or close() it first)"
            )
        self.epoch += 1
        if self._feed is not None and self._left:
            self.close()
        self._owner = weakref.ref(me)
        if self._feed is None:
            self._feed = self._engine.stream(
                _epochs(weakref.ref(self)), as_torch=True, ahead=self.prefetch, pacer=self.pacer
            )
        self._left, self._given = len(self), 0
        self._token += 1
        feed, token = self._feed, self._token
        try:
            while True:
                if self._token != token:
                    raise RuntimeError(
                        "PatchLoader: this epoch's iterator was left for a newer one (a loader "
                        "runs one epoch at a time); iterate the loader again"
                    )
                if self._feed is not feed or self._left <= 0:  # closed, or the epoch is done
                    if self._feed is not feed:  # (closed by another thread while it ran: stop it)
                        feed.close()
                    self._cut_short(feed)
                    return
                try:
                    res, (affines, cases, lesions) = next(feed)
                except StopIteration:  # closed meanwhile
                    self._cut_short(feed)
                    return
                self._left -= 1
                self._given += 1
                affine = torch.from_numpy(affines)
                img = MetaTensor(
                    stacked([r[0] for r in res]),
                    affine=affine,
                    meta={"filename_or_obj": [str(c["image"]) for c in cases]},
                )
                lab = MetaTensor(
                    stacked([r[1] for r in res]),
                    affine=affine.clone(),
                    meta={"filename_or_obj": [str(c.get("label")) for c in cases]},
                )
                img.is_batch = lab.is_batch = True
                batch: dict = {}
                store(batch, "image", img)  # (plain tensors under monai.data.set_track_meta(False))
                store(batch, "label", lab)
                yield {**batch, "case": cases, "lesions": lesions}
        finally:  # (the epoch ended, failed or was left: another thread may iterate)
            self._owner = None if self._token == token else self._owner

    def close(self) -> None:
        """Stop the engine's thread (the batches it made ahead are dropped). Also done when
        the loader is garbage-collected; iterating again starts it anew. Called in the loop,
        it ends the epoch quietly; from another thread mid-epoch, the loop raises
        RuntimeError (a truncated epoch never looks complete)."""
        feed, self._feed, self._left, self._owner = self._feed, None, 0, None
        if feed is not None:  # (an epoch cut short by another thread says so: _cut_short)
            self._closed = (feed, self._given, threading.get_ident())
            if not feed.gi_running:  # (else the iterating thread closes it: see __iter__)
                feed.close()

    def _cut_short(self, feed) -> None:
        """Raise if ``feed`` was closed by another thread before its epoch was done: a
        truncated epoch must not look complete (close() in the loop ends it quietly)."""
        closed, given, by = self._closed
        if closed is feed and given < len(self) and by != threading.get_ident():
            raise RuntimeError(
                f"PatchLoader: closed during the epoch, after {given} of {len(self)} batches"
            )


def _epochs(ref) -> Iterator[tuple]:
    """Engine items of a loader's epochs, one after the other, for ever. ``ref`` is a weak
    reference, held alone between items, so that the engine's thread never keeps a loader
    that is no longer used alive (its feed is closed when it is collected)."""
    while True:
        me = ref()
        if me is None:
            return
        batches = me._epoch_order()
        del me
        for indices in batches:
            me = ref()
            if me is None:
                return
            item = me._item(indices)
            del me
            yield item
