"""QC pictures a radiologist can check at a glance: before and after, through every lesion.

:func:`qc_figure` draws, for each lesion (else each label value at its largest extent, else the
centre), axial, coronal and sagittal views before (top row) and after (bottom row) conversion,
through the same world point on both grids, with orientation letters computed from each affine
(a wrong affine or a flipped array shows), label outlines and lesions circled in red. Views are
radiological: the patient's left on the image's right in axial and coronal views, anterior on the
left in sagittal views, along each volume's closest anatomical axes (oblique planes say so).
The picture is composed in numpy; text is rendered once per distinct string by matplotlib on
private ``Figure`` objects (Agg canvas): no pyplot, no backend switch, no rcParams change.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import numpy as np
from nibabel.orientations import io_orientation

from ._qc_text import GREY, WHITE, YELLOW, stamp, wrap_parts
from .volume import Volume

__all__ = ["ViewAxes", "view_axes", "orientation_letters", "qc_figure", "qc_render"]

VIEWS = ("axial", "coronal", "sagittal")
#: per view: world axis held fixed, (world axis, sign) of screen-right and of screen-up (RAS)
_CONVENTION = {
    "axial": (2, (0, -1), (1, 1)),  # patient left (-x) on the right, anterior up
    "coronal": (1, (0, -1), (2, 1)),  # patient left on the right, superior up
    "sagittal": (0, (1, -1), (2, 1)),  # anterior on the left (posterior right), superior up
}
_CODES = ("RL", "AP", "SI")  # letter of +axis, -axis (RAS)
_PALETTE = np.array(
    [[0, 255, 0], [0, 220, 255], [255, 0, 255], [255, 160, 0], [160, 120, 255], [255, 255, 0]],
    np.float32,
)
_LESION_RGB = np.array([255, 40, 40], np.uint8)


def orientation_letters(direction, secondary: float = 0.25) -> str:
    """Anatomical letters of a RAS direction: the dominant axis first, then any axis whose
    component is at least ``secondary`` of the unit vector (oblique directions).

    >>> orientation_letters([-1, 0, 0])
    'L'
    >>> orientation_letters([0, 0.26, 0.97])
    'SA'
    """
    v = np.asarray(direction, dtype=np.float64)
    v = v / np.linalg.norm(v)
    order = np.argsort(-np.abs(v), kind="stable")
    out = [
        _CODES[a][0 if v[a] > 0 else 1] for a in order if a == order[0] or abs(v[a]) >= secondary
    ]
    return "".join(out)


@dataclass(frozen=True)
class ViewAxes:
    """How one view of a volume is put on screen (rows top to bottom, columns left to right).

    ``fixed`` is the voxel axis held fixed; ``col``/``row`` the voxel axes along the screen's
    columns/rows, ``col_flip``/``row_flip`` whether the index decreases rightwards/downwards.
    ``letters`` maps "left", "right", "top", "bottom" to the anatomical letters there, and
    ``tilt_deg`` is the angle between the shown plane and the true anatomical plane.
    """

    view: str
    fixed: int
    col: int
    col_flip: bool
    row: int
    row_flip: bool
    letters: dict
    tilt_deg: float


def view_axes(affine, view: str) -> ViewAxes:
    """The screen layout of ``view`` ("axial", "coronal" or "sagittal") for a grid ``affine``.

    The closest voxel plane is shown, in the radiological convention; the letters on each side
    come from the affine's true directions (oblique planes get two letters, e.g. "SA").

    Examples
    --------
    >>> va = view_axes(np.diag([-1.0, -1.0, 1.0, 1.0]), "axial")  # an LPS grid
    >>> va.col, va.col_flip, va.letters["right"], va.letters["top"]
    (0, False, 'L', 'A')
    """
    if view not in _CONVENTION:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    a = np.asarray(affine, dtype=np.float64)[:3, :3]
    dirs = a / np.linalg.norm(a, axis=0)
    ornt = io_orientation(np.asarray(affine, dtype=np.float64))  # per voxel axis: world, sign
    voxel_of = {int(w): ax for ax, (w, _) in enumerate(ornt)}
    sign_of = {int(w): s for w, s in ornt}
    fixed_w, (right_w, right_s), (up_w, up_s) = _CONVENTION[view]
    col, row = voxel_of[right_w], voxel_of[up_w]
    col_flip = bool(sign_of[right_w] != right_s)
    row_flip = bool(sign_of[up_w] == up_s)  # index should grow downwards, i.e. against "up"
    right = dirs[:, col] * (-1 if col_flip else 1)
    down = dirs[:, row] * (-1 if row_flip else 1)
    sides = {"left": -right, "right": right, "top": -down, "bottom": down}
    letters = {side: orientation_letters(d) for side, d in sides.items()}
    normal = np.cross(right, down)
    tilt = float(np.degrees(np.arccos(min(1.0, abs(normal[fixed_w]) / np.linalg.norm(normal)))))
    return ViewAxes(view, voxel_of[fixed_w], col, col_flip, row, row_flip, letters, tilt)


def _window(arr: np.ndarray) -> tuple[float, float]:
    """Display window: a lung/soft-tissue CT window for HU data, else the 0.5-99.5 percentiles."""
    s = arr[::2, ::2, ::2] if min(arr.shape) > 8 else arr
    if s.dtype.kind == "f":  # (NaN or inf kept with --nan keep: a window of the rest)
        s = s[np.isfinite(s)]
    if s.size == 0:
        return 0.0, 1.0
    lo, hi = float(s.min()), float(s.max())
    if lo < -500 and hi > 200:
        return -1000.0, 400.0
    p = np.percentile(s.ravel()[::2], [0.5, 99.5])
    return float(p[0]), float(p[1]) if p[1] > p[0] else float(p[0]) + 1.0


def _lin(n_in: int, n_out: int, flip: bool) -> np.ndarray:
    """Fractional input indices of ``n_out`` display pixels spanning ``n_in`` voxels."""
    u = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
    return n_in - 1 - u if flip else u


def _sample(img: np.ndarray, r: np.ndarray, c: np.ndarray, linear: bool) -> np.ndarray:
    """``img`` at fractional rows ``r`` x columns ``c`` (bilinear, or nearest)."""
    nr, nc = img.shape
    if not linear:
        ri = np.clip(np.rint(r), 0, nr - 1).astype(np.intp)
        ci = np.clip(np.rint(c), 0, nc - 1).astype(np.intp)
        return img[ri][:, ci]
    r, c = np.clip(r, 0, nr - 1), np.clip(c, 0, nc - 1)
    r0, c0 = np.floor(r).astype(np.intp), np.floor(c).astype(np.intp)
    r1, c1 = np.minimum(r0 + 1, nr - 1), np.minimum(c0 + 1, nc - 1)
    wr, wc = (r - r0)[:, None].astype(np.float32), (c - c0)[None, :].astype(np.float32)
    top, bot = img[r0].astype(np.float32), img[r1].astype(np.float32)
    top = top[:, c0] * (1 - wc) + top[:, c1] * wc
    bot = bot[:, c0] * (1 - wc) + bot[:, c1] * wc
    return top * (1 - wr) + bot * wr


#: one drawn view: stage, target name, ViewAxes, slice index along axes.fixed, whether the target
#: lies on the grid, and the image's box (x, y, width, height) on the picture, y down
_Panel = namedtuple("_Panel", "stage target axes index inside box")


def _panel(vol, lab, win, va, point, lesions, size):
    """RGB pixels of one view through ``point`` (RAS), fitted in ``size`` = (width, height)."""
    inv = np.linalg.inv(vol.affine)
    ijk = inv[:3, :3] @ point + inv[:3, 3]
    n = np.array(vol.shape)
    inside = bool(np.all((ijk > -0.5) & (ijk < n - 0.5)))
    k = int(np.clip(np.rint(ijk[va.fixed]), 0, n[va.fixed] - 1))

    def plane(a):  # slice k as (voxel axis va.row, voxel axis va.col)
        t = a[(slice(None),) * va.fixed + (k,)]  # a view, no copy
        return t.T if va.row > va.col else t

    sp = vol.spacing
    ncol, nrow = n[va.col], n[va.row]
    scale = min(size[0] / (ncol * sp[va.col]), size[1] / (nrow * sp[va.row]))  # px per mm
    w = max(1, int(round(ncol * sp[va.col] * scale)))
    h = max(1, int(round(nrow * sp[va.row] * scale)))
    u, v = _lin(ncol, w, va.col_flip), _lin(nrow, h, va.row_flip)
    g = (_sample(plane(vol.array), v, u, True) - win[0]) * (255.0 / (win[1] - win[0]))
    bad = ~np.isfinite(g)  # (NaN voxels, kept: drawn in a colour of their own)
    rgb = np.repeat(np.clip(np.where(bad, 0, g), 0, 255)[..., None], 3, axis=2)
    rgb[bad] = (0, 160, 255)
    if lab is not None:
        lv = _sample(plane(lab.array), v, u, False)
        if lv.any():
            _overlay(rgb, lv)
    rgb = rgb.astype(np.uint8)
    # lesions crossing this plane: a red circle of the sphere's cross-section
    p0 = vol.affine[:3, :3] @ np.where(np.arange(3) == va.fixed, k, 0) + vol.affine[:3, 3]
    normal = np.cross(vol.affine[:3, va.col], vol.affine[:3, va.row])
    normal /= np.linalg.norm(normal)
    for c_ras, diam in lesions:
        d = float((c_ras - p0) @ normal)
        if abs(d) < diam / 2:
            cu, cv = (inv[:3, :3] @ c_ras + inv[:3, 3])[[va.col, va.row]]
            cu, cv = ncol - 1 - cu if va.col_flip else cu, nrow - 1 - cv if va.row_flip else cv
            x, y = (cu + 0.5) * w / ncol - 0.5, (cv + 0.5) * h / nrow - 0.5
            _ring(rgb, x, y, max(3.0, np.sqrt((diam / 2) ** 2 - d * d) * scale))
    return rgb, k, inside


def _overlay(rgb: np.ndarray, lv: np.ndarray) -> None:
    """Tint label voxels and draw their outlines (a colour per label value) in place."""
    vals = lv.astype(np.int64)
    colour = _PALETTE[(vals - 1) % len(_PALETTE)]
    on, p = vals > 0, np.pad(vals, 1, mode="edge")
    edge = on & (
        (p[:-2, 1:-1] != vals)
        | (p[2:, 1:-1] != vals)
        | (p[1:-1, :-2] != vals)
        | (p[1:-1, 2:] != vals)
    )
    fill = on & ~edge
    rgb[fill] = 0.75 * rgb[fill] + 0.25 * colour[fill]
    rgb[edge] = colour[edge]


def _ring(rgb: np.ndarray, x: float, y: float, r: float) -> None:
    h, w = rgb.shape[:2]
    y0, y1 = max(0, int(y - r - 2)), min(h, int(y + r + 3))
    x0, x1 = max(0, int(x - r - 2)), min(w, int(x + r + 3))
    if y1 > y0 and x1 > x0:  # else the circle is off the panel
        yy, xx = np.mgrid[y0:y1, x0:x1]
        rgb[y0:y1, x0:x1][np.abs(np.hypot(xx - x, yy - y) - r) <= 0.9] = _LESION_RGB


def _targets(before, label, lesions, max_targets):
    """[(name, {view: RAS point})]: each lesion, else each label value's largest extent."""
    if len(lesions):
        name = "lesion {}: {:.0f} mm at RAS ({:.0f}, {:.0f}, {:.0f})"
        out = [
            (name.format(n, d, *c), dict.fromkeys(VIEWS, c)) for n, (c, d) in enumerate(lesions, 1)
        ]
        return out[:max_targets], max(0, len(lesions) - max_targets)
    centre = before.voxel_to_world((np.array(before.shape) - 1) / 2.0)
    if label is None:
        return [("centre (no lesions, no label)", dict.fromkeys(VIEWS, centre))], 0
    lab = np.asarray(label.array)
    lab = lab[..., 0] if lab.ndim == 4 else lab
    if lab.dtype.kind in "biu" and lab.size and int(lab.max()) < 1 << 16:
        counts = np.bincount(lab.ravel().astype(np.int64, copy=False))
        values = [int(v) for v in np.argsort(-counts, kind="stable") if v > 0 and counts[v] > 0]
    else:
        values = [int(v) for v in np.unique(lab) if v > 0]
    if not values:
        return [("centre (empty label)", dict.fromkeys(VIEWS, centre))], 0
    out = []
    for v in values[:max_targets]:
        mask = lab == v
        points = {}
        for view in VIEWS:  # per view: the slice with the most voxels, at their centroid
            ax = view_axes(label.affine, view).fixed
            n = mask.sum(axis=tuple(a for a in range(3) if a != ax))
            ties = np.flatnonzero(n == n.max())  # (of equal slices, the one nearest the centroid:
            centroid = (n * np.arange(n.size)).sum() / n.sum()  # the first was the label's edge)
            k = int(ties[np.argmin(np.abs(ties - centroid))])
            ijk = np.insert(np.argwhere(np.take(mask, k, axis=ax)).mean(0), ax, k)
            points[view] = label.voxel_to_world(ijk)
        out.append((f"label {v}: views through its largest extent", points))
    return out, max(0, len(values) - max_targets)


def _describe(vol: Volume) -> str:
    sp = "x".join(f"{s:.3g}" for s in vol.spacing)
    return f"{'x'.join(map(str, vol.shape))} @ {sp} mm {vol.orientation}"


def qc_render(
    before: Volume,
    after: Volume,
    label_before: Volume | None = None,
    label_after: Volume | None = None,
    lesions=(),
    title: str = "",
    max_targets: int = 4,
    panel: int = 216,
) -> tuple[np.ndarray, list]:
    """The QC picture as an RGB array, and where each view is on it.

    Same arguments as :func:`qc_figure`; ``panel`` is the side of each view in pixels
    (letters included). Returns ``(rgb, panels)``: ``rgb`` is ``(height, width, 3)`` uint8;
    each panel records its stage ("before"/"after"), target, :class:`ViewAxes` (with the
    letters drawn), slice index, whether the target lies on that grid, and the image's pixel
    box ``(x, y, width, height)`` on the picture (y down).
    """
    vols = (before, after, label_before, label_after)
    before, after, label_before, label_after = (v if v is None else v.numpy() for v in vols)
    stages = []
    for stage, v, lab in (("before", before, label_before), ("after", after, label_after)):
        v = v.with_array(v.array[..., 0]) if v.array.ndim == 4 else v
        stages.append((stage, v, lab, _window(np.asarray(v.array))))
    lesions = [(np.asarray(c, dtype=np.float64), float(d)) for c, d in lesions]
    label = label_before if label_before is not None else label_after
    targets, hidden = _targets(before, label, lesions, max_targets)
    gap, cap, btitle, mx, my = 4, 14, 18, 20, 14  # pixels
    block_w, block_h = 3 * panel + 2 * gap, btitle + 2 * (cap + panel) + gap
    per_row = 1 if len(targets) == 1 else 2  # targets side by side
    W = per_row * block_w + (per_row - 1) * 4 * gap + 2 * gap
    more = f"{hidden} more not shown" if hidden else ""
    marks = [m for m, on in (("label outlined", label is not None), ("lesions circled in red",
                                                                      bool(lesions))) if on]  # fmt: skip
    legend = wrap_parts(  # (wrapped to the picture's width: one target's is 664 pixels)
        [f"before {_describe(before)}  ->  after {_describe(after)}", *([more] if more else []),
         "radiological views: patient's left on the image's right (axial, coronal)",
         "anterior on the left (sagittal)", *marks], W - 2 * gap,
    )  # fmt: skip
    head = 20 + 15 * len(legend) + 2
    H = head + -(-len(targets) // per_row) * (block_h + 2 * gap)
    pic, panels = np.zeros((H, W, 3), np.uint8), []
    for t, (tname, points) in enumerate(targets):
        bx = gap + (t % per_row) * (block_w + 4 * gap)
        by = head + (t // per_row) * (block_h + 2 * gap)
        stamp(pic, tname, bx, by + 3, size=8, colour=WHITE)
        for r, (stage, vol, lab, win) in enumerate(stages):
            for c, view in enumerate(VIEWS):
                va = view_axes(vol.affine, view)
                rgb, k, inside = _panel(
                    vol, lab, win, va, points[view], lesions, (panel - 2 * mx, panel - 2 * my)
                )
                px = bx + c * (panel + gap)
                py = by + btitle + r * (cap + panel) + cap
                h, w = rgb.shape[:2]
                x0, y0 = px + (panel - w) // 2, py + (panel - h) // 2
                pic[y0 : y0 + h, x0 : x0 + w] = rgb
                panels.append(_Panel(stage, tname, va, k, inside, (x0, y0, w, h)))
                note = f" (oblique {va.tilt_deg:.0f}°)" if va.tilt_deg > 1 else ""
                note += "" if inside else ": off this grid"
                stamp(pic, f"{stage} {view}{note}", px, py - 2, va="bottom", colour=GREY)
                L = va.letters
                for txt, x, y, ha, vaa in (
                    (L["left"], x0 - 3, y0 + h / 2, "right", "center"),
                    (L["right"], x0 + w + 3, y0 + h / 2, "left", "center"),
                    (L["top"], x0 + w / 2, y0 - 2, "center", "bottom"),
                    (L["bottom"], x0 + w / 2, y0 + h + 2, "center", "top"),
                ):
                    stamp(pic, txt, x, y, ha, vaa, size=9, colour=YELLOW, bold=True)
    stamp(pic, title or "QC", gap, 3, size=10, colour=WHITE)
    for n, line in enumerate(legend):
        stamp(pic, line, gap, 20 + 15 * n)
    return pic, panels


def qc_figure(
    before: Volume,
    after: Volume,
    path: str,
    label_before: Volume | None = None,
    label_after: Volume | None = None,
    lesions=(),
    title: str = "",
    max_targets: int = 4,
) -> str:
    """Write a QC PNG: views through each lesion before (top row) and after (bottom row).

    Parameters
    ----------
    before, after : Volume
        The input volume and the converted one (any grids; each is shown in the radiological
        convention with orientation letters computed from its own affine).
    path : str
        The PNG to write (atomically).
    label_before, label_after : Volume, optional
        Label maps on each grid, outlined (a colour per value). Without lesions, the views go
        through each label value's largest extent (per view, the slice with the most voxels).
    lesions : sequence of (center_ras_mm, diameter_mm)
        Each is a target (views through its centre) and is circled on every view it crosses.
    title : str
        Shown at the top (e.g. the output name).
    max_targets : int
        Lesions (or label values) shown at most; the header says how many more there are.

    Returns
    -------
    str
        ``path``.
    """
    from PIL import Image  # matplotlib's own dependency

    from .io import atomic_write

    pic, _ = qc_render(before, after, label_before, label_after, lesions, title, max_targets)
    with atomic_write(path) as tmp:
        Image.fromarray(pic).save(tmp, format="PNG", compress_level=1)
    return path
