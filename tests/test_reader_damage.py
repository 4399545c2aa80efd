"""Damaged files the readers once misread or explained badly: each must give a clear error naming
the file and the problem (or, for a usable file, a true warning).

- MetaImage zlib data that is garbage, cut short, or inflates to another size than the header
  declares (SimpleITK only printed "Uncompress failed" and returned leftover memory);
- NRRD/MetaImage geometry that is collinear, singular, NaN or infinite: ``load`` says what
  ``inspect`` says (SimpleITK said "0 0 1"; a NaN was "spacing along i is 0 mm");
- compressed DICOM cut short inside its pixel data (was "PixelData is missing");
- NIfTI dim[0] outside 1..7 (was nibabel's "vox offset 0 too low");
- a multi-frame DICOM with one ImagePositionPatient for the file (was "... missing").
"""

import gzip
import os
import struct
import warnings
import zlib

import nibabel as nib
import numpy as np
import pydicom
import pytest
import SimpleITK as sitk

import medproc
from medproc.io.headers import header_grid

SHAPE = (8, 6, 5)  # (i, j, k) = ITK (x, y, z)
VALUES = np.arange(np.prod(SHAPE), dtype="<i2")  # in file order (x fastest)
_MHA = (
    "ObjectType = Image\nNDims = 3\nDimSize = 8 6 5\nElementSpacing = 1 1 2\n"
    "ElementType = MET_SHORT\nElementByteOrderMSB = False\nCompressedData = True\n"
    "{size}ElementDataFile = {ref}\n"
)


def _mha(path, payload: bytes, size="auto", ref="LOCAL") -> str:
    """A compressed MetaImage: ``payload`` after the header (or in the detached file ``ref``);
    CompressedDataSize = ``size`` ("auto": the payload's length, None: no such line)."""
    size = len(payload) if size == "auto" else size
    line = "" if size is None else f"CompressedDataSize = {size}\n"
    head = _MHA.format(size=line, ref=ref).encode()
    if ref == "LOCAL":
        path.write_bytes(head + payload)
    else:
        path.write_bytes(head)
        (path.parent / ref).write_bytes(payload)
    return str(path)


Z = zlib.compress(VALUES.tobytes())

DAMAGED_ZLIB = {
    "garbage.mha": (b"\x78\x9c" + b"garbage" * 20, {}, "compressed voxel data is damaged"),
    "cut_short.mha": (Z[:30], {}, "compressed voxel data is truncated"),
    "cut_short_nosize.mha": (Z[:30], {"size": None}, "compressed voxel data is truncated"),
    "size_too_small.mha": (Z[:-10], {}, "compressed voxel data is truncated"),
    "detached.mhd": (Z[:30], {"ref": "x.zraw"}, r"compressed voxel data \(in x.zraw\) is trunc"),
    "inflates_short.mha": (zlib.compress(VALUES[:50].tobytes()), {}, "inflates to 100 bytes.*480"),
    "inflates_long.mha": (zlib.compress(VALUES.tobytes() * 2), {}, "inflates to more than 480"),
    "size_past_end.mha": (Z, {"size": len(Z) + 100}, "CompressedDataSize = .* holds only"),
}


@pytest.mark.parametrize("name", sorted(DAMAGED_ZLIB))
def test_damaged_zlib_metaimage_is_refused(tmp_path, name):
    payload, kw, match = DAMAGED_ZLIB[name]
    path = _mha(tmp_path / name, payload, **kw)
    with pytest.raises(medproc.ReadError, match=f"{name}: .*{match}"):
        medproc.load(path)


def test_intact_zlib_metaimage_reads_exactly(tmp_path):
    """Intact streams read as before: SimpleITK's own files (attached and detached), a zlib
    stream with bytes after it, a gzip-wrapped one (MetaIO accepts both headers)."""
    img = sitk.GetImageFromArray(VALUES.reshape(SHAPE[::-1]))
    want = VALUES.reshape(SHAPE[::-1]).transpose(2, 1, 0)
    paths = []
    for name in ("itk.mha", "itk.mhd"):
        sitk.WriteImage(img, str(tmp_path / name), useCompression=True)
        paths.append(str(tmp_path / name))
    paths.append(_mha(tmp_path / "trailing.mha", Z + b"tail"))
    paths.append(_mha(tmp_path / "gzip.mha", gzip.compress(VALUES.tobytes())))
    paths.append(_mha(tmp_path / "nosize.mhd", Z, size=None, ref="nosize.zraw"))
    for p in paths:
        np.testing.assert_array_equal(medproc.load(p).array, want, err_msg=p)


def test_attached_zlib_without_compressed_size_names_the_fix(tmp_path):
    """SimpleITK inflates such a file from its first byte (the header text) and returns
    garbage: refused, with the CompressedDataSize line to add."""
    path = _mha(tmp_path / "nosize.mha", Z, size=None)
    with pytest.raises(medproc.ReadError, match=f"nosize.mha: .*CompressedDataSize = {len(Z)}"):
        medproc.load(path)


def test_uncompressed_files_are_not_inflated(tmp_path, monkeypatch):
    import medproc.io.itk_header as itk_header

    def boom(*a, **k):
        raise AssertionError("an uncompressed file was inflated")

    monkeypatch.setattr(itk_header, "check_itk_zlib", boom)
    img = sitk.GetImageFromArray(VALUES.reshape(SHAPE[::-1]))
    for name in ("raw.mha", "raw.nrrd"):
        sitk.WriteImage(img, str(tmp_path / name), useCompression=False)
        assert medproc.load(str(tmp_path / name)).shape == SHAPE


_NRRD = (
    "NRRD0004\ntype: short\ndimension: 3\nspace: left-posterior-superior\nsizes: 8 6 5\n"
    "space directions: {} \nspace origin: (0,0,0)\nencoding: raw\nendian: little\n\n"
)
_MHA_RAW = (
    "ObjectType = Image\nNDims = 3\nDimSize = 8 6 5\nElementSpacing = {spacing}\n"
    "TransformMatrix = {matrix}\nElementType = MET_SHORT\nElementByteOrderMSB = False\n"
    "ElementDataFile = LOCAL\n"
)
BAD_GEOMETRY = {
    "collinear.nrrd": (_NRRD.format("(1,0,0) (1,0,0) (0,0,2)"), "collinear"),
    "singular.mha": (_MHA_RAW.format(spacing="1 1 2", matrix="0 0 0 0 1 0 0 0 1"), "along i"),
}
# non-finite numbers are named from the header text (SimpleITK reads a MetaImage's NaN as 0, so
# its message was "spacing along i is 0 mm")
NON_FINITE = {
    "nan_matrix.mha": (_MHA_RAW.format(spacing="1 1 2", matrix="nan 0 0 0 1 0 0 0 1"), "'nan'"),
    "nan_spacing.mha": (_MHA_RAW.format(spacing="nan 1 2", matrix="1 0 0 0 1 0 0 0 1"), "'nan'"),
    "inf_spacing.mha": (_MHA_RAW.format(spacing="1 inf 2", matrix="1 0 0 0 1 0 0 0 1"), "'inf'"),
    "nan_direction.nrrd": (_NRRD.format("(nan,0,0) (0,1,0) (0,0,2)"), "'nan'"),
    "inf_origin.nrrd": (_NRRD.format("(1,0,0) (0,1,0) (0,0,2)").replace("(0,0,0)", "(0,-inf,0)"),
                        "'-inf'"),
    # NRRD's nan "no spacing" placeholder on a spatial axis (SimpleITK made it 1 mm)
    "nan_spacings.nrrd": ("NRRD0004\ntype: short\ndimension: 3\nsizes: 8 6 5\nspacings: nan 2 3"
                          "\nencoding: raw\nendian: little\n\n", "'nan'"),
    "nan_spacings_kinds.nrrd": ("NRRD0004\ntype: short\ndimension: 3\nsizes: 8 6 5\nkinds: "
                                "domain domain domain\nspacings: 1 nan 3\nencoding: raw\n"
                                "endian: little\n\n", "'nan'"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BAD_GEOMETRY) + sorted(NON_FINITE))
def test_bad_itk_geometry_load_says_what_inspect_says(tmp_path, name):
    text, match = {**BAD_GEOMETRY, **NON_FINITE}[name]
    path = tmp_path / name
    path.write_bytes(text.encode() + VALUES.tobytes())
    what = "the voxel .*" if name in BAD_GEOMETRY else "its .* field holds "
    with pytest.raises(medproc.ReadError, match=f"{name}: {what}{match}.*damaged") as ei:
        medproc.load(str(path))
    with pytest.raises(medproc.MedprocError) as inspected:
        header_grid(str(path))
    assert str(ei.value) == str(inspected.value)


def _cut_dicom(sample_data, tmp_path, uid) -> str:
    ds = pydicom.dcmread(os.path.join(sample_data, "dicom", "ct_axial", "IM00000.dcm"))
    try:
        ds.compress(uid)
    except (RuntimeError, NotImplementedError) as e:  # no encoder for it here
        pytest.skip(f"cannot encode {uid.name} here: {e}")
    path = tmp_path / f"{uid.name.split()[0]}_cut.dcm"
    ds.save_as(path)
    data = path.read_bytes()
    path.write_bytes(data[:-200])  # inside the last fragment
    return str(path)


@pytest.mark.parametrize("uid", [pydicom.uid.JPEG2000Lossless, pydicom.uid.RLELossless])
def test_compressed_dicom_cut_short_says_truncated(sample_data, tmp_path, uid):
    path = _cut_dicom(sample_data, tmp_path, uid)
    name = os.path.basename(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(medproc.ReadError, match=f"{name}: truncated: .*pixel data is cut"):
            medproc.load(path)
    leaked = [str(w.message) for w in caught if "delimiter" in str(w.message)]
    assert not leaked, f"pydicom's warning leaked: {leaked}"


def _nifti(tmp_path, name, dim0, two=False) -> str:
    cls = nib.Nifti2Image if two else nib.Nifti1Image
    img = cls(VALUES.reshape(SHAPE, order="F"), np.diag([1.0, 1.0, 2.0, 1.0]))
    raw = bytearray(img.to_bytes())
    fmt, offset = ("<q", 16) if two else ("<h", 40)
    struct.pack_into(fmt, raw, offset, dim0)
    path = tmp_path / name
    path.write_bytes(gzip.compress(bytes(raw)) if name.endswith(".gz") else bytes(raw))
    return str(path)


@pytest.mark.parametrize(
    "name,dim0,two",
    [
        ("d0_8.nii", 8, False),
        ("d0_minus1.nii", -1, False),
        ("d0_0.nii", 0, False),
        ("d0_8.nii.gz", 8, False),
        ("d0_9_nifti2.nii", 9, True),
    ],
)
def test_nifti_dim0_out_of_range_is_named(tmp_path, name, dim0, two):
    path = _nifti(tmp_path, name, dim0, two)
    match = rf"{name}: the header's dim\[0\] .* is {dim0}; NIfTI allows 1 to 7"
    with pytest.raises(medproc.ReadError, match=match):
        medproc.load(path)
    with pytest.raises(medproc.ReadError, match=match):
        header_grid(path)  # inspect says the same
    assert medproc.load(_nifti(tmp_path, "ok_" + name, 3, two)).shape == SHAPE


def _multiframe(sample_data, tmp_path, drop=()) -> str:
    """The sample CT series as one multi-frame file: the first slice's header (one
    ImagePositionPatient / ImageOrientationPatient), no per-frame positions."""
    folder = os.path.join(sample_data, "dicom", "ct_axial")
    files = [os.path.join(folder, f) for f in os.listdir(folder)]
    slices = sorted((pydicom.dcmread(f) for f in files), key=lambda d: d.ImagePositionPatient[2])
    pixels = np.stack([s.pixel_array for s in slices]).tobytes()
    ds = slices[0]
    ds.NumberOfFrames, ds.PixelData = len(slices), pixels
    for key in drop:
        delattr(ds, key)
    path = tmp_path / "mf.dcm"
    ds.save_as(path)
    return str(path)


def test_multiframe_with_one_position_is_placed_from_it(sample_data, tmp_path):
    series = medproc.load(os.path.join(sample_data, "dicom", "ct_axial"))
    path = _multiframe(sample_data, tmp_path)
    with pytest.warns(medproc.GeometryWarning, match="mf.dcm: its .* frames have no positions"):
        vol = medproc.load(path)
    (w,) = vol.meta["warnings"]
    assert "missing" not in w and "SliceThickness" in w and "ImagePositionPatient" in w
    np.testing.assert_allclose(vol.affine, series.affine, atol=1e-6)
    np.testing.assert_array_equal(vol.array, series.array)
    path = _multiframe(sample_data, tmp_path, drop=("SliceThickness",))
    with pytest.warns(medproc.GeometryWarning, match=r"1 mm apart \(no SliceThickness either\)"):
        vol = medproc.load(path)
    np.testing.assert_allclose(vol.affine[:3, 3], series.affine[:3, 3], atol=1e-6)


@pytest.mark.parametrize(
    "image, field, offset, fmt",
    [
        (nib.Nifti1Image, "sform_code", 254, "<h"),
        (nib.Nifti1Image, "qform_code", 252, "<h"),
        (nib.Nifti2Image, "sform_code", 348, "<i"),  # (NIfTI-2: int32 codes)
        (nib.Nifti2Image, "qform_code", 344, "<i"),
    ],
)
@pytest.mark.parametrize("gz", [False, True])
def test_a_transform_code_outside_nifti_is_refused_not_guessed(
    tmp_path, image, field, offset, fmt, gz
):
    """sform_code 77 on an RAS sform: nibabel resets it to 0, and the volume was read with
    nibabel's guess, mirrored left-right (LAS), under the warning 'neither sform nor qform is
    set' (a prober's file). Refused, naming the field and its value, in NIfTI-1 and -2."""
    img = image(np.zeros((4, 5, 6), np.int16), np.diag([2.0, 3.0, 4.0, 1.0]))
    img.set_sform(img.affine, code=1)
    img.set_qform(img.affine, code=1)
    raw = bytearray(img.to_bytes())
    assert struct.unpack_from(fmt, raw, offset)[0] == 1  # (the field is where it is written)
    struct.pack_into(fmt, raw, offset, 77)
    path = tmp_path / ("bad.nii.gz" if gz else "bad.nii")
    path.write_bytes(gzip.compress(bytes(raw)) if gz else bytes(raw))
    with pytest.raises(medproc.errors.ReadError, match=rf"bad.nii.*{field}=77 is not a NIfTI"):
        medproc.load(str(path))
    struct.pack_into(fmt, raw, offset, 2)  # a valid code reads as before
    path.write_bytes(gzip.compress(bytes(raw)) if gz else bytes(raw))
    np.testing.assert_allclose(medproc.load(str(path)).affine, img.affine)


_NRRD = "NRRD0004\ntype: short\ndimension: 3\nsizes: 8 6 5\nendian: little\nencoding: raw\n"
_RAW_HEADERS = {  # uncompressed, the voxels attached (or in v<tail>.raw for .nhdr)
    "nrrd": _NRRD + "\n",
    "nhdr": _NRRD + "data file: {raw}\n",
    "mha": _MHA.replace("CompressedData = True\n{size}", "").format(ref="LOCAL"),
}


def _with_tail(tmp_path, ext: str, tail: int) -> str:
    """A volume of SHAPE as ``ext``, with ``tail`` bytes after its voxel data."""
    path = tmp_path / f"v{tail}.{ext}"
    if ext.startswith("nii"):
        v = medproc.Volume(VALUES.reshape(SHAPE, order="F"), np.diag([1.0, 1.0, 2.0, 1.0]))
        medproc.save(v, str(path))
        data = (gzip.decompress if ext == "nii.gz" else bytes)(path.read_bytes()) + bytes(tail)
        path.write_bytes(gzip.compress(data) if ext == "nii.gz" else data)
    elif ext == "nhdr":
        path.write_text(_RAW_HEADERS[ext].format(raw=f"v{tail}.raw"))
        (tmp_path / f"v{tail}.raw").write_bytes(VALUES.tobytes() + bytes(tail))
    else:
        path.write_bytes(_RAW_HEADERS[ext].encode() + VALUES.tobytes() + bytes(tail))
    return str(path)


@pytest.mark.parametrize("ext", ["nii", "nii.gz", "nrrd", "nhdr", "mha"])
def test_data_beyond_the_declared_voxels_is_said_not_read_silently(tmp_path, ext):
    """A file holding more than its header declares was read without a word (a prober's
    files; DICOM refuses): a header whose sizes are too small gives a cut volume. The voxels
    declared are read exactly as before, and the volume's warnings say how many bytes follow
    them; a file without them says nothing."""
    for tail in (0, 96):
        vol = medproc.load(_with_tail(tmp_path, ext, tail))
        np.testing.assert_array_equal(vol.array, VALUES.reshape(SHAPE, order="F"))
        said = [w for w in vol.meta["warnings"] if "after the 8x6x5" in w]
        assert (len(said) == 1 and "holds 96 byte(s)" in said[0]) if tail else not said


@pytest.mark.parametrize(
    "field, says",
    [
        ("HeaderSize = 10\n", r"HeaderSize = 10 points inside the header's text"),
        ("HeaderSize = 99999\n", r"HeaderSize = 99999 leaves 0 bytes for 480 bytes"),
        ("HeaderSize = -7\n", r"HeaderSize = '-7': expected a number of bytes >= 0, or -1"),
        ("BinaryData = False\n", r"BinaryData = False \(voxels stored as text\)"),
        ("ElementType = MET_FOO\n", r"ElementType = 'MET_FOO': expected a MetaImage scalar"),
    ],
)
def test_metaimage_fields_simpleitk_misreads_are_named(tmp_path, field, says):
    """A HeaderSize inside the header's text had SimpleITK read the text as voxels (no error);
    one past the data, and BinaryData = False, gave "No such file or directory"; an unknown
    ElementType gave "Unknown PixelType: unknown(0)". Each is named."""
    head = _RAW_HEADERS["mha"].replace("ElementDataFile", field + "ElementDataFile")
    if "MET_FOO" in field:
        head = head.replace("ElementType = MET_SHORT\n", "")
    path = tmp_path / "v.mha"
    path.write_bytes(head.encode() + VALUES.tobytes())
    with pytest.raises(medproc.errors.ReadError, match=says):
        medproc.load(str(path))


def test_a_metaimage_header_size_that_points_at_the_voxels_reads_them(tmp_path):
    """HeaderSize counts from the file's first byte (the text header included), or is -1 (the
    voxels end the file): both read the voxels exactly."""
    head = _RAW_HEADERS["mha"].replace("ElementDataFile", "HeaderSize = {}\nElementDataFile")
    at = len(head.format(100))  # (three digits: the header's length is the same)
    path = tmp_path / "v.mha"
    for skip in (-1, 0, at):  # (0: nothing skipped, as no HeaderSize line)
        path.write_bytes(head.format(skip).encode() + VALUES.tobytes())
        np.testing.assert_array_equal(medproc.load(str(path)).array.ravel("F"), VALUES)


def test_a_hex_encoded_nrrd_is_read_without_a_trailing_note(tmp_path):
    """Hex data takes two characters per byte: it was said to hold bytes after its voxels
    (review)."""
    path = tmp_path / "v.nrrd"
    head = _NRRD.replace("encoding: raw", "encoding: hex") + "\n"
    path.write_bytes(head.encode() + VALUES.tobytes().hex().encode() + b"\n")
    vol = medproc.load(str(path))
    np.testing.assert_array_equal(vol.array, VALUES.reshape(SHAPE, order="F"))
    assert not [w for w in vol.meta["warnings"] if "after the" in w]
