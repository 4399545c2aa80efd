"""Label maps from DICOM annotations: SEG (frames on their own grid, or placed on the grid of
the series they segment) and, in :mod:`.rtstruct`, RTSTRUCT (closed planar contours
rasterised on an image's grid).

A truncated or incomplete file raises :class:`~medproc.errors.ReadError` naming the file and
the item (frame, ROI, contour) and what is missing, never a bare ``ValueError`` or
``AttributeError``. Where annotations overlap, the higher number wins: the higher segment
number (SEG), the higher ROI number (RTSTRUCT), said in a warning naming them and the voxels
(:mod:`._overlap`).
"""

from __future__ import annotations

import contextlib
import os
import struct
import warnings

import numpy as np

from ..errors import GeometryError, MedprocError, MedprocWarning, ReadError
from ..geometry import LPS_TO_RAS
from ..volume import Volume
from ._overlap import overlay

__all__ = ["read_seg", "seg_on_image", "referenced_series", "check_image"]

_FLIP = LPS_TO_RAS.diagonal()[:3]  # LPS <-> RAS on coordinates
_ROIS, _SEGS = "StructureSetROISequence", "SegmentSequence"
_GIVE_IMAGE = "give the series it segments, read_seg(path, image=medproc.load(series_folder))"


def _dcmread(path: str, force: bool = False):
    """The whole dataset of ``path``, its header first checked as the series scan checks it
    (an element running past the end of the file, as in a truncated RTSTRUCT, is a ReadError:
    read as it was, an ROI cut off came back empty, unsaid)."""
    import pydicom

    from ..io.dicom_file import read_header
    from ..io.safety import os_error

    read_header(path, force=force)
    try:
        return pydicom.dcmread(path, force=force)
    except OSError as e:
        raise os_error(e, path) from None
    except Exception as e:  # noqa: BLE001 - pydicom raises many kinds on damaged files
        raise ReadError(f"cannot be read as DICOM: {type(e).__name__}: {e}", path) from None


@contextlib.contextmanager
def _incomplete(path: str, what: str):
    """Turn the errors an incomplete dataset causes into a ReadError naming the file."""
    try:
        yield
    except MedprocError:
        raise
    except (
        AttributeError,
        KeyError,
        IndexError,
        TypeError,
        ValueError,
        OSError,
        struct.error,
    ) as e:
        raise ReadError(
            f"is an incomplete or malformed {what} ({type(e).__name__}: {e}); export it again "
            "or fix the attribute named",
            path,
        ) from None


def _warn(text: str, stacklevel: int = 3) -> None:
    warnings.warn(text, MedprocWarning, stacklevel=stacklevel)


def referenced_series(ds) -> list[str]:
    """The SeriesInstanceUIDs a SEG (ReferencedSeriesSequence) or RTSTRUCT (its
    ReferencedFrameOfReferenceSequence) says it annotates, in that order."""
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    def items(parent, key) -> list:  # (a damaged file's value of another VR: no items)
        seq = parent.get(key) if isinstance(parent, Dataset) else None
        return [i for i in seq if isinstance(i, Dataset)] if isinstance(seq, Sequence) else []

    found = items(ds, "ReferencedSeriesSequence") + [
        se
        for fr in items(ds, "ReferencedFrameOfReferenceSequence")
        for st in items(fr, "RTReferencedStudySequence")
        for se in items(st, "RTReferencedSeriesSequence")
    ]  # (an item without one UID is skipped: it names no series)
    uids = [i.get("SeriesInstanceUID") for i in found]
    return [str(u) for u in uids if isinstance(u, str) and u.strip()]


def check_image(image, who: str, optional: bool = False) -> None:
    """Refuse an ``image`` that is not a :class:`Volume`, naming the argument (a path given
    for it was blamed on the annotation file, as "incomplete or malformed")."""
    from ..errors import UsageError

    if not (isinstance(image, Volume) or optional and image is None):
        raise UsageError(
            f"{who}: image must be a medproc.Volume (the series it annotates, e.g. "
            f"medproc.load(series_folder)), got {type(image).__name__} {image!r:.80}"
        )


def _check_series(ds, image: Volume, path: str, depth: int) -> None:
    """Warn when the DICOM series ``image`` was read from is not among those the annotation
    ``ds`` references: it is placed by patient coordinates all the same. ``depth``: the frames
    between this function and the public reader the user called (1: called by it)."""
    uid = str(image.meta.get("series_uid") or "")
    refs = referenced_series(ds)
    if uid and not uid.startswith("nouid:") and refs and uid not in refs:
        src = image.meta.get("source") or "the image"
        _warn(
            f"{path}: it annotates series {refs[0]}, not the series of {src} ({uid}); placed "
            "by patient coordinates all the same: is it this series' annotation?",
            stacklevel=depth + 3,  # (at the caller of the public reader, ``depth`` frames up)
        )


def _parse_seg(path: str):
    """(dataset, frames, extra info, segment number per frame, pixels, segment names)."""
    from ..io.dicom_records import label_kind_of
    from ..io.dicom_scan import frames_of

    ds = _dcmread(path)
    if label_kind_of(ds) != "SEG":
        what = f"Modality {ds.get('Modality')!r}, SOP Class UID {ds.get('SOPClassUID')!r}"
        if ds.get("Modality") is None and ds.get("SOPClassUID") is None:
            what = "it holds neither a Modality nor a SOP Class UID: truncated?"
        raise ReadError(f"is not a DICOM SEG ({what})", path)
    if "PerFrameFunctionalGroupsSequence" not in ds or "PixelData" not in ds:
        gone = [k for k in ("PerFrameFunctionalGroupsSequence", "PixelData") if k not in ds]
        raise ReadError(
            f"is a DICOM SEG without {' and '.join(gone)}: the file is truncated or incomplete; "
            "export or copy it again",
            path,
        )
    kind = str(ds.get("SegmentationType") or "BINARY").upper()
    if kind != "BINARY":  # (its pixels are probabilities or occupancies: > 0 is no label)
        raise ReadError(
            f"is a {kind} SEG ({ds.get('SegmentationFractionalType') or '?'}, values up to "
            f"{ds.get('MaximumFractionalValue')}): medproc reads BINARY segmentations; "
            "threshold it into a BINARY SEG or a label map first",
            path,
        )
    frames, extra = frames_of(ds, path)
    items = len(ds.PerFrameFunctionalGroupsSequence)
    if items > len(frames):  # (the frames beyond NumberOfFrames were dropped unsaid)
        raise ReadError(
            f"lists {items} per-frame items but NumberOfFrames is {len(frames)}: the header is "
            "damaged",
            path,
        )
    seg_of = []
    for i, item in enumerate(ds.PerFrameFunctionalGroupsSequence[: len(frames)]):
        sis = item.get("SegmentIdentificationSequence")
        n = sis[0].get("ReferencedSegmentNumber") if sis else None
        if n is None or not 1 <= int(n) <= 65535:  # (0 would be background: pixels lost)
            why = f"references segment number {n}: segments are numbered 1 to 65535 (0 is "
            raise ReadError(
                "has no SegmentIdentificationSequence / ReferencedSegmentNumber"
                if n is None
                else f"{why}background)",
                path,
                where=f"frame {i + 1}",
            )
        seg_of.append(int(n))
    if not seg_of:
        raise ReadError("holds no frames", path)
    if any(f.position is None or f.orientation is None for f in frames):
        raise ReadError(
            "frames without PlanePositionSequence / PlaneOrientationSequence: the segments "
            "cannot be placed",
            path,
        )
    _check_frames(frames, path)
    try:
        px = ds.pixel_array
    except Exception as e:  # noqa: BLE001 - decoders raise many kinds on damaged data
        raise ReadError(
            f"its pixel data cannot be decoded ({type(e).__name__}: {e}); truncated?", path
        ) from None
    px = px[None] if px.ndim == 2 else px
    if px.shape[0] < len(seg_of):
        raise ReadError(
            f"{len(seg_of)} frames declared but the pixel data holds {px.shape[0]}", path
        )
    if not any(px[i].any() for i in range(len(seg_of))):
        _warn(f"{path}: its {len(seg_of)} frame(s) hold no segmented pixel: the label is empty")
    names: dict[int, str] = {}
    for n, item in enumerate(ds.get(_SEGS) or []):
        number = int(item.SegmentNumber)
        if number in names:  # (the last name was taken: RTSTRUCT refuses the same)
            raise ReadError(
                f"lists segment number {number} twice ({names[number]!r}, "
                f"{str(item.get('SegmentLabel', ''))!r})",
                path,
                where=f"SegmentSequence item {n + 1}",
            )
        names[number] = str(item.get("SegmentLabel", ""))
    if not names:  # (it became an unnamed class "label_1")
        raise ReadError(
            "its SegmentSequence lists no segment: what its frames segment is unknown", path
        )
    for i, n in enumerate(seg_of):  # (its voxels became an unnamed class "label_7")
        if n not in names:
            raise ReadError(
                f"references segment {n}, which its {_SEGS} does not list (it lists "
                f"{sorted(names)}): the file is damaged; export it again",
                path,
                where=f"frame {i + 1}",
            )
    return ds, frames, extra, seg_of, px, names


def _check_frames(frames, path: str) -> None:
    """Refuse frames no grid can place, on an image's grid as on their own (an all-zero
    orientation put 6 frames of 900 pixels on 6 voxels of the image, unsaid)."""
    from ..io.dicom_geometry import orientation_problem
    from ..io.safety import SPACING_RANGE_MM, spacings_outside

    for i, f in enumerate(frames):
        why = orientation_problem(f.orientation)
        if why is None and f.pixel_spacing is not None and spacings_outside(f.pixel_spacing):
            lo, hi = SPACING_RANGE_MM
            why = f"PixelSpacing {list(f.pixel_spacing)} mm is outside {lo:g} to {hi:g} mm"
        if why:
            raise GeometryError(
                f"{why}: its frames cannot be placed; export it again", path, f"frame {i + 1}"
            )


def read_seg(path, image: Volume | None = None) -> Volume:
    """A DICOM SEG as a label map: voxel value = segment number (0 = none); where segments
    overlap, the higher number.

    Without ``image`` the map is on the SEG's own grid: the union of its frames' positions
    along the normal, which must be evenly spaced and no further apart than its
    SpacingBetweenSlices (else SliceThickness): a SEG that leaves out empty slices has gaps, and
    is refused saying so (give ``image``). With ``image`` (the series the SEG segments, e.g.
    ``medproc.load(folder)``) every frame's pixels are placed on that image's grid (the nearest
    voxel of each pixel centre), gaps or not; frames outside it are left out with a warning (all
    of them outside: an error). An ``image`` read from another DICOM series than the one the
    SEG references is used all the same, with a warning naming both; an ``image`` that is not a
    :class:`Volume` is a :class:`~medproc.errors.UsageError`.
    """
    return _read_seg(os.fspath(path), image, "own" if image is None else "place")


def seg_on_image(path, image: Volume) -> Volume:
    """A SEG's label map for the series it segments (``image``), as a training layout needs:
    placed frame by frame on ``image``'s grid where its frames lie on that grid (pixel centres
    on voxel centres: exact, and right for a SEG that leaves out empty slices); otherwise on its
    own grid, which must neither leave out slices nor have frames further apart than the
    image's slices (a :class:`GeometryError` saying so, never a label smeared across the gap).
    ``image`` is checked as in :func:`read_seg`.
    """
    return _read_seg(os.fspath(path), image, "auto")


def _read_seg(path: str, image: Volume | None, how: str) -> Volume:
    check_image(image, "read_seg" if how == "place" else "seg_on_image", how == "own")
    with _incomplete(path, "DICOM SEG"):
        ds, frames, extra, seg_of, px, names = _parse_seg(path)
        if image is not None:
            _check_series(ds, image, path, depth=2)
        if how == "place" or how == "auto" and _on_grid(frames, px.shape[1:], image):
            lab = _frames_on_image(frames, seg_of, px, image, names, path)
            return image.with_array(lab, source=path, format="dicom-seg", segments=names)
        hint = _GIVE_IMAGE if image is None else "export it on the grid of the series it segments"
        own = _own_grid(ds, frames, extra, seg_of, px, names, path, hint)
    if how == "auto" and own.shape[2] > 1:  # (frames off the image's slices, no gaps)
        a = np.asarray(image.affine)[:3, :3]  # the image's spacing along the SEG's normal:
        along = np.abs(own.affine[:3, 2] / own.spacing[2] @ a)
        step = along[np.argmax(along / np.linalg.norm(a, axis=0))]
        if own.spacing[2] > 1.5 * step:
            raise GeometryError(
                f"its frames lie {own.spacing[2]:g} mm apart, not on the slices of the series it "
                f"segments ({step:g} mm apart): it may leave out slices, and its frames cannot "
                "be placed on that series' grid; export it on the series' grid",
                path,
            )
    return own


def _on_grid(frames, rows_cols, image: Volume, tol: float = 0.05) -> bool:
    """Whether every frame's pixel centres are voxel centres of ``image`` (pixel steps of one
    voxel along two of its axes; the drift over a frame under ``tol`` voxel)."""
    inv = np.linalg.inv(np.asarray(image.affine, dtype=np.float64))
    n = max(rows_cols)
    for f in frames:
        if f.pixel_spacing is None:
            return False
        o = inv[:3, :3] @ (f.position * _FLIP) + inv[:3, 3]
        dc = inv[:3, :3] @ (f.orientation[:3] * f.pixel_spacing[1] * _FLIP)
        dr = inv[:3, :3] @ (f.orientation[3:] * f.pixel_spacing[0] * _FLIP)
        steps = np.rint([dc, dr])
        if not (
            np.allclose(o, np.rint(o), atol=tol)
            and np.allclose([dc, dr], steps, atol=tol / n)
            and np.array_equal(np.abs(steps).sum(1), [1, 1])
            and np.abs(steps).sum(0).max() == 1
        ):
            return False
    return True


def _own_grid(ds, frames, extra, seg_of, px, names, path: str, hint=_GIVE_IMAGE) -> Volume:
    """The SEG on its own grid: one slice per distinct frame position along the normal."""
    from ..io.dicom_geometry import series_geometry
    from ..io.dicom_scan import DicomSeries

    normal = np.cross(frames[0].orientation[:3], frames[0].orientation[3:])
    d = np.array([f.position @ normal for f in frames])
    uniq, first = np.unique(np.round(d, 3), return_index=True)
    gap = np.diff(uniq).max() if len(uniq) > 1 else 0.0
    key = "SpacingBetweenSlices" if extra.get("SpacingBetweenSlices") else "SliceThickness"
    if extra.get(key) and gap > 1.5 * float(extra[key]):  # (no SpacingBetweenSlices: thickness)
        raise GeometryError(
            f"its frames lie up to {gap:g} mm apart where it declares {key} "
            f"{float(extra[key]):g} mm: it leaves out slices, and has no grid of its own: "
            f"{hint}",
            path,
        )
    info = {"Rows": ds.Rows, "Columns": ds.Columns, **extra}
    try:
        geom = series_geometry(
            DicomSeries(str(ds.get("SeriesInstanceUID", path)), [frames[i] for i in first], info)
        )
    except GeometryError as e:
        raise GeometryError(
            f"{e.message}. A SEG that leaves out empty slices has no grid of its own: {hint}",
            path,
        ) from None
    slot_of_pos = {
        float(u): k for k, u in enumerate(np.round(d[[first[i] for i in geom.order]], 3))
    }
    masks: dict[int, dict[int, np.ndarray]] = {}  # segment -> slice k -> (i, j) mask
    for i, seg in enumerate(seg_of):
        k = slot_of_pos[float(np.round(d[i], 3))]
        m = masks.setdefault(seg, {}).setdefault(k, np.zeros((ds.Columns, ds.Rows), bool))
        m |= px[i].T > 0  # (rows = j, columns = i)
    lab = np.zeros((int(ds.Columns), int(ds.Rows), len(uniq)), np.uint16)
    overlay(lab, masks, {s: s for s in masks}, names, path, what="segment")
    return Volume(
        lab.astype(np.uint8 if max(seg_of) < 256 else np.uint16),
        geom.affine,
        {"source": path, "format": "dicom-seg", "segments": names, "warnings": geom.warnings},
    )


def _frames_on_image(frames, seg_of, px, image: Volume, names, path: str) -> np.ndarray:
    """Each SEG frame's pixels placed on ``image``'s grid (the nearest voxel of each pixel
    centre; overlaps keep the higher segment number, said); frames outside it are said."""
    inv = np.linalg.inv(np.asarray(image.affine, dtype=np.float64))
    masks: dict[int, dict[int, np.ndarray]] = {}  # segment -> slice k -> (i, j) mask
    held = lost = 0  # frames holding pixels; of them, those wholly outside the image
    off = 0.0  # how far (voxels) the furthest pixel centre lies from a voxel centre
    for f, seg, frame in zip(frames, seg_of, px):
        r, c = np.nonzero(frame)
        if f.pixel_spacing is None:
            raise ReadError("has no PixelSpacing for its frames: they cannot be placed", path)
        (rows, cols), o = f.pixel_spacing, f.orientation
        lps = f.position + np.outer(c * cols, o[:3]) + np.outer(r * rows, o[3:])
        exact = (lps * _FLIP) @ inv[:3, :3].T + inv[:3, 3]
        ijk = np.rint(exact).astype(np.int64)
        off = max(off, float(np.abs(exact - ijk).max())) if len(exact) else off
        ok = np.all((ijk >= 0) & (ijk < image.shape[:3]), axis=1)
        held += len(r) > 0
        lost += len(r) > 0 and not ok.any()
        i, j, k = ijk[ok].T
        for kk in np.unique(k):
            m = masks.setdefault(seg, {}).setdefault(int(kk), np.zeros(image.shape[:2], bool))
            m[i[k == kk], j[k == kk]] = True
    out = np.zeros(image.shape[:3], np.uint16)
    overlay(out, masks, {s: s for s in masks}, names, path, what="segment")
    src = image.meta.get("source") or "this image"
    if held and lost == held:
        why = f"all {held} of its frames that hold segment pixels lie outside the image"
        raise ReadError(f"{why}: is it the segmentation of another series than {src}?", path)
    if lost:
        _warn(f"{path}: {lost} of {held} frames lie outside {src}: left out")
    if off > 0.25:  # (half a slice off: frames 10 and 11 landed on 10 and 12)
        _warn(
            f"{path}: its pixels lie up to {off:.2f} voxel off the voxel centres of {src}: each "
            "placed on the nearest voxel (a SEG exported on another grid?), so slices may be "
            "skipped or doubled"
        )
    return out.astype(np.uint8 if out.max() < 256 else np.uint16)
