"""fastcollate.DataLoader as torch's DataLoader's drop-in: automatic batching off, typing, the
collate_fn attribute, and loaders re-created from its attributes (what frameworks do)."""
import pickle

import pytest
import torch
import torch.utils.data as tud

import fastcollate
from helpers import assert_same
from sample_data import Mixed


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_size_none_converts_like_torch(workers):
    ds = Mixed(9)
    ours = list(fastcollate.DataLoader(ds, batch_size=None, num_workers=workers))
    theirs = list(tud.DataLoader(ds, batch_size=None, num_workers=workers))
    assert len(ours) == 9
    for a, b in zip(ours, theirs):
        assert_same(a, b, contiguous=False)
    assert not fastcollate.DataLoader(ds, batch_size=None, num_workers=workers).stats()["ring"]


def test_generic_like_torch():
    alias = fastcollate.DataLoader[list[torch.Tensor]]
    assert alias.__origin__ is fastcollate.DataLoader
    loader: fastcollate.DataLoader[int] = fastcollate.DataLoader(list(range(4)), batch_size=2)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


def test_collate_fn_attribute_is_what_was_passed_wrapped():
    l0 = fastcollate.DataLoader(Mixed(8), batch_size=4)
    assert l0.collate_fn is fastcollate.collate  # no workers: no ring, nothing wrapped
    l2 = fastcollate.DataLoader(Mixed(8), batch_size=4, num_workers=2)
    assert isinstance(l2.collate_fn, fastcollate.RingCollator) and l2.collate_fn.inner is fastcollate.collate
    c = fastcollate.Collator(num_threads=1)
    assert fastcollate.DataLoader(Mixed(8), batch_size=4, num_workers=2, collate_fn=c).collate_fn.inner is c
    # the ring collator is a complete collate_fn outside workers too
    assert_same(l2.collate_fn([Mixed(8)[i] for i in range(4)]), tud.default_collate([Mixed(8)[i] for i in range(4)]))


@pytest.mark.parametrize("ctx", [None, "spawn"])
def test_a_loader_rebuilt_from_attributes_yields_batches_and_keeps_the_ring(ctx):
    ours = fastcollate.DataLoader(Mixed(40), batch_size=4, num_workers=2, multiprocessing_context=ctx)
    next(iter(ours))  # iterated once, as a framework's sanity check does
    rebuilt = tud.DataLoader(ours.dataset, batch_size=ours.batch_size, collate_fn=ours.collate_fn,
                             num_workers=ours.num_workers, multiprocessing_context=ctx)
    hits = ours.stats()["ring_hits"]
    for a, b in zip(rebuilt, tud.DataLoader(Mixed(40), batch_size=4), strict=True):
        assert_same(a, b)
    assert ours.stats()["ring_hits"] - hits == 10  # the rebuilt loader's workers used the same ring
    again = fastcollate.DataLoader(ours.dataset, batch_size=4, collate_fn=ours.collate_fn, num_workers=2)
    assert again.collate_fn.inner is fastcollate.collate and again._ring is not ours._ring
    assert sum(1 for _ in again) == 10 and again.stats()["ring_hits"] == 10


def test_copies_of_a_ring_collator_share_the_ring_never_copy_it():
    import copy

    loader = fastcollate.DataLoader(Mixed(8), batch_size=4, num_workers=2)
    data = pickle.dumps(loader.collate_fn)
    assert len(data) < 4096  # not the segment (gigabytes of address space)
    assert pickle.loads(data).ring is loader.collate_fn.ring
    assert copy.deepcopy(loader.collate_fn).ring is loader.collate_fn.ring


def test_star_import_needs_no_optional_package():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torchdata'] = None\n"  # torchdata 'not installed'
            "from fastcollate import *\n"
            "import fastcollate\n"
            "try:\n    fastcollate.StatefulDataLoader\nexcept ImportError as e:\n    print('NEEDS', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "NEEDS fastcollate.StatefulDataLoader needs torchdata: pip install torchdata" in r.stdout


class _StackedGetitems(torch.utils.data.Dataset):
    """A batch fetch that returns one stacked tensor: torch's loader refuses it (default_collate
    hands it to torch.stack), and so must fastcollate's -- code that ran here would break with
    FASTCOLLATE_DISABLE=1 otherwise."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((2,), i)

    def __getitems__(self, idx):
        return torch.stack([self[i] for i in idx])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_getitems_returning_one_tensor_is_refused_as_torch_refuses_it(workers):
    with pytest.raises(TypeError):
        list(torch.utils.data.DataLoader(_StackedGetitems(), batch_size=4, num_workers=workers))
    with pytest.raises(TypeError, match="must be a list or tuple of samples"):
        list(fastcollate.DataLoader(_StackedGetitems(), batch_size=4, num_workers=workers))
