"""The ``medproc`` command line: a thin ``main(argv=None)`` over the library.

Errors are printed as plain text (file names and messages are never read as markup), without a
traceback unless ``-v`` is given. Exit status: 0 everything worked, 1 some cases or files
failed (or an unexpected error), 2 the command could not run (bad arguments or inputs: the
message says which), 130 interrupted, 141 the reader of the output went away.

:func:`main` returns the status (tests and programs call it in-process); :func:`run`, the
program (``python -m medproc``), exits with it at once after flushing, skipping the
interpreter's teardown of DALI and the other extension modules (~0.3 s).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import textwrap
import traceback

from ._malloc import keep_scratch
from ._startup import python_interrupt

__all__ = ["main", "run", "build_parser", "plain_console"]


def _at_least(lowest: int):
    """An argparse type: a whole number >= ``lowest``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if n < lowest:
            raise argparse.ArgumentTypeError(f"must be >= {lowest}, got {n}")
        return n

    return parse


def _png(text: str) -> str:
    """An argparse type: a file name ending in .png (the picture is a PNG)."""
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"the picture is a PNG: name it *.png, got {text!r}")
    return text


def plain_console(stderr: bool = False, width: int | None = None):
    """A rich Console that never interprets text: no markup, emoji codes or highlighting, so a
    path like ``case[1].nii.gz`` or a message with ``[red]`` prints as it is."""
    from rich.console import Console

    from .errors import printable

    class _Plain(Console):
        # every string printed, table cells too (rich Text objects are not: medproc wraps only
        # its own fixed words in them)
        def render_str(self, text: str, **kw):
            return super().render_str(printable(text), **kw)

    console = _Plain(stderr=stderr, width=width, markup=False, emoji=False, highlight=False)
    console.on_broken_pipe = _broken_pipe  # rich's own exits 1: ours gives the documented 141
    return console


def _broken_pipe() -> None:
    raise BrokenPipeError("the reader of the output went away")


def _styled(text: str, style: str):
    from rich.text import Text

    return Text(text, style=style)


def _cmd_inspect(a) -> int:
    from rich.table import Table

    from .cases import check_exist
    from .inspect import inspect_paths

    check_exist(a.paths)
    entries = inspect_paths(a.paths)
    vols = [e for e in entries if e.kind in ("dicom", "nifti", "itk") and not e.error]
    failed = [e for e in entries if e.error and e.kind not in ("skipped", "annotation")]
    rc = 1 if failed or not vols else 0
    if a.json:
        print(json.dumps([e.as_dict() for e in entries], indent=1, default=str))
        return rc
    width = a.width or (None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 1000)
    con = plain_console(width=width)  # piped: wide rows that grep and less show whole
    shown = [e for e in entries if e.kind != "skipped"]
    t = Table(title=_inspect_title(shown, vols, failed), show_lines=False)
    for col in (
        "#",
        "kind",
        "modality",
        "folder / file",
        "series UID",
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
        elif e.kind == "annotation":
            status = _styled("not an image", "cyan")
        elif e.warnings:
            status = _styled(f"{len(e.warnings)} warning(s)", "yellow")
        else:
            status = _styled("ok", "green")
        t.add_row(
            str(n),
            e.kind,
            e.modality,
            e.source,
            e.series,
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
        for w in [] if a.quiet else e.warnings:
            con.print(_styled("warning", "yellow"), f"#{n} {e.source}: {w}", soft_wrap=True)
        if e.error:
            con.print(_styled("error", "red"), f"#{n} {e.source}: {e.error}", soft_wrap=True)
    skipped = [e for e in entries if e.kind == "skipped"]
    if skipped and not a.quiet:
        con.print(f"{len(skipped)} path(s) skipped (not images, or other names of files listed):")
        for e in skipped[: a.max_skipped]:
            con.print(f"  {e.source}: {e.error}", soft_wrap=True)
        if len(skipped) > a.max_skipped:
            con.print(f"  ... and {len(skipped) - a.max_skipped} more (--max-skipped)")
    return rc


def _inspect_title(shown, vols, failed) -> str:
    """The table's title, its rows counted: e.g. "13 row(s): 9 readable volume(s), 4 in
    error"."""
    ann = sum(e.kind == "annotation" for e in shown)
    parts = [f"{len(vols)} readable volume(s)", f"{len(failed)} in error"]
    parts += [f"{ann} annotation file(s) (not images)"] if ann else []
    return f"{len(shown)} row(s): " + ", ".join(parts)


def _cmd_trace(a) -> int:
    from ._trace_report import run

    return run(a.folder, a.png)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``medproc`` (subcommands ``inspect``, ``convert``, ``trace``)."""
    from . import __version__
    from ._cli_parser import EXIT_ALL, EXIT_INSPECT, EXIT_TRACE, HelpFormatter, Parser
    from .convert_cli import add_convert_parser

    p = Parser(
        prog="medproc",
        description="Fast, exact medical-imaging preprocessing.",
        formatter_class=HelpFormatter,
        epilog=EXIT_ALL,
    )
    p.add_argument("--version", action="version", version=f"medproc {__version__}")
    _add_verbosity(p, argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True, metavar="{inspect,convert,trace}")
    i = sub.add_parser(
        "inspect",
        help="list the series and files found, with geometry warnings",
        description=textwrap.fill(
            "The DICOM series and NIfTI/NRRD/MHA files under PATH, from headers only: folder, "
            "series UID, size, spacing, orientation, transfer syntax, decoder, and every "
            "warning or error; then the files skipped (not images). DICOM SEG and RTSTRUCT "
            "files are listed as annotations.",
            88,
        ),
        formatter_class=HelpFormatter,
        epilog=EXIT_INSPECT,
    )
    i.add_argument("paths", nargs="+", metavar="PATH", help="DICOM/NIfTI/NRRD/MHA files, folders")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--max-skipped", type=_at_least(0), default=20, help="skipped files to list")
    i.add_argument(
        "--width",
        type=_at_least(40),
        help=(
            "table width (default: the terminal's; piped or redirected: as wide as its rows, "
            "up to 1000, unless COLUMNS is set)"
        ),
    )
    i.set_defaults(func=_cmd_inspect)
    add_convert_parser(sub)
    t = sub.add_parser(
        "trace",
        help="where a traced run's time went (MEDPROC_TRACE=DIR medproc convert ...)",
        description=textwrap.fill(
            "Sum up a run traced with MEDPROC_TRACE=DIR: the main process's milestones, the "
            "seconds per step (header scan, read, resample, write, the GPU services' work) in "
            "each kind of process, with their CPU time and page faults, and how busy each "
            "process was over the batch. Trace each run into a folder of its own.",
            88,
        ),
        formatter_class=HelpFormatter,
        epilog=EXIT_TRACE,
    )
    t.add_argument("folder", metavar="DIR", help="the folder MEDPROC_TRACE named")
    t.add_argument(
        "--png", metavar="FILE", type=_png, help="also draw every process on one time axis"
    )
    t.set_defaults(func=_cmd_trace)
    for parser in (i, sub.choices["convert"], t):
        _add_verbosity(parser, argparse.SUPPRESS)
        parser.set_defaults(command_parser=parser)  # (its usage for errors found after parsing)
    p.set_defaults(verbose=False, quiet=False)
    return p


def _add_verbosity(parser, default) -> None:
    """``-v``/``-q``, accepted before or after the subcommand."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="tracebacks and progress logs (default: off)",
    )
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default,
        help="errors only: no progress bar, summary or warnings (default: off)",
    )


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
    import warnings

    from ._convert_case import plain_warning

    _safe_streams()
    parser = build_parser()
    a, extra = parser.parse_known_args(argv)
    command = a.command_parser
    if extra:  # said with the command's usage, not medproc's
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    if a.verbose and a.quiet:  # (one before the command, one after it)
        command.error("argument -q/--quiet: not allowed with argument -v/--verbose")
    with warnings.catch_warnings():  # (put back after: main() may be called from Python)
        warnings.showwarning = plain_warning  # "medproc: warning: ..." (forked workers too)
        if getattr(a, "quiet", False):  # -q: errors only (forked workers inherit it)
            warnings.simplefilter("ignore")
        return _command(a)


def _command(a) -> int:
    from ._trace import started
    from .errors import MedprocError, UsageError, printable

    if a.command != "trace":  # (reading a trace with MEDPROC_TRACE still set adds nothing)
        started()
    verbose = getattr(a, "verbose", False)
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    quiet = {} if verbose else {n: logging.getLogger(n) for n in ("nibabel", "pydicom")}
    levels = {n: lg.level for n, lg in quiet.items()}
    for lg in quiet.values():  # the readers' chatter about damaged headers: our errors say it
        lg.setLevel(logging.CRITICAL)
    from ._procs import Terminated, early_sigterm

    try:
        with early_sigterm():
            return a.func(a)
    except Terminated:
        again = "; run the same command again to continue" if a.command == "convert" else ""
        print(f"medproc {a.command}: terminated (SIGTERM){again}", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        again = "; run the same command again to continue" if a.command == "convert" else ""
        print(f"medproc {a.command}: interrupted{again}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (medproc inspect | head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except MedprocError as e:
        if verbose:
            traceback.print_exc()
        kind = "usage error" if isinstance(e, UsageError) else "error"
        print(f"medproc {a.command}: {kind}: {printable(str(e), newlines=True)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a bug: say so in one line; -v shows the traceback
        if verbose:
            traceback.print_exc()
        how = (
            "report it with the traceback above"
            if verbose
            else "run again with -v for the traceback and report it"
        )
        print(
            f"medproc {a.command}: unexpected {type(e).__name__}: {printable(str(e))}\n"
            f"This is a bug in medproc: {how}.",
            file=sys.stderr,
        )
        return 1
    finally:
        for n, lg in quiet.items():
            lg.setLevel(levels[n])


#: DALI helpers that build, at import, introspection signatures and docstrings for each of its
#: ~180 operators, and the cheap stand-ins the program uses instead
_DALI_INTROSPECTION = {
    "nvidia.dali.ops._signatures": {"_call_signature": None},
    "nvidia.dali.ops._docs": {"_docstring_generator_call": "", "_docstring_generator_fn": ""},
}


class _LeanDali:
    """A meta-path finder: when DALI imports its introspection helpers, they are loaded as
    usual and then :data:`_DALI_INTROSPECTION`'s functions are replaced by constants. Found
    nothing it expects (another DALI version): it changes nothing."""

    def find_spec(self, name, path, target=None):
        stubs = _DALI_INTROSPECTION.get(name)
        if stubs is None:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        exec_module = getattr(getattr(spec, "loader", None), "exec_module", None)
        if exec_module is None:
            return None

        def patched(module, exec_module=exec_module):
            exec_module(module)
            for attr, value in stubs.items():
                if callable(getattr(module, attr, None)):
                    setattr(module, attr, lambda *a, _v=value, **k: _v)

        spec.loader.exec_module = patched
        return spec


def _lean_dali_import() -> None:
    """In the program only: importing DALI spends ~0.1 s of its ~0.3 s on operator signatures
    and docstrings for ``inspect``/``help``, which a command line never shows: left empty."""
    if "nvidia.dali" not in sys.modules and not any(
        isinstance(f, _LeanDali) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _LeanDali())


def run(argv=None) -> None:
    """The ``medproc`` program: :func:`main`, then flush and leave the process at once with its
    status (``os._exit``): every file is closed and every pool stopped by then, and the
    interpreter's teardown (DALI, pydicom, numpy...) is skipped. Never call it from a program
    that should go on: call :func:`main`."""
    python_interrupt()  # (KeyboardInterrupt from here on: the command's own handling)
    keep_scratch()  # (DALI's CPU scratch reused run after run, in the forked workers too)
    _lean_dali_import()
    rc = main(argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    logging.shutdown()
    os._exit(rc)


if __name__ == "__main__":
    run()
