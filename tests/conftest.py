import os
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))


def pytest_collection_modifyitems(config, items):
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        has_gpu = GetCUDADeviceCount() > 0
    except Exception:  # noqa: BLE001
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="no NVIDIA GPU here (run on the H200: pytest -m gpu)")
        for it in items:
            if "gpu" in it.keywords:
                it.add_marker(skip)


@pytest.fixture(scope="session")
def sample_data():
    return os.path.join(ROOT, "sample_data")


@pytest.fixture(scope="session")
def pyradiomics_data():
    from fetch_test_data import fetch

    return fetch(os.path.join(ROOT, ".data"))


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(scope="session")
def broken_dataset(tmp_path_factory):
    from medproc.sample_data import make_broken

    d = str(tmp_path_factory.mktemp("broken"))
    return make_broken(d)
