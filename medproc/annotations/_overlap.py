"""Where DICOM annotations overlap: an RTSTRUCT ROI's contours on one slice (holes and islands
by nesting), and segments or ROIs drawn over one another (the higher number wins, said)."""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import MedprocWarning

__all__ = ["combine_contours", "overlay"]


def combine_contours(masks: list[np.ndarray]) -> tuple[np.ndarray, str]:
    """One ROI's contours on one slice (their voxel masks) as one mask: a contour inside
    another is a hole, one inside a hole an island (by how many others hold it: even, drawn;
    odd, cut out, in that order). Contours that overlap without one holding the other are
    taken together, and a contour given twice once (read by the even-odd rule, the first
    loses the overlap and the second cancels the contour); the returned text says so ("" if
    neither happened)."""
    uniq: list[np.ndarray] = []
    boxes: list[np.ndarray] = []  # (their bounding boxes: pairs far apart are not compared)
    twice = 0
    for m in masks:
        b = _box(m)
        if any((b == c).all() and np.array_equal(m, u) for u, c in zip(uniq, boxes)):
            twice += 1
        else:
            uniq.append(m)
            boxes.append(b)
    near = [[_near(boxes[i], boxes[j]) for j in range(len(uniq))] for i in range(len(uniq))]
    inside = {(i, j) for i, m in enumerate(uniq) for j, o in enumerate(uniq)
              if i != j and near[i][j] and _inside(m, o)}  # fmt: skip
    # (each inside the other, by the tolerance: nearly the same outline twice, not a hole)
    held = [[j for j in range(len(uniq)) if (i, j) in inside and (j, i) not in inside]
            for i in range(len(uniq))]  # fmt: skip
    depth = [len(h) for h in held]
    out = np.zeros_like(uniq[0])
    for d in sorted(set(depth)):
        for m, n in zip(uniq, depth):
            if n == d:
                out = out | m if d % 2 == 0 else out & ~m
    partial = sum(
        1
        for i in range(len(uniq))
        for j in range(i + 1, len(uniq))
        if depth[i] == depth[j] and near[i][j] and (uniq[i] & uniq[j]).any()
    )
    said = [f"{twice} contour(s) given twice, drawn once"] * bool(twice)
    said += [f"{partial} pair(s) of contours overlap, taken together"] * bool(partial)
    return out, "; ".join(said)


def _box(m: np.ndarray) -> np.ndarray:
    """A mask's bounding box (i0, i1, j0, j1), inclusive."""
    i, j = np.flatnonzero(m.any(1)), np.flatnonzero(m.any(0))
    return np.array([i[0], i[-1], j[0], j[-1]]) if i.size else np.array([0, -1, 0, -1])


def _near(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two boxes touch or overlap (within one voxel): only then can one mask hold, or
    overlap, the other (a slice of many contours compared every pair in full)."""
    return bool(a[0] <= b[1] + 1 and b[0] <= a[1] + 1 and a[2] <= b[3] + 1 and b[2] <= a[3] + 1)


def _inside(m: np.ndarray, o: np.ndarray) -> bool:
    """Whether contour mask ``m`` lies inside ``o``: wholly, or but for a rim of at most a tenth
    of its voxels next to ``o`` (a hole drawn on the outer contour's edge rasterises a column
    past it when the exported coordinates are a thousandth of a voxel off)."""
    out = m & ~o
    if not out.any():
        return True
    if out.sum() > 0.1 * m.sum() or not (m & o).any():
        return False
    near = np.zeros_like(o)
    p = np.pad(o, 1)
    for di in (0, 1, 2):
        for dj in (0, 1, 2):
            near |= p[di : di + o.shape[0], dj : dj + o.shape[1]]
    return not (out & ~near).any()


def overlay(out: np.ndarray, masks, value, names, path: str, what: str = "ROI") -> None:
    """Draw ``masks`` ({number: {slice k: (i, j) mask}}) into ``out`` with ``value[number]``,
    in ascending value order: the higher wins where they overlap. A warning names which
    ``what`` (ROI, segment) overwrote which, and how many voxels, and any left with none."""
    lost: dict[tuple[int, int], int] = {}  # (value overwritten, value on top) -> voxels
    total: dict[int, int] = {}
    for num in sorted(masks, key=value.get):
        v = value[num]
        for k, m in masks[num].items():
            sl = out[:, :, k]
            under = sl[m]
            for u, n in zip(*np.unique(under[under > 0], return_counts=True)):
                lost[(int(u), v)] = lost.get((int(u), v), 0) + int(n)
            sl[m] = v
            total[v] = total.get(v, 0) + int(m.sum())
    if not lost:
        return
    num_of = {v: n for n, v in value.items()}

    def name(v):
        return f"{names.get(num_of[v], '')!r} ({what} {num_of[v]})"

    said = "; ".join(
        f"{name(v)} overwrites {n} voxel(s) of {name(u)}" for (u, v), n in lost.items()
    )
    gone = "".join(
        f". {name(u)} is MISSING from the label map: all its {total[u]} voxel(s) lie in "
        f"higher-numbered {what}s"
        for u in sorted({u for u, _ in lost})
        if not (out == u).any()
    )
    warnings.warn(
        f"{path}: {what}s overlap, and the higher {what} number wins: {said}{gone}",
        MedprocWarning,
        stacklevel=3,
    )
