"""Random nested samples over the whole type table: the compiled engine, the reference and
default_collate agree exactly (types, dtypes, shapes, bytes)."""
import collections

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import default_collate

import fastcollate
from fastcollate import reference
from helpers import assert_same

Pair = collections.namedtuple("Pair", ["first", "second"])

TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
NP_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64,
             np.complex64]
shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)

# A schema says what every sample holds; each sample then gets its own values.
leaf_schema = st.one_of(
    st.tuples(st.just("tensor"), st.sampled_from(TORCH_DTYPES), shapes, st.sampled_from(["contig", "t", "slice", "conj"])),
    st.tuples(st.just("numpy"), st.sampled_from(NP_DTYPES), shapes, st.sampled_from(["contig", "t"])),
    st.tuples(st.just("npscalar"), st.sampled_from(NP_DTYPES)),
    st.tuples(st.just("py"), st.sampled_from(["float", "int", "bool", "str", "bytes"])),
)
keys = st.text("abcdefgh", min_size=1, max_size=3)
schema = st.recursive(
    leaf_schema,
    lambda inner: st.one_of(
        st.tuples(st.just("dict"), st.dictionaries(keys, inner, min_size=1, max_size=4)),
        st.tuples(st.just("list"), st.lists(inner, min_size=1, max_size=3)),
        st.tuples(st.just("tuple"), st.lists(inner, min_size=1, max_size=3)),
        st.tuples(st.just("pair"), st.tuples(inner, inner)),
    ),
    max_leaves=8,
)


def make(s, rng):
    kind = s[0]
    if kind == "tensor":
        _, dtype, shape, layout = s
        values = torch.from_numpy(np.asarray(rng.standard_normal(shape) * 50, dtype=np.float64))
        base = (values > 0) if dtype == torch.bool else values.to(dtype)
        if dtype.is_complex:
            base = base + 1j * torch.from_numpy(np.asarray(rng.standard_normal(shape))).to(dtype)
        if layout == "t" and base.dim() >= 2:
            base = base.transpose(0, 1).contiguous().transpose(0, 1)
        elif layout == "slice" and base.dim() >= 1:
            base = torch.cat([base, base], 0)[::2]
        elif layout == "conj" and dtype.is_complex:
            base = base.conj()
        return base
    if kind == "numpy":
        _, dtype, shape, layout = s
        arr = np.asarray(rng.standard_normal(shape) * 50).astype(dtype)
        if layout == "t" and arr.ndim >= 2:
            arr = np.asfortranarray(arr)
        return arr
    if kind == "npscalar":
        return np.asarray(abs(rng.standard_normal()) * 10).astype(s[1])[()]
    if kind == "py":
        t = s[1]
        return {"float": lambda: float(rng.standard_normal()), "int": lambda: int(rng.integers(-2**40, 2**40)),
                "bool": lambda: bool(rng.integers(0, 2)), "str": lambda: "s" * int(rng.integers(0, 4)),
                "bytes": lambda: b"b" * int(rng.integers(0, 4))}[t]()
    if kind == "dict":
        return {k: make(v, rng) for k, v in s[1].items()}
    if kind == "list":
        return [make(v, rng) for v in s[1]]
    if kind == "tuple":
        return tuple(make(v, rng) for v in s[1])
    if kind == "pair":
        return Pair(make(s[1][0], rng), make(s[1][1], rng))
    raise AssertionError(kind)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema, st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_random_batches_match_default_collate(s, batch_size, seed):
    rng = np.random.default_rng(seed)
    batch = [make(s, rng) for _ in range(batch_size)]
    want = default_collate(batch)
    assert_same(fastcollate.Collator(backend="cpp")(batch), want)
    assert_same(fastcollate.Collator(backend="cpp", num_threads=3)(batch), want)
    assert_same(reference.collate(batch), want, contiguous=False)
