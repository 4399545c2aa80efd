"""``medproc convert --device gpu``'s service (:mod:`medproc._gpu_service`): forked CPU workers
hand their volumes to the main process through the shared arena and write what comes back.

On the CPU the same protocol runs with DALI's CPU backend (``device="cpu"``), so this machine
checks the plumbing: outputs equal to converting in the worker itself (images and label maps),
every arena piece given back, a case the arena has no room for resampled by its worker, and an
error in the service failing only its case with the message. On the GPU (``-m gpu``) the whole
command is compared with the CPU route against an independent reference."""

import os
import sys

import nibabel as nib
import numpy as np
import pytest

from medproc import Spec
from medproc._convert_case import _init_worker, _worker
from medproc._gpu_serve import Server
from medproc._gpu_service import GpuService
from medproc._procs import start_pool
from medproc.convert import prepare


def _plan(sample_data, out, spec):
    return prepare(
        [os.path.join(sample_data, "nifti", "images"), os.path.join(sample_data, "dicom")],
        str(out),
        spec,
        labels_dir=os.path.join(sample_data, "nifti", "labels"),
        workers=1,
    )


def _served(sample_data, out, spacing, n=None, nbytes=None, mode="plain"):
    """Run the planned cases through a CPU-mode service in a fresh interpreter (whose main
    process has not imported DALI, as in ``medproc convert``); returns (source, status, error)
    per case and the service's counters."""
    import json
    import subprocess
    import sys

    args = [sample_data, str(out), str(spacing), str(n or 0), str(nbytes or 0), mode]
    r = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _serve_main(sample_data, out, spacing, n, nbytes, mode):
    import json
    import sys
    import time

    from medproc import _gpu_service, load

    spec = Spec(spacing=float(spacing), crop_foreground=1e9 if mode == "no-foreground" else None)
    with _plan(sample_data, out, spec) as batch:
        todo = batch.todo
        if mode == "outputs-no-room":  # inputs fit one at a time, their outputs never
            todo = [t for t in todo if not t.label_path]
            nbytes = max(load(t.case.source).array.nbytes for t in todo) + 8192
            _gpu_service.ROOM_WAIT_S = 0.3
        todo = todo[: int(n)] if int(n) else todo
        # every case through the service, except in "share" mode (its warm-up then takes a
        # while: the workers resample the cases meanwhile, and the service the later ones)
        service = GpuService(  # (two service processes side by side where that is the case)
            2,
            spec,
            nbytes=int(nbytes) or None,
            device="cpu",
            share=mode == "share",
            services=2 if mode in ("plain", "share") else 1,
        )
        if mode == "share":  # warm once the workers took two cases to resample themselves
            # workers that have resampled before (DALI imported, a pipeline built: forked
            # with this flag); workers without one wait for a service warming up
            service.policy._first_done = True

            warm = Server.warm_up

            def slow_warm_up(self):
                deadline = time.monotonic() + 60
                while self.s.policy.here.value < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
                warm(self)

            Server.warm_up = slow_warm_up
            import importlib

            resample_mod = importlib.import_module("medproc.resample")  # (the module)

            real_batch = resample_mod.resample_batch

            def slow_in_workers(*a, **k):  # a worker resampling by itself finishes only
                if service.index is not None:  # once the service is warm (attached: a worker)
                    deadline = time.monotonic() + 60
                    while not service.policy.warm.value and time.monotonic() < deadline:
                        time.sleep(0.01)
                return real_batch(*a, **k)

            resample_mod.resample_batch = slow_in_workers
        if mode == "fail-first":  # the first case's volume fails, alone or in a batch
            bad = load(todo[0].case.source).shape
            real = Server.resample

            def flaky(self, vols, labs):
                if any(v.shape == bad for v in vols):
                    raise ValueError("broken on purpose")
                return real(self, vols, labs)

            Server.resample = flaky
        if mode == "dies":  # the service process ends on its first batch

            class Gone(BaseException):
                pass

            def dies(self, part, with_label, answered, given):
                raise Gone("the service process ended")

            Server.answer = dies
        assert "nvidia.dali" not in sys.modules
        pool = start_pool(2, _init_worker, (os.getpid(), service))
        assert pool.medproc_start_method == "fork"
        service.start()
        try:
            futs = [pool.submit(_worker, batch._args(t)) for t in todo]
            res = [f.result(timeout=300) for f in futs]
            # close() terminates a service still warming up (no case reached it), which may
            # then hold the piece of its warm-up's output: the batch's arena goes with it, but
            # the check below would fail (it did once in ~20 runs under load). Warm first.
            deadline = time.monotonic() + 120
            while not all(service._warm[:]) and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            pool.shutdown()
            service.close()
        assert not any(service.arena._size[:]), "arena pieces were not given back"
        if mode != "dies":  # (a dead service leaves the requests it never took counted)
            assert service.policy.pending.value == 0, "the backlog count drifted"
    rows = [(r[0].source, r[1], r[3], r[2].get("warnings", "")) for r in res]
    counts = {
        "served": service.served,
        "no_room": service.no_room,
        "here": service.policy.here.value,
    }
    print(json.dumps({"rows": rows, **counts}))


def _outputs(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith(".nii.gz"))


def _same_files(a, b, names):
    for f in names:
        x, y = nib.load(os.path.join(a, f)), nib.load(os.path.join(b, f))
        np.testing.assert_allclose(x.affine, y.affine, atol=1e-6)
        assert x.get_data_dtype() == y.get_data_dtype()
        np.testing.assert_array_equal(np.asarray(x.dataobj), np.asarray(y.dataobj))


def test_service_outputs_equal_the_workers_own_and_every_piece_comes_back(sample_data, tmp_path):
    with _plan(sample_data, tmp_path / "here", Spec(spacing=2.0)) as here:
        assert len(here.todo) >= 4 and any(t.label_path for t in here.todo)
        for t in here.todo:
            assert _worker(here._args(t))[1] == "ok"
    got = _served(sample_data, tmp_path / "served", 2.0)
    res = got["rows"]
    assert [r[1] for r in res] == ["ok"] * len(here.todo), res
    assert got["served"] == len(here.todo) and got["no_room"] == 0  # all by the service
    names = _outputs(tmp_path / "here")
    assert names == _outputs(tmp_path / "served") and len(names) >= 5  # images and labels
    _same_files(tmp_path / "here", tmp_path / "served", names)


def test_the_services_planning_notes_come_back_to_the_worker(sample_data, tmp_path):
    """The service plans in its own process; what planning says about a case (here: no voxel
    above the crop threshold) comes back with the output, so the case's row says it."""
    got = _served(sample_data, tmp_path / "notes", 2.0, mode="no-foreground")
    assert got["served"] == len(got["rows"]) >= 4
    for source, status, _, said in got["rows"]:
        assert status == "ok" and "no voxel is above 1000000000.0: not cropped" in said, source


def test_the_workers_resample_while_the_service_warms_up_then_hand_over(sample_data, tmp_path):
    """The GPU route shares the work: while the service warms up, workers that have DALI
    already resample the cases themselves, then hand them over. Every case is done once, by one or the other, and
    the outputs are those of converting in the worker."""
    with _plan(sample_data, tmp_path / "here", Spec(spacing=2.0)) as here:
        for t in here.todo:
            assert _worker(here._args(t))[1] == "ok"
    got = _served(sample_data, tmp_path / "shared", 2.0, mode="share")
    assert [r[1] for r in got["rows"]] == ["ok"] * len(here.todo), got
    assert got["here"] >= 2  # resampled by the workers while the service warmed up...
    assert got["served"] >= 1  # ...and handed over once it was warm (and idle)
    assert got["served"] + got["here"] == len(here.todo) and got["no_room"] == 0
    names = _outputs(tmp_path / "here")
    _same_files(tmp_path / "here", tmp_path / "shared", names)


def test_a_worker_waits_for_the_service_only_when_that_is_sooner():
    import time

    from medproc._gpu_share import FIRST_LOCAL_S, WARM_WAIT_S

    p = GpuService(1, Spec(spacing=2.0), nbytes=1 << 20, device="cpu", share=True).policy
    # a worker without DALI: its first resampling would cost FIRST_LOCAL_S (import, build)
    p.since.value = time.monotonic()
    assert p.worth_waiting()  # the service warms up: it is importing DALI too
    p.since.value = time.monotonic() - WARM_WAIT_S - 1
    assert not p.worth_waiting()  # ...for too long: here
    p.warm.value = 1
    p.pending.value = 15
    assert p.worth_waiting()  # busy, its time per case not known yet: wait
    p.per_case.value = 0.04
    assert (15 + 1) * 0.04 < FIRST_LOCAL_S and p.worth_waiting()
    p.pending.value = 30  # 31 x 0.04 s > FIRST_LOCAL_S: sooner here, import included
    assert not p.worth_waiting()
    p.resampled_here(1.5)  # the first: DALI's import and pipeline build included
    assert p.local_s is None  # not counted
    p.warm.value, p.per_case.value, p.pending.value = 0, 0.0, 0
    assert not p.worth_waiting()  # DALI here, the service warming up: here
    p.warm.value, p.pending.value = 1, 1
    assert not p.worth_waiting()  # busy, and nothing known about resampling here
    p.pending.value = 0
    assert p.worth_waiting()  # idle
    p.resampled_here(0.2)
    p.pending.value = 1
    assert not p.worth_waiting()  # busy, and the service's time not known yet
    p.per_case.value = 0.04
    p.pending.value = 3  # 4 x 0.04 s ahead of it < 0.2 s here
    assert p.worth_waiting()
    p.pending.value = 5  # 6 x 0.04 s > 0.2 s
    assert not p.worth_waiting()
    p.resampled_here(0.4)  # resampling here got slower (0.3 s on average)
    assert p.worth_waiting()


def test_no_room_in_the_arena_the_worker_resamples_itself(sample_data, tmp_path):
    with _plan(sample_data, tmp_path / "here", Spec(spacing=2.5)) as here:
        for t in here.todo[:2]:
            _worker(here._args(t))
        names = [os.path.basename(t.out_path) for t in here.todo[:2]]
    got = _served(sample_data, tmp_path / "tiny", 2.5, n=2, nbytes=4096)  # no volume fits
    assert [r[1] for r in got["rows"]] == ["ok", "ok"], got
    assert got["served"] == 0
    _same_files(tmp_path / "here", tmp_path / "tiny", names)


def test_no_room_for_an_output_the_worker_is_told_to_resample_itself(sample_data, tmp_path):
    with _plan(sample_data, tmp_path / "here", Spec(spacing=2.0)) as here:
        todo = [t for t in here.todo if not t.label_path]
        for t in todo:
            _worker(here._args(t))
        names = [os.path.basename(t.out_path) for t in todo]
    got = _served(sample_data, tmp_path / "full", 2.0, mode="outputs-no-room")
    assert [r[1] for r in got["rows"]] == ["ok"] * len(todo), got
    assert got["no_room"] >= 1 and got["served"] == 0
    _same_files(tmp_path / "here", tmp_path / "full", names)


def test_a_dead_service_fails_its_cases_and_the_workers_go_on_alone(sample_data, tmp_path):
    """The service process ends on its first batch: those cases fail with its error (or, if
    their request was still queued, "the GPU service stopped"); later cases are resampled by
    the workers themselves; nothing hangs and no piece is left taken (checked in the run)."""
    got = _served(sample_data, tmp_path / "dead", 2.0, mode="dies")
    rows = got["rows"]
    failed = [r for r in rows if r[1] == "failed"]
    assert failed and any("Gone" in r[2] for r in failed), rows
    assert all("Gone" in r[2] or "the GPU service stopped" in r[2] for r in failed), rows
    assert all(r[1] in ("ok", "failed") for r in rows) and got["served"] == 0


def test_an_error_in_the_service_fails_the_cases_it_hits_only(sample_data, tmp_path):
    res = _served(sample_data, tmp_path / "err", 2.0, mode="fail-first")["rows"]
    assert res[0][1] == "failed" and "broken on purpose" in res[0][2], res[0]
    assert res[0][0] in res[0][2]  # the message names the file
    # (the sample NIfTI cases share one shape, so the flaky step fails them all; the DICOM
    # series, of other shapes, sometimes in the same batch, go through)
    dicom = [r for r in res if "dicom" in r[0]]
    assert len(dicom) == 2 and all(r[1] == "ok" for r in dicom), res


def test_close_does_not_wait_for_a_warm_up_no_case_needed(monkeypatch):
    """A rerun with nothing to do closes the service at once, not after DALI's import and the
    CUDA context: a service process still warming up is terminated."""
    import time

    monkeypatch.setattr(Server, "warm_up", lambda self: time.sleep(30))
    service = GpuService(1, Spec(spacing=2.0), nbytes=1 << 20, device="cpu", services=2)
    service.start()
    processes = list(service._processes)
    assert len(processes) == 2
    assert all(p.is_alive() and p.pid != os.getpid() for p in processes)
    t = time.perf_counter()
    service.close()
    assert time.perf_counter() - t < 5
    assert not any(p.is_alive() for p in processes)
    assert not service.alive  # a worker would resample on its own


def test_a_service_that_is_killed_is_noticed(monkeypatch):
    """However the service process ends (here SIGKILL, as the kernel's OOM killer would), the
    workers are told: none waits for ever for its reply."""
    import signal
    import time

    monkeypatch.setattr(Server, "warm_up", lambda self: None)
    service = GpuService(1, Spec(spacing=2.0), nbytes=1 << 20, device="cpu", services=2)
    service.start()
    deadline = time.monotonic() + 30
    while not service.policy.warm.value and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.alive
    os.kill(service._processes[0].pid, signal.SIGKILL)
    while service._up[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not service._up[0] and service._up[1]  # one gone, noticed; the other serves on
    os.kill(service._processes[1].pid, signal.SIGKILL)
    while service.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not service.alive
    service.close()


@pytest.mark.gpu
def test_convert_on_the_gpu_service_matches_the_cpu_route(sample_data, tmp_path):
    """The command as a user runs it (a fresh process: the service runs without PyTorch),
    images and label maps, against the CPU route's outputs."""
    import re
    import subprocess
    import sys

    from medproc.pipeline import gpu_available, hostmem

    if not gpu_available():
        pytest.skip("no GPU")
    inputs = [os.path.join(sample_data, "nifti", "images"), os.path.join(sample_data, "dicom")]
    labels = os.path.join(sample_data, "nifti", "labels")
    for dev in ("cpu", "gpu"):
        cmd = [sys.executable, "-m", "medproc", "-v", "convert", *inputs, "-o"]
        cmd += [str(tmp_path / dev), "--labels", labels, "--spacing", "1.5", "--device", dev]
        r = subprocess.run(cmd + ["-j", "3"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        if dev == "gpu":
            assert "GPU service process(es)" in r.stderr and "GPU service ready" in r.stderr
            if hostmem.available():  # copies to and from the GPU through page-locked pieces
                locked = re.findall(r"(\d+) MiB of the arena page-locked", r.stderr)
                assert locked and max(int(x) for x in locked) > 0, r.stderr[-3000:]
    names = _outputs(tmp_path / "cpu")
    assert names == _outputs(tmp_path / "gpu") and any("_label" in f for f in names)
    for f in names:
        x, y = nib.load(tmp_path / "cpu" / f), nib.load(tmp_path / "gpu" / f)
        np.testing.assert_allclose(x.affine, y.affine, atol=1e-5)
        a, b = np.asarray(x.dataobj), np.asarray(y.dataobj)
        if "_label" in f:  # nearest neighbour: the same labels but at rounding ties
            assert np.mean(a != b) < 1e-3
        else:
            np.testing.assert_allclose(a, b, atol=0.05 * (np.ptp(a) or 1) + 1e-3)


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        got = tuple(int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return got >= (major, minor)


@pytest.mark.skipif(
    not (sys.platform.startswith("linux") and _kernel_at_least(5, 14)),
    reason="MADV_POPULATE_* (Linux 5.14+)",
)
def test_a_committed_arena_takes_a_copy_without_a_fault_per_page():
    """What the GPU service does for its workers' first copies: the arena's low pages
    committed up front (in threads), so that a piece later taken there needs no fault per
    page; the data goes through intact."""
    import resource

    from medproc._proxy_arena import Arena

    arena = Arena(64 * 2**20, 4, pin=False)
    arena.commit(32 * 2**20, threads=3)
    vol = np.asfortranarray(np.arange(96 * 96 * 300, dtype=np.int16).reshape(96, 96, 300))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    slot = arena.put(vol)  # 5.5 MB: ~1,350 pages
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert slot is not None and slot.offset == 0
    assert faults < 100, faults
    np.testing.assert_array_equal(arena.array(slot), vol)


def _resident(arena) -> np.ndarray:
    """Which pages of the arena's memory exist (``mincore``: whoever allocated them)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    n = -(-arena.nbytes // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * n)()
    rc = libc.mincore(ctypes.c_void_p(arena.bytes.ctypes.data), ctypes.c_size_t(arena.nbytes), vec)
    assert rc == 0, ctypes.get_errno()
    return np.frombuffer(vec, np.uint8) & 1


@pytest.mark.skipif(
    not (sys.platform.startswith("linux") and _kernel_at_least(5, 14)),
    reason="MADV_POPULATE_* (Linux 5.14+)",
)
def test_the_services_commit_the_arena_pieces_of_the_cases_planned_from_the_start():
    """Once the services start, the arena's pieces for the workers' first cases are committed
    (a third of PER_WORKER per case planned), and only those: the pages exist for every
    process sharing the arena, this one included, without its touching them."""
    import mmap
    import time

    from medproc._gpu_service import PER_WORKER, GpuService

    service = GpuService(2, Spec(spacing=2.0), nbytes=512 * 2**20, device="cpu")
    assert _resident(service.arena).sum() == 0
    service.planned(1)
    service.start()
    try:
        want = -(-(PER_WORKER // 3) // mmap.PAGESIZE)
        deadline = time.monotonic() + 60
        while _resident(service.arena)[:want].sum() < want and time.monotonic() < deadline:
            time.sleep(0.05)
        pages = _resident(service.arena)
        assert pages[:want].all()
        assert pages[want + 1 :].sum() == 0
    finally:
        service.close()


def test_the_number_of_gpu_services(monkeypatch):
    from medproc._gpu_share import pinned_copies, service_count

    monkeypatch.delenv("MEDPROC_GPU_SERVICES", raising=False)
    monkeypatch.setenv("MEDPROC_GPU_PIN", "0")  # copies through pageable memory: 2 on 8+
    assert not pinned_copies()
    assert (service_count(2), service_count(8), service_count(16)) == (1, 2, 2)
    monkeypatch.delenv("MEDPROC_GPU_PIN")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(  # page-locked copies (cuda-bindings installed): one is enough
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "cuda.bindings" else real(name, *a),
    )
    assert pinned_copies()
    assert (service_count(2), service_count(8), service_count(16)) == (1, 1, 1)
    monkeypatch.setattr(  # without them: 2 on 8 cores or more
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "cuda.bindings" else real(name, *a),
    )
    assert not pinned_copies() and service_count(8) == 2
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.setenv("MEDPROC_GPU_SERVICES", "3")
    assert service_count(2) == 3
    from medproc.errors import UsageError

    for bad in ("abc", "0", "1.5"):  # a clear error naming the variable, before any work
        monkeypatch.setenv("MEDPROC_GPU_SERVICES", bad)
        with pytest.raises(UsageError, match="MEDPROC_GPU_SERVICES"):
            service_count(16)
    monkeypatch.delenv("MEDPROC_GPU_SERVICES")
    monkeypatch.setenv("MEDPROC_ARENA_COMMIT", "x")
    with pytest.raises(UsageError, match="MEDPROC_ARENA_COMMIT"):
        GpuService(1, Spec(spacing=2.0), nbytes=1 << 20, device="cpu")


def test_close_does_not_wait_for_a_service_still_warming_up_when_another_is_warm(monkeypatch):
    """One service warm, the other with a long warm-up: close() stops the first and ends the
    second at once (one warm flag for all made it wait for the whole warm-up)."""
    import time

    monkeypatch.setattr(Server, "warm_up", lambda self: time.sleep(30) if self.k else None)
    service = GpuService(1, Spec(spacing=2.0), nbytes=1 << 20, device="cpu", services=2)
    service.start()
    deadline = time.monotonic() + 30
    while not service._warm[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    processes = list(service._processes)
    t = time.perf_counter()
    service.close()
    assert time.perf_counter() - t < 5
    # the warm one exits by itself and a thread of close() reaps it: wait for that, do not
    # join it here too (two joins race, and one can see a child already reaped as alive)
    deadline = time.monotonic() + 10
    while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(p.is_alive() for p in processes)


def test_a_service_gathering_a_batch_never_blocks_on_another_services_read():
    """Two services read one queue: while one waits in ``get()``, the other, gathering the
    requests waiting, must not block on a request the first takes (it would hold the requests
    it had taken until the next one came, after the last: never)."""
    import multiprocessing
    import threading

    from medproc._gpu_serve import _gather

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    sink = ctx.Process(target=_drain, args=(q,), daemon=True)
    sink.start()
    try:
        for _ in range(50):
            q.put(("req",))
            done = threading.Event()

            def gather(done=done):
                _gather(q, [("first",)], 8, lambda r: None)
                done.set()

            threading.Thread(target=gather, daemon=True).start()
            assert done.wait(5), "gathering blocked behind the other reader"
    finally:
        q.put(None)
        sink.join(timeout=10)


def _drain(q):
    while q.get() is not None:
        pass


if __name__ == "__main__":
    import sys

    _serve_main(*sys.argv[1:])
