"""One named case per row of default_collate's type table, and the corners around them:
the compiled engine, the Python reference and torch's default_collate must agree exactly."""
import collections
import types

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import fastcollate
from fastcollate import reference
from helpers import assert_same, tensor_leaves

Point = collections.namedtuple("Point", ["x", "y"])


class MyDict(dict):
    pass


class AttrDict(dict):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.tag = "kept"


class FrozenMapping(collections.abc.Mapping):
    def __init__(self, d):
        self._d = dict(d)

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)

    def __eq__(self, other):
        return type(other) is type(self) and self._d == other._d


class NoArgMapping(FrozenMapping):
    """Cannot be rebuilt from a dict: default_collate falls back to dict."""

    def __init__(self, d=None, *, _ok=False):
        if not _ok:
            raise TypeError("no")
        super().__init__(d or {})


class MyList(list):
    pass


class MySeq(collections.abc.Sequence):
    def __init__(self, items):
        self._items = list(items)

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self):
        return len(self._items)


g = torch.Generator().manual_seed(0)


def rand(*shape, dtype=torch.float32):
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(*shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.rand(*shape, generator=g) > 0.5
    return torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=g).to(dtype)


ALL_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
NP_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64,
             np.float16, np.float32, np.float64, np.complex64, np.complex128]


def _cases():
    c = {}
    for dt in ALL_DTYPES:
        c[f"tensor-{dt}"] = lambda dt=dt: [rand(3, 5, dtype=dt) for _ in range(4)]
    c["tensor-0d"] = lambda: [torch.tensor(float(i)) for i in range(5)]
    c["tensor-empty"] = lambda: [torch.zeros(0, 3) for _ in range(3)]
    c["tensor-noncontig"] = lambda: [rand(4, 6).t() for _ in range(3)]
    c["tensor-sliced"] = lambda: [rand(10)[::3] for _ in range(3)]
    c["tensor-channels-last"] = lambda: [rand(1, 3, 4, 4).contiguous(memory_format=torch.channels_last) for _ in range(2)]
    c["tensor-conj"] = lambda: [rand(3, dtype=torch.complex64).conj() for _ in range(3)]
    c["tensor-neg-bit"] = lambda: [rand(3, dtype=torch.complex64).conj().imag for _ in range(3)]
    c["tensor-mixed-dtypes"] = lambda: [rand(3, dtype=torch.uint8), rand(3), rand(3, dtype=torch.float64)]
    c["tensor-mixed-int-float"] = lambda: [rand(3), rand(3, dtype=torch.int32)]
    c["tensor-nan-bits"] = lambda: [torch.tensor([float("nan"), -0.0, float("inf")]) for _ in range(2)]
    c["tensor-requires-grad"] = lambda: [rand(3).requires_grad_() for _ in range(2)]
    c["tensor-parameter"] = lambda: [torch.nn.Parameter(rand(2)) for _ in range(2)]
    c["tensor-view-of-storage"] = lambda: list(rand(6, 4).unbind(0))
    for dt in NP_DTYPES:
        c[f"numpy-{dt.__name__}"] = lambda dt=dt: [(np.arange(6) % 2).astype(dt).reshape(2, 3) for _ in range(3)]
    c["numpy-noncontig"] = lambda: [np.arange(12, dtype=np.float32).reshape(3, 4).T for _ in range(2)]
    c["numpy-0d"] = lambda: [np.array(i, dtype=np.int16) for i in range(3)]
    c["numpy-readonly"] = lambda: [np.frombuffer(b"\x00\x01\x02\x03", dtype=np.uint8) for _ in range(2)]
    c["numpy-mixed-dtypes"] = lambda: [np.zeros(2, np.float32), np.ones(2, np.float64)]
    for dt in [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64,
               np.complex64, np.complex128, np.uint16, np.uint32, np.uint64, np.longlong]:
        c[f"npscalar-{dt.__name__}"] = lambda dt=dt: [dt(1), dt(0), dt(3)]
    c["npscalar-mixed"] = lambda: [np.float32(1), np.float64(2)]
    c["float"] = lambda: [0.5, -0.0, float("nan"), 1e300]
    c["float-then-int"] = lambda: [1.0, 2]
    c["int"] = lambda: [1, 2, -3, 2**62]
    c["int-then-float"] = lambda: [1, 2.5]
    c["bool"] = lambda: [True, False]
    c["bool-int"] = lambda: [True, 7]
    c["int-bool"] = lambda: [7, False]
    c["intenum"] = lambda: [__import__("enum").IntEnum("E", "A B")(1), 2]
    c["str"] = lambda: ["a", "bb", "ccc"]
    c["bytes"] = lambda: [b"a", b"b"]
    c["dict"] = lambda: [{"image": rand(3, 4), "label": i, "name": f"n{i}"} for i in range(4)]
    c["dict-subclass"] = lambda: [MyDict(a=rand(2), b=i) for i in range(3)]
    c["dict-subclass-attrs"] = lambda: [AttrDict(a=i) for i in range(3)]
    c["ordered-dict"] = lambda: [collections.OrderedDict([("z", i), ("a", float(i))]) for i in range(3)]
    c["defaultdict"] = lambda: [collections.defaultdict(list, {"x": rand(2)}) for _ in range(2)]
    c["mapping-immutable"] = lambda: [FrozenMapping({"x": rand(2), "y": i}) for i in range(3)]
    c["mapping-proxy"] = lambda: [types.MappingProxyType({"x": i}) for i in range(3)]
    c["mapping-unrebuildable"] = lambda: [NoArgMapping({"x": i}, _ok=True) for i in range(3)]
    c["dict-extra-keys-later"] = lambda: [{"a": 1}, {"a": 2, "b": 3}]
    c["dict-other-order"] = lambda: [{"a": 1, "b": 2.0}, {"b": 3.0, "a": 4}]
    c["dict-int-keys"] = lambda: [{0: rand(2), 1: 1.0}, {0: rand(2), 1: 2.0}]
    c["namedtuple"] = lambda: [Point(rand(2), i) for i in range(3)]
    c["tuple"] = lambda: [(rand(2), i, "s") for i in range(3)]
    c["list"] = lambda: [[rand(2), i] for i in range(3)]
    c["list-subclass"] = lambda: [MyList([i, float(i)]) for i in range(3)]
    c["custom-sequence"] = lambda: [MySeq([i, rand(1)]) for i in range(3)]
    c["range"] = lambda: [range(3), range(3)]
    c["tuple-of-str"] = lambda: [("a", 1), ("b", 2)]
    c["nested"] = lambda: [{"a": [{"b": (rand(2), np.float32(i))}, [i, "x"]], "c": Point(i, {"d": rand(1)})} for i in range(3)]
    c["deep"] = lambda: [[[[[[{"x": i}]]]]] for i in range(2)]
    c["single-sample"] = lambda: [{"x": rand(3)}]
    c["batch-is-tuple"] = lambda: tuple(rand(2) for _ in range(3))
    c["batch-of-str-top"] = lambda: ["only", "strings"]
    c["big-batch"] = lambda: [{"img": rand(3, 16, 16, dtype=torch.uint8), "y": i} for i in range(300)]
    return c


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_default_collate(name):
    batch = CASES[name]()
    try:
        want = default_collate(batch)
    except Exception as exc:  # rows torch rejects (e.g. numpy uint64 scalars): same class
        for impl in (fastcollate.Collator(backend="cpp"), reference.collate):
            with pytest.raises(type(exc)):
                impl(batch)
        return
    assert_same(fastcollate.Collator(backend="cpp")(batch), want)
    assert_same(reference.collate(batch), want, contiguous=False)


def test_compiled_backend_is_in_use():
    assert fastcollate.backend() == "cpp"
    assert fastcollate.Collator().backend == "cpp"


def test_top_level_str_batch_is_returned_as_is():
    batch = ["a", "b"]
    assert fastcollate.collate(batch) is default_collate(batch) is batch


def test_attributes_of_mapping_subclass_are_kept():
    out = fastcollate.collate([AttrDict(a=1), AttrDict(a=2)])
    assert type(out) is AttrDict and out.tag == "kept"


def test_every_tensor_leaf_is_a_view_of_one_aligned_arena():
    batch = [{"a": rand(3, 5), "b": i, "c": [rand(2, dtype=torch.float64), np.float16(i), True], "s": "x"}
             for i in range(7)]
    out = fastcollate.collate(batch)
    leaves = tensor_leaves(out)
    assert len(leaves) == 5
    base = leaves[0].untyped_storage().data_ptr()
    assert base % 64 == 0
    assert {t.untyped_storage().data_ptr() for t in leaves} == {base}
    for t in leaves:
        assert (t.data_ptr() - base) % 64 == 0
        assert t.is_contiguous()
    ends = sorted((t.data_ptr() - base, t.data_ptr() - base + t.numel() * t.element_size()) for t in leaves)
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:])), "leaves overlap"


def test_deferred_leaves_join_the_arena():
    # mixed dtypes go through torch.stack in the reference; the result is copied into the arena
    batch = [{"a": rand(3), "b": rand(2, dtype=torch.int32)}, {"a": rand(3, dtype=torch.float64), "b": rand(2, dtype=torch.int32)}]
    out = fastcollate.collate(batch)
    assert out["a"].untyped_storage().data_ptr() == out["b"].untyped_storage().data_ptr()
    assert_same(out, default_collate(batch))


def test_requires_grad_stays_outside_the_arena_with_its_graph():
    ts = [rand(2).requires_grad_() for _ in range(2)]
    out = fastcollate.collate([{"x": t, "y": 1} for t in ts])
    assert out["x"].requires_grad and out["x"].grad_fn is not None
    out["x"].sum().backward()
    assert torch.equal(ts[0].grad, torch.ones(2))


def test_outputs_do_not_alias_inputs():
    batch = [rand(4) for _ in range(3)]
    out = fastcollate.collate(batch)
    before = out.clone()
    for t in batch:
        t.fill_(7)
    assert torch.equal(out, before)


def test_custom_fn_map_entry_is_honoured():
    from torch.utils.data._utils.collate import default_collate_fn_map

    class Box:
        def __init__(self, v):
            self.v = v

    default_collate_fn_map[Box] = lambda batch, *, collate_fn_map: sum(b.v for b in batch)
    try:
        batch = [{"box": Box(1), "t": rand(2)}, {"box": Box(2), "t": rand(2)}]
        assert_same(fastcollate.collate(batch), default_collate(batch))
        assert fastcollate.collate(batch)["box"] == 3
    finally:
        del default_collate_fn_map[Box]
    assert reference.fn_map_is_stock()


import enum  # noqa: E402


class Color(enum.IntEnum):
    RED = 1


def _fused_cases():
    """Samples whose simple columns go through the sample-major pass, with a column that goes
    off its pattern part-way (it must be redone by the column walk, the others kept)."""
    B = 9

    def t(i, dtype=torch.float32):
        return torch.full((2, 3), float(i), dtype=dtype)

    cases = {}
    cases["dict-all-simple"] = [{"a": t(i), "f": i / 3, "n": i, "b": i % 2 == 0} for i in range(B)]
    cases["dict-dtype-changes-at-5"] = [{"a": t(i, torch.float64 if i == 5 else torch.float32), "n": i} for i in range(B)]
    cases["dict-shape-error-at-4"] = [{"a": torch.zeros(2 if i != 4 else 3), "f": 1.0} for i in range(B)]
    cases["dict-int-then-enum"] = [{"n": Color.RED if i == 3 else i, "a": t(i)} for i in range(B)]
    cases["dict-int-then-float"] = [{"n": 2.5 if i == 6 else i, "a": t(i)} for i in range(B)]
    cases["dict-float-then-int"] = [{"f": 7 if i == 2 else i + 0.5, "a": t(i)} for i in range(B)]
    cases["dict-bools-then-int"] = [{"b": 3 if i == 8 else bool(i % 2), "a": t(i)} for i in range(B)]
    cases["dict-int-overflow"] = [{"n": 2**70 if i == 1 else i, "a": t(i)} for i in range(B)]
    cases["dict-not-a-tensor-at-7"] = [{"a": 1.0 if i == 7 else t(i), "n": i} for i in range(B)]
    cases["dict-strided-and-conj"] = [{"a": torch.randn(3, 4).t(), "c": torch.randn(2, dtype=torch.cfloat).conj()}
                                      for _ in range(B)]
    cases["dict-requires-grad-at-2"] = [{"a": torch.ones(2, requires_grad=(i == 2)), "n": i} for i in range(B)]
    cases["tuple-mixed"] = [(t(i), i, i * 0.25, f"s{i}") for i in range(B)]
    cases["tuple-dtype-changes"] = [(t(i, torch.int32 if i == 3 else torch.int64), i) for i in range(B)]
    cases["empty-tensors"] = [{"a": torch.zeros(0, 3), "n": i} for i in range(B)]
    return cases


FUSED = _fused_cases()


@pytest.mark.parametrize("name", sorted(FUSED))
def test_sample_major_pass_matches_default_collate(name):
    batch = FUSED[name]
    try:
        want = default_collate(batch)
    except Exception as exc:
        with pytest.raises(type(exc)):
            fastcollate.collate(batch)
        return
    got = fastcollate.collate(batch)
    assert_same(got, want)
    assert_same(reference.collate(batch), want)


def _cl(*shape, fmt=torch.channels_last):
    return torch.rand(*shape).contiguous(memory_format=fmt)


FORMATS = {
    "channels-last": lambda: [_cl(2, 3, 4, 5) for _ in range(4)],
    "channels-last-n1": lambda: [_cl(1, 3, 4, 5) for _ in range(4)],
    "channels-last-3d": lambda: [_cl(2, 3, 2, 4, 5, fmt=torch.channels_last_3d) for _ in range(3)],
    "mixed-formats": lambda: [_cl(2, 3, 4, 5) if i != 2 else torch.rand(2, 3, 4, 5) for i in range(4)],
    "dict-channels-last": lambda: [{"x": _cl(2, 3, 4, 5), "y": i} for i in range(4)],
    "tuple-channels-last": lambda: [(_cl(2, 3, 4, 5), 1.5) for i in range(4)],
    "permuted-3d-hwc": lambda: [torch.randint(0, 255, (6, 5, 3), dtype=torch.uint8).permute(2, 0, 1) for _ in range(4)],
    "channels-last-strided-view": lambda: [_cl(2, 3, 4, 6)[..., ::2] for _ in range(3)],
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_memory_format_is_default_collates(name):
    """Strides, not only values: outside a worker torch.stack keeps channels_last samples
    channels_last (cat + view), everything else comes back contiguous."""
    batch = FORMATS[name]()
    want = default_collate(batch)
    got = fastcollate.collate(batch)
    assert_same(got, want)  # compares strides too
    for t in tensor_leaves(got):
        assert t.untyped_storage().data_ptr() == tensor_leaves(got)[0].untyped_storage().data_ptr()


def test_channels_last_batches_move_in_one_copy():
    from fastcollate.device.transport import find_arena

    batch = fastcollate.collate([{"x": _cl(2, 3, 4, 5), "y": i} for i in range(4)])
    assert batch["x"].stride() != batch["x"].contiguous().stride()
    found = find_arena(batch)
    assert found is not None and found[1] >= batch["x"].numel() * 4


def _hwc(h, w, c, dtype=torch.uint8):
    return (torch.rand(h, w, c) * 200).to(dtype).permute(2, 0, 1)  # what PILToTensor / ToImage return


STRIDED = {
    "pil-uint8-3ch": lambda: [_hwc(13, 11, 3) for _ in range(5)],             # 143 pixels: SIMD + tail
    "pil-uint8-3ch-large": lambda: [_hwc(224, 224, 3) for _ in range(8)],  # > 1 MB: threaded
    "pil-uint8-1ch": lambda: [_hwc(6, 5, 1) for _ in range(3)],                # contiguous after all
    "pil-uint8-4ch": lambda: [_hwc(7, 9, 4) for _ in range(3)],
    "pil-float32": lambda: [_hwc(5, 6, 3, torch.float32) for _ in range(3)],
    "pil-int16": lambda: [_hwc(5, 6, 3, torch.int16) for _ in range(3)],
    "pil-float64": lambda: [_hwc(3, 4, 2, torch.float64) for _ in range(3)],
    "transposed-2d": lambda: [torch.rand(70, 90).t() for _ in range(3)],
    "step-slice": lambda: [torch.rand(8, 10)[:, ::2] for _ in range(3)],      # not a transpose: ATen copies
    "permute-4d": lambda: [torch.rand(2, 3, 4, 5).permute(0, 3, 1, 2) for _ in range(3)],
    "three-way-permute": lambda: [torch.rand(3, 4, 5).permute(2, 0, 1).contiguous().permute(1, 0, 2) for _ in range(3)],
    "dict-pil": lambda: [{"image": _hwc(9, 9, 3), "label": i} for i in range(4)],
    "tuple-pil": lambda: [(_hwc(9, 9, 3), i) for i in range(4)],
    "mixed-strided-and-contiguous": lambda: [_hwc(4, 5, 3) if i % 2 else _hwc(4, 5, 3).contiguous() for i in range(4)],
}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name", sorted(STRIDED))
def test_strided_sources_copied_by_the_engine_equal_stack(name, threads):
    batch = STRIDED[name]()
    want = default_collate(batch)
    assert_same(fastcollate.Collator(num_threads=threads)(batch), want)


def test_equal_keys_built_per_sample_of_every_string_kind():
    # keys made anew per sample (f-strings, decoded text): equal strings, distinct objects, of
    # 1-, 2- and 4-byte code units; and a near-miss of the same length
    names = ["plain", "caf\u00e9", "\u6f22\u5b57", "emoji\U0001f600"]
    batch = [{"".join(list(n)) + str(j % 1): torch.full((2,), float(i)) for j, n in enumerate(names)}
             for i in range(5)]
    assert_same(fastcollate.collate(batch), default_collate(batch))
    odd = [dict(s) for s in batch]
    odd[3] = {("caf\u00e8" + "0" if k.startswith("caf") else k): v for k, v in odd[3].items()}
    with pytest.raises(KeyError):
        default_collate(odd)
    with pytest.raises(KeyError):
        fastcollate.collate(odd)


class _Seq(collections.abc.Sequence):
    def __init__(self, items):
        self.items = list(items)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


_TOP = [torch.full((2,), float(i)) for i in range(3)]
TOP_LEVEL = {  # the batch itself as a __getitems__ may return it: what default_collate does with each
    "stacked tensor": torch.stack(_TOP), "tensor of scalars": torch.arange(3), "deque of tensors": collections.deque(_TOP),
    "Sequence of tensors": _Seq(_TOP), "tuple of tensors": tuple(_TOP), "2-d array": np.ones((3, 2)),
    "Sequence of ints": _Seq([1, 2, 3]), "Sequence of dicts": _Seq([{"a": t} for t in _TOP]),
    "deque of arrays": collections.deque([np.ones(2)] * 3),
}


@pytest.mark.parametrize("name", sorted(TOP_LEVEL))
@pytest.mark.parametrize("backend", ["cpp", "python"])
def test_a_batch_that_is_not_a_list_is_refused_or_collated_as_torch_does(name, backend):
    # torch.stack takes a list or a tuple only: a batch of tensors in anything else (a
    # __getitems__ that returns one stacked tensor) is a TypeError in default_collate
    batch = TOP_LEVEL[name]
    collate = fastcollate.Collator(backend=backend)
    try:
        want = default_collate(batch)
    except Exception as exc:
        with pytest.raises(type(exc), match="must be a list or tuple of samples"):
            collate(batch)
    else:
        assert_same(collate(batch), want)
