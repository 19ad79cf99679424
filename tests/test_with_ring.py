"""fastcollate.with_ring(LoaderClass): any torch DataLoader subclass gets fastcollate's collate and
the worker ring -- also one that wraps the collate_fn it is given in its own (as LitData's
StreamingDataLoader does) -- with batch-for-batch the batches of the class itself."""
import pytest
import torch
import torch.utils.data as tud

import fastcollate
from helpers import assert_same


class Wrapping:
    def __init__(self, inner):
        self.inner = inner

    def __call__(self, items):
        return {"batch": self.inner(items), "n": len(items)}


class WrappingLoader(tud.DataLoader):
    """A framework's loader: its own argument, and the collate_fn wrapped."""

    def __init__(self, dataset, *args, tag="x", collate_fn=None, **kwargs):
        self.tag = tag
        super().__init__(dataset, *args, collate_fn=Wrapping(collate_fn or tud.default_collate), **kwargs)


def data():
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(3, 4, generator=g), "y": i} for i in range(40)]


def test_with_ring_gives_the_class_batches_through_the_ring():
    Loader = fastcollate.with_ring(WrappingLoader)
    assert Loader is fastcollate.with_ring(WrappingLoader) and issubclass(Loader, WrappingLoader)
    assert fastcollate.with_ring(Loader) is Loader 
    assert fastcollate.with_ring(fastcollate.DataLoader) is fastcollate.with_ring(tud.DataLoader) is fastcollate.DataLoader
    want = list(WrappingLoader(data(), batch_size=8, num_workers=2))
    loader = Loader(data(), batch_size=8, num_workers=2, tag="y")
    assert loader.tag == "y" and isinstance(loader.collate_fn, Wrapping)
    assert isinstance(loader.collate_fn.inner, fastcollate.RingCollator)
    n = 0
    for got in loader:
        assert_same(got, want[n])
        n += 1
    assert n == len(want) and loader.stats()["ring_hits"] == n


def test_with_ring_without_workers_and_with_a_custom_collate():
    Loader = fastcollate.with_ring(WrappingLoader)
    assert_same(list(Loader(data(), batch_size=8)), list(WrappingLoader(data(), batch_size=8)))
    assert Loader(data(), batch_size=8).stats() == {"ring": False, "ring_off": "num_workers=0"}
    custom = Loader(data(), batch_size=8, num_workers=2, collate_fn=tud.default_collate)  # not ours: torch's path
    assert custom.stats() == {"ring": False, "ring_off": "the collate_fn is not fastcollate's"}
    assert_same(list(custom), list(WrappingLoader(data(), batch_size=8)))


class PassThroughLoader(tud.DataLoader):
    """MosaicML streaming's StreamingDataLoader has this shape: (*args, **kwargs), passed on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.made = True


def test_with_ring_reads_a_pass_through_signature_as_torchs():
    Loader = fastcollate.with_ring(PassThroughLoader)
    loader = Loader(data(), batch_size=8, num_workers=2)
    assert loader.made and isinstance(loader.collate_fn, fastcollate.RingCollator)
    n = 0
    for got, want in zip(loader, PassThroughLoader(data(), batch_size=8), strict=True):
        assert_same(got, want)
        n += 1
    assert loader.stats()["ring_hits"] == n == 5
    # arguments after the dataset may be positional, as the class itself takes them
    positional = fastcollate.with_ring(WrappingLoader)(data(), 8, num_workers=2)
    _same_epochs(positional, WrappingLoader(data(), 8))
    assert positional.stats()["ring_hits"] == 5


def test_with_ring_refuses_what_is_not_a_dataloader_class():
    class Wrapper:  # holds a DataLoader, is none (as webdataset's WebLoader)
        pass

    with pytest.raises(TypeError, match="subclass of torch.utils.data.DataLoader"):
        fastcollate.with_ring(Wrapper)
    with pytest.raises(TypeError, match="subclass of torch.utils.data.DataLoader"):
        fastcollate.with_ring(tud.DataLoader(data()))


# -- the class's own semantics, kept (each case once failed: the class's batches were not its own)

import loader_classes as lc  # noqa: E402

CONTEXTS = [(0, None), (2, "fork"), (2, "spawn")]


def _same_epochs(got_loader, want_loader):
    got, want = list(got_loader), list(want_loader)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same(g, w)
    return len(got)


@pytest.mark.parametrize("workers,ctx", CONTEXTS)
def test_a_class_default_collate_fn_is_kept(workers, ctx):
    Loader = fastcollate.with_ring(lc.OwnDefault)
    loader = Loader(lc.data(), num_workers=workers, multiprocessing_context=ctx)
    n = _same_epochs(loader, lc.OwnDefault(lc.data()))
    assert n == 5 and loader.collate_fn is lc.own_collate
    assert loader.stats() == {"ring": False, "ring_off": "the collate_fn is not fastcollate's"}


@pytest.mark.parametrize("workers,ctx", CONTEXTS)
def test_a_class_default_batch_size_none_is_kept(workers, ctx):
    Loader = fastcollate.with_ring(lc.NoBatching)
    loader = Loader(lc.data(8), num_workers=workers, multiprocessing_context=ctx)
    assert _same_epochs(loader, lc.NoBatching(lc.data(8))) == 8
    assert not loader.stats()["ring"]


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_a_class_default_num_workers_makes_the_ring(ctx):
    loader = fastcollate.with_ring(lc.TwoWorkers)(lc.data(), multiprocessing_context=ctx)
    assert _same_epochs(loader, lc.TwoWorkers(lc.data())) == 5
    assert loader.stats()["ring_hits"] == 5


@pytest.mark.parametrize("workers,ctx", CONTEXTS)
def test_renamed_arguments_are_found_by_what_the_class_passes(workers, ctx):
    renamed = fastcollate.with_ring(lc.Renamed)(lc.data(), workers=workers, multiprocessing_context=ctx)
    assert _same_epochs(renamed, lc.Renamed(lc.data(), workers=workers)) == 5
    assert renamed.stats().get("ring_hits", 0) == (5 if workers else 0)


@pytest.mark.parametrize("workers,ctx", CONTEXTS)
def test_a_positional_only_dataset(workers, ctx):
    loader = fastcollate.with_ring(lc.PositionalOnly)(lc.data(), num_workers=workers, multiprocessing_context=ctx)
    assert _same_epochs(loader, lc.PositionalOnly(lc.data())) == 5
    assert loader.stats().get("ring_hits", 0) == (5 if workers else 0)


@pytest.mark.parametrize("workers,ctx", CONTEXTS)
def test_a_post_processing_collate_runs_on_real_batches(workers, ctx):
    Loader = fastcollate.with_ring(lc.PostProcessing)
    loader = Loader(lc.data(), batch_size=8, num_workers=workers, multiprocessing_context=ctx)
    got = list(loader)
    assert len(got) == 5 and all("x_sum" in b for b in got)  # the class's step ran on every batch
    _same_epochs(got, lc.PostProcessing(lc.data(), batch_size=8))
    if workers:
        assert loader.stats()["ring_hits"] == 5  # ... and the ring served it


@pytest.mark.parametrize("workers,ctx", CONTEXTS)
def test_a_collator_subclass_call_runs_in_workers(workers, ctx):
    loader = fastcollate.DataLoader(lc.data(), batch_size=8, collate_fn=lc.AddingCollator(), num_workers=workers,
                                    multiprocessing_context=ctx)
    got = list(loader)
    _same_epochs(got, tud.DataLoader(lc.data(), batch_size=8, collate_fn=lc.adding_collate_reference))
    _same_epochs(got, tud.DataLoader(lc.data(), batch_size=8, collate_fn=lc.AddingCollator(), num_workers=workers,
                                     multiprocessing_context=ctx))
    if workers:
        assert loader.stats()["ring_hits"] == 5


@pytest.mark.parametrize("workers,ctx", CONTEXTS)
def test_a_class_own_stats_is_kept(workers, ctx):
    loader = fastcollate.with_ring(lc.WithStats)(lc.data(), batch_size=8, num_workers=workers,
                                                 multiprocessing_context=ctx)
    assert loader.stats() == "mine"
    assert sum(1 for _ in loader) == 5 and loader.ring_stats().get("ring_hits", 0) == (5 if workers else 0)
