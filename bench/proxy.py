"""Benchmark: the DALI Proxy loader against a plain PyTorch DataLoader doing the same work on
CPU workers (same samples, same plans, same batches delivered on the GPU).

    python bench/proxy.py --workers 8 --samples 64 --batch 4 --out results.json   # H200

Each sample: a CT volume (int16, 200 x 256 x 256 at 0.8 x 0.8 x 1.25 mm) -> 1.5 mm RAS, a
random flip + rotation, cropped to 96^3, with two lesions mapped onto the output grid.
- proxy: workers plan and map lesions (Python), DALI resamples on the GPU in the main process.
- plain: workers plan, map lesions and resample with SimpleITK (1 thread each, on the plan's
  exact output grid), the batch is collated and moved to the GPU.
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

SPEC = medproc.Spec(spacing=1.5, orientation="RAS", crop=(96, 96, 96))
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


class SitkTransform(ProxyTransform):
    """The same plan and lesions, resampled in the worker with SimpleITK."""

    def __call__(self, sample):
        import SimpleITK as sitk

        from medproc.io.sitk_io import resample_filter, to_sitk

        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(1)
        plan = self.plan(sample)
        img = sample["image"]
        # the augmented plan is a general affine: SimpleITK's AffineTransform from output to input
        f = resample_filter(plan.out_affine, plan.out_shape, motion=plan.motion)
        out = sitk.GetArrayFromImage(f.Execute(to_sitk(img))).transpose(2, 1, 0)  # (i, j, k)
        return {
            "image": torch.from_numpy(np.ascontiguousarray(out))[None],
            "affine": torch.as_tensor(plan.out_affine),
            "lesions": plan.lesions_on_grid(sample["lesions"]),
            "index": sample["index"],
        }


def run(loader, to_gpu):
    n = 0
    torch.cuda.synchronize()
    t = time.perf_counter()
    for batch in loader:
        img = batch["image"].cuda(non_blocking=True) if to_gpu else batch["image"]
        n += img.shape[0]
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    _VOLS.extend(volumes())
    res = {"workers": a.workers, "samples": a.samples, "batch": a.batch}
    with ProxyServer(SPEC, device="gpu", batch_size=a.batch, augment=augment, prefetch=2) as server:
        ds = Samples(a.samples, server.transform)
        loader = server.loader(ds, batch_size=a.batch, num_workers=a.workers)
        run(loader, False)  # warm-up (workers, pipeline)
        res["proxy_samples_per_s"] = run(loader, False)
    plain = torch.utils.data.DataLoader(
        Samples(a.samples, SitkTransform(SPEC, augment=augment)),
        batch_size=a.batch,
        num_workers=a.workers,
        collate_fn=collate,
        pin_memory=True,
    )
    run(plain, True)
    res["plain_samples_per_s"] = run(plain, True)
    res["speedup"] = res["proxy_samples_per_s"] / res["plain_samples_per_s"]
    print(json.dumps(res, indent=1))
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
