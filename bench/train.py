"""Benchmark: a real training loop fed by medproc's PatchLoader, by MONAI's tuned recipe, and by
batches already on the GPU (the limit the model allows) (issue #17).

    python bench/train.py --out train_h200.json                                        # H200
    python bench/train.py --device cpu --cases 3 --size 128 --patch 32 --small --steps 4  # CPU

The loop: MONAI ``UNet(channels=(32, 64, 128, 256, 320), strides=(2, 2, 2, 2),
num_res_units=2)``, ``DiceCELoss(to_onehot_y=True, softmax=True)``, Adam, AMP (float16 autocast
+ GradScaler on the GPU), ``--batch`` patches of ``--patch``³ per step, ``loss.item()`` every
step (as training scripts log it). The data task is bench/loader.py's (pos/neg 1:1, background
where the windowed image > 0, random flips; 4 patches per volume).

(a) limit: ``--limit-batches`` batches made once, kept on the GPU, cycled: no data work at all.
(b) medproc: ``PatchLoader`` (cache on the GPU, batches made ahead in the engine's thread).
(c) monai-tuned: CacheDataset + FgBgToIndicesd + EnsureTyped(cuda), copy_cache=False, then
    RandCropByPosNegLabeld(fg/bg indices) + RandFlipd on the GPU, ThreadDataLoader.

Reported: steps/s (after ``--warmup`` steps), % of the limit's steps/s, data wait (time blocked
in ``next(loader)``) as a fraction of step time, mean GPU utilisation (sampled every 50 ms with
``torch.cuda.utilization()``, else ``nvidia-smi``), peak GPU memory (cudaMemGetInfo above the
idle baseline, the model's share included; ``loader_GiB`` = peak minus the limit run's peak).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import loader as bench_loader  # noqa: E402  (bench/loader.py: data, MONAI chains, memory)
import torch  # noqa: E402

CUDA = torch.cuda.is_available()


class GpuUtil:
    """Mean GPU utilisation (%), sampled every 50 ms."""

    def __init__(self, on: bool):
        self.samples: list[float] = []
        self.on = on and CUDA
        if not self.on:
            return
        self._read = self._reader()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    @staticmethod
    def _reader():
        try:
            torch.cuda.utilization()
            return lambda: float(torch.cuda.utilization())
        except Exception:  # noqa: BLE001 - no pynvml: ask nvidia-smi
            if shutil.which("nvidia-smi") is None:
                return None
            dev = str(torch.cuda.current_device())
            cmd = [
                "nvidia-smi",
                "-i",
                dev,
                "--query-gpu=utilization.gpu",
                "--format=csv,noheader,nounits",
            ]
            return lambda: float(subprocess.check_output(cmd, text=True).strip().splitlines()[0])

    def _run(self):
        while self._read is not None and not self._stop.is_set():
            try:
                self.samples.append(self._read())
            except Exception:  # noqa: BLE001
                return
            time.sleep(0.05)

    def stop(self) -> float:
        if not self.on:
            return float("nan")
        self._stop.set()
        self._t.join()
        return sum(self.samples) / len(self.samples) if self.samples else float("nan")


def make_net(small: bool):
    from monai.networks.nets import UNet

    torch.manual_seed(0)
    channels = (8, 16, 32, 64, 64) if small else (32, 64, 128, 256, 320)
    return UNet(
        spatial_dims=3,
        in_channels=1,
        out_channels=2,
        channels=channels,
        strides=(2, 2, 2, 2),
        num_res_units=2,
    )


def train(name: str, make_loader, a, limit_peak: float | None = None) -> dict:
    """``--warmup`` + ``--steps`` steps of the loop on batches from ``make_loader()``."""
    from monai.losses import DiceCELoss

    gpu = CUDA and a.device == "gpu"
    dev = torch.device("cuda" if gpu else "cpu")
    mem = bench_loader.GpuMemory(a.device)
    t0 = time.perf_counter()
    loader = make_loader()
    build = time.perf_counter() - t0
    build_peak = mem.mark() if mem.on else float("nan")
    net = make_net(a.small).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    scaler = torch.amp.GradScaler("cuda", enabled=gpu)
    it = bench_loader.forever(loader)
    wait = 0.0
    util = None
    losses = []
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            bench_loader.sync(a.device)
            util = GpuUtil(gpu)
            warm_peak = mem.mark() if mem.on else float("nan")
            wait = 0.0
            t = time.perf_counter()
        w = time.perf_counter()
        batch = next(it)
        while batch["image"].shape[0] < a.batch:  # an epoch's last, partial batch: skipped
            batch = next(it)
        img, lab = batch["image"], batch["label"]
        img = img.as_tensor() if hasattr(img, "as_tensor") else img
        lab = lab.as_tensor() if hasattr(lab, "as_tensor") else lab
        img = img.to(dev, non_blocking=True)
        lab = (lab.to(dev, non_blocking=True) > 0).long()
        wait += time.perf_counter() - w
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.float16, enabled=gpu):
            loss = loss_fn(net(img), lab)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    bench_loader.sync(a.device)
    elapsed = time.perf_counter() - t
    out = {
        "steps_per_s": a.steps / elapsed,
        "data_wait_fraction": wait / elapsed,
        "mean_gpu_util_pct": util.stop(),
        "loop_peak_GiB": mem.mark() if mem.on else float("nan"),
        "build_peak_GiB": build_peak,
        "warmup_peak_GiB": warm_peak,
        "peak_gpu_GiB": mem.stop(),
        # what of the peak PyTorch's caching allocator held (the rest: CUDA context, DALI)
        "torch_reserved_peak_GiB": torch.cuda.max_memory_reserved() / 2**30 if gpu else 0.0,
        "torch_allocated_peak_GiB": torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0,
        "loader_build_s": build,
        "patches_per_step": int(img.shape[0]),
        "loss_first_last": [losses[0], losses[-1]],
    }
    if limit_peak is not None:
        out["loader_GiB"] = out["peak_gpu_GiB"] - limit_peak
    host = getattr(loader, "host_seconds", None)
    if host is not None:
        out["host_ms_per_batch"] = 1000 * host / max(1, loader.batches_made)
    pacer = getattr(loader, "pacer", None)
    if pacer is not None:  # PatchLoader's engine thread: waits for the loop's quiet phase
        out["pace"] = pacer.fraction
        out["pace_wait_ms_per_batch"] = 1000 * pacer.waited / max(1, loader.batches_made)
    print(name, json.dumps(out), flush=True)
    del it, loader, net, opt, batch, img, lab
    if CUDA:
        torch.cuda.empty_cache()
    return out


def isolated(a, argv: list[str]) -> None:
    """Run each method in a fresh process (one after the other), then merge the results."""
    import tempfile

    runs = [("limit", [])] if "limit" not in a.skip else []
    if "medproc" not in a.skip:
        runs += [("medproc", ["--cache", c]) for c in a.cache]
    runs += [("tuned", [])] if "tuned" not in a.skip else []
    res, limit_peak = None, None
    rest = _without(argv, "--isolate", "--out", "--skip", "--cache", "--repeats")
    every: dict = {}  # method -> its results, one per repeat
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):  # interleaved: a slow spell of the machine hits every method
            for n, (name, extra) in enumerate(runs):
                out = os.path.join(tmp, f"{r}_{n}.json")
                others = [k for k in ("limit", "medproc", "tuned") if k != name]
                cmd = [sys.executable, os.path.abspath(__file__), *rest, *extra, "--skip", *others]
                subprocess.run([*cmd, "--out", out], check=True)
                with open(out) as f:
                    one = json.load(f)
                if name == "medproc" and extra[1] != a.cache[0]:
                    one["methods"] = {f"medproc (cache={extra[1]})": one["methods"]["medproc"]}
                for k, v in one["methods"].items():
                    every.setdefault(k, []).append(v)
                res = res or one
    res["methods"] = {k: _median_run(v) for k, v in every.items()}
    res["args"] = {**vars(a), "isolate": True}
    if "limit" in res["methods"]:
        limit_peak = res["methods"]["limit"]["peak_gpu_GiB"]
        for k, v in res["methods"].items():
            if k != "limit":
                v["loader_GiB"] = v["peak_gpu_GiB"] - limit_peak
    _finish(res, limit_peak)


def _median_run(results: list[dict]) -> dict:
    """One method's repeats as one result: the median of every number, and each run's
    steps/s (``steps_per_s_runs``) to show the spread."""
    import statistics

    out = dict(results[0])
    for k, v in results[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = statistics.median(x[k] for x in results)
    out["steps_per_s_runs"] = [x["steps_per_s"] for x in results]
    return out


def _without(argv: list[str], *options: str) -> list[str]:
    """``argv`` less ``options`` and the values that follow each."""
    out, drop = [], False
    for x in argv:
        if x.startswith("--"):
            drop = x in options
        if not drop:
            out.append(x)
    return out


class _Fixed:
    """The limit: ``n`` batches made once, on the device, cycled."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu" if CUDA else "cpu")
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--slices", type=int, nargs=2, default=(150, 250))
    ap.add_argument("--patch", type=int, default=96)
    ap.add_argument("--batch", type=int, default=8, help="patches per step")
    ap.add_argument("--num-samples", type=int, default=4, help="patches per volume")
    ap.add_argument("--workers", type=int, default=12, help="MONAI's CacheDataset workers")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--limit-batches", type=int, default=4)
    ap.add_argument("--prefetch", type=int, help="PatchLoader's batches ahead (its default)")
    ap.add_argument("--small", action="store_true", help="a small UNet (CPU smoke runs)")
    ap.add_argument(
        "--cache",
        nargs="+",
        default=["auto"],
        choices=["auto", "gpu", "host"],
        help="PatchLoader caches to run (each a method; the first is reported as 'medproc')",
    )
    ap.add_argument("--data", default="/tmp/bench_loader")
    ap.add_argument("--skip", nargs="*", default=[], choices=["limit", "medproc", "tuned"])
    ap.add_argument(
        "--isolate",
        action="store_true",
        help="each method in a process of its own (memory peaks not shared between methods)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="with --isolate: run every method this many times, interleaved, and report "
        "medians (one run varies by a few points of the limit on the H200)",
    )
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.repeats < 1 or (a.repeats > 1 and not a.isolate):
        ap.error("--repeats needs --isolate and must be >= 1")
    if a.batch % a.num_samples:
        ap.error("--batch must be a multiple of --num-samples (MONAI batches whole volumes)")
    dl = bench_loader.dataset(a.data, a.cases, a.size, a.slices)
    if a.isolate:
        return isolated(a, argv if argv is not None else sys.argv[1:])
    import monai.data  # noqa: F401 - imports outside the timings
    import monai.transforms  # noqa: F401

    import medproc.monai  # noqa: F401
    import medproc.pipeline  # noqa: F401

    la = argparse.Namespace(
        patch=a.patch,
        num_samples=a.num_samples,
        volumes=a.batch // a.num_samples,
        device=a.device,
        cache=a.cache[0],
        cache_dir=None,
        workers=a.workers,
        prefetch=a.prefetch,
    )
    dev = "cuda:0" if CUDA and a.device == "gpu" else "cpu"
    res = {
        "args": vars(a),
        "device": torch.cuda.get_device_name() if CUDA and a.device == "gpu" else "cpu",
        "cores": len(os.sched_getaffinity(0)),
        "methods": {},
    }
    m = res["methods"]

    def fixed():
        src = bench_loader.make_medproc(dl, la, a.batch)
        out, it = [], bench_loader.forever(src)
        while len(out) < a.limit_batches:
            b = next(it)
            if b["image"].shape[0] == a.batch:
                out.append(
                    {
                        "image": b["image"].as_tensor().to(dev),
                        "label": b["label"].as_tensor().to(dev),
                    }
                )
        del src, it
        if CUDA:
            torch.cuda.empty_cache()
            from medproc.pipeline.cache import release_unused

            release_unused()  # the limit's peak: the model and its batches only
        return _Fixed(out)

    if "limit" not in a.skip:
        m["limit"] = train("limit", fixed, a)
    limit_peak = m["limit"]["peak_gpu_GiB"] if "limit" in m else None
    for n, cache in enumerate(a.cache if "medproc" not in a.skip else []):
        name = "medproc" if n == 0 else f"medproc (cache={cache})"
        lc = argparse.Namespace(**{**vars(la), "cache": cache})
        m[name] = train(
            name, lambda lc=lc: bench_loader.make_medproc(dl, lc, a.batch), a, limit_peak
        )
    if "tuned" not in a.skip:
        m["monai-tuned"] = train(
            "monai-tuned", lambda: bench_loader.make_monai_tuned(dl, la, dev), a, limit_peak
        )
    _finish(res, limit_peak)


def _finish(res: dict, limit_peak) -> None:
    """Ratios between the methods; print and write the results."""
    m, a = res["methods"], argparse.Namespace(**res["args"])
    if "limit" in m:
        for v in m.values():
            v["pct_of_limit"] = 100 * v["steps_per_s"] / m["limit"]["steps_per_s"]
    for k in [k for k in m if k.startswith("medproc")] if "monai-tuned" in m else []:
        m[k]["gpu_memory_vs_tuned"] = m[k]["peak_gpu_GiB"] / m["monai-tuned"]["peak_gpu_GiB"]
        if "loader_GiB" in m[k] and "loader_GiB" in m["monai-tuned"]:
            m[k]["loader_memory_vs_tuned"] = m[k]["loader_GiB"] / max(
                m["monai-tuned"]["loader_GiB"], 1e-9
            )
    print(json.dumps(res, indent=1, default=str))
    if a.out:
        from provenance import provenance  # (bench/provenance.py)

        res["provenance"] = provenance()
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
