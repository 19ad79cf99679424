"""The compiled template of fixed-row datasets (csrc/python/gather_fixed.cpp): byte for byte the batch
of the planned gather and of default_collate; every index list it does not take (numpy ints,
bools, out of range, empty, not a list) goes to the planned path, whose result or error is the
library's rule; the template is built once per process and never pickled."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.data import default_collate

import fastcollate
from fastcollate import ArrayDataset, Collator, TokenWindows
from fastcollate.data import gather as gather_mod
from helpers import assert_same
from test_arrays import NP_DTYPES, random_array


def planned(collate_fn, batch, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(gather_mod, "_COMPILED", False)
        return collate_fn(batch)


def template_only(monkeypatch):
    """Makes the planned gather raise: whatever is gathered now came from the template."""
    def refuse(*args, **kwargs):
        raise AssertionError("the planned gather ran")
    monkeypatch.setattr(fastcollate._ext._C, "gather", refuse)


indices = st.lists(st.integers(-20, 19), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(NP_DTYPES), row=st.lists(st.integers(0, 4), max_size=3), idx=indices,
       tensor=st.booleans(), widen=st.sampled_from([None, torch.float32, torch.int64, torch.bfloat16]),
       mapping=st.booleans(), seed=st.integers(0, 2**16))
def test_template_equals_the_planned_gather_and_default_collate(dtype, row, idx, tensor, widen, mapping, seed):
    rng = np.random.default_rng(seed)
    a = random_array(rng, dtype, (20, *row))
    cols = {"a": torch.from_numpy(a) if tensor else a, "s": random_array(rng, np.float32, (20,)),
            "t": np.arange(20)[::-1]}
    dtypes = None if widen is None else {"a" if mapping else 0: widen}
    ds = ArrayDataset(cols if mapping else list(cols.values()), dtypes=dtypes)
    with pytest.MonkeyPatch.context() as mp:
        want_planned = planned(fastcollate.collate, ds.__getitems__(idx), mp)
        template_only(mp)
        got = fastcollate.collate(ds.__getitems__(idx))
    assert_same(got, want_planned)
    assert_same(got, default_collate([ds[i] for i in idx]))


@settings(max_examples=30, deadline=None)
@given(dtype=st.sampled_from([np.uint8, np.uint16, np.uint32, np.int32, np.int64]), seq_len=st.integers(1, 17),
       stride=st.one_of(st.none(), st.integers(1, 9)), out=st.sampled_from([torch.int64, torch.int32]),
       seed=st.integers(0, 2**16), data=st.data())
def test_token_windows_template(dtype, seq_len, stride, out, seed, data):
    rng = np.random.default_rng(seed)
    tokens = random_array(rng, dtype, (200,)) if dtype != np.int64 else rng.integers(-2**40, 2**40, 200)
    ds = TokenWindows(tokens, seq_len, stride=stride, dtype=out)
    idx = data.draw(st.lists(st.integers(-len(ds), len(ds) - 1), min_size=1, max_size=30))
    with pytest.MonkeyPatch.context() as mp:
        want = planned(Collator(), ds.__getitems__(idx), mp)
        template_only(mp)
        got = Collator()(ds.__getitems__(idx))
    assert_same(got, want)
    assert_same(got, default_collate([ds[i] for i in idx]))


def test_threaded_template_equals_one_thread(monkeypatch):
    rng = np.random.default_rng(1)
    ds = TokenWindows(rng.integers(0, 50000, 1 << 18).astype(np.uint16), 1024)
    idx = rng.integers(0, len(ds), 96).tolist()  # 1.5 MB of int64: split across threads
    template_only(monkeypatch)
    one, two = Collator(num_threads=1)(ds.__getitems__(idx)), Collator(num_threads=2)(ds.__getitems__(idx))
    assert_same(two, one)
    assert_same(two, default_collate([ds[i] for i in idx]))


@pytest.mark.parametrize("idx", [
    np.array([3, 1, -2]), [np.int64(3), 1], (3, 1), [True, False], torch.tensor([0, 2]), range(3), [0, 2**70],
])
def test_index_lists_the_template_leaves_to_the_planned_path(idx, monkeypatch):
    ds = ArrayDataset({"x": np.arange(12.0).reshape(6, 2), "y": np.arange(6)})
    try:
        want = planned(fastcollate.collate, ds.__getitems__(idx), monkeypatch)
    except Exception as exc:  # noqa: BLE001 - the planned path's error is the one to give
        with pytest.raises(type(exc), match=str(exc)[:40].replace("(", r"\(").replace(")", r"\)")):
            fastcollate.collate(ds.__getitems__(idx))
        return
    assert_same(fastcollate.collate(ds.__getitems__(idx)), want)


def test_out_of_range_and_empty_give_the_planned_paths_errors():
    ds = TokenWindows(np.arange(50, dtype=np.uint16), 4)
    for bad in ([0, len(ds)], [-len(ds) - 1, 0]):
        with pytest.raises(IndexError, match=rf"index {bad[0] if bad[0] < 0 else bad[-1]} is out of range"):
            fastcollate.collate(ds.__getitems__(bad))
    with pytest.raises(Exception) as theirs:
        default_collate(ds.__getitems__([]))
    with pytest.raises(type(theirs.value)):
        fastcollate.collate(ds.__getitems__([]))


def test_columns_the_template_cannot_read_are_planned():
    rng = np.random.default_rng(2)
    ragged = fastcollate.Ragged.from_sequences([rng.integers(0, 9, k) for k in (3, 3, 3, 3)])
    for ds in (ArrayDataset({"r": ragged, "x": np.zeros((4, 2))}),):
        assert gather_mod._template(ds.layout) is None
        out = fastcollate.collate(ds.__getitems__([0, 2]))
        assert_same(out, default_collate([ds[0], ds[2]]))
    padded = Collator(pad={"r": 0})
    ds = ArrayDataset({"r": ragged, "x": np.zeros((4, 2))})
    assert_same(padded(ds.__getitems__([1, 3])), padded([ds[1], ds[3]]))


def test_one_arena_from_the_pool_and_a_worker_alloc():
    ds = ArrayDataset({"x": np.ones((8, 4), np.float32), "y": np.arange(8)})
    out = fastcollate.collate(ds.__getitems__([1, 2, 3]))
    assert out["x"].untyped_storage().data_ptr() == out["y"].untyped_storage().data_ptr()
    assert out["x"].data_ptr() % 64 == 0 and out["y"].data_ptr() % 64 == 0
    arenas = []

    def alloc(n):
        arenas.append(torch.zeros(n + 128, dtype=torch.uint8))
        return arenas[-1]

    out = gather_mod._template(ds.layout)([5, 0], alloc, 1)
    assert len(arenas) == 1 and out["x"].untyped_storage().data_ptr() == arenas[0].untyped_storage().data_ptr()
    assert_same(out, default_collate([ds[5], ds[0]]))
    with pytest.raises(RuntimeError, match="arena allocator must return"):
        gather_mod._template(ds.layout)([1], lambda n: torch.zeros(4, dtype=torch.uint8), 1)


def test_template_is_built_once_and_never_pickled():
    ds = TokenWindows(np.arange(100, dtype=np.uint16), 8)
    t = gather_mod._template(ds.layout)
    assert gather_mod._template(ds.layout) is t
    copy = pickle.loads(pickle.dumps(ds))
    assert dict(copy.layout.compiled) == {}
    assert_same(fastcollate.collate(copy.__getitems__([3, 1])), default_collate([ds[3], ds[1]]))
    assert gather_mod._template(copy.layout) is not t


def test_memmap_columns_sharing_a_file_are_checked_once(tmp_path, monkeypatch):
    path = tmp_path / "t.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    ds = TokenWindows(np.memmap(path, dtype=np.uint16, mode="r"), 16)
    assert len(ds.layout.checked) == 1  # input_ids and labels read one array: one stat() per batch
    fastcollate.collate(ds.__getitems__([0, 1]))
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(RuntimeError, match="column 'input_ids'.*shorter than the 2000"):
        fastcollate.collate(ds.__getitems__([0, 1]))
