"""Where ``--layout nnunet|monai`` writes: never over, into or around what is not medproc's.

A hostile-input probe found ``--layout monai --dataset PATH`` writing over any file (an input
image, the run's own manifest, a user's datalist), ``--force`` deleting a dataset folder that
held the run's inputs or its output folder, and relabelled maps written over the user's label
maps. Each is refused before any work now (exit 2), and the files stay as they were.
"""

import json
import os
import shutil

import numpy as np
import pytest

import medproc
from medproc.cli import main
from medproc.errors import MedprocError
from medproc.layouts import write_monai_datalist, write_nnunet


def _case_tree(sample_data, root):
    """images/ and labels/ with two cases each (copies of the bundled NIfTI cases)."""
    for sub in ("images", "labels"):
        os.makedirs(root / sub, exist_ok=True)
        for n in ("case001", "case002"):
            src = os.path.join(sample_data, "nifti", sub, f"{n}.nii.gz")
            shutil.copy(src, root / sub / f"{n}.nii.gz")
    return root / "images", root / "labels"


def _stamps(folder):
    """Every file under ``folder`` with its bytes."""
    return {
        os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
        for d, _, files in os.walk(folder)
        for f in files
    }


def _convert(images, labels, out, *more):
    args = ["convert", str(images), "--labels", str(labels), "-o", str(out), "--spacing", "3"]
    return main([*args, "-q", *more])


@pytest.mark.parametrize("target", ["input", "foreign_json", "default_foreign", "manifest"])
def test_a_datalist_never_replaces_a_file_medproc_did_not_write(
    sample_data, tmp_path, capsys, target
):
    images, labels = _case_tree(sample_data, tmp_path / "data")
    out = tmp_path / "out"
    mine = tmp_path / "mine.json"
    mine.write_text('{"training": []}')
    if target in ("default_foreign", "manifest"):
        assert _convert(images, labels, out) == 0  # an existing output folder
        (out / "datalist.json").write_text('{"training": [], "note": "hand-made"}')
    path = {
        "input": images / "case001.nii.gz",
        "foreign_json": mine,
        "default_foreign": None,
        "manifest": out / "manifest.csv",
    }[target]
    before = _stamps(tmp_path)
    more = ["--layout", "monai"] + (["--dataset", str(path)] if path else [])
    assert _convert(images, labels, out, *more) == 2
    assert "usage error: --layout monai" in capsys.readouterr().err
    assert _stamps(tmp_path) == before  # nothing written, nothing replaced


def test_relabelled_maps_never_go_over_the_users_label_maps(sample_data, tmp_path, capsys):
    images, _ = _case_tree(sample_data, tmp_path / "data")
    out = tmp_path / "out"
    shutil.copytree(tmp_path / "data" / "labels", out / "labels")  # --labels is OUTDIR/labels
    before = _stamps(tmp_path)
    assert _convert(images, out / "labels", out, "--layout", "monai") == 2
    assert "labels folder" in capsys.readouterr().err
    assert _stamps(tmp_path) == before
    # the library function refuses too, once it knows which files it would write
    assert _convert(images, tmp_path / "data" / "labels", out) == 0
    seg = out / "labels" / "case001.nii.gz"  # a user's file where a relabelled map would go
    with pytest.raises(MedprocError, match="no datalist of medproc's lists"):
        write_monai_datalist(out, out / "list.json", label_names={1: "x", 2: "y"}, labels={
            "case001": str(tmp_path / "data" / "labels" / "case001.nii.gz"),
            "case002": str(tmp_path / "data" / "labels" / "case002.nii.gz"),
        })  # fmt: skip
    assert seg.read_bytes() == before[os.path.relpath(seg, tmp_path)]
    assert not (out / "list.json").exists()


def test_a_dataset_folder_holding_the_inputs_or_the_output_is_refused_even_with_force(
    sample_data, tmp_path, capsys
):
    ds = tmp_path / "nnUNet_raw" / "Dataset501_Lungs"
    images, labels = _case_tree(sample_data, ds / "raw")
    (ds / "NOTES.txt").write_text("precious")
    before = _stamps(tmp_path)
    for extra in ([], ["--force"]):
        assert _convert(images, labels, tmp_path / "out", "--layout", "nnunet",
                        "--dataset", str(ds), *extra) == 2  # fmt: skip
        assert "holds the input" in capsys.readouterr().err
    assert _stamps(tmp_path) == before
    # -o inside the dataset folder: refused before converting (it would be deleted with it)
    ds2 = tmp_path / "nnUNet_raw" / "Dataset502_B"
    images2, labels2 = _case_tree(sample_data, tmp_path / "elsewhere")
    assert _convert(images2, labels2, ds2 / "out", "--layout", "nnunet", "--dataset", str(ds2)) == 2
    assert "holds the output folder" in capsys.readouterr().err
    assert not ds2.exists()
    # a dataset folder inside an input folder: a later run would read it as input
    ds3 = images2 / "Dataset503_C"
    assert _convert(images2, labels2, tmp_path / "o3", "--layout", "nnunet",
                    "--dataset", str(ds3)) == 2  # fmt: skip
    assert "lies inside the input" in capsys.readouterr().err


def test_force_replaces_only_a_dataset_medproc_wrote(sample_data, tmp_path, capsys):
    images, labels = _case_tree(sample_data, tmp_path / "data")
    raw = tmp_path / "nnUNet_raw"
    foreign = raw / "Dataset501_Lungs"
    (foreign / "imagesTr").mkdir(parents=True)
    (foreign / "dataset.json").write_text("{}")
    before = _stamps(foreign)
    args = ["--layout", "nnunet", "--dataset", str(foreign), "--force"]
    assert _convert(images, labels, tmp_path / "out", *args) == 2
    assert "not a dataset medproc wrote" in capsys.readouterr().err
    assert _stamps(foreign) == before
    with pytest.raises(FileExistsError, match="not a dataset medproc wrote"):
        write_nnunet(tmp_path / "out", foreign, overwrite=True)
    # medproc's own, from another output folder: refused without --force, replaced with it
    mine = raw / "Dataset502_Mine"
    assert (
        _convert(images, labels, tmp_path / "a", "--layout", "nnunet", "--dataset", str(mine)) == 0
    )
    b = ["--layout", "nnunet", "--dataset", str(mine)]
    assert _convert(images, labels, tmp_path / "b", *b) == 2
    assert "written from another output folder" in capsys.readouterr().err
    # a killed earlier build left its half-built folder beside the dataset: removed
    (raw / ".Dataset502_Mine.part-abc123").mkdir()
    assert _convert(images, labels, tmp_path / "b", *b, "--force") == 0
    assert sorted(os.listdir(raw)) == ["Dataset501_Lungs", "Dataset502_Mine"]
    assert open(mine / ".medproc_source").read().strip() == os.path.realpath(tmp_path / "b")


def test_a_validation_case_without_a_label_is_said(sample_data, tmp_path):
    images, labels = _case_tree(sample_data, tmp_path / "data")
    os.remove(labels / "case002.nii.gz")
    out = tmp_path / "out"
    assert _convert(images, labels, out) == 0
    with pytest.warns(medproc.MedprocWarning, match="validation case case002 has no label"):
        p = write_monai_datalist(out, out / "datalist.json", validation=["case002"])
    doc = json.load(open(p))
    assert [x["image"] for x in doc["test"]] == ["case002.nii.gz"] and not doc["validation"]


def test_a_rerun_keeps_the_datasets_channel_name(sample_data, tmp_path, capsys):
    images, labels = _case_tree(sample_data, tmp_path / "data")
    ds = tmp_path / "raw" / "Dataset505_MR"
    args = ["--layout", "nnunet", "--dataset", str(ds)]
    assert _convert(images, labels, tmp_path / "out", *args, "--channel-name", "MR") == 0
    assert _convert(images, labels, tmp_path / "out", *args, "--spacing", "4", "--force") == 0
    assert json.load(open(ds / "dataset.json"))["channel_names"] == {"0": "MR"}
    more = ["--labels", str(labels), "-o", str(tmp_path / "out"), "--spacing", "4"]
    assert main(["convert", str(images), *more, "--layout", "monai"]) == 0
    said = "(2 training and 0 validation case(s); 0 test case(s), those without a label)"
    assert said in capsys.readouterr().err


def test_a_rerun_keeps_what_the_user_added_to_the_dataset(sample_data, tmp_path, capsys):
    """Notes and a folder of predictions put into the dataset were deleted by the same command
    run again (no --force, no word: a prober's finding); they are carried over, said."""
    images, labels = _case_tree(sample_data, tmp_path / "data")
    ds = tmp_path / "raw" / "Dataset506_K"
    args = ["--layout", "nnunet", "--dataset", str(ds)]
    assert _convert(images, labels, tmp_path / "out", *args) == 0
    (ds / "NOTES.md").write_text("mine\n")
    (ds / "imagesTs_pred").mkdir()
    (ds / "imagesTs_pred" / "p.nii.gz").write_bytes(b"x")
    capsys.readouterr()
    again = ["convert", str(images), "--labels", str(labels), "-o", str(tmp_path / "out")]
    assert main([*again, "--spacing", "3", *args]) == 0  # (without -q: the warning is printed)
    assert (ds / "NOTES.md").read_text() == "mine\n"
    assert (ds / "imagesTs_pred" / "p.nii.gz").read_bytes() == b"x"
    assert "kept 2 entry(ies) medproc did not write (NOTES.md, imagesTs_pred)" in (
        capsys.readouterr().err
    )
    assert sorted(os.listdir(ds / "labelsTr")) == sorted(os.listdir(labels))


def test_a_case_whose_label_cannot_be_used_is_left_out_and_the_rest_written(
    sample_data, tmp_path, capsys
):
    """One label map with a negative value stopped the whole layout after the conversion: now
    that case is left out (said, naming the label map it came from), the others are written,
    exit 1."""
    import nibabel as nib
    import numpy as np

    images, labels = _case_tree(sample_data, tmp_path / "data")
    src = nib.load(labels / "case002.nii.gz")
    bad = np.asarray(src.dataobj).astype(np.int8)
    bad[0, 0, 0] = -1
    nib.save(nib.Nifti1Image(bad, src.affine), labels / "case002.nii.gz")
    ds = tmp_path / "raw" / "Dataset506_Part"
    args = ["--layout", "nnunet", "--dataset", str(ds), "--layout", "monai"]
    assert _convert(images, labels, tmp_path / "out", *args) == 1
    err = capsys.readouterr().err
    assert "left out case case002" in err and str(labels / "case002.nii.gz") in err
    assert err.count("left out case case002") == 1  # (said once for both layouts)
    assert os.listdir(ds / "imagesTr") == ["case001_0000.nii.gz"]
    assert json.load(open(ds / "dataset.json"))["numTraining"] == 1
    doc = json.load(open(tmp_path / "out" / "datalist.json"))
    assert [x["image"] for x in doc["training"]] == ["case001.nii.gz"] and not doc["test"]
    # the library: without failed= the bad label raises (for both layouts); with a list, the
    # case is left out and its error handed back
    from medproc.errors import MedprocError
    from medproc.layouts import write_monai_datalist, write_nnunet

    out = str(tmp_path / "out")
    for write, dst in ((write_monai_datalist, "lib.json"), (write_nnunet, "Dataset508_Lib")):
        with pytest.raises(MedprocError, match="case002"):
            write(out, str(tmp_path / dst))
        failed = []
        write(out, str(tmp_path / dst), failed=failed)
        assert len(failed) == 1 and "case002" in str(failed[0]), failed


def test_a_dataset_another_run_is_writing_is_refused_and_a_name_is_kept_only_from_its_source(
    sample_data, tmp_path, capsys
):
    from holder import holding

    images, labels = _case_tree(sample_data, tmp_path / "data")
    raw = tmp_path / "raw"
    ds = raw / "Dataset507_Lock"
    args = ["--layout", "nnunet", "--dataset", str(ds)]
    assert _convert(images, labels, tmp_path / "a", *args, "--channel-name", "MR") == 0
    assert not (raw / ".Dataset507_Lock.lock").exists()  # (released: removed)
    # rewritten from another output folder (--force): its channel name is guessed again
    assert _convert(images, labels, tmp_path / "b", *args, "--force") == 0
    assert json.load(open(ds / "dataset.json"))["channel_names"] == {"0": "CT"}
    # another process holds the dataset's lock: refused, naming it; its files untouched
    with holding("medproc._layout_targets:dataset_lock", ds):
        before = _stamps(ds)
        assert _convert(images, labels, tmp_path / "b", *args) == 1
        assert "is writing the dataset Dataset507_Lock here" in capsys.readouterr().err
        assert _stamps(ds) == before


def test_both_layouts_read_the_labels_once(sample_data, tmp_path, monkeypatch):
    """With both layouts the labels are read and put on the output grid once (every SEG's
    series was loaded twice, and every warning about the labels said twice)."""
    import medproc.layouts as lay

    images, labels = _case_tree(sample_data, tmp_path / "data")
    assert _convert(images, labels, tmp_path / "out") == 0
    calls = []
    real = lay.gather_labels
    monkeypatch.setattr(lay, "gather_labels", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = ["--layout", "nnunet", "--dataset", str(tmp_path / "raw" / "Dataset508_Once")]
    assert _convert(images, labels, tmp_path / "out", *args, "--layout", "monai") == 0
    assert calls == [1]


def test_a_datalist_never_replaces_medprocs_nnunet_dataset_json(sample_data, tmp_path, capsys):
    """Both files carry medproc's description; only a datalist (with its lists) may be
    rewritten as one (a re-probe replaced a dataset.json with a datalist, breaking the
    nnU-Net dataset)."""
    images, labels = _case_tree(sample_data, tmp_path / "data")
    ds = tmp_path / "raw" / "Dataset509_J"
    assert _convert(images, labels, tmp_path / "o", "--layout", "nnunet", "--dataset", str(ds)) == 0
    before = (ds / "dataset.json").read_bytes()
    more = ["--layout", "monai", "--dataset", str(ds / "dataset.json")]
    assert _convert(images, labels, tmp_path / "o", *more) == 2
    assert "not a datalist medproc wrote" in capsys.readouterr().err
    assert (ds / "dataset.json").read_bytes() == before


def test_files_a_case_list_names_inside_the_dataset_folder_are_refused(
    sample_data, tmp_path, capsys
):
    """A CSV case list can name inputs anywhere: a dataset's own images named as inputs would
    be deleted with it by --force (the check of the input folders did not see them)."""
    images, labels = _case_tree(sample_data, tmp_path / "data")
    ds = tmp_path / "raw" / "Dataset510_C"
    args = ["--layout", "nnunet", "--dataset", str(ds)]
    assert _convert(images, labels, tmp_path / "a", *args) == 0
    cases = tmp_path / "cases.csv"
    rows = [f"{ds}/imagesTr/{n}_0000.nii.gz,{ds}/labelsTr/{n}.nii.gz" for n in ("case001",)]
    cases.write_text("image,label\n" + "\n".join(rows) + "\n")
    before = _stamps(ds)
    run = ["convert", str(cases), "-o", str(tmp_path / "b"), "--spacing", "4", "-q"]
    assert main([*run, *args, "--force"]) == 2
    assert "which case" in capsys.readouterr().err
    assert _stamps(ds) == before


def test_a_datalist_named_like_a_cases_own_sidecar_is_refused_before_any_work(
    sample_data, tmp_path, capsys
):
    images, labels = _case_tree(sample_data, tmp_path / "data")
    out = tmp_path / "o"
    more = ["--layout", "monai", "--dataset", str(out / "case001.json")]
    assert _convert(images, labels, out, *more) == 2
    assert "is a file case case001 writes" in capsys.readouterr().err
    assert not (out / "case001.nii.gz").exists()  # (nothing converted)


def test_a_foreign_file_in_the_datalists_labels_folder_is_never_replaced(
    sample_data, tmp_path, capsys
):
    """Label maps that need no renumbering are listed where they are: the run goes on and the
    user's file stays. One that needs renumbering finds the file at the layout step (exit 1,
    nothing replaced); labels from SEG/RTSTRUCT, which always go there, are refused before
    any work (a re-probe found the pre-check refusing runs that wrote nothing there)."""
    import nibabel as nib

    images, labels = _case_tree(sample_data, tmp_path / "data")
    out = tmp_path / "o"
    (out / "labels").mkdir(parents=True)
    (out / "labels" / "case001.nii.gz").write_bytes(b"mine")
    assert _convert(images, labels, out, "--layout", "monai") == 0
    assert (out / "labels" / "case001.nii.gz").read_bytes() == b"mine"
    src = nib.load(labels / "case001.nii.gz")  # values 5 and 9: renumbered to 1 and 2
    lab = np.asarray(src.dataobj).astype(np.uint8)
    nib.save(nib.Nifti1Image(np.where(lab > 0, lab + 4, 0).astype(np.uint8), src.affine),
             labels / "case001.nii.gz")  # fmt: skip
    assert _convert(images, labels, tmp_path / "o2") == 0
    (tmp_path / "o2" / "labels").mkdir()
    (tmp_path / "o2" / "labels" / "case001.nii.gz").write_bytes(b"mine")
    assert _convert(images, labels, tmp_path / "o2", "--layout", "monai") == 1
    assert "no datalist of medproc's lists" in capsys.readouterr().err
    assert (tmp_path / "o2" / "labels" / "case001.nii.gz").read_bytes() == b"mine"


def test_an_edited_manifest_never_makes_a_layout_write_outside_its_folder(
    sample_data, tmp_path, recwarn
):
    """Layout files are named after the manifest's case names: a name that is a path (an edited
    manifest) wrote ../victim_0000.nii.gz over someone's file; a repeated name, or a missing
    output, passed unsaid."""
    import csv

    from medproc.errors import MedprocError
    from medproc.layouts import write_monai_datalist, write_nnunet

    images, labels = _case_tree(sample_data, tmp_path / "data")
    out = tmp_path / "out"
    assert _convert(images, labels, out) == 0
    victim = tmp_path / "victim_0000.nii.gz"
    victim.write_text("precious")
    manifest = out / "manifest.csv"
    good = manifest.read_text()

    def edit(change):
        with open(manifest, newline="") as f:
            rows = list(csv.DictReader(f))
        change(rows)
        with open(manifest, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    for change, said in (
        (lambda rows: rows[0].update(case=str(tmp_path / "victim")), "not a file name medproc"),
        (lambda rows: rows[0].update(case="../../victim"), "not a file name medproc"),
        (lambda rows: rows[1].update(case=rows[0]["case"]), "repeats case 'case001'"),
        (  # two rows of one output: it was trained on twice (a prober's)
            lambda rows: rows[1].update(
                output=rows[0]["output"], label_output=rows[0]["label_output"]
            ),
            r"cases 'case001' and 'case002' both name .*case001.nii.gz as their output",
        ),
    ):
        manifest.write_text(good)
        edit(change)
        for write, dst in ((write_nnunet, "raw/Dataset520_E"), (write_monai_datalist, "d.json")):
            with pytest.raises(MedprocError, match=said):
                write(str(out), str(tmp_path / dst))
    assert victim.read_text() == "precious" and not (tmp_path / "raw").exists()
    manifest.write_text(good)
    os.unlink(out / "case002.nii.gz")  # an output deleted since: said, left out
    p = write_monai_datalist(str(out), str(tmp_path / "d.json"))
    assert [x["image"] for x in json.load(open(p))["training"]] == ["out/case001.nii.gz"]
    assert any("case case002: its output" in str(w.message) for w in recwarn)
    os.unlink(out / "case001_label.nii.gz")  # a label deleted: left out, not made a test case
    with pytest.raises(MedprocError, match="no finished case"):
        write_monai_datalist(str(out), str(tmp_path / "d.json"))
    assert any("case case001: its label" in str(w.message) for w in recwarn)
    manifest.write_bytes("case,source,output,status\nd\xe9j\xe0,a,b,ok\n".encode("latin-1"))
    with pytest.raises(MedprocError, match="is not UTF-8 CSV text"):
        write_monai_datalist(str(out), str(tmp_path / "d.json"))
