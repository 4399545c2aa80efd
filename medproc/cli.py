"""The ``medproc`` command line: a thin ``main(argv=None)`` over the library."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def _cmd_inspect(a) -> int:
    from rich.console import Console
    from rich.table import Table

    from .inspect import inspect_paths

    entries = inspect_paths(a.paths)
    if a.json:
        print(json.dumps([e.as_dict() for e in entries], indent=1, default=str))
        return 0 if entries else 1
    con = Console(width=a.width)
    vols = [e for e in entries if e.kind != "skipped"]
    t = Table(title=f"{len(vols)} volume(s) found", show_lines=False)
    for col in (
        "#",
        "kind",
        "modality",
        "series / file",
        "description",
        "size",
        "spacing mm",
        "orient",
        "files",
        "transfer syntax",
        "decode",
        "status",
    ):
        t.add_column(col, overflow="fold")
    for n, e in enumerate(vols):
        status = (
            "[red]ERROR[/red]"
            if e.error
            else (
                f"[yellow]{len(e.warnings)} warning(s)[/yellow]"
                if e.warnings
                else "[green]ok[/green]"
            )
        )
        t.add_row(
            str(n),
            e.kind,
            e.modality,
            e.series or e.source,
            e.description,
            "x".join(map(str, e.shape)),
            " x ".join(f"{s:g}" for s in e.spacing),
            e.orientation,
            str(e.files),
            e.transfer_syntax,
            e.decode,
            status,
        )
    con.print(t)
    for n, e in enumerate(vols):
        for w in e.warnings:
            con.print(f"[yellow]warning[/yellow] #{n} {e.source}: {w}", highlight=False)
        if e.error:
            con.print(f"[red]error[/red] #{n} {e.source}: {e.error}", highlight=False)
    skipped = [e for e in entries if e.kind == "skipped"]
    if skipped:
        con.print(f"{len(skipped)} file(s) skipped:")
        for e in skipped[: a.max_skipped]:
            con.print(f"  {e.source}: {e.error}", highlight=False)
        if len(skipped) > a.max_skipped:
            con.print(f"  ... and {len(skipped) - a.max_skipped} more (--max-skipped)")
    return 0 if vols else 1


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="medproc", description="Fast, exact medical-imaging preprocessing."
    )
    p.add_argument("--version", action="version", version=f"medproc {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("inspect", help="list the series and files found, with geometry warnings")
    i.add_argument("paths", nargs="+", help="DICOM folders/files, NIfTI, NRRD or MHA files")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--max-skipped", type=int, default=20, help="skipped files to list")
    i.add_argument("--width", type=int, default=None, help="table width (default: terminal)")
    i.set_defaults(func=_cmd_inspect)
    from .convert_cli import add_convert_parser

    add_convert_parser(sub)
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
