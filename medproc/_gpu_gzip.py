"""``.nii.gz`` outputs of ``medproc convert --device gpu`` compressed on the GPU.

Why: with the resampling on the GPU, gzip is the largest stage a CPU worker has left (0.13-0.19 s
of ~0.35 s per 512 x 512 x 153 series on the H200 node, ``docs/benchmarks.md``). nvCOMP's gzip
(the ``nvidia-nvcomp-cu12`` package, optional) compresses such an output on the GPU in ~15-20 ms,
to a slightly smaller file than igzip's level 1.

How: a NIfTI-1 ``.nii.gz`` is one gzip member of the header (the bytes nibabel writes before the
voxels, :func:`nifti_head`) followed by the voxels. The GPU service (:mod:`medproc._gpu_serve`)
copies the header and the output it just copied into the arena back to the GPU, side by side,
compresses them there with nvCOMP into one gzip member (CRC-32 and length in its trailer, as
every gzip reader checks them), and copies the member into an arena piece of its own. The worker
checks that the member starts with the header it would write itself (:func:`head_matches`, a
few hundred bytes decompressed) and writes it as the file, atomically (:func:`write_member`);
otherwise, or without nvCOMP, it compresses on its CPU as before. ``MEDPROC_GPU_GZIP=0`` turns
this off (for comparison).
"""

from __future__ import annotations

import functools
import io
import logging
import os
import zlib

import numpy as np

log = logging.getLogger("medproc.convert")

__all__ = ["wanted", "nifti_head", "head_matches", "write_member", "GpuGzip"]

#: nvCOMP's gzip ``algorithm_type``: 2, "medium throughput, medium compression ratio, beats zlib
#: level 1 on the compression ratio" (nvCOMP's docs)
ALGORITHM = 2
#: codecs kept per service (nvCOMP's raw gzip compresses one buffer of the codec's chunk size)
_CODECS = 8


def wanted(fmt: str) -> bool:
    """Whether outputs of format ``fmt`` are to be compressed on the GPU (``.nii.gz`` only;
    ``MEDPROC_GPU_GZIP=0``: never)."""
    return fmt == "nii.gz" and os.environ.get("MEDPROC_GPU_GZIP", "1").strip() != "0"


class _Enough(Exception):
    """Raised by :class:`_HeadSink` once it holds the header: nibabel stops writing."""


class _HeadSink(io.RawIOBase):
    """A write-only file that keeps what nibabel writes up to the voxel offset its header
    declares (``vox_offset``, a float32 at byte 108 of a NIfTI-1 header), then stops it."""

    def __init__(self):
        super().__init__()
        self.buf = bytearray()
        self.end: int | None = None

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:  # (nibabel asks; it only seeks to where the sink is)
        return True

    def tell(self) -> int:
        return len(self.buf)

    def seek(self, pos: int, whence: int = 0) -> int:
        if (whence == 0 and pos == len(self.buf)) or (whence == 1 and pos == 0):
            return len(self.buf)
        raise io.UnsupportedOperation("the header is written front to back")

    def write(self, b) -> int:
        self.buf += bytes(b)
        if self.end is None and len(self.buf) >= 348:
            self.end = int(np.frombuffer(bytes(self.buf[108:112]), "<f4")[0])
            if self.end < 348:
                raise ValueError(f"a NIfTI header with vox_offset {self.end}")
        if self.end is not None and len(self.buf) >= self.end:
            raise _Enough
        return len(b)


def nifti_head(volume) -> bytes:
    """The bytes nibabel writes before the voxels of ``volume`` in a ``.nii`` (header,
    extension flag, padding to the voxel offset), as :func:`medproc.save` writes it; the
    voxels follow in memory order (i fastest)."""
    from .io.nifti import to_nibabel

    sink = _HeadSink()
    try:
        to_nibabel(volume).to_stream(sink)
    except _Enough:
        return bytes(sink.buf[: sink.end])
    raise ValueError("nibabel wrote no voxels")  # (an empty image)


def head_matches(member, head: bytes) -> bool:
    """Whether the gzip member ``member`` (bytes-like) decompresses to ``head`` first (only
    those bytes are decompressed)."""
    try:
        d = zlib.decompressobj(31)
        got = d.decompress(bytes(memoryview(member)[: max(4096, 2 * len(head))]), len(head))
    except zlib.error:
        return False
    return got == head


def write_member(volume, member, path: str) -> bool:
    """Write the gzip member ``member`` (made by a GPU service) as the ``.nii.gz`` of
    ``volume`` at ``path``, atomically, if it starts with the header :func:`medproc.save`
    would write for ``volume``; False (nothing written) if it does not."""
    from .errors import OutputError
    from .io import atomic_write

    if not path.lower().endswith(".nii.gz"):
        return False
    if not head_matches(member, nifti_head(volume)):
        log.warning("%s: the GPU's .nii.gz has another header; compressed here instead", path)
        return False
    try:
        with atomic_write(path) as tmp, open(tmp, "wb") as f:
            f.write(memoryview(member))
    except OSError as e:  # (named by the user's path, as save() does)
        raise OutputError(f"cannot be written: {e.strerror or e}", path) from None
    return True


class _Device:
    """A device buffer as nvCOMP takes it (``__cuda_array_interface__``)."""

    def __init__(self, ptr: int, n: int):
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": "|u1",
            "data": (ptr, False),
            "strides": None,
            "version": 3,
        }


class GpuGzip:
    """In a GPU service process: gzip members made on the GPU with nvCOMP (raises ImportError
    without it). One device buffer, grown as needed, holds a header and its voxels side by
    side."""

    def __init__(self):
        from nvidia import nvcomp

        from .pipeline.hostmem import _rt

        self.nv, self.rt = nvcomp, _rt()
        self.buf, self.cap = 0, 0
        self.codec = functools.lru_cache(maxsize=_CODECS)(self._codec)

    def _codec(self, n: int):
        return self.nv.Codec(
            algorithm="Gzip",
            algorithm_type=ALGORITHM,
            bitstream_kind=self.nv.BitstreamKind.RAW,
            uncomp_chunk_size=n,
        )

    def _room(self, n: int) -> None:
        from .pipeline.hostmem import _check

        if n <= self.cap:
            return
        if self.buf:
            _check(self.rt.cudaFree(self.buf), "cudaFree")
            self.buf, self.cap = 0, 0
        cap = max(n, 64 << 20) + (n >> 3)  # (room for a somewhat larger output next)
        err, ptr = self.rt.cudaMalloc(cap)
        _check((err,), "cudaMalloc")
        self.buf, self.cap = int(ptr), cap

    def compress(self, head: bytes, voxels: np.ndarray, take):
        """One gzip member of ``head`` + ``voxels`` (C-contiguous: their bytes as they are),
        copied into the host array ``take(nbytes)`` gives (a uint8 array, or None: no room;
        then None is returned). Checked: a gzip header, and a trailer whose length is the
        input's."""
        from .pipeline.hostmem import _check

        rt, h2d = self.rt, self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        if not voxels.flags.c_contiguous:
            raise ValueError("voxels must be C-contiguous")
        n = len(head) + voxels.nbytes
        self._room(n)
        hb = np.frombuffer(head, np.uint8)
        _check(rt.cudaMemcpy(self.buf, hb.ctypes.data, hb.nbytes, h2d), "cudaMemcpy (head)")
        _check(
            rt.cudaMemcpy(self.buf + hb.nbytes, voxels.ctypes.data, voxels.nbytes, h2d),
            "cudaMemcpy (voxels)",
        )
        _check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        enc = self.codec(n).encode(self.nv.as_array(_Device(self.buf, n)))
        size = int(enc.buffer_size)
        dst = take(size)
        if dst is None:
            return None
        src = int(enc.__cuda_array_interface__["data"][0])
        d2h = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        _check(rt.cudaMemcpy(dst.ctypes.data, src, size, d2h), "cudaMemcpy (member)")
        if size < 18 or bytes(dst[:3]) != b"\x1f\x8b\x08":
            raise RuntimeError("nvCOMP's gzip output does not start with a gzip header")
        if int.from_bytes(bytes(dst[-4:]), "little") != n % (1 << 32):
            raise RuntimeError("nvCOMP's gzip output is not one member of the whole input")
        return dst

    def close(self) -> None:
        if self.buf:
            self.rt.cudaFree(self.buf)
            self.buf, self.cap = 0, 0
