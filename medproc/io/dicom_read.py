"""Read the pixels of a DICOM series into a :class:`~medproc.Volume`."""

from __future__ import annotations

import atexit
import difflib
import os
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pydicom
from pydicom.errors import InvalidDicomError

from ..errors import GeometryWarning, MedprocWarning, ReadError, SeriesError
from ..volume import Volume
from .dicom_geometry import series_geometry
from .dicom_header import frame_notes, n_frames
from .dicom_records import expected_pixel_bytes, length_problem
from .dicom_rescale import rescale, rescaled_dtype  # noqa: F401  (rescaled_dtype: re-exported)
from .dicom_scan import DicomSeries, scan_dicom, series_source
from .safety import all_zero, os_error

_NATIVE_TS = {"1.2.840.10008.1.2", "1.2.840.10008.1.2.1", "1.2.840.10008.1.2.2"}

__all__ = [
    "load_dicom",
    "read_series",
    "select_series",
    "rescale",
    "rescaled_dtype",
    "decode_workers",
    "series_meta",
]

_DECODER_HINT = (
    "pydicom needs a decoder plugin for this transfer syntax: "
    "pip install pylibjpeg pylibjpeg-libjpeg pylibjpeg-openjpeg pylibjpeg-rle"
)


def _decode(path: str) -> np.ndarray:
    try:
        with warnings.catch_warnings():  # (pydicom's; medproc's checks below say it better)
            warnings.simplefilter("ignore", UserWarning)
            ds = pydicom.dcmread(path)
    except InvalidDicomError as e:
        raise ReadError(f"not a DICOM file ({e})", path) from None
    except OSError as e:
        raise os_error(e, path) from None
    except MemoryError:
        raise ReadError("not enough memory to read it (a damaged length?)", path) from None
    except RecursionError:
        raise ReadError("its sequences are nested too deeply to be parsed", path) from None
    except Exception as e:  # pydicom raises many kinds on damaged files
        raise ReadError(f"cannot be parsed: {type(e).__name__}: {e}", path) from None
    ts = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    if not any(k in ds for k in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        if _pixel_tag_at_end(path):  # pydicom drops an encapsulated value cut short
            raise ReadError(
                f"truncated: the file ends inside its compressed ({getattr(ts, 'name', ts)}) "
                "pixel data, before the end of its fragments: the pixel data is cut short. "
                "Copy or export the file again",
                path,
            )
        raise ReadError("has no pixel data (PixelData is missing)", path)
    if str(ts) in _NATIVE_TS and "PixelData" in ds:
        keys = ("Rows", "Columns", "SamplesPerPixel", "BitsAllocated", "PhotometricInterpretation")
        want = expected_pixel_bytes({k: ds.get(k) for k in keys}, n_frames(ds, path))
        data = ds.PixelData
        what = f"{ds.get('Rows')}x{ds.get('Columns')} at {ds.get('BitsAllocated')} bits"
        problem = length_problem(len(data), want, what, lambda: not any(data[want:]))
        if problem:
            raise ReadError(problem, path)
    try:
        return ds.pixel_array
    except (NotImplementedError, RuntimeError) as e:
        raise ReadError(
            f"pixel data in {getattr(ts, 'name', ts)} cannot be decoded: {e}. {_DECODER_HINT}", path
        ) from None
    except MemoryError:
        raise ReadError("not enough memory to decode its pixel data", path) from None
    except Exception as e:
        raise ReadError(
            f"pixel data cannot be decoded ({getattr(ts, 'name', ts)}): {type(e).__name__}: {e} "
            "(truncated or damaged file?)",
            path,
        ) from None


def _pixel_tag_at_end(path: str) -> bool:
    """Whether the file's header is followed by a PixelData element (7FE0,0010), which pydicom
    did not keep: an encapsulated value whose end delimiter the file lacks."""
    from .dicom_file import read_header

    try:
        _, offset = read_header(path, force=True, with_offset=True)
        with open(path, "rb") as f:
            f.seek(offset)
            tag = f.read(4)
    except (ReadError, OSError):
        return False
    return tag in (b"\xe0\x7f\x10\x00", b"\x7f\xe0\x00\x10")  # (little / big endian)


def _read_native(
    path: str, offset: int, dtype: str, rows: int, cols: int, bits_stored: int, out=None
):
    """Pixels of a native little-endian single-frame file, read at the offset the header scan
    found (no second parse). None when the file needs pydicom after all. ``out``: a C-ordered
    ``(rows, cols)`` array of that dtype to read into (no copy through a buffer)."""
    dt = np.dtype(dtype)
    want = rows * cols * dt.itemsize
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            head = f.read(8)
            if len(head) < 8 or head[:4] != b"\xe0\x7f\x10\x00":
                return None
            if head[4:6] in (b"OW", b"OB"):  # explicit VR: 2 reserved bytes, 4-byte length
                length = int.from_bytes(f.read(4), "little")
            else:  # implicit VR: 4-byte length right after the tag
                length = int.from_bytes(head[4:8], "little")
            if length == 0xFFFFFFFF:
                return None
            start, what = f.tell() + want, f"{rows}x{cols} {dt.name}"
            problem = length_problem(
                length, want, what, lambda: all_zero(path, start, length - want)
            )
            if problem:
                raise ReadError(problem, path)
            if out is None:
                buf = f.read(want)
                got = len(buf)
            else:
                got = f.readinto(memoryview(out).cast("B"))
    except OSError as e:
        raise os_error(e, path) from None
    if got < want:
        raise ReadError(f"truncated: the file ends {want - got} bytes into its pixel data", path)
    px = np.frombuffer(buf, dtype=dt).reshape(rows, cols) if out is None else out
    if dt.kind == "u" and bits_stored < dt.itemsize * 8 and px.max() >> bits_stored:
        return None  # bits above BitsStored are set: let pydicom decide what they mean
    return px


_POOLS: dict[int, ProcessPoolExecutor] = {}


def decode_workers(n_files: int, requested: int | None = None) -> int:
    """Processes for decoding ``n_files`` compressed files: ``requested``, or automatically all
    cores (at most 16, one per 8 files) for 24 files or more. pydicom's decoders hold the GIL, so
    threads would not help; a daemonic process (which cannot have children), or a platform
    without fork, decodes serially."""
    import multiprocessing

    if (
        multiprocessing.current_process().daemon
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return 1
    if requested is not None:
        return max(1, int(requested))
    return 1 if n_files < 24 else max(1, min(os.cpu_count() or 1, 16, n_files // 8))


def _pool(n: int) -> ProcessPoolExecutor:
    """A decode pool of ``n`` processes, kept for the next series. Forked (as PyTorch's DataLoader
    workers are): no re-import of the user's script, which spawn/forkserver would need guarded;
    the children only run pydicom's decoders, never CUDA or DALI."""
    ex = _POOLS.get(n)
    if ex is None:
        import multiprocessing

        from .._procs import die_with_parent

        ex = _POOLS[n] = ProcessPoolExecutor(
            n,
            mp_context=multiprocessing.get_context("fork"),
            initializer=die_with_parent,
            initargs=(os.getpid(),),
        )
        atexit.register(ex.shutdown, wait=False, cancel_futures=True)
    return ex


def read_series(
    series: DicomSeries, workers: int | None = None, device: str = "cpu", nan: str = "error"
) -> Volume:
    """Decode ``series`` (every file once) and return it as a Volume with an exact RAS affine.

    Parameters
    ----------
    series : DicomSeries
        A series found by :func:`~medproc.io.dicom_scan.find_series`.
    workers : int, optional
        Processes decoding compressed files on the CPU (see :func:`decode_workers`; default
        automatic, 1 = in this process). Uncompressed files are read in this process.
    device : {"cpu", "gpu"}
        ``"gpu"`` returns the voxels as a CUDA tensor, decoded on the GPU by the first decoder
        plugin that is available for the series' encoding (see :mod:`medproc.io.decoders`),
        else decoded on the CPU and copied. ``meta["decode"]`` says which decoder ran and
        ``meta["decode_note"]`` why the GPU decoder did not, when it did not.
    nan : {"error", "zero", "keep"}
        Float voxels (float pixel data, or a rescale) that are NaN or inf: as for NIfTI (see
        :func:`medproc.load`).
    """
    from .decoders import read_with_plugins

    return _nan_policy(read_with_plugins(series, device, workers), series, nan)


def _nan_policy(vol: Volume, series: DicomSeries, nan: str) -> Volume:
    """The NaN/inf policy of :func:`~medproc.io.voxel_checks.check_finite` on a read series (numpy,
    or a CUDA tensor checked where it is)."""
    from .voxel_checks import check_finite, nan_error

    arr = vol.array
    if isinstance(arr, np.ndarray):
        out = check_finite(arr, series_source(series.files), nan)
        return vol if out is arr else vol.with_array(out)
    if not arr.is_floating_point() or nan == "keep":
        return vol
    import torch

    bad = int((~torch.isfinite(arr)).sum())
    if bad and nan == "error":
        raise nan_error(bad, series_source(series.files))
    return vol.with_array(torch.nan_to_num(arr, 0.0, 0.0, 0.0)) if bad else vol


def read_series_cpu(series: DicomSeries, workers: int | None = None) -> Volume:
    """The CPU path of :func:`read_series` (pydicom's decoders, native files read directly)."""
    err = series.problem_error()
    if err is not None:
        raise err
    geom = series_geometry(series)
    frames = [series.frames[i] for i in geom.order]
    slot_of: dict[str, list[tuple[int, int | None]]] = {}
    for slot, f in enumerate(frames):
        slot_of.setdefault(f.path, []).append((slot, f.index))
    rows, cols = int(series.info["Rows"]), int(series.info["Columns"])
    spp = int(series.info.get("SamplesPerPixel") or 1)
    stored = None
    bits_stored = int(series.info.get("BitsStored") or series.info.get("BitsAllocated") or 16)
    used_pydicom = False

    def fast_of(slots):
        return frames[slots[0][0]].fast if len(slots) == 1 else None

    todo = [path for path, slots in slot_of.items() if fast_of(slots) is None]
    n_proc = decode_workers(len(todo), workers)
    decoded = (
        iter(_pool(n_proc).map(_decode, todo, chunksize=max(1, len(todo) // (4 * n_proc))))
        if n_proc > 1
        else None
    )
    for path, slots in slot_of.items():
        px = None
        fast = fast_of(slots)
        if fast is not None:
            into = None  # straight into the volume when the slot's type is known already
            if stored is not None and stored.dtype == np.dtype(fast[1]) and spp == 1:
                into = stored[slots[0][0]]
            px = _read_native(path, fast[0], fast[1], rows, cols, bits_stored, into)
            if px is not None and into is not None:
                continue
        elif decoded is not None:
            px = next(decoded)  # in the order of ``todo``
            used_pydicom = True
        if px is None:
            px = _decode(path)
            used_pydicom = True
        expect = (rows, cols) if spp == 1 else (rows, cols, spp)
        if px.ndim == len(expect):  # a single frame (pydicom drops the frame axis)
            px = px[None]
        if px.shape[1:] != expect:
            raise ReadError(f"pixel data has shape {px.shape[1:]}, expected {expect}", path)
        if stored is None:
            stored = np.empty((len(frames),) + expect, dtype=px.dtype)
        elif px.dtype != stored.dtype:
            stored = stored.astype(np.result_type(stored, px))
        for slot, idx in slots:
            stored[slot] = px[0 if idx is None else idx]
    slopes = np.array([f.slope for f in frames], dtype=np.float64)
    intercepts = np.array([f.intercept for f in frames], dtype=np.float64)
    array = rescale(stored, slopes, intercepts, [f.path for f in frames])  # (slice, row, col[, s])
    array = array.transpose(2, 1, 0) if array.ndim == 3 else array.transpose(2, 1, 0, 3)
    decode = "cpu (pydicom)" if used_pydicom else "cpu (native)"
    return Volume(array, geom.affine, series_meta(series, geom, decode))


def series_meta(series: DicomSeries, geom, decode: str) -> dict:
    """A read series' metadata (and its geometry warnings, issued as GeometryWarning)."""
    source = series_source(series.files)
    geo_warnings = frame_notes(series.info) + list(geom.warnings)
    for w in geo_warnings:
        warnings.warn(f"{source}: {w}", GeometryWarning, stacklevel=4)
    for w in series.notes:  # how the series was assembled (copies, folders kept apart)
        warnings.warn(f"{source}: {w}", MedprocWarning, stacklevel=4)
    i = series.info
    return {
        "source": source,
        "format": "dicom",
        "series_uid": series.uid,
        "series_key": series.key,
        "series_number": i.get("SeriesNumber"),
        "series_description": str(i.get("SeriesDescription") or ""),
        "modality": i.get("Modality"),
        "transfer_syntax": str(
            getattr(i.get("TransferSyntaxUID"), "name", i.get("TransferSyntaxUID"))
        ),
        "n_files": len(series.files),
        "decode": decode,
        "warnings": geo_warnings + list(series.notes),
    }


def select_series(found: list[DicomSeries], series, where: str) -> DicomSeries:
    """Pick one series by UID/key, SeriesNumber (int) or description; explain when ambiguous."""
    listing = "\n".join(f"  - {s.describe()}" for s in found)
    if series is None:
        if len(found) == 1:
            return found[0]
        raise SeriesError(
            f"holds {len(found)} series; pick one with series=<UID, SeriesNumber or "
            f"description> (or `medproc inspect` to see them):\n{listing}",
            where,
        )
    for s in found:
        if series in (s.key, s.uid) and (
            series == s.key or sum(t.uid == series for t in found) == 1
        ):
            return s
    cands = []
    if isinstance(series, int) or (isinstance(series, str) and series.isdigit()):
        cands = [s for s in found if str(s.info.get("SeriesNumber")) == str(series)]
    elif isinstance(series, str):
        cands = [
            s for s in found if series.lower() in str(s.info.get("SeriesDescription") or "").lower()
        ]
    if len(cands) == 1:
        return cands[0]
    hint = ""
    if isinstance(series, str):
        close = difflib.get_close_matches(series, [s.key for s in found], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
    what = "matches several" if cands else "matches none of the"
    raise SeriesError(f"series={series!r} {what} series here:{hint}\n{listing}", where)


def load_dicom(
    path, series=None, workers: int | None = None, device: str = "cpu", nan: str = "error"
) -> Volume:
    """Load one DICOM volume from a file or a folder tree (see :func:`medproc.load`)."""
    path = os.fspath(path)
    scan = scan_dicom(path)
    found = scan.series
    if not found:
        if scan.bad:
            p, reason = scan.bad[0]
            n = len(scan.bad_files)
            more = f" ({n} unusable files here)" if n > 1 and len(scan.bad) > 1 else ""
            raise ReadError(reason + more, p)
        if os.path.isfile(path) and scan.skipped:
            raise ReadError(scan.skipped[0][1], path)
        others = _image_files(path)
        if others:  # (a case list row, or load(), given a folder of NIfTI files)
            raise ReadError(
                f"holds no DICOM image, but image files ({', '.join(others)}"
                f"{', ...' if len(others) == 3 else ''}): a folder is read as one DICOM series; "
                "name each image file",
                path,
            )
        listed = "; ".join(f"{os.path.basename(p)}: {r}" for p, r in scan.skipped[:5])
        raise ReadError(
            f"holds no DICOM image ({len(scan.skipped)} file(s) skipped"
            + (f": {listed})" if listed else ")"),
            path,
        )
    return read_series(select_series(found, series, path), workers=workers, device=device, nan=nan)


def _image_files(folder: str, most: int = 3) -> list[str]:
    """The names of the first ``most`` NIfTI/NRRD/MetaImage files under ``folder``."""
    from . import IMAGE_EXT

    found: list[str] = []
    for _, _, names in os.walk(folder):
        found += sorted(n for n in names if n.lower().endswith(IMAGE_EXT))
        if len(found) >= most:
            break
    return found[:most]
