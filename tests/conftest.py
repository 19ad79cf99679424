import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import fastcollate  # noqa: E402

try:  # Hypothesis times its examples: a 200 ms deadline and a "too slow" health check fail on a busy
    # machine, not on a wrong result. Every property test here runs without them (explicit
    # @settings inherit this profile); HYPOTHESIS_PROFILE picks another where set.
    from hypothesis import HealthCheck, settings

    settings.register_profile("fastcollate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fastcollate"))
except ImportError:  # the property tests skip or fail on their own import
    pass


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
