"""``medproc convert``: outputs, manifest, failures, resume, atomicity, names (CLI in-process).

Shapes, spacings and voxel indices are (i, j, k), NIfTI's order: an output NIfTI read by nibabel
is indexed exactly like ``medproc.load(output).array``, and the manifest and annotation files
use the same order.
"""

import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import nibabel as nib
import numpy as np
import pytest

import medproc
from medproc.cli import main


def _fmt(shape):
    return "x".join(str(int(n)) for n in shape)


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
    args = [
        "convert",
        os.path.join(sample_data, "dicom"),
        os.path.join(sample_data, "nifti", "images"),
        "--labels",
        os.path.join(sample_data, "nifti", "labels"),
        "-o",
        str(out),
        "--spacing",
        "1.5",
        "--orientation",
        "RAS",
        "-j",
        "1",
    ]
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
        # nibabel reads the output indexed exactly like medproc: same shape, voxels, affine
        img = nib.load(r["output"])
        assert img.shape == vol.shape and "".join(nib.aff2axcodes(img.affine)) == "RAS"
        np.testing.assert_array_equal(img.get_fdata(), vol.array)
        np.testing.assert_allclose(img.affine, vol.affine, atol=1e-6)
        # the manifest's shapes and spacings are (i, j, k) too
        assert r["in_shape"] == _fmt(src.shape) and r["out_shape"] == _fmt(vol.shape)
        assert r["out_spacing"] == "1.5x1.5x1.5"
    lab = medproc.load(m["case001"]["label_output"])
    assert lab.array.dtype == np.uint8 and lab.array.max() == 2
    out_img = medproc.load(m["case001"]["output"])
    assert lab.shape == out_img.shape and np.allclose(lab.affine, out_img.affine)
    np.testing.assert_array_equal(
        np.asarray(nib.load(m["case001"]["label_output"]).dataobj), lab.array
    )
    axial = next(r for r in m.values() if r["source"].endswith("ct_axial"))
    assert axial["in_shape"] == "112x112x40" and axial["in_spacing"] == "2.9x2.9x2.5"
    assert not [f for f in os.listdir(out) if ".part" in f]
    # rerun: everything skipped, nothing rewritten
    mtimes = {f: os.stat(out / f).st_mtime_ns for f in os.listdir(out) if f.endswith(".nii.gz")}
    assert main(args) == 0
    assert {r["status"] for r in _manifest(out).values()} == {"skipped"}
    assert all(os.stat(out / f).st_mtime_ns == t for f, t in mtimes.items())
    assert (
        _manifest(out)["case001"]["out_shape"] == m["case001"]["out_shape"]
    )  # kept from the first run
    assert main(args + ["--force"]) == 0
    assert {r["status"] for r in _manifest(out).values()} == {"ok"}


def test_failures_are_reported_and_the_batch_goes_on(broken_dataset, sample_data, tmp_path, capsys):
    root = os.path.dirname(broken_dataset["nan"])
    out = tmp_path / "out"
    rc = main(
        [
            "convert",
            root,
            os.path.join(sample_data, "dicom", "ct_axial"),
            "-o",
            str(out),
            "--spacing",
            "3",
            "-j",
            "1",
        ]
    )
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
    assert (
        main(
            [
                "convert",
                os.path.dirname(broken_dataset["nan"]),
                "-o",
                str(out),
                "--spacing",
                "3",
                "-j",
                "1",
                "--nan",
                "zero",
            ]
        )
        == 1
    )
    nan_row = next(r for r in _manifest(out).values() if r["source"].endswith("nan.nii.gz"))
    assert nan_row["status"] == "ok" and np.isfinite(medproc.load(nan_row["output"]).array).all()


def test_name_template_format_and_csv_list(sample_data, tmp_path, capsys):
    lst = tmp_path / "cases.csv"
    img = os.path.join(sample_data, "nifti", "images", "case002.nii.gz")
    lab = os.path.join(sample_data, "nifti", "labels", "case002.nii.gz")
    lst.write_text(f"image,label,name\n{img},{lab},patientless-7\n")
    out = tmp_path / "o"
    assert (
        main(
            [
                "convert",
                str(lst),
                "-o",
                str(out),
                "--spacing",
                "2",
                "--format",
                "npy",
                "--name",
                "{name}_{uid_hash}",
                "--clip",
                "-1000",
                "400",
                "--scale",
                "0",
                "1",
            ]
        )
        == 0
    )
    (row,) = _manifest(out).values()
    assert os.path.basename(row["output"]).startswith("patientless-7_") and row["output"].endswith(
        ".npy"
    )
    arr = np.load(row["output"])
    assert arr.min() >= 0 and arr.max() <= 1
    side = json.load(open(row["output"][:-4] + ".json"))
    assert (
        side["shape"] == list(arr.shape)
        and side["axes"] == "ijk"
        and side["dtype"] == str(arr.dtype)
    )
    # the cache is the volume indexed (i, j, k), stored in Fortran order (i fastest), on its affine
    assert np.isfortran(arr)
    ref = medproc.resample(
        medproc.load(img), spacing=2.0, intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1))
    )
    assert arr.shape == ref.shape and row["out_shape"] == _fmt(ref.shape)
    np.testing.assert_allclose(arr, ref.array, atol=1e-5)
    np.testing.assert_allclose(side["affine"], ref.affine, atol=1e-5)
    capsys.readouterr()
    rc = main(["convert", str(lst), "-o", str(out), "--spacing", "2", "--name", "{patient}"])
    err = capsys.readouterr().err
    assert rc == 2 and "naming template '{patient}' uses unknown field 'patient'" in err
    assert "Traceback" not in err


def test_bad_case_list(tmp_path, capsys):
    lst = tmp_path / "bad.csv"
    lst.write_text("path\nfoo.nii.gz\n")
    assert main(["convert", str(lst), "-o", str(tmp_path / "o"), "--spacing", "2"]) == 2
    err = capsys.readouterr().err
    assert "bad.csv: line 1: missing column(s) ['image']" in err and "Traceback" not in err
    with pytest.raises(medproc.MedprocError, match=r"bad.csv: line 1: missing column"):
        medproc.convert.convert([str(lst)], str(tmp_path / "o"), medproc.Spec(spacing=2))


def test_cases_live_in_medproc_cases_and_stay_importable_from_convert(sample_data):
    import medproc.cases
    import medproc.convert

    assert medproc.convert.Case is medproc.cases.Case
    assert medproc.convert.find_cases is medproc.cases.find_cases
    cases, skipped = medproc.convert.find_cases(
        [os.path.join(sample_data, "nifti", "images")],
        labels_dir=os.path.join(sample_data, "nifti", "labels"),
    )
    assert [c.name("{name}") for c in cases] == ["case001", "case002"] and skipped == []
    assert all(c.label and c.label.endswith(os.path.basename(c.source)) for c in cases)


@pytest.mark.gpu
def test_convert_on_the_gpu_equals_the_cpu(sample_data, tmp_path):
    """``--device gpu``: the voxels go to the GPU once (uncompressed DICOM and NIfTI are read on
    the CPU and copied) and the engine resamples the CUDA tensors; same outputs, labels and
    manifest as on the CPU."""
    args = [
        "convert",
        os.path.join(sample_data, "dicom"),
        os.path.join(sample_data, "nifti", "images"),
        "--labels",
        os.path.join(sample_data, "nifti", "labels"),
        "--spacing",
        "1.5",
        "--orientation",
        "RAS",
        "-j",
        "1",
    ]
    assert main(args + ["-o", str(tmp_path / "cpu")]) == 0
    assert main(args + ["-o", str(tmp_path / "gpu"), "--device", "gpu"]) == 0
    mc, mg = _manifest(tmp_path / "cpu"), _manifest(tmp_path / "gpu")
    assert sorted(mc) == sorted(mg) and len(mg) == 4
    for case, g in mg.items():
        c = mc[case]
        assert g["status"] == "ok"
        for key in ("decode", "in_shape", "in_spacing", "out_shape", "out_spacing"):
            assert g[key] == c[key], (case, key)
        a, b = medproc.load(c["output"]), medproc.load(g["output"])
        assert b.shape == a.shape and isinstance(b.array, np.ndarray)
        np.testing.assert_allclose(b.affine, a.affine, atol=1e-6)
        assert np.abs(b.array - a.array).max() <= 1e-4 * np.abs(a.array).max()
        if c["label_output"]:
            la, lb = medproc.load(c["label_output"]), medproc.load(g["label_output"])
            assert lb.array.dtype == la.array.dtype == np.uint8
            assert (la.array == lb.array).mean() >= 0.999
    axial = next(r for r in mg.values() if r["source"].endswith("ct_axial"))
    assert axial["decode"] == "cpu (native)"


def test_kill_dash_nine_then_resume(tmp_path):
    """kill -9 in the middle of a batch: no half-written output under a final name, and the
    rerun finishes the rest without redoing finished cases."""
    from medproc.sample_data import make_dataset

    data = tmp_path / "data"
    info = make_dataset(str(data), cases=6, size=128, slices=(40, 50), lesions=1)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "medproc.cli",
        "convert",
        str(data / "dicom"),
        "-o",
        str(out),
        "--spacing",
        "0.6",
        "-j",
        "1",
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        done = (
            [f for f in os.listdir(out) if f.endswith(".nii.gz") and not f.startswith(".")]
            if out.exists()
            else []
        )
        if len(done) >= 2:
            break
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    finished = {
        f: os.stat(out / f).st_mtime_ns
        for f in os.listdir(out)
        if f.endswith(".nii.gz") and not f.startswith(".")
    }
    assert 2 <= len(finished) < 6
    for f in finished:  # every file under a final name is complete
        medproc.load(out / f)
    recorded = {c for c, r in _manifest(out).items() if r["status"] == "ok"}
    assert (
        main(["convert", str(data / "dicom"), "-o", str(out), "--spacing", "0.6", "-j", "1"]) == 0
    )
    m = _manifest(out)
    assert len(m) == 6 and {r["status"] for r in m.values()} <= {"ok", "skipped"}
    # what the manifest recorded is not redone; an output written but not yet recorded when
    # the kill came is redone (so every output on disk is in the manifest)
    assert {c for c, r in m.items() if r["status"] == "skipped"} == recorded
    shapes = {c["series_uid"]: c["shape"] for c in info["cases"]}  # (i, j, k) = (128, 128, slices)
    for r in m.values():
        if r["status"] == "ok":
            assert r["in_shape"] == _fmt(shapes[r["series_uid"]])
    for c in recorded:
        assert os.stat(out / f"{c}.nii.gz").st_mtime_ns == finished[f"{c}.nii.gz"]
    assert not [f for f in os.listdir(out) if ".part" in f]  # the resume removed temporaries


@pytest.mark.slow
def test_parallel_workers(sample_data, tmp_path):
    assert (
        main(
            [
                "convert",
                os.path.join(sample_data, "dicom"),
                "-o",
                str(tmp_path),
                "--spacing",
                "2",
                "-j",
                "2",
            ]
        )
        == 0
    )
    assert {r["status"] for r in _manifest(tmp_path).values()} == {"ok"}


def test_qc_pictures(sample_data, tmp_path):
    out = tmp_path / "o"
    assert (
        main(
            [
                "convert",
                os.path.join(sample_data, "nifti", "images"),
                "--labels",
                os.path.join(sample_data, "nifti", "labels"),
                "-o",
                str(out),
                "--spacing",
                "2",
                "--qc",
                "-j",
                "1",
            ]
        )
        == 0
    )
    pngs = sorted(os.listdir(out / "qc"))
    assert pngs == ["case001.png", "case002.png"]
    import matplotlib.image as mpimg

    img = mpimg.imread(out / "qc" / "case001.png")
    assert img.shape[0] > 300 and img.shape[1] > 600
    # the label contour is drawn in lime: some pixels are green-dominant
    rgb = img[..., :3]
    assert ((rgb[..., 1] > 0.7) & (rgb[..., 0] < 0.5) & (rgb[..., 2] < 0.5)).sum() > 10


def test_qc_pictures_circle_the_lesions_of_dicom_series(sample_data, tmp_path):
    """--qc with --annotations: medproc.qc's views through each lesion, circled in red."""
    import matplotlib.image as mpimg

    from medproc.qc import qc_render

    out = tmp_path / "o"
    args = ["convert", os.path.join(sample_data, "dicom", "ct_axial"), "-o", str(out)]
    args += ["--spacing", "3", "--orientation", "RAS", "--qc"]
    assert main(args + ["--annotations", os.path.join(sample_data, "lesions.csv")]) == 0
    (row,) = _manifest(out).values()
    img = mpimg.imread(out / "qc" / f"{row['case']}.png")[..., :3]
    red = (img[..., 0] > 0.8) & (img[..., 1] < 0.3) & (img[..., 2] < 0.3)
    assert red.sum() > 50
    # the same picture qc_render draws for these volumes and lesions (two targets)
    before = medproc.load(row["source"])
    after = medproc.load(row["output"])
    doc = json.load(open(medproc.convert.annotations_path(row["output"])))
    lesions = [(les["center_world_ras"], les["diameter_mm"]) for les in doc["lesions"]]
    ref, panels = qc_render(before, after, lesions=lesions, title=os.path.basename(row["output"]))
    assert ref.shape[:2] == img.shape[:2] and len({p.target for p in panels}) == 2


def test_dask_local_cluster(sample_data, tmp_path):
    """The same conversion on dask.distributed workers (a LocalCluster of 2 processes)."""
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        pids = set(client.run(os.getpid).values())
        out = tmp_path / "o"
        assert (
            main(
                [
                    "convert",
                    os.path.join(sample_data, "dicom"),
                    "-o",
                    str(out),
                    "--spacing",
                    "2",
                    "--dask",
                    cluster.scheduler_address,
                ]
            )
            == 0
        )
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
    assert (
        main(
            [
                "convert",
                os.path.join(sample_data, "dicom", "ct_axial"),
                "-o",
                str(out),
                "--spacing",
                "3",
            ]
        )
        == 0
    )
    umask = os.umask(0)
    os.umask(umask)
    for f in os.listdir(out):
        assert stat.S_IMODE(os.stat(out / f).st_mode) == 0o666 & ~umask, f


def test_npy_cache_is_read_by_dalis_numpy_reader_with_a_roi(sample_data, tmp_path):
    """The training cache: DALI's numpy reader reads just a region (roi_start/roi_end) of a
    converted volume, equal to the same slice of the array."""
    from nvidia.dali import fn, pipeline_def

    assert (
        main(
            [
                "convert",
                os.path.join(sample_data, "dicom", "ct_axial"),
                "-o",
                str(tmp_path),
                "--spacing",
                "2",
                "--format",
                "npy",
                "-j",
                "1",
            ]
        )
        == 0
    )
    (row,) = _manifest(tmp_path).values()
    arr = np.load(row["output"])
    ref = medproc.resample(
        medproc.load(os.path.join(sample_data, "dicom", "ct_axial")), spacing=2.0
    )
    assert arr.shape == ref.shape == (162, 162, 50)
    np.testing.assert_allclose(arr, ref.array, atol=1e-3)
    side = json.load(open(row["output"][:-4] + ".json"))
    assert list(arr.shape) == side["shape"] and side["axes"] == "ijk" and np.isfortran(arr)
    # (i, j, k) region: 40 columns, 30 rows, 8 slices
    start, end = [20, 10, 3], [60, 40, 11]

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def reader():
        return fn.readers.numpy(files=[row["output"]], roi_start=start, roi_end=end)

    p = reader()
    p.build()
    (out,) = p.run()
    got = np.array(out[0])
    assert got.shape == (40, 30, 8)
    np.testing.assert_array_equal(got, arr[20:60, 10:40, 3:11])


def _sitk_reference(dicom_dir, out_img):
    """SimpleITK (GDCM) reads the DICOM series and resamples it (linear) onto ``out_img``'s grid
    (a nibabel image); returns the voxels indexed (i, j, k) and the mask of output voxels whose
    source position lies at least one voxel inside the series."""
    import SimpleITK as sitk

    r = sitk.ImageSeriesReader()
    r.SetFileNames(r.GetGDCMSeriesFileNames(dicom_dir))
    src = sitk.Cast(r.Execute(), sitk.sitkFloat64)
    lps = np.diag([-1.0, -1.0, 1.0, 1.0]) @ out_img.affine  # RAS -> ITK's LPS
    sp = np.linalg.norm(lps[:3, :3], axis=0)
    res = sitk.Resample(
        src,
        [int(n) for n in out_img.shape],
        sitk.Transform(),
        sitk.sitkLinear,
        lps[:3, 3].tolist(),
        sp.tolist(),
        (lps[:3, :3] / sp).ravel().tolist(),
        np.nan,
        sitk.sitkFloat64,
    )
    ref = sitk.GetArrayFromImage(res).transpose(2, 1, 0)  # (z, y, x) -> (x, y, z) = (i, j, k)
    src_aff = np.eye(4)
    src_aff[:3, :3] = np.array(src.GetDirection()).reshape(3, 3) * np.array(src.GetSpacing())
    src_aff[:3, 3] = src.GetOrigin()
    idx = np.indices(out_img.shape).reshape(3, -1)
    ci = (np.linalg.inv(src_aff) @ lps @ np.vstack([idx, np.ones(idx.shape[1])]))[:3].T
    mask = np.all((ci >= 1) & (ci <= np.array(src.GetSize()) - 2), axis=1).reshape(out_img.shape)
    return ref, mask


@pytest.fixture(scope="module")
def converted_1_1_3(sample_data, tmp_path_factory):
    """sample_data's four cases converted with ``--spacing 1 1 3 --annotations lesions.csv``."""
    out = tmp_path_factory.mktemp("spacing113")
    assert (
        main(
            [
                "convert",
                os.path.join(sample_data, "dicom"),
                os.path.join(sample_data, "nifti", "images"),
                "-o",
                str(out),
                "--spacing",
                "1",
                "1",
                "3",
                "--annotations",
                os.path.join(sample_data, "lesions.csv"),
                "-j",
                "1",
            ]
        )
        == 0
    )
    m = _manifest(out)
    assert len(m) == 4 and {r["status"] for r in m.values()} == {"ok"}
    return m


def test_spacing_1_1_3_is_i_j_k_in_manifest_and_nifti(converted_1_1_3, sample_data):
    """``--spacing 1 1 3`` is (i, j, k): the manifest says out_spacing 1x1x3, nibabel reads zooms
    (1, 1, 3) and the same voxels as medproc.load, and SimpleITK's own reading and resampling of
    the DICOM series onto that grid holds the same voxels."""
    for r in converted_1_1_3.values():
        assert r["out_spacing"] == "1x1x3"
        img = nib.load(r["output"])
        np.testing.assert_allclose(img.header.get_zooms()[:3], (1.0, 1.0, 3.0), atol=1e-6)
        vol = medproc.load(r["output"])
        np.testing.assert_allclose(vol.spacing, (1.0, 1.0, 3.0), atol=1e-6)
        assert img.shape == vol.shape and r["out_shape"] == _fmt(img.shape)
        np.testing.assert_array_equal(np.asarray(img.dataobj), vol.array)
        np.testing.assert_allclose(img.affine, vol.affine, atol=1e-6)
        src = medproc.load(r["source"])
        assert r["in_shape"] == _fmt(src.shape)
        # the slice axis k stays the slice axis: it spans the same millimetres as in the source
        assert abs(img.shape[2] * 3.0 - src.shape[2] * src.spacing[2]) <= 3.0
    axial = next(r for r in converted_1_1_3.values() if r["source"].endswith("ct_axial"))
    assert axial["in_shape"] == "112x112x40" and axial["in_spacing"] == "2.9x2.9x2.5"
    assert axial["out_shape"] == "325x325x33"  # 112 x 2.9 / 1, 40 x 2.5 / 3
    # the output's voxels against SimpleITK's own reading and resampling of the series
    img = nib.load(axial["output"])
    ref, mask = _sitk_reference(os.path.join(sample_data, "dicom", "ct_axial"), img)
    assert mask.mean() > 0.8 and not np.isnan(ref[mask]).any()
    assert np.abs(np.asarray(img.dataobj, dtype=np.float64) - ref)[mask].max() <= 0.1


def test_annotations_center_voxel_maps_to_center_world(converted_1_1_3):
    """In ``<name>.annotations.json``, center_voxel is an (i, j, k) index of the output image:
    affine @ [*center_voxel, 1] == center_world_ras, and the voxel there is on the lesion."""
    from medproc.convert import annotations_path

    checked = 0
    for r in converted_1_1_3.values():
        img = nib.load(r["output"])
        data = np.asarray(img.dataobj)
        doc = json.load(open(annotations_path(r["output"])))
        assert doc["image"] == os.path.basename(r["output"]) and doc["coordinate_system"] == "RAS"
        assert "shape_ijk" not in doc and "center_index_convention" not in doc
        assert doc["shape"] == list(img.shape)
        affine = np.array(doc["affine"])
        np.testing.assert_allclose(affine, img.affine, atol=1e-6)
        assert int(r["lesions"]) == len(doc["lesions"]) == 2
        for les in doc["lesions"]:
            assert "center_index" not in les
            world = affine @ np.array([*les["center_voxel"], 1.0])
            np.testing.assert_allclose(world[:3], les["center_world_ras"], atol=1e-3)
            assert world[3] == 1.0
            inside = bool(
                np.all(np.array(les["center_voxel"]) >= -0.5)
                and np.all(np.array(les["center_voxel"]) <= np.array(img.shape) - 0.5)
            )
            assert les["inside"] == inside
            if les["inside"]:  # the centre voxel is on the lesion: bright tissue in the lung
                i, j, k = np.round(les["center_voxel"]).astype(int)
                assert data[i, j, k] > 0, (r["case"], les)
                checked += 1
    assert checked >= 7  # every lesion but the one outside the oblique series


def test_an_unguarded_script_whose_workers_are_spawned_is_told_why(tmp_path, sample_data):
    """Once DALI is loaded, convert()'s workers are spawned, and Python re-runs the user's
    script in each: unguarded, every worker called convert() again and the rows blamed the
    memory. The workers and the rows now say what to do."""
    script = tmp_path / "s.py"
    script.write_text(
        "import medproc\n"
        "from medproc.convert import convert\n"
        f"img = {os.path.join(sample_data, 'nifti', 'images')!r}\n"
        "medproc.resample(medproc.load(img + '/case001.nii.gz'), spacing=3.0)  # DALI loaded\n"
        f"rows = convert([img], {str(tmp_path / 'out')!r}, medproc.Spec(spacing=3.0), workers=2)\n"
        "print([r['error'] for r in rows])\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert "convert() was called in a spawned worker process" in r.stderr, r.stderr[-3000:]
    assert "if __name__ == '__main__'" in r.stdout
