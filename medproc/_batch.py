"""A planned batch (:class:`Batch`): which cases to convert, skip or fail, under which names,
checked against what the output folder already holds; and running it, with Ctrl-C handled.

Planning writes nothing. A case whose outputs exist and are recorded in the manifest is skipped
when they were made with the same options (the spec, format and NaN policy); made with other
options, the whole batch is refused before any work (``force`` redoes them), so a folder never
mixes outputs of two specs without saying so.

Running: cases go to the workers one at a time (never more queued than workers run), so a first
Ctrl-C starts no new case, lets the running ones finish and records them, then raises
``KeyboardInterrupt``; a second Ctrl-C ends the running ones at once (their rows say so) and
kills the workers. The manifest is written after every case: a rerun continues. A worker
killed (out of memory) breaks the pool: the cases running and those left fail, saying so, and a
rerun converts them.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, wait
from dataclasses import dataclass, field

from ._convert_case import _worker, annotations_path, sidecar_path
from ._trace import span
from .cases import Case
from .manifest import options_diff, write_manifest

__all__ = ["Batch", "Todo", "plan_cases", "INTERRUPTED"]

#: the error of a case a second Ctrl-C stopped (redone by the next run)
INTERRUPTED = "interrupted (Ctrl-C) before it finished; run the same command again to convert it"


@dataclass
class Todo:
    """One case to convert: its row and its output paths."""

    case: Case
    row: dict
    out_path: str
    label_path: str | None
    qc_path: str | None
    lesions: object = None

    @property
    def outputs(self) -> list[str]:
        """Every file converting the case writes."""
        out = [self.out_path, sidecar_path(self.out_path)]
        out += [p for p in (self.label_path, self.qc_path) if p]
        return out + ([annotations_path(self.out_path)] if self.lesions is not None else [])


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

    @property
    def annotations(self) -> list[tuple[str, str]]:
        """DICOM SEG / RTSTRUCT files found among the inputs (not converted)."""
        from .cases import is_annotation

        return [(p, r) for p, r in self.skipped if is_annotation(r)]

    def close(self) -> None:
        """Stop the pool this batch started and release the output folder; a Ctrl-C meanwhile
        cuts short the step it lands in, not the others (then it is raised)."""
        interrupted = False
        while self.closers:
            close = self.closers.pop(0)
            try:
                with span("close", what=getattr(close, "__qualname__", "")):
                    close()
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt

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
        write_manifest(manifest, self.kept + self.rows)
        for r in self.decided:
            if progress:
                progress(r)

        def finish(res, row, write: bool = True):
            case, status, info, err = res
            row.update(info, status=status, error=err)
            self.rows.append(row)
            with span("finish"):
                if write:  # atomically: resumable anywhere
                    write_manifest(manifest, self.kept + self.rows)
                if progress:
                    progress(row)

        try:
            with _Interrupts(on_interrupt) as stop:
                if self.executor is None:
                    self._run_here(stop, finish, on_started)
                else:
                    self._run_pool(stop, finish, on_started)
                interrupted = stop.requested
        finally:  # every row settled, whatever happened: a second Ctrl-C may have ended a
            write_manifest(manifest, self.kept + self.rows)  # finish() before its write
        if interrupted:
            raise KeyboardInterrupt
        return sorted(self.rows, key=lambda r: r["case"])

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
        if t.qc_path:
            os.makedirs(os.path.dirname(t.qc_path), exist_ok=True)
        t.row["options"] = _options_json(self.options)

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
                finish((t.case, "failed", {}, f"{t.case.source}: {INTERRUPTED}"), t.row)
                raise
            finish(res, t.row)

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
                    finish((u.case, "failed", {}, err), u.row, write=n == len(left) - 1)

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
                        err = (
                            f"{t.case.source}: its worker died or the pool broke (a worker "
                            f"killed, out of memory?) ({e}); run the same command again"
                        )
                        res = (t.case, "failed", {}, err)
                    try:  # the next case first: the worker is idle while this process does
                        # the bookkeeping (the manifest, the progress bar; on the H200 node
                        # workers waited up to 0.17 s for it)
                        if not stop.requested:
                            submit_next()
                    finally:  # (a second Ctrl-C meanwhile: this row is written all the same)
                        finish(res, t.row)
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
                    finish(ended[fut], t.row, write=False)
                    continue
                _remove_temporaries(t)  # a killed worker could not clean up after itself
                err = f"{t.case.source}: {INTERRUPTED}"
                finish((t.case, "failed", {}, err), t.row, write=False)
            raise  # (the manifest is written once, by run())


def _ok(fut) -> bool:
    """Whether a done future holds a result (not an error, not cancelled)."""
    return not fut.cancelled() and fut.exception() is None


def _remove_temporaries(t: Todo) -> None:
    """Remove the ``.<name>.*.part*`` files (``medproc.io.atomic``) of a case's outputs."""
    import glob

    for path in t.outputs:
        folder, name = os.path.split(path)
        for tmp in glob.glob(os.path.join(glob.escape(folder), f".{glob.escape(name)}.*.part*")):
            try:
                os.unlink(tmp)
            except OSError:
                pass


class _Interrupts:
    """SIGINT in the main thread: the first sets ``requested`` (and calls ``on_first``), the
    second raises ``KeyboardInterrupt``; the previous handler comes back on exit."""

    def __init__(self, on_first=None):
        self.requested, self.on_first, self.old = False, on_first, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.on_first:
            self.on_first()

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)


def _options_json(options: dict) -> str:
    import json

    return json.dumps(options, sort_keys=True, separators=(",", ":"))


def _same_file(a: str, b: str) -> bool:
    return bool(a) and bool(b) and os.path.realpath(a) == os.path.realpath(b)


def plan_cases(cases, outdir, prior, options, *, fmt, name, force, qc, table) -> Batch:
    """Decide every case (see the module doc); raises ``UsageError`` when outputs on disk were
    made with other options and ``force`` is not set."""
    import json
    import logging

    from .cases import lesions_for
    from .errors import UsageError

    todo, decided, seen, conflicts = [], [], set(), {}
    for c in cases:
        nm = base = c.name(name)
        n = 1
        # the stems a case writes: its image and its label (case "x" with a label and an image
        # named "x_label" would write one file)
        while {nm, f"{nm}_label"} & seen:
            nm = f"{base}-{c.fields['uid_hash']}" + (f"-{n}" if n > 1 else "")
            n += 1
        seen |= {nm, f"{nm}_label"} if c.label else {nm}
        out_path = os.path.join(outdir, f"{nm}.{fmt}")
        label_path = os.path.join(outdir, f"{nm}_label.{fmt}") if c.label else None
        row = {"case": nm, "source": c.source, "output": out_path, "label_output": label_path or ""}
        err = f"{c.source}: {c.error}" if c.error else ""
        if not err and os.path.abspath(out_path) == os.path.abspath(c.source):
            err = f"{c.source}: the output would overwrite the input; choose another -o"
        if err:
            decided.append({**row, "status": "failed", "error": err})
            continue
        old = prior.get(nm, {})
        recorded = (
            old.get("status") in ("ok", "skipped")
            and os.path.basename(old.get("output", "")) == os.path.basename(out_path)
            and _same_file(old.get("source", ""), c.source)
        )
        done = (
            os.path.exists(out_path)
            and (label_path is None or os.path.exists(label_path))
            and (table is None or os.path.exists(annotations_path(out_path)))
            and not (qc and not os.path.exists(os.path.join(outdir, "qc", f"{nm}.png")))
        )  # (a file a rerun adds, --labels/--annotations/--qc: the case is redone for it)
        if done and recorded:
            try:
                made_with = json.loads(old.get("options") or "null")
            except ValueError:
                made_with = None
            diff = (
                options_diff(made_with, options)
                if isinstance(made_with, dict)
                else ["the options were not recorded (an older medproc made them)"]
            )
            if diff:
                conflicts[nm] = diff
            elif not force:
                err = "output exists (use --force to redo)"
                decided.append({**old, **row, "status": "skipped", "error": err})
                continue
        if done and not recorded:
            logging.getLogger("medproc.convert").info(
                "%s: on disk but not in the manifest (an interrupted run): redone", out_path
            )
        qc_path = os.path.join(outdir, "qc", f"{nm}.png") if qc else None
        todo.append(Todo(c, row, out_path, label_path, qc_path, lesions_for(c, table)))
    # the same inputs converted by an earlier run under other names (another --format or
    # --name) with other options: refused too, or the folder would hold both unsaid; with
    # --force those rows are marked superseded (their files stay), so a rerun resumes
    here = {t.row["case"]: os.path.basename(t.out_path) for t in todo}
    sources = {os.path.realpath(t.case.source) for t in todo}
    elsewhere: dict[str, list[str]] = {}
    for nm, old in prior.items():
        if nm in conflicts or old.get("status") not in ("ok", "skipped"):
            continue
        if not old.get("source") or os.path.realpath(old["source"]) not in sources:
            continue
        if here.get(nm) == os.path.basename(old.get("output", "")):
            continue  # the same output: decided above
        if not old.get("output") or not os.path.exists(old["output"]):
            continue
        try:
            made_with = json.loads(old.get("options") or "null")
        except ValueError:
            made_with = None
        diff = options_diff(made_with, options) if isinstance(made_with, dict) else []
        if diff:
            elsewhere[nm] = diff
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
        files = ", ".join(sorted(os.path.basename(prior[n]["output"]) for n in elsewhere)[:3])
        raise UsageError(
            f"holds {len(elsewhere)} output(s) of these inputs under other names ({files}"
            f"{', ...' if len(elsewhere) > 3 else ''}) made with other options "
            f"({'; '.join(first)}). Add --force to convert them with these options as well "
            "(the manifest then marks the older ones superseded; their files stay), or choose "
            "another -o",
            outdir,
        )
    for nm in elsewhere:
        prior[nm] = {
            **prior[nm],
            "status": "superseded",
            "error": "made with other options; this input was converted again with --force",
        }
    this_run = {r["case"] for r in decided} | {t.row["case"] for t in todo}
    kept = [r for c, r in prior.items() if c not in this_run]  # earlier runs' cases stay listed
    return Batch(outdir, options, todo, decided, kept, [])
