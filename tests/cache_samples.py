"""The samples the cache tests send through fastcollate.Cached: every kind the codec stores (tensor
views, memory formats, flags; numpy layouts and dtypes; Python objects; buffers other reductions
offer: PickleBuffer, PEP 574, pyarrow), each with what a hit must equal. Deterministic, and
importable by workers, which rebuild them to check what they read (tests/test_cache.py,
tests/test_cache_isolation.py)."""
from __future__ import annotations

import collections
import dataclasses
import decimal
import fractions
import pickle

import numpy as np
import torch


@dataclasses.dataclass
class Record:
    name: str
    values: list


NT = collections.namedtuple("NT", ["a", "b"])


class ZeroCopyBytes(bytearray):
    """PEP 574's example class: pickled out of band, rebuilt around the buffer it is given."""

    def __reduce_ex__(self, protocol):
        if protocol >= 5:
            return type(self)._reconstruct, (pickle.PickleBuffer(self),), None
        return type(self)._reconstruct, (bytearray(self),)

    @classmethod
    def _reconstruct(cls, obj):
        with memoryview(obj) as m:
            obj = m.obj
            return obj if type(obj) is cls else cls(obj)


class Holder:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __eq__(self, other):
        return type(other) is Holder and vars(self).keys() == vars(other).keys()


def _with_attr(t: torch.Tensor) -> torch.Tensor:
    t.note = bytearray(b"attr")
    return t


def kinds() -> dict[str, tuple]:
    """name -> (sample, what a hit must equal: None for the sample itself)."""
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    big = torch.arange(100_000, dtype=torch.float32).reshape(1000, 100)
    ro = np.arange(6.0).reshape(2, 3)
    ro.flags.writeable = False
    with torch.inference_mode():
        inference = torch.ones(3)
    shared = torch.arange(3)
    loop: list = [1]
    loop.append(loop)
    wbuf, rbuf = bytearray(b"writable bytes"), b"read-only bytes"
    samples = {
        "tensor": torch.randn(4, 5, generator=g),
        "row of a big tensor": big[7],
        "column view": big[:, 3],
        "transposed": big[:4].t(),
        "channels_last": torch.randn(2, 3, 4, 5, generator=g).contiguous(memory_format=torch.channels_last),
        "expanded": torch.ones(3, 1).expand(3, 7),
        "offset view": torch.arange(10)[3:],
        "0-d": torch.tensor(2.5, dtype=torch.float64),
        "empty with strides": torch.empty(0, 3).as_strided((0, 3), (7, 2)),
        "bool": torch.tensor([True, False]),
        "bfloat16 nan": torch.tensor([float("nan"), -0.0], dtype=torch.bfloat16),
        "float8": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
        "complex conj": torch.randn(3, dtype=torch.complex64, generator=g).conj(),
        "neg view": torch._neg_view(torch.randn(3, generator=g)),
        "requires_grad leaf": torch.randn(3, generator=g).requires_grad_(True),
        "inference": inference,
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "tensor with attributes": _with_attr(torch.zeros(3)),
        "uint16": torch.arange(5).to(torch.uint16),
        "numpy": rng.standard_normal((3, 4)),
        "numpy F": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "numpy strided": np.arange(40.0).reshape(5, 8)[::2, 1::3],
        "numpy negative strides": np.arange(12.0).reshape(3, 4)[::-1, ::-2],
        "numpy big-endian": np.arange(5, dtype=">i4"),
        "numpy read-only": ro,
        "numpy structured": np.array([(1, 2.5), (3, -1.0)], dtype=[("a", "<i4"), ("b", ">f8")]),
        "numpy empty": np.zeros((2, 0, 3))[:, :, ::2],
        "numpy 0-d": np.array(3.5),
        "numpy scalars": [np.float32("nan"), np.int8(-3), np.bool_(True), np.complex128(1 - 2j)],
        "strings": np.array(["ab", "c"]),
        "python": {"int": 2**70, "float": float("nan"), "neg0": -0.0, "str": "é", "bytes": b"\x00",
                   "none": None, "tuple": (1, (2, 3)), "set": {1, 2}, "frozenset": frozenset("ab"),
                   "complex": complex(1, float("inf")), "decimal": decimal.Decimal("1.10"),
                   "fraction": fractions.Fraction(1, 3), "bytearray": bytearray(b"xy" * 50)},
        "containers": collections.OrderedDict(b=[NT(1, torch.ones(2)), Record("r", [1.5])], a=collections.deque([1])),
        "PEP 574 class": ZeroCopyBytes(b"zero copy"),
        "nested": {"a": [torch.arange(4), np.arange(3), bytearray(b"q")], "b": collections.deque([{"c": 1}]),
                   "h": Holder(t=torch.ones(2), items=[1, 2])},
        "one object twice": [shared, shared, {"again": shared}],
        "self-referencing list": loop,
    }
    out = {name: (sample, None) for name, sample in samples.items()}
    out["PickleBuffer"] = (pickle.PickleBuffer(wbuf), bytearray(wbuf))  # as pickle gives it: a bytearray
    out["read-only PickleBuffer"] = (pickle.PickleBuffer(rbuf), rbuf)  # ... and bytes
    try:
        import pyarrow as pa
    except ImportError:
        return out
    out["pyarrow array"] = (pa.array([1, 2, 3], pa.int64()), None)
    out["pyarrow strings"] = (pa.array(["x", None, "zz"]), None)
    out["pyarrow table"] = (pa.table({"a": [1.5, 2.5], "b": ["x", "y"], "c": [[1, 2], [3]]}), None)
    out["pyarrow slice"] = (pa.array(np.arange(100, dtype=np.int32)).slice(10, 5), None)
    out["pyarrow in a dict"] = ({"t": pa.table({"k": [7]}), "n": np.ones(2)}, None)
    return out


def expected(name: str, samples: dict) -> object:
    """What a hit of sample ``name`` must equal."""
    sample, want = samples[name]
    return sample if want is None else want
