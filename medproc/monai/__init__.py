"""MONAI bridge: the only place medproc imports MONAI.

- :mod:`.transforms`: ``LoadVolumed`` and ``Resampled``, MONAI dict transforms producing
  MetaTensors as ``LoadImaged(ensure_channel_first=True)`` does (channel first, spatial axes
  (i, j, k), RAS affine, ``original_affine``, ``spatial_shape``, ``filename_or_obj``...).
  ``Resampled`` is a MONAI ``InvertibleTransform``: ``monai.transforms.Invertd`` undoes it in
  any Compose; ``Spec(grid="monai")`` gives ``Spacingd``'s grid. ``plan_of`` rebuilds its plan.
- :mod:`.meta`: ``to_metatensor`` / ``to_volume`` (Volume <-> MetaTensor, views, no copy).
- :mod:`.loader`: ``PatchLoader``, the batched training loader: volumes resampled once into a
  ``.npy`` cache, patch centres chosen on the CPU by label ratio (as RandCropByPosNegLabeld),
  only the patch region read and shipped, augmentation and intensity in one DALI pipeline.
"""

try:
    import monai  # noqa: F401
    import torch  # noqa: F401
except ImportError as _e:
    from ..errors import TORCH_CPU_HINT

    raise ImportError(
        f"medproc.monai needs MONAI and PyTorch ({_e}): pip install monai torch {TORCH_CPU_HINT}"
    ) from None

from .loader import Augment, PatchLoader, PosNeg  # noqa: E402
from .meta import to_metatensor, to_volume  # noqa: E402
from .transforms import LoadVolumed, Resampled, invert, plan_of  # noqa: E402

__all__ = [
    "Augment",
    "PosNeg",
    "LoadVolumed",
    "Resampled",
    "PatchLoader",
    "plan_of",
    "invert",
    "to_metatensor",
    "to_volume",
]


def __getattr__(name):
    """Deprecated names (they warn when used; see :mod:`.legacy`)."""
    if name == "Invertd":  # not in __all__: `import *` brings no clash with MONAI's Invertd
        from .legacy import Invertd

        return Invertd
    raise AttributeError(f"module 'medproc.monai' has no attribute {name!r}")
