"""Regression tests for the classes the differential fuzzer (test_fuzz.py) found, one each.

The first: a strided sample (a transposed or permuted view, what PILToTensor returns; a
transposed or F-order numpy array) followed by a sample whose dtype promotes the batch. The
engine had recorded the strided sample's transpose piece before it saw the other dtype; rolling
the leaf back forgot that list, so the raw bytes landed over the reference's converted result.
"""
from __future__ import annotations

import collections
import itertools
import os
import tempfile

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import fastcollate
from helpers import assert_same

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.float32,
          torch.float64, torch.bfloat16, torch.complex64]


def _values(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(shape, generator=g, dtype=torch.float64) * 60
    return (v > 0) if dtype == torch.bool else v.to(dtype)


def _laid_out(dtype: torch.dtype, layout: str, seed: int) -> torch.Tensor:
    """A [3, 4, 4] sample in the given layout."""
    if layout == "contig":
        return _values(dtype, (3, 4, 4), seed)
    if layout == "chw":  # HWC memory seen as CHW
        return _values(dtype, (4, 4, 3), seed).permute(2, 0, 1)
    if layout == "t":
        return _values(dtype, (3, 4, 4), seed).transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "step":
        return _values(dtype, (6, 4, 4), seed)[::2]
    if layout == "expand":
        return _values(dtype, (3, 1, 4), seed).expand(3, 4, 4)
    raise AssertionError(layout)


LAYOUTS = ["contig", "chw", "t", "step", "expand"]


@pytest.mark.parametrize("odd", [0, 1, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("first,second", list(itertools.product(DTYPES, DTYPES)),
                         ids=lambda d: str(d).replace("torch.", ""))
def test_strided_samples_with_type_promotion(first, second, layout, odd):
    # three samples, all in `layout`, the one at `odd` of dtype `second`, the rest `first`
    batch = [_laid_out(second if i == odd else first, layout, i) for i in range(3)]
    assert_same(fastcollate.collate(batch), default_collate(batch))


def test_the_issue_reproducers():
    x = torch.randint(0, 255, (4, 4, 3), dtype=torch.uint8).permute(2, 0, 1)
    y = torch.rand(3, 4, 4)
    assert_same(fastcollate.collate([x, y]), default_collate([x, y]))
    a = [np.arange(9, dtype=np.float32).reshape(3, 3).T, np.arange(9.).reshape(3, 3)]
    assert_same(fastcollate.collate(a), default_collate(a))
    f = [np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)), np.arange(12).reshape(3, 4)]
    assert_same(fastcollate.collate(f), default_collate(f))


@pytest.mark.parametrize("np_first", ["float32", "int16", "uint8"])
@pytest.mark.parametrize("order", ["F", "T"])
def test_strided_numpy_then_a_wider_dtype(np_first, order):
    base = np.arange(12).reshape(3, 4).astype(np_first)
    first = np.asfortranarray(base) if order == "F" else np.ascontiguousarray(base.T).T
    batch = [first, np.arange(12, dtype=np.float64).reshape(3, 4), first]
    assert_same(fastcollate.collate(batch), default_collate(batch))


def test_strided_leaf_in_a_dict_of_many_fields():
    # the sample-major pass over dict columns, then the column walk that defers
    samples = [{"img": _laid_out(torch.uint8, "chw", i), "y": i, "w": torch.ones(2)} for i in range(4)]
    samples[2]["img"] = samples[2]["img"].float()
    assert_same(fastcollate.collate(samples), default_collate(samples))


def test_padding_rolls_back_a_strided_leaf():
    # a strided tensor first, then a list whose int overflows int64: the padded leaf goes to the
    # reference after sample 0's strided copy was recorded; the reference's error (torch.tensor's) stands
    base = torch.arange(6).reshape(2, 3).t()  # [3, 2], strided
    batch = [{"ids": torch.arange(8)[::2], "x": base}, {"ids": [1, 2**64], "x": base}]
    c = fastcollate.Collator(pad={"ids": 0, "x": 0})
    with pytest.raises(ValueError, match="Overflow"):
        c(batch)
    batch = [{"x": base, "ids": [1, 2]}, {"x": base.double(), "ids": [3]}]
    with pytest.raises(TypeError):  # mixed dtypes in a padded key: refused, nothing half-written
        c(batch)
    ok = [{"x": base, "ids": [1, 2]}, {"x": base[:2], "ids": [3]}]
    assert_same(c(ok), fastcollate.Collator(pad={"ids": 0, "x": 0}, backend="python")(ok))


def test_memmap_rows_of_zero_elements():
    with tempfile.TemporaryDirectory() as d:
        m = np.memmap(os.path.join(d, "m"), dtype=np.float32, mode="w+", shape=(5, 1, 0))
        ds = fastcollate.ArrayDataset({"x": m, "y": np.arange(5)})
        idx = [0, 4, 2]
        got = fastcollate.collate(ds.__getitems__(idx))
        assert got["x"].shape == (3, 1, 0)
        assert_same(got, default_collate([ds[i] for i in idx]))
        t = fastcollate.ArrayDataset([torch.zeros(4, 0, 3), np.zeros((4, 2, 0), dtype=np.int16)])
        assert_same(fastcollate.collate(t.__getitems__([1, 3])), default_collate([t[1], t[3]]))


NT2 = collections.namedtuple("NT2", ["a", "b"])
NT1 = collections.namedtuple("NT1", ["a"])


def test_namedtuple_with_fewer_fields_raises_before_later_leaves():
    # default_collate builds NT2 from one field (zip stops at the shortest) and raises TypeError
    # there, before it looks at "y", whose uint64 + int64 would raise RuntimeError
    batch = [{"t": NT2(torch.ones(1), torch.ones(1)), "y": torch.ones(2, dtype=torch.int64)},
             {"t": NT1(torch.ones(1)), "y": torch.ones(2, dtype=torch.uint64)}]
    with pytest.raises(TypeError):
        default_collate(batch)
    with pytest.raises(TypeError):
        fastcollate.collate(batch)


def test_padding_reports_the_first_key_in_error():
    # key order, as default_collate goes: "ids" (a pad value int64 cannot hold) before "x"
    batch = [{"ids": [1], "x": torch.ones(2)}, {"ids": [1, 2], "x": torch.ones(3)}]
    for backend in ("cpp", "python"):
        with pytest.raises(ValueError, match="pad value"):
            fastcollate.Collator(pad={"ids": 0.5}, backend=backend)(batch)
    batch = [{"x": torch.ones(2), "ids": [1]}, {"x": torch.ones(3), "ids": [1, 2]}]
    for backend in ("cpp", "python"):
        with pytest.raises(RuntimeError, match="shape"):
            fastcollate.Collator(pad={"ids": 0.5}, backend=backend)(batch)


class _Samples(torch.utils.data.Dataset):
    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def _worker_error(loader_cls, samples):
    loader = loader_cls(_Samples(samples), batch_size=len(samples), num_workers=1, multiprocessing_context="fork")
    try:
        next(iter(loader))
    except Exception as exc:
        return type(exc)
    return None


def test_in_a_worker_a_non_tensor_after_a_tensor_is_torchs_attribute_error():
    # in a worker default_collate sums numel() over the samples first
    samples = [torch.ones(3), np.ones(3)]
    assert _worker_error(DataLoader, samples) is AttributeError
    assert _worker_error(fastcollate.DataLoader, samples) is AttributeError
    assert _worker_error(lambda ds, **kw: DataLoader(ds, collate_fn=fastcollate.collate, **kw), samples) \
        is AttributeError


@pytest.mark.parametrize("view", ["neg", "conj"])
def test_in_a_worker_a_conj_or_neg_view_first_is_torchs_error(view):
    # torch's worker path builds its out= from sample 0, which it cannot do for these views
    t = torch._neg_view(torch.ones(3)) if view == "neg" else torch.ones(3, dtype=torch.complex64).conj()
    assert _worker_error(DataLoader, [t]) is RuntimeError
    assert _worker_error(fastcollate.DataLoader, [t]) is RuntimeError
    assert_same(fastcollate.collate([t, t]), default_collate([t, t]))  # the main process stacks them


def test_padding_never_reads_past_max_length():
    # a list's values past max_length are not converted (the engine never reads them), so an int
    # there that would overflow int64 is no error; the column's dtype is still the whole lists'
    batch = [{"ids": [1, 2, 3, 2**64]}, {"ids": [4, 5]}]
    for backend in ("cpp", "python"):
        out = fastcollate.Collator(pad={"ids": 0}, max_length=2, backend=backend)(batch)
        assert out["ids"].tolist() == [[1, 2], [4, 5]] and out["ids"].dtype == torch.int64
    mixed = [{"ids": [1, 2, 0.5]}, {"ids": [4, 5]}]
    for backend in ("cpp", "python"):
        assert fastcollate.Collator(pad={"ids": 0}, max_length=2, backend=backend)(mixed)["ids"].dtype == torch.float32
