"""ArrayDataset / TokenWindows through the loader stack: workers (fork, spawn), the ring,
shuffling, DistributedSampler, drop_last, Subset, LengthGroupedSampler, CudaPrefetcher --
batch for batch equal to default_collate of the same samples, gathered in the workers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from torch.utils.data import default_collate

import fastcollate
from fastcollate import Collator, Ragged
from helpers import assert_same
from sample_data import GatherOnly


def columns(n=64):
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 12, size=n)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    return {"x": rng.standard_normal((n, 3, 4), dtype=np.float32), "y": np.arange(n),
            "ids": Ragged(rng.integers(0, 1000, int(offsets[-1])).astype(np.int32), offsets)}


def reference(ds, batches, collate_fn=default_collate):
    return [collate_fn([ds[i] for i in b]) for b in batches]


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
@pytest.mark.parametrize("ring", [True, False])
def test_workers_gather_and_match(ctx, ring):
    ds = GatherOnly(columns())
    pad = Collator(pad={"ids": 0}, lengths_key="n")
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(5)).tolist()  # a shuffled order
    loader = fastcollate.DataLoader(ds, batch_size=8, sampler=perm, num_workers=2, collate_fn=pad,
                                    multiprocessing_context=ctx, ring=ring)
    order = list(tud.BatchSampler(perm, 8, False))
    got = list(loader)
    assert len(got) == len(order) == 8
    for a, b in zip(got, reference(ds, order, pad.pad.collate), strict=True):
        assert_same(a, b)
    if ring:
        st = loader.stats()
        assert st["ring_hits"] == 8 and st["ring_fallbacks"] == 0


def test_torch_loader_with_fastcollate_collate_and_token_windows(tmp_path):
    path = tmp_path / "tokens.bin"
    np.random.default_rng(2).integers(0, 65535, 10_000).astype(np.uint16).tofile(path)
    ds = fastcollate.TokenWindows(np.memmap(path, dtype=np.uint16, mode="r"), seq_len=64)
    sampler = tud.distributed.DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = tud.DataLoader(ds, batch_size=16, sampler=sampler, drop_last=True, num_workers=2,
                            collate_fn=fastcollate.collate, multiprocessing_context="spawn")
    batches = list(tud.BatchSampler(sampler, 16, True))
    assert len(batches) == len(loader) == 4
    for a, b in zip(loader, reference(ds, batches), strict=True):
        assert_same(a, b)


def test_default_collate_and_main_process():
    ds = fastcollate.ArrayDataset({k: v for k, v in columns().items() if k != "ids"})
    ours = tud.DataLoader(ds, batch_size=10, collate_fn=fastcollate.collate)
    theirs = tud.DataLoader(ds, batch_size=10)  # default_collate gets ordinary samples
    for a, b in zip(ours, theirs, strict=True):
        assert_same(a, b)
    before = fastcollate.stats()["gathered_batches"]
    list(fastcollate.DataLoader(ds, batch_size=10))
    assert fastcollate.stats()["gathered_batches"] - before == 7


def test_subset_and_length_grouped_sampler():
    ds = GatherOnly(columns())
    sub = tud.Subset(ds, list(range(10, 50)))
    pad = Collator(pad={"ids": -1})
    loader = fastcollate.DataLoader(sub, batch_size=6, num_workers=2, collate_fn=pad)
    for a, b in zip(loader, reference(sub, tud.BatchSampler(tud.SequentialSampler(sub), 6, False), pad.pad.collate),
                    strict=True):
        assert_same(a, b)
    sampler = fastcollate.LengthGroupedSampler(ds.lengths("ids"), batch_size=8, seed=1)
    loader = fastcollate.DataLoader(ds, batch_sampler=sampler, num_workers=2, collate_fn=pad)
    got = list(loader)
    for a, b in zip(got, reference(ds, list(sampler), pad.pad.collate), strict=True):
        assert_same(a, b)
    lengths = ds.lengths("ids")
    shuffled = list(tud.BatchSampler(torch.randperm(len(ds)).tolist(), 8, False))
    assert fastcollate.padding_fraction(lengths, list(sampler)) < fastcollate.padding_fraction(lengths, shuffled)


def test_cuda_prefetcher_on_cpu():
    ds = GatherOnly(columns())
    loader = fastcollate.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=Collator(pad={"ids": 0}))
    want = reference(ds, tud.BatchSampler(tud.SequentialSampler(ds), 8, False), Collator(pad={"ids": 0}).pad.collate)
    for a, b in zip(fastcollate.CudaPrefetcher(loader, device="cpu"), want, strict=True):
        assert_same(a, b, contiguous=False)


@pytest.mark.parametrize("workers", [0, 2])
def test_same_batches_as_torchs_loader_with_the_same_arguments(workers):
    ds = fastcollate.ArrayDataset({k: v for k, v in columns(50).items() if k != "ids"})

    def kw():
        return dict(batch_size=8, shuffle=True, drop_last=True, num_workers=workers,
                    generator=torch.Generator().manual_seed(11))

    theirs = tud.DataLoader(ds, **kw())  # torch's default_collate over the same ordinary samples
    ours = fastcollate.DataLoader(ds, **kw())
    for epoch in range(2):
        got, want = list(ours), list(theirs)
        assert len(got) == len(want) == 6
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
