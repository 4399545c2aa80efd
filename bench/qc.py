"""Benchmark: the QC picture (``medproc.qc.qc_figure``) per case on the bundled sample data.

    python bench/qc.py [--repeats 20] [--out docs/results/qc_cpu2core.json]

Each of the four bundled cases (ct_axial and ct_oblique with their lesions from lesions.csv,
case001/case002 with their label maps) is loaded and converted to 1.5 mm RAS once, outside the
timed region, as ``medproc convert --qc`` does before drawing. Then ``qc_figure`` writes the PNG:
the first call in the process (``cold``: matplotlib import, fonts, text rendering) and
``--repeats`` further calls (``warm``: what every later case of a batch costs). Wall-clock and
CPU seconds are reported (CPU time is less sensitive to other load on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _cases(sample: str):
    import medproc
    from medproc.annotations import read_luna_csv

    table = read_luna_csv(os.path.join(sample, "lesions.csv"))
    spec = medproc.Spec(spacing=1.5, orientation="RAS")
    for series in ("ct_axial", "ct_oblique"):
        v = medproc.load(os.path.join(sample, "dicom", series))
        les = table[v.meta["series_uid"]]
        (out,) = medproc.resample_batch([v], spec)
        yield series, (v, out, None, None, list(zip(les.centers, les.diameters)))
    for name in ("case001", "case002"):
        v = medproc.load(os.path.join(sample, "nifti", "images", f"{name}.nii.gz"))
        lab = medproc.load(os.path.join(sample, "nifti", "labels", f"{name}.nii.gz"))
        ((out, out_lab),) = medproc.resample_batch([v], spec, labels=[lab])
        yield name, (v, out, lab, out_lab, [])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sample", default=os.path.join(ROOT, "sample_data"))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None, help="write the results as JSON")
    a = ap.parse_args(argv)
    cases = dict(_cases(a.sample))
    t0 = time.perf_counter()
    from medproc.qc import qc_figure

    import_s = time.perf_counter() - t0
    tmp = tempfile.mkdtemp(prefix="bench_qc_")
    res = {"cpus": os.cpu_count(), "import_s": import_s, "cases": {}}
    print(f"import medproc.qc: {import_s:.3f} s")
    print(
        f"{'case':12s} {'cold s':>8s} {'warm s (median)':>16s} {'warm s (max)':>13s} {'CPU s':>7s}"
    )
    for name, (v, out, lab, out_lab, lesions) in cases.items():
        path = os.path.join(tmp, f"{name}.png")
        t = time.perf_counter()
        qc_figure(v, out, path, lab, out_lab, lesions=lesions, title=name)
        cold = time.perf_counter() - t
        walls, cpus = [], []
        for _ in range(a.repeats):
            t, c = time.perf_counter(), time.process_time()
            qc_figure(v, out, path, lab, out_lab, lesions=lesions, title=name)
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        r = {
            "cold_s": cold,
            "warm_median_s": statistics.median(walls),
            "warm_max_s": max(walls),
            "warm_cpu_median_s": statistics.median(cpus),
            "png_bytes": os.path.getsize(path),
        }
        res["cases"][name] = r
        print(
            f"{name:12s} {cold:8.3f} {r['warm_median_s']:16.3f} {r['warm_max_s']:13.3f} "
            f"{r['warm_cpu_median_s']:7.3f}",
            flush=True,
        )
    if a.out:
        from provenance import provenance  # (bench/provenance.py)

        res["provenance"] = provenance()
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
