"""Page-locked copies of the GPU service (medproc.pipeline.hostmem): which parts of the arena
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
    """cudaHostRegister/Unregister recorded (registering refused from the ``refuse``-th on)."""

    def __init__(self, refuse: int | None = None):
        self.calls: list[tuple] = []
        self.refuse, self.cleared, self.registers = refuse, 0, 0

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 - CUDA's name
        self.registers += 1
        self.calls.append(("register", ptr, size))
        return (1 if self.refuse is not None and self.registers >= self.refuse else 0,)

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.calls.append(("unregister", ptr))
        return (0,)

    def cudaGetLastError(self):  # noqa: N802
        self.cleared += 1
        return (0,)


def test_each_piece_is_one_registration_and_overlapped_ones_are_undone(monkeypatch):
    """A copy must lie within one registration (CUDA refuses one spanning two: on the H200
    node every case failed when 100 MB pieces spanned 64 MiB slabs registered apart)."""
    rt = FakeRuntime()
    monkeypatch.setattr(hostmem, "_rt", lambda: rt)
    page, base = hostmem.PAGE, 1 << 40
    pins = hostmem.Registered(base=base, nbytes=100 * page)
    assert pins.ensure(0, 10 * page) and pins.ensure(10 * page, 5 * page + 1)  # rounded out
    assert rt.calls == [("register", base, 10 * page), ("register", base + 10 * page, 6 * page)]
    assert pins.ensure(2 * page, 3 * page) and len(rt.calls) == 2  # inside one: nothing to do
    # a piece over both (their pieces were given back, the room taken again): both undone
    assert pins.ensure(5 * page, 8 * page)
    assert rt.calls[2:] == [
        ("unregister", base),
        ("unregister", base + 10 * page),
        ("register", base + 5 * page, 8 * page),
    ]
    assert pins.ranges == {5 * page: 13 * page} and pins.locked == 8 * page
    assert pins.ensure(98 * page, 10 * page)  # cut at the block's end
    assert rt.calls[-1] == ("register", base + 98 * page, 2 * page)


def test_a_refused_registration_turns_page_locking_off_and_clears_the_error(monkeypatch):
    rt = FakeRuntime(refuse=2)
    monkeypatch.setattr(hostmem, "_rt", lambda: rt)
    page = hostmem.PAGE
    pins = hostmem.Registered(base=0, nbytes=64 * page)
    assert pins.ensure(0, page)
    assert not pins.ensure(16 * page, page)  # refused: CUDA's last error is not left for DALI
    assert pins.off and rt.cleared == 1
    assert not pins.ensure(40 * page, page) and rt.registers == 2  # not tried again


def _server():
    service = GpuService(1, Spec(spacing=2.0), nbytes=8 << 20, device="cpu")
    server = Server(service, 0)
    server.pins = hostmem.Registered(service.arena.bytes.ctypes.data, service.arena.nbytes)
    return service, server


def slot_bytes(slot) -> int:
    return int(np.prod(slot.shape)) * np.dtype(slot.dtype).itemsize


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
        assert server.pins.locked >= slot_bytes(slot)  # its piece page-locked
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
shapes = [(300, 260, 90 + 7 * n) for n in range(3)]  # ~14-16 MB int16 each
arrays = [rng.integers(-1000, 2000, s, dtype=np.int16) for s in shapes]
aff = np.diag([0.8, 0.8, 1.2, 1.0])
spec = Spec(spacing=1.5)
ref = resample_batch([Volume(a, aff) for a in arrays], spec, device="gpu", batch_size=4)
mm = mmap.mmap(-1, 128 << 20)
block = np.frombuffer(mm, np.uint8)
pins = hostmem.Registered(block.ctypes.data, block.nbytes)
at = [0]

def piece(shape, dtype):  # the next page-aligned piece of the block, page-locked
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    a = block[at[0]: at[0] + n].view(dtype).reshape(shape)
    assert pins.ensure(at[0], n)
    at[0] += -(-n // 4096) * 4096
    return a

for start in (0, 7 << 20):  # then pieces over the first round's (re-registered)
    at[0] = start
    vols = []
    for a in arrays:  # inputs in the block, as the service's (k, j, i) pieces
        p = piece(a.shape[::-1], a.dtype)
        p[...] = a.transpose(2, 1, 0)
        vols.append(Volume(p.transpose(2, 1, 0), aff))
    given = []
    def into(shape, dtype):
        given.append(piece(shape, dtype))
        return given[-1]
    got = resample_batch(vols, spec, device="gpu", batch_size=4, into=into)
    assert len(given) == 3 and not pins.off
    for g, r, a in zip(got, ref, given):
        assert np.shares_memory(g.array, a)
        np.testing.assert_array_equal(g.array, r.array)
        np.testing.assert_allclose(g.affine, r.affine)
print("ok", len(pins.ranges), pins.locked)
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
