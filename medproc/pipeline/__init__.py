"""The DALI layer: the only place medproc imports NVIDIA DALI.

Everything goes through :class:`Engine` (see :mod:`medproc.pipeline.engine` for its contract:
pipelines per thread and process, fork-safe, running ahead). This package imports nothing from
``medproc.io`` or the connectors.
"""

from .cache import ForkError, cached_pipeline, dali_available, gpu_available
from .engine import Engine, Job
from .graphs import Graph
from .runner import stacked

__all__ = [
    "Engine",
    "ForkError",
    "Graph",
    "Job",
    "cached_pipeline",
    "dali_available",
    "gpu_available",
    "stacked",
]
