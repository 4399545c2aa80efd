"""MONAI bridge: the only place medproc imports MONAI.

- :mod:`.transforms`: MapTransform-style dict transforms (``LoadVolumed``, ``Resampled``,
  ``Invertd``) that compose with MONAI's ``Compose`` and produce MetaTensors with the right
  affine (MONAI's convention: channel first, spatial axes (i, j, k), RAS affine).
- :mod:`.loader`: ``PatchLoader``, the batched training loader: volumes resampled once into a
  ``.npy`` cache, patch centres chosen on the CPU by label ratio (as RandCropByPosNegLabeld),
  only the patch region read and shipped, augmentation and intensity in one DALI pipeline.
"""

from .loader import PatchLoader
from .transforms import Invertd, LoadVolumed, Resampled, to_metatensor, to_volume

__all__ = ["LoadVolumed", "Resampled", "Invertd", "PatchLoader", "to_metatensor", "to_volume"]
