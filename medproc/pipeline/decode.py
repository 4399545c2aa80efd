"""GPU decoding of compressed DICOM frames in DALI (nvImageCodec), behind a proven support table.

pydicom hands over each frame's encapsulated bytes without decoding them
(``pydicom.encaps.generate_frames``); DALI's ``fn.decoders.image(device="mixed")`` decodes them
on the GPU; a per-syntax *correction* (reinterpretation of the decoded bits) is applied on the
GPU; the frames are stacked in slice order and rescaled there, ready for the resampler, with no
host round trip.

Only what was proven runs on the GPU. ``gpu_decode_support.json`` (beside this file) is written
by ``scripts/probe_gpu_decode.py`` on a GPU machine: it decodes every compressed file of pydicom
and pydicom-data and synthetic CT series with every decoder configuration, compares with
pydicom's CPU decoders, and keeps, per (transfer syntax, bits allocated, bits stored, signedness,
samples, photometric interpretation), the configuration that was bit-exact on every file of that
kind. Everything else falls back to pydicom on the CPU, automatically.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np

__all__ = [
    "encoding_info",
    "support_key",
    "support_table",
    "gpu_config",
    "decode_path",
    "decode_frames_gpu",
    "config_applies",
    "stream_header",
    "j2k_unsigned",
    "sof_first",
    "CONFIGS",
]

_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_decode_support.json")

#: decoder configurations the probe tries: DALI output dtype, then a correction of the bits
CONFIGS = [
    {"dtype": None, "fix": "none"},
    {"dtype": "uint16", "fix": "none"},
    {"dtype": "uint16", "fix": "as_signed"},
    {"dtype": "uint16", "fix": "sign_extend"},
    {"dtype": "uint16", "fix": "unscale"},
    {"dtype": "uint16", "fix": "unscale_signed"},
    {"dtype": "int16", "fix": "none"},
    {"dtype": "uint8", "fix": "none"},
    {"dtype": None, "fix": "as_signed"},
]

#: the same configurations on a JPEG stream whose frame header (SOFn) is moved before its tables:
#: nvJPEG 12.4 refuses anything but APP0/APP1 before SOF3 (a valid DHT there included)
CONFIGS += [{**c, "stream": "sof_first"} for c in CONFIGS[:4] + CONFIGS[6:7]]
#: nvImageCodec scales a uint16 output up from the stream's sample precision p (JPEG 2000 SIZ,
#: JPEG SOFn), so BitsStored is the wrong shift when the encoder wrote p != BitsStored; the
#: "precision" fix reads p from each frame's header. JPEG 2000 signed samples are clamped to the
#: unsigned range (lossy): declaring the components unsigned in the SIZ marker makes the decoder
#: add 2^(p-1) instead (the inverse DC shift of unsigned data), which the fix subtracts again.
CONFIGS += [
    {"dtype": "uint16", "fix": "precision"},
    {"dtype": "uint16", "fix": "precision", "stream": "j2k_unsigned"},
]
JPEG_FAMILY = {
    "1.2.840.10008.1.2.4.50",
    "1.2.840.10008.1.2.4.51",
    "1.2.840.10008.1.2.4.57",
    "1.2.840.10008.1.2.4.70",
}
J2K_FAMILY = {
    "1.2.840.10008.1.2.4.90",
    "1.2.840.10008.1.2.4.91",
    "1.2.840.10008.1.2.4.201",
    "1.2.840.10008.1.2.4.202",
    "1.2.840.10008.1.2.4.203",
}
_FAMILY = {
    "sof_first": JPEG_FAMILY,
    "j2k_unsigned": J2K_FAMILY,
    "precision": JPEG_FAMILY | J2K_FAMILY,
}


def config_applies(config: dict, transfer_syntax: str) -> bool:
    """Whether a configuration can apply to a transfer syntax (stream rewrites are per family)."""
    return all(
        str(transfer_syntax) in _FAMILY[k]
        for k in (config.get("stream"), config.get("fix"))
        if k in _FAMILY
    )


NATIVE = {
    "1.2.840.10008.1.2",
    "1.2.840.10008.1.2.1",
    "1.2.840.10008.1.2.2",
    "1.2.840.10008.1.2.1.99",
}


ENCODING_KEYS = (
    "BitsAllocated",
    "BitsStored",
    "PixelRepresentation",
    "SamplesPerPixel",
    "PhotometricInterpretation",
)


def encoding_info(ds) -> dict:
    """The attributes of a pydicom dataset that :func:`support_key` reads."""
    info = {k: ds.get(k) for k in ENCODING_KEYS}
    info["TransferSyntaxUID"] = str(
        getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", "")
    )
    return info


def support_key(info: dict) -> str:
    """The table key of a series' pixel encoding."""
    ts = str(info.get("TransferSyntaxUID") or "")
    return "|".join(
        str(x)
        for x in (
            ts,
            int(info.get("BitsAllocated") or 0),
            int(info.get("BitsStored") or info.get("BitsAllocated") or 0),
            int(info.get("PixelRepresentation") or 0),
            int(info.get("SamplesPerPixel") or 1),
            str(info.get("PhotometricInterpretation") or ""),
        )
    )


@functools.lru_cache(maxsize=1)
def support_table() -> dict:
    if not os.path.exists(_TABLE):
        return {"entries": {}}
    with open(_TABLE) as f:
        return json.load(f)


def gpu_config(info: dict) -> dict | None:
    """The proven decoder configuration for this encoding, or None (CPU)."""
    entry = support_table().get("entries", {}).get(support_key(info))
    return entry["config"] if entry else None


def decode_path(info: dict) -> str:
    """What decodes a series with this encoding: shown by `medproc inspect` and the manifest."""
    ts = str(info.get("TransferSyntaxUID") or "")
    if ts in NATIVE:
        return "cpu (native)"
    if gpu_config(info) is not None and int(info.get("SamplesPerPixel") or 1) == 1:
        return "gpu (nvImageCodec) when device=gpu"  # the route convert --device gpu takes
    return "cpu (pydicom)"


def _pipe(dtype: str | None, batch_size: int, device_id: int, num_threads: int):
    from .cache import cached_pipeline

    key = ("decode", dtype, batch_size, device_id, num_threads)
    return cached_pipeline(key, lambda: _build(dtype, batch_size, device_id, num_threads), "gpu")


def _drop_pipe(dtype, batch_size, device_id, num_threads):
    from .cache import drop_cached

    drop_cached(("decode", dtype, batch_size, device_id, num_threads))


def _build(dtype: str | None, batch_size: int, device_id: int, num_threads: int):
    from nvidia.dali import fn, pipeline_def, types

    kw = {}
    if dtype is not None:
        kw["dtype"] = {"uint8": types.UINT8, "uint16": types.UINT16, "int16": types.INT16}[dtype]

    @pipeline_def(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        exec_dynamic=True,
        prefetch_queue_depth=1,
    )
    def graph():
        enc = fn.external_source(name="enc", device="cpu", dtype=types.UINT8)
        img = fn.decoders.image(enc, device="mixed", output_type=types.ANY_DATA, **kw)
        if dtype == "uint16":
            # torch (and DALI's torch bridge) has no uint16: widen exactly on the GPU
            img = fn.cast(img, dtype=types.INT32)
        return img

    p = graph()
    p.build()
    return p


def _fix(t, fix: str, bits_stored: int, signed: bool, siz: tuple | None = None):
    """Reinterpret decoded values (uint16 decodes arrive widened to int32, exactly). ``siz``:
    the frame's :func:`stream_header` (offset, precision, signed), for the "precision" fix."""
    import torch

    if fix == "none":
        return t
    wide = t.to(torch.int32)
    if fix in ("as_signed", "unscale_signed"):
        if t.dtype == torch.int32:  # uint16 bits held in int32
            wide = torch.where(wide >= 32768, wide - 65536, wide)
        if fix == "unscale_signed":
            wide = wide >> (16 - bits_stored)
        return wide.to(torch.int16)
    if fix == "sign_extend":
        shift = 32 - bits_stored
        return ((wide << shift) >> shift).to(torch.int16)
    if fix == "unscale":
        return wide >> (16 - bits_stored)
    if (
        fix == "precision"
    ):  # uint16 output of a stream with precision p (J2K: declared unsigned or not)
        if siz is None:
            raise ValueError("no JPEG 2000 SIZ or JPEG SOF header in the frame")
        _, p, cs_signed = siz
        v = wide >> (16 - p)  # nvImageCodec scaled p bits up to 16
        if cs_signed:  # decoded as unsigned after j2k_unsigned: x + 2^(p-1)
            v = v - (1 << (p - 1))
        elif signed:  # DICOM signed, codestream unsigned: the stored bit pattern (pydicom's rule)
            v = (v << (32 - bits_stored)) >> (32 - bits_stored)
        return v.to(torch.int16) if signed or bits_stored <= 15 else v
    raise ValueError(f"unknown correction {fix!r}")


def sof_first(frame: bytes) -> bytes:
    """The same JPEG stream with its SOFn segment moved right after SOI (before DHT/DQT/APPn...).

    Segment order before SOS is free in JPEG; the entropy-coded data is untouched, so any
    conforming decoder gives the same pixels. Returns ``frame`` unchanged if it cannot be parsed.
    """
    if frame[:2] != b"\xff\xd8":
        return frame
    i, segs, sof = 2, [], None
    while i + 4 <= len(frame):
        if frame[i] != 0xFF:
            return frame
        marker = frame[i + 1]
        if marker == 0xDA:  # SOS: the rest is scan data
            break
        length = int.from_bytes(frame[i + 2 : i + 4], "big")
        seg = frame[i : i + 2 + length]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and sof is None:
            sof = seg
        else:
            segs.append(seg)
        i += 2 + length
    if sof is None or i + 4 > len(frame):
        return frame
    return b"\xff\xd8" + sof + b"".join(segs) + frame[i:]


def j2k_siz(frame: bytes) -> tuple[int, int, bool] | None:
    """``(offset of the first Ssiz byte, precision, signed)`` of a JPEG 2000 codestream (raw or in
    a JP2 box), from its SIZ marker; None if there is none. Ssiz = signed bit | (precision - 1),
    one byte per component, 3 bytes apart (ISO 15444-1 A.5.1)."""
    i = frame.find(b"\xff\x4f\xff\x51")  # SOC then SIZ
    if i < 0 or i + 43 > len(frame):
        return None
    ssiz = frame[i + 42]
    return i + 42, (ssiz & 0x7F) + 1, bool(ssiz & 0x80)


def j2k_unsigned(frame: bytes) -> bytes:
    """The same codestream with every component declared unsigned (entropy data untouched)."""
    siz = j2k_siz(frame)
    if siz is None or not siz[2]:
        return frame
    off = siz[0]
    ncomp = int.from_bytes(frame[off - 2 : off], "big")
    b = bytearray(frame)
    for c in range(ncomp):
        b[off + 3 * c] &= 0x7F
    return bytes(b)


def jpeg_sof(frame: bytes) -> tuple[int, int, bool] | None:
    """``(offset of the SOFn marker, sample precision, False)`` of a JPEG stream; None if none."""
    if frame[:2] != b"\xff\xd8":
        return None
    i = 2
    while i + 5 <= len(frame) and frame[i] == 0xFF:
        marker = frame[i + 1]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return i, frame[i + 4], False
        if marker == 0xDA:
            return None
        i += 2 + int.from_bytes(frame[i + 2 : i + 4], "big")
    return None


def stream_header(frame: bytes) -> tuple[int, int, bool] | None:
    """Sample precision and signedness as the compressed stream declares them (JPEG or J2K)."""
    return jpeg_sof(frame) if frame[:2] == b"\xff\xd8" else j2k_siz(frame)


_STREAMS = {"sof_first": sof_first, "j2k_unsigned": j2k_unsigned}


def decode_frames_gpu(
    frames: list[bytes],
    config: dict,
    bits_stored: int = 16,
    signed: bool = False,
    batch_size: int = 64,
    device_id: int = 0,
    num_threads: int | None = None,
) -> list:
    """Decode encapsulated frames on the GPU; returns CUDA torch tensors (rows, columns[, 3]).

    ``num_threads``: DALI CPU threads (stream parsing and the host stages of the decoders);
    default ``min(8, cpu_count)``.
    """
    import torch
    from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

    key = (config.get("dtype"), batch_size, device_id, num_threads or min(8, os.cpu_count() or 1))
    pipe = _pipe(*key)
    sizes = (
        [stream_header(f) for f in frames] if config["fix"] == "precision" else [None] * len(frames)
    )
    if config.get("stream"):
        frames = [_STREAMS[config["stream"]](f) for f in frames]
    out = []
    for s in range(0, len(frames), batch_size):
        chunk = [np.frombuffer(f, np.uint8) for f in frames[s : s + batch_size]]
        try:
            pipe.feed_input("enc", chunk)
            (res,) = pipe.run()
        except Exception:
            _drop_pipe(*key)  # a failed DALI pipeline cannot run again: build a new one next time
            raise
        for i in range(len(chunk)):
            t = res[i]
            dst = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=f"cuda:{device_id}")
            feed_ndarray(t, dst, cuda_stream=torch.cuda.current_stream(device_id))
            dst = dst[..., 0] if dst.shape[-1] == 1 else dst
            out.append(_fix(dst, config["fix"], bits_stored, signed, sizes[s + i]))
    return out
