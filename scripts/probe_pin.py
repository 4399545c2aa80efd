"""Probe (H200): what page-locking the GPU service's shared arena would cost and save.

- cudaHostRegister of already-committed shared pages: 128 MiB pieces, 1 GiB, an uncommitted
  256 MiB (wall and CPU seconds);
- a DALI GPU pipeline (external_source on the GPU -> resize -> float32) fed 4 CT-sized int16
  volumes from private, shared and registered shared memory, its outputs taken three ways:
  ``as_cpu`` + a copy into shared memory; one ``cudaMemcpyAsync`` per sample on the output's
  stream into shared memory (not registered here); DALI's ``copy_to_external`` (refused for a
  host pointer: it copies device to device). CPU seconds of the process (synchronising spins).

    PYTHONPATH=/tmp/site:/tmp/cb python scripts/probe_pin.py

Its output on the node is quoted in docs/benchmarks.md (third round).
"""

import ctypes
import mmap
import time

import numpy as np

_t = time.perf_counter()
from cuda.bindings import runtime as rt  # noqa: E402

print(f"import cuda.bindings.runtime: {time.perf_counter() - _t:.3f} s")


def clock():
    return time.perf_counter(), time.process_time()


def since(t):
    w, c = clock()
    return f"{w - t[0]:.4f} s wall, {c - t[1]:.4f} s cpu"


def check(res):
    err = res[0] if isinstance(res, tuple) else res
    assert int(err) == 0, err
    return res


GB = 1 << 30
mm = mmap.mmap(-1, 4 * GB)
buf = np.frombuffer(mm, dtype=np.uint8)
base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
t = clock()
buf[: 2 * GB : 4096] = 1  # commit the first 2 GiB page by page
print("commit 2 GiB by touching:", since(t))

check(rt.cudaSetDevice(0))
check(rt.cudaFree(0))  # the primary context
for n in range(4):
    t = clock()
    check(rt.cudaHostRegister(base + n * (128 << 20), 128 << 20, 0))
    print(f"register 128 MiB committed #{n}:", since(t))
t = clock()
check(rt.cudaHostRegister(base + GB, GB, 0))
print("register 1 GiB committed:", since(t))
t = clock()
check(rt.cudaHostRegister(base + 3 * GB, 256 << 20, 0))
print("register 256 MiB never touched:", since(t))
t = clock()
check(rt.cudaHostUnregister(base + GB))
print("unregister 1 GiB:", since(t))

from nvidia.dali import fn, pipeline_def, types  # noqa: E402

SHAPE = (200, 512, 512, 1)  # DHWC int16, ~100 MB
OUT = (160, 256, 256)


@pipeline_def(batch_size=4, num_threads=2, device_id=0, exec_dynamic=True, prefetch_queue_depth=1)
def pipe():
    x = fn.external_source(name="img", device="gpu", layout="DHWC")
    y = fn.resize(x, size=list(OUT), interp_type=types.INTERP_LINEAR, antialias=False)
    return fn.cast(y, dtype=types.FLOAT)


p = pipe()
p.build()
nb = int(np.prod(SHAPE)) * 2
rng = np.random.default_rng(0)
src = rng.integers(-1000, 2000, SHAPE, dtype=np.int16)


def views(offset):
    out = []
    for i in range(4):
        a = buf[offset + i * nb : offset + (i + 1) * nb].view(np.int16).reshape(SHAPE)
        a[...] = src
        out.append(a)
    return out


pageable = [src.copy() for _ in range(4)]  # private memory, like a worker's array
shared_unreg = views(2 * GB + (512 << 20))  # shared, not registered
check(rt.cudaHostRegister(base + GB, GB, 0))  # again: 1 GiB at 1 GiB registered
shared_reg = views(GB)
out_nb = int(np.prod(OUT)) * 4
out_arr = [
    buf[(512 << 20) + i * out_nb : (512 << 20) + (i + 1) * out_nb].view(np.float32)
    for i in range(4)
]
probe = {}


def run(vols, mode):
    t = clock()
    p.feed_input("img", vols, layout="DHWC")
    (o,) = p.run()
    t_in = since(t)
    t2 = clock()
    if mode == "as_cpu":
        c = o.as_cpu()
        for i in range(4):
            np.copyto(out_arr[i], np.asarray(c[i]).reshape(-1))
    elif mode == "memcpy":  # our own D2H on DALI's output stream, into registered memory
        st = o.stream
        if "stream" not in probe:
            probe["stream"] = (type(st).__name__, [x for x in dir(st) if not x.startswith("_")])
            print("output stream:", probe["stream"])
        h = int(getattr(st, "handle", st) or 0) if st is not None else 0
        for i in range(4):
            check(
                rt.cudaMemcpyAsync(
                    out_arr[i].ctypes.data,
                    o[i].data_ptr(),
                    out_nb,
                    rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                    h,
                )
            )
        check(rt.cudaStreamSynchronize(h))
    else:
        for i in range(4):
            o[i].copy_to_external(out_arr[i].ctypes.data, non_blocking=False)
    return t_in, since(t2), since(t)


ref = None
for name, vols in (("private", pageable), ("shared", shared_unreg), ("registered", shared_reg)):
    for mode in ("as_cpu", "memcpy", "external"):
        try:
            for _rep in range(3):
                r = run(vols, mode)
            print(f"4 x 100 MB {name:10s} out {mode:8s}: in+run {r[0]}; out {r[1]}")
            got = np.array(out_arr[3])
            if ref is None:
                ref = got
            print("   output equal to first:", bool(np.array_equal(ref, got)), float(got.mean()))
            out_arr[3][...] = 0
        except Exception as e:  # noqa: BLE001
            print(f"4 x 100 MB {name:10s} out {mode:8s}: FAILED {type(e).__name__}: {e}")
