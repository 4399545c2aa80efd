"""Saves interrupted or misused, and a .nii.gz whose gzip data goes on past its voxels:

- a ``.npy`` save interrupted anywhere leaves the old (array, sidecar) pair or an array without
  its sidecar (incomplete), never the new voxels beside the old affine;
- a ``.nii.gz`` with a gzip member appended after the voxels is refused after a bounded read
  (it was inflated to its end: gigabytes for a few MB);
- ``save`` names the argument of the wrong type, takes bytes paths as ``load`` does, and says
  which parent is not a folder.
"""

import gzip
import json
import os

import nibabel as nib
import numpy as np
import pytest
from isal import igzip

import medproc
import medproc.io.writers as writers
from medproc import Volume
from medproc.errors import MedprocError, OutputError, ReadError, UsageError

OLD_AFFINE = np.diag([2.0, 3.0, 4.0, 1.0])
NEW_AFFINE = np.diag([-1.0, -1.0, 1.0, 1.0])


def _old_and_new():
    return (
        Volume(np.zeros((10, 12, 8), np.float32), OLD_AFFINE),
        Volume(np.ones((10, 12, 8), np.float32), NEW_AFFINE),
    )


def _interrupt_json_dump(monkeypatch, p):
    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(writers.json, "dump", boom)


def _interrupt_replace(target_ext):
    def arm(monkeypatch, p):
        real = os.replace

        def replace(src, dst, *a, **k):
            if os.fspath(dst).endswith(target_ext):
                raise KeyboardInterrupt
            return real(src, dst, *a, **k)

        monkeypatch.setattr(os, "replace", replace)

    return arm


def _interrupt_unlink_sidecar(monkeypatch, p):
    real = os.unlink

    def unlink(path, *a, **k):
        if os.fspath(path) == p[:-4] + ".json":
            raise KeyboardInterrupt
        return real(path, *a, **k)

    monkeypatch.setattr(os, "unlink", unlink)


@pytest.mark.parametrize(
    "arm",
    [
        _interrupt_json_dump,
        _interrupt_unlink_sidecar,
        _interrupt_replace(".npy"),
        _interrupt_replace(".json"),
    ],
    ids=["sidecar-write", "old-sidecar-removal", "array-rename", "sidecar-rename"],
)
def test_interrupted_npy_save_never_pairs_new_voxels_with_old_affine(arm, tmp_path, monkeypatch):
    p = str(tmp_path / "cache.npy")
    side = str(tmp_path / "cache.json")
    old, new = _old_and_new()
    medproc.save(old, p)
    with monkeypatch.context() as m:
        arm(m, p)
        with pytest.raises(KeyboardInterrupt):
            medproc.save(new, p)
    arr = np.load(p)
    if os.path.exists(side):  # a complete pair: it must be one save's, not a mix
        affine = np.array(json.load(open(side))["affine"])
        new_voxels = bool(arr.mean() == 1)
        assert new_voxels == np.allclose(affine, NEW_AFFINE), (arr.mean(), affine)
        assert np.allclose(affine, NEW_AFFINE if new_voxels else OLD_AFFINE)
    else:  # incomplete: convert's resume redoes the case; load names the file
        from medproc._plan_batch import _not_whole

        assert any("sidecar" in why for why in _not_whole(p, None))
        with pytest.raises(ReadError) as e:
            medproc.load(p)
        assert p in str(e.value)
    assert sorted(os.listdir(tmp_path)) in (["cache.json", "cache.npy"], ["cache.npy"])
    medproc.save(new, p)  # and the next save completes it
    assert np.load(p).mean() == 1
    assert np.allclose(json.load(open(side))["affine"], NEW_AFFINE)


DATA = np.arange(10 * 12 * 8, dtype=np.int16).reshape(10, 12, 8)


def _nii_gz(tmp_path, tail: bytes = b"") -> str:
    plain = tmp_path / "plain.nii"
    nib.save(nib.Nifti1Image(DATA, OLD_AFFINE), str(plain))
    p = tmp_path / "img.nii.gz"
    p.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=1) + tail)
    return str(p)


@pytest.fixture
def inflated(monkeypatch):
    """Counts the bytes ISA-L's gzip reader hands out (what the reader inflated)."""
    count = [0]
    read, readinto = igzip.IGzipFile.read, igzip.IGzipFile.readinto

    def counted_read(self, *a, **k):
        out = read(self, *a, **k)
        count[0] += len(out)
        return out

    def counted_readinto(self, b):
        n = readinto(self, b)
        count[0] += n or 0
        return n

    monkeypatch.setattr(igzip.IGzipFile, "read", counted_read)
    monkeypatch.setattr(igzip.IGzipFile, "readinto", counted_readinto)
    return count


def test_gzip_member_inflating_past_the_voxels_is_refused_after_a_bounded_read(tmp_path, inflated):
    bomb = 48 << 20  # 48 MiB of zeros: ~50 KB compressed
    p = _nii_gz(tmp_path, gzip.compress(b"\0" * bomb, compresslevel=1))
    with pytest.raises(ReadError) as e:
        medproc.load(p)
    assert p in str(e.value) and "more data than its header declares" in str(e.value)
    assert inflated[0] < 4 << 20, f"inflated {inflated[0]} bytes of a {bomb}-byte tail"


def test_gzip_tails_within_the_bound_and_junk(tmp_path):
    # a small second member (as `cat a.gz b.gz` makes) is read and checked, as before
    p = _nii_gz(tmp_path, gzip.compress(b"\0" * 4096))
    v = medproc.load(p)
    assert np.array_equal(v.array, DATA)
    # junk after the member is an error naming the file, as before
    p = _nii_gz(tmp_path, b"GARBAGEGARBAGE")
    with pytest.raises(ReadError, match="damaged") as e:
        medproc.load(p)
    assert p in str(e.value)


def test_save_names_the_argument_of_the_wrong_type(tmp_path):
    vol, _ = _old_and_new()
    with pytest.raises(UsageError) as e:
        medproc.save(vol.array, str(tmp_path / "a.nii"))
    assert "volume" in str(e.value) and "medproc.Volume" in str(e.value)
    assert "numpy.ndarray" in str(e.value)
    for bad in ("a", 2.5, True):
        with pytest.raises(UsageError) as e:
            medproc.save(vol, str(tmp_path / "t.nii.gz"), threads=bad)
        assert "threads" in str(e.value) and repr(bad) in str(e.value)
    assert not os.path.exists(tmp_path / "a.nii") and not os.path.exists(tmp_path / "t.nii.gz")
    with pytest.raises(UsageError, match="path"):
        medproc.save(vol, 3)


@pytest.mark.parametrize("kind", [bytes, os.fsencode, lambda s: __import__("pathlib").Path(s)])
def test_save_takes_the_paths_load_takes(kind, tmp_path):
    _, new = _old_and_new()
    p = str(tmp_path / "b.nii")
    got = medproc.save(new, kind(p.encode()) if kind is bytes else kind(p))
    assert got == p
    back = medproc.load(kind(p.encode()) if kind is bytes else kind(p))
    assert np.allclose(back.affine, NEW_AFFINE) and back.array.mean() == 1


@pytest.mark.parametrize("below", ["x.nii", "sub/x.nii.gz", "x.npy"])
def test_save_under_a_file_names_the_parent_that_is_not_a_folder(below, tmp_path):
    vol, _ = _old_and_new()
    afile = tmp_path / "afile"
    afile.write_text("keep")
    target = str(afile / below)
    with pytest.raises(OutputError) as e:
        medproc.save(vol, target)
    msg = str(e.value)
    assert msg.startswith(target) and f"{afile} is not a folder" in msg
    assert "File exists" not in msg
    assert afile.read_text() == "keep"
    assert isinstance(e.value, MedprocError)
