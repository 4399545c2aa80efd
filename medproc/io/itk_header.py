"""The text headers of NRRD (``.nrrd``, ``.nhdr``) and MetaImage (``.mha``, ``.mhd``) files,
checked before SimpleITK opens them.

Both formats may name their voxel data in another file (``data file:`` / ``ElementDataFile``),
with any path. medproc follows such a reference only to a regular file inside the header's own
folder (no ``..``, no absolute path elsewhere, no symlink out, never a device or FIFO), and
checks the declared sizes against the bytes the data can hold and the memory cap, so a damaged
or hostile header can neither read files it should not nor allocate without bound.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import ReadError
from .itk_fields import check_directions, check_finite, nrrd_unsized
from .safety import check_declared, check_inside, os_error, trailing_note

__all__ = ["check_itk_header", "check_itk_zlib", "ItkHeader"]

#: bytes per value of NRRD types (every spelling the NRRD format allows)
_NRRD_BYTES = {
    name: size
    for size, names in (
        (1, "signed char,int8,int8_t,uchar,unsigned char,uint8,uint8_t,char"),
        (2, "short,short int,signed short,signed short int,int16,int16_t,ushort,unsigned short,"
            "unsigned short int,uint16,uint16_t"),
        (4, "int,signed int,int32,int32_t,uint,unsigned int,uint32,uint32_t,float"),
        (8, "longlong,long long,long long int,signed long long,signed long long int,int64,"
            "int64_t,ulonglong,unsigned long long,unsigned long long int,uint64,uint64_t,double"),
    )
    for name in names.split(",")
}  # fmt: skip
_MET_BYTES = {
    "MET_CHAR": 1,
    "MET_UCHAR": 1,
    "MET_SHORT": 2,
    "MET_USHORT": 2,
    "MET_INT": 4,
    "MET_UINT": 4,
    "MET_LONG": 4,
    "MET_ULONG": 4,
    "MET_LONG_LONG": 8,
    "MET_ULONG_LONG": 8,
    "MET_FLOAT": 4,
    "MET_DOUBLE": 8,
}
_MAX_HEADER = 1 << 20  # a text header longer than 1 MiB is not a header


class ItkHeader:
    """What a NRRD/MetaImage header declares: sizes, bytes per value, encoding and the data
    files (real paths, checked), and where attached data starts. ``compressed_size``: a
    MetaImage's CompressedDataSize (None when absent); ``exact``: whether ``itemsize`` is known
    (not a guess for an unknown element type)."""

    def __init__(
        self, sizes, itemsize, compressed, data_files, data_start, compressed_size=None, exact=True
    ):
        self.notes: list[str] = []  # (what the header leaves unsaid, for the volume's warnings)
        self.sizes, self.itemsize, self.compressed = sizes, itemsize, compressed
        self.data_files, self.data_start = data_files, data_start
        self.compressed_size, self.exact = compressed_size, exact
        self.skips = False  # (the data files start after skipped bytes or lines)


def _read_lines(path: str, magic: bytes | None):
    try:
        with open(path, "rb") as f:
            head = f.read(_MAX_HEADER)
    except OSError as e:
        raise os_error(e, path) from None
    if magic is not None and not head.startswith(magic):
        raise ReadError(
            f"does not start with {magic.decode()!r}: not a {magic.decode()[:4]} file "
            "(wrong extension, or damaged)",
            path,
        )
    return head


def _expand(spec: str, path: str, count_hint: int) -> list[str]:
    """``fmt min max step`` (a printf pattern) -> file names."""
    parts = spec.split()
    try:
        lo, hi, step = int(parts[1]), int(parts[2]), int(parts[3]) if len(parts) > 3 else 1
        if step == 0 or abs(hi - lo) // abs(step) > max(count_hint, 1) * 4 + 4:
            raise ValueError
        return [parts[0] % i for i in range(lo, hi + (1 if step > 0 else -1), step)]
    except (ValueError, IndexError, TypeError):
        raise ReadError(
            f"its data file pattern {spec!r} is malformed; expected 'format min max step'", path
        ) from None


def _nrrd(path: str) -> ItkHeader:
    head = _read_lines(path, b"NRRD")
    end = head.find(b"\n\n")
    end_crlf = head.find(b"\r\n\r\n")
    text_end = min(x for x in (end, end_crlf, len(head)) if x >= 0)
    fields: dict[str, str] = {}
    lines = head[:text_end].decode("latin-1").splitlines()
    listed: list[str] = []
    for n, line in enumerate(lines[1:], 2):
        s = line.strip()
        if not s or s.startswith("#") or (":=" in s and s.find(":=") == s.find(":")):
            continue  # blank, comment, or a key:=value pair
        if ":" not in s:
            raise ReadError(f"line {n}: {s[:60]!r} is not a 'field: value' line", path)
        key, val = line.split(":", 1)
        key = key.strip().lower()
        fields[key] = val.strip()
        if key in ("data file", "datafile") and val.strip().upper().startswith("LIST"):
            listed = [x.strip() for x in lines[n:] if x.strip()]
            break
    try:
        sizes = [int(x) for x in fields["sizes"].split()]
    except (KeyError, ValueError):
        raise ReadError(
            f"its 'sizes' field is missing or not integers ({fields.get('sizes')!r})", path
        ) from None
    ttype = " ".join(fields.get("type", "").lower().split())
    if ttype == "block":
        raise ReadError("stores NRRD 'block' values; medproc reads numeric volumes", path)
    itemsize = _NRRD_BYTES.get(ttype, 1)
    encoding = fields.get("encoding", "raw").lower()
    compressed = {"gz": "gzip", "gzip": "gzip", "bz2": "bzip2", "bzip2": "bzip2"}.get(encoding)
    ref = fields.get("data file", fields.get("datafile"))
    files: list[str] = []
    if ref is not None:
        names = listed if ref.upper().startswith("LIST") else None
        if names is None:
            names = _expand(ref, path, sizes[-1] if sizes else 1) if len(ref.split()) > 1 else [ref]
        files = [check_inside(x, path) for x in names]
    check_finite(fields, path)
    check_directions(fields.get("space directions", ""), path)
    data_start = text_end + (2 if end == text_end else 4)
    text = encoding in ("ascii", "text", "txt", "hex")  # (hex: two characters per byte)
    if text:
        itemsize, compressed = 1, None  # at least one character per value
    exact = ttype in _NRRD_BYTES and not text
    hdr = ItkHeader(sizes, itemsize, compressed, files, data_start, exact=exact)
    hdr.skips = "byte skip" in fields or "line skip" in fields
    hdr.notes = nrrd_unsized(fields, len(sizes))
    return hdr


def _meta(path: str) -> ItkHeader:
    head = _read_lines(path, None)
    fields: dict[str, str] = {}
    pos = 0
    lines = head.split(b"\n")
    listed: list[str] = []
    for n, raw in enumerate(lines, 1):
        pos += len(raw) + 1
        line = raw.decode("latin-1").strip()
        if not line:
            continue
        if "=" not in line:
            raise ReadError(f"line {n}: {line[:60]!r} is not a 'Key = Value' line", path)
        key, val = (x.strip() for x in line.split("=", 1))
        fields[key.lower()] = val
        if key.lower() == "elementdatafile":
            if val.upper().startswith("LIST"):
                listed = [x.decode("latin-1").strip() for x in lines[n:] if x.strip()]
            break
        if n > 200:
            break
    if "elementdatafile" not in fields:
        raise ReadError(
            "has no ElementDataFile line: not a MetaImage header (or it is damaged)", path
        )
    try:
        ndims = int(fields.get("ndims", "0"))
        sizes = [int(x) for x in fields["dimsize"].split()]
        channels = int(fields.get("elementnumberofchannels", "1"))
    except (KeyError, ValueError):
        raise ReadError(
            f"its DimSize/NDims fields are missing or not integers ({fields.get('dimsize')!r})",
            path,
        ) from None
    check_finite(fields, path)
    if ndims and len(sizes) != ndims:
        raise ReadError(f"NDims = {ndims} but DimSize has {len(sizes)} values", path)
    etype = fields.get("elementtype", "").upper()
    if etype not in _MET_BYTES:  # (SimpleITK: "Unknown PixelType: unknown(0)")
        raise ReadError(
            f"ElementType = {fields.get('elementtype', '(none)')!r}: expected a MetaImage scalar "
            f"type ({', '.join(_MET_BYTES)})",
            path,
        )
    if fields.get("binarydata", "true").lower() == "false":  # (SimpleITK: "No such file ...")
        raise ReadError(
            "BinaryData = False (voxels stored as text): SimpleITK cannot read such a MetaImage; "
            "rewrite it with binary voxel data",
            path,
        )
    itemsize = _MET_BYTES[etype] * max(channels, 1)
    compressed = "zlib" if fields.get("compresseddata", "").lower() == "true" else None
    csize = None
    if compressed and "compresseddatasize" in fields:
        try:
            csize = int(fields["compresseddatasize"])
            if csize < 1:
                raise ValueError
        except ValueError:
            raise ReadError(
                f"CompressedDataSize = {fields['compresseddatasize']!r}: expected a number of "
                "bytes >= 1 (the header is damaged)",
                path,
            ) from None
    ref = fields["elementdatafile"]
    files: list[str] = []
    if ref.upper() != "LOCAL":
        if ref.upper().startswith("LIST"):
            names = listed
        elif len(ref.split()) > 1:
            names = _expand(ref, path, sizes[-1] if sizes else 1)
        else:
            names = [ref]
        files = [check_inside(x, path) for x in names]
    hdr = ItkHeader(sizes, itemsize, compressed, files, pos, csize)
    if "headersize" in fields:
        hdr.skips = True
        _header_size(fields["headersize"], hdr, path)
    return hdr


def _header_size(value: str, hdr: ItkHeader, path: str) -> None:
    """Check a MetaImage's HeaderSize: the bytes before the voxels in each data file (counted
    from the file's first byte, the text header included for LOCAL data; -1: the voxels end the
    file). SimpleITK read the header's own text as voxels when it pointed inside it, and said
    "No such file or directory" when it pointed past the data."""
    try:
        skip = int(value)
    except ValueError:
        skip = None
    if skip is None or skip < -1:
        raise ReadError(f"HeaderSize = {value!r}: expected a number of bytes >= 0, or -1", path)
    if skip in (-1, 0) or hdr.compressed:  # (0: no bytes skipped)
        return
    sources = hdr.data_files or [path]
    per_file = int(np.prod(hdr.sizes, dtype=object)) * hdr.itemsize // len(sources)
    if not hdr.data_files and skip < hdr.data_start:
        raise ReadError(
            f"HeaderSize = {skip} points inside the header's text (which ends at byte "
            f"{hdr.data_start}): the voxels would be read from the text (the header is damaged)",
            path,
        )
    for src in sources:
        if skip + per_file > os.path.getsize(src):
            name = "" if src == path else f" of {os.path.basename(src)}"
            raise ReadError(
                f"HeaderSize = {skip} leaves {max(os.path.getsize(src) - skip, 0)} bytes{name} "
                f"for {per_file} bytes of voxels (the header is damaged)",
                path,
            )


def check_itk_header(path: str) -> ItkHeader:
    """Check a NRRD or MetaImage header (see the module doc); returns what it declares."""
    low = path.lower()
    hdr = _nrrd(path) if low.endswith((".nrrd", ".nhdr")) else _meta(path)
    if not hdr.sizes or any(s < 1 for s in hdr.sizes):
        raise ReadError(
            f"the header declares sizes {hdr.sizes}; every axis needs a length >= 1 (the header "
            "is damaged)",
            path,
        )
    nbytes = int(np.prod(hdr.sizes, dtype=object)) * hdr.itemsize
    what = f"{'x'.join(map(str, hdr.sizes))} values of {hdr.itemsize} byte(s)"
    if hdr.data_files:
        stored = sum(os.path.getsize(f) for f in hdr.data_files)
    else:
        stored = os.path.getsize(path) - hdr.data_start
    if hdr.compressed == "zlib":
        stored = _zlib_stored(path, hdr, stored)
    check_declared(
        path,
        what,
        nbytes,
        available=None if hdr.compressed else stored,
        compressed=hdr.compressed if hdr.compressed != "bzip2" else None,
        stored=stored,
    )
    plain = hdr.exact and not (hdr.compressed or hdr.skips)
    extra = trailing_note(stored - nbytes if plain else 0, what)
    hdr.notes += [extra] if extra else []
    return hdr


def _zlib_stored(path: str, hdr: ItkHeader, stored: int) -> int:
    """The bytes of zlib data SimpleITK will inflate: its CompressedDataSize (refused when it
    runs past the end of the file: SimpleITK would only say "No such file or directory"), else
    the whole data."""
    if hdr.compressed_size is None:
        return stored
    sizes = [(os.path.getsize(f), f) for f in hdr.data_files] or [(stored, path)]
    shortest, where = min(sizes)
    if hdr.compressed_size > shortest:
        name = "the file" if where == path else f"its data file {os.path.basename(where)}"
        raise ReadError(
            f"CompressedDataSize = {hdr.compressed_size} but {name} holds only "
            f"{max(shortest, 0)} bytes of compressed data: it is truncated or the header is "
            "damaged",
            path,
        )
    return hdr.compressed_size * max(len(hdr.data_files), 1)


def check_itk_zlib(path: str, hdr: ItkHeader, chunk: int = 4 << 20) -> None:
    """Inflate a MetaImage's zlib voxel data (as :func:`check_itk_header` found it) without
    keeping it, and refuse a stream that is damaged, ends early, or inflates to more or fewer
    bytes than DimSize x ElementType: SimpleITK would only print "Uncompress failed" and return
    whatever its buffer held. So is attached data without a CompressedDataSize (SimpleITK then
    inflates the file from its first byte, the header text). Memory: one ``chunk`` of input
    and of output at a time."""
    nbytes = int(np.prod(hdr.sizes, dtype=object)) * hdr.itemsize
    sources = hdr.data_files or [path]
    start = 0 if hdr.data_files else hdr.data_start
    per_file = nbytes // len(sources) if nbytes % len(sources) == 0 else None
    total = 0
    for src in sources:
        limit = hdr.compressed_size
        if limit is None:
            limit = os.path.getsize(src) - start
        want = per_file if per_file is not None else nbytes - total
        got, used = _inflated_size(path, src, start, limit, want, chunk)
        total += got
        if hdr.exact and got != want:
            name = "" if src == path else f" (in {os.path.basename(src)})"
            amount = f"more than {want}" if got > want else str(got)
            raise ReadError(
                f"its compressed voxel data{name} inflates to {amount} bytes, but DimSize x "
                f"ElementType declare {want} ({'x'.join(map(str, hdr.sizes))} values of "
                f"{hdr.itemsize} byte(s)): the header does not match the data (damaged)",
                path,
            )
    if hdr.compressed_size is None and not hdr.data_files:
        raise ReadError(
            "has CompressedData = True and ElementDataFile = LOCAL but no CompressedDataSize "
            "line: SimpleITK cannot find the compressed voxels without it (it would return "
            f"garbage). Add 'CompressedDataSize = {used}' (the bytes of the zlib stream) to "
            "the header, before the ElementDataFile line, or rewrite the file with SimpleITK",
            path,
        )


def _inflated_size(path: str, src: str, start: int, limit: int, want: int, chunk: int):
    """``(inflated, compressed)``: the bytes the zlib (or gzip) stream in ``limit`` bytes at
    ``start`` of ``src`` inflates to (counted up to ``want`` + 1) and the bytes it takes; a
    :class:`ReadError` when it is damaged or cut short."""
    from isal import isal_zlib  # (zlib's API, ~1.4x faster)

    name = "" if src == path else f" (in {os.path.basename(src)})"
    d = isal_zlib.decompressobj(47)  # a zlib or a gzip header, as SimpleITK (MetaIO) accepts
    got = fed = 0
    try:
        with open(src, "rb") as f:
            f.seek(start)
            while fed < limit and not d.eof and got <= want:
                data = f.read(min(chunk, limit - fed))
                if not data:
                    break
                fed += len(data)
                while got <= want and not d.eof:  # (a full output may leave some pending)
                    n = len(d.decompress(data, chunk))
                    got, data = got + n, d.unconsumed_tail
                    if not data and n < chunk:
                        break
    except isal_zlib.error as e:
        raise ReadError(
            f"its compressed voxel data{name} is damaged ({e}, after {got} of the {want} bytes "
            "it should inflate to): the file is corrupt or truncated",
            path,
        ) from None
    except OSError as e:
        raise os_error(e, src) from None
    if not d.eof and got <= want:
        raise ReadError(
            f"its compressed voxel data{name} is truncated: the zlib stream stops after "
            f"inflating to {got} of the {want} bytes DimSize x ElementType declare (the "
            "file, or its CompressedDataSize, is cut short)",
            path,
        )
    return got, fed - len(d.unused_data) - len(d.unconsumed_tail)
