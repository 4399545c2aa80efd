"""Every DICOM file shipped by pydicom and pydicom-data, against independent readers.

Oracle for values: pydicom's own decoded pixels with the rescale applied. Oracle for geometry:
SimpleITK (GDCM) on the same file, compared by the world position of voxels. A file pydicom
cannot decode, or that holds no image, must give a medproc error that names the file.
"""

import os

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from fetch_test_data import pydicom_test_files
from world import assert_same_world

import medproc
from medproc.io.sitk_io import sitk_affine

FILES = pydicom_test_files()
sitk.ProcessObject_SetGlobalWarningDisplay(False)


def _ijk(frames):
    """pydicom's frames-first stack (frame, row, column[, sample]) in medproc's axis order
    (column, row, frame[, sample]) = (i, j, k[, C]): frame k is ``vol.array[:, :, k].T``."""
    return frames.transpose(2, 1, 0) if frames.ndim == 3 else frames.transpose(2, 1, 0, 3)


def _reference(path):
    """pydicom's pixels with rescale, frames first; None if pydicom cannot give an image."""
    try:
        ds = pydicom.dcmread(path)
        arr = ds.pixel_array
    except Exception:  # noqa: BLE001 - anything pydicom cannot decode is an expected error
        return None, None
    if "Rows" not in ds or ds.get("Modality") in ("SR", "RTPLAN", "RTSTRUCT"):
        return None, None
    if _longer_than_declared(ds) and any(ds.PixelData[_declared(ds) :]):
        return None, None  # longer than Rows x Columns x frames, not zero padding: refused
    nf = int(ds.get("NumberOfFrames") or 1)
    spp = int(ds.get("SamplesPerPixel") or 1)
    if arr.ndim == (2 if spp == 1 else 3):
        arr = arr[None]
    assert arr.shape[0] == nf or nf == 1
    slopes = np.ones(arr.shape[0])
    inter = np.zeros(arr.shape[0])
    if "PerFrameFunctionalGroupsSequence" in ds:
        shared = ds.get("SharedFunctionalGroupsSequence", [None])[0]
        for i, item in enumerate(ds.PerFrameFunctionalGroupsSequence):
            for grp in (shared, item):
                pv = grp.get("PixelValueTransformationSequence") if grp is not None else None
                if pv:
                    slopes[i] = float(pv[0].RescaleSlope)
                    inter[i] = float(pv[0].RescaleIntercept)
    elif "DoseGridScaling" in ds:
        slopes[:] = float(ds.DoseGridScaling)
    else:
        slopes[:] = float(ds.get("RescaleSlope") or 1)
        inter[:] = float(ds.get("RescaleIntercept") or 0)
    shape = (-1,) + (1,) * (arr.ndim - 1)
    return arr * slopes.reshape(shape) + inter.reshape(shape), ds


def _longer_than_declared(ds) -> bool:
    """Native pixel data holding more bytes than Rows x Columns x frames x samples x bits
    declare (beyond the one pad byte of an odd length): the header does not describe it."""
    ts = ds.file_meta.get("TransferSyntaxUID")
    if ts is None or ts.is_compressed or ts.is_deflated or "PixelData" not in ds:
        return False
    want = _declared(ds)
    return len(ds.PixelData) > want + want % 2


def _declared(ds) -> int:
    """Bytes of native pixel data that Rows x Columns x frames x samples x bits declare."""
    n = int(ds.Rows) * int(ds.Columns) * int(ds.get("NumberOfFrames") or 1)
    n *= int(ds.get("SamplesPerPixel") or 1)
    return n * int(ds.BitsAllocated) // 8 if int(ds.BitsAllocated) != 1 else (n + 7) // 8


def test_pixel_data_with_excess_zero_padding_is_read_and_other_excess_refused(tmp_path):
    """pydicom's MR_small_padded.dcm holds 128 zero bytes (a row) more than its header
    declares. DICOM asks readers to accept such padding (PS3.5 8.1.1), as pydicom, SimpleITK
    and dcm2niix do; medproc refused the file (a geometry auditor's finding). It now reads the
    declared part, equal to MR_small.dcm, and says so; excess that is not zero (Rows or
    Columns not matching the data: which part is the image?) is still refused."""
    from pydicom.data import get_testdata_file

    p = get_testdata_file("MR_small_padded.dcm")
    assert _longer_than_declared(pydicom.dcmread(p))
    with pytest.warns(medproc.MedprocWarning, match="128 zero bytes past the 8192"):
        vol = medproc.load(p)
    ref = medproc.load(get_testdata_file("MR_small.dcm"))
    np.testing.assert_array_equal(vol.array, ref.array)
    np.testing.assert_allclose(vol.affine, ref.affine, atol=1e-9)
    assert any("excess padding" in w for w in vol.meta["warnings"])
    ds = pydicom.dcmread(p)  # the same padding through pydicom's path: 12 bits stored
    ds.BitsStored, ds.HighBit = 12, 11  # (sign-extended: not the fast reader) and 2 frames
    ds.save_as(tmp_path / "b12.dcm")
    with pytest.warns(medproc.MedprocWarning, match="b12.dcm: PixelData holds 128 zero bytes"):
        assert medproc.load(str(tmp_path / "b12.dcm")).shape == (64, 64, 1)
    ds.Rows, ds.NumberOfFrames = 32, 2
    ds.save_as(tmp_path / "two.dcm")
    with pytest.warns(medproc.MedprocWarning, match="128 zero bytes past the 8192"):
        assert medproc.load(str(tmp_path / "two.dcm")).shape[:2] == (64, 32)
    raw = bytearray(open(p, "rb").read())
    ds = pydicom.dcmread(p)
    end = raw.index(bytes(ds.PixelData[:64])) + len(ds.PixelData)  # (a padding element follows)
    raw[end - 1] = 7  # the last byte of the excess
    bad = tmp_path / "MR_small_badpad.dcm"
    bad.write_bytes(bytes(raw))
    with pytest.raises(medproc.ReadError, match=r"MR_small_badpad.dcm: PixelData holds 8320 "
                       r"bytes, more than the 8192 .*not zero padding"):  # fmt: skip
        medproc.load(str(bad))


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(f) for f in FILES])
def test_real_file(path, quiet):
    ref, ds = _reference(path)
    if ref is None:
        with pytest.raises(medproc.MedprocError) as ei:
            medproc.load(path)
        assert os.path.basename(path) in str(ei.value)
        return
    vol = medproc.load(path)
    ref = _ijk(ref)  # (column, row, frame[, sample]): slice k of medproc is frame k transposed
    assert vol.array.shape == ref.shape
    # values: equal to pydicom's (frames in file order, or reversed when sorted along the normal)
    a = vol.array.astype(np.float64)
    tol = 1e-6 * max(1.0, np.abs(ref).max()) if vol.array.dtype.kind == "f" else 0
    same = np.allclose(a, ref, atol=tol, rtol=0) or np.allclose(
        a[:, :, ::-1], ref, atol=tol, rtol=0
    )
    assert same, f"values differ from pydicom's (max {np.abs(a - ref).max()})"
    if vol.array.dtype.kind in "iu":
        assert np.array_equal(vol.array, ref.astype(vol.array.dtype)) or np.array_equal(
            vol.array[:, :, ::-1], ref
        )
    # geometry: against SimpleITK where the file has patient geometry and GDCM reads it
    if any("no patient geometry" in w for w in vol.meta["warnings"]):
        # placeholder: i (column) -> x, j (row) -> y, k (frame) -> z
        assert np.allclose(vol.affine[:3, :3] != 0, np.eye(3) != 0)
        return
    try:
        img = sitk.ReadImage(path)
    except RuntimeError:
        pytest.skip("SimpleITK/GDCM cannot read this file: no independent geometry")
    if img.GetDimension() != 3 or img.GetNumberOfComponentsPerPixel() != vol.channels:
        pytest.skip("SimpleITK reads it with another dimensionality")
    ref_arr = _ijk(sitk.GetArrayFromImage(img))  # ITK index (x, y, z[, C]) = medproc's (i, j, k)
    if vol.shape[2] == 1:
        # one slice: SimpleITK has no slice spacing either; compare the in-plane grid
        A, B = vol.affine.copy(), sitk_affine(img)
        A[:3, 2] = B[:3, 2] = np.cross(A[:3, 0], A[:3, 1]) / np.linalg.norm(
            np.cross(A[:3, 0], A[:3, 1])
        )
        assert_same_world(vol.array, A, ref_arr, B, atol_mm=1e-4, values=False)
    else:
        assert_same_world(
            vol.array, vol.affine, ref_arr, sitk_affine(img), atol_mm=1e-4, values=False
        )


def test_truncated_file_names_file(quiet):
    from pydicom.data import get_testdata_file

    p = get_testdata_file("MR_truncated.dcm")
    with pytest.raises(medproc.ReadError, match="MR_truncated.dcm.*(truncated|less than expected)"):
        medproc.load(p)


def test_enhanced_ct_sorted_along_normal(quiet):
    """eCT_Supplemental stores frames in file order against its normal: sorted, the slice axis
    points along the normal and voxel values sit where SimpleITK puts them."""
    from pydicom.data import get_testdata_file

    p = get_testdata_file("eCT_Supplemental.dcm")
    vol = medproc.load(p)
    img = sitk.ReadImage(p)
    assert_same_world(
        vol.array, vol.affine, _ijk(sitk.GetArrayFromImage(img)), sitk_affine(img), atol_mm=1e-4
    )


def test_seg_frames_line_up(quiet):
    from pydicom.data import get_testdata_file

    vol = medproc.load(get_testdata_file("liver.dcm"))
    assert vol.shape == (512, 512, 3) and vol.array.max() == 1
    np.testing.assert_allclose(vol.spacing, [0.810547, 0.810547, 1.0], rtol=1e-6)
