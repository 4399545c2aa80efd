"""Exceptions and warnings raised by medproc.

Every error names the file (or argument) it is about, and where inside it (a line of a CSV, an
item of a JSON file), what was expected, what was found, and what to do. The public surface
(``medproc.load``, the annotation readers, case lists, ``medproc convert``) raises only
:class:`MedprocError` subclasses; the command line prints their text as it is, without a
traceback (``-v`` shows one).

>>> str(ReadError("expected 6 numbers, got 3; fix the box", "lesions.json", where="cases[0]"))
'lesions.json: cases[0]: expected 6 numbers, got 3; fix the box'
"""

from __future__ import annotations

import os
import re

__all__ = [
    "MedprocError",
    "ReadError",
    "LimitError",
    "SeriesError",
    "GeometryError",
    "UsageError",
    "OutputError",
    "DeviceError",
    "MedprocWarning",
    "GeometryWarning",
]


class MedprocError(ValueError):
    """Base class of medproc's errors.

    Parameters
    ----------
    message : str
        What was expected, what was found, and what to do.
    path : str or path-like, optional
        The file or folder concerned; it starts the text.
    where : str, optional
        Where in the file: ``"line 3"``, ``"cases[2].boxes[0]"``, ``"frame 7"``.

    Attributes
    ----------
    path, where, message
        As given (``path`` as a str).
    """

    def __init__(
        self, message: str, path: str | os.PathLike | None = None, where: str | None = None
    ):
        self.path = None if path is None else os.fsdecode(path)
        self.where = where
        self.message = message
        text = f"{where}: {message}" if where else message
        super().__init__(f"{self.path}: {text}" if self.path else text)


class ReadError(MedprocError):
    """A file could not be read: not the format it claims, truncated, damaged, unsafe."""


class LimitError(ReadError):
    """A header declares more data than the file can hold or memory allows (checked before any
    allocation; the cap is the smallest of the physical memory, ``ulimit -v`` and
    ``MEDPROC_MAX_BYTES``)."""


class SeriesError(MedprocError):
    """A DICOM series is inconsistent, or the series asked for does not exist / is ambiguous."""


class GeometryError(MedprocError):
    """The voxel grid cannot be built without being wrong (missing slices, duplicates...)."""


class UsageError(MedprocError):
    """An argument or option is invalid (the command line exits with status 2)."""


class DeviceError(MedprocError, RuntimeError):
    """The device asked for is not here (``device="gpu"`` without a GPU DALI or PyTorch sees);
    a RuntimeError too, as such errors were before."""


class OutputError(MedprocError):
    """The output folder cannot be used (it is a file, not writable, or busy)."""


class MedprocWarning(UserWarning):
    """Base class of medproc's warnings."""


class GeometryWarning(MedprocWarning):
    """Geometry that is usable but unusual (uneven spacing, gantry tilt, no patient geometry)."""


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def printable(text: str, newlines: bool = False) -> str:
    """``text`` with its control characters escaped (``\\x1b``, ``\\n``...): file names
    reach the terminal through messages, and a name holding an escape sequence must not clear
    the screen or retitle the window, nor a newline split a row. ``newlines``: keep line breaks
    (a message of several lines)."""
    pattern = _CONTROL_BUT_NEWLINE if newlines else _CONTROL
    return pattern.sub(lambda m: repr(m.group())[1:-1], text)


#: after an install command that brings PyTorch: an unpinned torch on a machine without a GPU
#: pulls a multi-GB CUDA build
TORCH_CPU_HINT = (
    "(on a CPU-only machine install PyTorch's CPU build first, e.g. pip install torch==2.13.0, "
    "as the README says)"
)

_CUDA_NAME = re.compile(r"cuda(:(0|[1-9][0-9]*))?")  # (ASCII digits, no leading zero)


def check_device(device, cuda: bool = False) -> str:
    """``device`` as a string: ``"cpu"`` or ``"gpu"`` (with ``cuda``, also ``"cuda"`` and
    ``"cuda:N"``; a ``torch.device`` is taken by its name), else a :class:`UsageError`."""
    if type(device).__name__ == "device" and hasattr(device, "type"):  # torch.device
        device = str(device)
    ok = device in ("cpu", "gpu") if isinstance(device, str) else False
    cuda_name = isinstance(device, str) and _CUDA_NAME.fullmatch(device)
    if not ok and not (cuda and cuda_name):
        names = "'cpu', 'gpu', 'cuda' or 'cuda:N'" if cuda else "'cpu' or 'gpu'"
        hint = (
            " ('gpu' is the current CUDA device; pick another with CUDA_VISIBLE_DEVICES, or"
            " device_id where the function takes one)"
            if cuda_name
            else ""
        )
        raise UsageError(f"device must be {names}, got {device!r}{hint}")
    return device
