"""A pytest plugin for gpu_check where pytest-timeout is not installed: each test gets 60 s,
after which faulthandler dumps every stack and ends pytest (a hung CUDA call cannot be
interrupted from Python; ending the run is the only bound that holds)."""
import faulthandler
import sys

import pytest

LIMIT_S = 60


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    faulthandler.dump_traceback_later(LIMIT_S, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
