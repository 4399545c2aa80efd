"""Benchmark: medproc's proxy loader against a plain PyTorch DataLoader doing the same work on
CPU workers (same samples, same plans, same batches delivered on the GPU), in one run.

    python bench/proxy.py --workers 8 16 --samples 96 --batch 4 --out results.json   # H200
    python bench/proxy.py --workers 2 --samples 8 --batch 2 --device cpu             # CPU box

Each sample is a CT volume (int16, 256 x 256 x 200 at 0.8 x 0.8 x 1.25 mm, (i, j, k)) with two
lesions. Two tasks:
- ``crop``: -> 1.5 mm RAS, a random flip + rotation, cropped to 96^3 (training patches);
- ``whole``: -> 1.5 mm RAS + intensity window, the whole volume (detection / inference).
Loaders:
- ``proxy (engine)``: workers plan, map lesions and hand the input box over in shared memory;
  the engine resamples the batch on the GPU in the main process, ahead of the consumer
  (``--device cpu``: each worker resamples its samples on DALI's CPU backend);
- ``proxy (DALI Proxy)``: the same transform through DALI Proxy's DALIServer (crop only);
- ``plain``: workers plan, map lesions and resample with SimpleITK (on SimpleITK images each
  worker made once, the cores shared out among the workers as ITK threads, on the plan's
  exact output grid, + the same intensity step), the batch is collated and moved to the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import medproc  # noqa: E402
from medproc.annotations import Lesions  # noqa: E402
from medproc.plan import affine_map, flip_map  # noqa: E402
from medproc.proxy import ProxyServer, ProxyTransform, collate  # noqa: E402
from medproc.sample_data import grid_affine  # noqa: E402

INTENSITY = medproc.Intensity(clip=(-1000, 400), scale=(0, 1))
SPECS = {
    "crop": medproc.Spec(spacing=1.5, orientation="RAS", crop=(96, 96, 96)),
    "whole": medproc.Spec(spacing=1.5, orientation="RAS", intensity=INTENSITY),
}
_VOLS = []


def volumes(n=8, shape=(256, 256, 200)):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        aff = grid_affine(shape, (0.8, 0.8, 1.25), (-100.0, -100.0, -120.0 + i))
        arr = np.asfortranarray(rng.integers(-1000, 400, shape, dtype=np.int16))  # as read
        les = Lesions([[0.0, 10.0 * i, 0.0], [20.0, -5.0, 10.0]], [[12.0] * 3, [8.0] * 3])
        out.append((medproc.Volume(arr, aff), les))
    return out


def augment(plan, rng):
    return flip_map(plan.out_shape, [int(rng.integers(0, 3))]) @ affine_map(
        plan.out_shape, [1.5] * 3, rotate_deg=tuple(rng.uniform(-15, 15, 3))
    )


class Samples(torch.utils.data.Dataset):
    def __init__(self, n, transform):
        self.n, self.transform = n, transform

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        vol, les = _VOLS[i % len(_VOLS)]
        return self.transform({"image": vol, "lesions": les, "index": i})


_SITK: dict = {}  # a worker's SimpleITK images of _VOLS, made once (as a SimpleITK user holds)


class SitkTransform(ProxyTransform):
    """The same plan and lesions, resampled in the worker with SimpleITK (+ the intensity), on
    SimpleITK images the worker made once per volume (not converted again per sample), with
    the cores shared out among the workers as ITK threads."""

    def __init__(self, *a, threads: int = 1, **k):
        super().__init__(*a, **k)
        self.threads = threads

    def __call__(self, sample):
        import SimpleITK as sitk

        from medproc.io.sitk_io import resample_filter, to_sitk

        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(self.threads)
        plan = self.plan(sample)
        img = sample["image"]
        if id(img) not in _SITK:
            _SITK[id(img)] = to_sitk(img)
        # the augmented plan is a general affine: SimpleITK's AffineTransform from output to input
        f = resample_filter(plan.out_affine, plan.out_shape, motion=plan.motion)
        out = sitk.GetArrayFromImage(f.Execute(_SITK[id(img)])).transpose(2, 1, 0)  # (i, j, k)
        if plan.intensity is not None:
            lo, hi, a, b = plan.intensity
            out = np.clip(out, lo, hi) * np.float32(a) + np.float32(b)
        return {
            "image": torch.from_numpy(np.ascontiguousarray(out))[None],
            "affine": torch.as_tensor(plan.out_affine),
            "lesions": plan.lesions_on_grid(sample["lesions"]),
            "index": sample["index"],
        }


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(loader, to_gpu, n_batches=None):
    n = 0
    _sync()
    t = time.perf_counter()
    for b, batch in enumerate(loader):
        imgs = batch["image"] if isinstance(batch["image"], list) else [batch["image"]]
        for img in imgs:
            img = img.cuda(non_blocking=True) if to_gpu else img
            n += 1 if isinstance(batch["image"], list) else img.shape[0]
        if n_batches and b + 1 >= n_batches:
            break
    _sync()
    return n / (time.perf_counter() - t)


def _plain_collate_lists(samples):
    """Whole volumes differ in size: a list per key, as the proxy returns them."""
    out = {k: [s[k] for s in samples] for k in samples[0]}
    return out


def measure(task, workers, a):
    spec = SPECS[task]
    aug = augment if task == "crop" else None
    res = {}
    gpu = a.device == "gpu"
    with ProxyServer(spec, device=a.device, batch_size=a.batch, augment=aug, prefetch=4) as server:
        loader = server.loader(
            Samples(a.samples, server.transform), batch_size=a.batch, num_workers=workers
        )
        run(loader, False)  # warm-up (workers, pipelines)
        res["proxy (engine)"] = run(loader, False)
    if task == "crop" and gpu and "dali-proxy" not in a.skip:
        with ProxyServer(
            spec,
            device="gpu",
            batch_size=a.batch,
            augment=aug,
            prefetch=2 * max(1, workers),  # DALI Proxy's documented setting: 2 x workers
            route="dali-proxy",
        ) as server:
            loader = server.loader(
                Samples(a.samples, server.transform), batch_size=a.batch, num_workers=workers
            )
            run(loader, False)
            res["proxy (DALI Proxy)"] = run(loader, False)
    if "plain" in a.skip:
        return res
    plain = torch.utils.data.DataLoader(
        Samples(
            a.samples,
            SitkTransform(
                spec, augment=aug, threads=max(1, (os.cpu_count() or 1) // max(1, workers))
            ),
        ),
        batch_size=a.batch,
        num_workers=workers,
        collate_fn=collate if task == "crop" else _plain_collate_lists,
        pin_memory=gpu,
        persistent_workers=workers > 0,
    )
    run(plain, gpu)
    res["plain (SimpleITK workers)"] = run(plain, gpu)
    res["proxy_vs_plain"] = res["proxy (engine)"] / res["plain (SimpleITK workers)"]
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tasks", nargs="+", default=list(SPECS))
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--skip", nargs="*", default=[], choices=["dali-proxy", "plain"])
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    _VOLS.extend(volumes())
    res = {"samples": a.samples, "batch": a.batch, "results": {}}
    for task in a.tasks:
        for w in a.workers:
            r = measure(task, w, a)
            res["results"][f"{task}, {w} workers"] = r
            print(task, w, json.dumps(r), flush=True)
    print(json.dumps(res, indent=1))
    if a.out:
        from provenance import provenance  # (bench/provenance.py)

        res["provenance"] = provenance()
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
