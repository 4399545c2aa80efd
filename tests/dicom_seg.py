"""A minimal multi-frame DICOM SEG writer for tests (8-bit frames, explicit VR little endian)."""

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset

_LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


def write_seg(path, affine, shape, frames, names, *, ref, thickness="auto", n_frames=None):
    """A SEG on the grid ``affine`` (RAS, (i, j, k) -> mm) of ``shape``, referencing series
    ``ref``: ``frames`` = [(slice k (may be fractional), segment number, mask (i, j))], ``names``
    {segment number: label}. ``thickness``: SliceThickness ("auto": the grid's slice spacing;
    None: left out); ``n_frames``: NumberOfFrames if not the frames' count (a damaged SEG)."""
    lps = _LPS @ np.asarray(affine, dtype=np.float64)
    sp = np.sqrt((lps[:3, :3] ** 2).sum(0))
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.66.4"
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = pydicom.uid.generate_uid()
    ds.Modality, ds.SeriesInstanceUID = "SEG", pydicom.uid.generate_uid()
    r = Dataset()
    r.SeriesInstanceUID = ref
    ds.ReferencedSeriesSequence = [r]
    ds.Rows, ds.Columns = shape[1], shape[0]
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    shared, orient, meas = Dataset(), Dataset(), Dataset()
    orient.ImageOrientationPatient = [*(lps[:3, 0] / sp[0]), *(lps[:3, 1] / sp[1])]
    meas.PixelSpacing = [sp[1], sp[0]]
    if thickness is not None:
        meas.SliceThickness = sp[2] if thickness == "auto" else thickness
    shared.PlaneOrientationSequence, shared.PixelMeasuresSequence = [orient], [meas]
    ds.SharedFunctionalGroupsSequence = [shared]
    ds.SegmentSequence = []
    for n, name in names.items():
        s = Dataset()
        s.SegmentNumber, s.SegmentLabel = n, name
        ds.SegmentSequence.append(s)
    per, px = [], []
    for k, n, m in frames:
        f, pos, sid = Dataset(), Dataset(), Dataset()
        pos.ImagePositionPatient = [float(v) for v in lps[:3, 3] + k * lps[:3, 2]]
        sid.ReferencedSegmentNumber = n
        f.PlanePositionSequence, f.SegmentIdentificationSequence = [pos], [sid]
        per.append(f)
        px.append(np.asarray(m).T.astype(np.uint8))  # rows = j, columns = i
    ds.PerFrameFunctionalGroupsSequence = per
    ds.NumberOfFrames = len(px) if n_frames is None else n_frames
    ds.PixelData = np.stack(px).tobytes() if px else b""
    ds.save_as(path, enforce_file_format=True)
    return str(path)
