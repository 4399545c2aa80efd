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
    """The CUDA runtime calls hostmem makes, recorded; registering refused from the
    ``refuse``-th call on; ``cudaMemcpyAsync`` copies for real (host to host) and fails at the
    ``fail_copy``-th call."""

    class cudaMemcpyKind:  # noqa: N801 - CUDA's name
        cudaMemcpyDeviceToHost = 2

    def __init__(self, refuse: int | None = None, fail_copy: int | None = None):
        self.calls: list[tuple] = []
        self.refuse, self.fail_copy = refuse, fail_copy
        self.cleared = self.registers = self.copies = 0

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 - CUDA's names
        self.registers += 1
        self.calls.append(("register", ptr, size))
        return (1 if self.refuse is not None and self.registers >= self.refuse else 0,)

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.calls.append(("unregister", ptr))
        return (0,)

    def cudaDeviceSynchronize(self):  # noqa: N802
        self.calls.append(("sync",))
        return (0,)

    def cudaStreamSynchronize(self, stream):  # noqa: N802
        self.calls.append(("sync stream", stream))
        return (0,)

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):  # noqa: N802
        import ctypes

        self.copies += 1
        self.calls.append(("copy", stream))
        if self.fail_copy is not None and self.copies >= self.fail_copy:
            return (1,)
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def cudaGetLastError(self):  # noqa: N802
        self.cleared += 1
        return (0,)


def test_each_piece_is_one_registration_and_overlapped_ones_are_undone(monkeypatch):
    """A copy must lie within one registration (CUDA refuses one spanning two: on the H200
    node every case failed when 100 MB pieces spanned 64 MiB slabs registered apart); a
    registration is undone only once the GPU is idle (no copy may still use it)."""
    rt = FakeRuntime()
    monkeypatch.setattr(hostmem, "_rt", lambda: rt)
    page, base = hostmem.PAGE, 1 << 40
    pins = hostmem.Registered(base=base, nbytes=100 * page)
    assert pins.ensure(0, 10 * page) and pins.ensure(10 * page, 5 * page + 1)  # rounded out
    assert rt.calls == [("register", base, 10 * page), ("register", base + 10 * page, 6 * page)]
    assert pins.ensure(0, 10 * page) and len(rt.calls) == 2  # the same piece: nothing to do
    # a piece inside an old one's room gets a registration of its own (the old one's piece
    # was given back; a neighbour taking the rest of that room would otherwise undo it)
    assert pins.ensure(2 * page, 3 * page)
    assert rt.calls[2:] == [
        ("sync",),
        ("unregister", base),
        ("register", base + 2 * page, 3 * page),
    ]
    # a piece over two (their pieces given back, the room taken again): both undone
    del rt.calls[:]
    assert pins.ensure(4 * page, 8 * page)
    assert rt.calls[0] == ("sync",) and rt.calls[3] == ("register", base + 4 * page, 8 * page)
    assert set(rt.calls[1:3]) == {("unregister", base + 2 * page), ("unregister", base + 10 * page)}
    assert pins.ranges == {4 * page: 12 * page} and pins.locked == 8 * page
    assert pins.ensure(98 * page, 10 * page)  # cut at the block's end
    assert rt.calls[-1] == ("register", base + 98 * page, 2 * page)
    del rt.calls[:]
    pins.close()
    assert sorted(rt.calls[1:]) == [
        ("unregister", base + 4 * page),
        ("unregister", base + 98 * page),
    ]
    assert not pins.ranges


def test_a_refused_registration_turns_page_locking_off_and_clears_the_error(monkeypatch):
    rt = FakeRuntime(refuse=2)
    monkeypatch.setattr(hostmem, "_rt", lambda: rt)
    page = hostmem.PAGE
    pins = hostmem.Registered(base=0, nbytes=64 * page)
    assert pins.ensure(0, page)
    assert not pins.ensure(16 * page, page)  # refused: CUDA's last error is not left for DALI
    assert pins.off and rt.cleared == 1
    assert not pins.ensure(40 * page, page) and rt.registers == 2  # not tried again


class FakeTensor:
    """A DALI GPU sample as copy_out sees it; its "device" memory is a numpy array."""

    def __init__(self, a):
        from nvidia.dali.types import DALIDataType

        self.a = a
        self.dtype = {np.dtype(np.float32): DALIDataType.FLOAT}[a.dtype]

    def shape(self):
        return list(self.a.shape)

    def data_ptr(self):
        return self.a.ctypes.data


class FakeTensorList:
    def __init__(self, arrays, stream):
        self.samples, self.stream = [FakeTensor(a) for a in arrays], stream

    def __getitem__(self, i):
        return self.samples[i]


def _outputs(n=3):
    rng = np.random.default_rng(0)
    return [rng.random((4, 5, 6 + k, 1), dtype=np.float32) for k in range(n)]


def test_copy_out_asks_for_every_destination_before_the_first_copy(monkeypatch):
    """Asking may page-lock memory (and undo a registration), which must not happen while a
    copy runs; a sample given no array gets a new one; the copies are waited for."""
    rt = FakeRuntime()
    monkeypatch.setattr(hostmem, "_rt", lambda: rt)
    src = _outputs()
    order, given = [], []

    def dest(shape, dtype):
        order.append(("dest", len(rt.calls)))
        if len(given) == 1:
            given.append(None)
            return None  # no room for this one
        given.append(np.empty(shape, dtype))
        return given[-1]

    (col,) = hostmem.copy_out([FakeTensorList(src, stream=7)], 3, dest)
    assert [n for _, n in order] == [0, 0, 0]  # all asked before any CUDA call
    assert rt.calls == [("copy", 7)] * 3 + [("sync stream", 7)]
    assert col[0] is given[0] and col[2] is given[2] and col[1] is not None
    for a, b in zip(col, src):
        np.testing.assert_array_equal(a, b)


def test_copy_out_waits_for_all_gpu_work_when_dali_names_no_stream(monkeypatch):
    rt = FakeRuntime()
    monkeypatch.setattr(hostmem, "_rt", lambda: rt)
    (col,) = hostmem.copy_out([FakeTensorList(_outputs(1), stream=None)], 1, lambda s, d: None)
    assert rt.calls == [("sync",), ("copy", 0), ("sync stream", 0)]


def test_copy_out_refuses_a_destination_of_the_wrong_size_before_copying(monkeypatch):
    rt = FakeRuntime()
    monkeypatch.setattr(hostmem, "_rt", lambda: rt)
    with pytest.raises(ValueError, match="shape"):
        hostmem.copy_out(
            [FakeTensorList(_outputs(2), stream=3)], 2, lambda s, d: np.empty((4, 5, 6), d)
        )
    with pytest.raises(ValueError, match="C-contiguous"):
        hostmem.copy_out(
            [FakeTensorList(_outputs(1), stream=3)],
            1,
            lambda s, d: np.empty(s[::-1], d).transpose(3, 2, 1, 0),
        )
    assert rt.calls == []  # nothing copied


def test_a_failed_copy_still_waits_for_those_started(monkeypatch):
    """Else the pieces would be given back while the GPU still writes into them."""
    rt = FakeRuntime(fail_copy=2)
    monkeypatch.setattr(hostmem, "_rt", lambda: rt)
    with pytest.raises(RuntimeError, match="cudaMemcpyAsync"):
        hostmem.copy_out([FakeTensorList(_outputs(3), stream=5)], 3, lambda s, d: None)
    assert rt.calls == [("copy", 5), ("copy", 5), ("sync stream", 5)]


def test_into_is_honoured_on_the_cpu_backend_too():
    """The outputs land in the arrays ``into`` gives whatever the device (a new one where it
    gives None), equal to the outputs without it."""
    from medproc import Volume, resample_batch

    rng = np.random.default_rng(1)
    vols = [
        Volume(rng.integers(-100, 100, (20, 18, 9 + k), dtype=np.int16), np.diag([1, 1, 2, 1.0]))
        for k in range(2)
    ]
    spec = Spec(spacing=1.5)
    ref = resample_batch(vols, spec, device="cpu", num_threads=1)
    given = []

    def into(shape, dtype):
        given.append(np.empty(shape, dtype) if not given else None)
        return given[-1]

    got = resample_batch(vols, spec, device="cpu", num_threads=1, into=into)
    assert len(given) == 2 and np.shares_memory(got[0].array, given[0])
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g.array, r.array)
    with pytest.raises(ValueError, match="into"):
        resample_batch(vols, spec, device="cpu", num_threads=1, into=lambda s, d: np.empty(3, d))
    # a label map DALI takes in another dtype comes back in its own (a new array)
    labs = [Volume((v.array > 0).astype(np.int32) * 7, v.affine) for v in vols]
    ref = resample_batch(vols, spec, device="cpu", labels=labs, num_threads=1)
    got = resample_batch(
        vols, spec, device="cpu", labels=labs, num_threads=1, into=lambda s, d: np.empty(s, d)
    )
    for (gi, gl), (ri, rl) in zip(got, ref):
        assert gl.array.dtype == np.int32
        np.testing.assert_array_equal(gl.array, rl.array)
        np.testing.assert_array_equal(gi.array, ri.array)


def _server():
    service = GpuService(1, Spec(spacing=2.0), nbytes=8 << 20, device="cpu")
    server = Server(service, 0)
    server.pins = hostmem.Registered(service.arena.bytes.ctypes.data, service.arena.nbytes)
    return service, server


def slot_bytes(slot) -> int:
    return int(np.prod(slot.shape)) * np.dtype(slot.dtype).itemsize


def _taken(service) -> int:
    return sum(1 for s in service.arena._size[:] if s)


def test_the_warm_up_gives_its_output_piece_back_even_when_it_fails(monkeypatch):
    """The warm-up's tiny output lands in an arena piece (``into``), page-locked or not: it
    goes back, also when the warm-up raises after taking it."""
    monkeypatch.setattr(hostmem, "_rt", lambda: FakeRuntime())
    service, server = _server()
    try:
        server.warm_up()
        assert _taken(service) == 0 and not server.made
        real = server.resample

        def fails(vols, labs):
            real(vols, labs)
            assert server.made  # its output is in a piece by now
            raise RuntimeError("after the copy")

        server.resample = fails
        with pytest.raises(RuntimeError, match="after the copy"):
            server.warm_up()
        assert _taken(service) == 0 and not server.made
    finally:
        service.close()


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


def test_page_locking_goes_off_only_for_a_case_that_fails_with_it_and_not_without(monkeypatch):
    """A bad case (fails either way) leaves page-locking on; a case that fails with it and
    not without turns it off for the rest of the run, said in the service's summary."""
    monkeypatch.setattr(hostmem, "_rt", lambda: FakeRuntime())
    service, server = _server()
    try:
        tried, fault = [], {"case": ValueError("a bad case")}

        def answer(part, with_label, answered, given):
            tried.append(server.pins is not None)
            if "case" in fault:
                raise fault["case"]
            if server.pins is not None:
                raise RuntimeError("CUDA error 1 (cudaErrorInvalidValue)")
            answered.add(id(part[0]))

        server.answer = answer
        r = (0, 1, [], np.eye(4))
        with pytest.raises(ValueError, match="bad case"):
            server.answer_alone(r, False, set(), set())
        assert tried == [True, False] and server.pins is not None and not server.pins_stopped
        del tried[:], fault["case"]
        answered: set = set()
        server.answer_alone(r, False, answered, set())
        assert tried == [True, False] and id(r) in answered
        assert server.pins is None and "cudaErrorInvalidValue" in server.pins_stopped
    finally:
        service.close()


def _request(service, seed=0):
    rng = np.random.default_rng(seed)
    vol = rng.integers(-100, 100, (20, 18, 12), dtype=np.int16)
    return (0, seed, [service.arena.put(vol)], np.diag([1.0, 1.0, 1.5, 1.0]))


def test_a_gone_worker_s_output_pieces_come_back(monkeypatch):
    """On DALI's CPU backend, outputs copied into page-locked pieces (CUDA faked): the
    worker's pipe is broken (it died), so its output piece goes back and the batch goes on."""
    monkeypatch.setattr(hostmem, "_rt", lambda: FakeRuntime())
    service, server = _server()
    sent = []

    def send(req, reply):
        if req[1] == 0:
            raise BrokenPipeError("the worker is gone")
        sent.append((req[1], reply))

    monkeypatch.setattr(service, "_send", send)
    try:
        server.run([_request(service, 0), _request(service, 1)])
        assert [n for n, _ in sent] == [1] and not isinstance(sent[0][1], str)
        slots, _, _ = sent[0][1]  # (pieces, affine, planning notes)
        assert _taken(service) == 1 and server.served == 1  # only the live worker's output
        service._give_back(slots)
        assert _taken(service) == 0
    finally:
        service.close()


def test_an_error_after_the_outputs_were_placed_gives_every_piece_back(monkeypatch):
    """Resampling succeeded into page-locked pieces, then the batch fails: the pieces
    outputs were copied into and the inputs come back, the worker is told the error."""
    monkeypatch.setattr(hostmem, "_rt", lambda: FakeRuntime())
    service, server = _server()
    sent = []
    monkeypatch.setattr(service, "_send", lambda req, reply: sent.append(reply))
    real, placed = server.resample, []

    def resample(vols, labs):
        real(vols, labs)
        placed.append(len(server.made))  # outputs in arena pieces (with page-locking)
        raise RuntimeError("after the copy")

    server.resample = resample
    try:
        server.run([_request(service, 0)])
        # tried in the batch, alone, alone without page-locking (outputs still copied into
        # an arena piece): failed each time, the case's fault, so page-locking stays on
        assert placed == [1, 1, 1] and server.pins is not None
        assert len(sent) == 1 and "after the copy" in sent[0]
        assert _taken(service) == 0 and not server.made
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
    def into(shape, dtype):  # the second output gets no piece: a new array
        given.append(piece(shape, dtype) if len(given) != 1 else None)
        return given[-1]
    got = resample_batch(vols, spec, device="gpu", batch_size=4, into=into)
    assert len(given) == 3 and given[1] is None and not pins.off
    for g, r, a in zip(got, ref, given):
        assert a is None or np.shares_memory(g.array, a)
        np.testing.assert_array_equal(g.array, r.array)
        np.testing.assert_allclose(g.affine, r.affine)
# with label maps (nearest neighbour, dtype kept), every output into a piece
labs = [Volume((a > 500).astype(np.uint8), aff) for a in arrays]
ref = resample_batch([Volume(a, aff) for a in arrays], spec, device="gpu", labels=labs)
at[0] = 0
got = resample_batch([Volume(a, aff) for a in arrays], spec, device="gpu", labels=labs,
                     into=piece)
for (gi, gl), (ri, rl) in zip(got, ref):
    np.testing.assert_array_equal(gi.array, ri.array)
    np.testing.assert_array_equal(gl.array, rl.array)
    assert gl.array.dtype == np.uint8 and gl.array.base is not None
# pieces that are not page-locked (the service with page-locking off): copied all the same
plain = np.zeros(64 << 20, np.uint8)
at[0] = 0
def pageable(shape, dtype):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    a = plain[at[0]: at[0] + n].view(dtype).reshape(shape)
    at[0] += -(-n // 4096) * 4096
    return a
got = resample_batch([Volume(a, aff) for a in arrays], spec, device="gpu", into=pageable)
for g, r in zip(got, ref):
    assert np.shares_memory(g.array, plain)
    np.testing.assert_array_equal(g.array, r[0].array)
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
