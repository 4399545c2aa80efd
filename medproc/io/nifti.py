"""NIfTI through nibabel.

nibabel's arrays are ``(i, j, k)`` (Fortran order on disk): medproc keeps them as they are, with
nibabel's affine. The header is checked before any voxel is read: shape (no zero-length axis),
data type (complex and RGB are refused), declared bytes against the file size and the memory
cap, scaling (``scl_slope``) and the affine.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from ..errors import ReadError
from ..geometry import is_orthogonal
from ..volume import Volume
from .safety import check_affine, check_declared, check_file, os_error, trailing_note
from .voxel_checks import check_dtype, check_finite

__all__ = [
    "load_nifti",
    "open_nifti",
    "to_nibabel",
    "check_finite",
    "check_dtype",
    "nifti_header_check",
]


def nifti_header_check(img, path) -> tuple[tuple, np.dtype]:
    """Check a lazily loaded nibabel image's header before its voxels are read: returns
    (shape, dtype) or raises :class:`ReadError` / :class:`~medproc.errors.LimitError`."""
    hdr = img.header
    shape = tuple(int(s) for s in hdr.get_data_shape())
    dtype = hdr.get_data_dtype()
    check_dtype(dtype, path)
    if len(shape) == 0 or len(shape) == 1:
        raise ReadError(
            f"the header declares {len(shape)} axis(es) (dim[0]={len(shape)}, shape {shape}); "
            "a volume needs 2 or more. The header is damaged (fix dim[0])",
            path,
        )
    bad = [n for n, s in enumerate(shape) if s < 1]
    if bad:
        raise ReadError(
            f"the header declares shape {shape} (dim[0]={len(shape)}): axis {bad[0]} has "
            f"length {shape[bad[0]]}. Every declared axis needs a length >= 1; the header is "
            "damaged (fix dim / dim[0])",
            path,
        )
    raw = _raw_fields(img, path)
    _check_pixdim(img, shape, path, raw["pixdim"])
    least = {b"n+1": 352, b"n+2": 544}.get(np.asarray(img.header["magic"]).item())  # one file
    if least and raw["vox_offset"][0] < least:  # (nibabel read the header as voxels)
        raise ReadError(
            f"the header's vox_offset is {raw['vox_offset'][0]:g}: inside the header (a "
            f"single-file NIfTI's voxels start at byte {least} or later). The header is "
            "damaged; fix vox_offset",
            path,
        )
    bad = [
        f"{n}={c}"
        for n, c in zip(("qform_code", "sform_code"), raw["codes"])
        if c == c and c not in range(6)
    ]
    if bad:  # (nibabel resets it to 0 and guesses: a mirrored volume under a wrong warning)
        raise ReadError(
            f"the header's {', '.join(bad)} is not a NIfTI transform code (0 to 5): the header "
            "is damaged, so which affine to trust is unknown. Fix the code",
            path,
        )
    slope, inter = raw["scaling"]
    if np.isinf(slope) or (np.isfinite(slope) and slope != 0 and not np.isfinite(inter)):
        raise ReadError(
            f"the header's scaling is not finite (scl_slope={slope}, scl_inter={inter}); "
            "expected finite numbers (or scl_slope 0 / NaN for no scaling). Fix the header",
            path,
        )
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    scaled = np.isfinite(slope) and slope != 0 and (slope, inter) != (1, 0)
    peak = nbytes + int(np.prod(shape, dtype=object)) * 8 if scaled else None  # (+ float64)
    what = f"{'x'.join(map(str, shape))} {dtype.name} voxels"
    size = os.path.getsize(path)
    if str(path).lower().endswith(".gz"):
        check_declared(path, what, nbytes, compressed="gzip", stored=size, peak=peak)
    else:
        offset = int(getattr(img.dataobj, "offset", 0) or 0)
        check_declared(path, what, nbytes, available=size - offset, peak=peak)
    return shape, dtype


def _check_pixdim(img, shape, path, pixdim: tuple) -> None:
    """Without an sform, the affine's spacings are pixdim's (the qform's, or nibabel's guess):
    a zero or non-finite one is an unknown voxel size, which nibabel would quietly make 1 mm (a
    negative one is read as its size, as nibabel reads it)."""
    if img.get_sform(coded=True)[1]:
        return
    zooms = pixdim[1:4]  # (as the file has them: nibabel's header has the zeros made 1)
    for ax, z in list(zip("ijk", zooms))[: min(3, len(shape))]:
        if not (np.isfinite(z) and z != 0):
            uses = "the qform uses it" if img.get_qform(coded=True)[1] else "no qform either"
            if z == 0:
                uses += "; nibabel would take 1 mm"
            raise ReadError(
                f"pixdim gives the voxel size along {ax} as {z:g} mm and no sform says otherwise "
                f"({uses}): the voxel size is unknown. Fix the header's pixdim",
                path,
            )


#: header fields as the file stores them: (offset, format) in NIfTI-1 and in NIfTI-2
_RAW_FIELDS = {
    "pixdim": ((76, "8f"), (104, "8d")),
    "scaling": ((112, "ff"), (176, "dd")),
    "codes": ((252, "hh"), (344, "ii")),  # qform_code, sform_code
    "vox_offset": ((108, "f"), (168, "q")),
}


def _raw_fields(img, path) -> dict[str, tuple]:
    """Header fields (:data:`_RAW_FIELDS`) as the file stores them, not as nibabel's checks
    leave them (on load it makes zero pixdims 1 and an infinite scl_slope NaN, "no scaling":
    such headers must be refused, not read); NaNs where the file cannot be read again."""
    import struct

    from nibabel.openers import ImageOpener

    two = type(img.header).__name__.startswith("Nifti2")
    endian = "<" if img.header.endianness == "<" else ">"
    try:
        with ImageOpener(path) as f:
            raw = f.read(540)  # (a NIfTI-2 header; NIfTI-1's is 348 bytes)
    except (OSError, EOFError):
        raw = b""
    out = {}
    for name, both in _RAW_FIELDS.items():
        off, fmt = both[two]
        try:
            out[name] = struct.unpack_from(endian + fmt, raw, off)
        except struct.error:  # (the file could not be read again)
            out[name] = (float("nan"),) * (struct.calcsize(fmt) // struct.calcsize(fmt[-1]))
    return out


def _check_dim0(path: str) -> None:
    """Refuse a NIfTI-1/2 header whose dim[0] (the number of dimensions) is not 1 to 7, before
    nibabel reads it: nibabel takes such a dim[0] for a sign of the other byte order and then
    complains of something else ("vox offset 0 too low"), or reads dim[0] = 0 as one empty
    axis. The byte order comes from sizeof_hdr (348: NIfTI-1, dim[0] at byte 40; 540: NIfTI-2,
    at byte 16); a file that is neither is left to nibabel."""
    import struct

    from nibabel.openers import ImageOpener

    try:
        with ImageOpener(path) as f:
            raw = f.read(48)
    except (OSError, EOFError, ValueError):
        return  # (nibabel says why)
    if len(raw) < 48:
        return
    for endian in "<>":
        size = struct.unpack_from(endian + "i", raw)[0]
        if size in (348, 540):
            fmt, offset = ("h", 40) if size == 348 else ("q", 16)
            dim0 = struct.unpack_from(endian + fmt, raw, offset)[0]
            if not 1 <= dim0 <= 7:
                raise ReadError(
                    f"the header's dim[0] (the number of dimensions) is {dim0}; NIfTI allows 1 "
                    "to 7 (3 for a volume). The header is damaged: set dim[0] (the "
                    f"{'2' if size == 348 else '8'}-byte integer at byte {offset}) to the "
                    "number of axes the image has",
                    path,
                )
            return


@contextlib.contextmanager
def _read_errors(path: str, memory: str, oserror: str, other: str):
    """nibabel's many exceptions on damaged files as one ReadError naming the file: ``memory``
    for MemoryError, ``oserror`` for an OSError without errno (errno ones say what the system
    said), ``other`` for anything else; ``{e}`` is the original message."""
    try:
        yield
    except ReadError:
        raise  # said already
    except MemoryError:
        raise ReadError(memory, path) from None
    except OSError as e:
        if e.errno is not None:
            raise os_error(e, path) from None
        raise ReadError(oserror.format(e=e), path) from None
    except Exception as e:  # noqa: BLE001 - nibabel/zlib raise many kinds on damaged files
        raise ReadError(other.format(e=f"{type(e).__name__}: {e}"), path) from None


def open_nifti(path: str):
    """nibabel's lazy image of ``path`` with its header checked (:func:`nifti_header_check`):
    no voxel read yet. Raises :class:`ReadError` naming the file."""
    import nibabel as nib

    check_file(path)
    try:
        open(path, "rb").close()  # nibabel hides why a file cannot be opened
    except OSError as e:
        raise os_error(e, path) from None
    _check_dim0(path)
    with _read_errors(
        path,
        memory="its header declares more data than memory holds (a damaged extension size?); "
        "the file is damaged",
        oserror="cannot be read as NIfTI: {e}; is it damaged or truncated?",
        other="cannot be read as NIfTI ({e}); the header is damaged or it is not a NIfTI file",
    ):
        try:
            img = nib.load(path)
        except ValueError as e:  # (nibabel's quaternions.fillpositive)
            if "should be positive" not in str(e):
                raise
            raise ReadError(
                f"the header's qform quaternion (quatern_b/c/d) is not a rotation ({e}) and no "
                "sform is set: the affine is unknown. Fix the header",
                path,
            ) from None
    if not hasattr(img, "get_sform"):
        raise ReadError(
            f"is a {type(img).__name__} (e.g. CIFTI), not a volume on a voxel grid", path
        )
    nifti_header_check(img, path)
    return img


#: uncompressed bytes a ``.nii.gz`` may hold after its declared voxels (read and checked, as
#: a ``.nii``'s trailing bytes are ignored); more is refused without inflating the rest
GZIP_TAIL_MAX = 1 << 20


def _drain(f, limit: int) -> int:
    """Read ``f`` to its end, but no more than ``limit`` + 1 bytes: how many there were."""
    n = 0
    while n <= limit and (got := len(f.read(min(1 << 18, limit + 1 - n)))):
        n += got
    return n


def _whole_gzip(img, path) -> tuple[np.ndarray, int]:
    """The voxels (scaled as nibabel scales them) of a ``.nii.gz`` and the bytes its gzip data
    holds after them (up to :data:`GZIP_TAIL_MAX`), decompressed by ISA-L
    straight into the array's memory: the gzip trailer's CRC-32 and length are checked (nibabel
    stops reading at the voxels' end, so a damaged file read as valid), it is ~1.7x faster than
    nibabel's zlib stream, and the memory it takes is the declared size once (decompressing to
    bytes and then to an array took it twice). After the header checks: the declared size is
    known to fit."""
    from isal import igzip
    from nibabel.volumeutils import apply_read_scaling

    proxy = img.dataobj
    offset = int(proxy.offset)
    buf = bytearray(offset + int(np.prod(proxy.shape, dtype=np.int64)) * proxy.dtype.itemsize)
    view = memoryview(buf)
    got = tail = 0
    try:
        with igzip.open(path, "rb") as f:
            # (in parts: a read into a whole volume's memory goes through a temporary copy)
            while got < len(buf) and (n := f.readinto(view[got : got + (16 << 20)])):
                got += n
            tail = _drain(f, GZIP_TAIL_MAX)  # to the end: the trailer is checked there
    except (OSError, EOFError, ValueError) as e:  # BadGzipFile (CRC, length), truncation
        raise ReadError(f"its gzip data is damaged ({e}): the file is corrupt", path) from None
    finally:
        view.release()
    if tail > GZIP_TAIL_MAX:
        raise ReadError(
            f"holds more data than its header declares: more than {GZIP_TAIL_MAX} bytes "
            f"(uncompressed) after the {len(buf) - offset} bytes of voxels (another gzip "
            "member appended?); not read further. Fix the header or cut the file",
            path,
        )
    if got < len(buf):
        raise ReadError(
            f"its data ends after {got - offset} of the {len(buf) - offset} bytes of voxels the "
            "header declares: the file is truncated",
            path,
        )
    arr = np.ndarray(proxy.shape, proxy.dtype, buffer=buf, offset=offset, order="F")
    return apply_read_scaling(arr, np.asanyarray(proxy.slope), np.asanyarray(proxy.inter)), tail


def load_nifti(path: str, nan: str = "error") -> Volume:
    """Read a NIfTI-1/2 file (see :func:`medproc.load`)."""
    img = open_nifti(path)
    affine = check_affine(img.affine, path, "the NIfTI header (sform/qform/pixdim)")
    from .safety import human

    nbytes = human(int(np.prod(img.dataobj.shape, dtype=object)) * img.dataobj.dtype.itemsize)
    with _read_errors(
        path,
        memory=f"not enough memory to read {nbytes} of voxels; free memory or use a machine "
        "with more",
        oserror="the voxel data cannot be read ({e}): truncated or damaged?",
        other="the voxel data cannot be read ({e}): the file is truncated or damaged",
    ):
        proxy = img.dataobj
        if str(path).lower().endswith(".nii.gz"):
            data, tail = _whole_gzip(img, path)
        else:
            data = np.asanyarray(proxy)  # applies scl_slope/scl_inter like every reader
            tail = os.path.getsize(path) - int(proxy.offset) - proxy.dtype.itemsize * data.size
        if not data.flags.writeable:  # a view of a read-only mapping
            data = data.copy()
    check_dtype(data.dtype, path)  # scaling may change it
    if data.ndim == 2:
        data = data[:, :, None]
    declared = f"{'x'.join(map(str, proxy.shape))} {proxy.dtype.name} voxels"
    warnings = [w for w in [trailing_note(tail, declared)] if w]
    if data.ndim > 4:
        extra = data.shape[3:]
        data = data.reshape(data.shape[:3] + (-1,), order="F")
        if sum(n > 1 for n in extra) > 1:  # (x, y, z, 1, c): the components, as they are
            warnings.append(
                f"a {len(extra) + 3}-D image (dimensions 4+ of sizes {list(extra)}) is read as "
                f"{data.shape[3]} channels, the 4th dimension varying fastest"
            )
    array = check_finite(data, path, nan)
    hdr = img.header
    sform, scode = img.get_sform(coded=True)
    try:
        qform, qcode = img.get_qform(coded=True)
    except ValueError as e:  # (an sform is set: the header check refuses it otherwise)
        qcode = None
        warnings.append(f"the qform's quaternion is not a rotation ({e}): the sform is used")
    if not scode and not qcode:
        warnings.append("neither sform nor qform is set: the affine is nibabel's best guess")
    meta = {
        "source": str(path),
        "format": "nifti",
        "modality": None,
        "intent": str(hdr.get_intent()[0]),
        "warnings": warnings,
    }
    return Volume(array, affine, meta)


def to_nibabel(volume: Volume):
    """The Volume as a ``nibabel.Nifti1Image`` (sform and, when possible, qform set)."""
    import nibabel as nib

    data = volume.numpy().array
    if data.dtype == np.bool_:
        data = data.astype(np.uint8)
    affine = volume.affine
    img = nib.Nifti1Image(data, affine, dtype=data.dtype)
    img.set_sform(affine, code=1)
    if is_orthogonal(affine):
        img.set_qform(affine, code=1)
    else:  # a sheared grid (gantry tilt) cannot be a qform
        img.set_qform(None, code=0)
    img.header.set_xyzt_units("mm")
    return img
