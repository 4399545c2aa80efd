"""The annotation-preserving proxy: Python workers plan, one GPU pipeline resamples.

PyTorch DataLoader workers read volumes, parse lesion annotations and compute each sample's
plan in Python (:class:`ProxyTransform`, usable as the last step of any ``Compose``); on the GPU
the voxel work runs once per batch in the main process (on DALI's CPU backend, in the workers:
see below). Each batch
comes back in order with the images (and labels) as tensors and, beside them, every sample's
output affine and its lesions mapped onto the output grid by the same matrix as the voxels
(also as boxes in MONAI's detection format).

Two routes to the pipeline:

- ``route="engine"`` (default): a worker cuts the input box the sample's output touches
  (:meth:`~medproc.plan.Plan.input_region`) into a tensor that the DataLoader hands over through
  shared memory (no pickled voxels); the main process runs the batch through
  :class:`~medproc.pipeline.Engine` in a background thread, ``prefetch`` batches ahead of the
  training loop (host -> device copies from pinned staging, overlapped). Works with outputs of
  varying size (whole volumes), and on the CPU too: there each worker resamples its own
  samples with a DALI CPU pipeline (``resample_in``), as one pipeline in the main process
  would leave the workers' cores idle.
- ``route="dali-proxy"``: DALI Proxy (``DALIServer``), GPU only, fixed output size. Its queue
  pickles every input, so it loses to the engine route (docs/benchmarks.md).

A runnable example on the bundled sample data: ``examples/proxy_loader.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._proxy_items import Pending, _note, collate, here, shareable
from .annotations.boxes import clip_boxes, lesion_boxes
from .plan import Plan, make_plan, say_notes
from .spec import Spec

__all__ = ["ProxyServer", "ProxyTransform", "collate", "lesion_boxes"]

ROUTES = ("engine", "dali-proxy")


class ProxyTransform:
    """Plan a sample and hand its voxels over (or resample them in this worker); map its lesions.

    Takes a dict with ``"image"`` (a :class:`~medproc.Volume`), optionally ``"label"`` (a
    Volume on the image's grid) and ``"lesions"`` (:class:`~medproc.annotations.Lesions`), and
    returns a dict with ``"image"``/``"label"`` (replaced by tensors in the batch), ``"affine"``
    (4x4 float64 tensor of the output grid), ``"lesions"`` (a list of dicts from
    ``Lesions.on_grid``: voxel centre, world centre, size, inside flag; every lesion, also
    those a crop left out), ``"boxes"``, ``"boxes_world"``, ``"box_labels"`` (MONAI detection
    format, see :func:`lesion_boxes`: the ground truth of a detector, so only the lesions
    holding a voxel centre of the output grid, their voxel boxes clipped to it, see
    :func:`medproc.annotations.boxes.clip_boxes`; world boxes are the lesions' whole extent),
    ``"box_lesion"`` (the index into ``"lesions"`` of each box) and ``"meta"``. Other keys
    pass through.

    ``augment(plan, rng) -> index_map`` may add a random spatial augmentation (see
    :func:`medproc.plan.flip_map`, :func:`medproc.plan.affine_map`); the voxels and the lesions
    move by the same matrix; its ``rng`` is seeded by ``seed`` and, in DataLoader workers, by
    PyTorch's worker seed (new every epoch, reproducible under ``torch.manual_seed``).
    ``box_mode`` is the boxes' MONAI mode; ``with_label`` True requires
    a label in every sample, False ignores labels, None ships them when present.
    """

    def __init__(
        self,
        spec: Spec,
        proxy=None,
        augment: Callable | None = None,
        seed: int = 0,
        box_mode: str = "xyzxyz",
        with_label: bool | None = None,
    ):
        from .annotations.readers import BOX_MODES
        from .spec import check_args, check_types

        check_args(spec, "ProxyTransform")
        check_types("ProxyTransform", with_label=(with_label, (bool, type(None))), seed=(seed, int))
        if box_mode not in BOX_MODES:
            raise ValueError(f"ProxyTransform: box_mode must be in {BOX_MODES}, got {box_mode!r}")
        self.spec = spec
        self.with_label = with_label
        self.proxy = proxy
        self.augment = augment
        self.seed = seed
        self.box_mode = box_mode
        self.arena = None  # in a DataLoader worker: its loader's (WithArena); here none
        self._rng = None

    def _generator(self):
        # (not persistent, a worker of each epoch is a new process: PyTorch's worker seed keeps
        # it from repeating the last epoch's draws; one made in the main process, e.g. by a
        # preview, is not the workers' own: made per process)
        import os

        if self._rng is None or self._rng[0] != os.getpid():
            import torch.utils.data as tud

            info = tud.get_worker_info()
            rng = np.random.default_rng([self.seed, info.seed if info else 0])
            self._rng = (os.getpid(), rng)
        return self._rng[1]

    def plan(self, sample: dict) -> Plan:
        """The sample's plan: the spec's resample, then the random augmentation if any."""
        img = sample["image"]
        arr = img.array if self.spec.needs_array else None
        labels = self.with_label is not False and sample.get("label") is not None
        plan = make_plan(img.shape, img.affine, self.spec, arr, labels=labels)
        say_notes(plan, img.meta.get("source"))
        if self.augment is not None:
            try:
                plan = plan.augmented(self.augment(plan, self._generator()))
            except Exception as e:  # (a user's augment: say which sample, keep the rest)
                _note(e, f"in medproc's proxy, sample {img.meta.get('source') or '?'}")
                raise
        return plan

    def _ship(self, region):
        """The region into its loader's arena (pinned shared memory), else a shared tensor."""
        slot = self.arena.put(region) if self.arena is not None else None
        return slot if slot is not None else shareable(region)

    def __call__(self, sample: dict) -> dict:
        from .errors import UsageError
        from .volume import Volume

        if not isinstance(sample, dict) or "image" not in sample:
            raise UsageError(
                f"the proxy's transform takes a dict with an 'image' Volume (and optionally "
                f"'label', 'lesions'), got {type(sample).__name__}"
            )
        img = sample["image"]
        lab = sample.get("label") if self.with_label is not False else None
        for key, v in (("image", img), ("label", lab)):
            if v is not None and not isinstance(v, Volume):
                raise UsageError(
                    f"sample[{key!r}] must be a medproc.Volume (its affine tells the grid), got "
                    f"{type(v).__name__}: load it with medproc.load, or wrap an (i, j, k) array "
                    "as medproc.Volume(array, affine) (a MONAI MetaTensor is channel-first)"
                )
        if self.with_label and lab is None:
            raise ValueError(
                f"the server was made with_label=True but sample "
                f"{img.meta.get('source') or ''} has no 'label'"
            )
        if lab is not None:  # (here, in the worker, the sample is known: named)
            from .resample import check_label_grid, check_label_values

            check_label_grid(img, lab)
            check_label_values(
                lab, lab.meta.get("source") or f"the label of {img.meta.get('source')}"
            )
        # ship only the input box the output touches (a crop of a big volume is a small box)
        region, plan = self.plan(sample).input_region()
        out = {k: v for k, v in sample.items() if k not in ("image", "label", "lesions")}
        arr = img.array[region]
        labs = [lab.array[region]] if lab is not None else []
        if self.proxy is not None:
            from .pipeline.graphs import Graph
            from .pipeline.proxy_server import proxy_inputs

            graph = Graph.from_spec(self.spec, labels=len(labs), channels_first=True, mode="warp")
            refs = self.proxy(**proxy_inputs(arr, labs, plan, self.spec.intensity.active, graph))
            refs = refs if isinstance(refs, tuple) else (refs,)
            out["image"] = refs[0]
            if lab is not None:
                out["label"] = refs[1]
        elif (local := here()) is not None:  # DALI's CPU backend, in this worker
            try:
                out["image"] = local.resample(arr, labs, plan)
            except Exception as e:  # (named here, where the sample is known)
                _note(e, f"in medproc's proxy, sample {img.meta.get('source') or '?'}")
                raise
        else:
            out["image"] = Pending(self._ship(arr), [self._ship(a) for a in labs], plan)
        # small arrays travel pickled inline (a tensor per sample would cost a shared-memory
        # file each); the batch turns them into tensors
        out["affine"] = plan.out_affine
        lesions = sample.get("lesions")
        placed = plan.lesions_on_grid(lesions) if lesions is not None else []
        out["lesions"] = placed
        vox, world, labels = lesion_boxes(placed, self.box_mode)
        # a detector's ground truth: what lies on this grid (a crop cuts or leaves out
        # lesions), see clip_boxes; "lesions" keeps them all
        kept, vox = clip_boxes(vox, plan.out_shape, self.box_mode)
        out["boxes"], out["boxes_world"], out["box_labels"] = vox, world[kept], labels[kept]
        out["box_lesion"] = kept
        out["meta"] = {
            "source": img.meta.get("source"),
            "in_shape": img.shape,
            "in_affine": img.affine,
            "out_shape": plan.out_shape,
            "region": region,
            "box_mode": self.box_mode,
        }
        return out


class ProxyServer:
    """Resampling for PyTorch DataLoader workers: one pipeline serving them, or on the CPU one
    in each (see the module doc for the routes, and ``resample_in``).

    Parameters
    ----------
    spec : Spec
        The preprocessing; its intensity steps are applied. ``route="dali-proxy"`` needs a fixed
        output size (``crop`` or ``shape``).
    device : {"gpu", "cpu", "auto"}
        ``"auto"`` takes the GPU when there is one.
    batch_size : int
        The loader's batch size (the largest pipeline batch).
    with_label : bool
        Samples carry a ``"label"`` Volume.
    augment : callable, optional
        See :class:`ProxyTransform`.
    num_threads, device_id : int
        DALI CPU threads and GPU.
    prefetch : int
        Batches prepared ahead of the consumer by the server's pipeline (workers that
        resample prefetch as a DataLoader does, ``prefetch_factor``).
    seed : int
        Seed of the workers' augmentation generators.
    route : {"engine", "dali-proxy"}
        How voxels reach the pipeline.
    arena_gb : float, optional
        Each loader's transfer arena (a loader with workers has one): shared memory (pinned
        on the GPU) that its workers write input boxes into, or on the CPU their outputs
        (``resample_in``), each taking a piece of its size (at most
        workers x ``prefetch_factor`` + ``prefetch`` batches of pieces at once). Default 4 GiB,
        or an eighth of the host's memory per local rank if less (committed as used on the
        CPU; page-locked whole on the GPU: a train and a val loader pin it twice). A box
        arriving when no piece of its size is free goes through a shared-memory tensor
        instead (slower, never a wait). The pieces of batches a ``break`` drops stay taken
        while at most half the arena is; past that the loader's workers are ended there and
        the arena given back (the next epoch forks new ones), as after a failed epoch.
    resample_in : {"auto", "server", "workers"}
        Where the engine route resamples a loader's samples when it has workers: ``"server"``,
        one pipeline in this process (the GPU's way); ``"workers"`` (CPU only), each worker
        with a DALI CPU pipeline of its own, ``num_threads`` threads (default: the cores
        shared out); ``"auto"``: workers on the CPU, the server on the GPU.
    """

    def __init__(
        self,
        spec: Spec,
        device: str = "auto",
        batch_size: int = 4,
        with_label: bool = False,
        augment: Callable | None = None,
        num_threads: int | None = None,
        device_id: int | None = None,
        prefetch: int = 2,
        seed: int = 0,
        route: str = "engine",
        arena_gb: float | None = None,
        resample_in: str = "auto",
    ):
        try:
            import torch  # noqa: F401
        except ImportError:
            from .errors import TORCH_CPU_HINT

            raise ImportError(
                f"the proxy feeds PyTorch DataLoaders: pip install torch {TORCH_CPU_HINT}"
            ) from None
        from .pipeline import Engine, Graph, gpu_available
        from .pipeline.threads import check_threads
        from .spec import check_args, check_types

        check_args(spec, "ProxyServer", batch_size=batch_size, prefetch=prefetch)
        check_types("ProxyServer", with_label=(with_label, bool), seed=(seed, int))
        check_threads(num_threads, "ProxyServer:")
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        if spec.antialias:  # (rotations, and the GPU, take warp_affine, which has neither)
            raise ValueError("the proxy resamples with warp_affine: use antialias=False")
        if spec.interp == "cubic":
            raise ValueError("the proxy resamples with warp_affine: use interp linear or nearest")
        if device == "auto":
            device = "gpu" if gpu_available() else "cpu"
        if resample_in not in ("auto", "server", "workers"):
            raise ValueError(f"resample_in must be auto, server or workers, got {resample_in!r}")
        if resample_in == "workers" and (device != "cpu" or route != "engine"):
            raise ValueError(
                f"resample_in='workers' is DALI's CPU backend (device='cpu', route 'engine'); "
                f"this server has device {device!r} (device='auto' takes a GPU when there is "
                f"one) and route {route!r}"
            )
        self._in_workers = resample_in == "workers" or (
            resample_in == "auto" and device == "cpu" and route == "engine"
        )
        self._threads = num_threads
        if route == "dali-proxy":
            from .pipeline.proxy_server import dali_proxy_usable

            if spec.crop is None and spec.shape is None:
                raise ValueError(
                    "route='dali-proxy' batches outputs into one tensor: give the "
                    "spec a fixed output size (crop=(ni, nj, nk) or shape=...), or "
                    "use route='engine'"
                )
            if not dali_proxy_usable(device):
                raise RuntimeError(
                    "route='dali-proxy' needs CUDA (DALI Proxy calls torch.cuda."
                    "nvtx); use route='engine'"
                )
        self.device, self.spec, self.with_label, self.route = device, spec, with_label, route
        self._batch = batch_size
        self.prefetch = prefetch
        self.arena_gb = arena_gb
        # the engine route takes the engine's choice: warp on the GPU, the separable resize
        # for axis-aligned plans on the CPU (several times faster there than warp)
        self._graph = Graph.from_spec(
            spec,
            labels=int(with_label),
            channels_first=True,
            mode="warp" if route == "dali-proxy" else "auto",
        )
        self._engine = Engine(
            device, batch_size=batch_size, num_threads=num_threads, device_id=device_id
        )
        self._proxy = None
        if route == "dali-proxy":
            from .pipeline.proxy_server import ProxyPipeline

            self._proxy = ProxyPipeline(
                self._graph,
                spec.intensity.active,
                batch_size,
                self._engine.num_threads,
                self._engine.device_id,
                prefetch,
            )
        self.transform = ProxyTransform(
            spec,
            self._proxy.server.proxy if self._proxy else None,
            augment=augment,
            seed=seed,
            with_label=with_label,
        )

    @property
    def uses_dali_proxy(self) -> bool:
        """Whether batches go through DALI Proxy's server."""
        return self._proxy is not None

    def __enter__(self):
        if self._proxy is not None:
            self._proxy.server.__enter__()
        return self

    def __exit__(self, *exc):
        if self._proxy is not None:
            return self._proxy.server.__exit__(*exc)
        return False

    def loader(self, dataset, batch_size: int | None = None, num_workers: int = 0, **kw):
        """An iterable over batches of ``dataset`` (whose samples went through
        :attr:`transform`): images (and labels) as tensors on the device, ``(B, C, i, j, k)``
        when the output size is fixed, else lists of ``(C, i, j, k)`` tensors. ``batch_size``
        (1 to the server's; None: the server's), or a ``batch_sampler`` in ``kw`` whose
        batches are as large at most; other keywords go to torch's DataLoader."""
        import torch.utils.data as tud

        from ._proxy_stream import batches_checked

        batch_size, most = batches_checked(batch_size, self._batch, kw, num_workers)
        num_workers = int(num_workers)
        kw.setdefault("collate_fn", collate)
        if self._proxy is not None:
            if num_workers > 0:
                return self._proxy.loader(dataset, batch_size, num_workers, **kw)
            from .pipeline.proxy_server import Mapped

            base = tud.DataLoader(dataset, batch_size=batch_size, num_workers=0, **kw)
            return Mapped(base, self._proxy.server.produce_data)
        from ._proxy_arena import Arena, WithArena, arena_bytes
        from ._proxy_items import ResampleInWorkers
        from ._proxy_stream import Streamed, fork_context

        arena, local = None, num_workers > 0 and self._in_workers
        if num_workers > 0:
            kw["multiprocessing_context"] = fork_context(kw.get("multiprocessing_context"))
            kw.setdefault("persistent_workers", True)
            held = num_workers * kw.get("prefetch_factor", 2) + self.prefetch + 3
            n = 4 * held * most * (1 + int(self.with_label))  # (room for breaks)
            arena = Arena(arena_bytes(self.arena_gb), n, pin=self.device == "gpu")
            # this loader's workers write into its arena, set in each as it starts: their input
            # boxes (WithArena), or on the CPU their outputs (each worker resamples its samples,
            # see medproc._proxy_items)
            then = kw.get("worker_init_fn")
            if local:
                kw["worker_init_fn"] = ResampleInWorkers(arena, self._graph, self._threads, then)
            else:
                kw["worker_init_fn"] = WithArena(self.transform, arena, then)
        base = tud.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **kw)
        engine = None if local else self._engine
        return Streamed(base, engine, self._graph, self.prefetch, self.with_label, arena)
