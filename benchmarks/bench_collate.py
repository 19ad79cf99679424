"""pytest-benchmark suite: every workload with default_collate, fastcollate and the memcpy
ceiling (a Tensor.copy_ of the same bytes into a reused buffer), grouped per workload so the
table shows the three side by side.

    pytest benchmarks/bench_collate.py --benchmark-only --benchmark-group-by=group
"""
import pytest
import torch
from torch.utils.data import default_collate

import fastcollate
from fastcollate._bench import workloads
from held import run_held

NAMES = list(workloads.WORKLOADS)


@pytest.fixture(scope="module", params=NAMES)
def workload(request):
    return request.param, workloads.WORKLOADS[request.param][1]()


def _run(benchmark, name, fn):
    run_held(benchmark, name, fn)


def test_default_collate(benchmark, workload):
    name, batch = workload
    _run(benchmark, name, lambda: default_collate(batch))


def test_fastcollate(benchmark, workload):
    name, batch = workload
    assert fastcollate.backend() == "cpp"
    _run(benchmark, name, lambda: fastcollate.collate(batch))


def test_memcpy_ceiling(benchmark, workload):
    name, batch = workload
    n = sum(workloads.tensor_bytes(s) for s in batch)
    src, dst = torch.empty(n, dtype=torch.uint8).random_(0, 255), torch.empty(n, dtype=torch.uint8)
    _run(benchmark, name, lambda: dst.copy_(src))
