"""What ``medproc convert`` prints: the plan of ``--dry-run``, the progress bar (made when
first needed), the summary line, the files skipped."""

from __future__ import annotations

import os
import sys

from .errors import printable

__all__ = ["print_plan", "print_skipped", "run_with_bar", "summary_line", "Mute"]


def print_plan(batch, con, targets: dict | None = None) -> None:
    """--dry-run's report: each case, what would be done with it, the files it would write and
    those of an earlier run it would remove; then the training layouts (``targets``: {kind:
    path}) it would write after them."""
    for r in sorted(batch.decided, key=lambda r: r["case"]):
        what = "skip (done)" if r["status"] == "skipped" else "fail"
        tail = r["error"] if r["status"] == "failed" else f"{r['source']} -> {r['output']}"
        con.print(f"{what:12s} {r['case']}  {tail}", soft_wrap=True)  # (errors name the input)
    for t in batch.todo:
        con.print(f"{'convert':12s} {t.row['case']}  {t.case.source}", soft_wrap=True)
        for p in t.outputs:
            con.print(f"{'':12s}   -> {p}", soft_wrap=True)
        for p in t.stale:  # (an earlier run's side files this run does not write again)
            con.print(f"{'':12s}   x  {p} (an earlier run's, removed)", soft_wrap=True)
    for p, reason in batch.annotations:
        con.print(f"{'annotation':12s} {p}: {reason}", soft_wrap=True)
    for p, reason in _other_skipped(batch):
        con.print(f"{'skip':12s} {p}: {reason}", soft_wrap=True)
    what = {"nnunet": "nnU-Net raw dataset (dataset.json, imagesTr/, labelsTr/, imagesTs/)",
            "monai": "MONAI datalist"}  # fmt: skip
    for kind, path in (targets or {}).items():
        con.print(f"{'layout':12s} {os.path.abspath(path)}: {what[kind]}", soft_wrap=True)
    n_skip = sum(r["status"] == "skipped" for r in batch.decided)
    con.print(
        f"{len(batch.todo)} to convert, {n_skip} already done, "
        f"{len(batch.decided) - n_skip} failed, with {batch.workers} worker(s); "
        f"nothing written (--dry-run)",
        soft_wrap=True,
    )


def _other_skipped(batch) -> list[tuple[str, str]]:
    """Files skipped that are not annotations: other names of a file read (links), stray
    non-image files named like images, an output folder met in the inputs..."""
    from .cases import is_annotation

    # (a folder both walks passed over, the images' and the DICOM headers', is listed once)
    return list(dict.fromkeys((p, r) for p, r in batch.skipped if not is_annotation(r)))


def print_skipped(batch) -> None:
    """The files skipped (not annotations), one line each on stderr (for -v)."""
    for p, reason in _other_skipped(batch):
        print(f"medproc convert: skipped {printable(f'{p}: {reason}')}", file=sys.stderr)


def summary_line(a, batch, s: dict, seconds: float) -> str:
    """The run's one-line summary: counts, time, workers, the manifest, what was skipped."""
    n_ann = len(batch.annotations)
    others = _other_skipped(batch)
    listed = "listed above" if getattr(a, "verbose", False) else "-v lists them"
    stopped = "".join(  # (after a Ctrl-C: the cases it stopped or kept from starting)
        f", {s[k]} {k.replace('_', ' ')}" for k in ("interrupted", "not_started") if s.get(k)
    )
    return (
        f"{s['ok']} converted, {s['skipped']} skipped (already done), {s['failed']} failed"
        f"{stopped}, of {len(batch.decided) + len(batch.todo)} case(s) in {seconds:.1f} s with "
        f"{batch.workers} worker(s); manifest: "
        f"{os.path.join(a.outdir, 'manifest.csv')}"
        + (f"; {n_ann} annotation file(s) (DICOM SEG/RTSTRUCT) not converted" if n_ann else "")
        + (f"; {len(others)} path(s) skipped, not images ({listed})" if others else "")
    )


def run_with_bar(batch, quiet: bool, t0: float):
    """Run the batch with a progress bar (none with -q); (rows, interrupted, bar)."""
    ui = _Bar(len(batch.decided) + len(batch.todo), quiet, t0)

    def on_interrupt():  # in a signal handler: one unbuffered write, nothing else
        os.write(
            2,
            b"\nmedproc convert: Ctrl-C: finishing the running case(s), starting no "
            b"new one (Ctrl-C again to stop them now)\n",
        )

    try:
        rows = batch.run(progress=ui.progress, on_interrupt=on_interrupt, on_started=ui.start)
        return rows, False, ui
    except KeyboardInterrupt as e:
        from ._procs import Terminated

        batch.terminated = batch.terminated or isinstance(e, Terminated)  # (outside its cases)
        return batch.rows, True, ui
    finally:
        ui.stop()


class _Bar:
    """The progress bar (none with -q) and the console, made when first needed: once the
    first cases are handed to the workers (rich's import then costs nothing: this process
    only waits), and after the pool is forked (no thread runs when workers are forked)."""

    def __init__(self, total: int, quiet: bool, t0: float):
        self.total, self.quiet, self.t0 = total, quiet, t0
        self.con = self.bar = None

    def console(self):
        """The stderr console (made now if not yet)."""
        if self.con is None:
            from .cli import plain_console

            self.con = plain_console(stderr=True)
        return self.con

    def start(self) -> None:
        """Show the bar (once; nothing with -q)."""
        if self.bar is not None or self.quiet:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        cols = [
            TextColumn("converting"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:.2f} cases/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        ]
        self.bar = Progress(*cols, console=self.console(), transient=False)
        self.task = self.bar.add_task("convert", total=self.total, rate=0.0)
        self.done = 0
        self.bar.start()

    def progress(self, row: dict) -> None:
        """One row settled: advance the bar; a failed one is printed (also with -q)."""
        import time

        self.start()
        if self.bar is not None:
            self.done += 1
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            self.bar.update(self.task, advance=1, rate=rate)
        if row["status"] in ("failed", "interrupted"):
            from rich.text import Text

            msg = row["error"] or row["source"]
            style = "red" if row["status"] == "failed" else "yellow"
            self.console().print(Text(row["status"], style=style), msg, soft_wrap=True)

    def stop(self) -> None:
        """Leave the bar's last state on the screen."""
        if self.bar is not None:
            self.bar.stop()


class Mute:
    """A console that prints nothing (-q)."""

    def print(self, *args, **kw) -> None:
        pass
