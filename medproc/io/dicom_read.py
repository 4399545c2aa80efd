"""Read the pixels of a DICOM series into a :class:`~medproc.Volume`."""

from __future__ import annotations

import difflib
import os
import warnings

import numpy as np
import pydicom
from pydicom.errors import InvalidDicomError

from ..errors import GeometryWarning, ReadError, SeriesError
from ..volume import Volume
from .dicom_geometry import series_geometry
from .dicom_scan import DicomSeries, find_series

__all__ = ["load_dicom", "read_series", "select_series"]

_DECODER_HINT = (
    "pydicom needs a decoder plugin for this transfer syntax: "
    "pip install pylibjpeg pylibjpeg-libjpeg pylibjpeg-openjpeg pylibjpeg-rle"
)


def _decode(path: str) -> np.ndarray:
    try:
        ds = pydicom.dcmread(path)
    except InvalidDicomError as e:
        raise ReadError(f"not a DICOM file ({e})", path) from None
    except Exception as e:  # pydicom raises many kinds on damaged files
        raise ReadError(f"cannot be parsed: {type(e).__name__}: {e}", path) from None
    if not any(k in ds for k in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        raise ReadError("has no pixel data (PixelData is missing)", path)
    ts = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    try:
        return ds.pixel_array
    except (NotImplementedError, RuntimeError) as e:
        raise ReadError(
            f"pixel data in {getattr(ts, 'name', ts)} cannot be decoded: {e}. {_DECODER_HINT}", path
        ) from None
    except Exception as e:
        raise ReadError(
            f"pixel data cannot be decoded ({getattr(ts, 'name', ts)}): {type(e).__name__}: {e} "
            "(truncated or damaged file?)",
            path,
        ) from None


def _rescaled(stored: np.ndarray, slopes: np.ndarray, intercepts: np.ndarray) -> np.ndarray:
    """Apply RescaleSlope/Intercept per slice; integer output when the result is integral."""
    if np.all(slopes == 1) and np.all(intercepts == 0):
        return stored
    shape = (-1,) + (1,) * (stored.ndim - 1)
    if stored.dtype.kind in "iu" and np.all(slopes == slopes[0]) and float(slopes[0]).is_integer() \
            and np.all(np.mod(intercepts, 1) == 0):
        lo = int(stored.min()) * int(slopes[0]) + int(intercepts.min())
        hi = int(stored.max()) * int(slopes[0]) + int(intercepts.max())
        for dt in (np.int16, np.int32, np.int64):
            info = np.iinfo(dt)
            if info.min <= min(lo, hi) and max(lo, hi) <= info.max:
                out = stored.astype(dt)
                if slopes[0] != 1:
                    out *= dt(slopes[0])
                out += intercepts.astype(dt).reshape(shape)
                return out
    out = stored.astype(np.float32)
    out *= slopes.astype(np.float32).reshape(shape)
    out += intercepts.astype(np.float32).reshape(shape)
    return out


def read_series(series: DicomSeries) -> Volume:
    """Decode ``series`` (every file once) and return it as a Volume with an exact RAS affine."""
    geom = series_geometry(series)
    frames = [series.frames[i] for i in geom.order]
    slot_of: dict[str, list[tuple[int, int | None]]] = {}
    for slot, f in enumerate(frames):
        slot_of.setdefault(f.path, []).append((slot, f.index))
    rows, cols = int(series.info["Rows"]), int(series.info["Columns"])
    spp = int(series.info.get("SamplesPerPixel") or 1)
    stored = None
    for path, slots in slot_of.items():
        px = _decode(path)
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
    array = _rescaled(stored, slopes, intercepts)
    source = series.files[0] if len(series.files) == 1 else os.path.commonpath(series.files)
    for w in geom.warnings:
        warnings.warn(f"{source}: {w}", GeometryWarning, stacklevel=3)
    i = series.info
    meta = {
        "source": source,
        "format": "dicom",
        "series_uid": series.uid,
        "series_key": series.key,
        "series_number": i.get("SeriesNumber"),
        "series_description": str(i.get("SeriesDescription") or ""),
        "modality": i.get("Modality"),
        "transfer_syntax": str(getattr(i.get("TransferSyntaxUID"), "name", i.get("TransferSyntaxUID"))),
        "n_files": len(series.files),
        "decode": "cpu (pydicom)",
        "warnings": list(geom.warnings),
    }
    return Volume(array, geom.affine, meta)


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
        if series in (s.key, s.uid) and (series == s.key or sum(t.uid == series for t in found) == 1):
            return s
    cands = []
    if isinstance(series, int) or (isinstance(series, str) and series.isdigit()):
        cands = [s for s in found if str(s.info.get("SeriesNumber")) == str(series)]
    elif isinstance(series, str):
        cands = [s for s in found if series.lower() in str(s.info.get("SeriesDescription") or "").lower()]
    if len(cands) == 1:
        return cands[0]
    hint = ""
    if isinstance(series, str):
        close = difflib.get_close_matches(series, [s.key for s in found], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
    what = "matches several" if cands else "matches none of the"
    raise SeriesError(f"series={series!r} {what} series here:{hint}\n{listing}", where)


def load_dicom(path, series=None) -> Volume:
    """Load one DICOM volume from a file or a folder tree (see :func:`medproc.load`)."""
    path = os.fspath(path)
    found, skipped = find_series(path)
    if not found:
        reasons = "; ".join(f"{os.path.basename(p)}: {r}" for p, r in skipped[:5])
        raise ReadError(f"no DICOM image found ({len(skipped)} file(s) skipped: {reasons})", path)
    return read_series(select_series(found, series, path))
