"""ArrayDataset / TokenWindows / Ragged: a gathered batch equals default_collate (or the padding
reference) of the same samples, element for element; the fast path is taken (counted) where it
should be and the ordinary path, errors included, everywhere else."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.data import default_collate

import fastcollate
from fastcollate import ArrayDataset, Collator, Gathered, Ragged, TokenWindows
from helpers import assert_same

NP_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.float16,
             np.float32, np.float64]


def gathered(collate_fn, ds, idx):
    """collate_fn of ds.__getitems__(idx), and whether it went through the gather."""
    before = fastcollate.stats()["gathered_batches"]
    out = collate_fn(ds.__getitems__(idx))
    return out, fastcollate.stats()["gathered_batches"] - before


def plain(ds, idx):
    return default_collate([ds[i] for i in idx])


def random_array(rng, dtype, shape):
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, endpoint=True).astype(dtype)
    return (rng.standard_normal(shape) * 100).astype(dtype)


indices = st.lists(st.integers(-20, 19), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(NP_DTYPES), row=st.lists(st.integers(1, 4), max_size=3), idx=indices,
       tensor=st.booleans(), seed=st.integers(0, 2**16))
def test_dense_columns_equal_default_collate(dtype, row, idx, tensor, seed):
    rng = np.random.default_rng(seed)
    a = random_array(rng, dtype, (20, *row))
    b = random_array(rng, np.float32, (20, 3))
    cols = {"a": torch.from_numpy(a) if tensor else a, "b": b, "c": np.arange(20)}
    ds = ArrayDataset(cols)
    got, n = gathered(fastcollate.collate, ds, idx)
    assert n == 1
    assert_same(got, plain(ds, idx))


def test_tuple_samples_give_a_list_as_default_collate_does():
    ds = ArrayDataset([np.arange(10.0), torch.arange(20).view(10, 2)])
    assert isinstance(ds[3], tuple)
    got, n = gathered(fastcollate.collate, ds, [9, 0, 3])
    assert n == 1 and isinstance(got, list)
    assert_same(got, plain(ds, [9, 0, 3]))


@settings(max_examples=40, deadline=None)
@given(src=st.sampled_from([np.uint8, np.int8, np.uint16, np.int16, np.int32, np.uint32, np.int64, np.float16,
                            np.float32, np.float64, np.bool_]),
       dst=st.sampled_from([torch.int64, torch.int32, torch.float32, torch.float64, torch.float16, torch.bfloat16]),
       idx=indices, seed=st.integers(0, 2**16), scalar=st.booleans())
def test_widening_equals_torch_to(src, dst, idx, seed, scalar):
    rng = np.random.default_rng(seed)
    a = random_array(rng, src, (20,) if scalar else (20, 5))
    ds = ArrayDataset({"a": a}, dtypes={"a": dst})
    assert ds[0]["a"].dtype == dst
    assert torch.equal(ds[2]["a"], torch.from_numpy(np.array(a[2])).to(dst))
    got, n = gathered(fastcollate.collate, ds, idx)
    assert n == 1
    assert_same(got, plain(ds, idx))


def test_large_batches_split_across_threads_exactly():
    rng = np.random.default_rng(0)
    ds = ArrayDataset({"x": rng.standard_normal((600, 3, 32, 32), dtype=np.float32),
                       "y": rng.integers(0, 255, (600, 1000), dtype=np.uint8)}, dtypes={"y": torch.float32})
    idx = rng.permutation(600)[:500].tolist()
    got, n = gathered(Collator(num_threads=2), ds, idx)  # > 1 MB: the threaded split
    assert n == 1
    assert_same(got, plain(ds, idx))


def test_views_of_one_arena_and_the_pool():
    ds = ArrayDataset({"x": np.ones((8, 4), np.float32), "y": np.arange(8)})
    out = fastcollate.collate(ds.__getitems__([1, 2, 3]))
    assert out["x"].untyped_storage().data_ptr() == out["y"].untyped_storage().data_ptr()
    assert out["x"].data_ptr() % 64 == 0 and out["y"].data_ptr() % 64 == 0


def test_non_contiguous_and_odd_columns_take_the_ordinary_path():
    base = np.arange(40, dtype=np.int64).reshape(10, 4)
    strided_rows = base[:, ::2]  # rows not dense: materialized, still exact
    every_other = base[::2]      # row stride 2 rows: gathered
    swapped = base.astype(">i8")  # byte-swapped: ordinary path (default_collate's own behaviour)
    for col, fast in ((strided_rows, 0), (every_other, 1)):
        ds = ArrayDataset({"a": col})
        assert ds.ungathered() == ({} if fast else {"a": "its rows are not contiguous"})
        got, n = gathered(fastcollate.collate, ds, [4, 1])
        assert n == fast
        assert_same(got, plain(ds, [4, 1]))
    for col in (swapped, np.arange(10, dtype=np.uint64)):  # default_collate refuses both: so do we
        ds = ArrayDataset({"a": col})
        with pytest.raises(Exception) as theirs:
            plain(ds, [1, 2])
        with pytest.raises(type(theirs.value)):
            fastcollate.collate(ds.__getitems__([1, 2]))


def test_any_other_collate_fn_sees_ordinary_samples():
    ds = ArrayDataset({"x": np.arange(12.0).reshape(6, 2), "y": np.arange(6)})
    batch = ds.__getitems__([5, 0])
    assert isinstance(batch, Gathered) and len(batch) == 2
    assert list(batch)[0]["y"] == 5 and batch[1]["y"] == 0 and batch[0:1][0]["y"] == 5
    assert_same(default_collate(batch), plain(ds, [5, 0]))
    assert_same(Collator(backend="python")(batch), plain(ds, [5, 0]))


def test_kill_switch(monkeypatch):
    ds = ArrayDataset({"x": np.arange(6)})
    monkeypatch.setenv("FASTCOLLATE_DISABLE", "1")
    got, n = gathered(fastcollate.collate, ds, [1, 2])
    assert n == 0
    assert_same(got, plain(ds, [1, 2]))


# ------------------------------------------------------------------ token windows


def token_window(tokens, start, seq_len, np_dtype=np.int64):
    # the plain-Python definition of a sample (the issue's): one window, shifted by one
    w = torch.from_numpy(tokens[start:start + seq_len + 1].astype(np_dtype))
    return {"input_ids": w[:-1], "labels": w[1:]}


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from([np.uint8, np.uint16, np.uint32, np.int32, np.int64]), seq_len=st.integers(1, 17),
       stride=st.one_of(st.none(), st.integers(1, 9)), seed=st.integers(0, 2**16), tensor=st.booleans(),
       out=st.sampled_from([torch.int64, torch.int32]))
def test_token_windows_equal_the_plain_definition(dtype, seq_len, stride, seed, tensor, out):
    rng = np.random.default_rng(seed)
    tokens = random_array(rng, dtype, (300,))
    ds = TokenWindows(torch.from_numpy(tokens) if tensor else tokens, seq_len, stride=stride, dtype=out)
    step = stride or seq_len
    assert len(ds) == (300 - seq_len - 1) // step + 1
    idx = rng.integers(0, len(ds), size=12).tolist() + [len(ds) - 1, -1]
    np_out = np.int64 if out == torch.int64 else np.int32
    want = default_collate([token_window(tokens, (i % len(ds)) * step, seq_len, np_out) for i in idx])
    assert_same(plain(ds, idx), want)
    got, n = gathered(fastcollate.collate, ds, idx)
    assert n == 1
    assert_same(got, want)


def test_token_windows_from_a_memmap_file(tmp_path):
    path = tmp_path / "train.bin"
    tokens = np.random.default_rng(1).integers(0, 50257, size=20_000).astype(np.uint16)
    tokens.tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    ds = TokenWindows(mm, seq_len=128)
    idx = [3, 150, 0, 3]
    want = default_collate([token_window(tokens, i * 128, 128) for i in idx])
    got, n = gathered(fastcollate.collate, ds, idx)
    assert n == 1
    assert_same(got, want)
    # pickled as the file, not its bytes (a spawned worker maps it again)
    blob = pickle.dumps(ds)
    assert len(blob) < 4096
    again = pickle.loads(blob)
    assert isinstance(again.tokens, np.memmap)
    assert_same(fastcollate.collate(again.__getitems__(idx)), want)
    # a view of the memmap keeps its place in the file
    tail = TokenWindows(mm[1000:], seq_len=16)
    assert_same(pickle.loads(pickle.dumps(tail))[2], tail[2])


def test_memmap_that_shrank_is_refused(tmp_path):
    path = tmp_path / "x.bin"
    np.arange(4096, dtype=np.float32).tofile(path)
    ds = ArrayDataset({"x": np.memmap(path, dtype=np.float32, mode="r", shape=(1024, 4))})
    assert fastcollate.collate(ds.__getitems__([1023]))["x"].shape == (1, 4)
    with open(path, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(RuntimeError, match=r"column 'x'.*shrank"):
        fastcollate.collate(ds.__getitems__([0]))
    with pytest.raises(RuntimeError, match="shrank"):
        ds[0]


def test_token_windows_bad_input():
    with pytest.raises(TypeError, match="1-D array of integers"):
        TokenWindows(np.zeros(100, np.float32), 8)
    with pytest.raises(TypeError, match="1-D array of integers"):
        TokenWindows(np.zeros((10, 10), np.int64), 8)
    with pytest.raises(ValueError, match="no window"):
        TokenWindows(np.zeros(8, np.int64), 8)
    with pytest.raises(ValueError, match="seq_len"):
        TokenWindows(np.zeros(80, np.int64), 0)


# ------------------------------------------------------------------ bad input


def test_bad_columns_and_indices():
    with pytest.raises(ValueError, match=r"different numbers of rows: \{'x': 4, 'y': 5\}"):
        ArrayDataset({"x": np.zeros(4), "y": np.zeros(5)})
    with pytest.raises(TypeError, match="column 'x' is a list"):
        ArrayDataset({"x": [1, 2, 3]})
    with pytest.raises(ValueError, match="no widening"):
        ArrayDataset({"x": np.zeros(4)}, dtypes={"x": torch.uint8})
    with pytest.raises(KeyError, match="do not exist"):
        ArrayDataset({"x": np.zeros(4)}, dtypes={"z": torch.int64})
    ds = ArrayDataset({"x": np.zeros(4), "y": np.zeros(4)})
    for bad in ([0, 4], [-5]):
        with pytest.raises(IndexError, match=rf"index {bad[-1]} is out of range for column 'x' of 4 rows"):
            fastcollate.collate(ds.__getitems__(bad))
    with pytest.raises(IndexError, match="index 9 is out of range"):
        ds[9]
    with pytest.raises(TypeError, match="integers"):
        ds[1.5]
    with pytest.raises(ValueError, match="non-decreasing"):
        Ragged(np.arange(5), [0, 3, 2, 5])
    with pytest.raises(ValueError, match="non-decreasing"):
        Ragged(np.arange(5), [0, 3, 6])


def test_empty_batch_is_default_collates_error():
    ds = ArrayDataset({"x": np.zeros(4)})
    with pytest.raises(Exception) as theirs:
        default_collate(ds.__getitems__([]))
    with pytest.raises(type(theirs.value)):
        fastcollate.collate(ds.__getitems__([]))


# ------------------------------------------------------------------ ragged + padding


def ragged_ds(rng, n, dtype, trailing=(), max_len=9):
    lens = rng.integers(0, max_len, size=n)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    values = random_array(rng, dtype, (int(offsets[-1]), *trailing))
    return Ragged(values, offsets)


@settings(max_examples=80, deadline=None)
@given(dtype=st.sampled_from([np.int64, np.int32, np.float32, np.uint8, np.bool_]), idx=indices,
       multiple=st.one_of(st.none(), st.sampled_from([1, 4, 8])), max_length=st.one_of(st.none(), st.sampled_from([0, 8, 16])),
       side=st.sampled_from(["right", "left"]), mask_dtype=st.sampled_from([torch.int64, torch.bool, torch.int32]),
       lengths=st.booleans(), trailing=st.sampled_from([(), (2,)]), seed=st.integers(0, 2**16))
def test_ragged_padding_equals_the_reference(dtype, idx, multiple, max_length, side, mask_dtype, lengths, trailing,
                                             seed):
    if multiple and max_length is not None and max_length % multiple:
        max_length = None
    rng = np.random.default_rng(seed)
    ds = ArrayDataset({"ids": ragged_ds(rng, 20, dtype, trailing), "fixed": np.arange(40).reshape(20, 2),
                       "y": np.arange(20.0)})
    c = Collator(pad={"ids": 1, "fixed": 0}, pad_to_multiple_of=multiple, max_length=max_length, padding_side=side,
                 mask_dtype=mask_dtype, lengths_key="lengths" if lengths else None)
    samples = [ds[i] for i in idx]
    want = c.pad.collate(samples)
    got, n = gathered(c, ds, idx)
    assert n == 1
    assert_same(got, want)
    assert_same(c(samples), want)  # and the engine's own padding agrees


def test_ragged_without_padding():
    rng = np.random.default_rng(3)
    ds = ArrayDataset({"ids": ragged_ds(rng, 10, np.int64)})
    same = [i for i in range(10) if len(ds[i]["ids"]) == len(ds[0]["ids"])]
    got, n = gathered(fastcollate.collate, ds, same)  # equal lengths: stacked, as default_collate does
    assert n == 1
    assert_same(got, plain(ds, same))
    uneven = ArrayDataset({"ids": Ragged(np.arange(5), [0, 2, 5])})
    with pytest.raises(RuntimeError) as theirs:
        plain(uneven, [0, 1])
    with pytest.raises(RuntimeError, match=str(theirs.value)[:30]):
        fastcollate.collate(uneven.__getitems__([0, 1]))


def test_padding_falls_back_where_the_reference_decides():
    ds = ArrayDataset({"ids": Ragged(np.arange(5, dtype=np.uint8), [0, 2, 5]), "attention_mask": np.ones((2, 3))})
    c = Collator(pad={"ids": 300})  # does not fit uint8: the reference's error
    with pytest.raises(ValueError, match="does not fit"):
        c(ds.__getitems__([0, 1]))
    # a carried attention_mask is padded (a tokenizer's rows), not refused
    c2 = Collator(pad={"ids": 0})
    got, n = gathered(c2, ds, [1, 0])
    assert n == 1
    assert_same(got, c2.pad.collate([ds[1], ds[0]]))
    tuples = ArrayDataset([Ragged(np.arange(5), [0, 2, 5])])
    with pytest.raises(TypeError, match="mapping samples"):
        c2(tuples.__getitems__([0]))


def test_lengths_for_the_length_grouped_sampler():
    ds = ArrayDataset({"ids": Ragged.from_sequences([[1, 2], [3], [], [4, 5, 6]]), "x": np.zeros((4, 3))})
    assert ds.lengths("ids").tolist() == [2, 1, 0, 3]
    assert ds.lengths("x").tolist() == [3, 3, 3, 3]
    s = fastcollate.LengthGroupedSampler(ds.lengths("ids"), batch_size=2, shuffle=False)
    assert sorted(i for b in s for i in b) == [0, 1, 2, 3]
