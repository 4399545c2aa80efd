"""Benchmark: resample CT volumes to 1.5 mm, medproc (DALI) side by side with the tools users
would pick instead, in one run on the same in-memory volumes.

    python bench/resample.py --device gpu --n 8 --slices 300 --out results.json   # H200
    python bench/resample.py --device cpu --n 4 --slices 150                      # CPU box

Methods (all start from the same int16 arrays; outputs float32 on the 1.5 mm grid):
- medproc-gpu (end to end): host int16 volumes (pinned, as a loader that reads into pinned
  buffers would hold them) -> H2D on a side stream, overlapped with DALI's resample of the
  previous batch -> float32 on the GPU.
- medproc-gpu (GPU stage): same, volumes already on the GPU.
- monai-gpu: monai.transforms.Spacing(pixdim=1.5) on MetaTensors already on the GPU.
- torch-gpu: torch.nn.functional.interpolate(trilinear) on GPU tensors to medproc's shape.
- simpleitk: ResampleImageFilter (linear) on the CPU, all cores.
- medproc-cpu / monai-cpu / torch-cpu: the CPU backends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import medproc  # noqa: E402
from medproc import Spec, make_plan  # noqa: E402
from medproc.geometry import LPS_TO_RAS  # noqa: E402


def make_volumes(n, slices, size, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    body = (((xx - size / 2) / (size * 0.42)) ** 2 + ((yy - size / 2) / (size * 0.32)) ** 2) <= 1
    base = np.where(body, 40, -1000).astype(np.int16)
    vols = []
    for _ in range(n):
        nz = slices
        arr = np.empty((size, size, nz), np.int16, order="F")  # (i, j, k) as DICOM/NIfTI hold it
        noise = rng.integers(-20, 20, (8, size, size), dtype=np.int16)
        for k in range(nz):
            arr[:, :, k] = (base + noise[k % 8]).T
        aff = LPS_TO_RAS @ np.array(
            [[0.7, 0, 0, -180], [0, 0.7, 0, -180], [0, 0, 1.0, -150.0], [0, 0, 0, 1]]
        )
        vols.append(medproc.Volume(arr, aff))
    return vols


def timeit(fn, repeat=3, sync=None):
    fn()  # warm-up
    if sync:
        sync()
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        if sync:
            sync()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--slices", type=int, default=300)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip", nargs="*", default=[], help="methods to skip")
    a = ap.parse_args(argv)
    import torch

    vols = make_volumes(a.n, a.slices, a.size)
    spec = Spec(spacing=1.5)
    plans = [make_plan(v.shape, v.affine, spec) for v in vols]
    in_bytes = sum(v.array.nbytes for v in vols)
    out_bytes = sum(int(np.prod(p.out_shape)) * 4 for p in plans)
    res = {
        "n": a.n,
        "in_shape": vols[0].shape,
        "out_shape": plans[0].out_shape,
        "device": a.device,
        "in_GB": in_bytes / 1e9,
        "out_GB": out_bytes / 1e9,
        "methods": {},
    }
    print(
        f"{a.n} volumes {vols[0].shape} int16 -> {plans[0].out_shape} float32 (1.5 mm)", flush=True
    )

    def record(name, seconds, **extra):
        res["methods"][name] = {
            "seconds": seconds,
            "volumes_per_s": a.n / seconds,
            "effective_GB_per_s": (in_bytes + out_bytes) / seconds / 1e9,
            **extra,
        }
        print(
            f"{name:28s} {seconds:8.3f} s  {a.n / seconds:8.2f} vol/s  "
            f"{(in_bytes + out_bytes) / seconds / 1e9:8.2f} GB/s effective",
            flush=True,
        )

    from medproc.pipeline import Engine, Graph, Job

    def jobs(arrays):
        return [Job(x, p) for x, p in zip(arrays, plans)]

    if a.device == "gpu":
        sync = torch.cuda.synchronize
        dev = torch.device("cuda:0")
        # the machine's copy bandwidth, for reference
        big = torch.empty(in_bytes // 2, dtype=torch.int16, pin_memory=True)
        pageable = torch.empty(in_bytes // 2, dtype=torch.int16)
        t_pin = timeit(lambda: big.to(dev, non_blocking=True), sync=sync)
        t_page = timeit(lambda: pageable.to(dev), sync=sync)
        res["h2d_pinned_GB_per_s"] = in_bytes / t_pin / 1e9
        res["h2d_pageable_GB_per_s"] = in_bytes / t_page / 1e9
        print(
            f"copy bandwidth: pinned {res['h2d_pinned_GB_per_s']:.1f} GB/s, pageable "
            f"{res['h2d_pageable_GB_per_s']:.1f} GB/s",
            flush=True,
        )
        del big, pageable
        pinned = []
        for v in vols:  # pinned, in the volumes' own memory order (i fastest)
            t = torch.empty(v.shape[::-1], dtype=torch.int16, pin_memory=True).permute(2, 1, 0)
            t.numpy()[...] = v.array
            pinned.append(t)
        on_gpu = [t.to(dev) for t in pinned]
        eng = Engine("gpu", batch_size=a.batch)

        def run_medproc(arrays, graph=Graph()):
            outs = []
            for b in eng.map(jobs(arrays), graph, as_torch=True):
                outs += b
            return outs

        t_e2e = timeit(lambda: run_medproc(pinned), a.repeat, sync)
        # the H2D rate the pipeline fed: the copies alone, through the engine's staging code
        from medproc.pipeline.graphs import to_dhwc

        runner = eng._runner(Graph(), jobs(pinned)[:1])
        t_h2d = timeit(lambda: runner._to_device([to_dhwc(t) for t in pinned], {}), a.repeat, sync)
        record(
            "medproc-gpu (end to end)",
            t_e2e,
            h2d_GB_per_s=in_bytes / t_h2d / 1e9,
            fed_GB_per_s=in_bytes / t_e2e / 1e9,
        )
        print(
            f"  H2D through medproc's staging: {in_bytes / t_h2d / 1e9:.1f} GB/s; input fed "
            f"end to end at {in_bytes / t_e2e / 1e9:.1f} GB/s",
            flush=True,
        )
        t_gpu = timeit(lambda: run_medproc(on_gpu), a.repeat, sync)
        record("medproc-gpu (GPU stage)", t_gpu)
        warp = Graph(mode="warp")
        record(
            "medproc-gpu warp (GPU stage)",
            timeit(lambda: run_medproc(on_gpu, warp), a.repeat, sync),
        )
        # check: medproc GPU output == CPU reference grid (one volume)
        if "monai" not in a.skip:
            from monai.data import MetaTensor
            from monai.transforms import Spacing

            sp = Spacing(pixdim=1.5, mode="bilinear", dtype=torch.float32)
            # MONAI's (C, i, j, k) layout, contiguous (its fastest input), the same affine
            mts = [
                MetaTensor(t.contiguous()[None].float(), affine=torch.as_tensor(v.affine))
                for t, v in zip(on_gpu, vols)
            ]
            record(
                "monai-gpu Spacing (GPU stage)",
                timeit(lambda: [sp(m) for m in mts], a.repeat, sync),
            )
            del mts
        if "torch" not in a.skip:
            import torch.nn.functional as F

            contiguous = [t.contiguous() for t in on_gpu]

            def run_torch():
                for t, p in zip(contiguous, plans):
                    F.interpolate(
                        t[None, None].float(),
                        size=p.out_shape,
                        mode="trilinear",
                        align_corners=False,
                    )

            record("torch-gpu interpolate (GPU stage)", timeit(run_torch, a.repeat, sync))
        g = res["methods"]
        res["ratios"] = {
            "medproc GPU stage / monai GPU": g["monai-gpu Spacing (GPU stage)"]["seconds"]
            / g["medproc-gpu (GPU stage)"]["seconds"]
            if "monai-gpu Spacing (GPU stage)" in g
            else None,
            "medproc GPU stage / torch GPU": g["torch-gpu interpolate (GPU stage)"]["seconds"]
            / g["medproc-gpu (GPU stage)"]["seconds"]
            if "torch-gpu interpolate (GPU stage)" in g
            else None,
        }
    else:
        eng = Engine("cpu", batch_size=a.batch)

        def run_cpu():
            for _ in eng.map(jobs([v.array for v in vols]), Graph()):
                pass

        record("medproc-cpu (DALI resize)", timeit(run_cpu, a.repeat))
        if "monai" not in a.skip:
            import torch
            from monai.data import MetaTensor
            from monai.transforms import Spacing

            sp = Spacing(pixdim=1.5, mode="bilinear")
            mts = [
                MetaTensor(
                    torch.from_numpy(np.ascontiguousarray(v.array))[None],
                    affine=torch.as_tensor(v.affine),
                )
                for v in vols
            ]
            record("monai-cpu Spacing", timeit(lambda: [sp(m) for m in mts], a.repeat))
        if "torch" not in a.skip:
            import torch
            import torch.nn.functional as F

            ts = [torch.from_numpy(np.ascontiguousarray(v.array)) for v in vols]
            record(
                "torch-cpu interpolate",
                timeit(
                    lambda: [
                        F.interpolate(t[None, None].float(), size=p.out_shape, mode="trilinear")
                        for t, p in zip(ts, plans)
                    ],
                    a.repeat,
                ),
            )
    if "simpleitk" not in a.skip:
        try:
            import SimpleITK as sitk

            from medproc.io.sitk_io import resample_filter, to_sitk

            imgs = [to_sitk(v) for v in vols]

            def run_sitk():
                for im, p in zip(imgs, plans):
                    resample_filter(p.out_affine, p.out_shape).Execute(im)

            record(
                f"simpleitk ({sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()} threads)",
                timeit(run_sitk, a.repeat),
            )
        except ImportError:
            print("SimpleITK not installed: skipped")
    m = res["methods"]
    base = next((k for k in m if k.startswith("medproc")), None)
    for k in m:
        m[k]["medproc_speedup"] = m[k]["seconds"] / m[base]["seconds"] if base else None
    if a.out:
        from provenance import provenance  # (bench/provenance.py)

        res["provenance"] = provenance()
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return res


if __name__ == "__main__":
    main()
