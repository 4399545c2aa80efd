"""A corpus of malformed and hostile inputs, generated at test time (small: a few MB in all),
beside good ones. Used by ``test_bad_inputs.py``.

Each :class:`BadCase` names its input (a file or folder under the corpus root), what must
happen (``"ok"``: read and converted; ``"error"``: a clear error naming the file, matching
``match``), and whether the problem shows in headers alone (``inspect``). ``rows`` is the number
of converted cases an ``"ok"`` input gives (identical copies count once; different copies under
one SeriesInstanceUID in two folders count twice).
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import struct
import subprocess
import warnings
from dataclasses import dataclass

import nibabel as nib
import numpy as np
import pydicom

from medproc import Volume
from medproc.sample_data import ct_phantom, grid_affine, write_dicom_series

__all__ = ["BadCase", "make_corpus", "SECRET", "can_deny", "deny_prefix"]

#: bytes of a file outside the corpus that hostile headers point at
SECRET = b"TOP-SECRET-" * 8


@dataclass
class BadCase:
    name: str  # also the file or folder name under the corpus root
    expect: str  # "ok" or "error"
    match: str = ""  # regex the error must match (besides naming the file)
    inspect: bool = True  # the problem is visible from headers (inspect reports it)
    rows: int = 1  # converted cases an "ok" input gives
    culprit: str = ""  # the file the error must name (default: the input's own name)
    perm: bool = False  # needs a permission-denied file (only where that can be made)
    load: str = ""  # medproc.load of the whole input fails with this (e.g. it holds 2 series)

    def path(self, root: str) -> str:
        return os.path.join(root, self.name)


_DENY: list | None = None


def deny_prefix() -> list[str] | None:
    """Command prefix under which a chmod-000 file cannot be read: none needed for a normal
    user; for root, a user namespace (``unshare``) mapping root to an ordinary uid; None when
    neither is possible (the permission cases are then left out)."""
    global _DENY
    if _DENY is None:
        if os.geteuid() != 0:
            _DENY = []
        else:
            cmd = ["unshare", "--user", "--map-user=1000", "--map-group=1000"]
            try:
                ok = subprocess.run([*cmd, "true"], capture_output=True, timeout=20).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            _DENY = cmd if ok else [None]
    return None if _DENY == [None] else _DENY


def can_deny() -> bool:
    return deny_prefix() is not None


# --- NIfTI ----------------------------------------------------------------------------------
_AFF = np.diag([2.0, 2.0, 3.0, 1.0])


def _nii_bytes(arr, affine=_AFF, nifti2=False) -> bytearray:
    cls = nib.Nifti2Image if nifti2 else nib.Nifti1Image
    img = cls(arr, affine, dtype=arr.dtype if arr.dtype.names is None else None)
    return bytearray(img.to_bytes())


def _patch(b: bytearray, offset: int, fmt: str, *values) -> bytearray:
    struct.pack_into("<" + fmt, b, offset, *values)
    return b


def _write(path: str, data: bytes, gz: bool | None = None) -> None:
    gz = path.endswith(".gz") if gz is None else gz
    with open(path, "wb") as f:
        f.write(gzip.compress(bytes(data), compresslevel=1) if gz else bytes(data))


def _ct(shape=(8, 6, 5), dtype=np.int16, lo=-1000, hi=1000, seed=0):
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(dtype)


def _nifti_cases(root: str, secret_dir: str) -> list[BadCase]:
    P = lambda n: os.path.join(root, n)  # noqa: E731
    out = []

    def good(name, arr, **kw):
        _write(P(name), _nii_bytes(arr, **kw))
        out.append(BadCase(name, "ok"))

    good("n_good_int16.nii.gz", _ct())
    good("n_dipy_uint16_4d.nii.gz", _ct((8, 6, 5, 1), np.uint16, 0, 65535))
    good("n_int8.nii.gz", _ct(dtype=np.int8, lo=-128, hi=127))
    good("n_int32_hu.nii.gz", _ct(dtype=np.int32, lo=-1024, hi=3071))
    good("n_uint64.nii.gz", _ct(dtype=np.uint64, lo=0, hi=5000))
    good("n_float64.nii.gz", _ct().astype(np.float64) / 7)
    good("n_case[1][red]x.nii.gz", _ct())  # markup-looking names print as they are
    good("n_2d.nii.gz", _ct((8, 6)))
    good("n_nifti2.nii", _ct(), nifti2=True)
    _write(P("n_extra_bytes.nii"), _nii_bytes(_ct()) + b"\0junk" * 10)
    out.append(BadCase("n_extra_bytes.nii", "ok"))
    weird = os.fsdecode(b"n_caf\xe9_latin1_name.nii.gz")  # not UTF-8: a surrogate in Python
    _write(os.path.join(root, weird), _nii_bytes(_ct()))
    out.append(BadCase(weird, "ok"))

    def bad(name, data, match, inspect=True, gz=None):
        _write(P(name), data, gz)
        out.append(BadCase(name, "error", match, inspect))

    bad("n_complex64.nii.gz", _nii_bytes(_ct().astype(np.complex64)), "complex")
    rgb = np.zeros((8, 6, 5), dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
    bad("n_rgb24.nii.gz", _nii_bytes(rgb), "RGB colour")
    bad("n_zero_axis.nii", _patch(_nii_bytes(_ct()), 40, "8h", 3, 8, 0, 5, 1, 1, 1, 1), "length 0")
    bad("n_dim7_zero.nii", _patch(_nii_bytes(_ct()), 40, "8h", 7, 8, 6, 5, 0, 0, 0, 0), "length 0")
    bad("n_dim1.nii", _patch(_nii_bytes(_ct()), 40, "8h", 1, 240, 1, 1, 1, 1, 1, 1), "axis")
    bad("n_negative_dim.nii", _patch(_nii_bytes(_ct()), 40, "8h", 3, 8, -6, 5, 1, 1, 1, 1), "")
    huge = _patch(_nii_bytes(_ct()), 40, "8h", 3, 30000, 30000, 30000, 1, 1, 1, 1)
    bad("n_huge_30000cubed.nii.gz", huge, "30000x30000x30000")
    bad("n_huge_30000cubed.nii", huge, "30000x30000x30000")
    full = gzip.compress(bytes(_nii_bytes(_ct((40, 40, 30)))))
    bad("n_truncated.nii.gz", full[: len(full) // 2], "truncated|damaged", inspect=False, gz=False)
    raw = _nii_bytes(_ct((40, 40, 30)))
    bad("n_truncated[red][1].nii", raw[: len(raw) // 2], "holds only")
    nan = _nii_bytes(_ct())
    _patch(nan, 280, "4f", np.nan, 0, 0, 0)
    _patch(nan, 252, "2h", 0, 1)
    bad("n_nan_sform.nii.gz", nan, "not finite")
    sing = _nii_bytes(_ct(), affine=np.diag([2.0, 2.0, 3.0, 1.0]))
    _patch(sing, 252, "2h", 0, 1)
    _patch(sing, 280, "12f", 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0)
    bad("n_singular_affine.nii.gz", sing, "spacing along|collinear")
    bad(
        "n_tiny_spacing.nii.gz",
        _nii_bytes(_ct(), affine=np.diag([1e-6, 1e-6, 1e-6, 1])),
        "spacing along i is 1e-06 mm",
    )
    bad("n_scl_inf.nii.gz", _patch(_nii_bytes(_ct()), 112, "f", np.inf), "scl_slope=inf")
    pix0 = _patch(_nii_bytes(_ct()), 252, "2h", 1, 0)  # qform only (nibabel makes 0 into 1 mm)
    bad("n_pixdim0_qform.nii", _patch(pix0, 80, "f", 0.0), "voxel size along i as 0 mm")
    _write(P("n_pixdim_negative_qform.nii"), _patch(bytearray(pix0), 80, "f", -2.0))
    out.append(BadCase("n_pixdim_negative_qform.nii", "ok"))  # (its size, as nibabel reads it)
    f = _ct().astype(np.float32)
    f[1, 1, 1] = np.nan
    bad("n_nan_voxels.nii.gz", _nii_bytes(f), "NaN", inspect=False)
    bad("n_vox_offset_beyond_eof.nii", _patch(_nii_bytes(_ct()), 108, "f", 1e9), "holds only")
    # (nibabel read the header's bytes as the first voxels)
    bad("n_vox_offset_0.nii", _patch(_nii_bytes(_ct()), 108, "f", 0.0), "vox_offset is 0")
    quat = _patch(_nii_bytes(_ct()), 256, "3f", 5.0, 0.0, 0.0)  # b, c, d: not a rotation
    bad("n_bad_quatern.nii", _patch(bytearray(quat), 252, "2h", 1, 0), "quaternion")
    _write(P("n_bad_quatern_sform.nii"), _patch(quat, 252, "2h", 1, 1))  # the sform is used
    out.append(BadCase("n_bad_quatern_sform.nii", "ok"))  # (a bare ValueError of nibabel's)
    bad("n_not_gzip.nii.gz", b"this is not gzip data\n" * 5, "cannot be read as NIfTI", gz=False)
    bad("n_empty.nii.gz", b"", "cannot be read as NIfTI", gz=False)
    _write(P("n_bad_sizeof.nii"), _patch(_nii_bytes(_ct()), 0, "i", 12345))
    out.append(BadCase("n_bad_sizeof.nii", "ok"))  # nibabel repairs it: the data is right
    bad("n_bad_datatype.nii", _patch(_nii_bytes(_ct()), 70, "h", 9999), "NIfTI|type")
    ext = _nii_bytes(_ct())
    ext[348] = 1  # an extension follows the header, declaring 2 GiB
    ext = ext[:352] + struct.pack("<ii", 2**31 - 16, 0) + bytes(8) + ext[352:]
    bad("n_huge_extension.nii", _patch(ext, 108, "f", 368), "memory|damaged")
    os.mkfifo(P("n_fifo.nii.gz"))
    out.append(BadCase("n_fifo.nii.gz", "error", "FIFO"))
    os.symlink("/dev/zero", P("n_devzero.nii.gz"))
    out.append(BadCase("n_devzero.nii.gz", "error", "character device"))
    os.mkdir(P("n_folder.nii.gz"))
    out.append(BadCase("n_folder.nii.gz", "error", "no DICOM|holds no"))
    os.symlink("n_loop_b.nii", P("n_loop_a.nii"))
    os.symlink("n_loop_a.nii", P("n_loop_b.nii"))
    out.append(BadCase("n_loop_a.nii", "error", "loop|broken"))
    os.symlink(os.path.join(secret_dir, "gone.nii.gz"), P("n_dangling.nii.gz"))
    out.append(BadCase("n_dangling.nii.gz", "error", "no such|broken"))
    _write(P("n_denied.nii.gz"), _nii_bytes(_ct()))
    os.chmod(P("n_denied.nii.gz"), 0)
    out.append(BadCase("n_denied.nii.gz", "error", "permission denied", perm=True))
    return out


# --- NRRD / MetaImage -----------------------------------------------------------------------
_NRRD = "NRRD0004\ntype: short\ndimension: 3\nspace: left-posterior-superior\nsizes: {sizes}\n"
_NRRD += "space directions: (1,0,0) (0,1,0) (0,0,2)\nspace origin: (0,0,0)\nencoding: raw\n"
_NRRD += "endian: little\n"
_MHD = "ObjectType = Image\nNDims = 3\nDimSize = {sizes}\nElementSpacing = 1 1 2\n"
_MHD += "ElementType = MET_SHORT\nElementByteOrderMSB = False\nElementDataFile = {ref}\n"


def _itk_cases(root: str, secret_dir: str) -> list[BadCase]:
    P = lambda *n: os.path.join(root, *n)  # noqa: E731
    out = []
    data = _ct((8, 6, 5)).tobytes(order="F")

    def put(rel, text, payload=b""):
        os.makedirs(os.path.dirname(P(rel)) or root, exist_ok=True)
        with open(P(rel), "wb") as f:
            f.write(text.encode() + payload)

    put("i_good.nrrd", _NRRD.format(sizes="8 6 5") + "\n", data)
    out.append(BadCase("i_good.nrrd", "ok"))
    put("i_good.mha", _MHD.format(sizes="8 6 5", ref="LOCAL"), data)
    out.append(BadCase("i_good.mha", "ok"))
    put("i_detached/x.nhdr", _NRRD.format(sizes="8 6 5") + "data file: x.raw\n")
    put("i_detached/x.raw", "", data)
    out.append(BadCase("i_detached/x.nhdr", "ok"))
    put("i_mhd/x.mhd", _MHD.format(sizes="8 6 5", ref="x.raw"))
    put("i_mhd/x.raw", "", data)
    out.append(BadCase("i_mhd/x.mhd", "ok"))

    def bad(rel, text, match, payload=b"", inspect=True):
        put(rel, text, payload)
        out.append(BadCase(rel, "error", match, inspect))

    up = os.path.relpath(os.path.join(secret_dir, "secret.raw"), P("i_traversal"))
    bad("i_traversal/x.nhdr", _NRRD.format(sizes="8 6 5") + f"data file: {up}\n", "outside")
    bad("i_devzero_ref/x.nhdr", _NRRD.format(sizes="8 6 5") + "data file: /dev/zero\n", "outside")
    os.makedirs(P("i_devzero_link"))
    os.symlink("/dev/zero", P("i_devzero_link", "zero.raw"))
    bad("i_devzero_link/x.mhd", _MHD.format(sizes="8 6 5", ref="zero.raw"), "outside")
    os.makedirs(P("i_fifo_data"))
    os.mkfifo(P("i_fifo_data", "pipe.raw"))
    bad("i_fifo_data/x.mhd", _MHD.format(sizes="8 6 5", ref="pipe.raw"), "FIFO")
    up = os.path.relpath(os.path.join(secret_dir, "secret.raw"), root)
    bad("i_mha_ref.mha", _MHD.format(sizes="8 6 5", ref=up), "outside")
    bad("i_abs.mhd", _MHD.format(sizes="4 4 1", ref="/etc/passwd"), "outside")
    bad("i_huge.nrrd", _NRRD.format(sizes="30000 30000 30000") + "\n", "30000x30000x30000", data)
    bad("i_sizes_400_digits.mhd", _MHD.format(sizes="8 6 " + "9" * 400, ref="LOCAL"), "99999", data)
    bad("i_short.nrrd", _NRRD.format(sizes="8 6 5") + "\n", "holds only", data[:50])
    up = os.path.relpath(os.path.join(secret_dir, "secret.raw"), P("i_list"))
    bad("i_list/x.nhdr", _NRRD.format(sizes="8 6 5") + f"data file: LIST\n{up}\n", "outside")
    pat = "data file: ../../slice%03d.raw 1 5 1\n"
    bad("i_pattern/x.nhdr", _NRRD.format(sizes="8 6 5") + pat, "outside")
    bad("i_block.nrrd", _NRRD.format(sizes="8 6 5").replace("short", "block") + "\n", "block")
    bad("i_garbage.nrrd", "", "NRRD", os.urandom(300))
    bad("i_binary_header.nrrd", "NRRD0004\n", "field: value", b"\x00\xff\xfe" * 40)
    bad("i_neg_size.mhd", _MHD.format(sizes="8 -6 5", ref="LOCAL"), "sizes", data)
    four = _NRRD.replace("dimension: 3", "dimension: 4").replace(
        "space directions: (1,0,0) (0,1,0) (0,0,2)\nspace origin: (0,0,0)\n", ""
    )
    bad("i_4d.nrrd", four.format(sizes="2 8 6 5") + "\n", "4D|3D|dimension", data * 2)
    return out


# --- DICOM ----------------------------------------------------------------------------------
def _series(folder, uid="1.2.3", shape=(8, 6, 4), seed=0, **kw) -> list[str]:
    aff = grid_affine(shape, (1.0, 1.2, 2.5), (-4.0, -3.0, 0.0))
    img, _ = ct_phantom(shape, aff, [], seed=seed)
    return sorted(write_dicom_series(folder, Volume(img, aff), uid, seed=seed, **kw))


def _edit(path, **attrs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom warns about the NaNs we write on purpose
        ds = pydicom.dcmread(path)
        for k, v in attrs.items():
            if v is None:
                delattr(ds, k)
            else:
                setattr(ds, k, v)
        ds.save_as(path)


def _raw_ds_attr(path, old: bytes, new: bytes):
    """Replace bytes in a file (DS strings keep their length, so the file stays valid)."""
    b = open(path, "rb").read()
    assert old in b, (path, old)
    open(path, "wb").write(b.replace(old, new, 1))


def _dicom_cases(root: str) -> list[BadCase]:
    P = lambda *n: os.path.join(root, *n)  # noqa: E731
    out = []
    uid = iter(f"1.2.826.0.1.3680043.8.498.77.{n}" for n in range(1, 1000))
    _series(P("d_good"), next(uid))
    out.append(BadCase("d_good", "ok"))
    f = _series(P("d_nan_ipp_one"), next(uid))
    _edit(f[2], ImagePositionPatient=["nan", "0", "5"])
    out.append(BadCase("d_nan_ipp_one", "error", "ImagePositionPatient", culprit=f[2]))
    f = _series(P("d_nan_ipp_all"), next(uid))
    for p in f:
        _edit(p, ImagePositionPatient=["NaN", "NaN", "NaN"])
    out.append(BadCase("d_nan_ipp_all", "error", "ImagePositionPatient"))
    f = _series(P("d_inf_iop"), next(uid))
    for p in f:
        _edit(p, ImageOrientationPatient=["1", "0", "0", "0", "inf", "0"])
    out.append(BadCase("d_inf_iop", "error", "ImageOrientationPatient"))
    f = _series(P("d_nan_spacing"), next(uid))
    _edit(f[1], PixelSpacing=["nan", "1"])
    out.append(BadCase("d_nan_spacing", "error", "PixelSpacing", culprit=f[1]))
    f = _series(P("d_rows_smaller"), next(uid))
    for p in f:
        _edit(p, Rows=5)
    out.append(BadCase("d_rows_smaller", "error", "PixelData holds .* more than"))
    f = _series(P("d_rows_larger"), next(uid))
    for p in f:
        _edit(p, Rows=7)
    out.append(BadCase("d_rows_larger", "error", "PixelData holds"))
    f = _series(P("d_missing_ipp_one"), next(uid))
    _edit(f[1], ImagePositionPatient=None)
    out.append(BadCase("d_missing_ipp_one", "error", "no ImagePositionPatient", culprit=f[1]))
    f = _series(P("d_slope_inf"), next(uid))
    _edit(f[0], RescaleSlope="inf")
    out.append(BadCase("d_slope_inf", "error", "RescaleSlope", culprit=f[0]))
    f = _series(P("d_slope_overflows"), next(uid))  # finite, but inf/NaN in float32
    _edit(f[1], RescaleSlope="1e300")
    out.append(  # (seen when the pixels are read, not in the headers)
        BadCase("d_slope_overflows", "error", "beyond float32's range", False, culprit=f[1])
    )
    f = _series(P("d_float_pixels_nan"), next(uid))  # FloatPixelData with a NaN: --nan error
    for n, p in enumerate(f):
        px = pydicom.dcmread(p).pixel_array.astype(np.float32)
        px[0, 0] = np.nan if n == 1 else px[0, 0]
        _edit(p, PixelData=None, BitsAllocated=32, BitsStored=32, HighBit=31)
        _edit(p, PixelRepresentation=0, FloatPixelData=px.tobytes())
    out.append(BadCase("d_float_pixels_nan", "error", "contains 1 NaN/inf voxel", False))
    f = _series(P("d_int32_rescale"), next(uid))
    for p in f:
        _edit(p, RescaleSlope="100")
    out.append(BadCase("d_int32_rescale", "ok"))
    f = _series(P("d_truncated"), next(uid), shuffle_names=False)
    with open(f[2], "r+b") as fh:
        fh.truncate(os.path.getsize(f[2]) - 20)
    out.append(BadCase("d_truncated", "error", "truncated", culprit=f[2]))
    # pydicom's own exceptions (struct.error, BytesLengthException, an unknown VR) left the
    # batch as "a bug in medproc", naming no file
    f = _series(P("d_cut_in_file_meta"), next(uid))
    os.truncate(f[1], 142)
    out.append(BadCase("d_cut_in_file_meta", "error", "cannot be parsed", culprit=f[1]))
    f = _series(P("d_cut_in_pixel_length"), next(uid))
    os.truncate(f[1], open(f[1], "rb").read().rindex(b"\xe0\x7f\x10\x00") + 10)
    out.append(BadCase("d_cut_in_pixel_length", "error", "cannot be parsed", culprit=f[1]))
    f = _series(P("d_unknown_vr"), next(uid))
    _raw_ds_attr(f[1], b"\x28\x00\x00\x01US", b"\x28\x00\x00\x01NS")  # BitsAllocated
    out.append(BadCase("d_unknown_vr", "error", "Unknown Value Representation", culprit=f[1]))
    f = _series(P("d_stray_text_in_series"), next(uid))
    open(P("d_stray_text_in_series", "timezone"), "w").write("Etc/UTC\n")  # skipped
    out.append(BadCase("d_stray_text_in_series", "ok"))
    f = _series(P("d_with_dicomdir"), next(uid))  # (was a failed row: exit status 1)
    d = pydicom.Dataset()
    d.file_meta = pydicom.dataset.FileMetaDataset()
    d.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.1.3.10"
    d.file_meta.MediaStorageSOPInstanceUID = next(uid)
    d.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    d.FileSetID, d.DirectoryRecordSequence = "X", pydicom.Sequence()
    d.save_as(P("d_with_dicomdir", "DICOMDIR"), enforce_file_format=True)
    out.append(BadCase("d_with_dicomdir", "ok"))
    f = _series(P("d_element_past_eof"), next(uid))
    raw = bytearray(open(f[1], "rb").read())
    at = raw.find(struct.pack("<HH", 0x0008, 0x0060) + b"CS")  # Modality, explicit VR
    raw[at + 6 : at + 8] = struct.pack("<H", 0xFFF0)  # its length runs past the end
    open(f[1], "wb").write(raw)
    out.append(BadCase("d_element_past_eof", "error", "runs .* bytes past the end", culprit=f[1]))
    f = _series(P("d_fifo_in_series"), next(uid))
    os.mkfifo(P("d_fifo_in_series", "IM_pipe"))
    out.append(BadCase("d_fifo_in_series", "ok"))
    f = _series(P("d_devzero_in_series"), next(uid))
    os.symlink("/dev/zero", P("d_devzero_in_series", "IM99999.dcm"))
    s = socket.socket(socket.AF_UNIX)
    s.bind(P("d_devzero_in_series", "IM_socket"))
    s.close()
    out.append(BadCase("d_devzero_in_series", "ok"))
    u = next(uid)
    _series(P("d_dup_identical", "a"), u)
    shutil.copytree(P("d_dup_identical", "a"), P("d_dup_identical", "b"))
    out.append(BadCase("d_dup_identical", "ok", rows=1))
    u = next(uid)
    _series(P("d_dup_differ", "a"), u, seed=1)
    _series(P("d_dup_differ", "b"), u, seed=2)  # same UIDs, other voxels (a re-export)
    out.append(BadCase("d_dup_differ", "ok", rows=2, load="holds 2 series"))
    f = _series(P("d_copy_in_folder"), next(uid))
    shutil.copy(f[0], P("d_copy_in_folder", "IM_copy.dcm"))
    out.append(BadCase("d_copy_in_folder", "ok", rows=1))
    f = _series(P("d_denied"), next(uid))
    os.chmod(f[1], 0)
    out.append(BadCase("d_denied", "error", "permission denied", culprit=f[1], perm=True))
    os.makedirs(P("d_empty_dir"))
    out.append(BadCase("d_empty_dir", "error", "holds no"))
    os.makedirs(P("d_only_readme"))
    open(P("d_only_readme", "README"), "w").write("nothing here\n")
    out.append(BadCase("d_only_readme", "error", "holds no"))

    # single files with damaged headers
    one = _series(P("_tmp_one"), next(uid), shape=(8, 6, 1))[0]

    def single(name, match, edit=None, raw=None):
        shutil.copy(one, P(name))
        u = next(uid)  # a series of its own
        _edit(P(name), SeriesInstanceUID=u, SOPInstanceUID=u + ".1", **(edit or {}))
        if raw:
            raw(P(name))
        out.append(BadCase(name, "error", match))

    single("d_frames_1e6.dcm", "NumberOfFrames", edit={"NumberOfFrames": "1000000"})
    single("d_frames_2e31.dcm", "NumberOfFrames", edit={"NumberOfFrames": "2147483647"})
    single(
        "d_rows_65535.dcm", "PixelData holds|65535x65535", edit={"Rows": 65535, "Columns": 65535}
    )
    single("d_rows_zero.dcm", "Rows x Columns", edit={"Rows": 0})
    single("d_bits_7.dcm", "BitsAllocated", edit={"BitsAllocated": 7})

    def huge_element(p):
        ds = pydicom.dcmread(p)
        ds.add_new(0x00091010, "OB", b"\0" * 4)
        ds.save_as(p)
        b = open(p, "rb").read()
        i = b.find(b"\x09\x00\x10\x10OB")
        open(p, "wb").write(b[: i + 8] + struct.pack("<I", 0xFFFFFFF0) + b[i + 12 :])

    single("d_huge_element.dcm", "past the end|damaged|no Rows", raw=huge_element)
    shutil.rmtree(P("_tmp_one"))
    open(P("d_junk.dcm"), "wb").write(os.urandom(2000))
    out.append(BadCase("d_junk.dcm", "error", "not a DICOM"))
    os.makedirs(P("d_markup["))  # the path holds a closing markup tag: d_markup[/red]junk.dcm
    open(P("d_markup[/red]junk.dcm"), "wb").write(os.urandom(700))
    out.append(BadCase("d_markup[/red]junk.dcm", "error", "not a DICOM"))
    open(P("d_empty.dcm"), "wb").close()
    out.append(BadCase("d_empty.dcm", "error", "empty"))
    open(P("d_dicm_garbage.dcm"), "wb").write(b"\0" * 128 + b"DICM" + os.urandom(500))
    out.append(BadCase("d_dicm_garbage.dcm", "error", ""))
    sr = pydicom.Dataset()
    sr.SOPClassUID = pydicom.uid.BasicTextSRStorage
    sr.SOPInstanceUID, sr.SeriesInstanceUID, sr.Modality = next(uid), next(uid), "SR"
    sr.file_meta = pydicom.dataset.FileMetaDataset()
    sr.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    sr.file_meta.MediaStorageSOPClassUID = sr.SOPClassUID
    sr.file_meta.MediaStorageSOPInstanceUID = sr.SOPInstanceUID
    sr.save_as(P("d_report_sr.dcm"), enforce_file_format=True)
    out.append(BadCase("d_report_sr.dcm", "error", "no image"))
    shutil.copy(P("d_report_sr.dcm"), P("d_nested_20000.dcm"))
    sq = b"\x08\x00\x15\x11SQ\x00\x00\xff\xff\xff\xff" + b"\xfe\xff\x00\xe0\xff\xff\xff\xff"
    end = b"\xfe\xff\x0d\xe0\x00\x00\x00\x00" + b"\xfe\xff\xdd\xe0\x00\x00\x00\x00"
    with open(P("d_nested_20000.dcm"), "ab") as fh:  # sequences nested 20000 deep
        fh.write(sq * 20000 + end * 20000)
    out.append(BadCase("d_nested_20000.dcm", "error", "nested too deeply"))
    out.append(BadCase("d_does_not_exist", "error", "no such file"))
    return out


def make_corpus(root: str, secret_dir: str) -> list[BadCase]:
    """Write the corpus under ``root`` (and a secret file in ``secret_dir``, outside it, that
    hostile headers point at); returns its cases."""
    os.makedirs(root, exist_ok=True)
    os.makedirs(secret_dir, exist_ok=True)
    with open(os.path.join(secret_dir, "secret.raw"), "wb") as f:
        f.write(SECRET * 10)
    cases = _nifti_cases(root, secret_dir) + _itk_cases(root, secret_dir) + _dicom_cases(root)
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    return cases
