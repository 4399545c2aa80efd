"""Exceptions and warnings raised by medproc.

Every error names the file (or argument) it is about, what was expected, what arrived, and
where possible the fix.
"""

from __future__ import annotations

import os

__all__ = [
    "MedprocError",
    "ReadError",
    "SeriesError",
    "GeometryError",
    "MedprocWarning",
    "GeometryWarning",
]


class MedprocError(ValueError):
    """Base class of medproc's errors. ``path`` is the file or folder concerned (or None)."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        self.path = None if path is None else os.fspath(path)
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path else message)


class ReadError(MedprocError):
    """A file could not be read: not the format it claims, truncated, missing pixel data..."""


class SeriesError(MedprocError):
    """A DICOM series is inconsistent, or the series asked for does not exist / is ambiguous."""


class GeometryError(MedprocError):
    """The voxel grid cannot be built without being wrong (missing slices, duplicates...)."""


class MedprocWarning(UserWarning):
    """Base class of medproc's warnings."""


class GeometryWarning(MedprocWarning):
    """Geometry that is usable but unusual (uneven spacing, gantry tilt, no patient geometry)."""
