"""Benchmark: training-cache formats. The resampled ``.npy`` cache that PatchLoader reads
(memory-mapped regions, shipped raw to the GPU) against a GPU-decodable compressed cache
(each slice one LZ4 block, inflated on the GPU by DALI's ``fn.decoders.inflate``).

    python bench/cache.py --cases 6 --samples 256 --batch 4 [--real lung1.nrrd] --out results.json

Measured for each format and cache dtype (int16 HU as stored without intensity scaling, and
float32 after a CT window, as PatchLoader caches a spec with intensity scaling):

- disk bytes of the cache;
- host->device bytes per sample;
- samples/s delivering a 96^3 patch (and a whole volume) as a CUDA tensor, page cache warm.

A patch touches a box of the volume: the ``.npy`` path reads exactly that box; the LZ4 path
reads the slices the box crosses (a slice is the compression unit), inflates them on the GPU
and crops. Every LZ4 delivery is checked equal to the ``.npy`` one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def make_cases(n: int, real: str | None):
    from medproc.sample_data import Lesion, ct_phantom, grid_affine

    vols = []
    if real:
        import medproc

        # this benchmark stores slices: (k, j, i), the (i, j, k) volume's memory seen C-ordered
        vols.append(("real", medproc.load(real).array.astype(np.int16).transpose(2, 1, 0)))
    for s in range(n - len(vols)):
        shape = (256, 256, 200 + 10 * s)  # a CT resampled to ~1.5 mm
        aff = grid_affine(shape, (1.5, 1.5, 1.5), (-190.0, -190.0, -150.0))
        img, _ = ct_phantom(shape, aff, [Lesion((10.0 * s, 20.0, 0.0), 12.0)], seed=s)
        vols.append((f"phantom{s}", img.transpose(2, 1, 0)))
    return vols


def write_lz4(arr: np.ndarray, path: str) -> dict:
    import lz4.block

    blocks = [
        lz4.block.compress(np.ascontiguousarray(sl).tobytes(), store_size=False) for sl in arr
    ]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blocks])]).astype(np.int64)
    with open(path, "wb") as f:
        for b in blocks:
            f.write(b)
    return {"path": path, "offsets": offsets, "shape": arr.shape, "dtype": arr.dtype}


def inflate_pipe(dtype, batch: int):
    from nvidia.dali import fn, pipeline_def, types

    dali_t = {np.dtype(np.int16): types.INT16, np.dtype(np.float32): types.FLOAT}[np.dtype(dtype)]

    @pipeline_def(
        batch_size=batch, num_threads=4, device_id=0, exec_dynamic=True, prefetch_queue_depth=1
    )
    def graph():
        data = fn.external_source(name="data", dtype=types.UINT8)
        sizes = fn.external_source(name="sizes", dtype=types.INT32)
        shape = fn.external_source(name="shape", dtype=types.INT32)
        return fn.decoders.inflate(
            data.gpu(), chunk_sizes=sizes, shape=shape, dtype=dali_t, algorithm="LZ4"
        )

    p = graph()
    p.build()
    return p


def boxes(vols, n, patch, rng):
    out = []
    for _ in range(n):
        v = int(rng.integers(len(vols)))
        shape = np.array(vols[v]["npy"].shape)
        lo = np.array([rng.integers(0, max(1, s - patch + 1)) for s in shape])
        out.append((v, tuple(slice(a, a + min(patch, s)) for a, s in zip(lo, shape))))
    return out


def run_npy(vols, work, batch):
    import torch

    nbytes = 0
    out = None
    for b in range(0, len(work), batch):
        out = []
        for v, box in work[b : b + batch]:
            region = np.ascontiguousarray(vols[v]["npy"][box])
            nbytes += region.nbytes
            out.append(torch.from_numpy(region).pin_memory().cuda(non_blocking=True))
    torch.cuda.synchronize()
    return nbytes, out


def run_lz4(vols, work, batch, pipe):
    import torch
    from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

    nbytes = 0
    out = None
    for b in range(0, len(work), batch):
        chunk = work[b : b + batch]
        data, sizes, shapes = [], [], []
        for v, box in chunk:
            z = vols[v]["lz4"]
            k0, k1 = box[0].start, box[0].stop
            with open(z["path"], "rb") as f:  # the slices the box crosses: one contiguous read
                f.seek(int(z["offsets"][k0]))
                buf = f.read(int(z["offsets"][k1] - z["offsets"][k0]))
            nbytes += len(buf)
            data.append(np.frombuffer(buf, np.uint8))
            sizes.append(np.diff(z["offsets"][k0 : k1 + 1]).astype(np.int32))
            shapes.append(np.array(z["shape"][1:], np.int32))
        pipe.feed_input("data", data)
        pipe.feed_input("sizes", sizes)
        pipe.feed_input("shape", shapes)
        (res,) = pipe.run()
        out = []
        for i, (_v, box) in enumerate(chunk):
            t = res[i]
            dst = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device="cuda")
            feed_ndarray(t, dst, cuda_stream=torch.cuda.current_stream())
            out.append(dst[:, box[1], box[2]])
    torch.cuda.synchronize()
    return nbytes, out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--patch", type=int, default=96)
    ap.add_argument(
        "--real", help="a real CT (e.g. pyradiomics lung1_image.nrrd) as one of the cases"
    )
    ap.add_argument("--work", default=None)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    import torch

    work_dir = a.work or tempfile.mkdtemp(prefix="medproc_cache_bench_")
    cases = make_cases(a.cases, a.real)
    res = {
        "cases": [[n, list(x.shape)] for n, x in cases],
        "patch": a.patch,
        "batch": a.batch,
        "formats": {},
    }
    for kind in ("int16", "float32"):
        vols = []
        for name, img in cases:
            arr = (
                img if kind == "int16" else (np.clip(img, -1000, 1000) / 1000.0).astype(np.float32)
            )
            p = os.path.join(work_dir, f"{name}_{kind}")
            np.save(p + ".npy", arr)
            z = write_lz4(arr, p + ".lz4")
            vols.append({"npy": np.load(p + ".npy", mmap_mode="r"), "lz4": z})
        disk_npy = sum(os.path.getsize(v["lz4"]["path"][:-4] + ".npy") for v in vols)
        disk_lz4 = sum(os.path.getsize(v["lz4"]["path"]) for v in vols)
        pipe = inflate_pipe(arr.dtype, a.batch)
        rng = np.random.default_rng(0)
        row = {
            "disk_MB_npy": disk_npy / 1e6,
            "disk_MB_lz4": disk_lz4 / 1e6,
            "lz4_ratio": disk_npy / disk_lz4,
        }
        whole = [
            (i % len(vols), tuple(slice(0, n) for n in vols[i % len(vols)]["npy"].shape))
            for i in range(4 * len(vols))
        ]
        for scen, work in (("patch", boxes(vols, a.samples, a.patch, rng)), ("volume", whole)):
            # equal outputs (first batch), warm-up and page cache
            _, ref = run_npy(vols, work[: a.batch], a.batch)
            _, got = run_lz4(vols, work[: a.batch], a.batch, pipe)
            for r, g in zip(ref, got):
                assert torch.equal(r, g), "LZ4 inflate differs from the .npy cache"
            t = time.perf_counter()
            b_npy, _ = run_npy(vols, work, a.batch)
            t_npy = time.perf_counter() - t
            t = time.perf_counter()
            b_lz4, _ = run_lz4(vols, work, a.batch, pipe)
            t_lz4 = time.perf_counter() - t
            n = len(work)
            row[scen] = {
                "samples": n,
                "npy_samples_per_s": n / t_npy,
                "lz4_samples_per_s": n / t_lz4,
                "lz4_vs_npy": t_npy / t_lz4,
                "h2d_MB_per_sample_npy": b_npy / n / 1e6,
                "h2d_MB_per_sample_lz4": b_lz4 / n / 1e6,
            }
        res["formats"][kind] = row
        print(kind, json.dumps(row), flush=True)
    if a.out:
        from provenance import provenance  # (bench/provenance.py)

        res["provenance"] = provenance()
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
