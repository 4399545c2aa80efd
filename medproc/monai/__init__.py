"""MONAI bridge: the only place medproc imports MONAI.

- :mod:`.transforms`: MapTransform-style dict transforms (``LoadVolumed``, ``Resampled``,
  ``Invertd``) that compose with MONAI's ``Compose`` and produce MetaTensors with the right
  affine (MONAI's convention: channel first, spatial axes (i, j, k), RAS affine).
- :mod:`.loader`: ``PatchLoader``, the batched training loader: volumes resampled once into a
  ``.npy`` cache, patch centres chosen on the CPU by label ratio (as RandCropByPosNegLabeld),
  only the patch region read and shipped, augmentation and intensity in one DALI pipeline.
"""

try:
    import monai  # noqa: F401
    import torch  # noqa: F401
except ImportError as _e:
    raise ImportError(
        f"medproc.monai needs MONAI and PyTorch ({_e}): pip install 'medproc[monai]' "
        "(on a CPU-only machine first: pip install torch==2.13.0)"
    ) from None

from .loader import PatchLoader  # noqa: E402
from .transforms import Invertd, LoadVolumed, Resampled, to_metatensor, to_volume  # noqa: E402

__all__ = ["LoadVolumed", "Resampled", "Invertd", "PatchLoader", "to_metatensor", "to_volume"]
