"""``medproc convert`` keeps the output folder clean and never touches what is not its own: the
lock is never written through a link, only medproc's temporaries are cleaned up, a failed case
takes back what it wrote, outputs never replace files medproc did not write, a replaced input is
converted again, a redo removes the side files it no longer writes; and the options, dry runs,
exit statuses and worker counts say what the run does (CLI in-process)."""

import csv
import errno
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import medproc
from medproc.cli import main


def _manifest(d):
    with open(os.path.join(d, "manifest.csv"), newline="") as f:
        return {r["case"]: r for r in csv.DictReader(f)}


def _images(sample_data):
    return os.path.join(sample_data, "nifti", "images")


def _copy_images(sample_data, dst, names=("case001", "case002")):
    os.makedirs(dst, exist_ok=True)
    for n in names:
        shutil.copy(os.path.join(_images(sample_data), f"{n}.nii.gz"), dst)
    return str(dst)


def _lesions(tmp_path, diameter=10.0):
    p = tmp_path / "lesions.csv"
    p.write_text(f"seriesuid,coordX,coordY,coordZ,diameter_mm\ncase001,0,0,0,{diameter}\n")
    return str(p)


# --- 1. the lock file ------------------------------------------------------------------------
@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_lock_file_that_is_a_link_is_never_written_through(sample_data, tmp_path, link):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    lock = out / ".medproc.lock"
    (os.symlink if link == "symlink" else os.link)(victim, lock)
    img = os.path.join(_images(sample_data), "case001.nii.gz")
    assert main(["convert", img, "-o", str(out), "--spacing", "3", "-j", "1", "-q"]) == 0
    assert victim.read_text() == "precious"  # untouched
    assert os.stat(victim).st_nlink == 1  # the link was replaced by a lock of its own,
    assert not os.path.lexists(lock)  # which the run removed when it ended


def test_a_lock_that_is_a_folder_is_a_clear_error(sample_data, tmp_path, capsys):
    out = tmp_path / "out"
    (out / ".medproc.lock").mkdir(parents=True)
    img = os.path.join(_images(sample_data), "case001.nii.gz")
    assert main(["convert", img, "-o", str(out), "--spacing", "3", "-j", "1"]) == 2
    assert ".medproc.lock" in capsys.readouterr().err
    assert not (out / "manifest.csv").exists()


# --- 2. temporaries ----------------------------------------------------------------------------
def test_only_medproc_s_own_temporaries_are_removed(sample_data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    mine = [".case001.nii.gz.k2j3h4g5.part.nii.gz", ".case001.json.a_b1c2d3.part.json"]
    theirs = [".dataset.tar.part", ".thesis.part.docx", ".notes.txt.abcdefgh.part.txt"]
    theirs += [".x.nii.gz.abcdefgh.part.json"]  # (not how medproc names a temporary of x.nii.gz)
    for n in mine + theirs:
        (out / n).write_text("data")
    img = os.path.join(_images(sample_data), "case001.nii.gz")
    assert main(["convert", img, "-o", str(out), "--spacing", "3", "-j", "1", "-q"]) == 0
    left = set(os.listdir(out))
    assert set(theirs) <= left and not set(mine) & left
    assert all((out / n).read_text() == "data" for n in theirs)


# --- 3. a failed case takes back what it wrote ------------------------------------------------
def test_a_failed_case_removes_the_outputs_it_wrote(sample_data, tmp_path, monkeypatch):
    import medproc.qc

    real = medproc.qc.qc_figure

    def qc_figure(*args, **kw):
        if "case001" in kw.get("title", ""):
            raise OverflowError("boom")
        return real(*args, **kw)

    monkeypatch.setattr(medproc.qc, "qc_figure", qc_figure)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3", "-j", "1", "-q"]
    assert main(args + ["--qc", "--annotations", _lesions(tmp_path)]) == 1
    m = _manifest(out)
    assert m["case001"]["status"] == "failed" and m["case002"]["status"] == "ok"
    left = set(os.listdir(out))
    assert not {n for n in left if n.startswith("case001")}, left  # nothing of the failed case
    assert {"case002.nii.gz", "case002.json", "notes.txt"} <= left
    assert os.listdir(out / "qc") == ["case002.png"]


def test_a_failed_case_alone_leaves_no_qc_folder(sample_data, tmp_path, monkeypatch):
    import medproc.qc

    def qc_figure(*args, **kw):
        raise OverflowError("boom")

    monkeypatch.setattr(medproc.qc, "qc_figure", qc_figure)
    out = tmp_path / "out"
    img = os.path.join(_images(sample_data), "case001.nii.gz")
    assert main(["convert", img, "-o", str(out), "--spacing", "3", "-j", "1", "-q", "--qc"]) == 1
    assert set(os.listdir(out)) == {"manifest.csv"}


# --- 4. never over files medproc did not write -------------------------------------------------
def test_a_sidecar_never_replaces_the_user_s_json(sample_data, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(os.path.join(_images(sample_data), "case001.nii.gz"), data / "sub-01_T1w.nii.gz")
    bids = '{"RepetitionTime": 2.0}'
    (data / "sub-01_T1w.json").write_text(bids)
    img = str(data / "sub-01_T1w.nii.gz")
    args = ["convert", img, "-o", str(data), "--spacing", "3", "--format", "nii", "-j", "1"]
    assert main(args) == 1
    assert (data / "sub-01_T1w.json").read_text() == bids
    assert not (data / "sub-01_T1w.nii").exists()
    row = _manifest(data)["sub-01_T1w"]
    assert row["status"] == "failed" and "sub-01_T1w.json" in row["error"]
    assert "sub-01_T1w.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["case001.nii.gz", "case001.json", "case001_label.nii.gz", "case001.annotations.json"]
)
def test_an_output_path_holding_a_file_of_someone_else_fails_the_case(sample_data, tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("not medproc's")
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3", "-j", "1", "-q"]
    args += ["--labels", os.path.join(sample_data, "nifti", "labels")]
    args += ["--annotations", _lesions(tmp_path)]
    assert main(args) == 1
    assert (out / name).read_text() == "not medproc's"
    m = _manifest(out)
    assert m["case001"]["status"] == "failed" and name in m["case001"]["error"]
    assert m["case002"]["status"] == "ok"
    assert not (out / "case001.nii.gz").exists() or name == "case001.nii.gz"
    # the dry run says so too
    assert main(args + ["--dry-run"]) == 1


def test_output_folder_equal_to_an_input_folder_is_a_usage_error(sample_data, tmp_path, capsys):
    d = _copy_images(sample_data, tmp_path / "in")
    before = sorted(os.listdir(d))
    assert main(["convert", d, "-o", d, "--spacing", "3", "-j", "1"]) == 2
    err = capsys.readouterr().err
    assert "usage error" in err and "output folder" in err
    assert sorted(os.listdir(d)) == before


# --- 5. a replaced input is converted again ----------------------------------------------------
def test_a_replaced_input_is_converted_again(sample_data, tmp_path, caplog):
    import logging

    src = tmp_path / "in"
    src.mkdir()
    a = src / "a.nii.gz"
    shutil.copy(os.path.join(_images(sample_data), "case001.nii.gz"), a)
    out = str(tmp_path / "out")
    args = ["convert", str(src), "-o", out, "--spacing", "3", "-j", "1", "-q"]
    assert main(args) == 0
    first = _manifest(out)["a"]
    assert first["input_id"]
    assert main(args) == 0 and _manifest(out)["a"]["status"] == "skipped"
    shutil.copy(os.path.join(_images(sample_data), "case002.nii.gz"), a)  # another image
    with caplog.at_level(logging.INFO, logger="medproc"):
        assert main(args) == 0
    row = _manifest(out)["a"]
    assert row["status"] == "ok" and row["input_id"] != first["input_id"]
    import medproc

    assert row["in_shape"] == "x".join(map(str, medproc.load(str(a)).shape))
    assert any("changed" in r.getMessage() for r in caplog.records)


def test_a_touched_label_map_is_converted_again_and_leaving_out_labels_is_no_change(
    sample_data, tmp_path
):
    imgs = _copy_images(sample_data, tmp_path / "img", ["case001"])
    labs = tmp_path / "lab"
    labs.mkdir()
    shutil.copy(os.path.join(sample_data, "nifti", "labels", "case001.nii.gz"), labs)
    out = str(tmp_path / "out")
    args = ["convert", imgs, "-o", out, "--spacing", "3", "-j", "1", "-q"]
    assert main(args + ["--labels", str(labs)]) == 0
    assert main(args) == 0 and _manifest(out)["case001"]["status"] == "skipped"
    st = os.stat(labs / "case001.nii.gz")
    os.utime(labs / "case001.nii.gz", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert main(args + ["--labels", str(labs)]) == 0
    assert _manifest(out)["case001"]["status"] == "ok"


def test_a_manifest_without_input_identities_still_resumes(sample_data, tmp_path):
    img = os.path.join(_images(sample_data), "case001.nii.gz")
    out = str(tmp_path / "out")
    args = ["convert", img, "-o", out, "--spacing", "3", "-j", "1", "-q"]
    assert main(args) == 0
    rows = list(_manifest(out).values())
    fields = [k for k in rows[0] if k != "input_id"]
    with open(os.path.join(out, "manifest.csv"), "w", newline="") as f:  # an older medproc's
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    assert main(args) == 0
    assert _manifest(out)["case001"]["status"] == "skipped"


# --- 6. a redo removes the side files it does not write ----------------------------------------
def test_a_forced_redo_removes_the_old_side_files(sample_data, tmp_path):
    out = tmp_path / "out"
    base = ["convert", _images(sample_data), "-o", str(out), "-j", "1", "-q"]
    first = ["--spacing", "3", "--qc", "--annotations", _lesions(tmp_path)]
    first += ["--labels", os.path.join(sample_data, "nifti", "labels")]
    assert main(base + first) == 0
    assert (out / "case001_label.nii.gz").exists() and (out / "case001.annotations.json").exists()
    assert (out / "qc" / "case001.png").exists()
    (out / "notes.txt").write_text("mine")
    assert main(base + ["--spacing", "3"]) == 0  # a rerun without them skips (their rows
    assert {r["status"] for r in _manifest(out).values()} == {"skipped"}  # name no label now)
    assert main(base + ["--spacing", "4", "--force"]) == 0
    left = set(os.listdir(out))
    assert not {n for n in left if "_label" in n or "annotations" in n}, left
    assert not os.path.exists(out / "qc") or not os.listdir(out / "qc")
    assert "notes.txt" in left
    m = _manifest(out)
    assert {r["status"] for r in m.values()} == {"ok"} and not m["case001"]["label_output"]
    doc = json.loads((out / "case001.json").read_text())
    assert doc["label_output"] is None and doc["output"]["spacing"] == [4.0, 4.0, 4.0]


# --- 7. the dry run fails what the headers already fail ----------------------------------------
def _header_failures(sample_data, d):
    import gzip
    import struct

    os.makedirs(d)
    img = os.path.join(_images(sample_data), "case001.nii.gz")
    raw = bytearray(gzip.decompress(open(img, "rb").read()))
    struct.pack_into("<4h", raw, 40, 3, 32767, 32767, 32767)
    with open(os.path.join(d, "huge_header.nii.gz"), "wb") as f:
        f.write(gzip.compress(bytes(raw)))
    open(os.path.join(d, "empty.nii"), "wb").close()
    series = os.path.join(d, "missing_slice")
    shutil.copytree(os.path.join(sample_data, "dicom", "ct_axial"), series)
    os.unlink(os.path.join(series, "IM00007.dcm"))


def test_dry_run_fails_the_cases_their_headers_fail(sample_data, tmp_path, capsys):
    src = str(tmp_path / "in")
    _header_failures(sample_data, src)
    out = str(tmp_path / "out")
    assert main(["convert", src, "-o", out, "--spacing", "3", "--dry-run"]) == 1
    text = capsys.readouterr().out
    fails = [ln for ln in text.splitlines() if ln.startswith("fail")]
    assert len(fails) == 3, text
    assert not [ln for ln in text.splitlines() if ln.startswith("convert")], text
    assert "0 to convert" in text and "3 failed" in text
    assert not os.path.exists(out)


def test_dry_run_that_lists_a_failure_exits_1(sample_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEDPROC_MAX_BYTES", "20M")
    out = str(tmp_path / "out")
    args = ["convert", os.path.join(sample_data, "dicom"), "-o", out, "--spacing", "0.5"]
    assert main(args + ["--dry-run"]) == 1
    assert "fail" in capsys.readouterr().out
    img = os.path.join(_images(sample_data), "case001.nii.gz")
    assert main(["convert", img, "-o", out, "--spacing", "3", "--dry-run"]) == 0


# --- 8. dask -----------------------------------------------------------------------------------
def test_dask_local_n_reports_n_workers_and_starts_no_dashboard(sample_data, tmp_path, capsys):
    pytest.importorskip("distributed")
    from medproc._procs import dask_executor

    ex, closers = dask_executor("local:1", 3)
    try:
        assert ex.medproc_workers == 1
        cluster = closers[-1].__self__  # (the LocalCluster)
        ports = [s.getsockname() for s in cluster.scheduler.http_server._sockets.values()]
        assert ports and all(host == "127.0.0.1" and port != 8787 for host, port, *_ in ports)
    finally:
        for close in closers:
            close()
    out = str(tmp_path / "out")
    args = ["convert", _images(sample_data), "-o", out, "--spacing", "3", "--dask", "local:1"]
    assert main(args) == 0
    assert "with 1 worker(s)" in capsys.readouterr().err


# --- 9. a manifest that cannot be written ------------------------------------------------------
def test_no_space_for_the_manifest_is_exit_1_saying_so(sample_data, tmp_path, monkeypatch, capsys):
    import contextlib

    import medproc.manifest as mf

    real, calls = mf.atomic_write, []

    @contextlib.contextmanager
    def full(path):
        calls.append(path)
        if len(calls) > 1:  # the first write (at the start) works, the next finds the disk full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        with real(path) as tmp:
            yield tmp

    monkeypatch.setattr(mf, "atomic_write", full)
    out = str(tmp_path / "out")
    args = ["convert", _images(sample_data), "-o", out, "--spacing", "3", "-j", "1"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "manifest.csv" in err and os.strerror(errno.ENOSPC) in err


# --- 10. --dtype -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bool", "complex64", "object", "uint64"])
def test_a_dtype_the_pipeline_cannot_write_is_a_usage_error(sample_data, tmp_path, capsys, dtype):
    out = tmp_path / "out"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3", "-j", "1"]
    assert main(args + ["--dtype", dtype]) == 2
    err = capsys.readouterr().err
    assert "usage error" in err and "dtype" in err and repr(dtype) in err
    assert not out.exists()


# --- lesions keyed by a stem two inputs share ------------------------------------------------
def test_two_images_under_one_lesion_key_both_fail_naming_each_other(sample_data, tmp_path):
    """siteA/case001 and siteB/case001 (another patient): the table's 'case001' lesions would
    go to both; both fail, naming the two inputs, and a third case converts."""
    inp = tmp_path / "in"
    _copy_images(sample_data, inp / "siteA", ("case001",))
    os.makedirs(inp / "siteB")
    shutil.copy(
        os.path.join(_images(sample_data), "case002.nii.gz"), inp / "siteB" / "case001.nii.gz"
    )
    _copy_images(sample_data, inp / "siteC", ("case002",))
    out = tmp_path / "out"
    args = ["convert", str(inp), "-o", str(out), "--spacing", "3", "-j", "1", "-q"]
    assert main([*args, "--annotations", _lesions(tmp_path)]) == 1
    rows = {os.path.relpath(r["source"], inp): r for r in _manifest(out).values()}
    assert rows["siteC/case002.nii.gz"]["status"] == "ok"
    for site in ("siteA", "siteB"):
        r = rows[f"{site}/case001.nii.gz"]
        assert r["status"] == "failed" and "key 'case001' names 2 inputs" in r["error"]
        assert "siteA/case001.nii.gz" in r["error"] and "siteB/case001.nii.gz" in r["error"]


def test_a_series_listed_under_its_uid_and_its_folder_name_fails_naming_both(sample_data, tmp_path):
    """One series in the table by SeriesInstanceUID and by folder name (both documented keys):
    the UID's lesions were written, the folder name's dropped without a word (exit 0)."""
    series = os.path.join(sample_data, "dicom", "ct_axial")
    uid = "1.2.826.0.1.3680043.8.498.2026.1.1"
    table = tmp_path / "les.csv"
    head = "seriesuid,coordX,coordY,coordZ,diameter_mm\n"
    table.write_text(head + f"{uid},-62,-10,5,14\nct_axial,75,15,-20,10\n")
    out = tmp_path / "out"
    args = ["convert", series, "-o", str(out), "--spacing", "3", "-j", "1", "-q"]
    assert main([*args, "--annotations", str(table)]) == 1
    (r,) = _manifest(out).values()
    assert r["status"] == "failed" and "under 2 keys" in r["error"] and "'ct_axial'" in r["error"]
    table.write_text(head + "ct_axial,75,15,-20,10\n")  # one key: converted
    assert main([*args, "--annotations", str(table)]) == 0


def test_a_failed_case_removes_its_temporaries_only_not_hidden_files_named_like_them(
    sample_data, tmp_path
):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    out.mkdir()
    data = open(os.path.join(_images(sample_data), "case001.nii.gz"), "rb").read()
    (inp / "case001.nii.gz").write_bytes(data[:5000])  # truncated: the case fails
    mine = [out / ".case001.nii.gz.my.partial", out / ".case001.json.v2.part-backup"]
    for p in mine:
        p.write_text("mine")
    assert main(["convert", str(inp), "-o", str(out), "--spacing", "3", "-q"]) == 1
    assert all(p.read_text() == "mine" for p in mine)


def test_a_changed_input_whose_new_conversion_fails_leaves_no_output_of_the_old_one(
    sample_data, tmp_path
):
    inp = _copy_images(sample_data, tmp_path / "in", ("case001",))
    out = tmp_path / "out"
    args = ["convert", inp, "-o", str(out), "--spacing", "3", "-q"]
    assert main(args) == 0
    data = open(os.path.join(inp, "case001.nii.gz"), "rb").read()
    with open(os.path.join(inp, "case001.nii.gz"), "wb") as f:
        f.write(data[:1000])
    assert main(args) == 1
    assert not (out / "case001.nii.gz").exists() and not (out / "case001.json").exists()
    assert _manifest(out)["case001"]["status"] == "failed"


def test_dtype_spellings_are_one_option(sample_data, tmp_path):
    out = tmp_path / "out"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3", "-q"]
    assert main([*args, "--dtype", "f4"]) == 0
    assert main([*args, "--dtype", "float32"]) == 0  # not "other options"
    assert {r["status"] for r in _manifest(out).values()} == {"skipped"}


def test_a_users_own_table_named_manifest_csv_is_refused_not_moved_aside(sample_data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.csv").write_text("subject,age\ns,34\n")
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3", "-q"]
    assert main(args) == 2
    assert (out / "manifest.csv").read_text() == "subject,age\ns,34\n"
    assert os.listdir(out) == ["manifest.csv"]  # nothing added: no lock file left either


def test_a_run_leaves_no_lock_file_and_a_held_lock_still_refuses(sample_data, tmp_path, capsys):
    from holder import holding

    out = tmp_path / "out"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3", "-q"]
    assert main(args) == 0
    assert ".medproc.lock" not in os.listdir(out)
    # another process holding the folder's lock: refused, its lock file left in place
    with holding("medproc.manifest:OutdirLock", out):
        assert main([*args, "--force"]) == 2
        assert "another medproc convert" in capsys.readouterr().err
        assert (out / ".medproc.lock").exists()


def test_a_dry_run_says_when_another_run_holds_the_folder_and_never_releases_a_lock(
    sample_data, tmp_path, capsys
):
    """--dry-run does not take the lock, but it tests it: held by another process, the list
    comes with a warning naming that run's pid (exit 0 as before); held by this process (a
    library caller), testing it must not release it (closing any descriptor of a file drops
    the process's POSIX locks on it): another process is still refused."""
    from holder import holding

    from medproc.manifest import OutdirLock

    out = tmp_path / "out"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3", "--dry-run"]
    assert main(args) == 0
    assert "another medproc convert" not in capsys.readouterr().err
    out.mkdir()
    with holding("medproc.manifest:OutdirLock", out) as proc:
        assert main(args) == 0
        err = capsys.readouterr().err
        assert f"another medproc convert (pid {proc.pid}) is writing into" in err
    lock = OutdirLock(str(out))
    try:
        assert main(args) == 0
        assert f"(pid {os.getpid()})" in capsys.readouterr().err
        code = "import sys; from medproc.manifest import OutdirLock; OutdirLock(sys.argv[1])"
        other = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True)
        assert other.returncode != 0 and b"another medproc convert" in other.stderr
        # a second lock in this process is refused without touching the first (POSIX would
        # grant it, and releasing either would have dropped both)
        with pytest.raises(
            medproc.errors.OutputError, match=f"this process \\(pid {os.getpid()}\\)"
        ):
            OutdirLock(str(out))
        other = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True)
        assert other.returncode != 0 and b"another medproc convert" in other.stderr
    finally:
        lock.release()


@pytest.mark.parametrize("fmt", ["npy", "nii", "nii.gz"])
@pytest.mark.parametrize(
    "damage", ["truncated", "sidecar_gone", "label_truncated", "swapped", "label_sidecar_gone"]
)
def test_a_resume_redoes_a_case_whose_files_were_cut_short_or_lost(
    sample_data, tmp_path, capsys, fmt, damage
):
    """A rerun skipped every case whose output existed: a truncated .npy/.nii/.nii.gz, a lost
    <name>.json (the affine of a .npy cache) stayed so. Each output's size is checked against
    its own header (the gzip trailer for .nii.gz) and the sidecar must be there."""
    labels = os.path.join(sample_data, "nifti", "labels")
    out = tmp_path / "out"
    args = ["convert", _images(sample_data), "--labels", labels, "-o", str(out), "--spacing", "3"]
    args += ["--format", fmt, "-q"]
    assert main(args) == 0
    first = {f: (out / f).read_bytes() for f in os.listdir(out) if f != "manifest.csv"}
    ext = "." + fmt
    victim = out / (
        {"truncated": "case001", "label_truncated": "case001_label"}.get(damage, "case001") + ext
    )
    if damage == "label_sidecar_gone" and fmt != "npy":
        pytest.skip("only a .npy label has a sidecar of its own")
    if damage == "sidecar_gone":
        os.remove(out / "case001.json")
    elif damage == "label_sidecar_gone":  # (cut short: no longer JSON)
        side = out / "case001_label.json"
        side.write_text(side.read_text()[:20])
    elif damage == "swapped":  # (another case's output in its place: another shape)
        os.replace(out / f"case002{ext}", tmp_path / "x")
        os.replace(out / f"case001{ext}", out / f"case002{ext}")
        os.replace(tmp_path / "x", out / f"case001{ext}")
    else:
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) - 100)
    capsys.readouterr()
    assert main(args[:-1]) == 0
    err = capsys.readouterr().err
    redone = ["case001", "case002"] if damage == "swapped" else ["case001"]
    assert f"{len(redone)} case(s) converted by an earlier run ({', '.join(redone)})" in err
    m = _manifest(out)
    assert [c for c in m if m[c]["status"] == "ok"] == redone
    assert all(m[c]["status"] == "skipped" for c in m if c not in redone)
    again = {f: (out / f).read_bytes() for f in os.listdir(out) if f != "manifest.csv"}
    assert again.keys() == first.keys()
    for f in first:
        if not f.endswith(".json"):  # (the sidecar's record of the run may differ)
            assert again[f] == first[f], f


@pytest.mark.parametrize("fill", [np.float32(-1024), np.int16(-5), float("nan")])
def test_a_fill_given_as_a_numpy_scalar_or_nan_converts_and_resumes(sample_data, tmp_path, fill):
    """A numpy scalar failed to be recorded (not JSON); a NaN fill never resumed (NaN differs
    from NaN: 'fill: nan before, nan now'). Found by a late re-probe."""
    from medproc.convert import convert

    spec = medproc.Spec(spacing=3.0, crop=(120, 120, 40), fill=fill)
    out = str(tmp_path / "o")
    assert {r["status"] for r in convert([_images(sample_data)], out, spec)} == {"ok"}
    assert {r["status"] for r in convert([_images(sample_data)], out, spec)} == {"skipped"}


@pytest.mark.parametrize("which, at", [("case001.nii.gz", 0.5), ("case001_label.nii.gz", 0.5),
                                       ("case001.nii.gz", 0.01)])  # fmt: skip
def test_verify_redoes_an_output_damaged_inside_its_size_and_header(
    sample_data, tmp_path, which, at
):
    """64 bytes flipped inside a .nii.gz (size and header kept): a rerun kept it as done and
    the manifest vouched for a file nibabel cannot read (a durability prober's finding;
    documented: sizes and headers only). A plain rerun still does that; --verify reads every
    finished output whole, redoes the damaged case (the same bytes as before) and only that
    one: a bad checksum (the middle), a broken deflate block (near the start: it crashed as
    a bug), and with -o spelled another way than the manifest's (it checked nothing)."""
    labels = os.path.join(sample_data, "nifti", "labels")
    out = tmp_path / "out"
    args = ["convert", _images(sample_data), "--labels", labels, "--spacing", "3"]
    assert main(args + ["-o", str(out), "-q"]) == 0
    victim = out / which
    first = victim.read_bytes()
    raw = bytearray(first)
    start = max(40, int(len(raw) * at))
    raw[start : start + 64] = bytes(b ^ 0xFF for b in raw[start : start + 64])
    victim.write_bytes(bytes(raw))
    args += ["-o", f"{tmp_path}/x/../out"]  # (the same folder, written otherwise)
    assert main(args + ["-q"]) == 0
    assert {r["status"] for r in _manifest(out).values()} == {"skipped"}  # (not seen)
    assert main(args + ["-q", "--verify"]) == 0
    m = _manifest(out)
    assert m["case001"]["status"] == "ok" and m["case002"]["status"] == "skipped"
    assert victim.read_bytes() == first
    assert main(args + ["-q", "--verify"]) == 0  # (all whole: nothing to redo)
    assert {r["status"] for r in _manifest(out).values()} == {"skipped"}
