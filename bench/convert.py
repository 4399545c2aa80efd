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

Whole processes (``--whole-process``), as a user runs them, start-up included: ``medproc
convert`` as a subprocess (``python -m medproc convert``, i.e. the ``medproc`` command, of
the checkout given by ``--medproc-root``, default this one) and a SimpleITK script doing the same
job (DICOM -> 1.5 mm linear -> float32 .nii.gz, one series after the other), on the first 1 and
4 series (``--counts``), ``--repeats`` times each (median and min), with ``-j`` from ``--jobs``
(numbers or ``auto``; default ``1 2 auto``):

    python bench/convert.py /tmp/bench_ct/dicom --whole-process --skip inprocess
    python bench/convert.py /tmp/bench_ct/dicom --whole-process --skip inprocess --ext nii

(``--ext nii``: both tools write uncompressed NIfTI, the same work: ITK's NIfTI writer gzips at
zlib's default level whatever it is asked, medproc with igzip at level 1, faster and ~15-30%
larger; the bytes each wrote are recorded.)

Per-stage breakdown of one case (``--stages``), in-process with the public functions: scan
(find_series), read/decode (read_series), host -> device (Volume.to), resample (resample_batch,
pipeline built beforehand), device -> host (Volume.numpy), compress (NIfTI bytes + igzip) and
write (atomic), each the median of ``--repeats`` runs, for every ``--device``:

    python bench/convert.py /tmp/bench_ct/dicom --stages --skip inprocess --device cpu gpu
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _series_dirs(root):
    return sorted(d for d in glob.glob(os.path.join(root, "*")) if os.path.isdir(d))


def sitk_one(args):
    """SimpleITK in this process: ``(series_dir, out_path)`` (bench/sitk_convert.py)."""
    from sitk_convert import convert_one

    convert_one(*args)


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


SITK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sitk_convert.py")


def _timed_run(cmd, cwd, env=None) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {r.returncode}: {r.stderr[-2000:]}")
    return dt


def whole_process(
    series, counts, jobs, repeats, medproc_root, tmp, devices=("cpu",), serial=True, ext="nii.gz"
) -> dict:
    """Wall seconds of whole processes (start-up included): medproc convert vs a SimpleITK
    script, on the first ``n`` series for each n in ``counts``, both writing ``ext``; and the
    bytes each wrote."""
    script = SITK_SCRIPT
    py = sys.executable
    # byte-compiled, as an installed package is (pip compiles at install; a checkout run with
    # PYTHONDONTWRITEBYTECODE would otherwise compile medproc in every process)
    subprocess.run(
        [py, "-m", "compileall", "-q", os.path.join(medproc_root, "medproc")], check=True
    )
    out: dict = {"startup": {}, "runs": {}}
    for name, code in (
        ("python -c pass", "pass"),
        ("import medproc.cli", "import medproc.cli"),
        ("import nvidia.dali", "import nvidia.dali"),
        ("import SimpleITK", "import SimpleITK"),
    ):
        ts = [_timed_run([py, "-c", code], medproc_root) for _ in range(repeats)]
        out["startup"][name] = min(ts)
        print(f"start-up  {name:28s} {min(ts):6.2f} s (min of {repeats})", flush=True)
    for n in counts:
        dirs = series[:n]
        cores = os.cpu_count() or 1
        runs = (
            {
                "simpleitk script": lambda d, dirs=dirs: [
                    py,
                    script,
                    d,
                    "1",
                    f"--ext={ext}",
                    *dirs,
                ],
            }
            if serial
            else {}
        )
        runs |= {
            f"simpleitk script, {cores} processes": lambda d, dirs=dirs, cores=cores: [
                py,
                script,
                d,
                str(cores),
                f"--ext={ext}",
                *dirs,
            ],  # fmt: skip
        }
        if cores > 1:  # the pool with ITK's threads shared out (cores / processes running)
            runs[f"simpleitk script, {cores} processes, ITK threads shared out"] = (
                lambda d, dirs=dirs, cores=cores: [
                    py,
                    script,
                    d,
                    str(cores),
                    f"--ext={ext}",
                    "--itk-threads=auto",
                    *dirs,
                ]  # fmt: skip
            )
        mine = []
        for dev in devices:
            for j in jobs:
                label = f"medproc convert -j {j}" + (f" --device {dev}" if dev != "cpu" else "")
                mine.append(label)
                runs[label] = lambda d, j=j, dirs=dirs, dev=dev: [
                    py, "-m", "medproc", "convert", *dirs, "-o", d, "--spacing", "1.5",
                    "-j", str(j), "--device", dev, "--format", ext,
                ]  # fmt: skip
        for label, make in runs.items():
            ts, size = [], 0
            for r in range(repeats):
                d = os.path.join(tmp, f"wp_{n}_{len(out['runs'])}_{r}")
                os.makedirs(d)
                ts.append(_timed_run(make(d), medproc_root))
                size = sum(  # the volumes written (not medproc's sidecars and manifest)
                    os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(ext)
                )
                shutil.rmtree(d, ignore_errors=True)
            key = f"{n} series: {label}"
            out["runs"][key] = {
                "median_s": statistics.median(ts),
                "min_s": min(ts),
                "all_s": ts,
                "output_bytes": size,
            }
            print(
                f"{key:40s} median {statistics.median(ts):6.2f} s  min {min(ts):6.2f} s  "
                f"{size / 1e6:7.1f} MB written",
                flush=True,
            )
        best = min(  # the anchor at its best: one process or a pool, whichever is faster
            out["runs"][f"{n} series: {k}"]["median_s"] for k in runs if k.startswith("simpleitk")
        )
        for label in mine:
            m = out["runs"][f"{n} series: {label}"]["median_s"]
            print(
                f"{n} series, {label}: {best / m:.2f}x SimpleITK at its best (medians)",
                flush=True,
            )
    return out


def stage_breakdown(series_dir, device, repeats, tmp) -> dict:
    """Seconds per stage of one case, in-process with the public functions (median of
    ``repeats``; the resample pipeline is built first and its build time reported apart)."""
    from isal import igzip

    import medproc
    from medproc.io import atomic_write
    from medproc.io.dicom_read import read_series
    from medproc.io.dicom_scan import find_series
    from medproc.io.nifti import to_nibabel

    gpu = device == "gpu"
    if gpu:
        import torch

    def sync():
        if gpu:
            torch.cuda.synchronize()

    spec = medproc.Spec(spacing=1.5)
    path = os.path.join(tmp, f"stages_{device}.nii.gz")
    times: dict[str, list] = {}

    def timed(name, fn):
        sync()
        t = time.perf_counter()
        res = fn()
        sync()
        times.setdefault(name, []).append(time.perf_counter() - t)
        return res

    t = time.perf_counter()
    series, _ = find_series([series_dir])
    vol = read_series(series[0])
    medproc.resample_batch([vol.to("gpu") if gpu else vol], spec, device=device)
    sync()
    first = time.perf_counter() - t
    for _ in range(repeats):
        series, _ = timed("scan (headers)", lambda: find_series([series_dir]))
        host = timed("read/decode", lambda s=series[0]: read_series(s))
        dev = timed("host -> device", lambda h=host: h.to("gpu")) if gpu else host
        (out,) = timed("resample", lambda v=dev: medproc.resample_batch([v], spec, device=device))
        out_h = timed("device -> host", lambda o=out: o.numpy()) if gpu else out
        gz = timed(
            "compress (NIfTI bytes + igzip)",
            lambda o=out_h: igzip.compress(to_nibabel(o).to_bytes(), compresslevel=1),
        )

        def write(gz=gz):
            with atomic_write(path) as tmp_path, open(tmp_path, "wb") as f:
                f.write(gz)

        timed("write (atomic)", write)
        timed("save() end to end (check)", lambda o=out_h: medproc.save(o, path))
    res = {k: statistics.median(v) for k, v in times.items()}
    total = sum(v for k, v in res.items() if "check" not in k)
    mb = host.array.nbytes / 1e6
    print(f"\nper-stage breakdown, device={device}: {os.path.basename(series_dir)} {host.shape} "
          f"{host.dtype} ({mb:.0f} MB in, {out_h.array.nbytes / 1e6:.0f} MB out), median of {repeats}")  # fmt: skip
    print(f"  first pass incl. imports + pipeline build: {first:6.3f} s")
    for k, v in res.items():
        share = "" if "check" in k else f"{100 * v / total:5.1f}%"
        print(f"  {k:34s} {v:7.3f} s {share}")
        if k == "read/decode" and not gpu:
            print(
                f"  {'host -> device, device -> host':34s}     n/a (DALI's CPU backend reads host memory)"
            )
    print(f"  {'sum of stages':34s} {total:7.3f} s; slowest: {max(res, key=lambda k: -1 if 'check' in k else res[k])}")  # fmt: skip
    return {"first_pass_s": first, "stages_s": res, "sum_s": total}


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
    ap.add_argument(
        "--skip", nargs="*", default=[], help="of inprocess, simpleitk, monai, dcm2niix"
    )
    ap.add_argument("--whole-process", action="store_true", help="time whole processes too")
    ap.add_argument("--stages", action="store_true", help="per-stage breakdown of one case")
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 4], help="series per run")
    ap.add_argument("--jobs", nargs="+", default=["1", "2", "auto"], help="medproc -j values")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--no-sitk-serial",
        action="store_true",
        help="whole processes: leave out SimpleITK in one process (when its pool is surely faster)",
    )
    ap.add_argument(
        "--ext",
        default="nii.gz",
        choices=["nii.gz", "nii"],
        help="whole processes: what both tools write (nii: the same work, no gzip: ITK's "
        "NIfTI writer gzips at zlib's default level, medproc with igzip at level 1)",
    )
    ap.add_argument("--medproc-root", default=ROOT, help="checkout whose medproc is run")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    series = _series_dirs(a.root)
    n = len(series)
    from provenance import provenance  # (bench/provenance.py)

    res = {
        "provenance": provenance(argv, os.path.abspath(a.medproc_root)),
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

    if "inprocess" not in a.skip:
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
                from sitk_convert import set_threads

                # ITK's default threads (every core in each process), then one each: the
                # faster is SimpleITK at its best
                for threads, label in ((0, ""), (1, ", 1 ITK thread each")):
                    with ProcessPoolExecutor(
                        a.workers,
                        mp_context=get_context("spawn"),
                        initializer=set_threads,
                        initargs=(threads,),
                    ) as ex:
                        list(ex.map(sitk_one, jobs[: a.workers]))  # start the workers
                        t = time.perf_counter()
                        list(ex.map(sitk_one, jobs))
                        record(f"simpleitk ({a.workers} processes{label})", time.perf_counter() - t)
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
                "dcm2niix (1 process, no resampling)",
                time.perf_counter() - t,
                "int16, no resampling",
            )
    if a.whole_process:
        res["whole_process"] = whole_process(
            series,
            a.counts,
            a.jobs,
            a.repeats,
            os.path.abspath(a.medproc_root),
            tmp,
            a.device,
            serial=not a.no_sitk_serial,
            ext=a.ext,
        )
    if a.stages:
        res["stages"] = {d: stage_breakdown(series[0], d, a.repeats, tmp) for d in a.device}
    m = res["methods"]
    if m:
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
