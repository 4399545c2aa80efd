"""PatchLoader's cache_dir never serves stale or damaged entries: a cache probe found entries of
edited DICOM series used as they were, mixed-up or damaged entries used silently, and damaged
index files crashing every later run. Each entry is now checked against its json and its
input files, and rebuilt when it does not agree."""

import glob
import json
import os
import shutil

import numpy as np
import pydicom
import pytest

import medproc
from medproc.monai.loader import PatchLoader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = medproc.Spec(spacing=3.0)


def _cases(tmp_path):
    d = os.path.join(ROOT, "sample_data", "nifti")
    out = []
    for n in ("case001", "case002"):
        for sub in ("images", "labels"):
            os.makedirs(tmp_path / sub, exist_ok=True)
            shutil.copy(os.path.join(d, sub, f"{n}.nii.gz"), tmp_path / sub / f"{n}.nii.gz")
        out.append({k: str(tmp_path / f"{k}s" / f"{n}.nii.gz") for k in ("image", "label")})
    return out


def _loader(cases, cache):
    return PatchLoader(cases, SPEC, (8, 8, 8), cache_dir=str(cache), batch_size=2)


def _arrays(loader):
    return [(e.host_image().copy(), e.host_label().copy()) for e in loader.entries]


def _entry_files(cache, suffix):
    return sorted(glob.glob(str(cache / f"*{suffix}")))


def _background(e):
    """An entry's background, as it stores it (a bitmap or, when sparse, indices)."""
    return np.asarray(e.bg_index if e.bg_index is not None else e.bg_bits)


def _same(a, b):
    for (ia, la), (ib, lb) in zip(a, b):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(la, lb)


def test_a_dicom_slice_edited_in_place_rebuilds_its_entry(sample_data, tmp_path):
    series = tmp_path / "ct"
    shutil.copytree(os.path.join(sample_data, "dicom", "ct_axial"), series)
    case = [{"image": str(series)}]
    first = _loader(case, tmp_path / "c").entries[0].host_image().copy()
    f = sorted(glob.glob(str(series / "*")))[5]
    folder = os.stat(series)
    ds = pydicom.dcmread(f)
    px = ds.pixel_array
    px[:] = px.max()
    ds.PixelData = px.tobytes()
    ds.save_as(f)
    os.utime(series, ns=(folder.st_atime_ns, folder.st_mtime_ns))  # the folder looks the same
    again = _loader(case, tmp_path / "c").entries[0].host_image()
    fresh = PatchLoader(case, SPEC, (8, 8, 8)).entries[0].host_image()
    np.testing.assert_array_equal(again, fresh)
    assert not np.array_equal(again, first)


@pytest.mark.parametrize(
    "damage",
    ["swap_labels", "swap_entries", "index_truncated", "index_empty", "json_shape_null",
     "image_header_fortran", "image_header_shape", "index_out_of_range", "background_zeroed",
     "json_affine_nan", "json_intensity_short", "json_n_bg_negative"],
)  # fmt: skip
def test_a_damaged_or_mixed_up_entry_is_rebuilt_not_used(tmp_path, damage):
    cases, cache = _cases(tmp_path), tmp_path / "c"
    first = _loader(cases, cache)
    reference, background = _arrays(first), [_background(e) for e in first.entries]
    labels, images, index = (_entry_files(cache, s) for s in ("_label.npy", "_image.npy", ".npz"))
    jsons = _entry_files(cache, ".json")
    if damage == "swap_labels":
        a, b = (open(p, "rb").read() for p in labels)
        open(labels[0], "wb").write(b)
        open(labels[1], "wb").write(a)
    elif damage == "swap_entries":
        for suffix in ("_image.npy", "_label.npy", "_index.npz", ".json"):
            p, q = _entry_files(cache, suffix)
            os.replace(p, p + ".x")
            os.replace(q, p)
            os.replace(p + ".x", q)
    elif damage == "index_truncated":
        with open(index[0], "r+b") as f:
            f.truncate(os.path.getsize(index[0]) // 2)
    elif damage == "index_empty":
        open(index[0], "wb").close()
    elif damage == "json_shape_null":
        doc = json.load(open(jsons[0]))
        doc["shape"] = None
        json.dump(doc, open(jsons[0], "w"))
    elif damage.startswith("image_header"):
        raw = open(images[0], "rb").read()
        head_len = 10 + int.from_bytes(raw[8:10], "little")
        head = raw[:head_len].decode("latin-1")
        if damage == "image_header_fortran":  # (the padding keeps the header's length)
            flipped = head.replace("'fortran_order': True, ", "'fortran_order': False,")
            if flipped == head:
                flipped = head.replace("'fortran_order': False,", "'fortran_order': True, ")
        else:
            shape = tuple(np.load(images[0], mmap_mode="r").shape)
            flipped = head.replace(str(shape), str(shape[::-1]))
        assert flipped != head and len(flipped) == len(head)
        open(images[0], "wb").write(flipped.encode("latin-1") + raw[head_len:])
    elif damage in ("index_out_of_range", "background_zeroed"):
        with np.load(index[0]) as z:
            parts = {k: z[k] for k in z.files}
        if damage == "index_out_of_range":
            parts["fg"] = parts["fg"] + 10**8
        else:  # (a prober's finding: the background sampler then looped for ever)
            key = "bg_bits" if "bg_bits" in parts else "bg_index"
            parts[key] = np.zeros_like(parts[key])
        np.savez(index[0][: -len(".npz")], **parts)
    elif damage.startswith("json_"):  # (the json's own fields: used unchecked, a prober's
        doc = json.load(open(jsons[0]))  # finding: a NaN affine in every batch, a crash)
        if damage == "json_affine_nan":
            doc["affine"][0][3] = float("nan")
        elif damage == "json_intensity_short":
            doc["intensity"] = [0.0, 1.0]
        else:
            doc["n_bg"] = -5
        json.dump(doc, open(jsons[0], "w"))
    loader = _loader(cases, cache)
    _same(_arrays(loader), reference)  # rebuilt: as the first build
    for e, bg, ref in zip(loader.entries, background, first.entries):  # (as the first build)
        np.testing.assert_array_equal(_background(e), bg)
        np.testing.assert_array_equal(e.affine, ref.affine)
        assert e.n_bg == ref.n_bg and e.intensity == ref.intensity
    assert next(iter(loader)) is not None


def test_a_read_only_cache_dir_builds_missing_entries_in_memory(tmp_path, monkeypatch):
    """A cache_dir that cannot be written (a read-only mount; here every temporary file in it
    is refused): the entries it holds are read, those it lacks built in memory, said once."""
    import tempfile

    cases, cache = _cases(tmp_path), tmp_path / "c"
    reference = _arrays(_loader(cases, cache))
    key = os.path.basename(_entry_files(cache, ".json")[1])[:20]
    for p in glob.glob(str(cache / f"{key}*")):
        os.remove(p)  # one entry missing
    before = sorted(os.listdir(cache))

    real = tempfile.mkstemp

    def refuse(*a, dir=None, **k):  # (the read-only mount: files in cache_dir only)
        if dir is not None and os.path.realpath(dir) == os.path.realpath(cache):
            raise OSError(30, "Read-only file system")
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.warns(medproc.MedprocWarning, match="cannot write there.*built in memory"):
        got = _arrays(_loader(cases, cache))
    _same(got, reference)
    assert sorted(os.listdir(cache)) == before


def test_loading_a_npy_says_what_it_is_and_how_to_read_it(tmp_path):
    p = tmp_path / "case001.npy"
    np.save(p, np.zeros((4, 4, 4), np.int16))
    with pytest.raises(medproc.ReadError, match=r"case001.npy: a .npy holds an array.*numpy.load"):
        medproc.load(str(p))


@pytest.mark.parametrize("damage", ["swap_same_shape", "label_as_float32", "image_as_uint16"])
def test_entries_of_the_same_shape_swapped_or_retyped_are_rebuilt(tmp_path, damage):
    """Another case's files of the same shape, or another dtype in the header, showed no
    difference the json recorded: entries now carry samples of their bytes (and dtypes)."""
    import nibabel as nib

    cases = _cases(tmp_path)
    img = nib.load(cases[0]["image"])
    other = tmp_path / "images" / "case003.nii.gz"
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj)[::-1].copy(), img.affine), other)
    cases = [cases[0], {"image": str(other), "label": cases[0]["label"]}]
    cache = tmp_path / "c"
    reference = _arrays(_loader(cases, cache))
    images, labels = _entry_files(cache, "_image.npy"), _entry_files(cache, "_label.npy")
    if damage == "swap_same_shape":
        a, b = (open(p, "rb").read() for p in images)
        open(images[0], "wb").write(b)
        open(images[1], "wb").write(a)
    elif damage == "label_as_float32":
        np.save(labels[0], np.load(labels[0]).astype(np.float32))
    else:
        np.save(images[0], np.load(images[0]).astype(np.uint16))
    _same(_arrays(_loader(cases, cache)), reference)  # rebuilt: as the first build


def test_temporaries_a_killed_build_left_are_removed_by_the_next(tmp_path):
    cases, cache = _cases(tmp_path), tmp_path / "c"
    _loader(cases, cache)
    old = cache / ".x_index.npz.abcd1234.part.npz"
    new = cache / ".y_image.npy.abcd1234.part.npy"  # (another build may be writing it now)
    mine = cache / "notes.part.txt"
    for p in (old, new, mine):
        p.write_bytes(b"x")
    os.utime(old, (1, 1))
    os.utime(mine, (1, 1))
    _loader(cases, cache)
    assert not old.exists() and new.exists() and mine.exists()
