"""Write notebooks/*.ipynb from the cell sources below (outputs stripped; CI executes them).

    python scripts/make_notebooks.py
"""

import os

import nbformat as nbf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = """import os, sys
ROOT = os.path.abspath("..") if os.path.basename(os.getcwd()) == "notebooks" else os.getcwd()
sys.path.insert(0, ROOT)
os.chdir(ROOT)
import numpy as np
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
%matplotlib inline
import medproc"""

NOTEBOOKS = {
    "01_explore_dataset.ipynb": [
        ("md", "# Explore a dataset\n\nWhat `medproc inspect` shows, from Python: the series in a folder, their geometry and "
               "every warning; then orthogonal slices with a CT window/level."),
        ("code", SETUP),
        ("code", """from medproc.inspect import inspect_paths
for e in inspect_paths("sample_data"):
    print(f"{e.kind:6s} {e.modality:3s} {'x'.join(map(str, e.shape)):12s} {str(e.spacing):22s} {e.orientation}  {e.series or e.source}")"""),
        ("md", "A series with problems: a gantry tilt (a warning with the numbers) and a missing slice "
               "(an error naming the files), made by the sample-data generator."),
        ("code", """import tempfile
from medproc.sample_data import ct_phantom, grid_affine, write_dicom_series, make_broken
tmp = tempfile.mkdtemp()
aff = grid_affine((20, 64, 64), (2.5, 2.0, 2.0), (-64, -64, -25), tilt_deg=15)
img, _ = ct_phantom((20, 64, 64), aff, [])
write_dicom_series(f"{tmp}/tilted", medproc.Volume(img, aff), "1.2.3.4", gantry_tilt=15)
make_broken(f"{tmp}/broken")
for e in inspect_paths(tmp):
    print(e.source, "->", e.error or e.warnings)"""),
        ("md", "Compressed series: `inspect` says which decoder each takes (the GPU only for encodings "
               "proven bit-exact there, and only with `device=gpu`); the CPU decodes in a process pool."),
        ("code", """aff2 = grid_affine((20, 64, 64), (2.5, 2.0, 2.0), (-64, -64, -25))
img2, _ = ct_phantom((20, 64, 64), aff2, [])
write_dicom_series(f"{tmp}/j2k", medproc.Volume(img2, aff2), "1.2.3.5", signed=True,
                   transfer_syntax="1.2.840.10008.1.2.4.90")   # JPEG 2000 lossless
for e in inspect_paths(f"{tmp}/j2k"):
    print(e.transfer_syntax, "->", e.decode)
print("lossless:", np.array_equal(medproc.load(f"{tmp}/j2k", workers=2).array, img2))"""),
        ("code", """vol = medproc.load("sample_data/dicom/ct_axial")
print(vol, vol.meta["warnings"])
k, j, i = (np.array(vol.shape) // 2)
lo, hi = -1000, 400   # window/level for lung CT
fig, ax = plt.subplots(1, 3, figsize=(12, 4))
sp = vol.spacing
ax[0].imshow(vol.array[k], cmap="gray", vmin=lo, vmax=hi, aspect=sp[1] / sp[2]); ax[0].set_title("axial")
ax[1].imshow(vol.array[:, j, :], cmap="gray", vmin=lo, vmax=hi, aspect=sp[0] / sp[2], origin="lower"); ax[1].set_title("coronal")
ax[2].imshow(vol.array[:, :, i], cmap="gray", vmin=lo, vmax=hi, aspect=sp[0] / sp[1], origin="lower"); ax[2].set_title("sagittal")
for a in ax: a.axis("off")"""),
    ],
    "02_resampling_and_annotations.ipynb": [
        ("md", "# Resampling and annotations\n\nResample to 1.5 mm RAS with one plan per volume, check the "
               "voxels against SimpleITK, and follow the lesions of `sample_data/lesions.csv` (world LPS) "
               "through resampling, flips and rotation. CPU against GPU when a GPU is present."),
        ("code", SETUP),
        ("code", """from medproc.annotations import read_luna_csv
vol = medproc.load("sample_data/dicom/ct_oblique")
lesions = read_luna_csv("sample_data/lesions.csv", series=vol.meta["series_uid"])
out = medproc.resample(vol, spacing=1.5, orientation="RAS")
print(vol.orientation, vol.spacing, "->", out.orientation, out.spacing, out.shape)
for les in lesions.on_grid(out.affine, out.shape):
    print(les["id"], "voxel (i,j,k)", np.round(les["center_voxel"], 1), "inside", les["inside"])"""),
        ("code", """from medproc.qc import qc_figure
from IPython.display import Image
qc_figure(vol, out, "/tmp/qc_nb.png", lesions=list(zip(lesions.centers, lesions.diameters)), title="before / after")
Image("/tmp/qc_nb.png")"""),
        ("md", "Voxels against SimpleITK's ResampleImageFilter on the grid medproc chose:"),
        ("code", """import SimpleITK as sitk
from medproc.io.sitk_io import to_sitk
f = sitk.ResampleImageFilter()
f.SetReferenceImage(to_sitk(medproc.Volume(np.zeros(out.shape, np.float32), out.affine)))
f.SetInterpolator(sitk.sitkLinear); f.SetOutputPixelType(sitk.sitkFloat32)
ref = sitk.GetArrayFromImage(f.Execute(to_sitk(vol.with_array(vol.array.astype(np.float32)))))
inner = (slice(3, -3),) * 3
print("relative L2 difference in the interior:", np.linalg.norm((out.array - ref)[inner]) / np.linalg.norm(ref[inner]))"""),
        ("md", "Augmentation moves voxels and lesions with the same matrix:"),
        ("code", """from medproc.plan import flip_map, affine_map
from medproc.pipeline import Resampler
plan = medproc.make_plan(vol.shape, vol.affine, medproc.Spec(spacing=1.5, orientation="RAS"))
plan = plan.augmented(flip_map(plan.out_shape, [2]) @ affine_map(plan.out_shape, [1.5] * 3, rotate_deg=(20, 0, 0)))
aug = Resampler("cpu").run([vol.array], [plan])[0]
placed = plan.lesions_on_grid(lesions)
k = int(round(placed[0]["center_index"][0]))
plt.imshow(aug[k], cmap="gray", vmin=-1000, vmax=400)
for p in placed:
    if abs(p["center_index"][0] - k) < 3:
        plt.scatter(p["center_index"][2], p["center_index"][1], s=200, facecolors="none", edgecolors="r")
plt.title("flipped + rotated 20 degrees: lesions still on their lesions"); plt.axis("off")"""),
        ("code", """from medproc.pipeline import gpu_available
if gpu_available():
    g = medproc.resample(vol, spacing=1.5, orientation="RAS", device="gpu")
    print("max |CPU - GPU| =", np.abs(g.array - out.array).max())
else:
    print("no GPU here: the GPU comparison runs in tests (-m gpu) on the H200")"""),
    ],
    "03_training_with_monai.ipynb": [
        ("md", "# Training with MONAI through medproc's loader\n\n`PatchLoader` yields MONAI batches (MetaTensors "
               "(B, 1, i, j, k) with affines); MONAI's `UNet` and `DiceCELoss` train on them unchanged."),
        ("code", SETUP),
        ("code", """sys.path.insert(0, os.path.join(ROOT, "examples"))
import train_monai
net, losses = train_monai.train(steps=30, device="cpu", cache_dir="/tmp/medproc_nb_cache")
plt.plot(losses); plt.xlabel("step"); plt.ylabel("DiceCE loss"); plt.title("MONAI UNet on medproc batches")
print("first 5: %.3f  last 5: %.3f" % (np.mean(losses[:5]), np.mean(losses[-5:])))"""),
        ("code", """case = train_monai.datalist()[0]
d, back = train_monai.infer_and_invert(net, case, "/tmp/pred_nb.nii.gz")
src = medproc.load(case["image"])
print("prediction in the source geometry:", back.shape == src.shape, np.allclose(back.affine, src.affine))
k = int(np.argmax((medproc.load(case["label"]).array > 0).sum((1, 2))))
plt.imshow(src.array[k], cmap="gray", vmin=-1000, vmax=400)
plt.contour(back.array[k] > 0, colors="r"); plt.contour(medproc.load(case["label"]).array[k] > 0, colors="lime")
plt.title("prediction (red) and label (green), source grid"); plt.axis("off")"""),
    ],
    "04_throughput.ipynb": [
        ("md", "# Throughput\n\nThe benchmark results recorded in `docs/results/` (commands in `docs/benchmarks.md`)."),
        ("code", SETUP),
        ("code", """import json
def bars(path, title, key="volumes_per_s"):
    r = json.load(open(path))["methods"]
    names = list(r)
    vals = [r[n][key] for n in names]
    plt.figure(figsize=(8, 0.5 + 0.45 * len(names)))
    plt.barh(names, vals, color=["tab:green" if n.startswith("medproc") else "tab:gray" for n in names])
    plt.xlabel(key.replace("_", " ")); plt.title(title); plt.gca().invert_yaxis()
bars("docs/results/resample_h200.json", "resample to 1.5 mm, 8 CT volumes, H200")
bars("docs/results/convert_cpu2core.json", "DICOM -> 1.5 mm -> .nii.gz, 2-core CPU")
bars("docs/results/convert_h200x2.json", "DICOM -> 1.5 mm -> .nii.gz, H200 node, 16 workers")
bars("docs/results/loader_h200.json", "96^3 training patches, H200", key="samples_per_s")"""),
        ("md", "Decoding compressed CT (512², slices/s): 16 CPU cores (pylibjpeg) against the GPU for the "
               "encodings the support table sends there. JPEG lossless was measured on the GPU too but is not "
               "exact on every file, so it decodes on the CPU (`docs/benchmarks.md`)."),
        ("code", """from medproc.pipeline.decode import support_table
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
plt.title("decode 512² CT slices, H200 node")"""),
    ],
}


def main():
    os.makedirs(os.path.join(ROOT, "notebooks"), exist_ok=True)
    for name, cells in NOTEBOOKS.items():
        nb = nbf.v4.new_notebook()
        nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src) for kind, src in cells]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbf.write(nb, os.path.join(ROOT, "notebooks", name))
        print("wrote notebooks/" + name)


if __name__ == "__main__":
    main()
