"""QC pictures: letters and sides right on RAS, LPS, permuted and oblique grids, views through
each lesion (or the label's largest extent), no global matplotlib state, and fast."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import medproc
from medproc.annotations import read_luna_csv
from medproc.qc import qc_figure, qc_render, view_axes
from medproc.sample_data import ANATOMY, grid_affine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COS, SIN = np.cos(np.radians(20)), np.sin(np.radians(20))
#: grids (LPS origin, DICOM IOP): axial LPS, RAS, sagittal acquisition (PIR-like), oblique
GRIDS = {
    "LPS": lambda: grid_affine((64, 60, 56), (2.0, 2.1, 2.2), (-63, -62, -60)),
    "RAS": lambda: np.diag([2.0, 2.1, 2.2, 1.0]) @ _shift((-31.5, -29.5, -30.5)),
    "sagittal": lambda: grid_affine((60, 56, 64), (2.1, 2.2, 2.0), (60, -60, 62), iop=(0, 1, 0, 0, 0, -1)),
    "oblique": lambda: grid_affine((64, 64, 56), (2.0, 2.0, 2.2), (-63, -70, -50), iop=(1, 0, 0, 0, COS, SIN)),
}  # fmt: skip
OFFSET = np.array([-30.0, 25.0, 20.0])  # from the grid's centre: patient left, anterior, superior


def _shift(t):
    m = np.eye(4)
    m[:3, 3] = t
    return m


def _marker_volume(affine, shape):
    """Zeros with a 16 mm bright cube left, anterior and superior of the centre; and its centre."""
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1)
    w = ijk @ affine[:3, :3].T + affine[:3, 3]
    marker = affine[:3, :3] @ ((np.array(shape) - 1) / 2) + affine[:3, 3] + OFFSET
    cube = np.all(np.abs(w - marker) <= 8, axis=-1)
    return medproc.Volume(np.where(cube, 1000, 0).astype(np.int16), affine), marker


def _shape_for(name):
    return {"sagittal": (60, 56, 64), "oblique": (64, 64, 56)}.get(name, (64, 60, 56))


def _centroid(pic, box, select):
    x, y, w, h = box
    sub = pic[y : y + h, x : x + w].astype(int)
    yy, xx = np.nonzero(select(sub))
    assert len(xx), "nothing found in the panel"
    return xx.mean() / w, yy.mean() / h


def _white(p):
    return (p[..., 0] > 200) & (p[..., 1] > 200) & (p[..., 2] > 200)


def _yellow(p):
    return (p[..., 0] > 180) & (p[..., 1] > 150) & (p[..., 2] < 80)


def test_view_axes_letters_and_flips():
    ras = np.eye(4)
    lps = np.diag([-1.0, -1.0, 1.0, 1.0])
    for aff, col_flip in ((ras, True), (lps, False)):  # i -> R must be flipped to put L right
        va = view_axes(aff, "axial")
        assert (va.fixed, va.col, va.row, va.col_flip) == (2, 0, 1, col_flip)
        assert va.letters == {"left": "R", "right": "L", "top": "A", "bottom": "P"}
    assert view_axes(ras, "coronal").letters == {
        "left": "R",
        "right": "L",
        "top": "S",
        "bottom": "I",
    }
    assert view_axes(lps, "sagittal").letters == {
        "left": "A",
        "right": "P",
        "top": "S",
        "bottom": "I",
    }
    sag = view_axes(GRIDS["sagittal"](), "axial")  # a sagittal acquisition seen axially
    assert sag.fixed == 1 and sag.letters["right"] == "L" and sag.letters["top"] == "A"
    obl = view_axes(GRIDS["oblique"](), "axial")
    assert abs(obl.tilt_deg - 20) < 1e-6 and obl.letters["right"] == "L"
    assert obl.letters["top"] == "AI" and obl.letters["bottom"] == "PS"  # tilted planes say so
    with pytest.raises(ValueError, match="view must be one of"):
        view_axes(ras, "transverse")


@pytest.mark.parametrize("grid", list(GRIDS))
def test_marker_lands_where_the_letters_say(grid):
    """A cube on the patient's left, anterior and superior appears right/top (axial), right/top
    (coronal), left/top (sagittal) on every grid, before and after resampling to RAS, with the
    letters drawn beside each view; the views go through it (the target)."""
    vol, marker = _marker_volume(GRIDS[grid](), _shape_for(grid))
    after = medproc.resample(vol, spacing=1.5, orientation="RAS", interp="nearest")
    pic, panels = qc_render(vol, after, lesions=[(marker, 16.0)])
    assert len(panels) == 6 and {p.stage for p in panels} == {"before", "after"}
    for p in panels:
        assert p.inside
        cx, cy = _centroid(pic, p.box, _white)
        want = {"axial": ("L", "A"), "coronal": ("L", "S"), "sagittal": ("P", "S")}[p.axes.view]
        assert p.axes.letters["right"][0] == want[0] and p.axes.letters["top"][0] == want[1]
        if p.axes.view == "sagittal":
            assert cx < 0.5 and cy < 0.5, (grid, p.stage, cx, cy)  # anterior left, superior up
        else:
            assert cx > 0.5 and cy < 0.5, (grid, p.stage, p.axes.view, cx, cy)  # left on right
        x, y, w, h = p.box  # the letters are drawn: yellow right of the image and above it
        assert _yellow(pic[y : y + h, x + w : x + w + 18].astype(int)).sum() > 5
        assert _yellow(pic[y - 16 : y, x : x + w].astype(int)).sum() > 5


def _bundled(sample_data, series):
    v = medproc.load(os.path.join(sample_data, "dicom", series))
    les = read_luna_csv(os.path.join(sample_data, "lesions.csv"))[v.meta["series_uid"]]
    return v, list(zip(les.centers, les.diameters))


def test_phantom_marker_shows_a_flip(sample_data):
    """The bundled LPS series and its RAS conversion show the phantom's left marker plate on the
    image's right; an array flipped without its affine (a real bug) shows it on the left."""
    v, lesions = _bundled(sample_data, "ct_axial")
    after = medproc.resample(v, spacing=1.5, orientation="RAS")
    flipped = after.with_array(np.ascontiguousarray(after.array[::-1]))
    first = [lesions[0]]  # at z = 5 mm: the plate (z >= 0) is in the axial view
    assert first[0][0][2] >= ANATOMY["left_marker"]["z_min"]
    pic, panels = qc_render(v, flipped, lesions=first)
    sides = {}
    for p in panels:
        if p.axes.view == "axial":
            x, y, w, h = p.box
            sub = pic[y : y + h, x : x + w].astype(int)
            sides[p.stage] = (_white(sub[:, : w // 8]).sum(), _white(sub[:, -w // 8 :]).sum())
    assert sides["before"][1] > 20 and sides["before"][0] == 0  # plate right, nothing left
    assert sides["after"][0] > 20 and sides["after"][1] == 0  # the flip is visible


def test_a_lesion_off_the_grid_is_said_so(sample_data):
    """The oblique bundled series does not reach its second lesion (LUNA rows are per series
    UID): its views say so and stop at the nearest slice; the first lesion is on the grid."""
    v, lesions = _bundled(sample_data, "ct_oblique")
    pic, panels = qc_render(v, v, lesions=lesions)
    inside = {p.target.split(":")[0]: p.inside for p in panels}
    assert inside == {"lesion 1": True, "lesion 2": False}
    assert pic.shape[0] > 300 and pic.shape[1] > 600


def test_views_go_through_each_lesion_and_circle_it(sample_data):
    img = medproc.load(os.path.join(sample_data, "nifti", "images", "case002.nii.gz"))
    lab = medproc.load(os.path.join(sample_data, "nifti", "labels", "case002.nii.gz"))
    les = read_luna_csv(os.path.join(sample_data, "lesions.csv"))["case002"]
    out, out_lab = medproc.resample(img, spacing=1.5, orientation="RAS", label=lab)
    pic, panels = qc_render(img, out, lab, out_lab, lesions=list(zip(les.centers, les.diameters)))
    assert len(panels) == 2 * 6
    for n, target in enumerate(dict.fromkeys(p.target for p in panels), 1):
        assert target.startswith(f"lesion {n}:")
        for p in (p for p in panels if p.target == target):
            grid = lab if p.stage == "before" else out_lab
            plane = np.take(grid.array, p.index, axis=p.axes.fixed)
            assert (plane == n).sum() >= 3, (target, p.stage, p.axes.view)  # cuts the lesion
            x, y, w, h = p.box
            sub = pic[y : y + h, x : x + w].astype(int)
            red = (sub[..., 0] > 200) & (sub[..., 1] < 80) & (sub[..., 2] < 80)
            assert red.sum() >= 8  # circled


def test_without_lesions_views_go_through_the_labels_largest_extent(sample_data):
    img = medproc.load(os.path.join(sample_data, "nifti", "images", "case001.nii.gz"))
    lab = medproc.load(os.path.join(sample_data, "nifti", "labels", "case001.nii.gz"))
    out, out_lab = medproc.resample(img, spacing=1.5, orientation="RAS", label=lab)
    pic, panels = qc_render(img, out, lab, out_lab)
    assert {p.target.split(":")[0] for p in panels} == {"label 1", "label 2"}
    for p in panels:
        v = int(p.target.split(":")[0].split()[1])
        if p.stage == "before":
            others = tuple(a for a in range(3) if a != p.axes.fixed)
            n = (lab.array == v).sum(axis=others)
            ties = np.flatnonzero(n == n.max())  # (of equal slices, the one nearest the centroid)
            centroid = (n * np.arange(n.size)).sum() / n.sum()
            assert p.index == ties[np.argmin(np.abs(ties - centroid))]
        grid = lab if p.stage == "before" else out_lab
        assert (np.take(grid.array, p.index, axis=p.axes.fixed) == v).any()
    box = next(p.box for p in panels if p.target.startswith("label 1"))
    x, y, w, h = box
    sub = pic[y : y + h, x : x + w].astype(int)
    assert ((sub[..., 1] > 200) & (sub[..., 0] < 80) & (sub[..., 2] < 80)).sum() > 5  # lime


def test_a_label_with_a_flat_profile_is_viewed_through_its_middle_on_both_grids():
    """Of slices holding equally many label voxels the first was taken: the box's edge, which
    after resampling to 1.5 mm RAS lay one slice outside the label, so the 'after' row showed a
    label lost that was not (a prober's). The views go through the middle slice, on both
    grids."""
    shape = (96, 96, 24)
    aff = grid_affine(shape, (0.7, 0.7, 1.25), (-30.0, -30.0, -15.0))
    lab = np.zeros(shape, np.uint8)
    lab[40:50, 20:30, 5:12] = 1
    img = medproc.Volume(np.where(lab > 0, 100.0, 0.0).astype(np.float32), aff)
    lab = medproc.Volume(lab, aff)
    out, out_lab = medproc.resample(img, spacing=1.5, orientation="RAS", label=lab)
    pic, panels = qc_render(img, out, lab, out_lab)
    for p in panels:
        grid = lab if p.stage == "before" else out_lab
        others = tuple(a for a in range(3) if a != p.axes.fixed)
        on = np.flatnonzero(np.asarray(grid.array).sum(axis=others))
        assert on[0] < p.index < on[-1] or len(on) <= 2, (p.stage, p.axes.view, p.index, on)
        assert (np.take(grid.array, p.index, axis=p.axes.fixed) == 1).any()


def test_nan_voxels_kept_do_not_blank_the_picture():
    """One NaN column (--nan keep) made every panel black (a NaN display window) with an
    anonymous 'invalid value encountered in cast'. The window comes from the finite voxels
    and NaN is drawn in a colour of its own."""
    import warnings

    i, j, k = np.meshgrid(np.arange(40), np.arange(40), np.arange(12), indexing="ij")
    arr = ((i + j + 3 * k) * 15 - 1000).astype(np.float32)
    arr[15:25, 15:25, :] = np.nan  # (a column through the centre: every view crosses it)
    vol = medproc.Volume(arr, np.eye(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pic, panels = qc_render(vol, vol)
    for p in panels:
        x, y, w, h = p.box
        sub = pic[y : y + h, x : x + w].astype(int)
        nan = (sub[..., 0] == 0) & (sub[..., 1] == 160) & (sub[..., 2] == 255)
        assert nan.any() and (~nan).sum() > nan.sum()  # (the column, and the rest)
        assert sub[~nan][:, 0].std() > 10  # the finite voxels in grey levels, not one colour


def test_no_global_matplotlib_state_changes(sample_data, tmp_path):
    code = f"""
import sys, matplotlib
matplotlib.use("svg")
import matplotlib.pyplot as plt
plt.figure()
rc, backend = dict(matplotlib.rcParams), matplotlib.get_backend()
import medproc
from medproc.qc import qc_figure
v = medproc.load({os.path.join(sample_data, "dicom", "ct_axial")!r})
qc_figure(v, v, {str(tmp_path / "q.png")!r}, lesions=[((60.0, 10.0, 5.0), 14.0)])
assert matplotlib.get_backend() == backend == "svg", matplotlib.get_backend()
assert dict(matplotlib.rcParams) == rc
assert plt.get_fignums() == [1], plt.get_fignums()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
    import matplotlib.image as mpimg

    assert mpimg.imread(tmp_path / "q.png").shape[2] == 3


def test_qc_figure_writes_the_picture_fast(sample_data, tmp_path):
    v, lesions = _bundled(sample_data, "ct_axial")
    after = medproc.resample(v, spacing=1.5, orientation="RAS")
    path = str(tmp_path / "qc.png")
    qc_figure(v, after, path, lesions=lesions, title="ct_axial")  # first: imports, fonts
    t = time.perf_counter()
    assert qc_figure(v, after, path, lesions=lesions, title="ct_axial") == path
    assert time.perf_counter() - t < 1.0  # 0.03-0.06 s on 2 cores; bench/qc.py measures it
    import matplotlib.image as mpimg

    pic, _ = qc_render(v, after, lesions=lesions, title="ct_axial")
    np.testing.assert_array_equal((mpimg.imread(path)[..., :3] * 255).round(), pic)
    assert [f for f in os.listdir(tmp_path) if f != "qc.png"] == []  # atomic: no leftovers


def test_the_legend_names_only_the_marks_the_picture_has(sample_data, monkeypatch):
    """...and fits the picture: wrapped into lines no wider than it (one target's picture is
    three views wide)."""
    from medproc import _qc_text, qc

    said = []
    real = qc.stamp
    monkeypatch.setattr(
        qc, "stamp", lambda pic, text, *a, **k: said.append(text) or real(pic, text, *a, **k)
    )
    vol = medproc.load(os.path.join(sample_data, "nifti", "images", "case001.nii.gz"))
    lab = medproc.load(os.path.join(sample_data, "nifti", "labels", "case001.nii.gz"))

    def legend():
        start = next(i for i, t in enumerate(said) if t.startswith("before "))
        return said[start:]

    pic, _ = qc_render(vol, vol)
    text = "; ".join(legend())
    assert "radiological views" in text and "anterior on the left (sagittal)" in text
    assert "label outlined" not in text and "circled" not in text
    said.clear()
    pic, _ = qc_render(vol, vol, lab, lab, lesions=[((0.0, 0.0, 0.0), 10.0)], max_targets=1)
    lines = legend()
    text = "; ".join(lines)
    assert "label outlined" in text and "lesions circled in red" in text
    assert len(lines) > 1 and all(_qc_text.text_width(t) <= pic.shape[1] - 8 for t in lines)
