"""LitData: a dataset written with `litdata.optimize` in a temporary directory, read back with
`StreamingDataset` + `StreamingDataLoader`. With `collate_fn=fastcollate.collate` the batches are
exactly LitData's default ones (default_collate's), with and without workers; and
`fastcollate.with_ring(StreamingDataLoader)` -- StreamingDataLoader is a torch DataLoader subclass
that passes the collate_fn on (wrapped in its own) -- gives the same batches through the worker
ring, every batch a ring hit, and keeps LitData's mid-epoch resume."""
import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

ld = pytest.importorskip("litdata")

import fastcollate  # noqa: E402
from helpers import assert_same  # noqa: E402

N, BATCH = 100, 8


def make_sample(i):
    """One sample of every kind LitData stores: a tensor, a numpy image, an int, a float, a string."""
    rng = np.random.default_rng(i)
    return {"x": torch.from_numpy(rng.standard_normal(4).astype(np.float32)),
            "image": rng.integers(0, 255, (3, 8, 8), dtype=np.uint8),
            "label": i, "weight": i / 3, "name": f"sample {i}"}


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("litdata") / "optimized")
    ld.optimize(fn=make_sample, inputs=list(range(N)), output_dir=out, chunk_bytes="8KB", num_workers=1)
    return out


def epoch(loader):
    # one batch at a time, released before the next (as a training loop does)
    return [b for b in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collate_fn_gives_litdatas_own_batches(optimized, num_workers):
    want = epoch(ld.StreamingDataLoader(ld.StreamingDataset(optimized), batch_size=BATCH, num_workers=num_workers))
    also = epoch(ld.StreamingDataLoader(ld.StreamingDataset(optimized), batch_size=BATCH, num_workers=num_workers,
                                        collate_fn=default_collate))
    got = epoch(ld.StreamingDataLoader(ld.StreamingDataset(optimized), batch_size=BATCH, num_workers=num_workers,
                                       collate_fn=fastcollate.collate))
    assert len(want) == -(-N // BATCH)
    for g, w, a in zip(got, want, also, strict=True):
        assert_same(g, w)
        assert_same(g, a)
    seen = sorted(i for b in got for i in b["label"].tolist())
    assert seen == list(range(N))


def test_the_ring_through_with_ring(optimized):
    Loader = fastcollate.with_ring(ld.StreamingDataLoader)
    assert issubclass(Loader, ld.StreamingDataLoader)
    want = epoch(ld.StreamingDataLoader(ld.StreamingDataset(optimized), batch_size=BATCH, num_workers=2))
    loader = Loader(ld.StreamingDataset(optimized), batch_size=BATCH, num_workers=2)
    for _ in range(2):  # two epochs: the slots are recycled
        n = 0
        for got, w in zip(loader, want, strict=True):
            assert_same(got, w)
            n += 1
        assert n == len(want)
    stats = loader.stats()
    assert stats["ring"] and stats["ring_hits"] == 2 * len(want) and stats["ring_fallbacks"] == 0, stats


def test_the_ring_keeps_litdatas_resume(optimized):
    Loader = fastcollate.with_ring(ld.StreamingDataLoader)
    want = epoch(ld.StreamingDataLoader(ld.StreamingDataset(optimized), batch_size=BATCH, num_workers=2))
    first = Loader(ld.StreamingDataset(optimized), batch_size=BATCH, num_workers=2)
    it = iter(first)
    head = [next(it) for _ in range(4)]
    state = first.state_dict()
    del it
    resumed = Loader(ld.StreamingDataset(optimized), batch_size=BATCH, num_workers=2)
    resumed.load_state_dict(state)
    rest = epoch(resumed)
    for g, w in zip(head + rest, want, strict=True):
        assert_same(g, w)
    assert resumed.stats()["ring_hits"] == len(rest)
