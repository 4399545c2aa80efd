"""Benchmark: DICOM series -> 1.5 mm -> float32 .nii.gz for a whole folder, medproc convert side
by side with SimpleITK, MONAI and dcm2niix, same inputs, one run.

    python -m medproc.sample_data /tmp/bench_ct --cases 8 --size 512 --slices 150 250
    python bench/convert.py /tmp/bench_ct/dicom --workers 2 --out docs/results/convert_cpu.json

Methods:
- medproc: ``medproc.convert`` (CLI engine): header scan once, native pixels read at their file
  offset, DALI resample (CPU backend, or --device gpu), ISA-L igzip write; ``--workers``
  processes over cases.
- simpleitk: ImageSeriesReader + ResampleImageFilter (linear, 1.5 mm, SimpleITK's own grid
  rule) + WriteImage(.nii.gz), one process (how it is used), and a pool of ``--workers``
  processes (the same parallelism medproc gets).
- monai: LoadImage(PydicomReader) + Spacing(1.5, bilinear) + SaveImage(.nii.gz, float32),
  one process.
- dcm2niix: conversion only (no resampling; int16 output), ``-z y``, one process.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _series_dirs(root):
    return sorted(d for d in glob.glob(os.path.join(root, "*")) if os.path.isdir(d))


def sitk_one(args):
    src, out = args
    import SimpleITK as sitk

    r = sitk.ImageSeriesReader()
    r.SetFileNames(r.GetGDCMSeriesFileNames(src))
    img = r.Execute()
    sp = img.GetSpacing()
    size = [max(1, int(round(n * s / 1.5))) for n, s in zip(img.GetSize(), sp)]
    f = sitk.ResampleImageFilter()
    f.SetOutputOrigin(img.GetOrigin())
    f.SetOutputDirection(img.GetDirection())
    f.SetOutputSpacing((1.5, 1.5, 1.5))
    f.SetSize(size)
    f.SetInterpolator(sitk.sitkLinear)
    f.SetOutputPixelType(sitk.sitkFloat32)
    sitk.WriteImage(f.Execute(img), out)


def monai_one(src, outdir):
    import torch
    from monai.transforms import LoadImage, SaveImage, Spacing

    img = LoadImage(reader="PydicomReader", image_only=True)(src)
    img = Spacing(pixdim=1.5, mode="bilinear")(img[None] if img.ndim == 3 else img)
    SaveImage(
        output_dir=outdir,
        output_postfix="",
        output_ext=".nii.gz",
        output_dtype=torch.float32,
        separate_folder=False,
        print_log=False,
    )(img)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("root", help="folder with one subfolder per DICOM series")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument(
        "--device",
        default=["cpu"],
        nargs="+",
        choices=["cpu", "gpu"],
        help="medproc backends to measure (each a separate run)",
    )
    ap.add_argument("--skip", nargs="*", default=[])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    series = _series_dirs(a.root)
    n = len(series)
    res = {
        "cases": n,
        "workers": a.workers,
        "devices": a.device,
        "cpus": os.cpu_count(),
        "methods": {},
    }
    tmp = tempfile.mkdtemp(prefix="bench_convert_")

    def record(name, seconds, note=""):
        res["methods"][name] = {
            "seconds": seconds,
            "s_per_volume": seconds / n,
            "volumes_per_s": n / seconds,
            "note": note,
        }
        print(
            f"{name:34s} {seconds:7.2f} s  {seconds / n:6.3f} s/volume  {n / seconds:6.2f} volumes/s {note}",
            flush=True,
        )

    import medproc
    from medproc.convert import convert

    for dev in a.device:
        # warm-up outside the timed region, as for SimpleITK's pool below: start the worker
        # processes (imports, DALI pipeline build) on as many cases as there are workers
        ex = (
            ProcessPoolExecutor(a.workers, mp_context=get_context("spawn"))
            if a.workers > 1
            else None
        )
        convert(
            series[: max(1, a.workers)],
            os.path.join(tmp, "warm"),
            medproc.Spec(spacing=1.5),
            workers=a.workers,
            device=dev,
            force=True,
            executor=ex,
        )
        out = os.path.join(tmp, f"medproc_{dev}")
        t = time.perf_counter()
        rows = convert(
            [a.root],
            out,
            medproc.Spec(spacing=1.5),
            workers=a.workers,
            device=dev,
            force=True,
            executor=ex,
        )
        record(f"medproc convert ({a.workers} workers, {dev})", time.perf_counter() - t)
        assert all(r["status"] == "ok" for r in rows), rows
        if ex is not None:
            ex.shutdown()
    if "simpleitk" not in a.skip:
        sitk_one((series[0], os.path.join(tmp, "warm.nii.gz")))
        jobs = [(s, os.path.join(tmp, f"sitk_{i}.nii.gz")) for i, s in enumerate(series)]
        t = time.perf_counter()
        for j in jobs:
            sitk_one(j)
        record("simpleitk (1 process)", time.perf_counter() - t)
        if a.workers > 1:
            with ProcessPoolExecutor(a.workers, mp_context=get_context("spawn")) as ex:
                list(ex.map(sitk_one, jobs[: a.workers]))  # start the workers
                t = time.perf_counter()
                list(ex.map(sitk_one, jobs))
                record(f"simpleitk ({a.workers} processes)", time.perf_counter() - t)
    if "monai" not in a.skip:
        md = os.path.join(tmp, "monai")
        os.makedirs(md, exist_ok=True)
        monai_one(series[0], os.path.join(tmp, "warm_monai"))
        t = time.perf_counter()
        for s in series:
            monai_one(s, md)
        record("monai (1 process)", time.perf_counter() - t)
    exe = shutil.which("dcm2niix")
    if exe and "dcm2niix" not in a.skip:
        dd = os.path.join(tmp, "dcm2niix")
        os.makedirs(dd, exist_ok=True)
        t = time.perf_counter()
        for i, s in enumerate(series):
            subprocess.run(
                [exe, "-z", "y", "-b", "n", "-o", dd, "-f", f"c{i}", s],
                check=True,
                capture_output=True,
            )
        record(
            "dcm2niix (1 process, no resampling)", time.perf_counter() - t, "int16, no resampling"
        )
    m = res["methods"]
    base = min((k for k in m if k.startswith("medproc")), key=lambda k: m[k]["seconds"])
    for k in m:
        m[k]["medproc_speedup"] = m[k]["seconds"] / m[base]["seconds"]
    print({k: round(v["medproc_speedup"], 2) for k, v in m.items()})
    shutil.rmtree(tmp, ignore_errors=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
