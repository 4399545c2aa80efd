"""The proxy layer: DataLoader workers plan and map lesions, one DALI pipeline resamples.

CPU (CI): medproc's fallback path (DALI CPU backend in the main process). GPU (-m gpu, H200):
DALI Proxy's DALIServer with a multi-worker DataLoader. Same assertions on both.
"""

import numpy as np
import pytest
import torch

import medproc
from medproc.plan import affine_map, flip_map
from medproc.proxy import ProxyServer
from test_annotations import oblique_case

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


class CaseDataset(torch.utils.data.Dataset):
    """What a user's dataset looks like: Python reads/parses, the transform comes last."""

    def __init__(self, n, transform):
        self.n, self.transform = n, transform

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        img, lab, lesions = oblique_case(shape=(30 + i, 60, 50))
        return self.transform({"image": img, "label": lab, "lesions": lesions, "index": i})


def augment(plan, rng):
    return flip_map(plan.out_shape, [2]) @ affine_map(plan.out_shape, [1.5] * 3, rotate_deg=(0, 0, 10))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("workers", [0, 2])
def test_proxy_batches_in_order_with_lesions_on_lesions(device, workers):
    spec = medproc.Spec(spacing=1.5, orientation="RAS", crop=(48, 56, 40))
    with ProxyServer(spec, device=device, batch_size=3, with_label=True, augment=augment) as server:
        assert server.uses_dali_proxy == (device == "gpu")
        ds = CaseDataset(7, server.transform)
        seen = []
        for batch in server.loader(ds, batch_size=3, num_workers=workers):
            n = len(batch["index"])
            assert batch["image"].shape == (n, 1, 40, 56, 48)
            assert batch["label"].shape == (n, 1, 40, 56, 48) and batch["label"].dtype == torch.uint8
            assert batch["image"].device.type == ("cuda" if device == "gpu" else "cpu")
            assert batch["affine"].shape == (n, 4, 4) and batch["affine"].dtype == torch.float64
            for s in range(n):
                i = int(batch["index"][s])
                seen.append(i)
                lab = batch["label"][s, 0].cpu().numpy()
                img = batch["image"][s, 0].cpu().numpy()
                # same voxels as resampling this sample directly with its plan
                src, src_lab, lesions = oblique_case(shape=(30 + i, 60, 50))
                base = medproc.make_plan(src.shape, src.affine, spec)
                plan = base.augmented(augment(base, None))
                np.testing.assert_allclose(batch["affine"][s].numpy(), plan.out_affine)
                ref_img, ref_lab = medproc.pipeline.Resampler("cpu", with_label=True, interp="linear").run(
                    [src.array], [plan], [src_lab.array])[0]
                assert np.abs(img - ref_img).max() <= 1e-3 * np.abs(ref_img).max()
                assert (lab == ref_lab).mean() >= 0.999
                for k, les in enumerate(batch["lesions"][s], 1):
                    assert les["inside"]
                    centroid = np.argwhere(lab == k).mean(0)
                    assert np.abs(np.array(les["center_index"]) - centroid).max() <= 0.5
        assert seen == list(range(7))  # every sample, in order


def test_proxy_needs_a_fixed_output_size():
    with pytest.raises(ValueError, match="fixed output size"):
        ProxyServer(medproc.Spec(spacing=1.5))
