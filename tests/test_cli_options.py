"""``medproc convert``: options are part of the result (manifest + ``<name>.json`` sidecar, a
rerun with other options refuses, ``--force`` redoes), naming fields, symlinked folders, DICOM
SEG/RTSTRUCT as annotations feeding ``--layout``, the number of workers and one header scan."""

import csv
import json
import os
import shutil
import sys

import nibabel as nib
import numpy as np
import pytest

import medproc
from medproc._procs import auto_workers
from medproc.cli import main
from medproc.convert import prepare


def _manifest(d):
    with open(os.path.join(d, "manifest.csv"), newline="") as f:
        return {r["case"]: r for r in csv.DictReader(f)}


def _images(sample_data):
    return os.path.join(sample_data, "nifti", "images")


def test_options_are_recorded_and_a_rerun_with_other_options_refuses(sample_data, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3"]
    assert main(args) == 0
    m = _manifest(out)
    for r in m.values():
        side = json.load(open(out / f"{r['case']}.json"))
        assert side["spec"]["spacing"] == [3.0, 3.0, 3.0] and side["format"] == "nii.gz"
        assert side["medproc_version"] == medproc.__version__ and side["device"] == "cpu"
        assert side["source"] == os.path.abspath(r["source"])
        src, img = nib.load(r["source"]), nib.load(r["output"])
        assert side["input"]["shape"] == list(src.shape)
        assert side["output"]["shape"] == list(img.shape)
        np.testing.assert_allclose(side["input"]["affine"], src.affine, atol=1e-5)
        np.testing.assert_allclose(side["output"]["affine"], img.affine, atol=1e-5)
        assert side["output"]["orientation"] == "".join(nib.aff2axcodes(img.affine))
        assert json.loads(r["options"])["spec"]["spacing"] == [3.0, 3.0, 3.0]
    stamps = {f: os.stat(out / f).st_mtime_ns for f in os.listdir(out) if f != ".medproc.lock"}
    capsys.readouterr()
    assert main(args[:-1] + ["2", "--orientation", "RAS"]) == 2
    err = capsys.readouterr().err
    assert "holds 2 case(s) converted with other options" in err
    assert "spacing: 3 x 3 x 3 before, 2 x 2 x 2 now" in err
    assert "orientation: none before, RAS now" in err and "--force" in err
    assert main(args + ["--clip", "-1000", "400"]) == 2  # said as the option is named
    err = capsys.readouterr().err
    assert "clip: none before, -1000 x 400 now" in err and "intensity." not in err
    assert {f: os.stat(out / f).st_mtime_ns for f in stamps} == stamps  # untouched
    assert main(args) == 0  # the same options: resumed, nothing redone
    assert {r["status"] for r in _manifest(out).values()} == {"skipped"}
    assert main(args[:-1] + ["2", "--orientation", "RAS", "--force"]) == 0
    for r in _manifest(out).values():
        assert r["status"] == "ok" and r["out_spacing"] == "2x2x2"
        assert json.load(open(out / f"{r['case']}.json"))["spec"]["orientation"] == "RAS"
        assert medproc.load(r["output"]).orientation == "RAS"


def test_another_format_or_name_template_is_refused_too(sample_data, tmp_path, capsys):
    """Outputs under other names (another --format, another --name) made with other options
    are refused like those under the same names: the folder would mix two option sets."""
    out = tmp_path / "out"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "2"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args[:-1] + ["3", "--format", "nii"]) == 2
    err = capsys.readouterr().err
    assert "format: nii.gz before, nii now" in err and "spacing: 2 x 2 x 2 before" in err
    assert "under other names (case001.nii.gz" in err
    assert main(args[:-1] + ["3", "--name", "x_{name}"]) == 2
    assert main(args[:-1] + ["2.0000001"]) == 2
    assert "2 x 2 x 2 before, 2.0000001 x 2.0000001 x 2.0000001 now" in capsys.readouterr().err
    assert not [f for f in os.listdir(out) if f.endswith(".nii") or f.startswith("x_")]
    assert main(args[:-1] + ["3", "--format", "nii", "--force"]) == 0
    m = _manifest(out)  # the same case names: their rows are this run's
    assert {(r["status"], r["output"][-4:]) for r in m.values()} == {("ok", ".nii")}


def test_the_same_inputs_under_another_name_are_refused_even_with_the_same_options(
    sample_data, tmp_path, capsys
):
    """A second --name with the same options would put each input in the folder, and in a
    layout made from it, twice (a validation case could train under its other name)."""
    out = tmp_path / "out"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3"]
    labels = ["--labels", os.path.join(sample_data, "nifti", "labels")]
    assert main(args + labels) == 0
    capsys.readouterr()
    again = args + labels + ["--name", "copy_{stem}", "--layout", "monai"]
    assert main(again) == 2
    err = capsys.readouterr().err
    assert "under other names (case001.nii.gz" in err and "made with these options" in err
    assert "--name they were made with" in err and "--force" in err
    assert not [f for f in os.listdir(out) if f.startswith("copy_")]
    assert main(again + ["--force"]) == 0
    doc = json.load(open(out / "datalist.json"))  # each input once: the older rows superseded
    assert sorted(x["image"] for x in doc["training"]) == [
        "copy_case001.nii.gz",
        "copy_case002.nii.gz",
    ]
    m = _manifest(out)
    assert {r["status"] for c, r in m.items() if not c.startswith("copy_")} == {"superseded"}


def test_a_folder_of_two_series_resumes_when_one_is_redone(sample_data, tmp_path, capsys):
    """Two series share one folder (one source path): redoing one of them is no 'input under
    another name' (the refusal above fired here, and the run could not resume)."""
    data = tmp_path / "data" / "patient"
    shutil.copytree(os.path.join(sample_data, "dicom", "ct_axial"), data)
    for n in os.listdir(os.path.join(sample_data, "dicom", "ct_oblique")):
        shutil.copy(os.path.join(sample_data, "dicom", "ct_oblique", n), data / f"obl_{n}")
    out = tmp_path / "out"
    args = ["convert", str(data.parent), "-o", str(out), "--spacing", "3", "-j", "1"]
    assert main(args) == 0
    assert len(_manifest(out)) == 2
    one = sorted(f for f in os.listdir(data) if f.startswith("obl_"))[0]
    os.utime(data / one, (1e9, 1e9))  # one series' input changed: it is redone
    capsys.readouterr()
    assert main(args) == 0, capsys.readouterr().err
    assert sorted(r["status"] for r in _manifest(out).values()) == ["ok", "skipped"]


def test_a_forced_run_under_other_names_resumes_without_force(sample_data, tmp_path):
    """After ``--force`` converted the inputs again under other names, an interrupted run of
    that same command continues without --force (the older outputs are marked superseded)."""
    out = tmp_path / "out"
    base = ["convert", _images(sample_data), "-o", str(out)]
    assert main(base + ["--spacing", "3"]) == 0
    again = base + ["--spacing", "4", "--name", "b_{name}"]
    assert main(again + ["--force"]) == 0
    redo = sorted(f for f in os.listdir(out) if f.startswith("b_") and f.endswith(".nii.gz"))[0]
    os.unlink(out / redo)  # as if the run had been interrupted before this case
    assert main(again) == 0  # resumes: no refusal, nothing else redone
    m = _manifest(out)
    assert (out / redo).exists()
    assert sorted(r["status"] for r in m.values() if r["case"].startswith("b_")) == [
        "ok",
        "skipped",
    ]
    assert {r["status"] for r in m.values() if not r["case"].startswith("b_")} == {"superseded"}


def test_npy_sidecar_keeps_the_cache_fields(sample_data, tmp_path):
    out = tmp_path / "o"
    image = os.path.join(_images(sample_data), "case001.nii.gz")
    assert main(["convert", image, "-o", str(out), "--spacing", "3", "--format", "npy"]) == 0
    side = json.load(open(out / "case001.json"))
    arr = np.load(out / "case001.npy")
    assert side["shape"] == list(arr.shape) and side["axes"] == "ijk"  # the cache's fields
    assert side["format"] == "npy" and side["output"]["shape"] == list(arr.shape)


def test_naming_fields_folder_series_number_description(sample_data, tmp_path, capsys):
    import pydicom

    out = tmp_path / "o"
    dicom = os.path.join(sample_data, "dicom")
    name = "{folder}_{series_number}_{description}"
    assert main(["convert", dicom, "-o", str(out), "--spacing", "4", "--name", name]) == 0
    got = sorted(r["case"] for r in _manifest(out).values())
    want = []
    for d in ("ct_axial", "ct_oblique"):
        f = sorted(os.listdir(os.path.join(dicom, d)))[0]
        ds = pydicom.dcmread(os.path.join(dicom, d, f), stop_before_pixels=True)
        want.append(f"{d}_{ds.SeriesNumber}_{ds.SeriesDescription.replace(' ', '_')}")
    assert got == sorted(want)
    image = os.path.join(_images(sample_data), "case001.nii.gz")
    assert main(["convert", image, "-o", str(tmp_path / "f"), "--spacing", "4",
                 "--name", "{folder}-{stem}"]) == 0  # fmt: skip
    assert list(_manifest(tmp_path / "f")) == ["images-case001"]
    capsys.readouterr()
    assert main(["convert", image, "-o", str(tmp_path / "g"), "--name", "{patient_id}"]) == 2
    err = capsys.readouterr().err
    assert "unknown field 'patient_id'" in err and "'folder'" in err and "'description'" in err


def test_symlinked_folders_are_followed_once_without_loops(sample_data, tmp_path):
    from medproc.io.walk import walk_inputs

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(os.path.join(_images(sample_data), "case001.nii.gz"), elsewhere)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    shutil.copy(os.path.join(_images(sample_data), "case002.nii.gz"), tree / "sub")
    os.symlink(elsewhere, tree / "linked")  # a dataset tree assembled from links
    os.symlink(tree / "sub", tree / "again")  # the same folder twice
    os.symlink(tree, tree / "sub" / "loop")  # a loop back up
    w = walk_inputs([str(tree)], keep=lambda n: n.endswith(".nii.gz"))
    assert sorted(os.path.basename(f) for f in w.files) == ["case001.nii.gz", "case002.nii.gz"]
    reasons = dict(w.skipped)
    assert "already scanned" in reasons[str(tree / "sub")]  # 'again' came first, by name
    assert "a loop" in reasons[str(tree / "again" / "loop")]
    out = tmp_path / "out"
    assert main(["convert", str(tree), "-o", str(out), "--spacing", "4"]) == 0
    assert sorted(_manifest(out)) == ["case001", "case002"]


def test_a_link_up_the_tree_never_leads_out_of_the_input(sample_data, tmp_path):
    """parent/mine/up -> .. converted parent/someone_else too (exit 0), as if it were an input;
    a link to / walked the whole file system."""
    from medproc.io.walk import walk_inputs

    mine, other = tmp_path / "parent" / "mine", tmp_path / "parent" / "someone_else"
    for d, n in ((mine, "case001"), (other, "case002")):
        d.mkdir(parents=True)
        shutil.copy(os.path.join(_images(sample_data), f"{n}.nii.gz"), d)
    os.symlink("..", mine / "up")
    os.symlink(tmp_path, mine / "root")  # (further up: like a link to /, which walked it all)
    w = walk_inputs([str(mine)], keep=lambda n: n.endswith(".nii.gz"))
    assert [os.path.basename(f) for f in w.files] == ["case001.nii.gz"]
    reasons = dict(w.skipped)
    assert "a folder above it (a loop)" in reasons[str(mine / "up")]
    assert "a folder above it (a loop)" in reasons[str(mine / "root")]
    out = tmp_path / "out"
    assert main(["convert", str(mine), "-o", str(out), "--spacing", "4", "-q"]) == 0
    assert sorted(_manifest(out)) == ["case001"]


def test_the_labels_folder_as_the_output_folder_is_refused_before_any_work(sample_data, tmp_path):
    """Outputs, sidecars and manifest.csv were written among the user's label maps."""
    labels = tmp_path / "labels"
    shutil.copytree(os.path.join(sample_data, "nifti", "labels"), labels)
    before = sorted(os.listdir(labels))
    args = ["convert", _images(sample_data), "--labels", str(labels), "-o", str(labels)]
    assert main([*args, "--spacing", "3", "--name", "{name}_x"]) == 2
    assert sorted(os.listdir(labels)) == before


def test_a_file_linked_under_two_names_is_read_once_and_the_other_name_said(sample_data, tmp_path):
    from medproc.inspect import inspect_paths

    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(os.path.join(_images(sample_data), "case001.nii.gz"), tree / "a.nii.gz")
    os.symlink(tree / "a.nii.gz", tree / "b.nii.gz")
    shutil.copy(os.path.join(_images(sample_data), "case002.nii.gz"), tree / "c.nii.gz")
    entries = inspect_paths([str(tree)])
    assert [os.path.basename(e.source) for e in entries] == ["a.nii.gz", "c.nii.gz", "b.nii.gz"]
    assert entries[-1].kind == "skipped" and "another name of" in entries[-1].error
    assert entries[-1].error.endswith("a.nii.gz (the same file): read once")
    out = tmp_path / "out"
    assert main(["convert", str(tree), "-o", str(out), "--spacing", "4", "-q"]) == 0
    assert sorted(_manifest(out)) == ["a", "c"]


def test_hard_links_links_first_and_links_into_outputs(sample_data, tmp_path, capsys):
    """A hard link is another name of the same file; a link met before its file yields to the
    file (the case is named after the file, whatever the order of the inputs); a link into
    the output folder, and a training dataset medproc wrote from it, are not inputs."""
    from medproc.io.walk import walk_inputs

    keep = lambda n: n.endswith(".nii.gz")  # noqa: E731
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    shutil.copy(os.path.join(_images(sample_data), "case001.nii.gz"), a / "z.nii.gz")
    os.symlink(a / "z.nii.gz", a / "alias.nii.gz")  # sorts before its file
    os.link(a / "z.nii.gz", b / "hard.nii.gz")
    for order in ([a, b], [b, a]):
        w = walk_inputs([str(p) for p in order], keep=keep)
        assert len(w.files) == 1 and len(w.skipped) == 2, (w.files, w.skipped)
        assert all("another name of" in r for _, r in w.skipped)
        assert not w.files[0].endswith("alias.nii.gz")  # the file, not the link
    out = tmp_path / "out"
    assert main(["convert", str(a), "-o", str(out), "--spacing", "4", "-v"]) == 0
    assert "skipped " + str(a / "alias.nii.gz") in capsys.readouterr().err
    assert sorted(_manifest(out)) == ["z"]
    os.symlink(out / "z.nii.gz", a / "from_out.nii.gz")
    w = walk_inputs([str(a)], keep=keep, exclude=[str(out)])
    assert dict(w.skipped)[str(a / "from_out.nii.gz")].startswith("a link into the output folder")
    # a dataset medproc wrote from that output folder: not an input, saying how to convert it
    ds = a / "Dataset009_X"
    ds.mkdir()
    (ds / ".medproc_source").write_text(str(out))
    shutil.copy(out / "z.nii.gz", ds / "z_0000.nii.gz")
    w = walk_inputs([str(a)], keep=keep, exclude=[str(out)])
    assert not any("Dataset009_X" in f for f in w.files)
    assert "name this folder itself to convert it" in dict(w.skipped)[str(ds)]
    assert walk_inputs([str(ds)], keep=keep).files == [str(ds / "z_0000.nii.gz")]  # named: read
    # one written from elsewhere is an ordinary folder
    (ds / ".medproc_source").write_text(str(tmp_path / "elsewhere"))
    assert str(ds / "z_0000.nii.gz") in walk_inputs([str(a)], keep=keep).files
    # an output folder above the inputs: a link to another input file is an input
    os.symlink(b / "hard.nii.gz", a / "to_b.nii.gz")
    w = walk_inputs([str(a)], keep=keep, exclude=[str(tmp_path)])
    assert "a link into the output folder" not in dict(w.skipped).get(str(a / "to_b.nii.gz"), "")


def test_named_links_a_folder_and_a_link_into_it_and_a_link_to_an_output(
    sample_data, tmp_path, monkeypatch, capsys
):
    inp = tmp_path / "in"
    inp.mkdir()
    shutil.copy(os.path.join(_images(sample_data), "case001.nii.gz"), inp / "zz_real.nii.gz")
    os.symlink(inp / "zz_real.nii.gz", inp / "aa_sym.nii.gz")
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "in", "in/aa_sym.nii.gz", "-o", "o", "--dry-run"]) == 0
    cap = capsys.readouterr()
    err = cap.out + cap.err
    assert "convert      zz_real" in err and "another name of zz_real" not in err
    assert err.count("in/aa_sym.nii.gz: another name of in/zz_real.nii.gz") == 1
    assert main(["convert", "in", "-o", "o", "--spacing", "4", "-q"]) == 0
    os.symlink(tmp_path / "o" / "zz_real.nii.gz", tmp_path / "linked_out.nii.gz")
    assert main(["convert", "linked_out.nii.gz", "-o", "o", "--dry-run"]) == 0
    assert "a link into the output folder" in capsys.readouterr().out


def test_a_file_system_without_inodes_still_tells_files_apart(tmp_path, monkeypatch):
    """st_ino 0 (some FUSE/SMB file systems): files are told apart by their real path."""
    from medproc.io import walk

    for n in range(5):
        (tmp_path / f"s{n}.dcm").write_bytes(b"x")
    real_stat = os.stat

    class NoInode:
        def __init__(self, st):
            self._st = st

        def __getattr__(self, k):
            return 0 if k == "st_ino" else getattr(self._st, k)

    real_lstat = os.lstat
    monkeypatch.setattr(walk.os, "stat", lambda p, *a, **k: NoInode(real_stat(p, *a, **k)))
    monkeypatch.setattr(walk.os, "lstat", lambda p, *a, **k: NoInode(real_lstat(p, *a, **k)))
    assert len({walk.file_identity(str(tmp_path / f"s{n}.dcm")) for n in range(5)}) == 5
    w = walk.walk_inputs([str(tmp_path)])
    assert len(w.files) == 5 and w.skipped == []


def _tree_with_seg(sample_data, tmp_path, modality=True):
    """A CT series and a DICOM SEG of it (without Modality: known by its SOP Class UID)."""
    import pydicom
    from test_layouts import _axial_label, _write_seg

    tree = tmp_path / "collection"
    shutil.copytree(os.path.join(sample_data, "dicom", "ct_axial"), tree / "ct")
    image, lab = _axial_label(sample_data)
    (tree / "seg").mkdir()
    seg = str(tree / "seg" / "seg.dcm")
    _write_seg(seg, image, lab, {1: "nodule right", 2: "nodule left"})
    if not modality:
        ds = pydicom.dcmread(seg)
        del ds.Modality
        ds.save_as(seg)
    return tree


def test_a_seg_known_only_by_its_sop_class_is_an_annotation_and_a_label(
    sample_data, tmp_path, capsys
):
    """Convert, inspect and the layouts tell a SEG the same way (Modality or SOP Class UID):
    one without Modality was an annotation for convert but read as an image by the layout."""
    tree = _tree_with_seg(sample_data, tmp_path, modality=False)
    out, ds = tmp_path / "out", tmp_path / "raw" / "Dataset009_Sop"
    args = ["convert", str(tree), "-o", str(out), "--spacing", "3", "--orientation", "RAS"]
    assert main(args + ["--layout", "nnunet", "--dataset", str(ds)]) == 0, capsys.readouterr()
    assert "1 annotation file(s) (DICOM SEG/RTSTRUCT) not converted" in capsys.readouterr().err
    doc = json.load(open(ds / "dataset.json"))
    assert doc["labels"] == {"background": 0, "nodule right": 1, "nodule left": 2}
    assert main(["inspect", str(tree), "--json"]) == 0
    kinds = {os.path.basename(e["source"]): e["kind"] for e in json.loads(capsys.readouterr().out)}
    assert kinds == {"ct": "dicom", "seg.dcm": "annotation"}


def test_seg_files_are_annotations_and_layouts_use_them(sample_data, tmp_path, capsys):
    from monai.data import load_decathlon_datalist

    tree = _tree_with_seg(sample_data, tmp_path)
    out, ds = tmp_path / "out", tmp_path / "raw" / "Dataset007_Nodules"
    args = ["convert", str(tree), "-o", str(out), "--spacing", "3", "--orientation", "RAS"]
    args += ["--layout", "nnunet", "--dataset", str(ds), "--layout", "monai", "--clip", "-1000"]
    assert main(args + ["400"]) == 0
    cap = capsys.readouterr()
    assert "nnU-Net normalises intensities itself" in cap.err  # warned: --clip with nnunet
    assert "1 annotation file(s) (DICOM SEG/RTSTRUCT) not converted" in cap.err
    (row,) = _manifest(out).values()  # the SEG is not a case
    assert row["source"] == str(tree / "ct") and row["status"] == "ok"
    doc = json.load(open(ds / "dataset.json"))
    assert doc["labels"] == {"background": 0, "nodule right": 1, "nodule left": 2}
    lab = nib.load(ds / "labelsTr" / f"{row['case']}.nii.gz")
    img = nib.load(ds / "imagesTr" / f"{row['case']}_0000.nii.gz")
    assert lab.shape == img.shape and {1, 2} <= set(np.unique(np.asarray(lab.dataobj)))
    train = load_decathlon_datalist(str(out / "datalist.json"))
    assert [x["image"] for x in train] == [row["output"]]
    assert nib.load(train[0]["label"]).shape == img.shape
    # the dataset exists now: the same run again rewrites it (medproc wrote it from this
    # output folder) without converting anything again; from another folder it is refused
    # without --force
    assert main(args + ["400"]) == 0
    cap = capsys.readouterr()
    assert "0 converted, 1 skipped" in cap.err and "nnU-Net dataset:" in cap.err
    assert (ds / "dataset.json").exists() and (ds / "labelsTr").is_dir()
    other = ["-o", str(tmp_path / "out2")]
    assert main(args[:2] + other + args[4:] + ["400"]) == 2
    assert "written from another output folder" in capsys.readouterr().err


def test_inspect_shows_seg_as_an_annotation(sample_data, tmp_path, capsys):
    tree = _tree_with_seg(sample_data, tmp_path)
    assert main(["inspect", str(tree), "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    kinds = {os.path.basename(e["source"]): (e["kind"], e["modality"]) for e in entries}
    assert kinds["ct"] == ("dicom", "CT") and kinds["seg.dcm"] == ("annotation", "SEG")


def test_named_seg_file_is_an_annotation_not_a_failure(sample_data, tmp_path, capsys):
    tree = _tree_with_seg(sample_data, tmp_path)
    seg = str(tree / "seg" / "seg.dcm")
    args = ["convert", str(tree / "ct"), seg, "-o", str(tmp_path / "o"), "--spacing", "3"]
    assert main(args + ["--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"annotation   {seg}: annotation: a DICOM SEG" in text
    assert "1 to convert, 0 already done, 0 failed" in text


def test_auto_workers_rule():
    assert auto_workers(100, cores=2) == 1  # a worker runs DALI threads and gzip itself
    assert auto_workers(2, cores=64) == 1  # two cases: a pool costs more than it gives
    assert auto_workers(3, cores=64) == 3 and auto_workers(100, cores=64) == 32
    # forked CPU workers start in ms with one DALI thread each: one per core, at most the cases
    assert auto_workers(4, cores=2, fork=True) == 2 and auto_workers(1, cores=2, fork=True) == 1
    assert auto_workers(100, cores=64, fork=True) == 64


def test_one_case_never_starts_a_pool_and_several_fork_one(sample_data, tmp_path):
    spec = medproc.Spec(spacing=3)
    image = os.path.join(_images(sample_data), "case001.nii.gz")
    with prepare([image], str(tmp_path / "a"), spec, workers=4) as b:
        assert b.workers == 1 and b.executor is None  # cut to the cases to do
    with prepare([_images(sample_data)], str(tmp_path / "b"), spec, workers=2) as b:
        # forked, unless this process holds DALI already (as pytest does): then spawned
        forked = "nvidia.dali" not in sys.modules
        assert b.workers == 2
        assert b.executor.medproc_start_method == ("fork" if forked else "spawn")
        pooled = b.run()
    here = medproc.convert.convert([_images(sample_data)], str(tmp_path / "c"), spec, workers=1)
    assert [r["status"] for r in pooled] == ["ok", "ok"]
    for p, h in zip(pooled, here):
        assert p["worker"] != h["worker"]
        np.testing.assert_array_equal(medproc.load(p["output"]).array,
                                      medproc.load(h["output"]).array)  # fmt: skip


@pytest.mark.parametrize("workers", ["1", "2"])
def test_dicom_headers_are_read_once(sample_data, tmp_path, monkeypatch, workers):
    import pydicom

    read = []
    real = pydicom.dcmread

    def counting(fp, *a, **k):
        read.append(os.path.basename(getattr(fp, "name", fp)))
        return real(fp, *a, **k)

    monkeypatch.setattr(pydicom, "dcmread", counting)
    dicom = os.path.join(sample_data, "dicom")
    files = sorted(f for d in os.listdir(dicom) for f in os.listdir(os.path.join(dicom, d)))
    args = ["convert", dicom, "-o", str(tmp_path / "o"), "--spacing", "4", "-j", workers]
    assert main(args) == 0
    # each header once: -j 1 in this process; -j 2 in the forked workers (this process reads
    # none), or here when the pool is spawned (this process holds DALI: as under pytest)
    forked = workers == "2" and "nvidia.dali" not in sys.modules
    assert sorted(read) == ([] if forked else files)


def test_grid_monai_writes_monai_spacingd_s_grid(sample_data, tmp_path):
    """``--grid monai``: the output lies on the grid MONAI's Spacingd makes (shape, affine to
    1e-5 mm), not medproc's centred one; the grid is part of the recorded options."""
    from monai.transforms import Compose, LoadImaged, Spacingd

    src = os.path.join(_images(sample_data), "case001.nii.gz")
    ref = Compose([LoadImaged("x", ensure_channel_first=True), Spacingd("x", pixdim=1.5)])(
        {"x": src}
    )["x"]
    out = tmp_path / "o"
    assert main(["convert", src, "-o", str(out), "--spacing", "1.5", "--grid", "monai", "-q"]) == 0
    img = nib.load(str(out / "case001.nii.gz"))
    assert img.shape == tuple(ref.shape[1:])
    np.testing.assert_allclose(img.affine, np.asarray(ref.affine), atol=1e-5)
    centred = tmp_path / "c"
    assert main(["convert", src, "-o", str(centred), "--spacing", "1.5", "-q"]) == 0
    assert nib.load(str(centred / "case001.nii.gz")).shape != img.shape  # (200 vs 199 here)
    assert json.load(open(out / "case001.json"))["spec"]["grid"] == "monai"
    # the grid is part of the result: a rerun with the other one refuses, saying so
    assert main(["convert", src, "-o", str(out), "--spacing", "1.5", "-q"]) == 2


def test_the_labels_folder_is_not_an_input_and_a_link_into_it_says_so(sample_data, tmp_path):
    """Inside an input tree the --labels folder is not entered, and a link among the images to a
    label map is skipped as a label map (not as "an output")."""
    from medproc.cases import find_cases

    data = tmp_path / "data"
    shutil.copytree(_images(sample_data), data / "images")
    labels = os.path.join(os.path.dirname(_images(sample_data)), "labels")
    shutil.copytree(labels, data / "labels")
    os.symlink(data / "labels" / "case001.nii.gz", data / "images" / "lab_alias.nii.gz")
    cases, skipped = find_cases([str(data)], labels_dir=str(data / "labels"))
    assert sorted(os.path.basename(c.source) for c in cases) == ["case001.nii.gz", "case002.nii.gz"]
    assert all(c.label and "labels" in c.label for c in cases)
    why = dict(skipped)
    assert why[str(data / "labels")] == "the labels folder (--labels): never read as an input"
    assert why[str(data / "images" / "lab_alias.nii.gz")].startswith(
        "a link into the labels folder (--labels)"
    )


def test_negative_values_in_scientific_notation_are_numbers(sample_data, tmp_path, capsys):
    """--clip -1e3 4e2: argparse alone takes -1e3 for an option."""
    args = ["convert", _images(sample_data), "-o", str(tmp_path / "o"), "--spacing", "3"]
    assert main([*args, "--clip", "-1e3", "4e2", "--dry-run"]) == 0
    assert main([*args, "--clip", "-1e39", "1e39"]) == 2
    assert "within float32's range" in capsys.readouterr().err


def test_the_suggestion_does_not_depend_on_how_argparse_quotes_the_choices():
    """CPython 3.12.8+/3.13.1+ (gh-117766) list the choices unquoted: the suggestion comes from
    the parser's own choices."""
    from medproc._cli_parser import did_you_mean
    from medproc.cli import build_parser

    p = build_parser()
    for choices in ("'inspect', 'convert', 'trace'", "inspect, convert, trace"):
        msg = (
            f"argument {{inspect,convert,trace}}: invalid choice: 'convrt' (choose from {choices})"
        )
        assert did_you_mean(p, msg) == "; did you mean convert?"


def test_usage_errors_name_the_option_and_suggest_the_closest(sample_data, tmp_path, capsys):
    """A value out of range names the flag (not the Spec field), a missing --annotations file
    is a usage error, and a mistyped option or command gets a suggestion and a short usage."""
    import pytest

    out = tmp_path / "o"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3"]
    assert main([*args, "--clip", "400", "-1000"]) == 2
    err = capsys.readouterr().err
    assert "usage error: invalid options: --clip must be (lo, hi) with lo < hi" in err
    assert "Intensity" not in err
    for pair, said in (
        (
            ["--clip", "1", "2", "--percentiles", "1", "99"],
            "--percentiles: not allowed with argument --clip",
        ),
        (["--shape", "9", "9", "9"], "--shape: not allowed with argument --spacing"),
        (["--scale", "0", "1", "--zscore"], "--zscore: not allowed with argument --scale"),
    ):
        with pytest.raises(SystemExit) as e:
            main(args + pair)
        assert e.value.code == 2 and said in capsys.readouterr().err
    assert main([*args, "--nan", "keep", "--dtype", "int16"]) == 2  # (NaN became 0, unsaid)
    assert "--nan keep keeps NaN voxels, which --dtype int16 cannot hold" in capsys.readouterr().err
    assert main([*args, "--orientation", "XYZ"]) == 2
    assert "invalid options: --orientation must be three codes" in capsys.readouterr().err
    assert main([*args, "--annotations", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err
    assert (
        f"usage error: {tmp_path / 'nope.csv'}: no such file (the annotation file, --annot" in err
    )
    assert not out.exists()
    for argv, hint in (
        ([*args, "--spacng", "1"], "unrecognized arguments: --spacng 1; did you mean --spacing?"),
        ([*args, "--orientaton=RAS"], "did you mean --orientation?"),
        (["convrt", _images(sample_data)], "did you mean convert?"),
        (  # an option of several values took the input after it
            ["convert", "--spacing", "3", _images(sample_data), "-o", str(out)],
            f"{_images(sample_data)!r} is a path: put the inputs before the options (or write "
            "--spacing=VALUE",
        ),
        (
            ["convert", "-o", str(out), "--layout", "monai", "--validation", "a", str(out)],
            "INPUT; --validation takes every word after it: put the inputs before",
        ),
        (["convert", "-o", str(out)], "required: INPUT\n"),  # (forgotten: no hint)
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and hint in err, err
        assert len(err.splitlines()) == 2, err  # the short usage and the error, not 13 lines


def test_layout_and_dask_needs_are_checked_before_any_work(
    sample_data, tmp_path, capsys, monkeypatch
):
    """nnU-Net without any label, and --dask without dask.distributed: usage errors (exit 2)
    before anything is converted or the output folder made."""
    import importlib.util

    out = tmp_path / "o"
    ds = tmp_path / "Dataset501_Lungs"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3"]
    assert main([*args, "--layout", "nnunet", "--dataset", str(ds)]) == 2
    assert "--layout nnunet: no case has a label" in capsys.readouterr().err
    assert not out.exists() and not ds.exists()
    if importlib.util.find_spec("distributed") is not None:  # (it hung, starting no worker)
        assert main([*args, "--dask", "local:0"]) == 2
        assert "--dask local:0: give a scheduler address" in capsys.readouterr().err
        for bad in ("foo", "http://x", "127.0.0.1:notaport"):  # (was "a bug in medproc")
            assert main([*args, "--dask", bad]) == 2
            err = capsys.readouterr().err
            assert f"--dask {bad}: no dask scheduler reached there" in err and "bug" not in err
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "distributed" else real(n, *a)
    )
    assert main([*args, "--dask", "local:1"]) == 2
    err = capsys.readouterr().err
    assert "--dask needs dask.distributed: pip install" in err and "bug" not in err
    assert not out.exists()


def test_dry_run_lists_the_layouts_it_would_write(sample_data, tmp_path, capsys):
    ds, out = tmp_path / "raw" / "Dataset510_Dry", tmp_path / "out"
    args = ["convert", _images(sample_data), "-o", str(out), "--spacing", "3"]
    args += ["--labels", os.path.join(sample_data, "nifti", "labels")]
    args += ["--layout", "nnunet", "--dataset", str(ds), "--layout", "monai", "--dry-run"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert f"layout       {ds}: nnU-Net raw dataset" in text
    assert f"layout       {out / 'datalist.json'}: MONAI datalist" in text
    assert not ds.exists() and not out.exists()


def test_label_maps_given_as_inputs_are_said(sample_data, tmp_path, capsys):
    """`medproc convert sample_data` (images and labels in one tree) resamples the label maps
    as images: said, naming them; with --labels nothing is said."""
    out = str(tmp_path / "o")
    assert main(["convert", sample_data, "-o", out, "--spacing", "3", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "2 image(s) to convert lie in a folder named like label maps" in err
    assert os.path.join("labels", "case001.nii.gz") in err and "--labels" in err
    args = ["convert", _images(sample_data), "-o", out, "--spacing", "3", "--dry-run"]
    assert main(args + ["--labels", os.path.join(sample_data, "nifti", "labels")]) == 0
    assert "named like label maps" not in capsys.readouterr().err
