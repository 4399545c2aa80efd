"""Bad input never crashes, hangs, or converts wrongly.

A corpus of malformed and hostile inputs (``badinputs.py``: NIfTI, NRRD/MetaImage and DICOM;
damaged headers, declared sizes that cannot be real, NaN geometry, FIFOs, ``/dev/zero``,
symlink loops, path traversal in detached headers, unreadable files...) beside good ones, run
through ``medproc.load``, ``medproc inspect`` and one ``medproc convert`` of all of it, each in a
subprocess under a 2 GiB address-space limit and a time limit. Every bad input must give a
clear error naming the file, without a traceback; every good input in the same batch must be
written; the inputs must be unchanged; nothing may be written outside the output folder.
"""

import gzip
import hashlib
import json
import os
import re
import resource
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
from badinputs import SECRET, deny_prefix, make_corpus

import medproc

HERE = os.path.dirname(os.path.abspath(__file__))
ADDRESS_SPACE = 2 << 30  # bytes: no input may make medproc exhaust this
TIMEOUT_S = 150


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _snapshot(root: str, skip=()) -> dict:
    """Every entry under ``root``: kind, size, content hash (regular files), link target.
    Never opens anything but regular files."""
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if os.path.join(d, x) not in skip)
        for n in sorted(dirs + files):
            p = os.path.join(d, n)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[p] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                try:
                    with open(p, "rb") as f:
                        out[p] = ("file", st.st_mode, hashlib.sha1(f.read()).hexdigest())
                except PermissionError:  # chmod 000 (for a non-root user)
                    out[p] = ("file", st.st_mode, st.st_size, st.st_mtime_ns)
            else:
                out[p] = (stat.S_IFMT(st.st_mode), st.st_mode)
    return out


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("bad"))
    root, secret, out = (os.path.join(base, n) for n in ("corpus", "secret", "out"))
    cases = make_corpus(root, secret)
    prefix = deny_prefix()
    if prefix is None:  # root without user namespaces: a chmod-000 file is readable
        cases = [c for c in cases if not c.perm]
    before = _snapshot(base)
    paths = [c.path(root) for c in cases]
    with open(os.path.join(base, "paths.json"), "w") as f:
        json.dump(paths + [root], f)  # and the whole tree at once
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    runner = [*(prefix or []), sys.executable, os.path.join(HERE, "_bad_inputs_runner.py")]
    runner += [os.path.join(base, "paths.json"), os.path.join(base, "results.json")]
    # the same inputs twice, to be converted once
    # a path that does not exist stops convert before any work (exit 2): not in the batch
    real = [p for p in paths if os.path.lexists(p)]
    convert = [*(prefix or []), sys.executable, "-m", "medproc", "convert", *real, *real[:3]]
    convert += ["-o", out, "--spacing", "3", "-j", "1"]
    # the whole tree as one folder, written inside it (and so never read back as input)
    inside = os.path.join(root, "_out_inside")
    tree = [*(prefix or []), sys.executable, "-m", "medproc", "convert", root, "-o", inside]
    tree += ["--spacing", "3", "-j", "2"]
    t0 = time.time()
    procs = {
        k: subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_limit, env=env
        )
        for k, cmd in (("runner", runner), ("convert", convert), ("tree", tree))
    }
    outs = {}
    for k, p in procs.items():
        try:
            o, e = p.communicate(timeout=max(1, TIMEOUT_S - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
            e += f"\n[{k} did not finish within {TIMEOUT_S} s]".encode()
        outs[k] = (p.returncode, o.decode(errors="replace"), e.decode(errors="replace"))
    after = _snapshot(base, skip=(out, inside))
    results = json.load(open(os.path.join(base, "results.json")))
    return {
        "base": base,
        "root": root,
        "out": out,
        "cases": cases,
        "before": before,
        "after": after,
        "results": results,
        "convert": outs["convert"],
        "tree": outs["tree"],
        "runner": outs["runner"],
        "manifest": _manifest(out),
        "tree_manifest": _manifest(inside),
        "inside": inside,
        "seconds": time.time() - t0,
    }


def _manifest(out: str) -> dict:
    import csv

    p = os.path.join(out, "manifest.csv")
    if not os.path.exists(p):
        return {}
    with open(p, newline="", encoding="utf-8") as f:
        return {r["case"]: r for r in csv.DictReader(f)}


def _culprit(c, root):
    return os.path.basename(c.culprit or c.path(root).rstrip("/"))


def _escaped(name: str) -> list[str]:
    """How a file name may appear in text: as is, or with undecodable bytes escaped."""
    return [name, name.encode("utf-8", "backslashreplace").decode("utf-8")]


def test_the_corpus_is_large_and_covers_the_classes(corpus_run):
    cases = corpus_run["cases"]
    assert len(cases) >= 60
    bad = [c for c in cases if c.expect == "error"]
    assert len(bad) >= 45 and len(cases) - len(bad) >= 15
    for prefix in ("n_", "i_", "d_"):  # NIfTI, NRRD/MetaImage, DICOM
        assert sum(c.name.startswith(prefix) for c in bad) >= 10, prefix
    for word in ("fifo", "devzero", "loop", "traversal", "huge", "nan", "frames", "truncated"):
        assert any(word in c.name for c in cases), word


def test_runs_finished_without_a_hang(corpus_run):
    """Both subprocesses (2 GiB address space each) finished in time, no input hung."""
    for key in ("runner", "convert", "tree"):
        rc, _, err = corpus_run[key]
        assert "did not finish" not in err, (key, err[-2000:])
    hangs = {p: r for p, r in corpus_run["results"].items() if "hang" in r}
    assert not hangs
    assert len(corpus_run["results"]) == len(corpus_run["cases"]) + 1
    assert corpus_run["seconds"] < TIMEOUT_S


def test_load_gives_a_volume_or_a_clear_error_naming_the_file(corpus_run):
    root, results = corpus_run["root"], corpus_run["results"]
    problems = []
    for c in corpus_run["cases"]:
        r = results[c.path(root)]["load"]
        if "crash" in r:
            problems.append(f"{c.name}: crashed: {r['crash']}")
        elif c.expect == "ok" and not c.load:
            if not r["ok"]:
                problems.append(f"{c.name}: expected a volume, got {r['message']}")
        elif r["ok"]:
            problems.append(f"{c.name}: expected an error, got a volume {r['shape']}")
        else:
            msg, pattern = r["message"], c.load or c.match
            if not any(n in msg for n in _escaped(_culprit(c, root))) and not c.load:
                problems.append(f"{c.name}: the error does not name {_culprit(c, root)}: {msg}")
            if not re.search(pattern, msg):
                problems.append(f"{c.name}: the error does not say {pattern!r}: {msg}")
            if "Traceback" in msg:
                problems.append(f"{c.name}: a traceback in the message")
    assert not problems, "\n".join(problems)


def test_inspect_reports_every_header_problem_without_a_traceback(corpus_run):
    root, results = corpus_run["root"], corpus_run["results"]
    problems = []
    for c in corpus_run["cases"]:
        res = results[c.path(root)]
        for key in ("inspect", "table"):
            if "crash" in res[key] or "Traceback" in res[key]["err"] + res[key]["out"]:
                problems.append(f"{c.name}: inspect ({key}) crashed: {res[key]}")
        if "crash" in res["inspect"]:
            continue
        if res["inspect"]["rc"] == 2:  # a path that does not exist: a usage error, no table
            for key in ("inspect", "table"):
                if not re.search(c.match, res[key]["err"]) or c.name not in res[key]["err"]:
                    problems.append(f"{c.name}: inspect ({key}) exit 2 unexplained: {res[key]}")
            continue
        entries = json.loads(res["inspect"]["out"])
        errors = [f"{e['source']}: {e['error']}" for e in entries if e["kind"] != "skipped"]
        errors = [e for e, x in zip(errors, entries) if x["error"]]
        if c.expect == "ok":
            vols = [e for e in entries if e["kind"] in ("dicom", "nifti", "itk") and not e["error"]]
            if len(vols) != c.rows:
                problems.append(f"{c.name}: expected {c.rows} volume(s), got {entries}")
        elif c.inspect:
            hit = [e for e in errors if re.search(c.match, e)]
            named = [e for e in hit if any(n in e for n in _escaped(_culprit(c, root)))]
            if not named:
                problems.append(f"{c.name}: no error naming {_culprit(c, root)}: {errors}")
            table = res["table"]["out"]  # printed as plain text: [red] stays [red]
            if not any(n in table for n in _escaped(_culprit(c, root))):
                problems.append(f"{c.name}: the table does not name {_culprit(c, root)}")
    assert not problems, "\n".join(problems)


def test_one_convert_of_everything(corpus_run):
    """One batch of every input (three of them given twice): every bad input is a failed row
    naming its file, every good one is written (once), no traceback, exit status 1."""
    rc, out, err = corpus_run["convert"]
    root, rows = corpus_run["root"], list(corpus_run["manifest"].values())
    assert rc == 1, err[-3000:]
    assert "Traceback" not in err + out and "medproc convert: error" not in err, err[-3000:]
    problems = []
    for c in corpus_run["cases"]:
        if not os.path.lexists(c.path(root)):
            continue  # never given to convert (tested as a usage error elsewhere)
        mine = [
            r
            for r in rows
            if r["source"] == c.path(root)
            or r["source"].startswith(c.path(root) + os.sep)
            or r["source"] in _escaped(c.path(root))
        ]
        if c.expect == "ok":
            ok = [r for r in mine if r["status"] == "ok"]
            if len(ok) != c.rows or len(mine) != c.rows:
                problems.append(f"{c.name}: expected {c.rows} converted, got {mine}")
            for r in ok:
                vol = medproc.load(r["output"])
                if not np.isfinite(vol.array).all() or np.allclose(vol.spacing, 3) is False:
                    problems.append(f"{c.name}: bad output {vol}")
        else:
            failed = [r for r in mine if r["status"] == "failed"]
            if not failed or len(failed) != len(mine):
                problems.append(f"{c.name}: expected failed row(s), got {mine}")
                continue
            for r in failed:
                e = r["error"]
                if not re.search(c.match, e) or not any(
                    n in e for n in _escaped(_culprit(c, root))
                ):
                    problems.append(f"{c.name}: unclear error {e!r}")
                if not any(n in err for n in _escaped(_culprit(c, root))):
                    problems.append(f"{c.name}: its failure was not printed")
    assert not problems, "\n".join(problems)
    assert len({r["output"] for r in rows}) == len(rows)


def test_inputs_unchanged_and_nothing_written_outside_the_output_folder(corpus_run):
    before, after = corpus_run["before"], corpus_run["after"]
    extra = {"paths.json", "results.json"}
    added = {p for p in after if p not in before and os.path.basename(p) not in extra}
    assert not added, sorted(added)
    changed = {p for p in before if after.get(p) != before[p]}
    assert not changed, sorted(changed)


def test_no_output_holds_bytes_from_outside_the_input_tree(corpus_run):
    """The detached headers pointing at ../../secret.raw, /etc/passwd, /dev/zero failed; no
    output holds the secret's bytes."""
    out = corpus_run["out"]
    for n in os.listdir(out):
        if n.endswith(".nii.gz"):
            data = gzip.decompress(open(os.path.join(out, n), "rb").read())
            assert SECRET[:22] not in data, n
    assert not [n for n in os.listdir(out) if ".part" in n]


def test_one_convert_of_the_whole_tree_with_the_output_inside_it(corpus_run):
    """The corpus root as one input folder, with -o inside it and 2 workers: the scan passes
    FIFOs, /dev/zero links and sockets without a hang; every good case is converted, every bad
    file that looks like an image is a failed row naming it, no traceback."""
    rc, out, err = corpus_run["tree"]
    assert rc == 1 and "Traceback" not in err + out, err[-3000:]
    rows = list(corpus_run["tree_manifest"].values())
    ok = [r for r in rows if r["status"] == "ok"]
    good = [c for c in corpus_run["cases"] if c.expect == "ok"]
    assert len(ok) == sum(c.rows for c in good), [r["source"] for r in ok]
    assert not [r for r in rows if r["source"].startswith(corpus_run["inside"])]
    root = corpus_run["root"]
    for c in corpus_run["cases"]:
        if c.expect == "error" and c.name.endswith((".nii", ".nii.gz", ".nhdr", ".mhd", ".nrrd")):
            if os.path.isdir(c.path(root)):
                continue  # a folder named like a file: scanned as a folder
            mine = [r for r in rows if r["source"] in _escaped(c.path(root))]
            assert mine and mine[0]["status"] == "failed", (c.name, mine)
    res = corpus_run["results"][root]  # medproc inspect of the whole tree
    assert "crash" not in res["inspect"] and "Traceback" not in res["table"]["err"]
    entries = json.loads(res["inspect"]["out"])
    assert sum(e["kind"] in ("dicom", "nifti", "itk") and not e["error"] for e in entries) >= len(
        good
    )
