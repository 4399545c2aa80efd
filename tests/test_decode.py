"""GPU decoding of compressed DICOM: the support table, the automatic CPU fallback, and (on the
GPU, -m gpu) bit-exactness of every encoding the table sends to the GPU."""

import glob
import os

import numpy as np
import pydicom
import pytest
from fetch_test_data import pydicom_test_files

import medproc
from medproc.cli import main
from medproc.io.dicom_scan import find_series
from medproc.pipeline import decode as dec

SYNTH = {
    "j2k": "JPEG 2000 Image Compression (Lossless Only)",
    "htj2k": "High-Throughput JPEG 2000 Image Compression (Lossless Only)",
    "jpegll": "JPEG Lossless, Non-Hierarchical, First-Order Prediction (Process 14 [Selection Value 1])",
}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from make_decode_data import main as make

    # made beforehand where the encoders are missing (the GPU machine has no imagecodecs):
    # python scripts/make_decode_data.py .gpu-data/decode96 --size 96 --slices 3
    made = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".gpu-data", "decode96"
    )
    if os.path.isdir(made) and os.environ.get("MEDPROC_OFFLINE"):
        return made
    out = str(tmp_path_factory.mktemp("decode"))
    make([out, "--slices", "3", "--size", "96"])
    return out


def test_support_keys_and_decode_paths():
    info = {
        "TransferSyntaxUID": "1.2.840.10008.1.2.4.90",
        "BitsAllocated": 16,
        "BitsStored": 12,
        "PixelRepresentation": 0,
        "SamplesPerPixel": 1,
        "PhotometricInterpretation": "MONOCHROME2",
    }
    assert dec.support_key(info) == "1.2.840.10008.1.2.4.90|16|12|0|1|MONOCHROME2"
    assert dec.decode_path({**info, "TransferSyntaxUID": "1.2.840.10008.1.2.1"}) == "cpu (native)"
    proven = dec.support_table()["entries"]
    assert dec.decode_path(info) == (
        "gpu (nvImageCodec) when device=gpu" if dec.support_key(info) in proven else "cpu (pydicom)"
    )
    # colour encodings proven on the GPU are still read on the CPU (the GPU route is monochrome)
    for key in proven:
        ts, ba, bs, pr, spp, pi = key.split("|")
        if spp != "1":
            assert (
                dec.decode_path(
                    {
                        "TransferSyntaxUID": ts,
                        "BitsAllocated": ba,
                        "BitsStored": bs,
                        "PixelRepresentation": pr,
                        "SamplesPerPixel": spp,
                        "PhotometricInterpretation": pi,
                    }
                )
                == "cpu (pydicom)"
            )
    # an encoding nobody proved always falls back to the CPU
    assert dec.gpu_config({**info, "TransferSyntaxUID": "1.2.840.10008.1.2.4.999"}) is None
    for key, entry in proven.items():
        assert entry["config"] in dec.CONFIGS and entry["files"], key


@pytest.mark.parametrize("name", list(SYNTH) + ["j2k-signed", "jpegll-signed"])
def test_synthetic_compressed_series_decode_exactly_on_cpu(synthetic, name):
    d = os.path.join(synthetic, name, "s00")
    vol = medproc.load(d)
    assert vol.meta["transfer_syntax"] == SYNTH[name.replace("-signed", "")]
    assert vol.meta["decode"] == "cpu (pydicom)"
    files = glob.glob(os.path.join(d, "*.dcm"))
    assert vol.shape[2] == len(files)  # (i, j, k): k runs through the slices
    for f in files:
        ds = pydicom.dcmread(f)
        assert vol.shape[:2] == (int(ds.Columns), int(ds.Rows))
        # the slice whose first voxel (i, j) = (0, 0) is this file's ImagePositionPatient (LPS)
        ipp_ras = np.array([float(x) for x in ds.ImagePositionPatient]) * [-1, -1, 1]
        dist = [np.abs(vol.voxel_to_world([0, 0, k]) - ipp_ras).max() for k in range(vol.shape[2])]
        k = int(np.argmin(dist))
        assert dist[k] < 1e-3
        # pydicom's pixel_array is (rows, columns) = (j, i): the slice transposed
        np.testing.assert_array_equal(
            vol.array[:, :, k].T,
            ds.pixel_array.astype(np.int32) * int(ds.RescaleSlope) + int(ds.RescaleIntercept),
        )


def test_inspect_and_manifest_show_the_decode_path(synthetic, tmp_path, capsys):
    assert main(["inspect", synthetic, "--json"]) == 0
    import json

    entries = json.loads(capsys.readouterr().out)
    assert {e["decode"] for e in entries} <= {"cpu (pydicom)", "gpu (nvImageCodec) when device=gpu"}
    assert (
        main(
            [
                "convert",
                os.path.join(synthetic, "jpegll"),
                "-o",
                str(tmp_path),
                "--spacing",
                "3",
                "-j",
                "1",
            ]
        )
        == 0
    )
    import csv

    rows = list(csv.DictReader(open(tmp_path / "manifest.csv")))
    assert [r["decode"] for r in rows] == ["cpu (pydicom)"]


def _compressed_files():
    out = []
    for f in pydicom_test_files():
        try:
            ds = pydicom.dcmread(f, stop_before_pixels=True)
            if ds.file_meta.TransferSyntaxUID.is_compressed and "Rows" in ds:
                out.append(f)
        except Exception:  # noqa: BLE001
            pass
    return out


@pytest.mark.gpu
def test_every_proven_encoding_is_bit_exact_on_the_gpu(synthetic):
    from pydicom.encaps import generate_frames

    files = _compressed_files() + sorted(
        glob.glob(os.path.join(synthetic, "**", "*.dcm"), recursive=True)
    )
    checked = 0
    for f in files:
        ds = pydicom.dcmread(f)
        info = dec.encoding_info(ds)
        cfg = dec.gpu_config(info)
        if cfg is None:
            continue
        ref = ds.pixel_array
        ref = (
            ref[None] if ref.ndim == (2 if int(ds.get("SamplesPerPixel") or 1) == 1 else 3) else ref
        )
        frames = list(
            generate_frames(ds.PixelData, number_of_frames=int(ds.get("NumberOfFrames") or 1))
        )
        got = dec.decode_frames_gpu(
            frames, cfg, int(ds.BitsStored), bool(int(ds.PixelRepresentation))
        )
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(
                g.cpu().numpy().astype(np.int64), r.astype(np.int64), err_msg=f
            )
        checked += 1
    assert checked > 0, "the support table proves no encoding found here"


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(SYNTH) + ["j2k-signed", "jpegll-signed"])
def test_gpu_series_read_equals_cpu_and_feeds_the_resampler(synthetic, name, tmp_path):
    from medproc.io.dicom_gpu import read_series_gpu
    from medproc.io.dicom_read import read_series

    d = os.path.join(synthetic, name, "s00")
    (series,), _ = find_series(d)
    if dec.gpu_config(series.info) is None:
        pytest.skip(f"{name} is not proven for the GPU: it decodes on the CPU (the fallback)")
    cpu = medproc.load(d)
    assert cpu.meta["decode"] == "cpu (pydicom)" and cpu.shape == (96, 96, 3)
    # the plugin's reader, the series reader and load(device="gpu"): the same Volume on the GPU
    for vol in (
        read_series_gpu(series),
        read_series(series, device="gpu"),
        medproc.load(d, device="gpu"),
    ):
        assert vol.array.is_cuda and vol.device.startswith("cuda")
        assert vol.meta["decode"] == "gpu (nvImageCodec)"
        assert vol.shape == cpu.shape  # (i, j, k), like the CPU reader
        assert str(vol.array.dtype).replace("torch.", "") == str(cpu.array.dtype)
        np.testing.assert_array_equal(vol.array.cpu().numpy(), cpu.array)
        np.testing.assert_allclose(vol.affine, cpu.affine)
    # the CUDA tensor feeds the engine directly: resampled on the GPU, it stays there
    gpu = medproc.load(d, device="gpu")
    (res,) = medproc.resample_batch([gpu], medproc.Spec(spacing=2.0), device="gpu")
    ref = medproc.resample(cpu, spacing=2.0)
    assert res.device.startswith("cuda") and res.shape == ref.shape
    np.testing.assert_allclose(res.numpy().array, ref.array, atol=1e-3)
    np.testing.assert_allclose(res.affine, ref.affine, atol=1e-6)
    # straight into medproc convert on the GPU: same output as the CPU path
    out = tmp_path / name
    assert (
        main(
            [
                "convert",
                os.path.join(synthetic, name),
                "-o",
                str(out),
                "--spacing",
                "2",
                "--device",
                "gpu",
                "-j",
                "1",
            ]
        )
        == 0
    )
    import csv

    (row,) = list(csv.DictReader(open(out / "manifest.csv")))
    assert row["decode"] == "gpu (nvImageCodec)"
    assert row["in_shape"] == "96x96x3" and row["out_shape"] == "x".join(map(str, ref.shape))
    np.testing.assert_allclose(medproc.load(row["output"]).array, ref.array, atol=1e-3)


def test_sof_first_keeps_the_pixels():
    """The stream correction for nvJPEG (SOF moved before the tables) decodes to the same pixels
    with an independent CPU decoder."""
    import imagecodecs

    a = np.random.default_rng(0).integers(0, 4096, (64, 48)).astype(np.uint16)
    raw = imagecodecs.ljpeg_encode(a, bitspersample=12)
    fixed = dec.sof_first(raw)
    assert fixed != raw and fixed[2:4] == b"\xff\xc3" and len(fixed) == len(raw)
    np.testing.assert_array_equal(imagecodecs.ljpeg_decode(fixed), a)
    from pydicom.data import get_testdata_file
    from pydicom.encaps import generate_frames

    ds = pydicom.dcmread(get_testdata_file("JPEG-LL.dcm"))  # a real JPEG lossless file
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    from pydicom.encaps import encapsulate

    ds.PixelData = encapsulate([dec.sof_first(frame)])
    np.testing.assert_array_equal(
        ds.pixel_array, pydicom.dcmread(get_testdata_file("JPEG-LL.dcm")).pixel_array
    )
    assert dec.sof_first(b"not a jpeg") == b"not a jpeg"


def _nvimgcodec_like(frame: bytes):
    """What the GPU decoder returns for a J2K or lossless JPEG frame with dtype uint16, emulated on
    the CPU with independent decoders (openjpeg / liblj92 via imagecodecs): samples of precision p
    scaled up to 16 bits, signed samples clamped at 0. The probe on the GPU proves the real one."""
    import imagecodecs
    import torch

    jpeg = frame[:2] == b"\xff\xd8"
    x = (imagecodecs.ljpeg_decode(frame) if jpeg else imagecodecs.jpeg2k_decode(frame)).astype(
        np.int64
    )
    _, p, cs_signed = dec.stream_header(frame)
    if cs_signed:
        x = np.clip(x, 0, None)
    return torch.as_tensor(np.rint(x * 65535 / (2**p - 1)).astype(np.int32))


@pytest.mark.parametrize("ts", ["1.2.840.10008.1.2.4.90", "1.2.840.10008.1.2.4.70"])
def test_precision_correction_recovers_pydicom_values_from_a_scaled_unsigned_decode(synthetic, ts):
    """The precision correction (J2K components declared unsigned; then the scaling from the
    stream's precision and the DC shift undone; then pydicom's sign rule) gives pydicom's values
    on every lossless J2K / JPEG lossless file here, signed ones included; without the stream
    rewrite, signed J2K files lose their negative values."""
    from pydicom.encaps import generate_frames

    files = [
        f
        for f in _compressed_files()
        if str(pydicom.dcmread(f, stop_before_pixels=True).file_meta.TransferSyntaxUID) == ts
    ]
    files += sorted(
        glob.glob(os.path.join(synthetic, "j2k*" if ts.endswith("90") else "jpegll*", "*", "*.dcm"))
    )
    jpeg = ts.endswith("70")
    cfg = (
        {"dtype": "uint16", "fix": "precision"}
        if jpeg
        else {"dtype": "uint16", "fix": "precision", "stream": "j2k_unsigned"}
    )
    seen_signed = 0
    for f in files:
        ds = pydicom.dcmread(f)
        if int(ds.get("SamplesPerPixel") or 1) != 1 or "PixelData" not in ds:
            continue
        ref = ds.pixel_array
        ref = ref[None] if ref.ndim == 2 else ref
        frames = list(
            generate_frames(ds.PixelData, number_of_frames=int(ds.get("NumberOfFrames") or 1))
        )
        bits, signed = int(ds.BitsStored), bool(int(ds.PixelRepresentation))
        for fr, r in zip(frames, ref):
            siz = dec.stream_header(fr)
            if int(ds.BitsAllocated) == 8:
                continue  # 8-bit: the GPU route has no uint16 scaling question
            got = dec._fix(_nvimgcodec_like(dec.j2k_unsigned(fr)), cfg["fix"], bits, signed, siz)
            np.testing.assert_array_equal(
                got.numpy().astype(np.int64), r.astype(np.int64), err_msg=f
            )
            if not jpeg and siz[2] and r.min() < 0:
                seen_signed += 1
                plain = dec._fix(_nvimgcodec_like(fr), cfg["fix"], bits, signed, siz).numpy()
                assert not np.array_equal(plain, r), "without the rewrite the negatives are lost"
    assert seen_signed > 0 or jpeg
    assert dec.config_applies(cfg, ts) and not dec.config_applies(cfg, "1.2.840.10008.1.2.5")
    assert not dec.config_applies({**cfg, "stream": "j2k_unsigned"}, "1.2.840.10008.1.2.4.70")
    assert dec.j2k_unsigned(b"\xff\xd8 not j2k") == b"\xff\xd8 not j2k"


def test_synthetic_jpeg_lossless_is_sv1_and_lossless(tmp_path):
    """The synthetic JPEG lossless series really are process 14 selection value 1 (predictor 1 in
    the SOS header, as the transfer syntax says) and decode to the phantom's values."""
    from pydicom.encaps import generate_frames

    from medproc.sample_data import ct_phantom, grid_affine, write_dicom_series

    shape = (36, 40, 2)  # (i, j, k): 36 columns, 40 rows, 2 slices
    aff = grid_affine(shape, (1.0, 1.0, 2.0), (-20.0, -18.0, 0.0))
    img, _ = ct_phantom(shape, aff, [], seed=3)
    for signed in (False, True):
        d = tmp_path / str(signed)
        write_dicom_series(
            str(d),
            medproc.Volume(img, aff),
            "1.2.826.0.1.3680043.8.498.9",
            signed=signed,
            transfer_syntax="1.2.840.10008.1.2.4.70",
        )
        vol = medproc.load(str(d))
        assert vol.shape == shape
        np.testing.assert_allclose(vol.affine, aff, atol=1e-5)
        np.testing.assert_array_equal(vol.array, img if signed else np.clip(img, -1024, 3071))
        ds = pydicom.dcmread(sorted(glob.glob(str(d / "*.dcm")))[0])
        assert (int(ds.Rows), int(ds.Columns)) == (40, 36)
        frame = next(generate_frames(ds.PixelData, number_of_frames=1))
        sos = frame.index(b"\xff\xda")
        ns = frame[sos + 4]
        assert frame[sos + 5 + 2 * ns] == 1, "predictor (Ss) must be 1 for SV1"


def test_probe_selection_prefers_the_precision_fix_and_keeps_lossy_syntaxes_off_the_gpu(tmp_path):
    """The probe's table rule: per key, the first preferred configuration exact on every file; a
    key with any inexact or undecodable file stays on the CPU; lossy syntaxes never enter."""
    import json

    from probe_gpu_decode import apply_policy, from_log, preference

    prec = next(c for c in preference() if dec.CONFIGS[c]["fix"] == "precision")
    assert preference()[0] == prec
    j2k = "1.2.840.10008.1.2.4.90|16|12|0|1|MONOCHROME2"
    lossy = "1.2.840.10008.1.2.4.91|16|12|0|1|MONOCHROME2"
    jll = "1.2.840.10008.1.2.4.70|16|12|0|1|MONOCHROME2"
    log = tmp_path / "probe.log"
    log.write_text(
        "\n".join(
            [
                f"a.dcm {j2k} {{1: 0, 4: 0, {prec}: 0}}",
                f"b.dcm {j2k} {{1: 26436, 4: 0, {prec}: 0}}",
                f"c.dcm {lossy} {{4: 0, {prec}: 0}}",
                f"d.dcm {jll} {{1: 0, {prec}: 0}}",
                f"e.dcm {jll} {{1: 65535, {prec}: 4095}}",
                "some other line",
            ]
        )
    )
    table = tmp_path / "table.json"
    table.write_text(
        json.dumps(
            {
                "entries": {},
                "unsupported": {
                    "1.2.840.10008.1.2.4.51|16|12|0|1|MONOCHROME2": {
                        "x.dcm": "pydicom cannot decode: no"
                    }
                },
            }
        )
    )
    from_log(str(log), str(table))
    doc = json.loads(table.read_text())
    assert list(doc["entries"]) == [j2k]
    assert doc["entries"][j2k] == {"config": dec.CONFIGS[prec], "files": ["a.dcm", "b.dcm"]}
    assert doc["unsupported"][jll]["e.dcm"]["1"] == 65535  # (JSON keys are strings)
    assert doc["unsupported"][lossy]["policy"].startswith("lossy syntax")
    assert "x.dcm" in doc["unsupported"]["1.2.840.10008.1.2.4.51|16|12|0|1|MONOCHROME2"]
    assert apply_policy({"entries": {}, "unsupported": {}}) == {"entries": {}, "unsupported": {}}


def test_compressed_series_decode_in_parallel_processes_equal_serial(tmp_path):
    """Compressed files decode in a process pool (pydicom's decoders hold the GIL): same volume
    as the serial read; a corrupt file still fails the load with its name."""
    from medproc.io.dicom_read import decode_workers
    from medproc.sample_data import ct_phantom, grid_affine, write_dicom_series

    shape = (64, 64, 12)  # (i, j, k): 64 columns, 64 rows, 12 slices
    aff = grid_affine(shape, (1.0, 1.0, 2.0), (-32.0, -32.0, 0.0))
    img, _ = ct_phantom(shape, aff, [], seed=5)
    d = tmp_path / "j2k"
    write_dicom_series(
        str(d),
        medproc.Volume(img, aff),
        "1.2.826.0.1.3680043.8.498.12",
        signed=True,
        transfer_syntax="1.2.840.10008.1.2.4.90",
    )
    serial = medproc.load(str(d), workers=1)
    medproc.resample(serial, spacing=4.0)  # a live DALI pipeline (its threads) before the fork
    parallel = medproc.load(str(d), workers=2)
    np.testing.assert_array_equal(parallel.array, serial.array)
    np.testing.assert_array_equal(serial.array, img)
    np.testing.assert_allclose(parallel.affine, serial.affine)
    assert parallel.meta["decode"] == "cpu (pydicom)"
    # a frame whose compressed stream is cut short
    assert len(glob.glob(str(d / "*.dcm"))) == 12
    victim = sorted(glob.glob(str(d / "*.dcm")))[5]
    ds = pydicom.dcmread(victim)
    from pydicom.encaps import encapsulate, generate_frames

    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    ds.PixelData = encapsulate([frame[: len(frame) // 3]])
    ds.save_as(victim)
    with pytest.raises(medproc.ReadError, match=os.path.basename(victim)):
        medproc.load(str(d), workers=2)
    assert decode_workers(10) == 1 and decode_workers(10, 3) == 3
    assert decode_workers(400) == max(1, min(os.cpu_count() or 1, 16))
