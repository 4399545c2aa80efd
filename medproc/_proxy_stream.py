"""The proxy's loader in the main process: :class:`Streamed` takes a DataLoader's batches and
finishes them with the engine in its background thread (the workers' input boxes, in pieces of
the loader's arena, :mod:`medproc._proxy_arena`), or, when the workers resampled (DALI's CPU
backend, :mod:`medproc._proxy_items`), copies their outputs out of the arena; every piece is
given back once read."""

from __future__ import annotations

import os

from ._proxy_arena import Slot

__all__ = ["Streamed", "fork_context", "batches_checked"]


class Streamed:
    """A DataLoader whose batches are finished by the engine in its background thread (or,
    ``engine`` None, were resampled by its workers); its workers' pieces (input boxes, or
    outputs) are in ``arena`` (None: no workers)."""

    def __init__(self, loader, engine, graph, ahead: int, with_label: bool, arena=None):
        self.loader, self.engine, self.graph = loader, engine, graph
        self.ahead, self.with_label, self.arena = ahead, with_label, arena
        self._live = 0  # epochs being iterated (a loader without persistent workers may
        # have two at once)

    def _tensor(self, x):
        return self.arena.tensor(x) if isinstance(x, Slot) else x

    def _release(self, batch) -> None:
        for p in batch["image"]:
            for x in (p.array, *p.labels):
                if isinstance(x, Slot):
                    self.arena.release(x)

    def __len__(self):
        return len(self.loader)

    def _items(self, held: list):
        """The engine's items; ``held`` gets this epoch's DataLoader iterator."""
        from ._proxy_items import fetch_boxes
        from .pipeline import Job

        held.append(iter(self.loader))
        while True:
            try:  # (in the engine's thread: an inline loader's dataset runs here)
                batch = fetch_boxes(held[0])
            except StopIteration:
                return
            jobs = [
                Job(self._tensor(p.array), p.plan, tuple(self._tensor(x) for x in p.labels))
                for p in batch["image"]
            ]
            yield jobs, self.graph, batch

    def _resampled(self, held: list):
        """``(results, batch)`` of a loader whose workers resampled their samples (``engine``
        None, see :mod:`medproc._proxy_items`): each output copied out of its arena piece,
        which is given back."""
        from ._proxy_items import Finished

        held.append(iter(self.loader))
        for batch in held[0]:
            if not all(isinstance(p, Finished) for p in batch["image"]):
                raise TypeError(
                    "this loader's workers resample on the CPU, but a sample reached it "
                    "unresampled (made by a ProxyTransform outside the loader's workers, e.g. "
                    "cached in the main process): call the transform in the dataset's "
                    "__getitem__, or make the server with resample_in='server'"
                )
            yield [[self._copied(x) for x in p.outputs] for p in batch["image"]], batch

    def _copied(self, x):
        """An output as a tensor of its own: out of its arena piece (then given back), or a
        copy of a shared-memory tensor (a worker's fallback: no file descriptor kept)."""
        if isinstance(x, Slot):
            return self.arena.take_out(x)
        return x.clone() if x.is_shared() else x

    def __iter__(self):
        from .pipeline import stacked

        held, pid, given = [], os.getpid(), 0
        if self.engine is None:
            stream = self._resampled(held)
        else:
            stream = self.engine.stream(self._items(held), as_torch=True, ahead=self.ahead)
        whole = failed = False
        self._live += 1
        try:
            for res, batch in stream:
                if self.arena is not None and self.engine is not None:
                    self._release(batch)  # the engine has copied them: the workers may refill
                cols = list(zip(*res))
                for key, col in zip(("image", "label"), cols[: 1 + self.with_label]):
                    same = all(t.shape == col[0].shape for t in col)
                    batch[key] = stacked(col) if same else list(col)
                given += 1
                yield batch
            whole = True
        except Exception as e:
            failed = True
            bad = getattr(e, "batch_extra", None)  # (the batch the engine refused, if it was)
            if isinstance(bad, dict) and isinstance(bad.get("meta"), list):
                from ._proxy_items import _note

                names = [str((m or {}).get("source") or "?") for m in bad["meta"]]
                _note(e, f"in medproc's proxy, a batch of samples {', '.join(names)}")
            raise
        finally:
            self._live -= 1
            if whole and self._live == 0 and self.arena is not None:
                self.arena.free_all()  # (what is still taken was dropped unread)
            if not whole and given < _length(self) and os.getpid() == pid:  # failed, left early
                stream.close()  # (the engine's thread ends: it takes no more batches)
                self._end_workers(held[0] if held else None, failed)

    def _end_workers(self, it, failed: bool) -> None:
        """After an epoch that failed or was left early (``break``): end its workers now, in
        this process, and give their pieces back. Left to the garbage collector, a failed
        epoch's persistent workers were collected in a later loader's forked worker, which
        printed "AssertionError: can only test a child process". The pieces of batches
        prefetched and dropped stay taken: persistent workers left by a ``break`` are kept
        (a new fork each time cost a validation loop ~0.2 s per pass) until that has taken
        half the arena; then they are ended and the arena given back whole."""
        if it is None or not hasattr(it, "_shutdown_workers"):
            return  # (no workers)
        persistent = getattr(self.loader, "_iterator", None) is it
        if persistent and not failed and (self.arena is None or self.arena.roomy()):
            return
        it._shutdown_workers()  # (joined: none writes into the arena any more)
        if persistent:  # the next epoch forks new ones
            self.loader._iterator = None
        if self.arena is not None and self._live == 0:  # (no other epoch writes into it)
            self.arena.reset()


def _length(loader) -> float:
    """``len(loader)``; infinite for an iterable dataset without a length."""
    try:
        return len(loader)
    except TypeError:
        return float("inf")


def fork_context(ctx):
    """The workers' start method: fork, which the transfer arena needs (the workers inherit
    its shared memory). Unset: fork, whatever Python's default is (forkserver from Python
    3.14); another one given: an error naming it."""
    import multiprocessing as mp

    method = ctx if isinstance(ctx, str) or ctx is None else ctx.get_start_method()
    if method in (None, "fork"):
        return mp.get_context("fork")
    raise ValueError(
        f"multiprocessing_context={method!r}: the proxy's workers must be forked (they share "
        "the transfer arena's memory with this process); leave multiprocessing_context unset, "
        "or give 'fork'"
    )


def batches_checked(batch_size, most: int, kw: dict, num_workers=0) -> tuple[int, int]:
    """A proxy loader's batches against its server's batch size ``most`` (DALI's pipelines
    take at most their batch size): ``(the batch_size for torch's DataLoader, the largest
    batch)``; ``batch_size=None`` is the server's. A ``batch_sampler`` in ``kw`` (then
    ``batch_size`` is left at None or 1, as torch's DataLoader wants) is wrapped so that a
    larger batch it draws is refused by name; ``num_workers`` is checked too."""
    from .errors import UsageError
    from .spec import whole_number as whole  # (numpy integers too, as ProxyServer takes them)

    if not whole(num_workers) or num_workers < 0:  # (1.5 and "2" were bare TypeErrors)
        raise UsageError(f"loader: num_workers must be a whole number >= 0, got {num_workers!r}")
    sampler = kw.get("batch_sampler")
    if sampler is None:
        batch_size = most if batch_size is None else batch_size
        if not whole(batch_size) or not 1 <= batch_size <= most:
            raise UsageError(
                f"loader batch_size must be a whole number from 1 to the server's batch_size "
                f"{most}, got {batch_size!r} (a larger one: make the ProxyServer with that "
                "batch_size)"
            )
        return int(batch_size), int(batch_size)
    if batch_size not in (None, 1) or isinstance(batch_size, bool):
        raise UsageError(
            f"batch_size={batch_size!r} and a batch_sampler: the batch_sampler's batches are "
            "the loader's batches; leave batch_size out (or 1)"
        )
    size = getattr(sampler, "batch_size", None)  # (torch's BatchSampler says it)
    if isinstance(size, int) and not 1 <= size <= most:
        raise UsageError(
            f"the batch_sampler's batch_size {size} is more than the server's batch_size "
            f"{most} (make the ProxyServer with batch_size={size})"
        )
    kw["batch_sampler"] = _AtMost(sampler, most)
    return 1, most


class _AtMost:
    """A user's batch_sampler whose batches are checked as they are drawn (in this process)."""

    def __init__(self, sampler, most: int):
        self.sampler, self.most = sampler, most

    def __len__(self):
        return len(self.sampler)

    def __getattr__(self, name):  # (the user's sampler as it was: set_epoch, batch_size...)
        return getattr(self.sampler, name)

    def __iter__(self):
        for b in self.sampler:
            b = list(b)
            if not 1 <= len(b) <= self.most:
                raise ValueError(
                    f"the batch_sampler drew a batch of {len(b)} samples; the server takes "
                    f"1 to {self.most} (its batch_size)"
                )
            yield b
