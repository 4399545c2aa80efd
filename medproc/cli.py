"""The ``medproc`` command line: a thin ``main(argv=None)`` over the library.

Errors are printed as plain text (file names and messages are never read as markup), without a
traceback unless ``-v`` is given. Exit status: 0 everything worked, 1 some cases or files
failed (or an unexpected error), 2 the command could not run (bad arguments or inputs: the
message says which), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback

__all__ = ["main", "build_parser", "plain_console"]


def plain_console(stderr: bool = False, width: int | None = None):
    """A rich Console that never interprets text: no markup, emoji codes or highlighting, so a
    path like ``case[1].nii.gz`` or a message with ``[red]`` prints as it is."""
    from rich.console import Console

    return Console(stderr=stderr, width=width, markup=False, emoji=False, highlight=False)


def _styled(text: str, style: str):
    from rich.text import Text

    return Text(text, style=style)


def _cmd_inspect(a) -> int:
    from rich.table import Table

    from .inspect import inspect_paths

    entries = inspect_paths(a.paths)
    vols = [e for e in entries if e.kind not in ("skipped", "error")]
    if a.json:
        print(json.dumps([e.as_dict() for e in entries], indent=1, default=str))
        return 0 if vols else 1
    con = plain_console(width=a.width)
    shown = [e for e in entries if e.kind != "skipped"]
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
    for n, e in enumerate(shown):
        if e.error:
            status = _styled("ERROR", "red")
        elif e.warnings:
            status = _styled(f"{len(e.warnings)} warning(s)", "yellow")
        else:
            status = _styled("ok", "green")
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
    for n, e in enumerate(shown):
        for w in e.warnings:
            con.print(_styled("warning", "yellow"), f"#{n} {e.source}: {w}", soft_wrap=True)
        if e.error:
            con.print(_styled("error", "red"), f"#{n} {e.source}: {e.error}", soft_wrap=True)
    skipped = [e for e in entries if e.kind == "skipped"]
    if skipped:
        con.print(f"{len(skipped)} file(s) skipped:")
        for e in skipped[: a.max_skipped]:
            con.print(f"  {e.source}: {e.error}", soft_wrap=True)
        if len(skipped) > a.max_skipped:
            con.print(f"  ... and {len(skipped) - a.max_skipped} more (--max-skipped)")
    return 0 if vols else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``medproc`` (subcommands ``inspect`` and ``convert``)."""
    from . import __version__

    p = argparse.ArgumentParser(
        prog="medproc", description="Fast, exact medical-imaging preprocessing."
    )
    p.add_argument("--version", action="version", version=f"medproc {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks and progress logs")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("inspect", help="list the series and files found, with geometry warnings")
    i.add_argument("paths", nargs="+", help="DICOM folders/files, NIfTI, NRRD or MHA files")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--max-skipped", type=int, default=20, help="skipped files to list")
    i.add_argument("--width", type=int, default=None, help="table width (default: terminal)")
    i.set_defaults(func=_cmd_inspect)
    from .convert_cli import add_convert_parser

    add_convert_parser(sub)
    for parser in (i, sub.choices["convert"]):
        parser.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="tracebacks and progress logs",
        )
    return p


def _safe_streams() -> None:
    """File names that are not valid UTF-8 (kept by Python as surrogates) print escaped instead
    of raising UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):  # replaced streams (pytest capture, notebooks)
            pass


def main(argv=None) -> int:
    """Run ``medproc`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    from .errors import MedprocError, UsageError

    _safe_streams()
    a = build_parser().parse_args(argv)
    verbose = getattr(a, "verbose", False)
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    quiet = {} if verbose else {n: logging.getLogger(n) for n in ("nibabel", "pydicom")}
    levels = {n: lg.level for n, lg in quiet.items()}
    for lg in quiet.values():  # the readers' chatter about damaged headers: our errors say it
        lg.setLevel(logging.CRITICAL)
    try:
        return a.func(a)
    except KeyboardInterrupt:
        print(f"medproc {a.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (medproc inspect | head)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except MedprocError as e:
        if verbose:
            traceback.print_exc()
        kind = "usage error" if isinstance(e, UsageError) else "error"
        print(f"medproc {a.command}: {kind}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a bug: say so in one line; -v shows the traceback
        if verbose:
            traceback.print_exc()
        print(
            f"medproc {a.command}: unexpected {type(e).__name__}: {e}\n"
            "This is a bug in medproc: run again with -v for the traceback and report it.",
            file=sys.stderr,
        )
        return 1
    finally:
        for n, lg in quiet.items():
            lg.setLevel(levels[n])


if __name__ == "__main__":
    sys.exit(main())
