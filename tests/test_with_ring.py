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
    assert Loader(data(), batch_size=8).stats() == {"ring": False}
    custom = Loader(data(), batch_size=8, num_workers=2, collate_fn=tud.default_collate)  # not ours: torch's path
    assert custom.stats() == {"ring": False}
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
    with pytest.raises(TypeError, match="by keyword"):
        fastcollate.with_ring(WrappingLoader)(data(), 8)


def test_with_ring_refuses_what_is_not_a_dataloader_class():
    class Wrapper:  # holds a DataLoader, is none (as webdataset's WebLoader)
        pass

    with pytest.raises(TypeError, match="subclass of torch.utils.data.DataLoader"):
        fastcollate.with_ring(Wrapper)
    with pytest.raises(TypeError, match="subclass of torch.utils.data.DataLoader"):
        fastcollate.with_ring(tud.DataLoader(data()))
