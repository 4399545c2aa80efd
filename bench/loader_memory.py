"""GPU memory of a PatchLoader alone (no model): the device memory in use (cudaMemGetInfo)
above the idle baseline after the build and at its peak over 60 batches, on bench/loader.py's
data. Run once per setting, each in a fresh process:

    python bench/loader_memory.py host
    DALI_USE_DEVICE_MEM_POOL=0 python bench/loader_memory.py host
    DALI_USE_VMM=0 python bench/loader_memory.py host
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import loader as bench_loader  # noqa: E402
import torch  # noqa: E402


def used() -> float:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("cache", choices=["auto", "gpu", "host"])
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--data", default="/tmp/bench_loader")
    a = ap.parse_args(argv)
    torch.cuda.init()
    base = used()
    dl = bench_loader.dataset(a.data, 24, 512, (150, 250))
    la = argparse.Namespace(
        patch=96, num_samples=4, volumes=2, device="gpu", cache=a.cache, cache_dir=None, workers=12
    )
    pl = bench_loader.make_medproc(dl, la, 8)
    build = used() - base
    it = bench_loader.forever(pl)
    peak = 0.0
    for _ in range(a.batches):
        next(it)
        peak = max(peak, used() - base)
    print(
        f"cache={a.cache} build {build:.2f} GiB, peak over {a.batches} batches {peak:.2f} GiB, "
        f"cases on the GPU {sum(e.on_gpu for e in pl.entries)}",
        flush=True,
    )


if __name__ == "__main__":
    main()
