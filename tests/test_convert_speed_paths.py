"""The fast paths of ``medproc convert`` give the same results as the plain ones: the gzip
written in parallel parts (same bytes for any number of threads, read back by nibabel and
SimpleITK as the uncompressed file), the header scan in this process for few files, and one
case converted by a forked worker that imported DALI meanwhile (same output as ``-j 1``)."""

import csv
import gzip
import io
import os
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest

import medproc
from medproc.io import dicom_scan, writers


def _volume(shape=(180, 170, 60)):
    rng = np.random.default_rng(3)
    a = np.asfortranarray(rng.normal(0, 100, shape).astype(np.float32))
    aff = np.diag([0.7, 0.8, 1.5, 1.0])
    aff[:3, 3] = (-60.0, 10.0, 4.0)
    return medproc.Volume(a, aff)


def test_parallel_gzip_same_bytes_for_any_thread_count_and_read_back_everywhere(tmp_path):
    vol = _volume()  # 7 MB raw: two parts
    written = []
    for threads in (1, 2, 3):
        p = str(tmp_path / f"t{threads}.nii.gz")
        medproc.save(vol, p, threads=threads)
        written.append(open(p, "rb").read())
    assert written[0] == written[1] == written[2]
    plain = str(tmp_path / "plain.nii")
    medproc.save(vol, plain)
    assert gzip.decompress(written[0]) == open(plain, "rb").read()  # one member, nibabel's bytes
    a, b = nib.load(str(tmp_path / "t2.nii.gz")), nib.load(plain)
    assert np.array_equal(np.asanyarray(a.dataobj), np.asanyarray(b.dataobj))
    assert a.header.binaryblock == b.header.binaryblock
    sitk = pytest.importorskip("SimpleITK")
    sa, sb = sitk.ReadImage(str(tmp_path / "t2.nii.gz")), sitk.ReadImage(plain)
    assert np.array_equal(sitk.GetArrayFromImage(sa), sitk.GetArrayFromImage(sb))
    assert sa.GetOrigin() == sb.GetOrigin() and sa.GetDirection() == sb.GetDirection()


@pytest.mark.parametrize(
    "n", [0, 1, writers.GZIP_PART - 1, writers.GZIP_PART, 2 * writers.GZIP_PART + 5]
)
def test_gzip_bytes_at_part_borders(n):
    data = (np.arange(n, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8).tobytes()
    one = writers.gzip_bytes(data, threads=1)
    assert one == writers.gzip_bytes(data, threads=4)
    assert gzip.decompress(b"".join(one)) == data


class _Counting:
    """An executor that counts the header reads handed to it."""

    def __init__(self, workers=None):
        self.calls, self.tasks = 0, []
        if workers:
            self._max_workers = workers  # (as a ProcessPoolExecutor says its size)

    def map(self, fn, *its):
        self.calls += 1
        its = [list(it) for it in its]
        self.tasks += [len(files) for files in its[0]]
        return map(fn, *its)


def test_few_files_are_scanned_here_and_on_files_may_give_the_pool(sample_data, monkeypatch):
    dicom = os.path.join(sample_data, "dicom")
    seen, ex = [], _Counting()
    scan = dicom_scan.scan_dicom(dicom, executor=ex, on_files=lambda f: seen.append(f) or None)
    assert ex.calls == 0 and len(seen) == 1
    assert len(seen[0]) == sum(len(s.files) for s in scan.series)
    monkeypatch.setattr(dicom_scan, "POOL_MIN_FILES", 1)
    given = _Counting()
    again = dicom_scan.scan_dicom(dicom, on_files=lambda f: given)
    assert given.calls == 1
    assert [s.files for s in again.series] == [s.files for s in scan.series]
    assert [s.key for s in again.series] == [s.key for s in scan.series]
    # a pool of known size gets a few tasks per worker, of equal counts (see _chunks)
    three = _Counting(workers=3)
    third = dicom_scan.scan_dicom(dicom, on_files=lambda f: three)
    assert sum(three.tasks) == len(seen[0]) and len(three.tasks) > 3
    assert [s.files for s in third.series] == [s.files for s in scan.series]


def _run(args, cwd):
    cmd = [sys.executable, "-m", "medproc", "-v", "convert", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)


def test_one_series_in_a_warm_worker_equals_in_process(sample_data, tmp_path):
    series = os.path.join(sample_data, "dicom", "ct_axial")
    root = os.path.dirname(os.path.dirname(os.path.abspath(medproc.__file__)))
    outs = {}
    for j in ("auto", "1"):
        out = str(tmp_path / f"j{j}")
        r = _run([series, "-o", out, "--spacing", "2", "-j", j], root)
        assert r.returncode == 0, r.stderr
        outs[j] = out
        rows = list(csv.DictReader(open(os.path.join(out, "manifest.csv"))))
        assert [x["status"] for x in rows] == ["ok"]
        if j == "auto" and (os.cpu_count() or 1) > 1:
            assert "1 worker(s), fork pool" in r.stderr  # converted by the forked worker
        else:
            assert "in this process" in r.stderr
    names = sorted(f for f in os.listdir(outs["1"]) if f.endswith(".nii.gz"))
    assert names == sorted(f for f in os.listdir(outs["auto"]) if f.endswith(".nii.gz"))
    for f in names:  # the same bytes, compressed too
        assert (
            open(os.path.join(outs["1"], f), "rb").read()
            == open(os.path.join(outs["auto"], f), "rb").read()
        )


def test_a_writer_that_seeks_back_falls_back_to_the_same_bytes(tmp_path, monkeypatch):
    vol = _volume((120, 110, 40))
    medproc.save(vol, str(tmp_path / "streamed.nii.gz"))

    def refuse(self, pos, whence=0):
        raise io.UnsupportedOperation("no seek")

    monkeypatch.setattr(writers.GzipStream, "seek", refuse)
    medproc.save(vol, str(tmp_path / "fallback.nii.gz"))
    a = open(tmp_path / "streamed.nii.gz", "rb").read()
    assert a == open(tmp_path / "fallback.nii.gz", "rb").read()
    assert not [f for f in os.listdir(tmp_path) if ".part" in f]


def _left_behind(out: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if out.encode() in f.read() and int(pid) != os.getpid():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def test_a_rerun_with_nothing_to_do_ends_its_warming_worker(sample_data, tmp_path):
    series = os.path.join(sample_data, "dicom", "ct_axial")
    root = os.path.dirname(os.path.dirname(os.path.abspath(medproc.__file__)))
    out = str(tmp_path / "o")
    assert _run([series, "-o", out, "--spacing", "3"], root).returncode == 0
    r = _run([series, "-o", out, "--spacing", "3"], root)  # the worker forked meanwhile: unused
    assert r.returncode == 0, r.stderr
    assert "0 case(s) to convert" in r.stderr and "1 skipped" in r.stderr
    assert _left_behind(out) == []


def test_scan_tasks_are_a_few_per_worker_in_order():
    chunks = dicom_scan._chunks
    assert dicom_scan.TASKS_PER_WORKER == 4
    files = [f"f{i}" for i in range(70)]
    three = chunks(files, 3)  # 12 tasks of 6 files at most (the last one shorter)
    assert [len(c) for c in three] == [6] * 11 + [4]
    assert [f for c in three for f in c] == files
    assert [len(c) for c in chunks(files[:5], 3)] == [1] * 5
    assert [len(c) for c in chunks(files, None)] == [64, 6]  # pool of unknown size: CHUNK


def test_a_frame_pickles_as_plain_floats_and_comes_back_equal():
    import pickle

    from medproc.io.dicom_header import Frame

    f = Frame(
        "a.dcm", None, np.array([1.5, -2.0, 3.25]), np.array([1.0, 0, 0, 0, 1, 0]), (0.7, 0.7)
    )
    g = Frame("b.dcm", 3, None, None, None, slope=2.0, intercept=-1.0, fast=(10, "<i2"))
    blob = pickle.dumps([f, g])
    assert b"numpy" not in blob  # no numpy reconstruction in the records sent back
    f2, g2 = pickle.loads(blob)
    assert isinstance(f2.position, np.ndarray) and f2.position.dtype == np.float64
    np.testing.assert_array_equal(f2.position, f.position)
    np.testing.assert_array_equal(f2.orientation, f.orientation)
    assert (f2.path, f2.pixel_spacing) == ("a.dcm", (0.7, 0.7))
    assert g2 == g


def test_the_workers_warm_up_builds_the_pipeline_of_an_int16_case(sample_data):
    """A worker's warm-up (after its share of the header scan) builds the pipeline its first
    CT case uses: that case builds none."""
    from medproc._convert_case import _warm_up
    from medproc.pipeline import cache
    from medproc.resample import resample_batch

    spec = medproc.Spec(spacing=2.0)
    vol = medproc.load(os.path.join(sample_data, "dicom", "ct_axial"))
    assert vol.array.dtype == np.int16
    before = dict(cache._CACHE)
    _warm_up(spec, 3)  # (3 DALI threads: a pipeline no other test builds)
    built = dict(cache._CACHE)
    assert len(built) == len(before) + 1
    resample_batch([vol], spec, num_threads=3)
    assert dict(cache._CACHE) == built


def test_warm_ups_are_queued_after_the_header_scan_tasks():
    from medproc.convert import _WarmAfter

    class Pool:
        _max_workers = 2

        def __init__(self):
            self.order = []

        def map(self, fn, *its):
            self.order += [fn.__name__] * len(list(its[0]))
            return iter(())

        def submit(self, fn, *args):
            self.order.append((fn.__name__, args))

    pool = Pool()
    warm = _WarmAfter(pool, 2, ("spec", 1))
    assert warm._max_workers == 2
    warm.map(dicom_scan._scan_files, [["a"], ["b"], ["c"]], [False] * 3)
    assert pool.order == ["_scan_files"] * 3 + [("_warm_up", ("spec", 1))] * 2
