"""Padding collate: the compiled engine against the pure-Python reference (pad_sequence and
explicit masks) bit for bit; worker mode; errors; the length-grouped sampler."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

import fastcollate
from fastcollate.data.sampler import LengthGroupedSampler, padding_fraction
from helpers import assert_same, tensor_leaves

DTYPES = [torch.int64, torch.int32, torch.uint8, torch.float32, torch.float16, torch.bfloat16, torch.bool]


def both(**kw):
    return fastcollate.Collator(backend="cpp", **kw), fastcollate.Collator(backend="python", **kw)


def make(kind, length, dtype, trailing, rng):
    vals = rng.integers(0, 100, size=(length, *trailing))
    if kind == "list":
        if dtype == torch.bool:
            return [bool(v) for v in (vals % 2).reshape(-1)]
        if dtype.is_floating_point:
            return [float(v) / 7 for v in vals.reshape(-1)]
        return [int(v) for v in vals.reshape(-1)]
    t = torch.from_numpy(vals).to(dtype) if dtype != torch.bool else torch.from_numpy(vals % 2 == 1)
    if kind == "numpy":
        return t.numpy() if dtype != torch.bfloat16 else t.float().numpy()
    return t


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=7),
    kind=st.sampled_from(["tensor", "numpy", "list"]),
    dtype=st.sampled_from(DTYPES),
    trailing=st.sampled_from([(), (3,), (2, 2)]),
    side=st.sampled_from(["right", "left"]),
    multiple=st.sampled_from([None, 1, 4]),
    max_length=st.sampled_from([None, 0, 1, 8]),
    mask_dtype=st.sampled_from([torch.int64, torch.bool]),
    seed=st.integers(0, 2**31),
)
def test_engine_equals_reference(lengths, kind, dtype, trailing, side, multiple, max_length, mask_dtype, seed):
    if kind == "list":
        trailing = ()
        dtype = {torch.bool: torch.bool, torch.float32: torch.float32}.get(dtype, torch.int64)
    if multiple == 4 and max_length not in (None, 0, 8):
        max_length = 8
    pad_value = 0 if dtype in (torch.bool, torch.uint8) else -3
    rng = np.random.default_rng(seed)
    batch = [{"ids": make(kind, n, dtype, trailing, rng), "y": i, "s": "x"} for i, n in enumerate(lengths)]
    kw = dict(pad={"ids": pad_value}, padding_side=side, pad_to_multiple_of=multiple, max_length=max_length,
              mask_dtype=mask_dtype, lengths_key="lengths")
    fast, ref = both(**kw)
    got, want = fast(batch), ref(batch)
    assert_same(got, want)
    # the reference itself against a direct construction
    seqs = [torch.as_tensor(b["ids"]) if kind != "list" else torch.tensor(b["ids"], dtype=got["ids"].dtype) for b in batch]
    if kind == "list" and all(len(b["ids"]) == 0 for b in batch):
        seqs = [s.to(torch.int64) for s in seqs]
    if max_length is not None:
        seqs = [s[:max_length] for s in seqs]
    L = got["ids"].shape[1]
    for i, s in enumerate(seqs):
        n = s.shape[0]
        row = got["ids"][i]
        real = row[:n] if side == "right" else row[L - n:]
        assert torch.equal(real, s.to(row.dtype))
        assert int(got["lengths"][i]) == n
        assert got["attention_mask"][i].sum().item() == n
    if multiple:
        assert L % multiple == 0
    # every leaf, padded ones and masks included, in the one arena
    assert len({t.untyped_storage().data_ptr() for t in tensor_leaves(got)}) == 1


def test_hf_style_tokenizer_output():
    batch = [{"input_ids": [101, 7, 8, 102], "labels": [7, 8, 9, 10]}, {"input_ids": [101, 102], "labels": [1, 2]}]
    out = fastcollate.Collator(pad={"input_ids": 0, "labels": -100})(batch)
    assert out["input_ids"].tolist() == [[101, 7, 8, 102], [101, 102, 0, 0]]
    assert out["labels"].tolist() == [[7, 8, 9, 10], [1, 2, -100, -100]]
    assert out["attention_mask"].dtype == torch.int64
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert list(out) == ["input_ids", "labels", "attention_mask"]


def test_matches_pad_sequence_pattern():
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 1000, (n,), generator=g) for n in (5, 0, 1, 9)]
    out = fastcollate.Collator(pad={"x": 3})([{"x": s} for s in seqs])
    assert torch.equal(out["x"], pad_sequence(seqs, batch_first=True, padding_value=3))
    lengths = torch.tensor([len(s) for s in seqs])
    assert torch.equal(out["attention_mask"], (torch.arange(9)[None] < lengths[:, None]).long())


def test_non_contiguous_and_mixed_sources():
    base = torch.arange(40).view(10, 4)
    batch = [{"x": base[:, 1]}, {"x": [1, 2]}, {"x": np.array([5, 6, 7], dtype=np.int64)}]
    fast, ref = both(pad={"x": -1})
    assert_same(fast(batch), ref(batch))


def test_worker_mode_through_a_dataloader():
    data = [{"ids": list(range(n)), "y": float(n)} for n in [3, 0, 5, 1, 2, 7, 4]]
    c = fastcollate.Collator(pad={"ids": 0})
    for a, b in zip(DataLoader(data, batch_size=3, num_workers=2, collate_fn=c),
                    DataLoader(data, batch_size=3, collate_fn=fastcollate.Collator(pad={"ids": 0}, backend="python"))):
        assert_same(a, b)
        assert all(t.is_shared() for t in tensor_leaves(a))


@pytest.mark.parametrize("impl", ["cpp", "python"])
@pytest.mark.parametrize("batch,kw,err,needles", [
    ([{"x": torch.zeros(2, 3)}, {"x": torch.zeros(4, 2)}], {}, RuntimeError, ["batch['x']", "sample 1", "[2]", "[3]"]),
    ([{"x": [1, 2]}, {"y": [1]}], {}, KeyError, ["sample 1", "'x'"]),
    ([{"y": 1}], {}, KeyError, ["sample 0", "'x'"]),
    ([{"x": 5}, {"x": 6}], {}, TypeError, ["batch['x']", "sample 0", "int"]),
    ([{"x": "abc"}, {"x": "d"}], {}, TypeError, ["sample 0", "str"]),
    ([{"x": torch.tensor(3)}], {}, TypeError, ["0-d"]),
    ([{"x": [[1], [2]]}], {}, TypeError, ["flat list"]),
    ([{"x": torch.zeros(2)}, {"x": torch.zeros(2, dtype=torch.int64)}], {}, TypeError, ["sample 1", "dtype"]),
    ([{"x": torch.zeros(2, dtype=torch.uint8)}], {"pad": {"x": -100}}, ValueError, ["-100", "uint8"]),
    ([[1, 2], [3]], {}, TypeError, ["mapping"]),
    ([], {}, IndexError, ["empty"]),
    ([{"x": [1], "attention_mask": 1}], {}, ValueError, ["attention_mask"]),  # carried, but not a sequence
    ([{"x": [2**70]}], {}, RuntimeError, []),
])
def test_errors(impl, batch, kw, err, needles):
    kw = {"pad": {"x": 0}, **kw}
    c = fastcollate.Collator(backend=impl, **kw)
    with pytest.raises(Exception) as info:
        c(batch)
    if not needles:  # torch's own overflow error: the same class from both backends
        with pytest.raises(type(info.value)):
            fastcollate.Collator(backend="python", **kw)(batch)
        return
    assert isinstance(info.value, err), repr(info.value)
    for n in needles:
        assert n in str(info.value), (n, str(info.value))


def test_bad_pad_arguments():
    for kw, match in [({"pad": {}}, "non-empty"), ({"pad": {"x": "0"}}, "int or float"),
                      ({"pad": {"x": 0}, "pad_to_multiple_of": 0}, "pad_to_multiple_of"),
                      ({"pad": {"x": 0}, "max_length": 10, "pad_to_multiple_of": 4}, "multiple"),
                      ({"pad": {"x": 0}, "padding_side": "up"}, "padding_side"),
                      ({"pad": {"x": 0}, "mask_key": "x"}, "differ"),
                      ({"pad": {"x": 0}, "mask_dtype": torch.float32}, "mask_dtype")]:
        with pytest.raises(ValueError, match=match):
            fastcollate.Collator(**kw)


def test_empty_sequences_everywhere():
    out = fastcollate.Collator(pad={"x": 0})([{"x": []}, {"x": []}])
    assert out["x"].shape == (2, 0) and out["x"].dtype == torch.int64 and out["attention_mask"].shape == (2, 0)


def test_length_grouped_sampler_deterministic_and_complete():
    rng = np.random.default_rng(0)
    lengths = rng.integers(16, 513, size=1000).tolist()
    s = LengthGroupedSampler(lengths, 32, seed=3)
    a, b = list(s), list(s)
    assert a == b
    s.set_epoch(1)
    assert list(s) != a
    assert sorted(i for batch in a for i in batch) == list(range(1000))
    assert len(s) == len(a)
    random_batches = [list(range(i, min(i + 32, 1000))) for i in range(0, 1000, 32)]
    assert padding_fraction(lengths, a) < 0.25 * padding_fraction(lengths, random_batches)


def test_length_grouped_sampler_ddp_ranks_disjoint_and_even():
    lengths = list(range(1, 103))
    ranks = [LengthGroupedSampler(lengths, 8, seed=1, num_replicas=3, rank=r) for r in range(3)]
    seen = [list(r) for r in ranks]
    assert len({len(x) for x in seen}) == 1 and all(len(x) == len(r) for x, r in zip(seen, ranks))
    covered = {i for x in seen for b in x for i in b}
    assert covered == set(range(102))
    dropped = [list(LengthGroupedSampler(lengths, 8, seed=1, num_replicas=3, rank=r, drop_last=True)) for r in range(3)]
    flat = [i for x in dropped for b in x for i in b]
    assert len(flat) == len(set(flat)), "drop_last: no sample twice"
    with pytest.raises(ValueError, match="rank"):
        LengthGroupedSampler(lengths, 8, num_replicas=2, rank=2)


EMPTY_CASES = {
    "float-empty-among-int64": ([torch.tensor([1, 2, 3]), torch.tensor([]), torch.tensor([4])], torch.int64),
    "empty-tensor-among-lists": ([[1, 2], torch.tensor([])], torch.int64),
    "empty-first-then-list": ([torch.tensor([]), [1, 2]], torch.int64),
    "empty-1d-among-2d": ([torch.zeros(0, 4), torch.ones(2, 4), torch.tensor([])], torch.float32),
    "all-empty": ([torch.tensor([]), torch.tensor([], dtype=torch.int64)], torch.float32),
    "empty-list-among-floats": ([torch.tensor([0.5, 1.5]), []], torch.float32),
}


@pytest.mark.parametrize("name", sorted(EMPTY_CASES))
def test_an_empty_sequence_carries_no_dtype(name):
    seqs, dtype = EMPTY_CASES[name]
    batch = [{"ids": s, "i": i} for i, s in enumerate(seqs)]
    ours = fastcollate.Collator(pad={"ids": -1})(batch)
    ref = fastcollate.Collator(pad={"ids": -1}, backend="python")(batch)
    assert_same(ours, ref)
    assert ours["ids"].dtype == dtype
    fastcollate.reset_stats()
    fastcollate.Collator(pad={"ids": -1})(batch)
    assert fastcollate.stats()["deferred_leaves"] == 0  # the engine wrote it, not the reference


def test_non_empty_mixed_dtypes_are_still_refused():
    batch = [{"ids": torch.tensor([1.5])}, {"ids": torch.tensor([1])}]
    for backend in ("cpp", "python"):
        with pytest.raises(TypeError, match="sample 1 has dtype torch.int64, sample 0 has torch.float32"):
            fastcollate.Collator(pad={"ids": 0}, backend=backend)(batch)
