"""A batch's columns for the engine (private to :mod:`medproc.monai.loader`): one dtype per
column, and GPU boxes gathered into one tensor when they can be."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["gathered", "one_dtype"]


def gathered(boxes: list) -> list:
    """GPU boxes ``(k, j, i)`` (views of the cached volumes) copied out and seen as ``(i, j, k)``:
    when they agree in shape and dtype, as the rows of one batch tensor (one copy; the engine
    then feeds DALI the batch in one piece), else one by one. Host boxes are left as they are."""
    on_gpu = [torch.is_tensor(b) for b in boxes]
    if not any(on_gpu):
        return boxes
    first = boxes[0]
    if all(on_gpu) and all(b.shape == first.shape and b.dtype == first.dtype for b in boxes):
        return [b.permute(2, 1, 0) for b in torch.stack(boxes).unbind(0)]
    return [b.contiguous().permute(2, 1, 0) if t else b for b, t in zip(boxes, on_gpu)]


def one_dtype(arrays: list, wider: tuple[str, ...]) -> list:
    """The arrays of one batch column in one dtype (the engine feeds a column in one): the
    first of ``wider`` that holds them all, when they differ."""
    names = {str(a.dtype).replace("torch.", "") for a in arrays}
    if len(names) == 1:
        return arrays
    small = {"uint8", "int16"}
    target = wider[0] if names <= small | {wider[0]} and wider[0] in small else "float32"
    return [
        a.astype(target) if isinstance(a, np.ndarray) else a.to(getattr(torch, target))
        for a in arrays
    ]
