"""Batch conversion: find cases, resample each with one spec, write outputs and a manifest.

Guarantees: inputs are only read; every output (and the manifest) is written to a temporary
name and renamed, so a crash or kill -9 never leaves a half-written file under its final name;
a rerun skips the cases the manifest records as done whose outputs exist and were made with the
same options, refuses when they were made with other options (``force`` redoes them), and
redoes an output on disk that the manifest does not record (a run killed between the two);
temporaries a killed run left are removed; a failing case, or an input that yields nothing, is
recorded in the manifest with its reason and the batch goes on, the files it wrote removed; a
file in the output folder that is not medproc's is never replaced (the case fails instead).
Every output has a ``<name>.json`` sidecar (medproc version, source, options, geometry).

``device="gpu"``: the workers are forked CPU workers that read and write; GPU service
processes forked after them resample for all of them (:mod:`medproc._gpu_service`).

Start-up is part of a small batch's cost: once the inputs are listed, CPU workers are forked
(Linux, see :mod:`medproc._procs`): one per core for many DICOM files (they read the headers),
else one per DICOM folder or image file (at most one per core), importing DALI while this
process reads the few headers; ``workers`` is then cut to the cases to do. One case goes to such
a worker (unless a compressed series this process decodes faster with a decode pool of its
own); otherwise one worker means no pool at all (everything in this process).
Ctrl-C finishes the running cases and records them (see :mod:`medproc._batch`); pool workers
exit when the main process dies.
"""

from __future__ import annotations

import logging
from concurrent.futures import BrokenExecutor

import numpy as np

from ._batch import INTERRUPTED, Batch, close_all
from ._case_checks import check_not_an_input, warn_label_like, warn_unmatched
from ._convert_case import (
    _init_worker,
    _warm_up,
    _WarmAfter,
    annotations_path,
    plain_warning,
    sidecar_path,
)
from ._options import check_options, output_options
from ._plan_batch import foresee, plan_cases
from .cases import (
    DEFAULT_NAME,
    Case,
    check_inputs,
    find_cases,
    read_annotation_table,
)
from .errors import MedprocError, UsageError
from .manifest import MANIFEST_FIELDS, STATUSES, prepare_outdir, read_manifest
from .spec import Spec

log = logging.getLogger(__name__)

__all__ = [
    "Batch",
    "Case",
    "find_cases",
    "prepare",
    "convert",
    "summary",
    "annotations_path",
    "sidecar_path",
    "MANIFEST_FIELDS",
    "DEFAULT_NAME",
    "INTERRUPTED",
    "plain_warning",
]


def convert(
    inputs,
    outdir: str,
    spec: Spec,
    *,
    fmt: str = "nii.gz",
    labels_dir: str | None = None,
    name: str = DEFAULT_NAME,
    device: str = "cpu",
    workers: int | str = "auto",
    force: bool = False,
    verify: bool = False,
    qc: bool = False,
    dask: str | None = None,
    annotations: str | None = None,
    progress=None,
    executor=None,
    nan: str = "error",
    on_start=None,
    on_interrupt=None,
) -> list[dict]:
    """Convert every case under ``inputs`` into ``outdir``; returns this run's manifest rows.

    Parameters
    ----------
    inputs : list of str
        Folders (scanned recursively, symlinked folders followed), image or DICOM files, CSV
        case lists (``image[,label][,name]``). A path that does not exist is a
        :class:`~medproc.errors.UsageError` before any work.
    workers : int or "auto"
        Worker processes, at most the number of cases to do (1: no pool, all in this
        process; with more allowed, one case found in a folder of DICOM files is converted by a
        forked worker that imported DALI while the headers were read, see the module doc).
        ``"auto"``: one forked CPU worker per core; with ``device="gpu"`` one forked CPU
        worker per core but the GPU service processes' (:mod:`medproc._gpu_service`);
        spawned workers (no fork, or a process that already holds DALI or CUDA): 1 on 2 cores
        or fewer or for 2 cases or fewer, else half the cores (see
        :func:`medproc._procs.auto_workers`).
    verify : bool
        Read every finished output whole (a ``.nii.gz``'s gzip checksum) and convert again
        those that cannot be; otherwise a rerun checks their sizes and headers only.
    qc : bool
        Also write ``OUTDIR/qc/<name>.png`` (see :func:`medproc.qc.qc_figure`).
    dask : str, optional
        Run the cases on dask.distributed: a scheduler address (``tcp://host:8786``), or
        ``"local"`` / ``"local:N"`` for a LocalCluster of ``N`` (default ``workers``) processes.
        Workers must have medproc installed and see the input and output paths.
    annotations : str, optional
        A lesion file (LUNA16-style CSV or medproc JSON); each case's lesions (matched by
        SeriesInstanceUID or file stem) are written to ``<output name>.annotations.json``.
    progress : callable, optional
        Called with each manifest row as its case is settled (the CLI draws its bar with it).
    nan : {"error", "zero", "keep"}
        NaN/inf voxels in float inputs: fail the case (default), set them to 0, or keep them.
    executor : concurrent.futures.Executor, optional
        A pool to run on (kept open: reuse it across calls).
    on_start : callable, optional
        Called with the number of cases once they are planned (before any is converted).
    on_interrupt : callable, optional
        Called on the first Ctrl-C (the running cases finish, no new one starts; the rows are
        written, then ``KeyboardInterrupt`` is raised; a second Ctrl-C stops them at once).
        A SIGTERM while the cases run stops them at once too and raises
        ``KeyboardInterrupt`` after writing their rows, unless the process has a SIGTERM
        handler of its own (kept, and left to act).

    Raises
    ------
    UsageError, OutputError, ReadError
        Before any case starts: bad options, a missing input, outputs on disk made with other
        options (without ``force``), an output folder that cannot be used (a file, not
        writable, or busy with another run), a malformed annotation file or case list.
    """
    with prepare(
        inputs,
        outdir,
        spec,
        fmt=fmt,
        labels_dir=labels_dir,
        name=name,
        device=device,
        workers=workers,
        force=force,
        verify=verify,
        qc=qc,
        dask=dask,
        annotations=annotations,
        executor=executor,
        nan=nan,
    ) as batch:
        if on_start:
            on_start(len(batch.decided) + len(batch.todo))
        return batch.run(progress=progress, on_interrupt=on_interrupt)


def prepare(
    inputs,
    outdir: str,
    spec: Spec,
    *,
    fmt: str = "nii.gz",
    labels_dir: str | None = None,
    name: str = DEFAULT_NAME,
    device: str = "cpu",
    workers: int | str = "auto",
    force: bool = False,
    verify: bool = False,
    qc: bool = False,
    dask: str | None = None,
    annotations: str | None = None,
    executor=None,
    nan: str = "error",
    dry_run: bool = False,
) -> Batch:
    """Check the options, scan the inputs and plan the batch (:class:`medproc._batch.Batch`,
    a context manager: ``with prepare(...) as b: b.run()``). Parameters as :func:`convert`.

    Nothing is converted. Unless ``dry_run`` (which writes nothing at all), the output folder
    is created and locked until the batch is closed, and the worker pool is started."""
    import os
    import time

    t0 = time.perf_counter()
    from ._case_checks import say_if_locked
    from ._gpu_service import GpuService
    from ._gpu_share import service_count, service_wanted
    from ._procs import (
        _cores,
        auto_workers,
        can_fork,
        check_dask,
        dask_executor,
        drop_pool,
        in_rerun_script,
        kill_pool,
        start_pool,
    )
    from ._trace import span
    from .manifest import check_outdir, check_qc_folder

    if in_rerun_script():
        raise UsageError(  # (a spawned worker re-running the user's script: say it, once)
            "convert() was called in a spawned worker process: Python re-runs your script in "
            "each worker it spawns (as it does once DALI or CUDA is loaded); put the script's "
            "code under if __name__ == '__main__':"
        )
    single = isinstance(inputs, (str, os.PathLike))
    inputs = [os.fspath(p) for p in ([inputs] if single else inputs)]
    check_options(fmt, nan, workers, device, name, spec)
    if dask:
        check_dask(dask)
    check_inputs(inputs, labels_dir)
    check_not_an_input(inputs, outdir, labels_dir)
    if annotations and not os.path.exists(annotations):  # (a mistyped path: the command's)
        raise UsageError(
            "no such file (the annotation file, --annotations); check the path", annotations
        )
    table = read_annotation_table(annotations) if annotations else None  # fails before work
    if qc:
        check_qc_folder(outdir)
    if dry_run:
        check_outdir(outdir)
        say_if_locked(outdir)
    closers = [] if dry_run else [prepare_outdir(outdir).release]
    pool, size, warm = None, 0, False
    try:
        ex = executor
        if ex is None and dask and not dry_run:
            ex, more = dask_executor(dask, workers if workers != "auto" else os.cpu_count() or 1)
            closers = more + closers
        service = None
        if service_wanted(device, ex, dask, dry_run):  # forked CPU workers + a GPU service
            cores = auto_workers(fork=True)
            n = service_count(cores)
            want = max(1, cores - n) if workers == "auto" else workers
            service, fork = GpuService(want, spec, services=n), True
        else:
            fork = can_fork(device)
            want = auto_workers(fork=fork) if workers == "auto" else workers

        def fork_pool(n):  # the GPU service starts once its workers have forked
            p = start_pool(n, _init_worker, (os.getpid(), service), "cpu" if service else device)
            closers.insert(0, p.shutdown)
            if service is not None:
                closers.insert(1, service.close)
                service.start()
            return p

        def workers_for(n):  # the CPU route's workers for n cases
            return auto_workers(n, fork=fork) if workers == "auto" else max(1, min(workers, n))

        def threads_for(n):  # DALI threads per case: the cores over the workers (1: default)
            w = workers_for(n)
            return max(1, _cores() // w) if w > 1 else None

        def on_files(files, n_cases):  # the inputs are listed, their headers not yet read
            nonlocal pool, size, warm
            from .io.dicom_scan import POOL_MIN_FILES

            reads = len(files) >= POOL_MIN_FILES  # the workers read the headers
            guess = len({os.path.dirname(f) for f in files}) + n_cases  # a series per folder
            size = want if reads or service else min(want, guess)
            if size < 1:
                return None
            if service:  # how much of its arena to commit at once: a guess (before planning)
                service.planned(guess)
            pool = fork_pool(size)  # forked: ms
            if service:
                return pool
            # the workers import DALI and build the cases' pipeline while this process reads
            # the headers, or (when they read them) once their share is read; with the DALI
            # threads the batch will give each case (below) if the guess is right
            warm_args, warm = (spec, threads_for(guess)), True
            if reads:
                return _WarmAfter(pool, size, warm_args)
            for _ in range(size):
                pool.submit(_warm_up, *warm_args)
            return pool

        early = ex is None and want > 1 and fork and not dry_run
        with span("find_cases"):
            try:
                cases, skipped = find_cases(
                    inputs,
                    labels_dir,
                    executor=ex,
                    exclude=[outdir],
                    on_files=on_files if early else None,
                )
            except BrokenExecutor:  # a worker killed while reading headers (OOM killer...)
                raise MedprocError(
                    "a worker process died while the DICOM headers were read (killed: out "
                    "of memory?); nothing was converted: run the same command again",
                    outdir,
                ) from None
        prior = read_manifest(os.path.join(outdir, "manifest.csv"), repair=not dry_run)
        opts = output_options(spec, fmt, nan)
        warn_unmatched(cases, table)
        warn_label_like(cases)
        batch = plan_cases(
            cases,
            outdir,
            prior,
            opts,
            fmt=fmt,
            name=name,
            force=force,
            qc=qc,
            table=table,
            verify=verify,
        )
        batch.skipped, batch.spec, batch.device, batch.nan = skipped, spec, device, nan
        batch.dry_run, batch.closers = dry_run, closers
        if dry_run:  # what the headers already show the run would refuse
            foresee(batch, spec)
        n = len(batch.todo)
        batch.workers = max(1, min(want, n)) if service else workers_for(n)
        if service is not None:  # its pool (of `want` workers), any count (never a dry run)
            service.planned(n)
            pool = pool or fork_pool(want)
            batch.executor = pool
            batch.threads = max(1, _cores() // batch.workers)
        elif ex is not None:  # a given pool or dask: as many cases in flight as it runs
            size = getattr(ex, "medproc_workers", None)  # dask: the cluster's workers
            if size is None:
                size = workers if workers != "auto" else getattr(ex, "_max_workers", None) or n
            batch.workers = max(1, min(size, n))
            batch.executor, batch.threads = ex, 1 if device == "cpu" else None
        elif batch.workers > 1 and not dry_run:
            if pool is not None and size < batch.workers:  # more cases than folders
                closers.remove(pool.shutdown)
                drop_pool(pool, warm)
                pool = None
            if pool is None:  # only now that we know it is worth it
                pool = fork_pool(batch.workers)
            batch.executor = pool
            batch.threads = threads_for(n) if device == "cpu" else None
        elif pool is not None and warm and _in_worker(batch.todo):
            batch.executor = pool  # one case, to a worker that imported DALI meanwhile
        elif pool is not None:  # one worker is enough: no pool
            closers.remove(pool.shutdown)
            drop_pool(pool, warm)
        how = getattr(batch.executor, "medproc_start_method", None)
        how = "in this process" if batch.executor is None else f"{how or 'given'} pool"
        if service is not None:
            how += f", {service.n_services} GPU service process(es)"
        log.info(
            "%d case(s) to convert, %d worker(s), %s (inputs listed, headers read and cases "
            "planned in %.2f s)",
            n,
            batch.workers,
            how,
            time.perf_counter() - t0,
        )
        return batch
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt) and pool is not None:  # (its queued scan tasks:
            closers.insert(0, lambda: kill_pool(pool))  # not run)
        try:
            close_all(closers)
        except KeyboardInterrupt:  # (a second Ctrl-C while closing: the first is raised)
            pass
        raise


def _in_worker(todo) -> bool:
    """Whether the one case to do is converted in a pool worker: yes, unless it is a DICOM
    series with enough compressed files for a decode pool (which only this process can fork:
    workers are daemons)."""
    if len(todo) != 1:
        return False
    series = todo[0].case.dicom
    packed = {f.path for f in series.frames if f.fast is None} if series is not None else ()
    if not packed:
        return True
    from .io.dicom_read import decode_workers

    return decode_workers(len(packed)) == 1


def summary(rows: list[dict]) -> dict:
    """Counts of a run's manifest rows by status (``not_started`` for "not started"), and the
    mean seconds per converted case."""
    counts = {s.replace(" ", "_"): sum(r["status"] == s for r in rows) for s in STATUSES}
    counts["total"] = len(rows)
    secs = [float(r["seconds"]) for r in rows if r["status"] == "ok" and r.get("seconds")]
    counts["mean_seconds"] = float(np.mean(secs)) if secs else 0.0
    return counts
