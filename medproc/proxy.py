"""The annotation-preserving proxy: Python workers plan, one DALI pipeline resamples.

PyTorch DataLoader workers read volumes, parse lesion annotations and compute each sample's
plan in Python (:class:`ProxyTransform`, usable inside any ``Compose``); the voxel work goes
through DALI Proxy (``nvidia.dali.plugin.pytorch.experimental.proxy.DALIServer``) to one DALI
pipeline in the main process, on the GPU. Each batch comes back in order with the images (and
labels) as tensors, and beside them every sample's output affine and its lesions mapped onto
the output grid by the same matrix as the voxels.

Where DALI Proxy cannot run (no CUDA: it calls ``torch.cuda.nvtx``), the same transform and
loader fall back to medproc's own path: workers send the arrays and plans, and the main process
runs the same DALI graph on DALI's CPU backend. Same outputs, same order.

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
    """Fallback payload: what the main process resamples (arrays + plan)."""

    __slots__ = ("array", "plan", "kind")

    def __init__(self, array, plan, kind):
        self.array, self.plan, self.kind = array, plan, kind


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
        img = sample["image"]
        plan = make_plan(img.shape, img.affine, self.spec, img.array)
        if self.augment is not None:
            plan = plan.augmented(self.augment(plan, self._generator()))
        return plan

    def __call__(self, sample: dict) -> dict:
        import torch

        from .pipeline.resample import dali_matrix

        img = sample["image"]
        lab = sample.get("label")
        full_plan = self.plan(sample)
        # ship only the input box the output touches (a crop of a big volume is a small box)
        region, plan = full_plan.input_region()
        out = {k: v for k, v in sample.items() if k not in ("image", "label", "lesions")}
        arr = np.ascontiguousarray(img.array[region])[..., None]
        if self.proxy is not None:
            kw = {"img": arr, "mat": dali_matrix(plan), "size": np.array(plan.out_shape, np.float32)}
            if lab is not None:
                kw["lab"] = np.ascontiguousarray(lab.array[region])[..., None]
            refs = self.proxy(**kw)
            refs = refs if isinstance(refs, tuple) else (refs,)
            out["image"] = refs[0]
            if lab is not None:
                out["label"] = refs[1]
        else:
            out["image"] = _Pending(arr[..., 0], plan, "image")
            if lab is not None:
                out["label"] = _Pending(np.ascontiguousarray(lab.array[region]), plan, "label")
        out["affine"] = torch.as_tensor(plan.out_affine)
        lesions = sample.get("lesions")
        out["lesions"] = plan.lesions_on_grid(lesions) if lesions is not None else []
        out["meta"] = {"source": img.meta.get("source"), "in_shape": img.shape,
                       "in_affine": img.affine, "out_shape": plan.out_shape, "region": region}
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


def _dali_proxy_usable(device: str) -> bool:
    if device != "gpu":
        return False
    try:
        import torch

        from nvidia.dali.plugin.pytorch.experimental import proxy  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


class ProxyServer:
    """One DALI pipeline serving PyTorch DataLoader workers (DALI Proxy on the GPU; medproc's
    own main-process path on DALI's CPU backend elsewhere).

    Parameters
    ----------
    spec : Spec
        Must fix the output size (``crop`` or ``shape``).
    device : {"gpu", "cpu", "auto"}
        ``"auto"`` takes the GPU when DALI Proxy can run there.
    batch_size : int
        The loader's batch size (the largest DALI batch).
    with_label : bool
        Samples carry a ``"label"`` Volume.
    augment : callable, optional
        See :class:`ProxyTransform`.
    """

    def __init__(self, spec: Spec, device: str = "auto", batch_size: int = 4, with_label: bool = False,
                 augment: Callable | None = None, num_threads: int | None = None, device_id: int = 0,
                 prefetch: int = 2, seed: int = 0):
        if spec.crop is None and spec.shape is None:
            raise ValueError("ProxyServer batches outputs into one tensor: give the spec a fixed "
                             "output size (crop=(ni, nj, nk) or shape=...)")
        if spec.interp == "cubic" or spec.antialias:
            raise ValueError("the proxy pipeline resamples with warp_affine: use interp linear or "
                             "nearest, without antialias")
        from .pipeline import Resampler, gpu_available

        if device == "auto":
            device = "gpu" if gpu_available() and _dali_proxy_usable("gpu") else "cpu"
        self.device = device
        self.spec = spec
        self.with_label = with_label
        self.uses_dali_proxy = _dali_proxy_usable(device)
        self._resampler = Resampler(device=device, batch_size=batch_size, interp=spec.interp,
                                    dtype=spec.dtype, fill=spec.fill, with_label=with_label,
                                    num_threads=num_threads, device_id=device_id,
                                    host_feed=self.uses_dali_proxy, channels_first=True,
                                    prefetch=prefetch if self.uses_dali_proxy else 1)
        self._server = None
        if self.uses_dali_proxy:
            from nvidia.dali.plugin.pytorch.experimental import proxy as dali_proxy

            if spec.intensity.active:
                raise ValueError("intensity steps in the proxy are not wired yet: apply them on "
                                 "the batch, or use medproc.resample_batch")
            self._server = dali_proxy.DALIServer(self._resampler.pipeline("warp", False))
        self.transform = ProxyTransform(spec, self._server.proxy if self._server else None,
                                        augment=augment, seed=seed)

    def __enter__(self):
        if self._server is not None:
            self._server.__enter__()
        return self

    def __exit__(self, *exc):
        if self._server is not None:
            return self._server.__exit__(*exc)
        return False

    def loader(self, dataset, batch_size: int, num_workers: int = 0, **kw):
        """A DataLoader over ``dataset`` (whose samples went through :attr:`transform`) that
        yields batches with tensors in place of the proxy references."""
        import torch.utils.data as tud

        kw.setdefault("collate_fn", collate)
        if self._server is not None:
            if num_workers > 0:
                from nvidia.dali.plugin.pytorch.experimental import proxy as dali_proxy

                return dali_proxy.DataLoader(self._server, dataset, batch_size=batch_size,
                                             num_workers=num_workers, **kw)
            base = tud.DataLoader(dataset, batch_size=batch_size, num_workers=0, **kw)
            return _Mapped(base, self._server.produce_data)
        base = tud.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **kw)
        return _Mapped(base, self._run_fallback)

    def _run_fallback(self, batch: dict) -> dict:
        import torch

        imgs = batch["image"]
        labs = batch.get("label") if self.with_label else None
        res = self._resampler.run([p.array for p in imgs], [p.plan for p in imgs],
                                  [p.array for p in labs] if labs else None, as_torch=True)
        if self.with_label:
            batch["image"] = torch.stack([r[0] for r in res])
            batch["label"] = torch.stack([r[1] for r in res])
        else:
            batch["image"] = torch.stack(list(res))
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
