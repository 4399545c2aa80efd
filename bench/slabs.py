"""Benchmark: one CT resampled on DALI's CPU backend as 1..N slabs (``medproc/pipeline/slabs.py``),
with 1 and with 2+ threads: wall time, CPU time and page faults per run (median of
``--repeats``, after one warm-up run each). What ``slabs.MIN_SLICES`` was chosen from.

    python -m medproc.sample_data /tmp/bench_ct --cases 1 --size 512 --slices 143 143
    python bench/slabs.py /tmp/bench_ct/dicom/case000 --threads 1 2

The slab count is forced (``slabs.slab_count`` replaced) so that every count runs on the same
volume; ``default`` is the engine's own choice.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import medproc  # noqa: E402
from medproc.pipeline import slabs  # noqa: E402
from medproc.resample import resample_batch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("series", help="a DICOM series folder or a volume file")
    ap.add_argument("--spacing", type=float, default=1.5)
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    vol = medproc.load(a.series)
    spec = medproc.Spec(spacing=a.spacing)
    default = slabs.slab_count
    out = medproc.make_plan(vol.shape, vol.affine, spec).out_shape
    print(f"{vol.shape} {vol.array.dtype} -> {out} float32; the engine's own cut: {default(out)}")
    for threads in a.threads:
        for count in [*a.counts, "default"]:
            slabs.slab_count = default if count == "default" else (lambda s, c=count: c)
            resample_batch([vol], spec, num_threads=threads)  # warm-up
            wall, cpu, faults = [], [], []
            for _ in range(a.repeats):
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                c0, t0 = time.process_time(), time.perf_counter()
                resample_batch([vol], spec, num_threads=threads)
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            print(
                f"threads {threads}  slabs {count!s:>7}  wall {statistics.median(wall):.3f} s  "
                f"cpu {statistics.median(cpu):.3f} s  page faults {int(statistics.median(faults))}"
            )
    slabs.slab_count = default


if __name__ == "__main__":
    main()
