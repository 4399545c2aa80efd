"""DICOM series: ordering, spacing fit, checks, series selection, against SimpleITK and dcm2niix."""

import os
import re
import shutil
import subprocess
import warnings
import zlib

import nibabel as nib
import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from world import assert_same_world

import medproc
from medproc.io.sitk_io import sitk_affine
from medproc.sample_data import ct_phantom, grid_affine, write_dicom_series


def _series(
    tmp_path,
    name="s",
    shape=(40, 48, 16),
    spacing=(0.9, 1.1, 2.5),
    iop=(1, 0, 0, 0, 1, 0),
    tilt=0.0,
    **kw,
):
    """A synthetic series: ``shape`` (columns, rows, slices) = (i, j, k), ``spacing`` (column
    spacing, row spacing, slice step) mm; returns (folder, voxels (i, j, k), affine)."""
    aff = grid_affine(shape, spacing, (-20.0, -25.0, 30.0), iop=iop, tilt_deg=tilt)
    img, _ = ct_phantom(shape, aff, [])
    d = str(tmp_path / name)
    write_dicom_series(
        d,
        medproc.Volume(img, aff),
        f"1.2.3.{zlib.crc32(name.encode())}",
        gantry_tilt=tilt or None,
        **kw,
    )
    return d, img, aff


def _sitk_series(d):
    """SimpleITK's (GDCM's) reading: voxels indexed (x, y, z) as ITK's index, and its affine."""
    r = sitk.ImageSeriesReader()
    r.SetFileNames(r.GetGDCMSeriesFileNames(d))
    im = r.Execute()
    return sitk.GetArrayFromImage(im).transpose(2, 1, 0), sitk_affine(im)


OBLIQUE = (0.9659258, 0.0, -0.258819, 0.1830127, 0.7071068, 0.6830127)


@pytest.mark.parametrize(
    "iop", [(1, 0, 0, 0, 1, 0), (0, 1, 0, 0, 0, -1), OBLIQUE], ids=["axial", "sagittal", "oblique"]
)
def test_series_matches_simpleitk(tmp_path, iop):
    d, img, aff = _series(tmp_path, iop=iop)
    vol = medproc.load(d)
    assert vol.meta["warnings"] == []
    np.testing.assert_allclose(vol.affine, aff, atol=1e-5)  # our generator's truth
    arr, A = _sitk_series(d)
    assert_same_world(vol.array, vol.affine, arr, A, atol_mm=1e-4)
    # one axis order: ITK's index (x, y, z) is medproc's (i, j, k), voxel for voxel
    assert vol.shape == arr.shape
    np.testing.assert_array_equal(vol.array, arr)
    np.testing.assert_allclose(vol.affine, A, atol=1e-4)


def test_series_matches_dcm2niix(tmp_path, sample_data):
    exe = shutil.which("dcm2niix")
    if exe is None:
        pytest.skip("dcm2niix not installed (pip install dcm2niix)")
    src = os.path.join(sample_data, "dicom", "ct_oblique")
    subprocess.run(
        [exe, "-z", "n", "-b", "n", "-o", str(tmp_path), "-f", "ref", src],
        check=True,
        capture_output=True,
    )
    img = nib.load(str(tmp_path / "ref.nii"))
    ref = np.asarray(img.dataobj)
    vol = medproc.load(src)
    assert vol.shape == img.shape  # the same (i, j, k) axes as dcm2niix's NIfTI
    assert_same_world(vol.array, vol.affine, ref.astype(vol.array.dtype), img.affine, atol_mm=1e-3)


def test_order_ignores_names_and_instance_numbers(tmp_path):
    d, img, aff = _series(tmp_path, shuffle_names=True)
    vol = medproc.load(d)
    np.testing.assert_array_equal(vol.array, img)


def test_gantry_tilt_keeps_voxels_in_place(tmp_path):
    d, img, aff = _series(tmp_path, tilt=12.0)
    with pytest.warns(medproc.GeometryWarning, match=r"gantry tilt of 12\.0"):
        vol = medproc.load(d)
    np.testing.assert_array_equal(vol.array, img)
    # every slice's ImagePositionPatient is where the affine puts voxel (0, 0, k)
    for f in os.listdir(d):
        ds = pydicom.dcmread(os.path.join(d, f), stop_before_pixels=True)
        ipp = np.array(ds.ImagePositionPatient, float) * [-1, -1, 1]
        k = np.argmin(
            [np.abs(vol.voxel_to_world([0, 0, k]) - ipp).max() for k in range(vol.shape[2])]
        )
        np.testing.assert_allclose(vol.voxel_to_world([0, 0, k]), ipp, atol=1e-4)


def _move_slice(d, fraction_of_step, step=2.5, which=5):
    files = sorted(os.listdir(d))
    dss = [pydicom.dcmread(os.path.join(d, f)) for f in files]
    dss.sort(key=lambda ds: float(ds.ImagePositionPatient[2]))
    ds = dss[which]
    ipp = [float(x) for x in ds.ImagePositionPatient]
    ipp[2] += fraction_of_step * step
    ds.ImagePositionPatient = [f"{x:.6f}" for x in ipp]
    ds.save_as(ds.filename)


def test_uneven_spacing_warns_with_numbers(tmp_path):
    d, *_ = _series(tmp_path, shuffle_names=False)
    _move_slice(d, 0.04)
    with pytest.warns(
        medproc.GeometryWarning, match=r"uneven slice spacing: steps from 2\.4 to 2\.6 mm"
    ):
        vol = medproc.load(d)
    assert abs(vol.spacing[2] - 2.5) < 0.01


def test_badly_uneven_spacing_is_an_error(tmp_path):
    d, *_ = _series(tmp_path, shuffle_names=False)
    _move_slice(d, 0.45)
    with pytest.raises(medproc.GeometryError, match="uneven slice spacing"):
        medproc.load(d)


def test_broken_series_errors_name_the_problem(broken_dataset, quiet):
    with pytest.raises(
        medproc.GeometryError,
        match=r"missing slices: a gap of 5\.000 mm.*IM00004\.dcm and IM00006\.dcm",
    ):
        medproc.load(broken_dataset["missing_slice"])
    with pytest.raises(medproc.GeometryError, match="share a slice position.*IM_dup.dcm"):
        medproc.load(broken_dataset["duplicate_slice"])
    with pytest.raises(
        medproc.ReadError, match=r"IM00002\.dcm.*(truncated|less than expected|cannot be)"
    ):
        medproc.load(broken_dataset["truncated"])
    with pytest.raises(medproc.ReadError, match="not_dicom.dcm.*not a DICOM"):
        medproc.load(broken_dataset["not_dicom"])


def test_missing_pixel_data(tmp_path):
    d, *_ = _series(tmp_path, shape=(8, 8, 3))
    f = os.path.join(d, sorted(os.listdir(d))[0])
    ds = pydicom.dcmread(f)
    del ds.PixelData
    ds.save_as(f)
    with pytest.raises(medproc.ReadError, match=f"{os.path.basename(f)}.*no pixel data"):
        medproc.load(d)


def test_varying_rescale_slopes_give_float(tmp_path):
    d, img, _ = _series(tmp_path, shuffle_names=False)
    f = os.path.join(d, sorted(os.listdir(d))[3])
    ds = pydicom.dcmread(f)
    ds.RescaleSlope = "0.5"
    ds.save_as(f)
    vol = medproc.load(d)
    assert vol.array.dtype == np.float32
    ref = pydicom.dcmread(f)
    k = int(
        np.argmin(
            [
                abs(vol.voxel_to_world([0, 0, k])[2] - float(ref.ImagePositionPatient[2]))
                for k in range(vol.shape[2])
            ]
        )
    )
    # slice k, transposed, is pydicom's pixel_array (rows, columns)
    np.testing.assert_array_equal(vol.array[:, :, k].T, ref.pixel_array * 0.5 - 1024)
    others = [i for i in range(vol.shape[2]) if i != k]
    np.testing.assert_array_equal(vol.array[:, :, others], img[:, :, others])


@pytest.mark.parametrize(
    "ts", [pydicom.uid.RLELossless, pydicom.uid.JPEG2000Lossless], ids=["rle", "j2k-lossless"]
)
def test_compressed_series_decode_exactly(tmp_path, ts):
    try:
        d, img, _ = _series(tmp_path, shape=(32, 32, 6), transfer_syntax=ts)
    except (RuntimeError, NotImplementedError) as e:  # the encoder plugins are dependencies
        pytest.fail(f"no encoder here for {ts.name}: {e}")
    vol = medproc.load(d)
    assert vol.meta["transfer_syntax"] == ts.name
    np.testing.assert_array_equal(vol.array, img)


def test_folder_with_several_series(tmp_path):
    _series(tmp_path, "a", series_number=4, description="T1 axial")
    _series(tmp_path, "b", shape=(32, 32, 10), series_number=7, description="CT lung")
    with pytest.raises(medproc.SeriesError, match=r"(?s)holds 2 series.*T1 axial.*CT lung"):
        medproc.load(tmp_path)
    assert medproc.load(tmp_path, series=7).shape == (32, 32, 10)
    assert medproc.load(tmp_path, series="lung").shape == (32, 32, 10)
    uid = medproc.load(tmp_path, series="T1").meta["series_uid"]
    assert medproc.load(tmp_path, series=uid).shape == (40, 48, 16)
    with pytest.raises(medproc.SeriesError, match="matches none"):
        medproc.load(tmp_path, series="brain")


def test_series_uid_split_by_geometry_and_stray_files(tmp_path):
    """One SeriesInstanceUID holding two image sizes (e.g. a localizer) is split into parts;
    stray non-DICOM files are ignored."""
    d, *_ = _series(tmp_path, "x", shape=(16, 16, 5))
    aff = grid_affine((20, 20, 1), (1, 1, 1), (0, 0, 0), iop=(0, 1, 0, 0, 0, -1))
    img, _ = ct_phantom((20, 20, 1), aff, [])
    uid = pydicom.dcmread(os.path.join(d, os.listdir(d)[0])).SeriesInstanceUID
    write_dicom_series(os.path.join(d, "loc"), medproc.Volume(img, aff), uid)
    (tmp_path / "x" / "notes.txt").write_text("hello")
    (tmp_path / "x" / "README").write_text("not dicom")
    from medproc.io.dicom_scan import find_series

    found, skipped = find_series(d)
    assert sorted(len(s.frames) for s in found) == [1, 5]
    assert {s.key for s in found} == {f"{uid}.part1", f"{uid}.part2"}
    assert [os.path.basename(p) for p, _ in skipped] == ["README"]


def _set(path, **attrs):
    ds = pydicom.dcmread(path)
    for k, v in attrs.items():
        if v is None:
            delattr(ds, k)
        else:
            setattr(ds, k, v)
    ds.save_as(path)


@pytest.mark.parametrize(
    "attrs, error",
    [
        ({"ImagePositionPatient": ["1", "2", "nan"]}, "ImagePositionPatient is '1"),
        ({"ImageOrientationPatient": ["1", "0", "0", "0", "1", "inf"]}, "ImageOrientation"),
        ({"PixelSpacing": ["-1", "1"]}, "PixelSpacing is '-1"),
        ({"RescaleSlope": "inf"}, "RescaleSlope is 'inf'"),
        ({"Rows": 47}, "PixelData holds 3840 bytes, more than the 3760"),
        ({"Columns": 41}, "PixelData holds 3840 bytes, 3936 expected"),
    ],
    ids=["nan-position", "inf-orientation", "negative-spacing", "inf-slope", "rows", "columns"],
)
def test_one_damaged_slice_fails_the_series_naming_it(tmp_path, attrs, error, quiet):
    """Strict geometry: a slice with NaN/inf geometry or pixel data that does not match Rows x
    Columns is never dropped nor placed by guess: the series fails, naming the file."""
    d, *_ = _series(tmp_path, shuffle_names=True)
    bad = os.path.join(d, sorted(os.listdir(d))[3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom warns about the values written on purpose
        _set(bad, **attrs)
    with pytest.raises(medproc.ReadError, match=f"{os.path.basename(bad)}: {re.escape(error)}"):
        medproc.load(d)


def test_a_slice_without_a_position_among_placed_ones_is_an_error(tmp_path):
    d, *_ = _series(tmp_path, shape=(8, 8, 5))
    bad = os.path.join(d, sorted(os.listdir(d))[2])
    _set(bad, ImagePositionPatient=None)
    with pytest.raises(
        medproc.GeometryError, match=rf"1 of 5 frames have no .*{os.path.basename(bad)}"
    ):
        medproc.load(d)


def test_declared_frame_counts_are_checked_before_anything_is_built(tmp_path):
    import time

    d, *_ = _series(tmp_path, shape=(8, 8, 1))
    f = os.path.join(d, os.listdir(d)[0])
    cases = ((10**6, "PixelData holds 128 bytes, 128000000 expected"), (2**31 - 1, "Number"))
    for n, match in cases:
        _set(f, NumberOfFrames=str(n))
        t = time.perf_counter()
        with pytest.raises(medproc.ReadError, match=match):
            medproc.load(f)
        assert time.perf_counter() - t < 2


def test_an_unreadable_slice_fails_the_series(tmp_path, monkeypatch):
    """A slice that cannot be opened (permission denied) fails its series by name; the series
    is never read with a slice fewer. (As root, chmod 000 does not stop reads: the open is made
    to fail the way the kernel fails it for other users.)"""
    import builtins
    import errno

    d, *_ = _series(tmp_path, shape=(8, 8, 5))
    bad = os.path.join(d, sorted(os.listdir(d))[1])
    os.chmod(bad, 0)
    real_open = builtins.open

    def deny(p, *a, **k):
        if isinstance(p, (str, os.PathLike)) and os.fspath(p) == bad:
            raise PermissionError(errno.EACCES, "Permission denied", bad)
        return real_open(p, *a, **k)

    if os.geteuid() == 0:
        monkeypatch.setattr(builtins, "open", deny)
    with pytest.raises(medproc.ReadError, match=f"{os.path.basename(bad)}: permission denied"):
        medproc.load(d)
    from medproc.inspect import inspect_paths

    inspect = inspect_paths(d)
    assert "permission denied" in inspect[0].error and os.path.basename(bad) in inspect[0].error


def test_orientation_clustering_agrees_with_numpy_allclose():
    """The grouping's orientation test (plain Python, per file) decides as
    ``np.allclose(a, b, atol=1e-4)`` does, on both sides of the tolerance and with NaN."""
    from medproc.io.dicom_scan import _same_orientation

    rng = np.random.default_rng(7)
    for scale in (1e-6, 5e-5, 9e-5, 1.2e-4, 1e-3, 0.1):
        for _ in range(200):
            a = rng.normal(size=6)
            b = a + rng.uniform(-scale, scale, size=6)
            assert _same_orientation(a, b) == np.allclose(a, b, atol=1e-4)
    nan = np.array([np.nan, 0, 0, 0, 1, 0])
    assert not _same_orientation(nan, nan) and not np.allclose(nan, nan, atol=1e-4)
    assert _same_orientation(None, None) and not _same_orientation(None, np.zeros(6))


def test_a_file_without_orientation_in_an_oriented_series_is_named(tmp_path, sample_data):
    """One file of a series lost ImageOrientationPatient: not a 1-slice volume of its own on a
    made-up grid (with its series failing for a gap it does not name), but an error of the
    series naming that file."""
    from medproc.inspect import inspect_paths

    d = tmp_path / "s"
    shutil.copytree(os.path.join(sample_data, "dicom", "ct_axial"), d)
    f = sorted(os.listdir(d))[10]
    ds = pydicom.dcmread(d / f)
    del ds.ImageOrientationPatient
    ds.save_as(d / f)
    entries = [e for e in inspect_paths([str(d)]) if e.kind == "dicom"]
    assert len(entries) == 1  # one series, not two volumes
    assert f in entries[0].error and "no ImageOrientationPatient" in entries[0].error
    with pytest.raises(medproc.errors.MedprocError, match=f"{f}.*no ImageOrientationPatient"):
        medproc.load(str(d))


def test_a_folder_of_nifti_files_named_as_one_image_says_so(sample_data, tmp_path):
    """A case list row (or load) naming a folder of NIfTI files said "holds no DICOM image (0
    file(s) skipped)": now it names the image files and what to do."""
    images = os.path.join(sample_data, "nifti", "images")
    with pytest.raises(medproc.ReadError, match=r"but image files \(case001.nii.gz, case002"):
        medproc.load(images)
    (tmp_path / "cases.csv").write_text(f"image,name\n{images},a\n")
    from medproc.cli import main

    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "cases.csv"), "-o", str(out), "--spacing", "3"]) == 1
    assert "name each image file" in (out / "manifest.csv").read_text()


@pytest.mark.parametrize("thickness", ["1e400", "nan", "abc"])
def test_a_single_slice_with_an_unusable_thickness_says_the_value(sample_data, tmp_path, thickness):
    """SliceThickness 1e400 (inf) made the affine NaN, refused as that without naming the
    attribute; nan/abc were said to be "without SliceThickness"."""

    src = os.path.join(sample_data, "dicom", "ct_axial")
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(os.path.join(src, sorted(os.listdir(src))[0]), one / "x.dcm")
    ds = pydicom.dcmread(one / "x.dcm")
    ds.SliceThickness = "1"  # (then replaced byte for byte: pydicom refuses to write these)
    ds.save_as(one / "x.dcm")
    raw = (one / "x.dcm").read_bytes()
    at = raw.index(b"\x18\x00\x50\x00DS")  # (0018,0050) SliceThickness, explicit VR
    value = thickness.encode() + (b" " if len(thickness) % 2 else b"")
    (one / "x.dcm").write_bytes(raw[:at + 6] + len(value).to_bytes(2, "little") + value
                                + raw[at + 8 + 2:])  # fmt: skip
    with pytest.warns(medproc.GeometryWarning, match=f"unusable SliceThickness \\('{thickness}'"):
        v = medproc.load(str(one))
    assert v.spacing[2] == 1.0 and np.isfinite(v.affine).all()
