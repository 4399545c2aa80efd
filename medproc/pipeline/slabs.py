"""Big volumes as several samples, so that DALI's CPU backend uses its threads on them.

Private to :mod:`medproc.pipeline`. DALI's CPU operators run the samples of a batch in parallel
but each sample on one thread: a batch of one 512 x 512 x 143 CT resampled to 1.5 mm took
0.20-0.25 s on 2 cores whether the pipeline had 1 or 2 threads. So on the CPU the engine cuts
each big job into slabs of output slices (:func:`split`), each a job of its own (the slab's
plan, :meth:`~medproc.plan.Plan.output_slab`, on the part of the input it reads plus the
interpolation's reach, :meth:`~medproc.plan.Plan.input_region`), and :class:`Joiner` puts the
outputs back together, in the memory layout an uncut output has.

How a volume is cut depends on its plan alone (its output shape, and which slabs would lie
wholly beyond the input), never on the thread count or the batch: a volume's output is the
same whatever ``-j``, ``num_threads`` or batch it ran in. A slab samples the same input
points as the uncut job, computed from a shifted origin, so an interpolated value may differ
from an uncut run's in float32's last bits (~1e-5 of the local contrast); nearest-neighbour
ties are broken half up either way (:data:`~medproc.pipeline.graphs.NN_TIE`).
"""

from __future__ import annotations

import math

import numpy as np

from ._dtypes import _is_torch

__all__ = ["split", "Joiner", "slab_count", "MIN_SLICES", "MIN_VOXELS", "MAX_SLABS"]

#: output slices per slab, at least: thinner slabs cost DALI's resize more per voxel (a
#: 512 x 512 x 143 CT -> 1.5 mm, 239 x 239 x 119, on one thread: 0.20 s whole or in 2-3 slabs
#: of 40-60 slices, 0.28-0.32 s in 4-6 slabs of 20-30). Seen with gdb: DALI's CPU resize takes
#: each sample's scratch from malloc in blocks of 32 MiB + 4 bytes, above glibc's largest mmap
#: threshold, so each is a fresh mapping whose pages fault on every run (~28,000 faults per run
#: at 4-6 slabs, a few at 1-3 or 8); where that happens depends on the slab's size.
#: Measured by ``bench/slabs.py`` (docs/benchmarks.md)
MIN_SLICES = 40
#: output voxels per slab, at least (~100^3): below that a sample costs more than it saves
MIN_VOXELS = 1 << 20
#: slabs per volume, at most (a pipeline takes ``batch_size * MAX_SLABS`` samples)
MAX_SLABS = 16


def slab_count(out_shape) -> int:
    """How many slabs a volume with this output shape runs as (1: not cut)."""
    return max(
        1, min(MAX_SLABS, int(out_shape[2]) // MIN_SLICES, math.prod(out_shape) // MIN_VOXELS)
    )


def _margin(graph, plan) -> int:
    """Input voxels kept around a slab's box: linear and nearest read 1 beyond it, cubic 2 (one
    more for safety); a resize's region reaches half an output voxel (``0.5 * scale`` input
    voxels) past the sample points, and with it inside the slab's input the batch keeps its
    graph (``Graph.mode_for``); antialiasing low-passes over ~2 x the downsampling factor."""
    scale = float(np.linalg.norm(plan.matrix[:3, :3], axis=0).max())
    margin = (3 if graph.interp == "cubic" else 2) + math.ceil(0.5 * scale)
    if graph.antialias:
        margin += math.ceil(2 * max(1.0, scale))
    return margin


def split(jobs: list, graph) -> tuple[list, list | None]:
    """``jobs`` with the big ones cut into slabs, and how to put them back (``None``: nothing
    was cut). Each part is ``(first, count, bounds)``: the original job's slabs are ``count``
    consecutive jobs from ``first``, making its output slices ``bounds[s]:bounds[s + 1]``."""
    from .engine import Job

    out, parts = [], []
    for j in jobs:
        nk, count = int(j.plan.out_shape[2]), slab_count(j.plan.out_shape)
        if count == 1:  # (most jobs: patches, small volumes)
            parts.append((len(out), 1, (0, nk)))
            out.append(j)
            continue
        bounds = _touching(j.plan, np.linspace(0, nk, count + 1).round().astype(int), graph)
        count = len(bounds) - 1
        parts.append((len(out), count, tuple(int(b) for b in bounds)))
        margin = _margin(graph, j.plan)
        for k0, k1 in zip(bounds[:-1], bounds[1:]):
            region, plan = j.plan.output_slab(int(k0), int(k1)).input_region(margin)
            out.append(Job(j.image[region], plan, tuple(lb[region] for lb in j.labels)))
    if len(out) == len(jobs):
        return jobs, None
    return out, parts


def _touching(plan, bounds: np.ndarray, graph) -> list[int]:
    """``bounds`` less those that would make a slab lying wholly beyond the input along k (a
    volume centre-cropped far past itself): it joins its neighbour towards the input, as DALI's
    resize crashes on a region beyond its input (:func:`.graphs.misses_input`). Plans the warp
    graph takes (:meth:`.graphs.Graph.mode_for`: a fill value, nearest neighbour past the
    input) keep every slab."""
    from .graphs import misses_input

    b = [int(x) for x in bounds]
    if not plan.axis_aligned or misses_input(plan) or graph.mode_for([plan], "cpu") == "warp":
        return b
    while len(b) > 2 and misses_input(plan.output_slab(b[0], b[1])):
        del b[1]
    while len(b) > 2 and misses_input(plan.output_slab(b[-2], b[-1])):
        del b[-2]
    return b


class Joiner:
    """Puts a batch's slabs back together. Numpy outputs of ``(i, j, k[, C])`` graphs are copied
    by the runner straight into their place in one array per output (:attr:`sink` is the
    runner's ``into``: no second copy, and no more memory than an uncut output takes); others
    (torch, channels-first) are joined after (:func:`np.concatenate`; the engine does not cut
    channels-first outputs that go into a caller's arrays)."""

    def __init__(self, parts: list, channels_first: bool, as_torch: bool, into=None):
        self.parts, self.channels_first, self.into = parts, channels_first, into
        #: the ``into`` to give the runner (None: the outputs are joined after)
        self.sink = self._sink if not (channels_first or as_torch) else None
        self._where = [(n, s) for n, (_, count, _) in enumerate(parts) for s in range(count)]
        self._calls = 0
        self._wholes: dict = {}  # (output column, job) -> DALI-layout array of the whole job

    def _sink(self, shape: tuple, dtype):
        """The runner asks output column by column, sample by sample (``runner._into``)."""
        column, sample = divmod(self._calls, len(self._where))
        self._calls += 1
        job, s = self._where[sample]
        _, count, bounds = self.parts[job]
        if count == 1:
            return None if self.into is None else self.into(shape, dtype)
        if s == 0:
            from .hostmem import destination

            whole = (bounds[-1], *shape[1:])
            self._wholes[column, job] = (
                np.empty(whole, dtype)
                if self.into is None
                else destination(self.into, whole, dtype)
            )
        return self._wholes[column, job][bounds[s] : bounds[s + 1]]

    def join(self, results: list[tuple]) -> list[tuple]:
        """The outputs of :func:`split`'s jobs as the outputs of the jobs it was given."""
        from .runner import _from_dhwc

        out = []
        for n, (first, count, _) in enumerate(self.parts):
            rows = results[first : first + count]
            if count == 1:
                out.append(rows[0])
            elif self.sink is not None:
                out.append(tuple(_from_dhwc(self._wholes[c, n]) for c in range(len(rows[0]))))
            else:
                cols = zip(*rows)
                out.append(tuple(_stacked(list(p), self.channels_first) for p in cols))
        return out


def _stacked(pieces: list, channels_first: bool):
    """Slabs along k as one array: ``(C, i, j, k)`` contiguous for channels-first outputs, else
    ``(i, j, k[, C])`` with i fastest in memory, as an uncut output is (a view of DALI's
    ``(k, j, i, C)`` layout)."""
    from .graphs import to_dhwc
    from .runner import _from_dhwc

    as_torch = _is_torch(pieces[0])
    arrays = [p.numpy() if as_torch else np.asarray(p) for p in pieces]
    if channels_first:  # (C, i, j, k): joined along the last axis
        whole = np.concatenate(arrays, axis=3)
    else:  # joined in DALI's (k, j, i, C) and viewed back
        whole = _from_dhwc(np.concatenate([to_dhwc(a, contiguous=False) for a in arrays]))
    if as_torch:
        import torch

        return torch.from_numpy(whole)
    return whole
