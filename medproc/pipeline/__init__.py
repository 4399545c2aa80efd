"""DALI execution layer: the only place medproc imports NVIDIA DALI."""

from .resample import Resampler, dali_available, gpu_available

__all__ = ["Resampler", "dali_available", "gpu_available"]
