"""DICOM pixel decoders as plugins, modelled on pydicom's: each says whether it can decode a
series' encoding here and, when it cannot, why (with what to install).

``read_series(series, device="gpu")`` tries the GPU plugins in order and falls back to the CPU
path (pydicom's decoders, then a copy to the GPU); ``Volume.meta["decode"]`` records which
decoder ran and ``meta["decode_note"]`` why the GPU plugins did not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..volume import Volume
from .dicom_scan import DicomSeries

__all__ = ["DecoderPlugin", "GPU_PLUGINS", "gpu_decoder_status", "read_with_plugins"]


@dataclass(frozen=True)
class DecoderPlugin:
    """A decoder backend.

    Attributes
    ----------
    name : str
        Shown in ``meta["decode"]`` and in messages.
    unavailable : callable
        ``unavailable(info) -> str | None``: None when it can decode a series whose header
        summary is ``info`` here, else the reason (naming the install command when a package
        is missing).
    read : callable
        ``read(series) -> Volume`` with the voxels where the plugin decodes them.
    """

    name: str
    unavailable: Callable[[dict], str | None]
    read: Callable[[DicomSeries], Volume]

    def is_available(self, info: dict) -> bool:
        """Whether this plugin can decode an encoding described by ``info`` here."""
        return self.unavailable(info) is None


def _dali_gpu_unavailable(info: dict) -> str | None:
    try:
        from ..pipeline import dali_available, gpu_available
        from ..pipeline.decode import NATIVE, gpu_config, support_key
    except ImportError as e:  # pragma: no cover - the pipeline package is part of medproc
        return str(e)
    if not dali_available():
        return "NVIDIA DALI is not installed (pip install nvidia-dali-cuda120)"
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (pip install torch)"
    if not gpu_available() or not torch.cuda.is_available():
        return "no CUDA GPU here"
    if str(info.get("TransferSyntaxUID") or "") in NATIVE:
        return "uncompressed: read on the CPU and copied"
    if int(info.get("SamplesPerPixel") or 1) != 1:
        return "colour images are decoded on the CPU"
    if gpu_config(info) is None:
        return (
            f"encoding {support_key(info)} is not proven bit-exact on the GPU "
            "(medproc/pipeline/gpu_decode_support.json)"
        )
    return None


def _dali_gpu_read(series: DicomSeries) -> Volume:
    from .dicom_gpu import read_series_gpu

    return read_series_gpu(series)


#: GPU decoders, in order of preference
GPU_PLUGINS = [DecoderPlugin("gpu (nvImageCodec)", _dali_gpu_unavailable, _dali_gpu_read)]


def gpu_decoder_status(info: dict) -> list[tuple[str, str | None]]:
    """``(plugin name, reason it cannot decode this encoding here or None)`` for each GPU
    plugin."""
    return [(p.name, p.unavailable(info)) for p in GPU_PLUGINS]


def read_with_plugins(
    series: DicomSeries, device: str = "cpu", workers: int | None = None
) -> Volume:
    """Decode ``series`` on ``device`` ("cpu" or "gpu"): see the module doc."""
    from ..errors import check_device
    from .dicom_read import read_series_cpu

    device = check_device(device)
    err = series.problem_error()  # a file of the series cannot be used: never read without it
    if err is not None:
        raise err
    if device == "cpu":
        return read_series_cpu(series, workers)
    notes = []
    for plugin in GPU_PLUGINS:
        reason = plugin.unavailable(series.info)
        if reason is None:
            return plugin.read(series)
        notes.append(f"{plugin.name}: {reason}")
    vol = read_series_cpu(series, workers).to("gpu")
    vol.meta["decode_note"] = "; ".join(notes)
    return vol
