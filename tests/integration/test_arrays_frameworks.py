"""fastcollate's columnar datasets through the frameworks: torchdata's StatefulDataLoader resumes
a TokenWindows epoch exactly (ring included), and accelerate's prepare() keeps the gather."""
import numpy as np
import pytest
import torch.utils.data as tud

import fastcollate
from helpers import assert_resumes_as_torchdata, assert_same


def windows():
    tokens = np.random.default_rng(4).integers(0, 60000, 40 * 32 + 1).astype(np.uint16)
    return fastcollate.TokenWindows(tokens, seq_len=32)


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_loader_resumes_token_windows(workers):
    pytest.importorskip("torchdata")
    assert_resumes_as_torchdata(windows, workers, head=4, batches=10, ring_hits=6)


def test_accelerate_prepare_keeps_the_gather():
    accelerate = pytest.importorskip("accelerate")
    ds = windows()
    loader = fastcollate.DataLoader(ds, batch_size=4, num_workers=2)
    prepared = accelerate.Accelerator(cpu=True).prepare(loader)
    want = [tud.default_collate([ds[i] for i in range(s, min(s + 4, len(ds)))]) for s in range(0, len(ds), 4)]
    for a, b in zip(prepared, want, strict=True):
        assert_same(a, b)
    assert prepared.collate_fn.stats()["ring_hits"] == len(want)
