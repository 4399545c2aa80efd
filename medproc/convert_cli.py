"""``medproc convert``: the CLI over :func:`medproc.convert.prepare` and ``Batch.run``.

Thin: parse, check everything that can be checked before any work (options, GPU, inputs,
output folder, layout targets), plan, then convert with a progress bar, write the training
layouts, print a summary and return the exit status.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap

from ._cli_parser import HelpFormatter, exit_status

__all__ = ["add_convert_parser", "EXIT_CODES"]

#: the exit statuses of ``medproc convert`` (shown in its help)
EXIT_CODES = exit_status(
    "every case converted (or already done)",
    "the command could not start: a bad option, a missing input, an output folder that cannot "
    "be used, or outputs there made with other options (the message says which)",
    "some cases failed (see manifest.csv; --dry-run: it lists cases that would fail), the "
    "manifest could not be written during the run (a full disk), or a layout could not be "
    "written",
    "interrupted (Ctrl-C): the running cases finished and recorded; rerun to continue",
    terminated="terminated (SIGTERM: timeout, docker stop...): the running cases stopped and "
    "recorded as interrupted; rerun to continue",
)


def _workers(text: str):
    if text == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1 or 'auto', got {text!r}")
    return n


def add_convert_parser(sub) -> None:
    """Add ``convert`` (and its options) to the ``medproc`` subparsers ``sub``."""
    from .cases import NAME_FIELDS
    from .spec import GRIDS

    c = sub.add_parser(
        "convert",
        help="resample whole datasets to NIfTI or a .npy training cache",
        description=textwrap.fill(
            "Resample every DICOM series and NIfTI/NRRD/MHA file under INPUT (folders, files "
            "or CSV case lists) into OUTDIR, with manifest.csv (one row per case) and "
            "<name>.json beside each output (options, source, geometry). Resumable: a rerun "
            "skips finished cases and refuses when they were made with other options.",
            88,
        ),
        formatter_class=HelpFormatter,
        epilog=EXIT_CODES,
    )
    # argparse takes "-1e3" for an option (its negative numbers have no exponent): values such
    # as --clip -1e3 400 are numbers here (no option of convert looks like one)
    c._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
    add = c.add_argument
    add("inputs", nargs="+", metavar="INPUT", help="folders, image/DICOM files or CSV case lists")
    add("-o", "--outdir", required=True, help="output folder (created; locked while running)")
    g = c.add_argument_group("output grid and voxels (recorded; a rerun must match them)")
    one = g.add_mutually_exclusive_group()  # (pairs said by argparse, naming both flags)
    one.add_argument(
        "--spacing",
        type=float,
        nargs="+",
        metavar="MM",
        help="1 or 3 values (i j k) (default: keep the input's)",
    )
    one.add_argument("--shape", type=int, nargs=3, metavar="N", help="output size instead")
    g.add_argument("--orientation", help="axis codes such as RAS (default: keep the input's)")
    g.add_argument(
        "--interp",
        default="linear",
        choices=["linear", "cubic", "nearest"],
        help="image interpolation; labels are always nearest",
    )
    g.add_argument("--antialias", action="store_true", help="low-pass when downsampling")
    g.add_argument(
        "--grid",
        default="centred",
        choices=GRIDS,
        help="where a --spacing grid lies: centred on the field of view, or MONAI Spacingd's",
    )
    g.add_argument("--crop", type=int, nargs=3, metavar="N", help="centred crop/pad (i j k)")
    one = g.add_mutually_exclusive_group()
    one.add_argument("--clip", type=float, nargs=2, metavar=("LO", "HI"), help="intensity window")
    one.add_argument(
        "--percentiles",
        type=float,
        nargs=2,
        metavar=("LO", "HI"),
        help="clip to these percentiles of each volume",
    )
    one = g.add_mutually_exclusive_group()
    one.add_argument("--scale", type=float, nargs=2, metavar=("LO", "HI"), help="map to range")
    one.add_argument(
        "--zscore",
        action="store_true",
        help="subtract the mean and divide by the deviation of the input volume (computed before resampling)",
    )
    g.add_argument("--dtype", default="float32", help="image dtype (labels keep theirs)")
    g.add_argument(
        "--format",
        default="nii.gz",
        choices=["nii.gz", "nii", "npy"],
        help="npy: the training cache read by DALI's numpy reader",
    )
    g.add_argument(
        "--nan",
        default="error",
        choices=["error", "zero", "keep"],
        help="NaN/inf voxels in float inputs: fail the case, set to 0, keep",
    )
    o = c.add_argument_group("cases and outputs")
    o.add_argument("--labels", help="folder of label maps named like the images")
    o.add_argument(
        "--name",
        default="{name}",
        help="output name template; fields: "
        + "; ".join(f"{k}: {v}" for k, v in NAME_FIELDS.items()),
    )
    o.add_argument(
        "--annotations",
        metavar="FILE",
        help="lesion CSV (LUNA16: seriesuid,coordX,coordY,coordZ,diameter_mm, LPS) "
        "or JSON; writes <name>.annotations.json per case",
    )
    o.add_argument(
        "--qc",
        action="store_true",
        help="write OUTDIR/qc/<name>.png: views through each lesion (or label), "
        "before and after, with orientation letters",
    )
    o.add_argument(
        "--force",
        action="store_true",
        help="redo finished cases, also those made with other options",
    )
    o.add_argument(
        "--verify",
        action="store_true",
        help="on a rerun, read every finished output whole (a .nii.gz's gzip checksum) and "
        "convert again those that cannot be (default: sizes and headers checked)",
    )
    o.add_argument(
        "--dry-run",
        action="store_true",
        help="list the cases and the files they would write; write nothing",
    )
    r = c.add_argument_group("where it runs")
    r.add_argument("--device", default="cpu", choices=["cpu", "gpu"], help="DALI backend")
    r.add_argument(
        "-j",
        "--workers",
        type=_workers,
        default="auto",
        metavar="N|auto",
        help="worker processes, at most the cases to do; auto: one per core with forked "
        "CPU workers (--device gpu: one per core but one per GPU service), else 1 on <= 2 "
        "cores or for <= 2 cases and half the cores otherwise",
    )
    r.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run on dask.distributed: a scheduler address, or local[:N]",
    )
    t = c.add_argument_group("training layouts, written after the conversion from manifest.csv")
    t.add_argument(
        "--layout",
        action="append",
        choices=["nnunet", "monai"],
        help="nnunet: an nnU-Net v2 raw dataset; monai: a decathlon datalist JSON "
        "(repeatable); labels from --labels, or DICOM SEG/RTSTRUCT among the "
        "inputs",
    )
    t.add_argument(
        "--dataset",
        metavar="PATH",
        help="nnunet: the dataset folder, $nnUNet_raw/DatasetNNN_Name (required); "
        "monai alone: the JSON (default: OUTDIR/datalist.json)",
    )
    t.add_argument(
        "--channel-name", help="nnunet channel_names['0'] (default: CT for HU images, else zscore)"
    )
    t.add_argument(
        "--validation", nargs="+", metavar="CASE", help="monai: these cases go to 'validation'"
    )
    c.set_defaults(func=_cmd_convert)


def _spec(a):
    from .errors import UsageError
    from .spec import Intensity, Spec

    try:
        return Spec(
            spacing=a.spacing,
            shape=a.shape,
            orientation=a.orientation,
            interp=a.interp,
            antialias=a.antialias,
            grid=a.grid,
            crop=a.crop,
            dtype=a.dtype,
            intensity=Intensity(
                clip=a.clip, percentiles=a.percentiles, scale=a.scale, zscore=a.zscore
            ),
        )
    except (ValueError, TypeError) as e:  # said with the flag, not the Spec field
        msg = str(e)
        for field in sorted(_FLAG_OF, key=len, reverse=True):
            if msg.startswith(f"{field} "):
                msg = _FLAG_OF[field] + msg[len(field) :]
                break
        raise UsageError(f"invalid options: {msg}") from None


#: the option of each Spec field whose messages name it
_FLAG_OF = {
    f: "--" + f.removeprefix("Intensity.")
    for f in ("spacing", "shape", "orientation", "interp", "antialias", "grid", "crop", "dtype")
    + ("Intensity.clip", "Intensity.percentiles", "Intensity.scale", "Intensity.zscore")
}


def _cmd_convert(a) -> int:
    import time

    from ._convert_layouts import check_cases, check_layouts, write_layouts
    from ._convert_report import Mute, print_plan, print_skipped, run_with_bar, summary_line
    from ._trace import span
    from .cli import plain_console
    from .convert import prepare, summary
    from .errors import OutputError, printable
    from .pipeline.threads import default_threads

    t0 = time.perf_counter()
    quiet = getattr(a, "quiet", False)
    spec = _spec(a)
    default_threads()  # (a bad MEDPROC_DALI_THREADS: a usage error now, not every case failed)
    targets = check_layouts(a)
    with prepare(
        a.inputs,
        a.outdir,
        spec,
        fmt=a.format,
        labels_dir=a.labels,
        name=a.name,
        device=a.device,
        workers=a.workers,
        force=a.force,
        verify=a.verify,
        qc=a.qc,
        dask=a.dask,
        annotations=a.annotations,
        nan=a.nan,
        dry_run=a.dry_run,
    ) as batch:
        check_cases(a, batch, targets)
        if a.dry_run:  # (status 1 when it lists cases that would fail, as the run's)
            print_plan(batch, plain_console(), targets)
            return int(any(r["status"] == "failed" for r in batch.decided))
        try:
            with span("batch", cases=len(batch.todo), workers=batch.workers):
                rows, interrupted, ui = run_with_bar(batch, quiet, t0)
        except OutputError as e:  # the run started: not a "could not start" (2)
            print(
                f"medproc convert: error: {printable(str(e))}; the run stopped (the outputs "
                "written are kept, a rerun converts what the manifest does not record as done)",
                file=sys.stderr,
            )
            return 1
        s = summary(rows)
        if not quiet:
            if getattr(a, "verbose", False):
                print_skipped(batch)
            line = summary_line(a, batch, s, time.perf_counter() - t0)
            ui.console().print(line, soft_wrap=True)
            if batch.repeats:
                print(
                    f"medproc: warning: {batch.repeats} more case note(s) identical to one above not "
                    "printed; manifest.csv's 'warnings' column and each case's <name>.json list "
                    "every case's",
                    file=sys.stderr,
                )
        # (the failed are counted apart, in the summary line: each error says why)
        left = s["interrupted"] + s["not_started"]
        how = "terminated (SIGTERM)" if batch.terminated else "interrupted"
        if interrupted:  # (also after the last case: a `set -e` script stops as asked)
            if left:
                why = f"; {left} case(s) not converted yet: run the same command again to continue"
            elif targets:  # (no layout is started after a Ctrl-C or SIGTERM)
                why = (
                    " after every case was done, before the --layout files were written: run "
                    "the same command again to write them"
                )
            else:
                why = " after every case was done (nothing is left to convert)"
            print(f"medproc convert: {how}{why}", file=sys.stderr)
            return 143 if batch.terminated else 130
        rc = 0 if s["failed"] == 0 else 1
        if targets:  # still holding the output folder's lock
            rc = max(rc, write_layouts(a, targets, batch, Mute() if quiet else ui.console()))
        return rc
