"""medproc: fast, exact medical-imaging preprocessing (readers, DALI pipelines, MONAI bridge)."""

from __future__ import annotations

import logging

from ._startup import quiet_early_interrupt, without_unused_imports

quiet_early_interrupt()  # (the medproc command: Ctrl-C while importing, no traceback)
from .errors import (  # noqa: E402
    DeviceError,
    GeometryError,
    GeometryWarning,
    LimitError,
    MedprocError,
    MedprocWarning,
    OutputError,
    ReadError,
    SeriesError,
    UsageError,
)

with without_unused_imports():  # the medproc command does not import pydicom's `requests`
    from .io import load, save
    from .plan import Plan, make_plan
    from .resample import resample, resample_batch
    from .spec import Intensity, Spec
    from .volume import Volume

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "GeometryError",
    "Intensity",
    "Plan",
    "Spec",
    "make_plan",
    "resample",
    "resample_batch",
    "GeometryWarning",
    "LimitError",
    "MedprocWarning",
    "OutputError",
    "DeviceError",
    "UsageError",
    "MedprocError",
    "ReadError",
    "SeriesError",
    "Volume",
    "load",
    "save",
]
