"""Page-locked copies of the GPU service (medproc.pipeline.hostmem): which slabs of the arena
are registered with CUDA, what happens when CUDA refuses, the service's bookkeeping of the
pieces outputs are copied into straight from the GPU (on the CPU, with CUDA faked), and on the
GPU the outputs landing in the arrays given, equal to DALI's own host copy."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from medproc import Spec
from medproc._gpu_serve import Server
from medproc._gpu_service import GpuService
from medproc.pipeline import hostmem


class FakeRuntime:
    """cudaHostRegister recorded (refused from the ``refuse``-th call on)."""

    def __init__(self, refuse: int | None = None):
        self.calls: list[tuple[int, int]] = []
        self.refuse, self.cleared = refuse, 0

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 - CUDA's name
        self.calls.append((ptr, size))
        return (1 if self.refuse is not None and len(self.calls) >= self.refuse else 0,)

    def cudaGetLastError(self):  # noqa: N802
        self.cleared += 1
        return (0,)


def test_the_slabs_holding_a_range_are_registered_once_each(monkeypatch):
    rt = FakeRuntime()
    monkeypatch.setattr(hostmem, "_rt", lambda: rt)
    mib = 1 << 20
    pins = hostmem.Registered(base=1000 * mib, nbytes=10 * mib, slab=4 * mib)
    assert pins.ensure(3 * mib, 2 * mib)  # bytes 3..5 MiB: slabs 0 and 1
    assert rt.calls == [(1000 * mib, 4 * mib), (1004 * mib, 4 * mib)]
    assert pins.ensure(5 * mib, mib) and len(rt.calls) == 2  # slab 1 again: nothing to do
    assert pins.ensure(9 * mib, mib)  # the last slab stops at the block's end (2 MiB)
    assert rt.calls[-1] == (1008 * mib, 2 * mib) and pins.slabs == {0, 1, 2}


def test_a_refused_registration_turns_page_locking_off_and_clears_the_error(monkeypatch):
    rt = FakeRuntime(refuse=2)
    monkeypatch.setattr(hostmem, "_rt", lambda: rt)
    pins = hostmem.Registered(base=0, nbytes=64, slab=16)
    assert pins.ensure(0, 16)
    assert not pins.ensure(16, 16)  # refused: CUDA's last error is not left for DALI
    assert pins.off and rt.cleared == 1
    assert not pins.ensure(40, 8) and len(rt.calls) == 2  # not tried again


def _server():
    service = GpuService(1, Spec(spacing=2.0), nbytes=8 << 20, device="cpu")
    server = Server(service, 0)
    server.pins = hostmem.Registered(service.arena.bytes.ctypes.data, service.arena.nbytes)
    return service, server


def _taken(service) -> int:
    return sum(1 for s in service.arena._size[:] if s)


def test_an_output_copied_into_an_arena_piece_is_handed_over_as_that_piece(monkeypatch):
    """The piece ``into`` gave is the worker's output piece (no copy), with the (i, j, k)
    output's DHW shape (DALI's channel of 1 dropped)."""
    monkeypatch.setattr(hostmem, "_rt", lambda: FakeRuntime())
    service, server = _server()
    try:
        dst = server.into((5, 4, 3, 1), np.dtype(np.float32))  # DALI's (k, j, i, C)
        dst[...] = np.arange(60, dtype=np.float32).reshape(5, 4, 3, 1)
        out = dst[..., 0].transpose(2, 1, 0)  # what the engine returns: (i, j, k), a view
        slot = server.to_host(out)
        assert slot.shape == (5, 4, 3) and not server.made
        np.testing.assert_array_equal(service.arena.array(slot), out)
        assert server.pins.slabs  # its slab page-locked
        service._give_back([slot])
        assert _taken(service) == 0
    finally:
        service.close()


def test_pieces_given_for_outputs_that_were_converted_after_the_copy_come_back(monkeypatch):
    """A label map cast back to its dtype after its copy is a new array: copied into a piece
    of its own, the piece ``into`` gave goes back; none is left taken."""
    monkeypatch.setattr(hostmem, "_rt", lambda: FakeRuntime())
    service, server = _server()
    try:
        dst = server.into((2, 3, 4, 1), np.dtype(np.uint8))
        dst[...] = 1
        converted = dst[..., 0].transpose(2, 1, 0).astype(bool)
        slot = server.to_host(converted)
        assert slot is not None and slot.dtype == "bool" and slot.shape == (2, 3, 4)
        np.testing.assert_array_equal(service.arena.array(slot), converted)
        assert _taken(service) == 2 and len(server.made) == 1
        server.give_back_made()  # (what answering a batch ends with, whatever happened)
        assert _taken(service) == 1 and not server.made
        service._give_back([slot])
        assert _taken(service) == 0
    finally:
        service.close()


_GPU_SCRIPT = r"""
import mmap, sys
import numpy as np
from medproc import Spec, Volume, resample_batch
from medproc.pipeline import hostmem

assert "torch" not in sys.modules
rng = np.random.default_rng(0)
vols = [Volume(rng.integers(-1000, 2000, (96, 80, 60 + 7 * n), dtype=np.int16),
               np.diag([0.8, 0.8, 1.2, 1.0])) for n in range(3)]
spec = Spec(spacing=1.5)
ref = resample_batch(vols, spec, device="gpu", batch_size=4)
mm = mmap.mmap(-1, 64 << 20)
block = np.frombuffer(mm, np.uint8)
pins = hostmem.Registered(block.ctypes.data, block.nbytes, slab=16 << 20)
given, at = [], [0]
def into(shape, dtype):
    n = int(np.prod(shape)) * dtype.itemsize
    a = block[at[0]: at[0] + n].view(dtype).reshape(shape)
    assert pins.ensure(at[0], n)
    at[0] += -(-n // 4096) * 4096
    given.append(a)
    return a
got = resample_batch(vols, spec, device="gpu", batch_size=4, into=into)
assert len(given) == 3 and pins.slabs and not pins.off
for g, r, a in zip(got, ref, given):
    assert np.shares_memory(g.array, a)
    np.testing.assert_array_equal(g.array, r.array)
    np.testing.assert_allclose(g.affine, r.affine)
print("ok", len(pins.slabs))
"""


@pytest.mark.gpu
def test_outputs_are_copied_from_the_gpu_into_the_arrays_given():
    """In a process without PyTorch (as the service): each output lands in the page-locked
    array ``into`` gave, equal to DALI's own host copy."""
    from medproc.pipeline import gpu_available

    if not gpu_available():
        pytest.skip("no GPU")
    if not hostmem.available():
        pytest.skip("no CUDA Python bindings (cuda-bindings)")
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", _GPU_SCRIPT], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-3000:]
