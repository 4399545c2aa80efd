"""A planned batch (:class:`Batch`; planned by :mod:`medproc._plan_batch`): which cases to
convert, skip or fail, under which names; and running it, with Ctrl-C handled.

Running: cases go to the workers one at a time (never more queued than workers run), so a first
Ctrl-C starts no new case, lets the running ones finish and records them, then raises
``KeyboardInterrupt``; a second Ctrl-C ends the running ones at once (their rows say so) and
kills the workers. The manifest is written after every case: a rerun continues. A worker
killed (out of memory) breaks the pool: the cases running and those left fail, saying so, and a
rerun converts them.

Files: before any case starts, the side files an earlier run wrote for a case this run redoes
without them are removed, and every case to do gets its row ("not started"), so that whatever
kills the run, each output on disk is owned by a row. A case that fails removes what it wrote
in this run (:func:`medproc._case_files.take_back`), nothing else.
"""

from __future__ import annotations

import logging
import os
import warnings
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, wait
from dataclasses import dataclass, field

from ._case_files import file_state, remove_files, take_back
from ._convert_case import _worker, annotations_path, sidecar_path
from ._procs import Interrupts
from ._trace import span
from .cases import Case
from .errors import MedprocWarning
from .manifest import write_manifest

log = logging.getLogger("medproc.convert")

__all__ = ["Batch", "Todo", "INTERRUPTED", "NOT_STARTED", "STOPPED", "close_all"]

#: the status of a case a second Ctrl-C stopped, and its error (redone by the next run)
STOPPED = "interrupted"
INTERRUPTED = (
    "interrupted (Ctrl-C or SIGTERM) before it finished; run the same command again to convert it"
)
#: the status of a case a Ctrl-C kept from starting (converted when the command is run again)
NOT_STARTED = "not started"
_NOT_STARTED_WHY = (
    "not started: a Ctrl-C (or SIGTERM) came first; run the same command again to convert it"
)
#: the row of a case not settled yet, written before any case starts: what a killed run leaves
_PENDING_WHY = (
    "not converted: the run ended before this case was done (killed?); run the same command "
    "again to convert it"
)


@dataclass
class Todo:
    """One case to convert: its row and its output paths."""

    case: Case
    row: dict
    out_path: str
    label_path: str | None
    qc_path: str | None
    lesions: object = None
    stale: list = field(default_factory=list)  # an earlier run's side files a redo removes
    before: dict | None = None  # its outputs' file_state when it started (None: not started)

    @property
    def outputs(self) -> list[str]:
        """Every file converting the case writes."""
        return output_files(self.out_path, self.label_path, self.qc_path, self.lesions is not None)


def output_files(out_path: str, label_path, qc_path, annotations: bool) -> list[str]:
    """Every file a case writes: its image, ``<name>.json``, label map, QC picture and
    annotations (those it has)."""
    out = [out_path, sidecar_path(out_path)]
    out += [p for p in (label_path, qc_path) if p]
    return out + ([annotations_path(out_path)] if annotations else [])


@dataclass
class Batch:
    """A planned batch (see the module doc); made by :func:`medproc.convert.prepare`."""

    outdir: str
    options: dict
    todo: list[Todo]
    decided: list[dict]  # rows settled without converting: failed inputs, skipped done cases
    kept: list[dict]  # rows of earlier runs' cases that are not in this one
    skipped: list[tuple[str, str]]  # files that are no case, with the reason
    spec: object = None
    device: str = "cpu"
    nan: str = "error"
    workers: int = 1
    dry_run: bool = False
    executor: object = None  # the pool the cases run on (None: in this process)
    threads: int | None = None  # DALI threads per case
    closers: list = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # this run's rows, as cases finish
    made_qc: bool = False  # this run made OUTDIR/qc (removed again if left empty)
    said: set = field(default_factory=set)  # the case notes printed (each once)
    repeats: int = 0  # case notes not printed again: word for word one said for another case
    terminated: bool = False  # a SIGTERM stopped the run (else a Ctrl-C, if interrupted)

    @property
    def annotations(self) -> list[tuple[str, str]]:
        """DICOM SEG / RTSTRUCT files found among the inputs (not converted)."""
        from .cases import is_annotation

        return [(p, r) for p, r in self.skipped if is_annotation(r)]

    def close(self) -> None:
        """Stop the pool this batch started and release the output folder; a Ctrl-C meanwhile
        cuts short the step it lands in, not the others (then it is raised)."""
        close_all(self.closers)

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, progress=None, on_interrupt=None, on_started=None) -> list[dict]:
        """Convert the cases; returns this run's rows (sorted by case). See the module doc.

        ``progress(row)`` is called for every row as it is settled; ``on_interrupt()`` on the
        first Ctrl-C (in the main thread only); ``on_started()`` once the first cases are
        handed to the workers (in this process: before the first starts), e.g. to draw a
        progress bar while they run."""
        if self.dry_run:
            raise RuntimeError("a dry-run batch cannot run: prepare it with dry_run=False")
        manifest = os.path.join(self.outdir, "manifest.csv")
        self.rows = list(self.decided)
        for t in self.todo:  # (what its files are made with, from now on: they are its own)
            t.row["options"] = _options_json(self.options)
        self._remove_stale()
        # every file this run may write is in the manifest before it is written (a case not
        # done yet says so): a run killed anywhere leaves no output that no row owns
        write_manifest(manifest, self._manifest_rows())
        for r in self.decided:
            if progress:
                progress(r)

        def finish(res, t: Todo, write: bool = True):
            case, status, info, err = res
            row = t.row
            tb = info.pop("traceback", None)
            if tb:  # a bug in a case, not bad input: said with -v
                log.info("%s: %s", case.source, tb)
            if status != "ok" and t.before is not None:  # what it wrote in this run goes
                gone = take_back(t.outputs, t.before)
                if gone:
                    log.info("%s: failed; removed what it wrote: %s", case.source, gone)
            self._say(case, info.pop("notes", None) or ())
            row.update(info, status=status, error=err)
            self.rows.append(row)
            with span("finish"):
                if write:  # atomically: resumable anywhere
                    write_manifest(manifest, self._manifest_rows())
                if progress:
                    progress(row)

        interrupted, stop = False, Interrupts(on_interrupt)
        try:
            with stop:
                if self.executor is None:
                    self._run_here(stop, finish, on_started)
                else:
                    self._run_pool(stop, finish, on_started)
                interrupted = stop.requested
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:  # every row settled, whatever happened: a second Ctrl-C may have ended a
            # finish() before its write; the cases a Ctrl-C kept from starting get a row too
            self.terminated = stop.terminated
            settled = {id(r) for r in self.rows}
            for t in self.todo if interrupted else ():
                if id(t.row) not in settled:
                    t.row.update(status=NOT_STARTED, error=f"{t.case.source}: {_NOT_STARTED_WHY}")
                    self.rows.append(t.row)
            self._drop_qc_folder()
            write_manifest(manifest, self._manifest_rows())
        if interrupted:
            raise KeyboardInterrupt
        return sorted(self.rows, key=lambda r: r["case"])

    def _say(self, case, notes) -> None:
        """Print a case's notes (warnings, ``medproc: warning: <input>: ...`` on the command
        line), each only the first time in this batch: the label-tie note of a common grid is
        the same for every case. Its manifest row and sidecar record them all."""
        for note in notes:
            if note in self.said:
                self.repeats += 1
                continue
            self.said.add(note)
            warnings.warn(f"{case.source}: {note}", MedprocWarning, stacklevel=2)

    def _manifest_rows(self) -> list[dict]:
        """The manifest now: earlier runs' rows, this run's settled rows, and a row saying
        "not converted" for each case not settled yet."""
        settled = {id(r) for r in self.rows}
        pending = [
            {**t.row, "status": NOT_STARTED, "error": f"{t.case.source}: {_PENDING_WHY}"}
            for t in self.todo
            if id(t.row) not in settled
        ]
        return self.kept + self.rows + pending

    def _remove_stale(self) -> None:
        """Remove the side files (label, annotations, QC picture) an earlier run wrote for the
        cases this run redoes without them (listed in their old rows: medproc's own)."""
        qc = os.path.join(self.outdir, "qc")
        emptied = False
        for t in self.todo:
            gone = remove_files(t.stale)
            if gone:
                log.info(
                    "%s: removed %s, written by an earlier run and not by this one",
                    t.row["case"],
                    ", ".join(gone),
                )
            emptied |= any(os.path.dirname(p) == qc for p in gone)
        self._drop_qc_folder(made=emptied)

    def _drop_qc_folder(self, made: bool = False) -> None:
        """Remove ``OUTDIR/qc`` when it is empty and this run made it (``made``: or took a
        picture out of it)."""
        if made or self.made_qc:
            try:
                os.rmdir(os.path.join(self.outdir, "qc"))
            except OSError:  # (not empty, or not there)
                pass

    def _args(self, t: Todo) -> tuple:
        record = {**self.options, "device": self.device}
        decode = 1 if self.executor is not None else None  # a pool spreads cases over cores
        return (
            t.case,
            t.out_path,
            t.label_path,
            self.spec,
            self.device,
            t.qc_path,
            self.threads,
            t.lesions,
            self.nan,
            decode,
            record,
        )

    def _start(self, t: Todo) -> None:
        if t.qc_path and not os.path.isdir(os.path.dirname(t.qc_path)):
            os.makedirs(os.path.dirname(t.qc_path), exist_ok=True)
            self.made_qc = True
        t.before = {p: file_state(p) for p in t.outputs}

    def _run_here(self, stop, finish, on_started) -> None:
        if on_started:
            on_started()
        for t in self.todo:
            if stop.requested:
                break
            self._start(t)
            try:
                res = _worker(self._args(t))
            except KeyboardInterrupt:  # a second Ctrl-C: this case stops where it is
                finish((t.case, STOPPED, {}, f"{t.case.source}: {INTERRUPTED}"), t)
                raise
            finish(res, t)

    def _run_pool(self, stop, finish, on_started) -> None:
        from ._procs import kill_pool

        ex, queue, running = self.executor, iter(self.todo), {}

        def submit_next() -> None:
            t = next(queue, None)
            if t is None:
                return
            self._start(t)
            try:
                running[ex.submit(_worker, self._args(t))] = t
            except BrokenExecutor as e:  # a worker died (OOM killer...): no more cases
                left = [t, *queue]
                for n, u in enumerate(left):  # their rows, the manifest written once
                    err = f"{u.case.source}: not converted, the worker pool broke ({e})"
                    finish((u.case, "failed", {}, err), u, write=n == len(left) - 1)

        for _ in range(max(1, self.workers)):
            submit_next()
        try:
            if on_started:
                on_started()
            while running:
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in done:
                    t = running.pop(fut)
                    try:
                        res = fut.result()
                    except Exception as e:  # noqa: BLE001 - a worker died (OOM killer...)
                        spawned = getattr(ex, "medproc_start_method", "") == "spawn"
                        why = (  # (a spawned worker re-runs an unguarded script: it says so)
                            "a worker killed, out of memory? Or, spawned workers: a script "
                            "without if __name__ == '__main__': (see the workers' error above)"
                            if spawned
                            else "a worker killed, out of memory?"
                        )
                        err = (
                            f"{t.case.source}: its worker died or the pool broke ({why}) ({e}); "
                            "run the same command again"
                        )
                        res = (t.case, "failed", {}, err)
                    try:  # the next case first: the worker is idle while this process does
                        # the bookkeeping (the manifest, the progress bar; on the H200 node
                        # workers waited up to 0.17 s for it)
                        if not stop.requested:
                            submit_next()
                    finally:  # (a second Ctrl-C meanwhile: this row is written all the same)
                        finish(res, t)
        except KeyboardInterrupt:  # a second Ctrl-C: end the running cases now
            # (those that finished meanwhile keep their row as it came back)
            ended = {f: f.result() for f in running if f.done() and _ok(f)}
            if hasattr(ex, "_processes"):
                kill_pool(ex)
            else:
                for fut in running:
                    fut.cancel()
            for fut, t in running.items():
                if fut in ended:
                    finish(ended[fut], t, write=False)
                    continue
                # (a killed worker could not clean up after itself: finish takes back what
                # it wrote, temporaries included)
                err = f"{t.case.source}: {INTERRUPTED}"
                finish((t.case, STOPPED, {}, err), t, write=False)
            raise  # (the manifest is written once, by run())


def close_all(closers: list) -> None:
    """Call and remove each of ``closers`` in turn (stop the pool, release the output folder's
    lock...); a Ctrl-C meanwhile cuts short the step it lands in, not the others (then it is
    raised): two quick Ctrl-Cs never leave the lock behind."""
    interrupted = None
    while closers:
        close = closers.pop(0)
        try:
            with span("close", what=getattr(close, "__qualname__", "")):
                close()
        except KeyboardInterrupt as e:  # (the first kept: a SIGTERM stays Terminated)
            interrupted = interrupted or e
    if interrupted:
        raise interrupted


def _ok(fut) -> bool:
    """Whether a done future holds a result (not an error, not cancelled)."""
    return not fut.cancelled() and fut.exception() is None


def _options_json(options: dict) -> str:
    import json

    return json.dumps(options, sort_keys=True, separators=(",", ":"))
