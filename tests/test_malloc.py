"""keep_scratch: a big block freed and taken again is reused, not mapped (and faulted) anew."""

import subprocess
import sys

import pytest

SCRIPT = """
import ctypes, resource, sys
from medproc._malloc import keep_scratch
if sys.argv[1] == "keep":
    assert keep_scratch()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = (32 << 20) + 4  # DALI's CPU resize scratch block
def run():
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)
run()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_dali_sized_scratch_is_reused_with_keep_scratch_and_faults_again_without():
    def faults(mode):
        r = subprocess.run(
            [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
        )
        return int(r.stdout.split()[-1])

    pages = (32 << 20) // 4096
    assert faults("default") > pages // 2  # a fresh mapping: every page faults again
    assert faults("keep") < pages // 20  # the heap's block, its pages still there
