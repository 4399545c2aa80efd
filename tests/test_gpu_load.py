"""GPU decoding as a reader backend: ``medproc.load(path, device="gpu")`` equals ``load(path)``
on every encoding the support table proves, falls back to the CPU (and says why) elsewhere,
and fails clearly where there is no GPU."""

import glob
import os

import numpy as np
import pytest

import medproc
from medproc.io.decoders import gpu_decoder_status
from medproc.io.dicom_scan import find_series
from medproc.pipeline.decode import gpu_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _candidates():
    """pydicom's own compressed test files, and the synthetic series of
    ``scripts/make_decode_data.py`` when they were made into .gpu-data/decode96 (the GPU run
    carries them; their encoders are not all installed there)."""
    import pydicom

    files = sorted(
        glob.glob(os.path.join(os.path.dirname(pydicom.__file__), "data", "test_files", "*.dcm"))
    )
    files += sorted(glob.glob(os.path.join(ROOT, ".gpu-data", "decode96", "*", "s*")))
    out = []
    for p in files:
        try:
            found, _ = find_series(p)
        except Exception:  # noqa: BLE001 - not a readable series: not a candidate
            continue
        if len(found) == 1 and gpu_config(found[0].info) is not None:
            if int(found[0].info.get("SamplesPerPixel") or 1) == 1:
                out.append(p)
    return out


PROVEN = _candidates()


@pytest.mark.gpu
@pytest.mark.parametrize("path", PROVEN, ids=lambda p: os.path.relpath(p, ROOT))
def test_load_on_the_gpu_equals_load_on_every_proven_encoding(path):
    import torch

    cpu = medproc.load(path, workers=1)
    gpu = medproc.load(path, device="gpu")
    assert gpu.meta["decode"] == "gpu (nvImageCodec)", gpu.meta.get("decode_note")
    assert isinstance(gpu.array, torch.Tensor) and gpu.array.is_cuda
    assert gpu.shape == cpu.shape and np.array_equal(gpu.affine, cpu.affine)
    got = gpu.array.cpu().numpy()
    assert got.dtype == cpu.array.dtype, (got.dtype, cpu.array.dtype)
    np.testing.assert_array_equal(got, cpu.array)


@pytest.mark.gpu
def test_there_are_proven_encodings_to_test():
    assert len(PROVEN) >= 3, PROVEN


@pytest.mark.gpu
def test_unproven_encodings_fall_back_to_the_cpu_and_say_why(sample_data):
    vol = medproc.load(os.path.join(sample_data, "dicom", "ct_axial"), device="gpu")
    assert vol.device.startswith("cuda") and vol.meta["decode"] == "cpu (native)"
    assert "uncompressed" in vol.meta["decode_note"]
    ref = medproc.load(os.path.join(sample_data, "dicom", "ct_axial"))
    np.testing.assert_array_equal(vol.array.cpu().numpy(), ref.array)
    out = medproc.resample(vol, spacing=2.0, device="gpu")  # stays on the GPU
    assert out.device.startswith("cuda")
    np.testing.assert_allclose(
        out.array.cpu().numpy(), medproc.resample(ref, spacing=2.0).array, atol=0.5
    )


def test_without_a_gpu_the_plugins_say_why_and_load_fails_clearly(sample_data):
    from medproc.pipeline import gpu_available

    if gpu_available():
        pytest.skip("this machine has a GPU")
    found, _ = find_series(os.path.join(sample_data, "dicom", "ct_axial"))
    ((name, reason),) = gpu_decoder_status(found[0].info)
    assert name == "gpu (nvImageCodec)" and reason
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        medproc.load(os.path.join(sample_data, "nifti", "images", "case001.nii.gz"), device="gpu")
