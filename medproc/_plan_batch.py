"""Planning a batch (:func:`plan_cases`): which cases to convert, skip or fail, under which names,
checked against what the output folder already holds. Planning writes nothing.

A case whose outputs exist and are recorded in the manifest is skipped when they were made with
the same options (the spec, format and NaN policy); made with other options, the whole batch is
refused before any work (``force`` redoes them), so a folder never mixes outputs of two specs
without saying so. A case done before that lacks a file this run adds (its label, annotations
or QC picture) is converted again, and a warning says so. :func:`foresee` adds, for
``--dry-run``, the failures the headers already show (an output too large to resample).
"""

from __future__ import annotations

import json
import logging
import os
import warnings

from ._batch import Batch, Todo, output_files
from ._case_files import (
    input_changed,
    input_identity,
    is_own,
    made_from,
    owners,
    side_files,
    taken,
)
from ._convert_case import annotations_path, sidecar_path
from ._options import options_diff
from .cases import safe_name
from .errors import MedprocError, MedprocWarning
from .io.walk import file_identity
from .manifest import is_finished

__all__ = ["plan_cases", "foresee"]

log = logging.getLogger("medproc.convert")


def _same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name one file or folder (links, hard links: io.walk's rule)."""
    return bool(a) and bool(b) and file_identity(a) == file_identity(b)


def _made_with(row: dict) -> dict | None:
    """The options an earlier run recorded in its manifest row, or None (not recorded)."""
    try:
        made_with = json.loads(row.get("options") or "null")
    except ValueError:
        return None
    return made_with if isinstance(made_with, dict) else None


def _held_by_another(prior: dict, nm: str, case) -> bool:
    """Whether an earlier run's case ``nm`` (whatever its status) left an output that came from
    another input, still there: this run's case of that name then takes another, as two cases
    of one run do. The same input is not another: the same file, the same DICOM series found
    elsewhere, or an input that is gone (moved or renamed: it keeps its name)."""
    old = prior.get(nm)
    src = (old or {}).get("source", "")
    uid = case.dicom.uid if case.dicom is not None else None
    return bool(
        old
        and os.path.exists(old.get("output", ""))
        and not _same_file(src, case.source)
        and not (uid and old.get("series_uid") == uid)
        and os.path.exists(src)
    )


def _case_paths(outdir: str, nm: str, fmt: str, case, qc: bool) -> tuple:
    """(image, label map or None, QC picture or None) of case ``case`` under the name ``nm``."""
    return (
        os.path.join(outdir, f"{nm}.{fmt}"),
        os.path.join(outdir, f"{nm}_label.{fmt}") if case.label else None,
        os.path.join(outdir, "qc", f"{nm}.png") if qc else None,
    )


def _paths(outdir: str, nm: str, fmt: str, case, table, qc: bool) -> list[str]:
    """The files case ``case`` would write under the name ``nm`` (:func:`output_files`)."""
    return output_files(*_case_paths(outdir, nm, fmt, case, qc), table is not None)


def _foreign(t: Todo, outdir: str, prior: dict) -> str:
    """Why ``t`` may not write its files (""): one exists that is not medproc's own output of
    this case (recorded in the manifest, or made from this input by a run killed before it
    recorded it). Such a file is never replaced: the case fails, naming it."""
    nm = t.row["case"]
    there = [p for p in t.outputs if os.path.lexists(p) and not is_own(p, nm, prior)]
    if not there or made_from(sidecar_path(t.out_path), t.case):
        return ""
    return (
        f"{t.case.source}: its output {there[0]} exists and is not an output of this case "
        f"recorded in {os.path.join(outdir, 'manifest.csv')}: medproc never replaces a file it "
        "did not write; move it away, or choose another -o (or --name)"
    )


def _few(names) -> str:
    """The first three of ``names``, sorted, for a message ("a, b, c, ...")."""
    return ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")


def _not_whole(out_path: str, label_path: str | None, broken: dict | None = None) -> list[str]:
    """What of a finished case's files is missing or cut short (its sidecar, a whole image or
    label map; ``broken``: files found unreadable by ``--verify``): the case is converted
    again."""
    from ._output_check import damaged

    said, side = [], sidecar_path(out_path)
    try:
        with open(side) as f:
            out = json.load(f)["output"]
        shape, dtype = out["shape"], out["dtype"]
    except (OSError, ValueError, KeyError, TypeError):
        return ["sidecar <name>.json (missing, unreadable, or an older medproc's)"]
    checks = [("image", out_path, dtype), ("label map", label_path, None)]
    broken = broken or {}
    if out_path.endswith(".npy") and label_path:  # (a .npy label's own sidecar: its affine)
        lab_side = sidecar_path(label_path)
        try:
            with open(lab_side) as f:
                json.load(f)["affine"]
        except (OSError, ValueError, KeyError, TypeError):  # (gone, or cut short)
            said.append(f"label sidecar {os.path.basename(lab_side)}")
    for what, p, dt in checks:
        why = damaged(p, shape, dt) if p and os.path.exists(p) else None
        unread = broken.get(os.path.realpath(p)) if p and not why else None
        if why or unread:
            log.info("%s: %s: converted again", p, why or unread)
            said.append(f"whole {what} ({'damaged inside' if unread else 'cut short or replaced'})")
    return said


def _verified(cases, outdir: str, prior: dict) -> dict:
    """``--verify``: ``{real path: why}`` for the files of the finished cases of ``cases`` (as
    the manifest names them, in this run's ``outdir``) that cannot be read whole."""
    from ._output_check import unreadable_all

    sources = {os.path.realpath(c.source) for c in cases}
    files = [
        os.path.realpath(os.path.join(outdir, os.path.basename(r[k])))
        for r in prior.values()
        if is_finished(r) and os.path.realpath(r.get("source", "")) in sources
        for k in ("output", "label_output")
        if r.get(k)
    ]
    return unreadable_all(p for p in files if os.path.isfile(p))


def plan_cases(
    cases, outdir, prior, options, *, fmt, name, force, qc, table, verify=False
) -> Batch:
    """Decide every case (see the module doc); raises ``UsageError`` when outputs on disk were
    made with other options and ``force`` is not set. ``verify``: finished outputs are read
    whole (see :func:`medproc._output_check.unreadable`), those that cannot be are redone."""
    from .case_lesions import lesions_for, shared_lesion_keys
    from .errors import UsageError

    cases = list(cases)
    broken = _verified(cases, outdir, prior) if verify else {}
    shared = shared_lesion_keys(cases, table)  # two images under one lesion key: both fail
    todo, decided, seen, conflicts, redo, changed = [], [], set(), {}, {}, []
    owner, seen_files = owners(prior), set()
    for c in cases:
        nm = base = c.name(name)
        n = 1
        # the stems a case writes: its image and its label (case "x" with a label and an image
        # named "x_label" would write one file); and no file another case of an earlier run owns
        while True:
            paths = _paths(outdir, nm, fmt, c, table, qc)
            if not (
                {nm, f"{nm}_label"} & seen
                or _held_by_another(prior, nm, c)
                or taken(paths, nm, owner)
                or set(paths) & seen_files
            ):
                break
            nm = safe_name(f"{base}-{c.fields['uid_hash']}" + (f"-{n}" if n > 1 else ""))
            n += 1
        seen |= {nm, f"{nm}_label"} if c.label else {nm}
        seen_files |= set(paths)
        out_path, label_path, qc_path = _case_paths(outdir, nm, fmt, c, qc)
        # (absolute: a later run started elsewhere still knows its input)
        row = {
            "case": nm,
            "source": os.path.abspath(c.source),
            "output": out_path,
            "label_output": label_path or "",
        }
        err = f"{c.source}: {c.error}" if c.error else ""
        if not err and c.source in shared:
            err = f"{c.source}: {shared[c.source]}"
        if not err and os.path.abspath(out_path) == os.path.abspath(c.source):
            err = f"{c.source}: the output would overwrite the input; choose another -o"
        t = Todo(c, row, out_path, label_path, qc_path, lesions_for(c, table) if not err else None)
        err = err or _foreign(t, outdir, prior)
        if err:
            decided.append({**row, "status": "failed", "error": err})
            continue
        row["input_id"] = input_identity(c)
        old = prior.get(nm, {})
        recorded = (
            is_finished(old)
            and os.path.basename(old.get("output", "")) == os.path.basename(out_path)
            and _same_file(old.get("source", ""), c.source)
        )
        adds = {  # the files this run writes besides the volume (--labels/--annotations/--qc)
            "label": label_path,
            "annotations": annotations_path(out_path) if table is not None else None,
            "QC picture": qc_path,
        }
        lacks = [what for what, p in adds.items() if p and not os.path.exists(p)]
        there = os.path.exists(out_path)
        if there and recorded:  # (what a resume would keep must be whole, and say its grid)
            lacks += _not_whole(out_path, label_path, broken)
        done = there and not lacks  # (lacking a file this run adds: the case is redone)
        if there and recorded:
            made_with = _made_with(old)
            diff = (
                options_diff(made_with, options)
                if made_with is not None
                else ["the options were not recorded (an older medproc made them)"]
            )
            if diff:
                conflicts[nm] = diff
            elif input_changed(old.get("input_id", ""), row["input_id"]):
                changed.append(nm)  # (not recorded by an older medproc: resumed as before)
                log.info(
                    "%s: its input %s changed since it was converted (size or modification "
                    "time of the files read): converted again",
                    out_path,
                    c.source,
                )
            elif done and not force:
                # (status skipped: done by an earlier run with these options; no error)
                skip = {**old, **row, "input_id": old.get("input_id", "")}
                decided.append({**skip, "status": "skipped", "error": ""})
                continue
            elif lacks and not force:
                redo[nm] = lacks
        if done and not recorded:
            log.info("%s: on disk but not in the manifest (an interrupted run): redone", out_path)
        t.stale = side_files(old, outdir, nm, t.outputs, c)
        if changed and changed[-1] == nm:  # its files came from the old input: none may stay
            t.stale += [p for p in t.outputs if os.path.lexists(p)]  # (if this attempt fails)
        todo.append(t)
    # the same inputs converted by an earlier run under other names (another --format or
    # --name) with other options: refused too, or the folder would hold both unsaid; with
    # --force those rows are marked superseded (their files stay), so a rerun resumes
    here = {t.row["case"]: os.path.basename(t.out_path) for t in todo}
    settled = {r["case"] for r in decided}  # (their rows: decided above)
    # an input is its file or folder and, for DICOM, its series (a folder can hold several)
    inputs = {
        (file_identity(t.case.source), t.case.dicom.uid if t.case.dicom is not None else "")
        for t in todo
    }
    elsewhere: dict[str, list[str]] = {}
    for nm, old in prior.items():
        if nm in conflicts or nm in settled or not is_finished(old) or not old.get("source"):
            continue
        if here.get(nm) == os.path.basename(old.get("output", "")):
            continue  # the same output: decided above
        if (file_identity(old["source"]), old.get("series_uid") or "") not in inputs:
            continue
        if not old.get("output") or not os.path.exists(old["output"]):
            continue
        made_with = _made_with(old)
        # (with the same options too: the folder, and a layout made from it, would hold the
        # input twice; a --validation case could be in training under its other name)
        elsewhere[nm] = options_diff(made_with, options) if made_with is not None else []
    if conflicts and not force:
        first = sorted({d for ds in conflicts.values() for d in ds})
        raise UsageError(
            f"holds {len(conflicts)} case(s) converted with other options "
            f"({'; '.join(first)}). Rerun with the options they were made with to resume, "
            "add --force to redo them with these, or choose another -o",
            outdir,
        )
    if elsewhere and not force:
        first = sorted({d for ds in elsewhere.values() for d in ds})
        files = _few([os.path.basename(prior[n]["output"]) for n in elsewhere])
        made = (
            f"made with other options ({'; '.join(first)})"
            if first
            else (
                "made with these options: converted again, each input would be in the folder (and "
                "in a --layout made from it) twice. Rerun with the --name they were made with to "
                "resume"
            )
        )
        raise UsageError(
            f"holds {len(elsewhere)} output(s) of these inputs under other names ({files}) "
            f"{made}. Add --force to convert them under these names (the manifest then marks "
            "the older ones superseded, and layouts leave them out; their files stay), or "
            "choose another -o",
            outdir,
        )
    if changed:
        warnings.warn(
            f"{outdir}: the input of {len(changed)} case(s) changed since an earlier run "
            f"converted it ({_few(changed)}): converted again",
            MedprocWarning,
            stacklevel=2,
        )
    if redo:
        what = sorted({w for ws in redo.values() for w in ws})
        warnings.warn(
            f"{outdir}: {len(redo)} case(s) converted by an earlier run ({_few(redo)}) lack the "
            f"{' / '.join(what)} this run writes: they are converted again",
            MedprocWarning,
            stacklevel=2,
        )
    for nm in elsewhere:
        prior[nm] = {
            **prior[nm],
            "status": "superseded",
            "error": "this input was converted again under another name, with --force",
        }
    this_run = {r["case"] for r in decided} | {t.row["case"] for t in todo}
    kept = [r for c, r in prior.items() if c not in this_run]  # earlier runs' cases stay listed
    return Batch(outdir, options, todo, decided, kept, [])


def foresee(batch: Batch, spec) -> None:
    """For ``--dry-run``: fail the cases to convert that the run would fail from their headers
    alone: a header or series that cannot be read (an empty file, a declared size beyond the
    memory cap, a series with a missing slice or an unusable file), or an output too large to
    resample (the check the workers make, :func:`medproc.resample.check_output_size`), so that
    the listing says what the real run would do, with the run's message. Cases whose grid
    depends on their voxels (a crop to the foreground) are sized by the run."""
    from .io.headers import header_grid, series_grid
    from .plan import make_plan
    from .resample import check_output_size

    if spec.crop_foreground is None:  # the grid does not depend on intensity statistics
        spec = spec.replace(intensity=type(spec.intensity)())
    keep = []
    for t in batch.todo:
        c = t.case
        try:
            problem = getattr(c.dicom, "problem_error", None)  # (an unusable file of it)
            err = problem() if problem is not None else None
            if err is not None:
                raise err
            g = series_grid(c.dicom) if c.dicom is not None else header_grid(c.source)
        except MedprocError as e:  # what reading it says first
            batch.decided.append({**t.row, "status": "failed", "error": str(e)})  # (as a run)
            continue
        except (ValueError, TypeError, KeyError, IndexError, OSError):
            keep.append(t)  # (the run reads it and says what is wrong)
            continue
        try:
            plan = make_plan(g.shape[:3], g.affine, spec)
        except (MedprocError, ValueError, TypeError, KeyError, IndexError):
            keep.append(t)  # (the run plans with the voxels and says what is wrong)
            continue
        try:
            check_output_size(plan, g.channels, g.nbytes, c.source)
        except MedprocError as e:
            batch.decided.append({**t.row, "status": "failed", "error": str(e)})  # (as a run)
            continue
        keep.append(t)
    batch.todo = keep
