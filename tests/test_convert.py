"""``medproc convert``: outputs, manifest, failures, resume, atomicity, names (CLI in-process)."""

import csv
import hashlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import medproc
from medproc.cli import main


def _manifest(d):
    with open(os.path.join(d, "manifest.csv")) as f:
        return {r["case"]: r for r in csv.DictReader(f)}


def _tree_hash(d):
    h = hashlib.sha1()
    for root, _, files in sorted(os.walk(d)):
        for n in sorted(files):
            p = os.path.join(root, n)
            h.update(p.encode())
            h.update(open(p, "rb").read())
    return h.hexdigest()


def test_convert_sample_data(sample_data, tmp_path):
    before = _tree_hash(sample_data)
    out = tmp_path / "out"
    args = ["convert", os.path.join(sample_data, "dicom"), os.path.join(sample_data, "nifti", "images"),
            "--labels", os.path.join(sample_data, "nifti", "labels"), "-o", str(out),
            "--spacing", "1.5", "--orientation", "RAS", "-j", "1"]
    assert main(args) == 0
    assert _tree_hash(sample_data) == before  # inputs untouched
    m = _manifest(out)
    assert {r["status"] for r in m.values()} == {"ok"} and len(m) == 4
    for r in m.values():
        assert "SYNTH" not in r["output"] and "PAT" not in r["output"]  # no patient identifiers
        vol = medproc.load(r["output"])
        assert vol.orientation == "RAS" and np.allclose(vol.spacing, 1.5)
        src = medproc.load(r["source"])
        ref = medproc.resample(src, spacing=1.5, orientation="RAS")
        np.testing.assert_allclose(vol.array, ref.array, atol=1e-3)
        np.testing.assert_allclose(vol.affine, ref.affine, atol=1e-5)
    lab = medproc.load(m["case001"]["label_output"])
    assert lab.array.dtype == np.uint8 and lab.array.max() == 2
    assert not [f for f in os.listdir(out) if ".part" in f]
    # rerun: everything skipped, nothing rewritten
    mtimes = {f: os.stat(out / f).st_mtime_ns for f in os.listdir(out) if f.endswith(".nii.gz")}
    assert main(args) == 0
    assert {r["status"] for r in _manifest(out).values()} == {"skipped"}
    assert all(os.stat(out / f).st_mtime_ns == t for f, t in mtimes.items())
    assert _manifest(out)["case001"]["out_shape"] == m["case001"]["out_shape"]  # kept from the first run
    assert main(args + ["--force"]) == 0
    assert {r["status"] for r in _manifest(out).values()} == {"ok"}


def test_failures_are_reported_and_the_batch_goes_on(broken_dataset, sample_data, tmp_path, capsys):
    root = os.path.dirname(broken_dataset["nan"])
    out = tmp_path / "out"
    rc = main(["convert", root, os.path.join(sample_data, "dicom", "ct_axial"), "-o", str(out),
               "--spacing", "3", "-j", "1"])
    assert rc == 1
    m = _manifest(out)
    status = {os.path.basename(r["source"]): (r["status"], r["error"]) for r in m.values()}
    assert status["missing_slice"][0] == "failed" and "missing slices" in status["missing_slice"][1]
    assert status["duplicate_slice"][0] == "failed"
    assert status["truncated"][0] == "failed" and "IM00002.dcm" in status["truncated"][1]
    assert status["nan.nii.gz"][0] == "failed" and "NaN" in status["nan.nii.gz"][1]
    assert status["ct_axial"][0] == "ok"
    assert "failed" in capsys.readouterr().err
    # asked to, the NaN case converts with its NaNs set to 0; finished cases are not redone
    assert main(["convert", os.path.dirname(broken_dataset["nan"]), "-o", str(out), "--spacing", "3", "-j", "1",
                 "--nan", "zero"]) == 1
    nan_row = next(r for r in _manifest(out).values() if r["source"].endswith("nan.nii.gz"))
    assert nan_row["status"] == "ok" and np.isfinite(medproc.load(nan_row["output"]).array).all()


def test_name_template_format_and_csv_list(sample_data, tmp_path):
    lst = tmp_path / "cases.csv"
    img = os.path.join(sample_data, "nifti", "images", "case002.nii.gz")
    lab = os.path.join(sample_data, "nifti", "labels", "case002.nii.gz")
    lst.write_text(f"image,label,name\n{img},{lab},patientless-7\n")
    out = tmp_path / "o"
    assert main(["convert", str(lst), "-o", str(out), "--spacing", "2", "--format", "npy",
                 "--name", "{name}_{uid_hash}", "--clip", "-1000", "400", "--scale", "0", "1"]) == 0
    (row,) = _manifest(out).values()
    assert os.path.basename(row["output"]).startswith("patientless-7_") and row["output"].endswith(".npy")
    arr = np.load(row["output"])
    assert arr.min() >= 0 and arr.max() <= 1
    import json

    side = json.load(open(row["output"][:-4] + ".json"))
    assert side["shape"] == list(arr.shape)
    with pytest.raises(ValueError, match="unknown field"):
        main(["convert", str(lst), "-o", str(out), "--spacing", "2", "--name", "{patient}"])


def test_bad_case_list(tmp_path):
    lst = tmp_path / "bad.csv"
    lst.write_text("path\nfoo.nii.gz\n")
    with pytest.raises(medproc.MedprocError, match="bad.csv.*'image' column"):
        main(["convert", str(lst), "-o", str(tmp_path / "o"), "--spacing", "2"])


def test_kill_dash_nine_then_resume(tmp_path):
    """kill -9 in the middle of a batch: no half-written output under a final name, and the
    rerun finishes the rest without redoing finished cases."""
    from medproc.sample_data import make_dataset

    data = tmp_path / "data"
    make_dataset(str(data), cases=6, size=128, slices=(40, 50), lesions=1)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "medproc.cli", "convert", str(data / "dicom"), "-o", str(out),
           "--spacing", "0.6", "-j", "1"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        done = [f for f in os.listdir(out) if f.endswith(".nii.gz") and not f.startswith(".")] if out.exists() else []
        if len(done) >= 2:
            break
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    finished = {f: os.stat(out / f).st_mtime_ns for f in os.listdir(out)
                if f.endswith(".nii.gz") and not f.startswith(".")}
    assert 2 <= len(finished) < 6
    for f in finished:  # every file under a final name is complete
        medproc.load(out / f)
    assert main(["convert", str(data / "dicom"), "-o", str(out), "--spacing", "0.6", "-j", "1"]) == 0
    m = _manifest(out)
    assert len(m) == 6 and {r["status"] for r in m.values()} <= {"ok", "skipped"}
    assert sum(r["status"] == "skipped" for r in m.values()) == len(finished)
    for f, t in finished.items():
        assert os.stat(out / f).st_mtime_ns == t
    leftovers = [f for f in os.listdir(out) if ".part" in f]
    for f in leftovers:  # a temporary from the killed write may remain; never a final name
        assert f.startswith(".")


@pytest.mark.slow
def test_parallel_workers(sample_data, tmp_path):
    assert main(["convert", os.path.join(sample_data, "dicom"), "-o", str(tmp_path), "--spacing", "2", "-j", "2"]) == 0
    assert {r["status"] for r in _manifest(tmp_path).values()} == {"ok"}


def test_qc_pictures(sample_data, tmp_path):
    out = tmp_path / "o"
    assert main(["convert", os.path.join(sample_data, "nifti", "images"), "--labels",
                 os.path.join(sample_data, "nifti", "labels"), "-o", str(out), "--spacing", "2",
                 "--qc", "-j", "1"]) == 0
    pngs = sorted(os.listdir(out / "qc"))
    assert pngs == ["case001.png", "case002.png"]
    import matplotlib.image as mpimg

    img = mpimg.imread(out / "qc" / "case001.png")
    assert img.shape[0] > 300 and img.shape[1] > 600
    # the label contour is drawn in lime: some pixels are green-dominant
    rgb = img[..., :3]
    assert ((rgb[..., 1] > 0.7) & (rgb[..., 0] < 0.5) & (rgb[..., 2] < 0.5)).sum() > 10


def test_dask_local_cluster(sample_data, tmp_path):
    """The same conversion on dask.distributed workers (a LocalCluster of 2 processes)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        pids = set(client.run(os.getpid).values())
        out = tmp_path / "o"
        assert main(["convert", os.path.join(sample_data, "dicom"), "-o", str(out), "--spacing", "2",
                     "--dask", cluster.scheduler_address]) == 0
    m = _manifest(out)
    assert {r["status"] for r in m.values()} == {"ok"} and len(m) == 2
    ran_on = {int(r["worker"].rsplit(":", 1)[1]) for r in m.values()}
    assert ran_on <= pids and os.getpid() not in ran_on
    ref = medproc.resample(medproc.load(os.path.join(sample_data, "dicom", "ct_axial")), spacing=2)
    row = next(r for r in m.values() if r["source"].endswith("ct_axial"))
    np.testing.assert_allclose(medproc.load(row["output"]).array, ref.array, atol=1e-3)


def test_outputs_have_ordinary_permissions(sample_data, tmp_path):
    import stat

    out = tmp_path / "o"
    assert main(["convert", os.path.join(sample_data, "dicom", "ct_axial"), "-o", str(out), "--spacing", "3"]) == 0
    umask = os.umask(0)
    os.umask(umask)
    for f in os.listdir(out):
        assert stat.S_IMODE(os.stat(out / f).st_mode) == 0o666 & ~umask, f


def test_npy_cache_is_read_by_dalis_numpy_reader_with_a_roi(sample_data, tmp_path):
    """The training cache: DALI's numpy reader reads just a region (roi_start/roi_end) of a
    converted volume, equal to the same slice of the array."""
    from nvidia.dali import fn, pipeline_def

    assert main(["convert", os.path.join(sample_data, "dicom", "ct_axial"), "-o", str(tmp_path),
                 "--spacing", "2", "--format", "npy", "-j", "1"]) == 0
    (row,) = _manifest(tmp_path).values()
    arr = np.load(row["output"])
    start, end = [3, 10, 20], [11, 40, 60]

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def reader():
        return fn.readers.numpy(files=[row["output"]], roi_start=start, roi_end=end)

    p = reader()
    p.build()
    (out,) = p.run()
    np.testing.assert_array_equal(np.array(out[0]), arr[3:11, 10:40, 20:60])
