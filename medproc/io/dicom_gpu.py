"""The GPU decoder plugin's reader: compressed DICOM frames decoded on the GPU (DALI,
nvImageCodec), corrected and rescaled there, stacked into a ``Volume`` whose voxels are a CUDA
tensor. Only encodings proven bit-exact (``pipeline/gpu_decode_support.json``) come here."""

from __future__ import annotations

import numpy as np

from ..volume import Volume
from .dicom_geometry import series_geometry
from .dicom_read import series_meta
from .dicom_rescale import rescale
from .dicom_scan import DicomSeries

__all__ = ["read_series_gpu"]


def read_series_gpu(series: DicomSeries, device_id: int = 0) -> Volume:
    """Decode ``series`` on GPU ``device_id``; the result's ``.array`` is a CUDA tensor indexed
    ``(i, j, k)``, rescaled by the CPU reader's rule (integer when integral, else float32)."""
    import pydicom
    import torch
    from pydicom.encaps import generate_frames

    from ..pipeline.decode import decode_frames_gpu, gpu_config, support_key

    config = gpu_config(series.info)
    if config is None:
        raise ValueError(
            f"{support_key(series.info)} is not proven for GPU decoding; use the CPU reader"
        )
    geom = series_geometry(series)
    frames = [series.frames[i] for i in geom.order]
    encoded: dict = {}
    for path in {f.path for f in frames}:
        ds = pydicom.dcmread(path)
        nf = int(ds.get("NumberOfFrames") or 1)
        encoded[path] = list(generate_frames(ds.PixelData, number_of_frames=nf))
    data = [encoded[f.path][f.index or 0] for f in frames]
    bits = int(series.info.get("BitsStored") or 16)
    signed = bool(int(series.info.get("PixelRepresentation") or 0))
    stack = torch.stack(decode_frames_gpu(data, config, bits, signed, device_id=device_id))
    slopes = np.array([f.slope for f in frames], dtype=np.float64)
    inter = np.array([f.intercept for f in frames], dtype=np.float64)
    out = rescale(stack, slopes, inter, [f.path for f in frames])  # (slice, row, column)
    return Volume(
        out.permute(2, 1, 0), geom.affine, series_meta(series, geom, "gpu (nvImageCodec)")
    )
