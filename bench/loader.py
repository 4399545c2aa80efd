"""Benchmark: a MONAI training data pipeline three ways, same data, same transform chain:
orient RAS, 1.5 mm, intensity window, crop foreground, pos/neg 96^3 patches (2 per volume),
random flips, batch 2, delivered on the GPU.

    python bench/loader.py --cases 24 --workers 12 --batches 60 --out results.json   # H200

(a) monai-dataloader: Dataset + DataLoader(num_workers) with MONAI's CPU transforms.
(b) monai-fast: CacheDataset (deterministic part, cached on the GPU) + ThreadDataLoader + random
    transforms on GPU tensors (MONAI's fast-training recipe).
(c) medproc: PatchLoader (resampled .npy cache on disk, patch regions read and shipped, crop +
    flips + layout in one DALI warp on the GPU).

Reports samples/s after warm-up, cache build time, and peak GPU memory measured the same way for
all three (device memory in use, from cudaMemGetInfo, minus the idle baseline: DALI's own
allocator is invisible to torch.cuda.max_memory_allocated).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

PATCH = (96, 96, 96)


def _make_case(args):
    out, seed, size, slices = args
    from medproc.sample_data import make_dataset

    make_dataset(out, cases=1, size=size, slices=slices, nifti=True, lesions=3, seed=seed)
    return out


def dataset(root, n, size, slices):
    dirs = [os.path.join(root, f"c{i:03d}") for i in range(n)]
    todo = [
        (d, 100 + i, size, slices)
        for i, d in enumerate(dirs)
        if not os.path.exists(os.path.join(d, "labels"))
    ]
    if todo:
        with ProcessPoolExecutor(min(len(todo), os.cpu_count() or 1)) as ex:
            list(ex.map(_make_case, todo))
    return [
        {
            "image": glob.glob(os.path.join(d, "nifti", "*.nii.gz"))[0],
            "label": glob.glob(os.path.join(d, "labels", "*.nii.gz"))[0],
        }
        for d in dirs
    ]


CUDA = torch.cuda.is_available()
DEV = "cuda:0" if CUDA else "cpu"


class GpuMemory:
    """Peak device memory in use (cudaMemGetInfo), sampled every 5 ms, minus a baseline."""

    def __new__(cls):
        if not CUDA:
            return _NoMemory()
        return super().__new__(cls)

    def __init__(self):
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        self.base = total - free
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free - self.base)
            time.sleep(0.005)

    def stop(self):
        self._stop.set()
        self._t.join()
        return self.peak / 2**30


class _NoMemory:
    def stop(self):
        return float("nan")


def _sync():
    if CUDA:
        torch.cuda.synchronize()


def monai_transforms(gpu_random: bool):
    from monai.transforms import (
        Compose,
        CropForegroundd,
        EnsureChannelFirstd,
        EnsureTyped,
        LoadImaged,
        Orientationd,
        RandCropByPosNegLabeld,
        RandFlipd,
        ScaleIntensityRanged,
        Spacingd,
    )

    det = [
        LoadImaged(["image", "label"], image_only=True),
        EnsureChannelFirstd(["image", "label"]),
        Orientationd(["image", "label"], axcodes="RAS"),
        Spacingd(["image", "label"], pixdim=1.5, mode=("bilinear", "nearest")),
        ScaleIntensityRanged("image", -1000, 400, 0.0, 1.0, clip=True),
        CropForegroundd(["image", "label"], source_key="image", margin=0),
    ]
    rand = [
        RandCropByPosNegLabeld(["image", "label"], "label", PATCH, pos=1, neg=1, num_samples=2),
        RandFlipd(["image", "label"], prob=0.5, spatial_axis=0),
        RandFlipd(["image", "label"], prob=0.5, spatial_axis=1),
        RandFlipd(["image", "label"], prob=0.5, spatial_axis=2),
    ]
    if gpu_random:
        return Compose(
            det + [EnsureTyped(["image", "label"], device=DEV, track_meta=False)]
        ), Compose(rand)
    return Compose(det + rand + [EnsureTyped(["image", "label"], track_meta=False)]), None


def measure(loader, batches, warm=3):
    it = iter(loader)
    for _ in range(warm):
        b = next(it)
    _sync()
    t = time.perf_counter()
    n = 0
    for _ in range(batches):
        try:
            b = next(it)
        except StopIteration:
            it = iter(loader)
            b = next(it)
        img = b["image"].to(DEV, non_blocking=True)
        n += img.shape[0]
    _sync()
    return n / (time.perf_counter() - t)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--slices", type=int, nargs=2, default=(150, 250))
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--data", default="/tmp/bench_loader")
    ap.add_argument("--skip", nargs="*", default=[])
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    t = time.perf_counter()
    dl = dataset(a.data, a.cases, a.size, tuple(a.slices))
    res = {
        "cases": a.cases,
        "workers": a.workers,
        "batches": a.batches,
        "patch": PATCH,
        "data_seconds": time.perf_counter() - t,
        "methods": {},
    }
    print(f"data ready ({res['data_seconds']:.0f} s)", flush=True)
    from monai.data import CacheDataset, DataLoader, Dataset, ThreadDataLoader, list_data_collate

    if "medproc" not in a.skip:
        import medproc
        from medproc.monai import PatchLoader

        spec = medproc.Spec(
            spacing=1.5,
            orientation="RAS",
            crop_foreground=-1000 + 1e-3,
            intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1)),
        )
        mem = GpuMemory()
        t = time.perf_counter()
        loader = PatchLoader(
            dl,
            spec,
            PATCH,
            batch_size=2,
            num_samples=2,
            pos=1,
            neg=1,
            flip_prob=0.5,
            device="gpu" if CUDA else "cpu",
            cache_dir=os.path.join(a.data, "medproc_cache"),
        )
        build = time.perf_counter() - t
        sps = measure(loader, a.batches)
        res["methods"]["medproc"] = {
            "samples_per_s": sps,
            "cache_build_s": build,
            "peak_gpu_GiB": mem.stop(),
        }
        print("medproc", res["methods"]["medproc"], flush=True)
        del loader
        if CUDA:
            torch.cuda.empty_cache()
    if "fast" not in a.skip:
        det, rand = monai_transforms(gpu_random=True)
        mem = GpuMemory()
        t = time.perf_counter()
        cache = CacheDataset(dl, det, cache_rate=1.0, num_workers=a.workers)
        build = time.perf_counter() - t
        ds = _RandOnCached(cache, rand)
        loader = ThreadDataLoader(ds, batch_size=1, num_workers=0, collate_fn=list_data_collate)
        sps = measure(loader, a.batches)
        res["methods"]["monai-fast"] = {
            "samples_per_s": sps,
            "cache_build_s": build,
            "peak_gpu_GiB": mem.stop(),
        }
        print("monai-fast", res["methods"]["monai-fast"], flush=True)
        del cache, ds, loader
        if CUDA:
            torch.cuda.empty_cache()
    if "dataloader" not in a.skip:
        full, _ = monai_transforms(gpu_random=False)
        mem = GpuMemory()
        loader = DataLoader(
            Dataset(dl, full),
            batch_size=1,
            num_workers=a.workers,
            collate_fn=list_data_collate,
            pin_memory=True,
            persistent_workers=True,
        )
        sps = measure(loader, max(4, a.batches // 6), warm=1)
        res["methods"]["monai-dataloader"] = {"samples_per_s": sps, "peak_gpu_GiB": mem.stop()}
        print("monai-dataloader", res["methods"]["monai-dataloader"], flush=True)
    m = res["methods"]
    if "medproc" in m:
        for k in m:
            m[k]["medproc_speedup"] = m["medproc"]["samples_per_s"] / m[k]["samples_per_s"]
            m[k]["gpu_memory_vs_medproc"] = m[k]["peak_gpu_GiB"] / max(
                m["medproc"]["peak_gpu_GiB"], 1e-9
            )
    print(json.dumps(res, indent=1, default=str))
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1, default=str)


class _RandOnCached(torch.utils.data.Dataset):
    """MONAI's random transforms applied to cached GPU items (2 patches each, batch of 2)."""

    def __init__(self, cache, rand):
        self.cache, self.rand = cache, rand

    def __len__(self):
        return len(self.cache)

    def __getitem__(self, i):
        return self.rand(self.cache[i])


if __name__ == "__main__":
    main()
