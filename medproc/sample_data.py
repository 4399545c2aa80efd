"""Synthetic CT-like data with lesions at known world positions, and deliberately broken files.

``python -m medproc.sample_data OUT`` writes a data set for benchmarks and reliability tests;
``--bundled`` writes the small set committed in ``sample_data/``. Everything is deterministic
(seeded), so tests can rely on the lesion positions in ``lesions.csv``.

Lesion CSVs follow LUNA16: ``seriesuid,coordX,coordY,coordZ,diameter_mm`` in world **LPS** mm
(as DICOM stores positions); ``seriesuid`` is the DICOM SeriesInstanceUID or the NIfTI file stem.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from dataclasses import dataclass

import numpy as np

from ._dicom_writer import _UID_ROOT, _uid, write_dicom_series
from .geometry import LPS_TO_RAS, apply_affine
from .volume import Volume

__all__ = [
    "Lesion",
    "grid_affine",
    "ct_phantom",
    "in_lung",
    "ANATOMY",
    "write_dicom_series",
    "make_dataset",
    "make_broken",
    "make_bundled",
]


@dataclass
class Lesion:
    center_lps: tuple[float, float, float]
    diameter_mm: float
    hu: float = 60.0


def grid_affine(shape, spacing, origin_lps, iop=(1, 0, 0, 0, 1, 0), tilt_deg: float = 0.0):
    """RAS affine of voxels (i, j, k) = (column, row, slice) of a DICOM-style grid (LPS origin
    and IOP); ``spacing`` is (column spacing, row spacing, slice step) in mm."""
    row, col = np.array(iop[:3], float), np.array(iop[3:], float)
    normal = np.cross(row, col)
    step = normal * spacing[2]
    if tilt_deg:
        step = step + col * spacing[2] * np.tan(np.radians(tilt_deg))
    a = np.eye(4)
    a[:3, 0] = row * spacing[0]
    a[:3, 1] = col * spacing[1]
    a[:3, 2] = step
    a[:3, 3] = origin_lps
    return LPS_TO_RAS @ a


#: Where the phantom is asymmetric, on purpose, so that a flip of any axis shows (world RAS mm;
#: RAS: +x = patient Right, +y = Anterior, +z = Superior).
ANATOMY = {
    # heart: anterior and to the patient's LEFT, in the lower half; it carves the left lung
    "heart": {"center": (-15.0, 30.0, -20.0), "semi_axes": (50.0, 38.0, 45.0), "hu": 45.0},
    # a dense marker plate on the LEFT body wall, superior half only (z >= 0): left-right and
    # head-feet at a glance, like the lead "L" marker on a radiograph
    "left_marker": {"x": (-148.0, -142.0), "y": (-50.0, 50.0), "z_min": 0.0, "hu": 1200.0},
    # the spine is posterior (y = -75); the diaphragm is inferior, its right dome (liver) higher
    "spine": {"center": (0.0, -75.0), "radius": 18.0, "hu": 700.0},
    "diaphragm": {"right_top": -28.0, "left_top": -38.0, "hu": 55.0},
}


def _dome(x):
    """Height (RAS z, mm) of the diaphragm under each lung: the right dome is higher."""
    d = ANATOMY["diaphragm"]
    top = np.where(x > 0, d["right_top"], d["left_top"])
    return top - 25.0 * ((np.abs(x) - 70.0) / 55.0) ** 2


def _in_heart(x, y, z):
    h = ANATOMY["heart"]
    (cx, cy, cz), (ax, ay, az) = h["center"], h["semi_axes"]
    return ((x - cx) / ax) ** 2 + ((y - cy) / ay) ** 2 + ((z - cz) / az) ** 2 <= 1


def in_lung(x, y, z):
    """Whether RAS points (mm) are lung: two ellipsoids above the diaphragm, less the heart."""
    x, y, z = (np.asarray(a, dtype=np.float64) for a in (x, y, z))
    lung = np.zeros(np.broadcast(x, y, z).shape, bool)
    for sx in (-70, 70):
        lung |= ((x - sx) / 55) ** 2 + ((y - 5) / 70) ** 2 + (z / 160) ** 2 <= 1
    return lung & (z > _dome(x)) & ~_in_heart(x, y, z)


def _anatomy_hu(x, y, z) -> np.ndarray:
    """HU of the phantom's anatomy (no lesions, no noise) at RAS points (mm)."""
    hu = np.full(np.broadcast(x, y, z).shape, -1000.0)
    body = (x / 160) ** 2 + (y / 110) ** 2 <= 1
    hu[body] = 40
    hu[body & (z <= _dome(x)) & (np.abs(x) < 125)] = ANATOMY["diaphragm"]["hu"]  # liver, spleen
    hu[in_lung(x, y, z)] = -820
    hu[_in_heart(x, y, z) & body] = ANATOMY["heart"]["hu"]
    sp = ANATOMY["spine"]
    hu[((x - sp["center"][0]) ** 2 + (y - sp["center"][1]) ** 2) <= sp["radius"] ** 2] = sp["hu"]
    m = ANATOMY["left_marker"]
    plate = (x >= m["x"][0]) & (x <= m["x"][1]) & (y >= m["y"][0]) & (y <= m["y"][1])
    hu[plate & (z >= m["z_min"])] = m["hu"]
    return hu


def ct_phantom(
    shape, affine, lesions: list[Lesion], seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A CT-like int16 HU volume and a uint8 lesion label map on the grid ``affine``.

    Body ellipse (soft tissue), two lungs, a spine, and spherical lesions labelled 1, 2, ...
    It is asymmetric on purpose (see ``ANATOMY``), so a flipped axis shows: the heart is
    anterior and on the patient's left, a dense marker plate lies on the left body wall in the
    superior half (z >= 0), the spine is posterior and the diaphragm inferior (right dome higher).
    Geometry is defined in world RAS mm, so any grid (oblique, tilted) samples the same anatomy.
    """
    rng = np.random.default_rng(seed)
    nx, ny, nz = shape
    img = np.empty(shape, np.int16, order="F")  # (i, j, k), i fastest: as readers return it
    lab = np.zeros(shape, np.uint8, order="F")
    jj, ii = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    centers = [LPS_TO_RAS[:3, :3] @ np.asarray(les.center_lps, float) for les in lesions]
    for k in range(nz):
        idx = np.stack([ii, jj, np.full_like(jj, k)], -1).astype(np.float64)  # (row j, column i)
        w = apply_affine(affine, idx)  # RAS
        hu = _anatomy_hu(w[..., 0], w[..., 1], w[..., 2])
        for n, (c, les) in enumerate(zip(centers, lesions), 1):
            r2 = ((w - c) ** 2).sum(-1)
            m = r2 <= (les.diameter_mm / 2) ** 2
            hu[m] = les.hu
            lab[:, :, k][m.T] = n
        hu += rng.normal(0, 12, hu.shape)
        img[:, :, k] = np.clip(np.rint(hu), -1024, 3071).T
    return img, lab


def _sphere_in_lung(c_ras, diameter: float) -> bool:
    """Whether a lesion sphere lies in lung: its centre and 14 points on its surface."""
    d = np.array(
        [[0, 0, 0]]
        + [[s * (a == 0), s * (a == 1), s * (a == 2)] for a in range(3) for s in (-1, 1)]
        + [[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)],
        dtype=np.float64,
    )
    d[1:] /= np.linalg.norm(d[1:], axis=1, keepdims=True)
    p = np.asarray(c_ras, dtype=np.float64) + d * diameter / 2
    return bool(in_lung(p[:, 0], p[:, 1], p[:, 2]).all())


def _lesions_for(affine, shape, rng, count: int) -> list[Lesion]:
    """Lesions inside the lungs of the phantom, well inside the grid."""
    out = []
    inv = np.linalg.inv(affine)
    tries = 0
    while len(out) < count and tries < 1000:
        tries += 1
        side = rng.choice([-70, 70])
        c_ras = np.array([side + rng.uniform(-25, 25), rng.uniform(-30, 40), 0.0])
        zc = apply_affine(affine, (np.array(shape) - 1) / 2.0)[2]
        c_ras[2] = zc + rng.uniform(-0.25, 0.25) * shape[2] * abs(affine[2, 2])
        d = float(rng.uniform(8, 16))
        ijk = apply_affine(inv, c_ras)
        margin = d / np.sqrt((affine[:3, :3] ** 2).sum(0))
        inside = np.all(ijk - margin >= 1) and np.all(ijk + margin <= np.array(shape) - 2)
        if inside and _sphere_in_lung(c_ras, d):
            out.append(
                Lesion(tuple((LPS_TO_RAS[:3, :3] @ c_ras).tolist()), d, float(rng.uniform(40, 90)))
            )
    return out


def _write_lesion_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seriesuid", "coordX", "coordY", "coordZ", "diameter_mm"])
        for uid, les in rows:
            w.writerow([uid, *(f"{v:.3f}" for v in les.center_lps), f"{les.diameter_mm:.2f}"])


def make_dataset(
    out: str,
    cases: int = 4,
    size: int = 512,
    slices: tuple[int, int] = (150, 250),
    spacing_xy: float = 0.7,
    slice_mm: float = 1.25,
    lesions: int = 2,
    nifti: bool = False,
    broken: bool = False,
    seed: int = 0,
    progress=None,
) -> dict:
    """Write ``cases`` synthetic CT DICOM series (and NIfTI copies with labels) under ``out``.

    Returns a dict with the series UIDs, lesions and paths. With ``broken``, also writes a
    ``broken/`` folder: a truncated file, a non-DICOM file, a series with a missing slice, a
    series with duplicated positions, and a NIfTI with NaNs. ``progress(line)``, if given, is
    called once per case written (the command line prints it: a case of 512^2 x 200 slices
    takes ~15 s on 2 cores).
    """
    from .io import save

    rng = np.random.default_rng(seed)
    info: dict = {"cases": []}
    rows = []
    for c in range(cases):
        nz = int(rng.integers(slices[0], slices[1] + 1))
        sp = (spacing_xy, spacing_xy, slice_mm)
        fov = size * spacing_xy
        origin = (-fov / 2 + spacing_xy / 2, -fov / 2 + spacing_xy / 2 + 20, -nz * slice_mm / 2)
        aff = grid_affine((size, size, nz), sp, origin)
        les = _lesions_for(aff, (size, size, nz), rng, lesions)
        if lesions and len(les) < lesions:
            import warnings

            warnings.warn(
                f"sample case {c}: {len(les)} of {lesions} lesion(s) fit inside its lungs and "
                f"its field of view ({size} voxels in-plane, {nz} slices); its label map holds "
                "only those. A larger size (192 or more) or more slices make room",
                stacklevel=2,
            )
        img, lab = ct_phantom((size, size, nz), aff, les, seed=seed + c)
        vol = Volume(img, aff)
        # (the same draws as before, mixed with the size: another --size or slice count
        # makes other volumes, so they get other UIDs)
        uid = _uid(np.random.default_rng([*rng.integers(1, 10**9, 3).tolist(), size, nz]))
        name = f"case{c:03d}"
        write_dicom_series(
            os.path.join(out, "dicom", name),
            vol,
            uid,
            series_number=c + 1,
            patient_id=f"PAT{c:04d}",
            seed=seed + c,
        )
        entry = {"name": name, "series_uid": uid, "lesions": les, "shape": (size, size, nz)}
        if nifti:
            save(vol, os.path.join(out, "nifti", f"{name}.nii.gz"))
            save(Volume(lab, aff), os.path.join(out, "labels", f"{name}.nii.gz"))
        info["cases"].append(entry)
        rows += [(uid, les_) for les_ in les]
        if progress is not None:
            progress(f"case {c + 1} of {cases} written ({size}x{size}x{nz}, {name})")
    _write_lesion_csv(os.path.join(out, "lesions.csv"), rows)
    if broken:
        info["broken"] = make_broken(os.path.join(out, "broken"), seed=seed)
    return info


def make_broken(folder: str, seed: int = 0) -> dict:
    """Deliberately broken inputs, one per subfolder/file, for reliability tests."""
    from .io import save

    rng = np.random.default_rng(seed + 99)
    os.makedirs(folder, exist_ok=True)
    shape, sp = (64, 64, 12), (2.0, 2.0, 2.5)
    aff = grid_affine(shape, sp, (-64, -64, -15))
    img, _ = ct_phantom(shape, aff, [], seed=seed)
    vol = Volume(img, aff)
    out = {}
    # missing slice
    d = os.path.join(folder, "missing_slice")
    paths = write_dicom_series(d, vol, _uid(rng), shuffle_names=False)
    os.remove(paths[5])
    out["missing_slice"] = d
    # duplicate positions: one slice written twice with another SOP instance
    d = os.path.join(folder, "duplicate_slice")
    paths = write_dicom_series(d, vol, _uid(rng), shuffle_names=False)
    import pydicom

    ds = pydicom.dcmread(paths[3])
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID + ".99"
    ds.save_as(os.path.join(d, "IM_dup.dcm"))
    out["duplicate_slice"] = d
    # truncated file inside an otherwise fine series
    d = os.path.join(folder, "truncated")
    paths = write_dicom_series(d, vol, _uid(rng), shuffle_names=False)
    with open(paths[2], "r+b") as f:
        f.truncate(os.path.getsize(paths[2]) - 3000)
    out["truncated"] = d
    # not DICOM at all
    p = os.path.join(folder, "not_dicom.dcm")
    with open(p, "w") as f:
        f.write("this is a text file, not DICOM\n")
    out["not_dicom"] = p
    # NIfTI full of NaNs
    p = os.path.join(folder, "nan.nii.gz")
    arr = img.astype(np.float32)
    arr[10:20, 10:20, 3] = np.nan
    save(Volume(arr, aff), p)
    out["nan"] = p
    return out


def make_bundled(out: str = "sample_data") -> None:
    """The small set committed in ``sample_data/`` (a few MB)."""
    from .io import save

    rng = np.random.default_rng(2026)
    rows = []
    # 1) axial CT series, 2.9 x 2.9 x 2.5 mm
    shape = (112, 112, 40)
    aff = grid_affine(shape, (2.9, 2.9, 2.5), (-161.0, -141.0, -50.0))
    les = [Lesion((-62.0, -10.0, 5.0), 14.0, 70.0), Lesion((75.0, 15.0, -20.0), 10.0, 55.0)]
    img, lab = ct_phantom(shape, aff, les, seed=1)
    uid1 = _UID_ROOT + "2026.1.1"
    write_dicom_series(
        os.path.join(out, "dicom", "ct_axial"),
        Volume(img, aff),
        uid1,
        study_uid=_UID_ROOT + "2026.1",
        series_number=2,
        description="CT chest axial",
    )
    rows += [(uid1, x) for x in les]
    # 2) oblique, anisotropic series (15 degrees about the R-L axis) in the same study
    c, s = np.cos(np.radians(15)), np.sin(np.radians(15))
    iop = (1, 0, 0, 0, c, s)
    shape2 = (96, 96, 30)
    aff2 = grid_affine(shape2, (3.2, 3.2, 3.0), (-152.0, -150.0, -40.0), iop=iop)
    img2, _ = ct_phantom(shape2, aff2, les, seed=2)
    uid2 = _UID_ROOT + "2026.1.2"
    write_dicom_series(
        os.path.join(out, "dicom", "ct_oblique"),
        Volume(img2, aff2),
        uid2,
        study_uid=_UID_ROOT + "2026.1",
        series_number=3,
        description="CT oblique",
    )
    rows += [(uid2, x) for x in les]
    # 3) NIfTI cases with label maps
    for n in range(2):
        shp = (100, 100, 36)
        a = grid_affine(shp, (3.0, 3.0, 2.0 + n), (-148.5, -128.5, -36.0 - 4 * n))
        lz = _lesions_for(a, shp, rng, 2)
        im, lb = ct_phantom(shp, a, lz, seed=10 + n)
        name = f"case{n + 1:03d}"
        save(Volume(im, a), os.path.join(out, "nifti", "images", f"{name}.nii.gz"))
        save(Volume(lb, a), os.path.join(out, "nifti", "labels", f"{name}.nii.gz"))
        rows += [(name, x) for x in lz]
    _write_lesion_csv(os.path.join(out, "lesions.csv"), rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m medproc.sample_data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("out", help="output folder")
    p.add_argument("--bundled", action="store_true", help="write the small committed set")
    p.add_argument("--cases", type=int, default=4)
    p.add_argument("--size", type=int, default=512, help="rows = columns")
    p.add_argument("--slices", type=int, nargs=2, default=(150, 250), metavar=("MIN", "MAX"))
    p.add_argument("--lesions", type=int, default=2, help="lesions per case")
    p.add_argument("--nifti", action="store_true", help="also write NIfTI images and label maps")
    p.add_argument("--broken", action="store_true", help="also write deliberately broken inputs")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if os.path.isdir(a.out) and os.listdir(a.out):
        print(f"{a.out} already holds files: those medproc writes are replaced", file=sys.stderr)
    if a.bundled:
        make_bundled(a.out)
    else:
        make_dataset(
            a.out,
            a.cases,
            a.size,
            tuple(a.slices),
            lesions=a.lesions,
            nifti=a.nifti,
            broken=a.broken,
            seed=a.seed,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
