"""``.nii.gz`` outputs compressed on the GPU (:mod:`medproc._gpu_gzip`): the header a service
puts before the voxels is byte for byte what :func:`medproc.save` writes, a member is written
only when it holds that header, and on the GPU (``-m gpu``, with nvCOMP) a member decompresses
to its input and is one gzip member that readers check whole."""

import gzip
import importlib.util
import os

import nibabel as nib
import numpy as np
import pytest

from medproc import Volume
from medproc._gpu_gzip import head_matches, nifti_head, write_member
from medproc._output_check import damaged
from medproc.io.nifti import to_nibabel


def _volumes():
    rng = np.random.default_rng(3)
    aff = np.diag([1.5, 0.8, 2.0, 1.0])
    aff[:3, 3] = [-100.25, 20.0, 31.5]
    sheared = aff.copy()
    sheared[2, 1] = 0.3  # a tilted gantry: no qform
    yield Volume(np.asfortranarray(rng.normal(size=(23, 19, 7)).astype(np.float32)), aff)
    yield Volume(np.asfortranarray(rng.integers(-1024, 3000, (5, 6, 7)).astype(np.int16)), aff)
    yield Volume(np.asfortranarray(rng.integers(0, 4, (9, 8, 3)).astype(np.uint8)), sheared)
    yield Volume(np.asfortranarray(rng.normal(size=(4, 4, 4, 2))), aff)  # float64, channels


@pytest.mark.parametrize("vol", list(_volumes()), ids=lambda v: str(v.dtype))
def test_the_head_and_the_voxels_are_what_save_writes(vol):
    head = nifti_head(vol)
    assert to_nibabel(vol).to_bytes() == head + np.asarray(vol.array).tobytes(order="F")


def test_a_member_is_written_only_with_the_workers_header(tmp_path):
    vol = next(_volumes())
    head, voxels = nifti_head(vol), np.asarray(vol.array).tobytes(order="F")
    member = gzip.compress(head + voxels, 9, mtime=0)
    assert head_matches(member, head) and not head_matches(member[:10], head)
    path = str(tmp_path / "a.nii.gz")
    assert write_member(vol, member, path)
    with open(path, "rb") as f:
        assert f.read() == member
    img = nib.load(path)
    np.testing.assert_array_equal(np.asarray(img.dataobj), vol.array)
    np.testing.assert_allclose(img.affine, vol.affine)
    assert damaged(path, vol.shape, vol.dtype) is None
    # another volume's header (another affine), a .nii name, a damaged member: not written
    other = Volume(vol.array, vol.affine @ np.diag([2.0, 1, 1, 1]))
    for v, p, m in [
        (other, str(tmp_path / "b.nii.gz"), member),
        (vol, str(tmp_path / "c.nii"), member),
        (vol, str(tmp_path / "d.nii.gz"), member[:12] + bytes(20)),
    ]:
        assert not write_member(v, m, p)
        assert not os.path.exists(p)


@pytest.mark.gpu
def test_nvcomp_makes_one_member_of_the_header_and_the_voxels():
    from medproc.pipeline import gpu_available

    if not gpu_available() or importlib.util.find_spec("nvidia.nvcomp") is None:
        pytest.skip("needs a GPU and nvCOMP (nvidia-nvcomp-cu12)")
    from medproc._gpu_gzip import GpuGzip

    rng = np.random.default_rng(0)
    gz = GpuGzip()
    for shape in [(239, 239, 119), (64, 64, 3), (512, 512, 40)]:  # (the buffer grows)
        vol = Volume(np.asfortranarray(rng.normal(size=shape).astype(np.float32) * 100), np.eye(4))
        head = nifti_head(vol)
        voxels = np.ascontiguousarray(vol.array.transpose(2, 1, 0))  # DHW: the file's order
        got = gz.compress(head, voxels, lambda n: np.empty(n, np.uint8))
        raw = head + voxels.tobytes()
        d = __import__("zlib").decompressobj(31)
        assert d.decompress(got.tobytes()) == raw and d.eof and not d.unused_data  # one member
        assert len(got) < len(raw)
    assert gz.compress(head, voxels, lambda n: None) is None  # no room: nothing
    gz.close()
