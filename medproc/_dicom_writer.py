"""Write a Volume as a synthetic CT DICOM series (for the sample data, tests and benchmarks)."""

from __future__ import annotations

import datetime
import os

import numpy as np

from .geometry import LPS_TO_RAS
from .volume import Volume

__all__ = ["write_dicom_series"]

_UID_ROOT = "1.2.826.0.1.3680043.8.498."  # pydicom's root for generated UIDs


def _uid(rng) -> str:
    return _UID_ROOT + ".".join(str(int(x)) for x in rng.integers(1, 10**9, 3))


def write_dicom_series(
    folder: str,
    volume: Volume,
    series_uid: str,
    *,
    study_uid: str | None = None,
    series_number: int = 1,
    description: str = "synthetic CT",
    patient_id: str = "SYNTH0001",
    shuffle_names: bool = True,
    gantry_tilt: float | None = None,
    transfer_syntax: str | None = None,
    seed: int = 0,
    signed: bool = False,
) -> list[str]:
    """Write ``volume`` (int16 HU, voxels (i, j, k) = (column, row, slice)) as a CT DICOM series.

    Stored values are unsigned (HU + 1024, RescaleIntercept -1024) as many scanners write them;
    ``signed`` stores signed 16-bit HU instead (PixelRepresentation 1, intercept 0).
    File names are shuffled relative to slice order and InstanceNumber runs backwards, so a
    reader that sorts by name or instance number gets it wrong. ``transfer_syntax`` compresses
    with pydicom's encoders (e.g. ``pydicom.uid.JPEG2000Lossless``).
    """
    import pydicom
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    lps = LPS_TO_RAS @ volume.affine
    sp = np.sqrt((lps[:3, :3] ** 2).sum(0))
    row_cos = lps[:3, 0] / sp[0]
    col_cos = lps[:3, 1] / sp[1]
    normal = np.cross(row_cos, col_cos)
    thick = float(lps[:3, 2] @ normal)
    study_uid = study_uid or _uid(rng)
    frame_uid = _uid(rng)
    n = volume.shape[2]
    names = [f"IM{i:05d}.dcm" for i in (rng.permutation(n) if shuffle_names else range(n))]
    today = datetime.date(2026, 1, 1).strftime("%Y%m%d")
    paths = []
    for k in range(n):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CTImageStorage
        meta.MediaStorageSOPInstanceUID = f"{series_uid}.{k + 1}"
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID = CTImageStorage
        ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
        ds.StudyInstanceUID = study_uid
        ds.SeriesInstanceUID = series_uid
        ds.FrameOfReferenceUID = frame_uid
        ds.PatientID = patient_id
        ds.PatientName = "Synthetic^Phantom"
        ds.StudyDate = ds.SeriesDate = today
        ds.Modality = "CT"
        ds.SeriesNumber = series_number
        ds.SeriesDescription = description
        ds.InstanceNumber = n - k
        ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL"]
        ds.ImagePositionPatient = [f"{v:.6f}" for v in lps[:3, 3] + k * lps[:3, 2]]
        ds.ImageOrientationPatient = [f"{v:.8f}" for v in (*row_cos, *col_cos)]
        ds.PixelSpacing = [f"{sp[1]:.6f}", f"{sp[0]:.6f}"]  # row spacing (along j), column (i)
        ds.SliceThickness = f"{thick:.6f}"
        if gantry_tilt is not None:
            ds.GantryDetectorTilt = f"{gantry_tilt:.4f}"
        ds.Rows, ds.Columns = volume.shape[1], volume.shape[0]
        ds.SamplesPerPixel = 1
        ds.PhotometricInterpretation = "MONOCHROME2"
        if signed:
            ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 16, 15
            ds.PixelRepresentation = 1
            ds.RescaleIntercept = "0"
        else:
            ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 12, 11
            ds.PixelRepresentation = 0
            ds.RescaleIntercept = "-1024"
        ds.RescaleSlope, ds.RescaleType = "1", "HU"
        ds.WindowCenter, ds.WindowWidth = "40", "400"
        px = np.ascontiguousarray(volume.array[:, :, k].T)  # (rows, columns)
        if signed:
            stored = px.astype(np.int16)
        else:
            stored = (px.astype(np.int32) + 1024).clip(0, 4095).astype(np.uint16)
        ds.PixelData = stored.tobytes()
        if transfer_syntax is not None:
            _compress(ds, stored, transfer_syntax)
        path = os.path.join(folder, names[k])
        pydicom.dcmwrite(path, ds, enforce_file_format=True)
        paths.append(path)
    return paths


#: encoders pydicom lacks, from imagecodecs (a test dependency): JPEG lossless SV1, HTJ2K lossless
_IMAGECODECS = {"1.2.840.10008.1.2.4.70": "ljpeg", "1.2.840.10008.1.2.4.201": "htj2k"}


def _compress(ds, stored: np.ndarray, transfer_syntax) -> None:
    """Compress one frame: pydicom's encoders (RLE, JPEG 2000), or imagecodecs for the syntaxes
    pydicom cannot encode (JPEG lossless process 14 SV1, HTJ2K lossless)."""
    ts = str(transfer_syntax)
    if ts not in _IMAGECODECS:
        ds.compress(transfer_syntax, stored)
        return
    import imagecodecs
    from pydicom.encaps import encapsulate
    from pydicom.uid import UID

    if _IMAGECODECS[ts] == "ljpeg":
        # libjpeg-turbo's lossless mode with predictor 1 (this syntax's SV1; imagecodecs'
        # ljpeg_encode uses predictor 6). Signed values go in as their stored bit pattern.
        bits = int(ds.BitsStored)
        pattern = (stored.astype(np.int32) & ((1 << bits) - 1)).astype(np.uint16)
        frame = imagecodecs.jpeg8_encode(pattern, lossless=True, predictor=1, bitspersample=bits)
    else:
        frame = imagecodecs.htj2k_encode(stored, level=0)  # level 0: reversible (lossless)
    ds.PixelData = encapsulate([frame])
    ds["PixelData"].VR = "OB"
    ds.file_meta.TransferSyntaxUID = UID(ts)
