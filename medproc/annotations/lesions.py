"""``Lesions``: points (centre + diameter) and boxes, in world RAS mm."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..geometry import apply_affine

__all__ = ["Lesions"]

_XY = np.array([-1.0, -1.0, 1.0])  # x and y negated: LPS <-> RAS


@dataclass
class Lesions:
    """Lesions of one image: centres, sizes and kinds, in world RAS mm.

    Attributes
    ----------
    centers : (N, 3) float64
        Lesion centres, RAS mm.
    sizes : (N, 3) float64
        Extent along the world R, A, S axes in mm (a point's diameter three times; a box's
        width, height, depth).
    kinds : list of {"point", "box"}
    labels : (N,) int
        Class label per lesion (0 when the format has none).
    ids : list of str
        Where each lesion came from (file:line), for messages.
    """

    centers: np.ndarray
    sizes: np.ndarray
    kinds: list[str] = field(default_factory=list)
    labels: np.ndarray | None = None
    ids: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.centers = np.asarray(self.centers, dtype=np.float64).reshape(-1, 3)
        self.sizes = np.asarray(self.sizes, dtype=np.float64).reshape(-1, 3)
        n = len(self.centers)
        if len(self.sizes) != n:
            raise ValueError(f"Lesions: {n} centres but {len(self.sizes)} sizes")
        self.kinds = list(self.kinds) or ["point"] * n
        self.labels = np.zeros(n, int) if self.labels is None else np.asarray(self.labels, int)
        self.ids = list(self.ids) or [str(i) for i in range(n)]
        for name, got in (("kinds", self.kinds), ("labels", self.labels), ("ids", self.ids)):
            if len(got) != n:
                raise ValueError(f"Lesions: {n} centres but {len(got)} {name}")
        odd = [k for k in self.kinds if k not in ("point", "box")]
        if odd:
            raise ValueError(f"Lesions: kinds must be 'point' or 'box', got {odd[0]!r}")
        for name, a in (("centers", self.centers), ("sizes", self.sizes)):
            bad = np.flatnonzero(~np.isfinite(a).all(axis=1))
            if bad.size:
                raise ValueError(f"Lesions: {name}[{bad[0]}] is not finite: {a[bad[0]].tolist()}")
        neg = np.flatnonzero((self.sizes < 0).any(axis=1))
        if neg.size:
            raise ValueError(
                f"Lesions: sizes[{neg[0]}] is negative: {self.sizes[neg[0]].tolist()} (sizes are "
                "extents in mm, >= 0)"
            )

    def __len__(self) -> int:
        return len(self.centers)

    @classmethod
    def empty(cls) -> Lesions:
        return cls(np.zeros((0, 3)), np.zeros((0, 3)))

    @classmethod
    def of(cls, table: dict, keys) -> Lesions:
        """An image's lesions in a lesion table (``{SeriesInstanceUID or file stem: Lesions}``,
        one file may list many images): the first of ``keys`` listed; none: no lesions."""
        return next((table[k] for k in keys if k and k in table), None) or cls.empty()

    @property
    def diameters(self) -> np.ndarray:
        """Equivalent diameter (mm): the largest extent."""
        return self.sizes.max(axis=1) if len(self) else np.zeros(0)

    def transformed(self, world: np.ndarray) -> Lesions:
        """The lesions moved by a world-space 4x4 matrix (an augmentation moved the content).

        Centres map exactly; a box becomes the world-axis-aligned box around its 8 moved
        corners; a point keeps its diameter scaled by the matrix's mean scale."""
        world = np.asarray(world, dtype=np.float64)
        c = apply_affine(world, self.centers)
        sizes = self.sizes.copy()
        scale = abs(np.linalg.det(world[:3, :3])) ** (1 / 3)
        for n, kind in enumerate(self.kinds):
            if kind == "box":
                h = self.sizes[n] / 2
                corners = np.array(
                    [[x, y, z] for x in (-h[0], h[0]) for y in (-h[1], h[1]) for z in (-h[2], h[2])]
                )
                moved = corners @ world[:3, :3].T
                sizes[n] = moved.max(0) - moved.min(0)
            else:
                sizes[n] = self.sizes[n] * scale
        return Lesions(c, sizes, self.kinds, self.labels.copy(), self.ids)

    def off_image(self, affine: np.ndarray, shape) -> str | None:
        """A note when lesion centres lie outside the image of ``affine`` and ``shape``.

        More than half a voxel beyond its edge; None when all lie inside. An annotation of
        another image, or a table in LPS read as RAS (x and y negated), which the note then
        names when negating puts all inside: a mix-up that keeps the lesions inside (a CT
        centred on the scanner's origin) is not seen."""
        out = [g for g in self.on_grid(affine, shape) if not g["inside"]]
        if not out:
            return None
        first = ", ".join(f"{x:g}" for x in out[0]["center_world_ras"])
        note = (
            f"{len(out)} of {len(self)} lesion(s) lie outside the image (first: {out[0]['id']}"
            f" at RAS ({first}) mm)"
        )
        negated = Lesions(self.centers * _XY, self.sizes, self.kinds, self.labels, self.ids)
        if not any(not g["inside"] for g in negated.on_grid(affine, shape)):
            note += (
                ": with x and y negated all lie inside; are LPS coordinates read as RAS, or "
                "the reverse? (LUNA16's CSV and MONAI's LUNA16 boxes are LPS)"
            )
        return note + ": do these annotations belong to this image?"

    def on_grid(self, affine: np.ndarray, shape) -> list[dict]:
        """Where each lesion sits on a grid: one dict per lesion.

        ``center_voxel`` is the fractional voxel index ``(i, j, k)`` (``affine @ center_voxel``
        gives ``center_world_ras``; the same index into the array nibabel loads from the saved
        NIfTI); ``inside`` says whether the centre lies in the grid (a lesion that left a crop
        is flagged, never dropped); ``size_voxels`` is the extent along i, j, k.
        """
        inv = np.linalg.inv(np.asarray(affine, dtype=np.float64))
        idx = apply_affine(inv, self.centers) if len(self) else np.zeros((0, 3))
        shape = np.asarray(shape[:3])
        sp = np.sqrt((np.asarray(affine)[:3, :3] ** 2).sum(0))
        dirs = np.asarray(affine)[:3, :3] / sp
        diameters = self.diameters  # (once: a property over every lesion)
        out = []
        for n in range(len(self)):
            inside = bool(np.all(idx[n] >= -0.5) and np.all(idx[n] <= shape - 0.5))
            # extent along array axes: project the world box onto each axis direction
            ext = (
                np.abs(dirs.T) @ self.sizes[n]
                if self.kinds[n] == "box"
                else np.full(3, diameters[n])
            )
            out.append(
                {
                    "id": self.ids[n],
                    "kind": self.kinds[n],
                    "label": int(self.labels[n]),
                    "center_world_ras": [round(float(x), 4) for x in self.centers[n]],
                    "center_voxel": [round(float(x), 4) for x in idx[n]],
                    "size_mm": [round(float(x), 4) for x in self.sizes[n]],
                    "diameter_mm": round(float(diameters[n]), 4),
                    "size_voxels": [round(float(x), 4) for x in ext / sp],
                    "inside": inside,
                }
            )
        return out
