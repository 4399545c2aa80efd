"""DALI Proxy's server side: one DALI pipeline in the main process that DataLoader workers feed
through ``nvidia.dali.plugin.pytorch.experimental.proxy`` (GPU only: DALI Proxy calls
``torch.cuda.nvtx``). The connector is :mod:`medproc.proxy`."""

from __future__ import annotations

import numpy as np

from ..plan import Plan
from .graphs import Graph, build_resample, plan_inputs, to_dhwc

__all__ = ["dali_proxy_usable", "ProxyPipeline", "proxy_inputs", "Mapped"]


def proxy_inputs(image: np.ndarray, labels, plan: Plan, intensity: bool, graph: Graph) -> dict:
    """The named pipeline inputs of one sample (computed in a worker, passed to the server's
    ``proxy``): voxels in DALI's layout and the plan's arguments exactly as the engine feeds
    them (:func:`~medproc.pipeline.graphs.plan_inputs`: warp matrices, size, intensity)."""
    from ._dtypes import _astype, _dtype_name, _feed_dtype

    fed = _feed_dtype(image, False, graph.fill)  # (the engine's rule)
    kw = {"img": to_dhwc(image if _dtype_name(image) == fed else _astype(image, fed))}
    for n, lb in enumerate(labels):
        kw[f"lab{n}"] = to_dhwc(lb)
    for name, vals in plan_inputs([plan], "warp", intensity, graph).items():
        kw[name] = vals[0]
    return kw


def dali_proxy_usable(device: str) -> bool:
    """Whether DALI Proxy can run here on ``device`` (it needs CUDA)."""
    if device != "gpu":
        return False
    try:
        import torch
        from nvidia.dali.plugin.pytorch.experimental import proxy  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


class ProxyPipeline:
    """A DALI Proxy server over the engine's warp graph (host-fed, outputs ``(C, i, j, k)``).

    Parameters
    ----------
    graph : Graph
        Interpolation, dtype, fill, labels (``channels_first`` and ``mode`` are set here).
    intensity : bool
        Whether samples carry an intensity step.
    batch_size, num_threads, device_id, prefetch : int
        DALI pipeline settings.
    """

    def __init__(
        self,
        graph: Graph,
        intensity: bool,
        batch_size: int,
        num_threads: int,
        device_id: int = 0,
        prefetch: int = 2,
    ):
        from dataclasses import replace

        from nvidia.dali.plugin.pytorch.experimental import proxy as dali_proxy

        self.graph = replace(graph, channels_first=True, mode="warp")
        self.intensity = intensity
        pipe = build_resample(
            self.graph,
            "warp",
            intensity,
            "gpu",
            batch_size,
            num_threads,
            device_id,
            host_feed=True,
            prefetch=prefetch,
        )
        self.server = dali_proxy.DALIServer(pipe)
        self._dali_proxy = dali_proxy

    def loader(self, dataset, batch_size: int, num_workers: int, **kw):
        """DALI Proxy's DataLoader over ``dataset``."""
        return self._dali_proxy.DataLoader(
            self.server, dataset, batch_size=batch_size, num_workers=num_workers, **kw
        )


class Mapped:
    """Iterate a DataLoader, finishing each batch in the main process (DALI Proxy's
    ``produce_data`` when the loader has no workers)."""

    def __init__(self, loader, fn):
        self.loader, self.fn = loader, fn

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            yield self.fn(batch)
