"""Inside DataLoader workers the arena is shared memory: the batch equals default_collate's,
is_shared() like default_collate's, and crosses to the main process as one storage."""
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import fastcollate
from sample_data import Mixed
from helpers import assert_same, tensor_leaves


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_worker_batches_match_default_collate(ctx):
    ds = Mixed(37)
    ours = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=fastcollate.collate, multiprocessing_context=ctx)
    theirs = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=default_collate, multiprocessing_context=ctx)
    n = 0
    for a, b in zip(ours, theirs):
        assert_same(a, b)
        leaves = tensor_leaves(a)
        assert all(t.is_shared() for t in leaves)
        assert all(t.is_shared() for t in tensor_leaves(b))
        assert len({t.untyped_storage().data_ptr() for t in leaves}) == 1, "one shared segment per batch"
        n += 1
    assert n == 5


def test_worker_errors_surface_with_their_class():
    class Bad(Mixed):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            if i == 5:
                s["image"] = torch.zeros(3, 15, 16, dtype=torch.uint8)
            return s

    loader = DataLoader(Bad(16), batch_size=8, num_workers=2, collate_fn=fastcollate.collate)
    with pytest.raises(RuntimeError, match=r"batch\['image'\]: sample 5 has shape \[3, 15, 16\]"):
        list(loader)


def test_main_process_loader_matches():
    ds = Mixed(21)
    for a, b in zip(DataLoader(ds, batch_size=4, collate_fn=fastcollate.collate),
                    DataLoader(ds, batch_size=4)):
        assert_same(a, b)
        assert not any(t.is_shared() for t in tensor_leaves(a))


def test_channels_last_samples_are_contiguous_in_workers_as_with_torch():
    # default_collate stacks into a contiguous out= tensor inside a worker
    import torch.utils.data as tud

    data = [torch.rand(2, 3, 4, 5).contiguous(memory_format=torch.channels_last) for _ in range(8)]
    for ours, theirs in zip(tud.DataLoader(data, batch_size=4, num_workers=2, collate_fn=fastcollate.collate),
                            tud.DataLoader(data, batch_size=4, num_workers=2)):
        assert ours.stride() == theirs.stride() and torch.equal(ours, theirs)
