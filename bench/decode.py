"""Benchmark: decoding compressed CT series, GPU (DALI / nvImageCodec) against the CPU
(pylibjpeg plugins through pydicom, in a pool over all cores), same frames.

    python scripts/make_decode_data.py /tmp/dec --slices 100 --series 4 --only j2k jpegll
    python bench/decode.py /tmp/dec --out results.json [--load]

Both sides start from the encapsulated frames in memory (file reading is the same for both and
left out). GPU: batches of 64 frames through the proven configuration of the support table;
encodings without one are reported as "CPU fallback". CPU: pydicom's decoder (pylibjpeg-openjpeg
for JPEG 2000, pylibjpeg-libjpeg for JPEG lossless) in a process pool of ``--workers``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(path):
    import pydicom
    from pydicom.encaps import generate_frames

    ds = pydicom.dcmread(path)
    return list(generate_frames(ds.PixelData, number_of_frames=1))[0]


_FRAMES: list = []  # the encoded frames, set before the pool forks: in every worker, not sent


def _cpu_decode(args):
    ts, rows, cols, bits, signed, which = args
    from pydicom.encaps import encapsulate
    from pydicom.pixels.decoders.base import get_decoder
    from pydicom.uid import UID

    dec = get_decoder(ts)
    n = 0
    for f in (_FRAMES[i] for i in which):
        arr, _ = dec.as_array(
            encapsulate([f]),
            rows=rows,
            columns=cols,
            samples_per_pixel=1,
            bits_allocated=16,
            bits_stored=bits,
            pixel_representation=int(signed),
            photometric_interpretation="MONOCHROME2",
            number_of_frames=1,
            transfer_syntax_uid=UID(ts),
        )
        n += arr.size > 0
    return n


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _sitk_read(d):
    import SimpleITK as sitk

    r = sitk.ImageSeriesReader()
    r.SetFileNames(r.GetGDCMSeriesFileNames(d))
    return sitk.GetArrayFromImage(r.Execute()).transpose(2, 1, 0)  # (i, j, k) as medproc


def _medproc_serial(d):
    import medproc

    return medproc.load(d, workers=1).array


def _noop(_):
    return None


def _read_in_pool(job):
    """A pool worker's series: only the first comes back whole (checked against the
    reference); the others' arrays stay in the worker, as a script writing them there would."""
    tool, d, whole = job
    arr = (_sitk_read if tool == "simpleitk_pool" else _medproc_serial)(d)
    return arr if whole else arr.shape


def _time_loads(series_dirs: list[str], workers: int) -> dict:
    """Seconds per series to load from disk (file reading included), the same series for each
    tool, each tool in its best layouts on these cores: one process decoding each series in
    turn (medproc's own decode pool, or serially; SimpleITK), and a pool of ``workers``
    processes, one series each (SimpleITK's best for a set of series, as the project's rule
    asks; medproc decoding serially in each)."""
    from concurrent.futures import ProcessPoolExecutor

    import numpy as np
    import SimpleITK as sitk  # noqa: F401  (imported before the pools fork)

    import medproc

    out: dict = {}
    ref = medproc.load(series_dirs[0], workers=1).array  # the serial read is the reference
    in_turn = {
        "medproc_serial": _medproc_serial,
        "medproc_pool": lambda d: medproc.load(d).array,
        "simpleitk": _sitk_read,
    }
    pooled = ("medproc_serial_in_pool", "simpleitk_pool")
    for tool in (*in_turn, *pooled):
        try:
            if tool in in_turn:
                fn = in_turn[tool]
                fn(series_dirs[0])  # warm-up (medproc's decode pool starts)
                t = time.perf_counter()
                arrays = [fn(d) for d in series_dirs]
            else:
                with ProcessPoolExecutor(workers) as ex:
                    list(ex.map(_noop, range(workers)))  # (started before the clock)
                    t = time.perf_counter()
                    jobs = [(tool, d, n == 0) for n, d in enumerate(series_dirs)]
                    arrays = list(ex.map(_read_in_pool, jobs))
            out[f"{tool}_s_per_series"] = (time.perf_counter() - t) / len(series_dirs)
            out[f"{tool}_equal"] = bool(np.array_equal(arrays[0], ref))
        except Exception as e:  # noqa: BLE001 - a tool that cannot read this syntax
            out[f"{tool}_s_per_series"] = (
                f"cannot: {type(e).__name__}: {str(e).strip().splitlines()[-1][:100]}"
            )
    times = {k[: -len("_s_per_series")]: v for k, v in out.items() if k.endswith("_s_per_series")}
    ok = {k: v for k, v in times.items() if isinstance(v, float)}
    mine = {k: v for k, v in ok.items() if k.startswith("medproc")}
    theirs = {k: v for k, v in ok.items() if k.startswith("simpleitk")}
    if "medproc_pool" in ok and "medproc_serial" in ok:
        out["pool_vs_serial"] = ok["medproc_serial"] / ok["medproc_pool"]
    if mine and theirs:  # best against best, this run
        bm, bs = min(mine, key=mine.get), min(theirs, key=theirs.get)
        out.update(medproc_best=bm, simpleitk_best=bs, best_vs_best=theirs[bs] / mine[bm])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument(
        "--gpu",
        nargs="*",
        default=["64x4", "128x8", "256x12"],
        help="GPU settings tried, BATCHxTHREADS; the best is reported",
    )
    ap.add_argument(
        "--load",
        action="store_true",
        help="also time whole-series loads from disk: medproc.load serial, with its decode "
        "pool, and serially in a pool of --workers processes (a series each), against "
        "SimpleITK's ImageSeriesReader (GDCM) in one process and in such a pool",
    )
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    import pydicom

    import medproc.pipeline.decode as dec

    res = {"workers": a.workers, "syntaxes": {}}
    for name in sorted(os.listdir(a.root)):
        series = sorted(glob.glob(os.path.join(a.root, name, "*")))
        paths = [p for s in series for p in sorted(glob.glob(os.path.join(s, "*.dcm")))]
        ds = pydicom.dcmread(paths[0], stop_before_pixels=True)
        info = dec.encoding_info(ds)
        frames = [_load(p) for p in paths]
        n = len(frames)
        per_series = n / len(series)
        row = {
            "transfer_syntax": ds.file_meta.TransferSyntaxUID.name,
            "frames": n,
            "rows": int(ds.Rows),
            "compressed_MB": sum(len(f) for f in frames) / 1e6,
        }
        # the frames reach the workers by fork, before the clock (the GPU side also starts
        # from frames in memory); each worker gets the indices of its share
        _FRAMES[:] = frames
        chunks = [list(range(i, n, a.workers)) for i in range(a.workers)]
        args = [
            (
                info["TransferSyntaxUID"],
                int(ds.Rows),
                int(ds.Columns),
                int(ds.BitsStored),
                bool(int(ds.PixelRepresentation)),
                c,
            )
            for c in chunks
        ]
        with ProcessPoolExecutor(a.workers, mp_context=get_context("fork")) as ex:
            list(
                ex.map(_cpu_decode, [(x[0], x[1], x[2], x[3], x[4], x[5][:1]) for x in args])
            )  # warm-up
            t = time.perf_counter()
            assert sum(ex.map(_cpu_decode, args)) == n
            cpu = time.perf_counter() - t
        row["cpu_slices_per_s"] = n / cpu
        row["cpu_series_per_s"] = n / cpu / per_series
        cfg = dec.gpu_config(info)
        if cfg is None:
            row["gpu"] = "not proven bit-exact: CPU fallback"
        elif not _has_gpu():
            row["gpu"] = "no GPU on this machine"
        else:
            import torch

            bits, signed = int(ds.BitsStored), bool(int(ds.PixelRepresentation))
            tried = {}
            for setting in a.gpu:
                bs, th = (int(x) for x in setting.split("x"))
                dec.decode_frames_gpu(
                    frames[:bs], cfg, bits, signed, batch_size=bs, num_threads=th
                )  # warm-up
                torch.cuda.synchronize()
                t = time.perf_counter()
                out = dec.decode_frames_gpu(
                    frames, cfg, bits, signed, batch_size=bs, num_threads=th
                )
                torch.cuda.synchronize()
                tried[setting] = time.perf_counter() - t
                assert len(out) == n
                del out
            best = min(tried, key=tried.get)
            gpu = tried[best]
            row.update(
                gpu_slices_per_s=n / gpu,
                gpu_series_per_s=n / gpu / per_series,
                gpu_vs_cpu=cpu / gpu,
                gpu_config=cfg,
                gpu_setting=best,
                gpu_slices_per_s_by_setting={k: n / v for k, v in tried.items()},
            )
        if a.load:
            row["load"] = _time_loads(
                [
                    os.path.join(a.root, name, x)
                    for x in sorted(os.listdir(os.path.join(a.root, name)))
                ],
                a.workers,
            )
        res["syntaxes"][name] = row
        print(name, json.dumps(row), flush=True)
    if a.out:
        from provenance import provenance  # (bench/provenance.py)

        res["provenance"] = provenance()
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
