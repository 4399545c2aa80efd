"""``medproc convert`` against inputs a hostile-input review found mishandled: names that
collide with another case's label, labels paired by file name that fit two images, label
folders that pair nothing, case lists naming an image twice, values float32 cannot hold,
unreadable numbers in lesion files, lesion keys that match no case, a rerun adding --qc, label
maps no training layout can hold, and output grids whose resampling would not fit in memory."""

import csv
import os
import shutil

import nibabel as nib
import numpy as np
import pytest

import medproc
from medproc.cli import main


def _images(sample_data):
    return os.path.join(sample_data, "nifti", "images")


def _labels(sample_data):
    return os.path.join(sample_data, "nifti", "labels")


def _manifest(out):
    with open(os.path.join(out, "manifest.csv"), newline="") as f:
        return {r["case"]: r for r in csv.DictReader(f)}


def test_an_image_named_like_another_case_s_label_does_not_overwrite_it(sample_data, tmp_path):
    """Case "case001" (with a label) writes case001_label.nii.gz: an image named
    "case001_label" gets another name instead of overwriting that label (or being overwritten)."""
    i, lab = tmp_path / "i", tmp_path / "l"
    i.mkdir(), lab.mkdir()
    shutil.copy(os.path.join(_images(sample_data), "case001.nii.gz"), i)
    shutil.copy(os.path.join(_images(sample_data), "case002.nii.gz"), i / "case001_label.nii.gz")
    shutil.copy(os.path.join(_labels(sample_data), "case001.nii.gz"), lab)
    out = tmp_path / "o"
    assert (
        main(["convert", str(i), "--labels", str(lab), "-o", str(out), "--spacing", "3", "-q"]) == 0
    )
    m = _manifest(out)
    files = [r["output"] for r in m.values()] + [r["label_output"] for r in m.values()]
    files = [f for f in files if f]
    assert len(files) == len(set(files)) == 3  # two images, one label: three files
    label = np.asarray(nib.load(m["case001"]["label_output"]).dataobj)
    assert label.dtype == np.uint8 and set(np.unique(label)) <= {0, 1, 2}  # the label, not CT


def test_one_label_named_like_two_images_fails_both_saying_why(sample_data, tmp_path):
    i, lab = tmp_path / "i", tmp_path / "l"
    (i / "a").mkdir(parents=True), (i / "b").mkdir(), lab.mkdir()
    for d in ("a", "b"):
        shutil.copy(os.path.join(_images(sample_data), "case001.nii.gz"), i / d)
    shutil.copy(os.path.join(_labels(sample_data), "case001.nii.gz"), lab)
    out = tmp_path / "o"
    assert (
        main(["convert", str(i), "--labels", str(lab), "-o", str(out), "--spacing", "3", "-q"]) == 1
    )
    rows = list(_manifest(out).values())
    assert len(rows) == 2 and all(r["status"] == "failed" for r in rows)
    assert all("is named like 2 images" in r["error"] and "ambiguous" in r["error"] for r in rows)


def test_a_labels_folder_that_pairs_nothing_is_said(sample_data, tmp_path, capsys):
    empty = tmp_path / "l"
    empty.mkdir()
    out = tmp_path / "o"
    assert main(["convert", _images(sample_data), "--labels", str(empty), "-o", str(out)]) == 0
    assert "no label file is named like any of the 2 image(s)" in capsys.readouterr().err


def test_a_case_list_naming_an_image_twice_as_two_cases_fails_the_second(sample_data, tmp_path):
    img = os.path.join(_images(sample_data), "case001.nii.gz")
    lab = os.path.join(_labels(sample_data), "case001.nii.gz")
    p = tmp_path / "list.csv"
    p.write_text(f"image,label,name\n{img},{lab},a\n{img},,b\n")
    out = tmp_path / "o"
    assert main(["convert", str(p), "-o", str(out), "--spacing", "3", "-q"]) == 1
    m = _manifest(out)
    assert m["a"]["status"] == "ok" and m["b"]["status"] == "failed"
    assert "listed again" in m["b"]["error"] and str(p) in m["b"]["error"]


def test_values_beyond_float32_fail_the_case_naming_the_file(tmp_path):
    d = tmp_path / "i"
    d.mkdir()
    nib.save(nib.Nifti1Image(np.full((6, 6, 6), 1e300), np.eye(4)), str(d / "big.nii.gz"))
    nib.save(nib.Nifti1Image(np.full((6, 6, 6), 1e30), np.eye(4)), str(d / "fine.nii.gz"))
    out = tmp_path / "o"
    assert main(["convert", str(d), "-o", str(out), "-q"]) == 1
    m = _manifest(out)
    assert m["fine"]["status"] == "ok" and m["big"]["status"] == "failed"
    assert "big.nii.gz" in m["big"]["error"] and "beyond float32's range" in m["big"]["error"]
    assert np.isfinite(np.asarray(nib.load(m["fine"]["output"]).dataobj)).all()


def test_a_lesion_file_with_an_unreadable_number_is_a_usage_error(sample_data, tmp_path, capsys):
    f = tmp_path / "les.json"
    f.write_text(
        '{"cases": [{"image": "case001", "lesions": [{"points": [[1' + "0" * 5000 + "]]}]}]}"
    )
    out = tmp_path / "o"
    assert main(["convert", _images(sample_data), "-o", str(out), "--annotations", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}: holds a value that cannot be read as a number" in err and "bug" not in err


def test_lesion_keys_that_match_no_case_are_said(sample_data, tmp_path, capsys):
    f = tmp_path / "les.csv"
    rows = open(os.path.join(sample_data, "lesions.csv")).read()
    f.write_text(rows + "9.9.9.9,1,2,3,5\n")
    out = tmp_path / "o"
    assert main(["convert", _images(sample_data), "-o", str(out), "--annotations", str(f)]) == 0
    err = capsys.readouterr().err
    assert "match no case" in err and "9.9.9.9" in err and "case001" not in err.split("used:")[1]
    assert "only in upper/lower case" not in err


def test_lesion_keys_differing_from_a_case_only_in_case_are_pointed_out(
    sample_data, tmp_path, capsys
):
    """'CASE001' matched no case, said only as a key matching no case: the image got no
    lesions, though its name is one key away."""
    f = tmp_path / "les.csv"
    rows = open(os.path.join(sample_data, "lesions.csv")).read().replace("case001,", "CASE001,")
    assert "CASE001," in rows
    f.write_text(rows)
    out = tmp_path / "o"
    assert main(["convert", _images(sample_data), "-o", str(out), "--annotations", str(f)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "1 differs from a case's name only in upper/lower case: 'CASE001' ~ 'case001'" in err


def test_a_rerun_adding_qc_makes_the_pictures_saying_so(sample_data, tmp_path, capsys):
    out = tmp_path / "o"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3"]
    assert main(args + ["-q"]) == 0 and not (out / "qc").exists()
    capsys.readouterr()
    assert main(args + ["--qc"]) == 0
    assert sorted(os.listdir(out / "qc")) == ["case001.png", "case002.png"]
    err = capsys.readouterr().err
    assert "2 case(s) converted by an earlier run (case001, case002) lack the QC picture" in err


def test_a_rerun_adding_a_file_with_other_options_is_still_refused(sample_data, tmp_path):
    """Adding --qc (or --labels, --annotations) does not bypass the check of the options the
    outputs were made with: they would be silently remade with the new spacing."""
    out = tmp_path / "o"
    args = ["convert", _images(sample_data), "-o", str(out), "-q"]
    assert main(args + ["--spacing", "3"]) == 0
    stamps = {f: os.stat(out / f).st_mtime_ns for f in os.listdir(out) if f.endswith(".nii.gz")}
    assert main(args + ["--spacing", "2", "--qc"]) == 2
    assert {f: os.stat(out / f).st_mtime_ns for f in stamps} == stamps
    assert not (out / "qc").exists()


def test_dry_run_fails_the_cases_the_run_would_refuse_for_size(
    sample_data, tmp_path, monkeypatch, capsys
):
    """The output-size check, from the headers alone (DICOM series and NIfTI): with a cap
    between the two NIfTI cases' needs, the dry run and the real run fail the same case."""
    inputs = [os.path.join(sample_data, "dicom"), _images(sample_data)]
    out = tmp_path / "o"
    assert main(["convert", *inputs, "-o", str(out), "--spacing", "0.002", "--dry-run"]) == 1
    text = capsys.readouterr().out
    assert "0 to convert, 0 already done, 4 failed" in text and "twice the output" in text
    assert "ct_axial: the output grid would be" in text and not out.exists()
    # both are 100 x 100 x 36 voxels, case001 at 3 x 3 x 2 mm, case002 at 3 mm: at 0.5 mm
    # the outputs are 600 x 600 x 144 and x 216 float32 voxels; a cap between the two needs
    need = [2 * 600 * 600 * n * 4 for n in (144, 216)]
    monkeypatch.setenv("MEDPROC_MAX_BYTES", str((need[0] + need[1]) // 2))
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "0.5"]
    assert main(args + ["--dry-run"]) == 1
    listed = capsys.readouterr().out
    assert "fail         case002" in listed and "convert      case001" in listed
    assert main(args + ["-q"]) == 1
    assert {r["case"]: r["status"] for r in _manifest(out).values()} == {
        "case001": "ok",
        "case002": "failed",
    }


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda a: a.astype(np.int16) - 3, "negative values"),
        (lambda a: np.stack([a, a], -1), "2 values per voxel"),
        (lambda a: a.astype(np.float32) + 0.5, "must hold whole numbers"),
    ],
)
def test_label_maps_no_layout_can_hold_fail_it_naming_the_file(sample_data, tmp_path, bad, message):
    from medproc.layouts import write_nnunet

    src = medproc.load(os.path.join(_labels(sample_data), "case001.nii.gz"))
    lab = tmp_path / "lab.nii.gz"
    nib.save(nib.Nifti1Image(bad(np.asarray(src.array)), src.affine), str(lab))
    image = os.path.join(_images(sample_data), "case001.nii.gz")
    out = tmp_path / "o"
    assert main(["convert", image, "-o", str(out), "--spacing", "3", "-q"]) == 0
    uid = next(iter(_manifest(out)))
    with pytest.raises(medproc.errors.MedprocError, match=message) as e:
        write_nnunet(str(out), tmp_path / "Dataset009_Bad", labels={uid: str(lab)})
    assert str(lab) in str(e.value)
    assert not (tmp_path / "Dataset009_Bad").exists()


def test_an_output_whose_resampling_would_not_fit_is_refused(monkeypatch):
    """The check counts the resampling's peak (about twice the float32 output, and the input),
    not the output alone: an output of half the cap is refused."""
    vol = medproc.Volume(np.zeros((10, 10, 10), np.int16), np.diag([1.0, 1.0, 1.0, 1.0]))
    monkeypatch.setenv("MEDPROC_MAX_BYTES", str(2 * 40**3 * 4))  # twice the output below
    medproc.resample(vol, shape=(38, 38, 38))  # needs ~2 x 219 KB + 2 KB: fits
    with pytest.raises(medproc.errors.UsageError, match="twice the output"):
        medproc.resample(vol, shape=(40, 40, 40))  # output = half the cap, resampling more


def test_a_read_only_datalist_target_stops_before_any_work(sample_data, tmp_path, monkeypatch):
    """(As root every folder is writable: the permission check is faked for the target.)"""
    target = tmp_path / "ro"
    target.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if str(p) == str(target) else real(p, m))
    out = tmp_path / "o"
    args = ["convert", _images(sample_data), "-o", str(out), "--layout", "monai"]
    assert main(args + ["--dataset", str(target / "d.json")]) == 2
    assert not out.exists()


def test_the_output_size_check_takes_tensors_too():
    """Volumes holding torch tensors (medproc.load(..., device="gpu") gives CUDA ones) are
    sized by their element size: the check broke every GPU read once (torch dtypes are not
    numpy's)."""
    torch = pytest.importorskip("torch")
    vol = medproc.Volume(torch.zeros((10, 10, 10), dtype=torch.int16), np.eye(4))
    assert medproc.resample(vol, spacing=2.0).shape == (5, 5, 5)


def test_a_nifti_whose_gzip_check_fails_is_refused_naming_it(sample_data, tmp_path):
    """nibabel stops reading at the voxels' end, so a .nii.gz with a damaged gzip trailer (its
    CRC-32) read as valid: the whole stream is checked now."""
    src = os.path.join(_images(sample_data), "case001.nii.gz")
    data = bytearray(open(src, "rb").read())
    data[-8] ^= 0xFF  # the CRC-32 of the trailer
    d = tmp_path / "i"
    d.mkdir()
    (d / "bad.nii.gz").write_bytes(bytes(data))
    shutil.copy(os.path.join(_images(sample_data), "case002.nii.gz"), d)
    with pytest.raises(medproc.errors.ReadError, match="bad.nii.gz: its gzip data is damaged"):
        medproc.load(str(d / "bad.nii.gz"))
    good = medproc.load(src)
    np.testing.assert_array_equal(good.array, np.asanyarray(nib.load(src).dataobj))
    assert good.array.flags.writeable
    out = tmp_path / "o"
    assert main(["convert", str(d), "-o", str(out), "--spacing", "3", "-q"]) == 1
    m = _manifest(out)
    assert m["bad"]["status"] == "failed" and m["case002"]["status"] == "ok"


@pytest.mark.parametrize(
    "text", ["img,x\nfoo,bar\n", "image\n\x00\n", "image,label\n,lab.nii.gz\n"]
)
def test_a_malformed_case_list_stops_before_the_output_folder_is_made(tmp_path, capsys, text):
    p = tmp_path / "list.csv"
    p.write_text(text)
    out = tmp_path / "o"
    assert main(["convert", str(p), "-o", str(out)]) == 2
    assert str(p) in capsys.readouterr().err
    assert not out.exists()  # not even the lock file


def test_an_integer_dtype_that_clips_the_values_is_said(sample_data, tmp_path, capsys):
    """--dtype uint8 on CT saturates every negative HU: said per case (warning line and the
    manifest), not when a scale maps the values into the type's range."""
    out = tmp_path / "o"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3", "--dtype", "uint8"]
    assert main(args) == 0
    assert "reach the uint8 output, whose range is 0..255" in capsys.readouterr().err
    m = _manifest(out)
    assert all("those outside are clipped" in r["warnings"] for r in m.values())
    out2 = tmp_path / "o2"
    scaled = ["--clip", "-100", "200", "--scale", "0", "255"]
    assert main(args[:2] + ["-o", str(out2)] + args[4:] + scaled) == 0
    assert "clipped" not in capsys.readouterr().err
    assert not any("clipped" in r["warnings"] for r in _manifest(out2).values())


def test_a_foreground_crop_that_finds_nothing_is_said_and_recorded_per_case(sample_data, tmp_path):
    """A threshold above every voxel keeps the whole grid: said naming the case (once: the
    second case's note is word for word the same, so it is not printed again) and recorded in
    every case's manifest row (the GPU service plans elsewhere, so the worker notes it on both
    routes)."""
    out = tmp_path / "o"
    spec = medproc.Spec(spacing=3, crop_foreground=1e6)
    from medproc.convert import convert

    with pytest.warns(medproc.errors.MedprocWarning) as got:
        convert([_images(sample_data)], str(out), spec, workers=1)
    said = [str(w.message) for w in got if "crop_foreground" in str(w.message)]
    assert len(said) == 1 and "no voxel is above 1000000.0: not cropped" in said[0]
    assert said[0].startswith(os.path.join(_images(sample_data), "case001.nii.gz"))
    m = _manifest(out)
    assert len(m) == 2 and all("no voxel is above" in r["warnings"] for r in m.values())
    vol = medproc.load(os.path.join(_images(sample_data), "case001.nii.gz"))
    with pytest.warns(medproc.errors.MedprocWarning, match=r"case001.nii.gz: crop_foreground"):
        medproc.resample(vol, spec=medproc.Spec(spacing=3, crop_foreground=1e6))


def test_a_label_map_off_its_image_grid_fails_the_case_naming_both(sample_data, tmp_path):
    labels = tmp_path / "labels"
    labels.mkdir()
    src = medproc.load(os.path.join(_labels(sample_data), "case001.nii.gz"))
    nib.save(
        nib.Nifti1Image(np.asarray(src.array)[:, :, :-1], src.affine),
        str(labels / "case001.nii.gz"),
    )
    out = tmp_path / "o"
    image = os.path.join(_images(sample_data), "case001.nii.gz")
    assert main(["convert", image, "--labels", str(labels), "-o", str(out), "-q"]) == 1
    (row,) = _manifest(out).values()
    assert row["status"] == "failed" and "is not on the grid of" in row["error"]
    assert str(labels / "case001.nii.gz") in row["error"] and image in row["error"]


def test_dry_run_sizes_inputs_as_the_readers_load_them(tmp_path, monkeypatch, capsys):
    """A 2-D NIfTI crashed the dry run (the reader makes it one slice); an int16 NRRD was
    counted at 4 bytes a voxel, so a cap the run fits under failed it in the dry run."""
    d = tmp_path / "in"
    d.mkdir()
    nib.save(nib.Nifti1Image(np.zeros((50, 40), np.int16), np.eye(4)), str(d / "flat.nii.gz"))
    medproc.save(medproc.Volume(np.zeros((100, 100, 100), np.int16), np.eye(4)), d / "cube.nrrd")
    out = tmp_path / "o"
    # cube: 2 x 4 MB (float32 output, twice) + 2 MB (int16 input) = 10 MB; at 4 bytes 12 MB
    monkeypatch.setenv("MEDPROC_MAX_BYTES", str(11_000_000))
    assert main(["convert", str(d), "-o", str(out), "--spacing", "1", "--dry-run"]) == 0
    listed = capsys.readouterr().out
    assert "convert      cube" in listed and "convert      flat" in listed
    assert main(["convert", str(d), "-o", str(out), "--spacing", "1", "-q"]) == 0


def _a_converted_beside_another_a(sample_data, tmp_path):
    """Folders A and B each with an a.nii.gz (different images); A converted into out:
    (out, the convert options, A's output bytes)."""
    for d, src in (("A", "case001.nii.gz"), ("B", "case002.nii.gz")):
        (tmp_path / d).mkdir()
        shutil.copy(os.path.join(_images(sample_data), src), tmp_path / d / "a.nii.gz")
    out = tmp_path / "out"
    args = ["-o", str(out), "--spacing", "3", "-q"]
    assert main(["convert", str(tmp_path / "A"), *args]) == 0
    return out, args, open(out / "a.nii.gz", "rb").read()


def test_a_later_run_of_another_input_never_overwrites_an_earlier_case(sample_data, tmp_path):
    """Two folders each with an a.nii.gz, converted one after the other into one -o: the
    second takes another name, as two such cases of one run do (it replaced the first)."""
    out, args, first = _a_converted_beside_another_a(sample_data, tmp_path)
    assert main(["convert", str(tmp_path / "B"), *args]) == 0
    assert open(out / "a.nii.gz", "rb").read() == first
    m = _manifest(out)
    assert len(m) == 2 and m["a"]["source"] == str(tmp_path / "A" / "a.nii.gz")
    (other,) = [r for c, r in m.items() if c != "a"]
    assert other["source"] == str(tmp_path / "B" / "a.nii.gz") and other["status"] == "ok"
    assert main(["convert", str(tmp_path / "A"), *args]) == 0  # and A again: skipped
    assert _manifest(out)["a"]["status"] == "skipped"


def test_another_input_never_replaces_an_output_whatever_its_row_says_and_moves_keep_names(
    sample_data, tmp_path
):
    """The earlier row failed or was not started, yet its output is on disk from input A: B's
    case takes another name. A moved input (A renamed) is the same input: its name is kept,
    no duplicate case."""
    import csv as _csv

    out, args, first = _a_converted_beside_another_a(sample_data, tmp_path)
    rows = list(_csv.DictReader(open(out / "manifest.csv", newline="")))
    rows[0]["status"] = "not started"
    with open(out / "manifest.csv", "w", newline="") as f:
        w = _csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert main(["convert", str(tmp_path / "B"), *args]) == 0
    assert open(out / "a.nii.gz", "rb").read() == first  # A's output untouched
    out2 = tmp_path / "out2"
    args2 = ["-o", str(out2), "--spacing", "3", "-q"]
    assert main(["convert", str(tmp_path / "A"), *args2]) == 0
    os.rename(tmp_path / "A", tmp_path / "A_moved")
    assert main(["convert", str(tmp_path / "A_moved"), *args2]) == 0
    assert sorted(_manifest(out2)) == ["a"]  # the same input, moved: one case


def test_runs_started_from_other_folders_know_their_inputs(sample_data, tmp_path, monkeypatch):
    """Relative inputs: the manifest records absolute sources, so a later run started from
    another folder skips the same input and never replaces another input's output."""
    out, args, first = _a_converted_beside_another_a(sample_data, tmp_path)
    assert os.path.isabs(_manifest(out)["a"]["source"])
    monkeypatch.chdir(tmp_path / "B")
    assert main(["convert", ".", *args]) == 0  # B's a.nii.gz, from B, relative
    assert open(out / "a.nii.gz", "rb").read() == first and len(_manifest(out)) == 2
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "A", *args]) == 0
    assert _manifest(out)["a"]["status"] == "skipped"


def test_a_bug_inside_a_case_shows_its_traceback_with_v(sample_data, tmp_path, monkeypatch):
    from medproc import _convert_case

    def boom(*a, **k):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(_convert_case, "_convert_one", boom)
    images = _images(sample_data)
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("medproc.convert").addHandler(handler)
    logging.getLogger("medproc.convert").setLevel(logging.INFO)
    try:
        assert main(["convert", images, "-o", str(tmp_path / "o"), "-j", "1", "-q"]) == 1
    finally:
        logging.getLogger("medproc.convert").removeHandler(handler)
    text = "\n".join(r.getMessage() for r in records)
    assert "Traceback" in text and "simulated bug" in text


def test_a_bug_in_a_pool_worker_sends_its_traceback_back(monkeypatch, caplog):
    """A worker's log may be lost (spawned workers, Dask): the traceback travels in the
    result, for the main process to log, and the worker logs nothing itself."""
    from medproc import _convert_case
    from medproc.cases import Case

    def boom(*a, **k):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(_convert_case, "_convert_one", boom)
    caplog.set_level("INFO", logger="medproc")
    case = Case(source="/x/a.nii.gz")
    got_case, status, info, err = _convert_case._worker((case,))
    assert status == "failed" and err == "/x/a.nii.gz: RuntimeError: simulated bug"
    assert "Traceback" in info["traceback"] and "simulated bug" in info["traceback"]
    assert not caplog.records


def test_cubic_overshoot_beyond_float32_fails_the_case(tmp_path):
    """Cubic interpolation overshoots: on values near float32's limits it made inf, written
    as "ok". The case fails, saying what to do; linear stays in range."""
    import nibabel as nib

    a = np.full((12, 12, 12), 3.3e38, np.float32)
    a[::2] = -3.3e38
    src = str(tmp_path / "big.nii.gz")
    nib.save(nib.Nifti1Image(a, np.eye(4)), src)
    args = ["convert", src, "--spacing", "0.5", "-q", "-j", "1"]
    assert main([*args, "-o", str(tmp_path / "o"), "--interp", "cubic"]) == 1
    (row,) = _manifest(tmp_path / "o").values()
    assert "cubic interpolation overshot float32's range" in row["error"]
    assert not os.path.exists(tmp_path / "o" / "big.nii.gz")
    assert main([*args, "-o", str(tmp_path / "o2")]) == 0
    assert np.isfinite(np.asanyarray(nib.load(tmp_path / "o2" / "big.nii.gz").dataobj)).all()


def test_a_label_map_with_several_values_per_voxel_fails_its_case_naming_it(sample_data, tmp_path):
    """A 4-D label file (two values per voxel) was resampled as two channels and then broke the
    training layout after the conversion: it fails its own case, naming the label file."""
    labels = tmp_path / "labels"
    labels.mkdir()
    src = medproc.load(os.path.join(_labels(sample_data), "case001.nii.gz"))
    four = np.stack([np.asarray(src.array)] * 2, axis=-1)
    nib.save(nib.Nifti1Image(four, src.affine), str(labels / "case001.nii.gz"))
    shutil.copy(os.path.join(_labels(sample_data), "case002.nii.gz"), labels / "case002.nii.gz")
    out = tmp_path / "o"
    args = ["convert", _images(sample_data), "--labels", str(labels), "-o", str(out), "-q"]
    assert main([*args, "--spacing", "3"]) == 1
    m = _manifest(out)
    assert m["case002"]["status"] == "ok" and m["case001"]["status"] == "failed"
    err = m["case001"]["error"]
    assert str(labels / "case001.nii.gz") in err and "2 values per voxel" in err


def test_a_4d_image_s_channels_are_in_the_manifest_and_the_sidecar(tmp_path):
    """A 3-channel image was written 10x10x5x3 while its manifest row said 10x10x5 (a prober's
    finding): the rows give the arrays' shapes, the sidecar the grid and its channels."""
    import json

    src = str(tmp_path / "four.nii.gz")
    rng = np.random.default_rng(0)
    nib.save(nib.Nifti1Image(rng.random((20, 20, 10, 3), dtype=np.float32), np.eye(4)), src)
    out = tmp_path / "o"
    assert main(["convert", src, "-o", str(out), "--spacing", "2", "-q", "-j", "1"]) == 0
    (row,) = _manifest(out).values()
    assert (row["in_shape"], row["out_shape"]) == ("20x20x10x3", "10x10x5x3")
    assert nib.load(out / "four.nii.gz").shape == (10, 10, 5, 3)
    side = json.load(open(out / "four.json"))
    assert side["output"]["shape"] == [10, 10, 5] and side["output"]["channels"] == 3


def test_integer_label_values_beyond_float32_fail_the_case_naming_the_label(sample_data, tmp_path):
    """Values above 2^24 cannot be resampled exactly: the case failed with the engine's
    'ValueError' naming the image; now a ReadError naming the label map."""
    labels = tmp_path / "labels"
    labels.mkdir()
    src = medproc.load(os.path.join(_labels(sample_data), "case001.nii.gz"))
    big = np.asarray(src.array).astype(np.uint32)
    big[big > 0] = 2**24 + 1
    nib.save(nib.Nifti1Image(big, src.affine), str(labels / "case001.nii.gz"))
    out = tmp_path / "o"
    args = ["convert", _images(sample_data), "--labels", str(labels), "-o", str(out), "-q"]
    assert main([*args, "--spacing", "3"]) == 1
    err = _manifest(out)["case001"]["error"]
    assert err.startswith(str(labels / "case001.nii.gz")) and "16777217" in err
    assert "ValueError" not in err


def test_a_note_made_before_a_case_failed_is_still_said(sample_data, tmp_path, monkeypatch, capsys):
    """The notes travel back with the case's row: a case that clips (--dtype int8) and then
    fails (its QC picture, here) says both."""
    import medproc.qc

    def qc_figure(*args, **kw):
        raise OverflowError("boom")

    monkeypatch.setattr(medproc.qc, "qc_figure", qc_figure)
    img = os.path.join(_images(sample_data), "case001.nii.gz")
    args = ["convert", img, "-o", str(tmp_path / "o"), "--spacing", "3", "--dtype", "int8"]
    assert main([*args, "-j", "1", "--qc"]) == 1
    err = capsys.readouterr().err
    assert "reach the int8 output" in err and "boom" in err
