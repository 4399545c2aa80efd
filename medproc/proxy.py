"""The annotation-preserving proxy: Python workers plan, one DALI pipeline resamples.

PyTorch DataLoader workers read volumes, parse lesion annotations and compute each sample's
plan in Python (:class:`ProxyTransform`, usable inside any ``Compose``); the voxel work goes
through DALI Proxy (``nvidia.dali.plugin.pytorch.experimental.proxy.DALIServer``) to one DALI
pipeline in the main process, on the GPU. Each batch comes back in order with the images (and
labels) as tensors, and beside them every sample's output affine and its lesions mapped onto
the output grid by the same matrix as the voxels.

Where DALI Proxy cannot run (no CUDA: it calls ``torch.cuda.nvtx``), the same transform and
loader fall back to the engine: workers send the voxels and plans, and the main process runs
the same DALI graph on DALI's CPU backend. Same outputs, same order.

DALI Proxy returns each batch as one tensor, so the spec must give a fixed output size
(``crop=`` or ``shape=``).

Example
-------
>>> spec = medproc.Spec(spacing=1.5, orientation="RAS", crop=(96, 96, 96))  # doctest: +SKIP
>>> with ProxyServer(spec, device="gpu", batch_size=4) as server:            # doctest: +SKIP
...     ds = MyDataset(transform=Compose([read_case, parse_lesions, server.transform]))
...     for batch in server.loader(ds, batch_size=4, num_workers=4):
...         batch["image"], batch["affine"], batch["lesions"]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .plan import Plan, make_plan
from .spec import Spec

__all__ = ["ProxyServer", "ProxyTransform", "collate"]


class _Pending:
    """Fallback payload: what the main process resamples (voxels + plan)."""

    __slots__ = ("array", "labels", "plan")

    def __init__(self, array, labels, plan):
        self.array, self.labels, self.plan = array, labels, plan


class ProxyTransform:
    """Plan a sample and hand its voxels to the server; map its lesions. Picklable.

    Takes a dict with ``"image"`` (a :class:`~medproc.Volume`), optionally ``"label"`` (a
    Volume on the image's grid) and ``"lesions"`` (:class:`~medproc.annotations.Lesions`), and
    returns a dict with ``"image"``/``"label"`` (DALI proxy references, replaced by tensors in
    the batch), ``"affine"`` (4x4 float64 tensor of the output grid), ``"lesions"`` (a list of
    dicts from ``Lesions.on_grid``: voxel centre, world centre, size, inside flag) and
    ``"meta"``. Other keys pass through.

    ``augment(plan, rng) -> index_map`` may add a random spatial augmentation (see
    :func:`medproc.plan.flip_map`, :func:`medproc.plan.affine_map`); the voxels and the lesions
    move by the same matrix.
    """

    def __init__(self, spec: Spec, proxy=None, augment: Callable | None = None, seed: int = 0):
        self.spec = spec
        self.proxy = proxy
        self.augment = augment
        self.seed = seed
        self._rng = None

    def _generator(self):
        if self._rng is None:
            import torch.utils.data as tud

            info = tud.get_worker_info()
            self._rng = np.random.default_rng([self.seed, info.id if info else 0])
        return self._rng

    def plan(self, sample: dict) -> Plan:
        """The sample's plan: the spec's resample, then the random augmentation if any."""
        img = sample["image"]
        plan = make_plan(img.shape, img.affine, self.spec, img.array)
        if self.augment is not None:
            plan = plan.augmented(self.augment(plan, self._generator()))
        return plan

    def __call__(self, sample: dict) -> dict:
        import torch

        img = sample["image"]
        lab = sample.get("label")
        # ship only the input box the output touches (a crop of a big volume is a small box)
        region, plan = self.plan(sample).input_region()
        out = {k: v for k, v in sample.items() if k not in ("image", "label", "lesions")}
        arr = img.array[region]
        labs = [lab.array[region]] if lab is not None else []
        if self.proxy is not None:
            from .pipeline.proxy_server import proxy_inputs

            refs = self.proxy(**proxy_inputs(arr, labs, plan, self.spec.intensity.active))
            refs = refs if isinstance(refs, tuple) else (refs,)
            out["image"] = refs[0]
            if lab is not None:
                out["label"] = refs[1]
        else:
            out["image"] = _Pending(np.array(arr), [np.array(a) for a in labs], plan)
        out["affine"] = torch.as_tensor(plan.out_affine)
        lesions = sample.get("lesions")
        out["lesions"] = plan.lesions_on_grid(lesions) if lesions is not None else []
        out["meta"] = {
            "source": img.meta.get("source"),
            "in_shape": img.shape,
            "in_affine": img.affine,
            "out_shape": plan.out_shape,
            "region": region,
        }
        return out


def collate(samples: list[dict]) -> dict:
    """Batch dicts: proxy references and tensors via torch's default_collate (DALI Proxy
    registers its references there), lesions and meta as per-sample lists."""
    from torch.utils.data import default_collate

    out = {}
    for key in samples[0]:
        vals = [s[key] for s in samples]
        if key in ("lesions", "meta") or isinstance(vals[0], _Pending):
            out[key] = vals
        else:
            out[key] = default_collate(vals)
    return out


class ProxyServer:
    """One DALI pipeline serving PyTorch DataLoader workers (DALI Proxy on the GPU; the
    engine, in the main process, on DALI's CPU backend elsewhere).

    Parameters
    ----------
    spec : Spec
        Must fix the output size (``crop`` or ``shape``); its intensity steps are applied.
    device : {"gpu", "cpu", "auto"}
        ``"auto"`` takes the GPU when DALI Proxy can run there.
    batch_size : int
        The loader's batch size (the largest DALI batch).
    with_label : bool
        Samples carry a ``"label"`` Volume.
    augment : callable, optional
        See :class:`ProxyTransform`.
    num_threads, device_id, prefetch : int
        DALI settings (threads, GPU, batches in flight).
    seed : int
        Seed of the workers' augmentation generators.
    """

    def __init__(
        self,
        spec: Spec,
        device: str = "auto",
        batch_size: int = 4,
        with_label: bool = False,
        augment: Callable | None = None,
        num_threads: int | None = None,
        device_id: int = 0,
        prefetch: int = 2,
        seed: int = 0,
    ):
        if spec.crop is None and spec.shape is None:
            raise ValueError(
                "ProxyServer batches outputs into one tensor: give the spec a fixed "
                "output size (crop=(ni, nj, nk) or shape=...)"
            )
        if spec.interp == "cubic" or spec.antialias:
            raise ValueError(
                "the proxy pipeline resamples with warp_affine: use interp linear or "
                "nearest, without antialias"
            )
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ImportError(
                "the proxy feeds PyTorch DataLoaders: pip install 'medproc[torch]'"
            ) from None
        from .pipeline import Engine, Graph, gpu_available
        from .pipeline.proxy_server import ProxyPipeline, dali_proxy_usable

        if device == "auto":
            device = "gpu" if gpu_available() and dali_proxy_usable("gpu") else "cpu"
        self.device = device
        self.spec = spec
        self.with_label = with_label
        self.uses_dali_proxy = dali_proxy_usable(device)
        self._graph = Graph.from_spec(
            spec, labels=int(with_label), channels_first=True, mode="warp"
        )
        self._engine = Engine(
            device, batch_size=batch_size, num_threads=num_threads, device_id=device_id
        )
        self._proxy = None
        if self.uses_dali_proxy:
            self._proxy = ProxyPipeline(
                self._graph,
                spec.intensity.active,
                batch_size,
                self._engine.num_threads,
                device_id,
                prefetch,
            )
        self.transform = ProxyTransform(
            spec, self._proxy.server.proxy if self._proxy else None, augment=augment, seed=seed
        )

    def __enter__(self):
        if self._proxy is not None:
            self._proxy.server.__enter__()
        return self

    def __exit__(self, *exc):
        if self._proxy is not None:
            return self._proxy.server.__exit__(*exc)
        return False

    def loader(self, dataset, batch_size: int, num_workers: int = 0, **kw):
        """A DataLoader over ``dataset`` (whose samples went through :attr:`transform`) that
        yields batches with tensors in place of the proxy references."""
        import torch.utils.data as tud

        kw.setdefault("collate_fn", collate)
        if self._proxy is not None:
            if num_workers > 0:
                return self._proxy.loader(dataset, batch_size, num_workers, **kw)
            base = tud.DataLoader(dataset, batch_size=batch_size, num_workers=0, **kw)
            return _Mapped(base, self._proxy.server.produce_data)
        base = tud.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **kw)
        return _Mapped(base, self._run_fallback)

    def _run_fallback(self, batch: dict) -> dict:
        import torch

        from .pipeline import Job

        jobs = [Job(p.array, p.plan, p.labels) for p in batch["image"]]
        res = self._engine.run(jobs, self._graph, as_torch=True)
        batch["image"] = torch.stack([r[0] for r in res])
        if self.with_label:
            batch["label"] = torch.stack([r[1] for r in res])
        return batch


class _Mapped:
    """Iterate a DataLoader, finishing each batch in the main process."""

    def __init__(self, loader, fn):
        self.loader, self.fn = loader, fn

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            yield self.fn(batch)
