"""A batch protects itself: explicit inputs are never dropped silently, duplicates are converted
once, outputs inside an input tree are never inputs, temporaries of a killed run are cleaned,
and ``kill -9`` of the main process (alone, as an OOM killer does) at random points leaves no
worker behind, no partial file under a final name, and a resume that redoes nothing finished
and ends with the outputs of a clean run."""

import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import nibabel as nib
import numpy as np
import pytest

import medproc
from medproc.cli import main


def _manifest(d):
    p = os.path.join(d, "manifest.csv")
    if not os.path.exists(p):
        return {}
    with open(p, newline="") as f:
        return {r["case"]: r for r in csv.DictReader(f)}


def _nifti(path, shape=(24, 20, 12), seed=0):
    arr = np.random.default_rng(seed).integers(-1000, 1000, shape).astype(np.int16)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    nib.save(nib.Nifti1Image(arr, np.diag([2.0, 2.0, 3.0, 1.0])), path)
    return path


def _series(folder, uid, seed=0):
    from medproc.sample_data import ct_phantom, grid_affine, write_dicom_series

    aff = grid_affine((12, 10, 5), (1.5, 1.5, 2.5), (0.0, 0.0, 0.0))
    img, _ = ct_phantom((12, 10, 5), aff, [], seed=seed)
    return write_dicom_series(folder, medproc.Volume(img, aff), uid, seed=seed)


def test_explicit_inputs_that_yield_nothing_are_failed_rows(tmp_path, capsys):
    good = _nifti(str(tmp_path / "good.nii.gz"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.dcm").write_bytes(b"junk" * 100)
    (tmp_path / "zero.dcm").write_bytes(b"")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello")
    (tmp_path / "cases.csv").write_text("image,label\n")  # a case list without a case
    named = ["empty", "junk.dcm", "zero.dcm", "notes", "cases.csv"]
    out = tmp_path / "out"
    rc = main(["convert", good, *[str(tmp_path / n) for n in named], "-o", str(out)] + ["-j", "1"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    m = _manifest(out)
    assert m["good"]["status"] == "ok"
    failed = {os.path.basename(r["source"]): r["error"] for r in m.values() if r["status"] != "ok"}
    assert sorted(failed) == sorted(named)
    assert "holds no DICOM series" in failed["empty"] and "not a DICOM" in failed["junk.dcm"]
    assert "empty (0 bytes)" in failed["zero.dcm"]
    assert "the case list has no cases" in failed["cases.csv"]
    assert failed["empty"].endswith("it holds no file at all")
    assert "its 1 file(s) are named otherwise (e.g. readme.txt)" in failed["notes"]
    for n in named:
        assert str(tmp_path / n) in err  # printed, by name
    # a path that does not exist is a usage error before any work: exit 2, nothing written
    for missing in ("missing_dir", "missing.nii.gz"):
        out2 = tmp_path / f"out_{missing}"
        assert main(["convert", good, str(tmp_path / missing), "-o", str(out2)]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / missing}: no such file or folder" in err and not out2.exists()


def test_duplicates_are_converted_once(tmp_path):
    a = _nifti(str(tmp_path / "data" / "a.nii.gz"))
    uid = "1.2.826.0.1.3680043.8.498.55.1"
    _series(str(tmp_path / "data" / "s"), uid)
    shutil.copytree(tmp_path / "data" / "s", tmp_path / "copy")  # an identical re-export
    os.symlink(a, tmp_path / "link.nii.gz")
    out = tmp_path / "out"
    inputs = [a, a, str(tmp_path / "data"), str(tmp_path / "link.nii.gz"), str(tmp_path / "copy")]
    assert main(["convert", *inputs, "-o", str(out), "--spacing", "3", "-j", "1"]) == 0
    m = _manifest(out)
    assert sorted(r["status"] for r in m.values()) == ["ok", "ok"], m
    dicom = next(r for r in m.values() if r["series_uid"] == uid)
    assert "identical copies" in dicom["warnings"]


def test_different_copies_under_one_series_uid_are_kept_apart_per_folder(tmp_path):
    uid = "1.2.826.0.1.3680043.8.498.55.2"
    _series(str(tmp_path / "a"), uid, seed=1)
    _series(str(tmp_path / "b"), uid, seed=2)  # same UIDs, other voxels
    from medproc.io.dicom_scan import scan_dicom

    scan = scan_dicom(str(tmp_path))
    assert len(scan.series) == 2 and not any(s.problems for s in scan.series)
    assert {os.path.basename(s.files[0].rsplit(os.sep, 1)[0]) for s in scan.series} == {"a", "b"}
    assert all("kept as a series of its own" in s.notes[0] for s in scan.series)
    with pytest.warns(medproc.errors.MedprocWarning, match="kept as a series of its own"):
        vols = [medproc.load(tmp_path, series=s.key) for s in scan.series]
    assert not np.array_equal(vols[0].array, vols[1].array)
    for d in ("a", "b"):  # each folder alone is the series it always was
        assert medproc.load(tmp_path / d).shape == (12, 10, 5)


def test_exports_of_one_series_that_differ_in_a_file_are_each_whole(tmp_path):
    """Three exports of one series: B an identical copy of A, C with one file edited. Each
    folder that differs is the whole series it always was (not the edited file alone, its
    other files merged into A's), and B is a copy of A; a damaged file in C fails C only."""
    import pydicom

    from medproc.io.dicom_scan import scan_dicom

    uid = "1.2.826.0.1.3680043.8.498.55.3"
    files = _series(str(tmp_path / "A"), uid)
    shutil.copytree(tmp_path / "A", tmp_path / "B")
    shutil.copytree(tmp_path / "A", tmp_path / "C")
    edited = os.path.join(tmp_path, "C", os.path.basename(files[2]))
    ds = pydicom.dcmread(edited)
    ds.InstitutionName = "another export"
    ds.save_as(edited)
    scan = scan_dicom(str(tmp_path))
    assert sorted(len(s.frames) for s in scan.series) == [5, 5]
    assert sorted({os.path.basename(d) for s in scan.series for d in s.folders}) == ["A", "C"]
    assert not any(s.problems for s in scan.series)
    a = next(s for s in scan.series if "A" in {os.path.basename(d) for d in s.folders})
    assert len(a.copies) == 5 and all(os.sep + "B" + os.sep in c for c in a.copies)
    del ds.PixelData  # now C holds a damaged file: C fails, naming it; A converts
    ds.save_as(edited)
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path), "-o", str(out), "--spacing", "3", "-j", "1"]) == 1
    m = {os.path.basename(r["source"]): r for r in _manifest(out).values()}
    assert m["A"]["status"] == "ok" and m["C"]["status"] == "failed"
    assert os.path.basename(edited) in m["C"]["error"] and len(m) == 2


def test_outputs_inside_an_input_tree_are_never_inputs(tmp_path):
    data = tmp_path / "data"
    for n in range(2):
        _nifti(str(data / f"c{n}.nii.gz"), seed=n)
    out = data / "out"
    args = ["convert", str(data), "-o", str(out), "--spacing", "3", "-j", "1"]
    assert main(args) == 0 and len(_manifest(out)) == 2
    assert main(args) == 0
    m = _manifest(out)
    assert len(m) == 2 and {r["status"] for r in m.values()} == {"skipped"}
    # an earlier run's output folder elsewhere in the tree is not an input either
    assert main(["convert", str(data), "-o", str(tmp_path / "o2"), "--spacing", "3"]) == 0
    assert sorted(_manifest(tmp_path / "o2")) == ["c0", "c1"]


def test_stale_temporaries_are_removed_and_unrecorded_outputs_redone(tmp_path):
    a = _nifti(str(tmp_path / "a.nii.gz"))
    b = _nifti(str(tmp_path / "b.nii.gz"), seed=1)
    out = tmp_path / "out"
    args = ["convert", a, b, "-o", str(out), "--spacing", "3", "-j", "1"]
    assert main(args) == 0
    # a killed run: a temporary left behind, and b written but never recorded
    stale = out / ".a.nii.gz.x1y2z3.part.nii.gz"
    stale.write_bytes(b"half")
    rows = [r for r in _manifest(out).values() if r["case"] != "b"]
    from medproc.manifest import write_manifest

    write_manifest(str(out / "manifest.csv"), rows)
    t_a = os.stat(out / "a.nii.gz").st_mtime_ns
    assert main(args) == 0
    m = _manifest(out)
    assert not stale.exists()
    assert m["a"]["status"] == "skipped" and os.stat(out / "a.nii.gz").st_mtime_ns == t_a
    assert m["b"]["status"] == "ok"  # redone: now in the manifest with its shapes
    assert m["b"]["out_shape"]


# --- kill -9 -----------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d))
    return kids


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _finals(out) -> dict:
    return {
        f: os.stat(os.path.join(out, f)).st_mtime_ns
        for f in os.listdir(out)
        if f.endswith(".nii.gz") and not f.startswith(".")
    }


@pytest.fixture(scope="module")
def kill_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("killdata")
    for n in range(8):
        _nifti(str(d / "in" / f"case{n}.nii.gz"), shape=(64, 64, 40), seed=n)
    clean = str(d / "clean")
    assert main(["convert", str(d / "in"), "-o", clean, "--spacing", "0.9", "-j", "1"]) == 0
    return str(d / "in"), clean


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process trees from /proc")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_dash_nine_of_the_main_process_at_a_random_point(kill_data, tmp_path, seed):
    src, clean = kill_data
    out = str(tmp_path / "out")
    rng = random.Random(seed)
    wait_outputs, extra_s = rng.choice([0, 1, 3, 5]), rng.uniform(0, 0.3)
    cmd = [sys.executable, "-m", "medproc", "convert", src, "-o", out]
    p = subprocess.Popen(
        cmd + ["--spacing", "0.9", "-j", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline, workers = time.time() + 120, set()
    while time.time() < deadline and p.poll() is None:
        workers |= set(_children(p.pid))
        if os.path.isdir(out) and len(_finals(out)) >= wait_outputs and workers:
            break
        time.sleep(0.02)
    time.sleep(extra_s)
    workers |= set(_children(p.pid))
    os.kill(p.pid, signal.SIGKILL)  # the main process alone, as an OOM killer does
    p.wait()
    assert workers, "the pool never started"
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.05)
    assert not [w for w in workers if _alive(w)], "workers outlived their parent"
    time.sleep(0.3)  # nothing may appear any more
    finished = _finals(out) if os.path.isdir(out) else {}
    for f in finished:  # every file under a final name is complete
        medproc.load(os.path.join(out, f))
    recorded = {c for c, r in _manifest(out).items() if r["status"] == "ok"}
    # resume
    assert main(["convert", src, "-o", out, "--spacing", "0.9", "-j", "1"]) == 0
    m = _manifest(out)
    assert len(m) == 8 and {r["status"] for r in m.values()} <= {"ok", "skipped"}
    assert {c for c, r in m.items() if r["status"] == "skipped"} == recorded  # nothing redone
    for c in recorded:
        assert os.stat(os.path.join(out, f"{c}.nii.gz")).st_mtime_ns == finished[f"{c}.nii.gz"]
    assert not [f for f in os.listdir(out) if ".part" in f]  # stale temporaries removed
    on_disk = set(_finals(out))
    assert on_disk == {os.path.basename(r["output"]) for r in m.values()}  # all in the manifest
    for f in on_disk:  # the same outputs as a clean run
        a = np.asarray(nib.load(os.path.join(out, f)).dataobj)
        b = np.asarray(nib.load(os.path.join(clean, f)).dataobj)
        np.testing.assert_array_equal(a, b)


def _dies_on_case_b(args):
    """A batch worker that is killed (as the OOM killer does) when it gets case ``b``."""
    from medproc._convert_case import _worker

    if "b.nii" in args[0].source:
        os.kill(os.getpid(), signal.SIGKILL)
    return _worker(args)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_killed_fails_the_cases_left_and_the_batch_reports_them(
    tmp_path, monkeypatch, workers
):
    """A pool worker killed mid-batch breaks the pool: the batch does not end in a traceback,
    every case gets its row (converted, or failed saying why), and a rerun converts the rest."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    import medproc._batch as batch
    from medproc.convert import convert

    data = tmp_path / "in"
    for n, name in enumerate("abcdef"):
        _nifti(str(data / f"{name}.nii.gz"), seed=n)
    out = tmp_path / "out"
    monkeypatch.setattr(batch, "_worker", _dies_on_case_b)
    spec = medproc.Spec(spacing=3.0)
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as ex:
        rows = convert([str(data)], str(out), spec, executor=ex, workers=workers)
    by = {r["case"]: r for r in rows}
    assert len(by) == 6
    assert by["b"]["status"] == "failed" and "its worker died" in by["b"]["error"]
    if workers == 1:  # a before b; the others never started
        assert by["a"]["status"] == "ok"
        for c in "cdef":
            assert by[c]["status"] == "failed" and "worker pool broke" in by[c]["error"], by[c]
    for c in "acdef":  # (with 2 workers: done before, running beside b, or never started)
        r = by[c]
        why = r["error"] if r["status"] == "failed" else ""
        assert r["status"] == "ok" or "worker pool broke" in why or "its worker died" in why, r
    assert {r["case"]: r["status"] for r in _manifest(out).values()} == {
        c: r["status"] for c, r in by.items()
    }
    monkeypatch.undo()
    assert main(["convert", str(data), "-o", str(out), "--spacing", "3", "-j", "1", "-q"]) == 0
    again = {c: r["status"] for c, r in _manifest(out).items()}
    done = {c for c, r in by.items() if r["status"] == "ok"}
    assert again == {c: "skipped" if c in done else "ok" for c in "abcdef"}


def test_a_second_ctrl_c_while_a_row_is_written_loses_no_row(tmp_path, monkeypatch):
    """A Ctrl-C that lands while the manifest is written for a finished case (the case's
    files are on disk) leaves the manifest with that case's row all the same."""
    import medproc._batch as batch
    from medproc.convert import convert

    data = tmp_path / "in"
    for n, name in enumerate("abc"):
        _nifti(str(data / f"{name}.nii.gz"), seed=n)
    real, calls = batch.write_manifest, []

    def interrupted_at_the_last_case(path, rows):
        calls.append(len(rows))
        if len([r for r in rows if r.get("status") == "ok"]) == 3 and calls.count(-1) == 0:
            calls.append(-1)
            raise KeyboardInterrupt  # (as the signal would, before the file is replaced)
        real(path, rows)

    monkeypatch.setattr(batch, "write_manifest", interrupted_at_the_last_case)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        convert([str(data)], str(out), medproc.Spec(spacing=3.0), workers=1)
    assert -1 in calls
    assert {c: r["status"] for c, r in _manifest(out).items()} == dict.fromkeys("abc", "ok")


def _scan_dies(files, strict=False):
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would, in a pool's worker


def test_a_worker_killed_while_headers_are_read_is_a_clear_error(tmp_path, monkeypatch):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from medproc.convert import convert
    from medproc.errors import MedprocError
    from medproc.io import dicom_scan

    data = tmp_path / "dicom"
    _series(str(data / "s1"), "1.2.3.4")
    monkeypatch.setattr(dicom_scan, "POOL_MIN_FILES", 1)
    monkeypatch.setattr(dicom_scan, "_scan_files", _scan_dies)
    out = tmp_path / "out"
    with ProcessPoolExecutor(1, mp_context=mp.get_context("fork")) as ex:
        with pytest.raises(MedprocError, match="worker process died while the DICOM headers"):
            convert([str(data)], str(out), medproc.Spec(spacing=3.0), executor=ex, workers=1)


def test_a_label_map_that_is_not_one_is_named(tmp_path):
    """A float label map with a value that is not a whole number: the error names the label
    file (the engine's message named the image)."""
    import nibabel as nib

    img = _nifti(str(tmp_path / "img" / "c.nii.gz"))
    lab = np.zeros(nib.load(img).shape, np.float32)
    lab[2, 2, 2] = 0.5
    os.makedirs(tmp_path / "lab")
    nib.save(nib.Nifti1Image(lab, nib.load(img).affine), str(tmp_path / "lab" / "c.nii.gz"))
    out = tmp_path / "out"
    args = ["convert", str(tmp_path / "img"), "--labels", str(tmp_path / "lab"), "-o", str(out)]
    assert main([*args, "--spacing", "3", "-q"]) == 1
    (row,) = _manifest(out).values()
    assert row["error"].startswith(f"{tmp_path / 'lab' / 'c.nii.gz'}: label maps must hold whole")
    assert "got the float32 value 0.5" in row["error"]
    with pytest.raises(medproc.ReadError, match="lab/c.nii.gz: label maps must hold whole"):
        medproc.resample_batch(
            [medproc.load(img)],
            medproc.Spec(spacing=3),
            labels=[medproc.load(tmp_path / "lab" / "c.nii.gz")],
        )


def test_a_file_name_that_is_not_utf8_is_done_once(tmp_path):
    """The manifest (UTF-8) writes such a name's bytes escaped and reads them back: a rerun
    skips the case (it converted it again on every run)."""
    weird = os.path.join(str(tmp_path / "in"), os.fsdecode(b"lat\xe9in1.nii.gz"))
    _nifti(weird)
    args = ["convert", str(tmp_path / "in"), "-o", str(tmp_path / "o"), "--spacing", "3", "-q"]
    assert main(args) == 0
    assert main(args) == 0
    from medproc.manifest import read_manifest

    (row,) = read_manifest(str(tmp_path / "o" / "manifest.csv")).values()
    assert row["status"] == "skipped" and row["source"] == weird


def test_only_files_that_share_a_sop_instance_uid_are_read_to_compare(tmp_path, monkeypatch):
    """Telling copies apart reads the bytes of files that share a SOPInstanceUID, and of
    folders with the same UIDs, never the whole of every export."""
    import pydicom

    from medproc.io import dicom_copies
    from medproc.io.dicom_scan import scan_dicom

    uid = "1.2.826.0.1.3680043.8.498.55.4"
    files = _series(str(tmp_path / "A"), uid)
    os.makedirs(tmp_path / "B")
    edited = str(tmp_path / "B" / os.path.basename(files[0]))
    ds = pydicom.dcmread(files[0])
    ds.InstitutionName = "edited"
    ds.save_as(edited)
    read = []
    real = dicom_copies._digest
    monkeypatch.setattr(dicom_copies, "_digest", lambda p, c: read.append(p) or real(p, c))
    scan = scan_dicom(str(tmp_path))
    assert sorted(len(s.frames) for s in scan.series) == [1, 5]
    assert set(read) <= {files[0], edited}
