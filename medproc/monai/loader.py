"""``PatchLoader``: MONAI-style training batches of random patches, built in one DALI pipeline.

1. **Cache (deterministic, once).** Each case is resampled to the spec (orientation, spacing,
   intensity) and written as ``.npy`` (image and label) plus a small index of foreground and
   background voxels. A rerun reuses the cache.
2. **Per batch (CPU, small).** Patch centres are drawn by label ratio (``pos``/``neg``, as
   MONAI's RandCropByPosNegLabeld) from the precomputed indices; a random flip / rot90 /
   rotation+scaling is drawn per patch; only the region of the cached volume that the
   augmented patch touches is read (memory-mapped) and shipped.
3. **Per batch (the engine, GPU or CPU backend).** One ``warp_affine`` per patch executes crop +
   augmentation as one matrix, for the image (linear, with a random intensity scale/shift) and
   the label (nearest), batched, into MONAI's (C, i, j, k) layout. Steps 2 and 3 run in the
   engine's background thread, ``prefetch`` batches ahead of the training loop.

Batches are dicts with ``"image"`` and ``"label"`` MetaTensors of shape (B, 1, i, j, k) on the
device, with per-sample affines (B, 4, 4) as MONAI collates them, plus ``"lesions"`` (per
sample, on the patch grid) and ``"case"``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import torch
from monai.data import MetaTensor

from ..plan import Plan, affine_map, flip_map
from ..spec import Spec

__all__ = ["PatchLoader"]


class PatchLoader:
    """Random-patch training loader (see module doc).

    Parameters
    ----------
    datalist : list of dict or str
        ``[{"image": path, "label": path}, ...]`` (a MONAI datalist), or a decathlon-style JSON
        file (read with ``monai.data.load_decathlon_datalist``, key ``data_key``).
    spec : Spec
        The deterministic preprocessing (spacing, orientation, intensity...).
    patch_size : (i, j, k)
    batch_size : int
        Patches per batch.
    num_samples : int
        Patches per volume per epoch.
    pos, neg : float
        Ratio of patches centred on foreground / background voxels.
    flip_prob, rot90_prob : float
        Per-axis flip probability; probability of a random 90-degree rotation in the (i, j)
        plane.
    rotate_range : float
        Max absolute rotation (degrees) about each axis; ``scale_range`` likewise (0.1 = +-10%).
    intensity_scale, intensity_shift : float
        Random ``x * (1 + U(-s, s)) + U(-t, t)`` per patch.
    device : {"cpu", "gpu"}
    cache_dir : str
        Where the resampled ``.npy`` cache lives (reused across runs).
    shard_id, num_shards : int
        Data-parallel sharding: this loader takes cases ``shard_id::num_shards``.
    device_id : int
        GPU of this shard.
    prefetch : int
        Batches prepared ahead of the training loop, in the engine's background thread.
    """

    def __init__(
        self,
        datalist,
        spec: Spec,
        patch_size: Sequence[int],
        batch_size: int = 2,
        num_samples: int = 2,
        pos: float = 1.0,
        neg: float = 1.0,
        flip_prob: float = 0.5,
        rot90_prob: float = 0.0,
        rotate_range: float = 0.0,
        scale_range: float = 0.0,
        intensity_scale: float = 0.0,
        intensity_shift: float = 0.0,
        device: str = "cpu",
        cache_dir: str = ".medproc_cache",
        shard_id: int = 0,
        num_shards: int = 1,
        device_id: int = 0,
        seed: int = 0,
        data_key: str = "training",
        base_dir: str | None = None,
        num_threads: int | None = None,
        prefetch: int = 2,
    ):
        if isinstance(datalist, (str, os.PathLike)):
            from monai.data import load_decathlon_datalist

            datalist = load_decathlon_datalist(
                str(datalist), data_list_key=data_key, base_dir=base_dir
            )
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard_id must be in [0, {num_shards}), got {shard_id}")
        self.cases = list(datalist)[shard_id::num_shards]
        if not self.cases:
            raise ValueError(
                f"shard {shard_id} of {num_shards} has no cases ({len(datalist)} in all)"
            )
        self.spec = spec
        self.patch = tuple(int(x) for x in patch_size)  # (i, j, k)
        self.batch_size = batch_size
        self.num_samples = num_samples
        self.pos_ratio = pos / (pos + neg) if pos + neg > 0 else 1.0
        self.flip_prob, self.rot90_prob = flip_prob, rot90_prob
        self.rotate_range, self.scale_range = rotate_range, scale_range
        self.intensity_scale, self.intensity_shift = intensity_scale, intensity_shift
        self.device, self.device_id = device, device_id
        self.cache_dir = cache_dir
        self.rng = np.random.default_rng([seed, shard_id])
        self.epoch = 0
        from ..pipeline import Engine, Graph

        self.prefetch = prefetch
        self._engine = Engine(
            device, batch_size=batch_size, num_threads=num_threads, device_id=device_id
        )
        self._graph = Graph(
            labels=1, channels_first=True, mode="warp"
        )  # crop + augment: one matrix
        self.volumes = [self._cached(c) for c in self.cases]

    # cache ---------------------------------------------------------------------------------
    def _cached(self, case: dict) -> dict:
        from ..io import atomic_write, load, save
        from ..resample import resample_batch

        key = hashlib.sha1(
            json.dumps(
                ["ijk", str(case.get("image")), str(case.get("label")), repr(self.spec)],
                sort_keys=True,
            ).encode()
        ).hexdigest()[:16]
        base = os.path.join(self.cache_dir, key)
        meta_path = base + ".json"
        if not os.path.exists(meta_path):
            os.makedirs(self.cache_dir, exist_ok=True)
            dev = self.device
            img = load(case["image"], device=dev)  # decoded on the GPU where proven
            lab = load(case["label"], device=dev) if case.get("label") else None
            res = resample_batch(
                [img], self.spec, labels=[lab] if lab is not None else None, device=self.device
            )[0]
            out, out_lab = res if lab is not None else (res, None)
            save(out, base + "_image.npy")
            if out_lab is not None:
                out_lab = out_lab.numpy()
                save(out_lab, base + "_label.npy")
                fg = np.flatnonzero(out_lab.array > 0)
            else:
                fg = np.zeros(0, np.int64)
            np.save(base + "_fg.npy", fg.astype(np.int64))
            doc = {
                "image": str(case["image"]),
                "label": str(case.get("label")),
                "shape": list(out.shape),
                "affine": out.affine.tolist(),
                "has_label": out_lab is not None,
            }
            with atomic_write(meta_path) as tmp, open(tmp, "w") as f:
                json.dump(doc, f)  # written last: its presence means the entry is complete
        doc = json.load(open(meta_path))
        vol = {
            "case": case,
            "image": np.load(base + "_image.npy", mmap_mode="r"),
            "label": np.load(base + "_label.npy", mmap_mode="r") if doc["has_label"] else None,
            "fg": np.load(base + "_fg.npy"),
            "affine": np.array(doc["affine"]),
            "lesions": case.get("lesions"),
        }
        return vol

    # sampling ------------------------------------------------------------------------------
    def _augment(self) -> np.ndarray:
        """A random index map on the patch grid (i, j, k): flips, rot90, rotation + scaling."""
        shape = self.patch
        t = np.eye(4)
        for ax in range(3):
            if self.rng.random() < self.flip_prob:
                t = t @ flip_map(shape, [ax])
        if self.rot90_prob and self.rng.random() < self.rot90_prob and shape[0] == shape[1]:
            t = t @ affine_map(shape, (1, 1, 1), rotate_deg=(0, 0, 90.0 * self.rng.integers(1, 4)))
        if self.rotate_range or self.scale_range:
            rot = self.rng.uniform(-self.rotate_range, self.rotate_range, 3)
            sc = 1 + self.rng.uniform(-self.scale_range, self.scale_range, 3)
            t = t @ affine_map(shape, (1, 1, 1), rotate_deg=tuple(rot), scale=tuple(sc))
        return t

    def _sample(self, vol: dict):
        """One patch: its plan (crop + augmentation, re-based onto the input region it reads)
        and that region of the cached image and label."""
        shape = np.array(vol["image"].shape[:3])
        psz = np.array(self.patch)
        if vol["fg"].size and self.rng.random() < self.pos_ratio:
            centre = np.array(np.unravel_index(vol["fg"][self.rng.integers(vol["fg"].size)], shape))
        else:
            centre = np.array([self.rng.integers(0, n) for n in shape])
        crop = np.eye(4)
        crop[:3, 3] = np.clip(centre - psz // 2, 0, np.maximum(shape - psz, 0))
        plan = Plan(tuple(shape), vol["affine"], self.patch, vol["affine"] @ crop, crop)
        region, plan = plan.augmented(self._augment()).input_region()
        img = vol["image"][region]
        lab = vol["label"][region] if vol["label"] is not None else np.zeros(img.shape, np.uint8)
        if self.intensity_scale or self.intensity_shift:
            a = 1 + self.rng.uniform(-self.intensity_scale, self.intensity_scale)
            b = self.rng.uniform(-self.intensity_shift, self.intensity_shift)
            plan = replace(plan, intensity=(-np.inf, np.inf, float(a), float(b)))
        return img, lab, plan

    def _items(self) -> Iterator[tuple]:
        """Engine items ``(jobs, graph, (plans, volumes))``, one per batch of an epoch."""
        from ..pipeline import Job

        order = self.rng.permutation(len(self.volumes))
        items = [v for v in order for _ in range(self.num_samples)]
        for b in range(0, len(items), self.batch_size):
            vols = [self.volumes[v] for v in items[b : b + self.batch_size]]
            sampled = [self._sample(v) for v in vols]
            jobs = [Job(img, plan, (lab,)) for img, lab, plan in sampled]
            yield jobs, self._graph, ([p for _, _, p in sampled], vols)

    def __len__(self) -> int:
        return -(-len(self.volumes) * self.num_samples // self.batch_size)

    def __iter__(self):
        self.epoch += 1
        for res, (plans, vols) in self._engine.stream(
            self._items(), as_torch=True, ahead=self.prefetch
        ):
            img = torch.stack([r[0] for r in res])
            lab = torch.stack([r[1] for r in res])
            aff = torch.as_tensor(np.stack([p.out_affine for p in plans]))
            yield {
                "image": MetaTensor(img, affine=aff),
                "label": MetaTensor(lab, affine=aff),
                "lesions": [
                    p.lesions_on_grid(v["lesions"]) if v["lesions"] is not None else []
                    for p, v in zip(plans, vols)
                ],
                "case": [v["case"] for v in vols],
            }
