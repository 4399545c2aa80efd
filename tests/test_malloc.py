"""keep_scratch: a block of DALI's scratch size, freed and taken again, is reused instead of
mapped and faulted in anew; a volume-sized block is still given back to the system."""

import os
import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, resource, sys
from medproc._malloc import keep_scratch
libc = ctypes.CDLL(None)
libc.prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages, whatever the host's THP setting
if sys.argv[1] == "keep" and not keep_scratch():
    print("unsupported")
    sys.exit()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def run(size):
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
scratch = (32 << 20) + 4  # DALI's CPU resize scratch block
run(scratch)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run(scratch)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
before = rss()
run(200 << 20)  # a volume
print(faults, rss() - before)
"""


def _run(mode):
    # (without malloc tuning a test before left, e.g. dask's nanny sets MALLOC_TRIM_THRESHOLD_)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUN"))}
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True, env=env
    )
    return r.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_dali_sized_scratch_is_reused_and_a_volume_is_given_back():
    kept = _run("keep")
    if kept == ["unsupported"]:
        pytest.skip("not glibc, or malloc tuned by the environment")
    pages = (32 << 20) // 4096
    default_faults, _ = map(int, _run("default"))
    faults, held = map(int, kept)
    assert default_faults > pages // 2  # (the control) a fresh mapping: every page faults again
    assert faults < pages // 20  # the heap's block, its pages still there
    assert held < 16 << 20  # the 200 MiB block was a mapping of its own, given back
