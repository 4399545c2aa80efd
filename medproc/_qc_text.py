"""Text on the QC pictures: each distinct string rendered once by matplotlib on a private
``Figure`` (Agg canvas: no pyplot, no global state) and blended into the numpy picture."""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["GREY", "WHITE", "YELLOW", "stamp", "text_width", "wrap_parts"]


@functools.lru_cache(maxsize=512)
def _text_mask(text: str, size: float, bold: bool) -> np.ndarray:
    """Coverage (uint8, tight box) of ``text`` at ``size`` points, rendered once by matplotlib
    on a private Figure with the Agg canvas (no pyplot, no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # a core dependency
    from matplotlib.figure import Figure

    w, h = int(size * 1.4 * max(1, len(text))) + 8, int(size * 3) + 8
    fig = Figure(figsize=(w / 100, h / 100), dpi=100)
    fig.patch.set_alpha(0)
    fig.text(4 / w, 0.5, text, fontsize=size, color="white", va="center", ha="left",
             fontweight="bold" if bold else "normal")  # fmt: skip
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    a = np.asarray(canvas.buffer_rgba())[..., 3]
    rows, cols = np.flatnonzero(a.any(1)), np.flatnonzero(a.any(0))
    if rows.size == 0:
        return np.zeros((1, 1), np.uint8)
    return a[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1].copy()


def stamp(pic, text, x, y, ha="left", va="top", size=7.0, colour=(255, 255, 255), bold=False):
    """Blend ``text`` into ``pic`` anchored at pixel (x, y) (``ha``/``va`` as in matplotlib)."""
    m = _text_mask(text, float(size), bold)
    h, w = m.shape
    x0 = int(round(x - {"left": 0, "center": w / 2, "right": w}[ha]))
    y0 = int(round(y - {"top": 0, "center": h / 2, "bottom": h}[va]))
    xa, ya, xb, yb = max(0, x0), max(0, y0), min(pic.shape[1], x0 + w), min(pic.shape[0], y0 + h)
    if xa < xb and ya < yb:
        a = m[ya - y0 : yb - y0, xa - x0 : xb - x0, None].astype(np.float32) / 255.0
        region = pic[ya:yb, xa:xb]
        region[:] = region * (1 - a) + np.asarray(colour, np.float32) * a


GREY, WHITE, YELLOW = (190, 190, 190), (255, 255, 255), (255, 230, 0)


def text_width(text: str, size: float = 7.0) -> int:
    """Pixels ``text`` takes on a picture at ``size`` points."""
    return _text_mask(text, float(size), False).shape[1]


def wrap_parts(parts: list[str], width: int, size: float = 7.0, sep: str = "; ") -> list[str]:
    """``parts`` joined by ``sep`` into lines no wider than ``width`` pixels (a part wider than
    that alone keeps a line of its own)."""
    lines: list[str] = []
    for part in parts:
        if lines and text_width(lines[-1] + sep + part, size) <= width:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return lines
