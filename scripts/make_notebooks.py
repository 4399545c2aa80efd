"""Write notebooks/*.ipynb from the cell sources below (outputs stripped; CI executes them).

    python scripts/make_notebooks.py

Axis order everywhere: NIfTI's (i, j, k) (``Volume.array``, shapes, spacings, ``center_voxel``).
Slices are drawn as radiologists view them (``SHOW`` below): reoriented to RAS with flips and
transposes only (no interpolation), patient right on the image left (``medproc.qc``'s convention).
"""

import os

import nbformat as nbf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = """import os, sys, time
ROOT = os.path.abspath("..") if os.path.basename(os.getcwd()) == "notebooks" else os.getcwd()
sys.path.insert(0, ROOT)
os.chdir(ROOT)
import numpy as np
import matplotlib.pyplot as plt
%matplotlib inline
import medproc"""

SHOW_MD = (
    "`vol.array` is indexed (i, j, k), NIfTI's order; for a DICOM series i is the column, j the row "
    "and k the slice, so `vol.array[:, :, k]` is slice k **transposed** (columns x rows). To draw a "
    "slice as radiologists look at it, `show` below reorients the array to RAS with flips and "
    "transposes only (no interpolation), transposes the slice so that anterior (or superior) is "
    "up, and puts the patient's right on the image left (sagittal: anterior on the left), the "
    "convention `medproc.qc` draws in. Lesions `(centre RAS mm, diameter mm)` are circled (4 mm "
    "outside their edge) where the slice cuts them; `contours` outlines label maps on the "
    "volume's grid."
)
SHOW = '''from matplotlib.patches import Ellipse
from nibabel.orientations import apply_orientation, inv_ornt_aff, io_orientation

VIEWS = {"axial": 2, "coronal": 1, "sagittal": 0}                  # the RAS axis a view holds fixed
EDGES = {"axial": "RLPA", "coronal": "RLIS", "sagittal": "APIS"}   # image left, right, bottom, top

def ras(vol, array=None):
    """vol's array (or another array on vol's grid) in (R, A, S) index order, and its affine."""
    arr = np.asarray(vol.array if array is None else array)
    ornt = io_orientation(vol.affine)
    return apply_orientation(arr, ornt), vol.affine @ inv_ornt_aff(ornt, arr.shape)

def show(ax, vol, view="axial", at=None, lesions=(), contours=(), window=(-1000, 400), title=None, zoom=None):
    """The `view` slice of `vol` through the RAS point `at` (mm; default the centre), radiological;
    `zoom` (mm): show only +-zoom around `at`."""
    data, aff = ras(vol)
    inv = np.linalg.inv(aff)
    at = vol.voxel_to_world((np.array(vol.shape) - 1) / 2) if at is None else np.asarray(at, float)
    at_idx = inv[:3, :3] @ at + inv[:3, 3]                         # fractional (R, A, S) index of `at`
    c = np.clip(np.round(at_idx).astype(int), 0, np.array(data.shape) - 1)
    fixed = VIEWS[view]
    u, v = [a for a in range(3) if a != fixed]                    # image x, image y (RAS axes)
    sl = tuple(int(c[a]) if a == fixed else slice(None) for a in range(3))
    sp = np.sqrt((aff[:3, :3] ** 2).sum(0))
    ax.imshow(data[sl].T, cmap="gray", vmin=window[0], vmax=window[1], origin="lower",
              aspect=sp[v] / sp[u], interpolation="nearest")
    ax.set_facecolor("black")                                     # outside the volume (zoom)
    for arr, color in contours:
        m = ras(vol, arr)[0][sl].T > 0
        if m.any():
            ax.contour(m, levels=[0.5], colors=color, linewidths=1.2)
    for centre, diam in lesions:
        ijk = inv[:3, :3] @ np.asarray(centre, float) + inv[:3, 3]
        d = (ijk[fixed] - c[fixed]) * sp[fixed]                  # mm from the slice to the centre
        if abs(d) < diam / 2:
            r = np.sqrt((diam / 2) ** 2 - d * d) + 4.0            # the cut's radius, plus 4 mm
            ax.add_patch(Ellipse((ijk[u], ijk[v]), 2 * r / sp[u], 2 * r / sp[v], fill=False,
                                 edgecolor="red", linewidth=1.2))
    if zoom:            # x limits high -> low: patient right on the image left (sagittal: anterior left)
        ax.set_xlim(at_idx[u] + zoom / sp[u], at_idx[u] - zoom / sp[u])
        ax.set_ylim(at_idx[v] - zoom / sp[v], at_idx[v] + zoom / sp[v])
    else:
        ax.invert_xaxis()   # patient right on the image left (sagittal: anterior on the left)
    for (x, y), t in zip(((0.03, 0.5), (0.97, 0.5), (0.5, 0.03), (0.5, 0.97)), EDGES[view]):
        ax.text(x, y, t, transform=ax.transAxes, color="yellow", ha="center", va="center", fontsize=9,
                bbox=dict(facecolor="black", alpha=0.6, pad=1, linewidth=0))
    ax.set_title(title if title is not None else f"{view}, RAS index {c[fixed]}", fontsize=9)
    ax.set_xticks([]); ax.set_yticks([])'''

NOTEBOOKS = {
    "01_explore_dataset.ipynb": [
        (
            "md",
            "# Explore a dataset\n\nWhat `medproc inspect` shows, from Python: the series in a folder, their geometry and "
            "every warning; then orthogonal slices with a CT window/level and the annotated lesions.\n\n"
            "Shapes, spacings and orientation codes are in NIfTI's axis order (i, j, k): for DICOM "
            "(columns, rows, slices).",
        ),
        ("code", SETUP),
        (
            "code",
            """from medproc.inspect import inspect_paths
for e in inspect_paths("sample_data"):
    print(f"{e.kind:6s} {e.modality:3s} {'x'.join(map(str, e.shape)):12s} {str(e.spacing):22s} {e.orientation}  {e.series or e.source}")""",
        ),
        (
            "md",
            "A series with problems: a gantry tilt (a warning with the numbers) and a missing slice "
            "(an error naming the files), made by the sample-data generator. `grid_affine` takes the "
            "shape `(columns, rows, slices)` and the spacing `(column, row, slice step)` in mm.",
        ),
        (
            "code",
            """import tempfile
from medproc.sample_data import ct_phantom, grid_affine, write_dicom_series, make_broken
scratch = tempfile.TemporaryDirectory()  # removed when the kernel ends
tmp = scratch.name
shape, spacing = (64, 64, 20), (2.0, 2.0, 2.5)          # (i, j, k): 64 x 64 pixels, 20 slices
aff = grid_affine(shape, spacing, (-64, -64, -25), tilt_deg=15)
img, _ = ct_phantom(shape, aff, [])
write_dicom_series(f"{tmp}/tilted", medproc.Volume(img, aff), "1.2.3.4", gantry_tilt=15)
make_broken(f"{tmp}/broken")
for e in inspect_paths(tmp):
    print(e.source, "->", e.error or e.warnings)""",
        ),
        (
            "md",
            "Compressed series: `inspect` says which decoder each takes (the GPU only for encodings "
            "proven bit-exact there, and only with `device=gpu`); the CPU decodes in a process pool.",
        ),
        (
            "code",
            """aff2 = grid_affine(shape, spacing, (-64, -64, -25))
img2, _ = ct_phantom(shape, aff2, [])
write_dicom_series(f"{tmp}/j2k", medproc.Volume(img2, aff2), "1.2.3.5", signed=True,
                   transfer_syntax="1.2.840.10008.1.2.4.90")   # JPEG 2000 lossless
for e in inspect_paths(f"{tmp}/j2k"):
    print(e.transfer_syntax, "->", e.decode)
back = medproc.load(f"{tmp}/j2k", workers=2)
print(back.shape, "lossless:", np.array_equal(back.array, img2))""",
        ),
        ("md", "## Looking at slices\n\n" + SHOW_MD),
        ("code", SHOW),
        (
            "code",
            """from medproc.annotations import read_luna_csv
vol = medproc.load("sample_data/dicom/ct_axial")
print(vol, vol.meta["warnings"])
lesions = read_luna_csv("sample_data/lesions.csv", series=vol.meta["series_uid"])
marks = list(zip(lesions.centers, lesions.diameters))
for les in lesions.on_grid(vol.affine, vol.shape):
    ijk = np.round(les["center_voxel"]).astype(int)
    print(les["id"], "centre voxel (i, j, k)", les["center_voxel"], "HU there:", vol.array[tuple(ijk)])
fig, ax = plt.subplots(1, 3, figsize=(13, 4.5))
for a, view in zip(ax, VIEWS):
    show(a, vol, view, at=lesions.centers[0], lesions=marks)
fig.suptitle("ct_axial through lesion 1 (window -1000..400 HU); lesions circled in red")
plt.show()""",
        ),
        (
            "md",
            "The same axial slice straight from the array: this series is LPS (i -> patient left, "
            'j -> posterior), so `vol.array[:, :, k].T` drawn with the default `origin="upper"` is '
            "already the radiological view. That holds for LPS data only; `show` works for any "
            "orientation (here the same volume resampled to RAS, and the oblique series).",
        ),
        (
            "code",
            """k = int(round(lesions.on_grid(vol.affine, vol.shape)[0]["center_voxel"][2]))
ras_vol = medproc.resample(vol, orientation="RAS")             # same spacing, axes flipped to R, A, S
obl = medproc.load("sample_data/dicom/ct_oblique")
fig, ax = plt.subplots(1, 4, figsize=(16, 4.5))
ax[0].imshow(vol.array[:, :, k].T, cmap="gray", vmin=-1000, vmax=400)
ax[0].set_title(f"vol.array[:, :, {k}].T (LPS)", fontsize=9); ax[0].axis("off")
show(ax[1], vol, "axial", at=lesions.centers[0], lesions=marks, title="show(vol)")
show(ax[2], ras_vol, "axial", at=lesions.centers[0], lesions=marks, title=f"show(resampled to {ras_vol.orientation})")
show(ax[3], obl, "axial", at=lesions.centers[0], lesions=marks, title="show(ct_oblique), 15 degrees oblique")
plt.show()""",
        ),
    ],
    "02_resampling_and_annotations.ipynb": [
        (
            "md",
            "# Resampling and annotations\n\nResample to 1.5 mm RAS with one plan per volume, check the "
            "voxels against SimpleITK, and follow the lesions of `sample_data/lesions.csv` (world LPS) "
            "through resampling, flips and rotation. CPU against GPU when a GPU is present.\n\n"
            "Everything is in NIfTI's axis order (i, j, k): shapes, spacings, `center_voxel`.",
        ),
        ("code", SETUP),
        ("code", SHOW),
        (
            "code",
            """from medproc.annotations import read_luna_csv
vol = medproc.load("sample_data/dicom/ct_oblique")
lesions = read_luna_csv("sample_data/lesions.csv", series=vol.meta["series_uid"])
marks = list(zip(lesions.centers, lesions.diameters))
out = medproc.resample(vol, spacing=1.5, orientation="RAS")
print(vol.orientation, vol.spacing, vol.shape, "->", out.orientation, out.spacing, out.shape)
for les in lesions.on_grid(out.affine, out.shape):
    line = f"{les['id']}  voxel (i, j, k) {np.round(les['center_voxel'], 1)}  inside {les['inside']}"
    if les["inside"]:   # affine @ center_voxel == the lesion's RAS centre; the voxel there is lesion
        line += f"  HU there {out.array[tuple(np.round(les['center_voxel']).astype(int))]:.0f}"
    print(line)""",
        ),
        (
            "md",
            "The oblique slab stops above the second lesion on purpose (its k index is negative): "
            "a lesion off the grid is kept and flagged `inside False`, never dropped, and "
            '`medproc convert --annotations` warns about it ("1 of 2 lesion(s) lie outside the '
            'image"), as it would for an annotation table of another image.',
        ),
        (
            "md",
            "`qc_figure` writes the PNG that `medproc convert --qc` writes (views through each lesion, "
            "before and after). It draws without pyplot: the notebook's backend and figures are left "
            "alone, and the plots after it still show.",
        ),
        (
            "code",
            """import tempfile
from medproc.qc import qc_figure
from IPython.display import Image, display
scratch = tempfile.TemporaryDirectory()  # removed when the kernel ends
png = os.path.join(scratch.name, "qc.png")
display(Image(qc_figure(vol, out, png, lesions=marks, title="before / after")))""",
        ),
        (
            "code",
            """fig, ax = plt.subplots(2, 3, figsize=(13, 8.5))
for row, (v, name) in enumerate(((vol, "source (oblique)"), (out, "1.5 mm RAS"))):
    for a, view in zip(ax[row], VIEWS):
        show(a, v, view, at=lesions.centers[0], lesions=marks, title=f"{name} {view}")
fig.suptitle("through lesion 1, before and after resampling (after the QC cell: plots still work)")
plt.show()""",
        ),
        (
            "md",
            "Voxels against SimpleITK's ResampleImageFilter on the grid medproc chose. "
            "`sitk.GetArrayFromImage` is (z, y, x): `.transpose(2, 1, 0)` makes it (i, j, k).",
        ),
        (
            "code",
            """import SimpleITK as sitk
from medproc.io.sitk_io import to_sitk
f = sitk.ResampleImageFilter()
f.SetReferenceImage(to_sitk(medproc.Volume(np.zeros(out.shape, np.float32), out.affine)))
f.SetInterpolator(sitk.sitkLinear); f.SetOutputPixelType(sitk.sitkFloat32)
ref = sitk.GetArrayFromImage(f.Execute(to_sitk(vol.with_array(vol.array.astype(np.float32))))).transpose(2, 1, 0)
assert ref.shape == out.shape
inner = (slice(3, -3),) * 3
print("relative L2 difference in the interior:", np.linalg.norm((out.array - ref)[inner]) / np.linalg.norm(ref[inner]))""",
        ),
        (
            "md",
            "Augmentation moves voxels and lesions with the same matrix: a flip of axis k (superior <-> "
            "inferior) and a 20-degree rotation about axis i, composed with the resampling into one "
            "plan and run once by the engine. `plan.lesions_on_grid` gives each lesion's voxel (i, j, k) "
            "on the augmented grid, which is RAS: an axial slice is `aug[:, :, k]`.",
        ),
        (
            "code",
            """from medproc.plan import flip_map, affine_map
from medproc.pipeline import Engine, Graph, Job
plan = medproc.make_plan(vol.shape, vol.affine, medproc.Spec(spacing=1.5, orientation="RAS"))
plan = plan.augmented(flip_map(plan.out_shape, [2]) @ affine_map(plan.out_shape, [1.5] * 3, rotate_deg=(20, 0, 0)))
(aug,), = Engine("cpu").run([Job(vol.array, plan)], Graph())
for p in plan.lesions_on_grid(lesions):
    if p["inside"]:
        print(p["id"], "voxel (i, j, k)", np.round(p["center_voxel"], 1), "HU there", aug[tuple(np.round(p["center_voxel"]).astype(int))].round())
panels = [(out.array, lesions.on_grid(out.affine, out.shape), "resampled: out.array"),
          (aug, plan.lesions_on_grid(lesions), "flipped + rotated 20 degrees: aug")]
fig, ax = plt.subplots(1, 2, figsize=(10, 5))
for a, (arr, pts, name) in zip(ax, panels):
    k = int(round(next(p for p in pts if p["inside"])["center_voxel"][2]))   # axial slice through a lesion
    a.imshow(arr[:, :, k].T, cmap="gray", vmin=-1000, vmax=400, origin="lower")  # RAS grid: rows j (A up), columns i
    for p in pts:
        i, j, kk = p["center_voxel"]
        r = p["diameter_mm"] / 2 / 1.5                                       # radius in 1.5 mm voxels
        if p["inside"] and abs(kk - k) < r:                                  # circled 4 mm outside its edge
            a.add_patch(plt.Circle((i, j), np.sqrt(r * r - (kk - k) ** 2) + 4 / 1.5, fill=False, color="r", lw=1.2))
    a.invert_xaxis()                                                         # patient right on the image left
    a.set_title(f"{name}[:, :, {k}].T", fontsize=9); a.axis("off")
fig.suptitle("lesion markers (red) from plan.lesions_on_grid: on their lesions after the augmentation")
plt.show()""",
        ),
        (
            "code",
            """from medproc.pipeline import gpu_available
if gpu_available():
    g = medproc.resample(vol, spacing=1.5, orientation="RAS", device="gpu")
    print("max |CPU - GPU| =", np.abs(g.array - out.array).max())
else:
    print("no GPU here: the GPU comparison runs in tests (-m gpu) on the H200")""",
        ),
    ],
    "03_training_with_monai.ipynb": [
        (
            "md",
            "# Training with MONAI through medproc's loader\n\n`PatchLoader` yields MONAI batches (MetaTensors "
            "(B, 1, i, j, k) with affines); MONAI's `UNet` and `DiceCELoss` train on them unchanged "
            "(`examples/train_monai.py`). 100 steps on a CPU (seconds to a minute) with the two bundled "
            "cases: enough for the network to find the lesions it was trained on. The prediction is shown "
            "on a case it was trained on: this demonstrates the plumbing (patches, inference, inversion "
            "to the source grid), not generalisation.",
        ),
        ("code", SETUP),
        ("code", SHOW),
        (
            "code",
            """sys.path.insert(0, os.path.join(ROOT, "examples"))
import tempfile
import train_monai
scratch = tempfile.TemporaryDirectory()  # removed when the kernel ends
work = scratch.name
t0 = time.time()
net, losses = train_monai.train(steps=100, device="cpu", cache_dir=os.path.join(work, "cache"), lr=3e-3)
print("trained %d steps in %.0f s; loss first 5: %.3f  last 5: %.3f" % (len(losses), time.time() - t0, np.mean(losses[:5]), np.mean(losses[-5:])))
plt.figure(figsize=(6, 3))
plt.plot(losses); plt.xlabel("step"); plt.ylabel("DiceCE loss"); plt.title("MONAI UNet on medproc batches")
plt.show()""",
        ),
        (
            "md",
            "Sliding-window inference on the 2 mm RAS grid (a MONAI `Compose` of medproc's `LoadVolumed` and "
            "`Resampled` with MONAI's `ScaleIntensityRanged`), then MONAI's `Invertd` maps the prediction "
            "back through that Compose onto the source image's grid (same shape and affine as the file), "
            "where it is compared with the label.",
        ),
        (
            "code",
            """case = train_monai.datalist()[0]
d, back = train_monai.infer_and_invert(net, case, os.path.join(work, "pred.nii.gz"))
src, label = medproc.load(case["image"]), medproc.load(case["label"])
print("prediction in the source geometry:", back.shape == src.shape, np.allclose(back.affine, src.affine))
pred, truth = back.array > 0, label.array > 0
print("Dice on the source grid: %.2f  (predicted %d voxels, label %d, overlap %d)"
      % (2 * (pred & truth).sum() / (pred.sum() + truth.sum()), pred.sum(), truth.sum(), (pred & truth).sum()))""",
        ),
        (
            "code",
            """ids = [n for n in np.unique(label.array) if n]
fig, ax = plt.subplots(len(ids), 3, figsize=(13, 4.3 * len(ids)), squeeze=False)
for row, n in enumerate(ids):
    centre = src.voxel_to_world(np.argwhere(label.array == n).mean(0))   # RAS centre of lesion n
    for a, view in zip(ax[row], VIEWS):
        show(a, src, view, at=centre, contours=[(label.array, "lime"), (back.array, "red")],
             title=f"lesion {n}, {view} (+-40 mm)", zoom=40)
fig.suptitle("prediction (red) and label (green) on the source grid")
plt.show()""",
        ),
    ],
    "04_throughput.ipynb": [
        (
            "md",
            "# Throughput\n\nFirst a few seconds of measurement on the machine running this notebook (CPU, small "
            "sizes), then the benchmark results recorded on H200 nodes in `docs/results/` (commands in "
            "`docs/benchmarks.md`).",
        ),
        ("code", SETUP),
        (
            "code",
            """from medproc.sample_data import Lesion, ct_phantom, grid_affine
shape, spacing = (256, 256, 80), (1.0, 1.0, 2.5)          # (i, j, k) = (columns, rows, slices)
aff = grid_affine(shape, spacing, (-127.5, -107.5, -100.0))
img, _ = ct_phantom(shape, aff, [Lesion((-60.0, -10.0, 0.0), 14.0)])
vol = medproc.Volume(img, aff)
print(vol, f"{img.nbytes / 1e6:.0f} MB, {os.cpu_count()} CPU cores")

def best(fn, repeat=3):
    fn()                                                  # warm-up (DALI builds its pipeline once)
    times = []
    for _ in range(repeat):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)""",
        ),
        (
            "md",
            "Resample to 1.5 mm: `medproc.resample` (DALI's CPU backend), SimpleITK's "
            "`ResampleImageFilter` onto the same grid, and MONAI's `Spacing` (its own grid rule), "
            "all linear, float32 out.",
        ),
        (
            "code",
            """import SimpleITK as sitk, torch
from monai.data import MetaTensor
from monai.transforms import Spacing
from medproc.io.sitk_io import resample_filter, to_sitk

out = medproc.resample(vol, spacing=1.5, device="cpu")
f = resample_filter(out.affine, out.shape)                      # linear, float32, medproc's grid
s_img = to_sitk(vol)
ref = sitk.GetArrayFromImage(f.Execute(s_img)).transpose(2, 1, 0)  # (z, y, x) -> (i, j, k)
inner = (slice(2, -2),) * 3
print(f"{vol.shape} -> {out.shape}; medproc vs SimpleITK relative L2 (interior):",
      "%.1e" % (np.linalg.norm((out.array - ref)[inner]) / np.linalg.norm(ref[inner])))
spacing_tf = Spacing(pixdim=1.5, mode="bilinear")
mt = MetaTensor(torch.from_numpy(np.ascontiguousarray(img))[None], affine=torch.as_tensor(aff))
t = {"medproc (DALI CPU)": best(lambda: medproc.resample(vol, spacing=1.5, device="cpu")),
     f"SimpleITK ({sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()} threads)": best(lambda: f.Execute(s_img)),
     "MONAI Spacing": best(lambda: spacing_tf(mt), repeat=2)}
t0 = t["medproc (DALI CPU)"]
for name, s in t.items():
    print(f"{name:24s} {s * 1e3:7.0f} ms   time / medproc's: {s / t0:5.2f}")""",
        ),
        (
            "md",
            "A small `PatchLoader` run on the bundled cases: 32^3 training patches (half centred on a "
            "lesion; crop + flips + intensity jitter as one resampling per patch), batches of 4, made "
            "in the engine's background thread.",
        ),
        (
            "code",
            """import glob, tempfile
from medproc.monai import PatchLoader
from medproc.monai.loader import Augment, PosNeg
dl = [{"image": p, "label": p.replace("images", "labels")} for p in sorted(glob.glob("sample_data/nifti/images/*.nii.gz"))]
spec = medproc.Spec(spacing=2.0, orientation="RAS", intensity=medproc.Intensity(clip=(-1000, 400), scale=(0, 1)))
scratch = tempfile.TemporaryDirectory()  # removed when the kernel ends
t0 = time.perf_counter()
loader = PatchLoader(dl, spec, (32, 32, 32), batch_size=4, sampling=PosNeg(pos=1, neg=1, num_samples=16),
                     augment=Augment(flip_prob=0.5, scale_intensity_prob=1.0, intensity_factors=0.05),
                     cache_dir=scratch.name)                      # a fresh cache: built here
cache_s = time.perf_counter() - t0
next(iter(loader))                                               # warm-up: pipelines built
n, t0 = 0, time.perf_counter()
for _ in range(3):
    for batch in loader:
        n += batch["image"].shape[0]
print(f"cache built in {cache_s:.2f} s (once per spec), then {n / (time.perf_counter() - t0):.0f} patches/s "
      f"({n} patches of {tuple(batch['image'].shape[2:])})")""",
        ),
        ("md", "## Recorded results (H200 nodes and a 2-core CPU box)"),
        (
            "code",
            """import json
def bars(path, title, key="volumes_per_s"):
    r = json.load(open(path))["methods"]
    names = [n for n in r if key in r[n]]
    vals = [r[n][key] for n in names]
    plt.figure(figsize=(8, 0.5 + 0.45 * len(names)))
    plt.barh(names, vals, color=["tab:green" if n.startswith("medproc") else "tab:gray" for n in names])
    plt.xlabel(key.replace("_", " ")); plt.title(title); plt.gca().invert_yaxis()
    plt.show()
bars("docs/results/resample_h200.json", "resample to 1.5 mm, 8 CT volumes, H200")
bars("docs/results/resample_cpu2core_6d6202a.json", "resample to 1.5 mm, 2 CT volumes, 2-core CPU")
bars("docs/results/loader_h200.json", "96^3 training patches, H200", key="samples_per_s")""",
        ),
        (
            "md",
            "Conversion is not plotted here: its early in-process rounds compared unequal gzip work "
            "(medproc writes igzip level 1, ITK zlib's default: larger files, written faster). At "
            "equal work (uncompressed `.nii`, whole processes) medproc is slower than SimpleITK at "
            "its best for 1 to 4 series and faster for 16 on 2 cores: `docs/benchmarks.md`, "
            '"Equal work".',
        ),
        (
            "md",
            "Decoding compressed CT (512², slices/s): 16 CPU cores (pylibjpeg) against the GPU for the "
            "encodings the support table sends there. JPEG lossless was measured on the GPU too but is not "
            "exact on every file, so it decodes on the CPU (`docs/benchmarks.md`).",
        ),
        (
            "code",
            """from medproc.pipeline.decode import support_table
r = json.load(open("docs/results/decode_h200.json"))["syntaxes"]
proven = {k.split("|")[0] for k in support_table()["entries"]}
uids = {"htj2k": "1.2.840.10008.1.2.4.201", "j2k": "1.2.840.10008.1.2.4.90", "j2k-signed": "1.2.840.10008.1.2.4.90",
        "jpegll": "1.2.840.10008.1.2.4.70", "jpegll-signed": "1.2.840.10008.1.2.4.70"}
names = list(r)
y = np.arange(len(names))
plt.figure(figsize=(8, 3))
plt.barh(y - 0.2, [r[n]["cpu_slices_per_s"] for n in names], 0.4, label="CPU, 16 cores", color="tab:gray")
plt.barh(y + 0.2, [r[n].get("gpu_slices_per_s", 0) if uids[n] in proven else 0 for n in names], 0.4,
         label="GPU (used)", color="tab:green")
plt.yticks(y, names); plt.xlabel("slices/s"); plt.legend(); plt.gca().invert_yaxis()
plt.title("decode 512² CT slices, H200 node")
plt.show()""",
        ),
    ],
}


def main():
    os.makedirs(os.path.join(ROOT, "notebooks"), exist_ok=True)
    for name, cells in NOTEBOOKS.items():
        nb = nbf.v4.new_notebook()
        nb.cells = [
            nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src)
            for kind, src in cells
        ]
        for n, cell in enumerate(nb.cells):  # stable ids: regenerating changes nothing
            cell.id = f"{name[:2]}-{n:02d}"
        nb.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        nbf.write(nb, os.path.join(ROOT, "notebooks", name))
        print("wrote notebooks/" + name)


if __name__ == "__main__":
    main()
