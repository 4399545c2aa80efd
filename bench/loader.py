"""Benchmark: the training data pipeline, medproc's PatchLoader against MONAI's tuned recipe and
the plain DataLoader, on the same data and the same sampling (issue #17).

    python bench/loader.py --out loader_h200.json                                   # H200
    python bench/loader.py --device cpu --cases 3 --size 128 --patch 48 --batches 6  # CPU smoke

Task: ``--cases`` synthetic CTs with lesion label maps (NIfTI, ``--size``² x 150-250 slices);
orient RAS, 1.5 mm, window [-1000, 400] -> [0, 1], crop the foreground; ``--num-samples``
patches of ``--patch``³ per volume centred pos/neg 1:1 (negatives where label == 0 and the
windowed image > 0: ``FgBgToIndicesd(image_key="image")``), random flips on the 3 axes;
``--volumes`` volumes per batch; delivered on the device.

(a) medproc: ``PatchLoader`` (cache built in parallel, resampled on the GPU, kept there in int16
    / uint8; each patch's box sliced on the GPU; crop + flips + window in one DALI pass per
    batch, prepared ahead in the engine's thread).
(b) monai-tuned: MONAI's fast-training recipe: ``CacheDataset`` over the deterministic chain +
    ``FgBgToIndicesd`` + ``EnsureTyped(device=cuda)`` with ``copy_cache=False`` and
    ``--workers`` workers, then ``RandCropByPosNegLabeld(fg_indices_key, bg_indices_key)`` +
    ``RandFlipd`` on the GPU tensors, through a ``ThreadDataLoader``.
(c) monai-dataloader: ``Dataset`` + ``DataLoader(num_workers=--workers)``, MONAI's whole chain
    on the CPU in the workers, batches moved to the device.

Reported per method: steady samples/s (after the first ``--first`` samples), cache build
seconds, seconds from nothing to the first ``--first`` samples (build included), peak GPU
memory (device memory in use, from cudaMemGetInfo every 5 ms, minus the idle baseline: DALI's
allocator is invisible to torch.cuda.max_memory_allocated), and medproc's host seconds per
batch (sampling + slicing, in its background thread).
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

CUDA = torch.cuda.is_available()


def _make_case(args):
    out, seed, size, slices = args
    from medproc.sample_data import make_dataset

    make_dataset(out, cases=1, size=size, slices=slices, nifti=True, lesions=3, seed=seed)
    return out


def dataset(root: str, n: int, size: int, slices) -> list[dict]:
    """``n`` synthetic cases under ``root`` (made once, in parallel; reused)."""
    dirs = [os.path.join(root, f"s{size}_{slices[0]}_{slices[1]}", f"c{i:03d}") for i in range(n)]
    todo = [
        (d, 100 + i, size, tuple(slices))
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


class GpuMemory:
    """Peak device memory in use (cudaMemGetInfo), sampled every 5 ms, minus a baseline."""

    def __init__(self, device: str = "gpu"):
        self.on = CUDA and device == "gpu"
        self.peak = 0
        self.since = 0  # the peak since the last :meth:`mark`
        if not self.on:
            return
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        self.base = total - free
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free - self.base)
            self.since = max(self.since, total - free - self.base)
            time.sleep(0.005)

    def mark(self) -> float:
        """The peak since the last mark (GiB); starts a new one."""
        got, self.since = self.since, 0
        return got / 2**30

    def stop(self) -> float:
        if not self.on:
            return float("nan")
        self._stop.set()
        self._t.join()
        return self.peak / 2**30


def sync(device: str) -> None:
    if CUDA and device == "gpu":
        torch.cuda.synchronize()


def medproc_spec():
    import medproc

    return medproc.Spec(
        spacing=1.5,
        orientation="RAS",
        crop_foreground=-1000 + 1e-3,
        intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1)),
    )


def make_medproc(dl, a, batch_patches: int):
    """medproc's loader for the task (cold: no cache_dir)."""
    from medproc.monai.loader import Augment, PatchLoader, PosNeg

    prefetch = getattr(a, "prefetch", None)  # None: PatchLoader's default
    return PatchLoader(
        dl,
        medproc_spec(),
        (a.patch,) * 3,
        batch_size=batch_patches,
        sampling=PosNeg(pos=1, neg=1, num_samples=a.num_samples, image_threshold=0.0),
        augment=Augment(flip_prob=0.5),
        device=a.device,
        cache=a.cache,
        cache_dir=a.cache_dir,
        **({} if prefetch is None else {"prefetch": prefetch}),
    )


def monai_chains(a, device: str):
    """(deterministic chain, random chain) of the tuned recipe, and the plain chain."""
    from monai.transforms import (
        CropForegroundd,
        EnsureChannelFirstd,
        EnsureTyped,
        FgBgToIndicesd,
        LoadImaged,
        Orientationd,
        RandCropByPosNegLabeld,
        RandFlipd,
        ScaleIntensityRanged,
        Spacingd,
    )

    keys = ["image", "label"]
    det = [
        LoadImaged(keys, image_only=True),
        EnsureChannelFirstd(keys),
        Orientationd(keys, axcodes="RAS"),
        Spacingd(keys, pixdim=1.5, mode=("bilinear", "nearest")),
        ScaleIntensityRanged("image", -1000, 400, 0.0, 1.0, clip=True),
        CropForegroundd(keys, source_key="image", margin=0),
    ]
    flips = [RandFlipd(keys, prob=0.5, spatial_axis=ax) for ax in range(3)]
    patch = (a.patch,) * 3
    tuned = det + [
        FgBgToIndicesd("label", image_key="image"),
        EnsureTyped(keys, device=device, track_meta=False),
        RandCropByPosNegLabeld(
            keys,
            "label",
            patch,
            pos=1,
            neg=1,
            num_samples=a.num_samples,
            fg_indices_key="label_fg_indices",
            bg_indices_key="label_bg_indices",
        ),
        *flips,
    ]
    plain = det + [
        RandCropByPosNegLabeld(
            keys, "label", patch, pos=1, neg=1, num_samples=a.num_samples, image_key="image"
        ),
        *flips,
        EnsureTyped(keys, track_meta=False),
    ]
    return tuned, plain


def make_monai_tuned(dl, a, device: str):
    from monai.data import CacheDataset, ThreadDataLoader
    from monai.transforms import Compose

    tuned, _ = monai_chains(a, device)
    ds = CacheDataset(
        dl, Compose(tuned), cache_rate=1.0, num_workers=a.workers, copy_cache=False, progress=False
    )
    return ThreadDataLoader(ds, num_workers=0, batch_size=a.volumes, shuffle=True)


def make_monai_plain(dl, a):
    from monai.data import DataLoader, Dataset
    from monai.transforms import Compose

    _, plain = monai_chains(a, "cpu")
    return DataLoader(
        Dataset(dl, Compose(plain)),
        batch_size=a.volumes,
        shuffle=True,
        num_workers=a.workers,
        pin_memory=CUDA,
        persistent_workers=a.workers > 0,
    )


def forever(loader):
    """Batches without end (a new epoch when one ends)."""
    while True:
        yield from loader


def run_method(name: str, make, a, first: int, steady_batches: int) -> dict:
    """Build the loader, time the first ``first`` samples (build included), then
    ``steady_batches`` batches."""
    dev = "cuda" if (CUDA and a.device == "gpu") else "cpu"
    mem = GpuMemory(a.device)
    t0 = time.perf_counter()
    loader = make()
    build = time.perf_counter() - t0
    it = forever(loader)
    n = 0
    while n < first:
        b = next(it)
        b["image"].to(dev, non_blocking=True)
        n += b["image"].shape[0]
    sync(a.device)
    cold = time.perf_counter() - t0
    t = time.perf_counter()
    m = 0
    for _ in range(steady_batches):
        b = next(it)
        img = b["image"].to(dev, non_blocking=True)
        b["label"].to(dev, non_blocking=True)
        m += img.shape[0]
    sync(a.device)
    steady = m / (time.perf_counter() - t)
    out = {
        "samples_per_s": steady,
        "cache_build_s": build,
        "first_samples": n,
        "build_plus_first_s": cold,
        "peak_gpu_GiB": mem.stop(),
        "batch_shape": list(b["image"].shape),
    }
    host = getattr(loader, "host_seconds", None)
    if host is not None:
        out["host_ms_per_batch"] = 1000 * host / max(1, loader.batches_made)
        out["on_gpu_cases"] = sum(e.on_gpu for e in loader.entries)
    print(name, json.dumps(out), flush=True)
    del it, loader, b
    if CUDA:
        torch.cuda.empty_cache()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu" if CUDA else "cpu")
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--slices", type=int, nargs=2, default=(150, 250))
    ap.add_argument("--patch", type=int, default=96)
    ap.add_argument("--num-samples", type=int, default=2, help="patches per volume")
    ap.add_argument("--volumes", type=int, default=2, help="volumes per batch (MONAI's)")
    ap.add_argument("--workers", type=int, default=12, help="MONAI's CacheDataset/DataLoader")
    ap.add_argument("--first", type=int, default=1200, help="samples timed from cold")
    ap.add_argument("--batches", type=int, default=200, help="steady-state batches")
    ap.add_argument("--plain-batches", type=int, default=12, help="for the plain DataLoader")
    ap.add_argument("--cache", default="auto", choices=["auto", "gpu", "host"])
    ap.add_argument("--cache-dir", default=None, help="medproc's cache_dir (default: none)")
    ap.add_argument("--data", default="/tmp/bench_loader")
    ap.add_argument("--skip", nargs="*", default=[], choices=["medproc", "tuned", "plain"])
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    t = time.perf_counter()
    dl = dataset(a.data, a.cases, a.size, a.slices)
    per_batch = a.volumes * a.num_samples
    res = {
        "args": vars(a),
        "device": torch.cuda.get_device_name() if CUDA and a.device == "gpu" else "cpu",
        "cores": len(os.sched_getaffinity(0)),
        "data_seconds": time.perf_counter() - t,
        "patches_per_batch": per_batch,
        "methods": {},
    }
    print(f"data ready ({res['data_seconds']:.0f} s)", flush=True)
    t = time.perf_counter()
    import medproc.pipeline  # noqa: F401 - DALI's import, once per process, not in the build

    res["dali_import_s"] = time.perf_counter() - t
    import monai.data  # noqa: F401 - MONAI's imports, not in anyone's build time
    import monai.transforms  # noqa: F401

    import medproc.monai  # noqa: F401

    dev = "cuda:0" if CUDA and a.device == "gpu" else "cpu"
    m = res["methods"]
    if "medproc" not in a.skip:
        m["medproc"] = run_method(
            "medproc", lambda: make_medproc(dl, a, per_batch), a, a.first, a.batches
        )
    if "tuned" not in a.skip:
        m["monai-tuned"] = run_method(
            "monai-tuned", lambda: make_monai_tuned(dl, a, dev), a, a.first, a.batches
        )
    if "plain" not in a.skip:
        m["monai-dataloader"] = run_method(
            "monai-dataloader",
            lambda: make_monai_plain(dl, a),
            a,
            min(a.first, per_batch * 2),
            a.plain_batches,
        )
    if "medproc" in m:
        base = m["medproc"]
        for k, v in m.items():
            v["medproc_steady_speedup"] = base["samples_per_s"] / v["samples_per_s"]
            if k != "monai-dataloader":
                v["medproc_cold_speedup"] = v["build_plus_first_s"] / base["build_plus_first_s"]
            v["gpu_memory_vs_medproc"] = v["peak_gpu_GiB"] / max(base["peak_gpu_GiB"], 1e-9)
    print(json.dumps(res, indent=1, default=str))
    if a.out:
        from provenance import provenance  # (bench/provenance.py)

        res["provenance"] = provenance()
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
