import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import fastcollate  # noqa: E402


def pytest_configure(config):
    # A broken build must not pass on the Python fallback: the suite refuses to run without the
    # compiled engine, unless a run opts into the fallback explicitly.
    if fastcollate.backend() != "cpp" and os.environ.get("FASTCOLLATE_TEST_ALLOW_FALLBACK") != "1":
        from fastcollate import _ext

        raise pytest.UsageError(f"fastcollate's compiled backend is not in use: {_ext.LOAD_ERROR}")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_disable(monkeypatch):
    monkeypatch.delenv("FASTCOLLATE_DISABLE", raising=False)
