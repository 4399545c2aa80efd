"""``medproc convert``: the CLI over :func:`medproc.convert.convert`."""

from __future__ import annotations

import os

__all__ = ["add_convert_parser"]


def add_convert_parser(sub) -> None:
    c = sub.add_parser(
        "convert",
        help="resample whole datasets to NIfTI or a .npy training cache",
        description="Resample every DICOM series and NIfTI/NRRD/MHA file under "
        "INPUT (folders, files or CSV case lists) into OUTDIR, with a manifest.",
    )
    c.add_argument("inputs", nargs="+", metavar="INPUT")
    c.add_argument("-o", "--outdir", required=True)
    c.add_argument("--spacing", type=float, nargs="+", metavar="MM", help="1 or 3 values (i j k)")
    c.add_argument("--shape", type=int, nargs=3, metavar="N")
    c.add_argument("--orientation", default=None, help="e.g. RAS (default: keep)")
    c.add_argument("--interp", default="linear", choices=["linear", "cubic", "nearest"])
    c.add_argument("--antialias", action="store_true")
    c.add_argument("--labels", default=None, help="folder of label maps named like the images")
    c.add_argument("--clip", type=float, nargs=2, metavar=("LO", "HI"))
    c.add_argument("--percentiles", type=float, nargs=2, metavar=("LO", "HI"))
    c.add_argument("--scale", type=float, nargs=2, metavar=("LO", "HI"))
    c.add_argument("--zscore", action="store_true")
    c.add_argument("--crop", type=int, nargs=3, metavar="N")
    c.add_argument("--dtype", default="float32")
    c.add_argument("--format", default="nii.gz", choices=["nii.gz", "nii", "npy"])
    c.add_argument(
        "--name",
        default="{name}",
        help="output name template; fields: name (file stem or series-<uid hash>), "
        "stem, uid_hash, series_number, modality",
    )
    c.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    c.add_argument("-j", "--workers", type=int, default=max(1, (os.cpu_count() or 1)))
    c.add_argument("--force", action="store_true", help="redo cases whose output exists")
    c.add_argument(
        "--nan",
        default="error",
        choices=["error", "zero", "keep"],
        help="NaN/inf voxels in float inputs: fail the case (default), set to 0, keep",
    )
    c.add_argument(
        "--qc",
        action="store_true",
        help="write OUTDIR/qc/<name>.png: mid-slices before/after, labels overlaid",
    )
    c.add_argument(
        "--annotations",
        default=None,
        metavar="FILE",
        help="lesion CSV (LUNA16: seriesuid,coordX,coordY,coordZ,diameter_mm, LPS) or JSON; "
        "writes <output name>.annotations.json per case",
    )
    c.add_argument(
        "--dask",
        default=None,
        metavar="ADDRESS",
        help="run on dask.distributed: a scheduler address, or local[:N] for a LocalCluster",
    )
    c.set_defaults(func=_cmd_convert)


def _cmd_convert(a) -> int:
    import time
    import warnings

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    from .cli import plain_console
    from .convert import convert, plain_warning, summary
    from .errors import UsageError
    from .spec import Intensity, Spec

    con = plain_console(stderr=True)
    try:
        spec = Spec(
            spacing=a.spacing,
            shape=a.shape,
            orientation=a.orientation,
            interp=a.interp,
            antialias=a.antialias,
            crop=a.crop,
            dtype=a.dtype,
            intensity=Intensity(
                clip=a.clip, percentiles=a.percentiles, scale=a.scale, zscore=a.zscore
            ),
        )
    except (ValueError, TypeError) as e:
        raise UsageError(f"invalid options: {e}") from None
    cols = [
        TextColumn("converting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:.2f} cases/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ]
    t0 = time.perf_counter()
    with warnings.catch_warnings(), Progress(*cols, console=con, transient=False) as bar:
        warnings.showwarning = plain_warning
        task = bar.add_task("convert", total=None, rate=0.0)

        def progress(row):
            done = bar.tasks[0].completed + 1
            bar.update(task, advance=1, rate=done / max(time.perf_counter() - t0, 1e-9))
            if row["status"] == "failed":
                msg = row["error"] or row["source"]
                bar.console.print(Text("failed", style="red"), msg, soft_wrap=True)

        rows = convert(
            a.inputs,
            a.outdir,
            spec,
            fmt=a.format,
            labels_dir=a.labels,
            name=a.name,
            device=a.device,
            workers=a.workers,
            force=a.force,
            qc=a.qc,
            dask=a.dask,
            annotations=a.annotations,
            nan=a.nan,
            progress=progress,
            on_start=lambda n: bar.update(task, total=n),
        )
    s = summary(rows)
    con.print(
        f"{s['ok']} converted, {s['skipped']} skipped (already done), {s['failed']} failed, "
        f"of {s['total']} case(s) in {time.perf_counter() - t0:.1f} s; manifest: "
        f"{os.path.join(a.outdir, 'manifest.csv')}"
    )
    return 0 if s["failed"] == 0 else 1
