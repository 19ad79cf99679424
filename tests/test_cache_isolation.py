"""A cache hit never aliases the cache (issue #33, "speed never changes what the loop sees"): for a
broad set of samples, every hit is read, every mutable thing reachable from it is changed in
place, and the next hit still equals the dataset's first fetch exactly (helpers.assert_identical)
-- in the main process, and in forked DataLoader workers whose transform mutates what it gets.

The routes by which ``pickle.loads(..., buffers=...)`` could hand back an object whose memory is an
out-of-band buffer, and so the cache itself: ``pickle.PickleBuffer`` (comes back as the buffer
object), PEP 574 classes (``_reconstruct`` keeps ``memoryview(buf).obj``), pyarrow buffers, arrays
and tables (``py_buffer(buf)`` wraps it), numpy's own ndarray reduction (``frombuffer``). The codec
sends only its own tensor/ndarray buffers out of band (their reconstructors copy); numpy scalars,
ndarray subclasses and object arrays never reach numpy's buffer path (in-band bytes, or refused)."""
from __future__ import annotations

import collections
import ctypes
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastcollate
from fastcollate import _ext
from helpers import assert_identical

C = _ext._C


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


def broad_samples() -> dict[str, tuple]:
    """name -> (sample, what a hit must equal: the sample itself, or None for that). Deterministic:
    forked workers rebuild it to check what they read."""
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    big = torch.arange(20_000, dtype=torch.float32).reshape(200, 100)
    ro = np.arange(6.0).reshape(2, 3)
    ro.flags.writeable = False
    with torch.inference_mode():
        inference = torch.ones(3)
    shared = torch.arange(3)
    loop: list = [1]
    loop.append(loop)
    wbuf, rbuf = bytearray(b"writable bytes"), b"read-only bytes"
    out = {
        "tensor": (torch.randn(4, 5, generator=g), None),
        "row of a big tensor": (big[7], None),
        "column view": (big[:, 3], None),
        "transposed": (big[:4].t(), None),
        "channels_last": (torch.randn(2, 3, 4, 5, generator=g).contiguous(memory_format=torch.channels_last), None),
        "expanded": (torch.ones(3, 1).expand(3, 7), None),
        "complex conj": (torch.randn(3, dtype=torch.complex64, generator=g).conj(), None),
        "neg view": (torch._neg_view(torch.randn(3, generator=g)), None),
        "requires_grad leaf": (torch.randn(3, generator=g).requires_grad_(True), None),
        "inference": (inference, None),
        "parameter": (torch.nn.Parameter(torch.ones(2)), None),
        "tensor with attributes": (_with_attr(torch.zeros(3)), None),
        "ndarray": (rng.standard_normal((3, 4)), None),
        "ndarray F": (np.asfortranarray(np.arange(12.0).reshape(3, 4)), None),
        "ndarray strided": (np.arange(40.0).reshape(5, 8)[::2, 1::3], None),
        "ndarray negative strides": (np.arange(12.0).reshape(3, 4)[::-1, ::-2], None),
        "ndarray read-only": (ro, None),
        "ndarray structured": (np.array([(1, 2.5), (3, -1.0)], dtype=[("a", "<i4"), ("b", ">f8")]), None),
        "ndarray strings": (np.array(["ab", "c"]), None),
        "numpy scalars": ([np.float32(1.5), np.int8(-3), np.bool_(True), np.complex128(1 - 2j)], None),
        "bytearray": (bytearray(b"abc" * 50), None),
        "PickleBuffer": (pickle.PickleBuffer(wbuf), bytearray(wbuf)),  # as pickle gives it: a bytearray
        "read-only PickleBuffer": (pickle.PickleBuffer(rbuf), rbuf),  # ... and bytes
        "PEP 574 class": (ZeroCopyBytes(b"zero copy"), None),
        "nested": ({"a": [torch.arange(4), np.arange(3), bytearray(b"q")], "b": collections.deque([{"c": 1}]),
                    "h": Holder(t=torch.ones(2), items=[1, 2])}, None),
        "one object twice": ([shared, shared, {"again": shared}], None),
        "self-referencing list": (loop, None),
    }
    try:
        import pyarrow as pa
    except ImportError:
        pass
    else:
        out["pyarrow array"] = (pa.array([1, 2, 3], pa.int64()), None)
        out["pyarrow strings"] = (pa.array(["x", None, "zz"]), None)
        out["pyarrow table"] = (pa.table({"a": [1.5, 2.5], "b": ["x", "y"], "c": [[1, 2], [3]]}), None)
        out["pyarrow slice"] = (pa.array(np.arange(100, dtype=np.int32)).slice(10, 5), None)
        out["pyarrow in a dict"] = ({"t": pa.table({"k": [7]}), "n": np.ones(2)}, None)
    return out


def _with_attr(t):
    t.note = bytearray(b"attr")
    return t


def expected(name: str, samples: dict) -> object:
    sample, want = samples[name]
    return sample if want is None else want


# ---- changing everything a sample reaches, in place ----------------------------------------------

def _flip(address: int, nbytes: int) -> None:
    if nbytes:
        raw = (ctypes.c_uint8 * nbytes).from_address(address)
        view = np.frombuffer(raw, np.uint8)
        view ^= 0xA5


def mutate(obj, seen=None) -> None:
    """Changes in place every byte and container reachable from obj that can be changed."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        _flip(storage.data_ptr(), storage.nbytes())  # every byte the tensor may read: as add_ would
        if vars(obj):
            mutate(vars(obj), seen)
    elif isinstance(obj, np.ndarray):
        if obj.flags.writeable and obj.size:
            lo = sum((n - 1) * s for n, s in zip(obj.shape, obj.strides) if s < 0)
            hi = sum((n - 1) * s for n, s in zip(obj.shape, obj.strides) if s > 0)
            _flip(obj.__array_interface__["data"][0] + lo, hi - lo + obj.itemsize)
    elif isinstance(obj, bytearray):
        obj[:] = bytes(b ^ 0xA5 for b in obj) + b"!"
    elif isinstance(obj, (memoryview, pickle.PickleBuffer)):
        view = memoryview(obj)
        if not view.readonly and view.nbytes:
            np.frombuffer(view.cast("B"), np.uint8)[:] ^= 0xA5
    elif type(obj).__module__.startswith("pyarrow"):
        _mutate_arrow(obj)
    elif isinstance(obj, dict):
        for v in list(obj.values()):
            mutate(v, seen)
        obj["mutated"] = True
    elif isinstance(obj, (list, collections.deque)):
        for v in list(obj):
            mutate(v, seen)
        obj.append("mutated")
    elif isinstance(obj, set):
        obj.add("mutated")
    elif isinstance(obj, tuple):
        for v in obj:
            mutate(v, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        mutate(vars(obj), seen)
        obj.mutated = True


def _mutate_arrow(obj) -> None:
    import pyarrow as pa

    if isinstance(obj, pa.Table):
        arrays = [chunk for column in obj.columns for chunk in column.chunks]
    elif isinstance(obj, pa.ChunkedArray):
        arrays = list(obj.chunks)
    elif isinstance(obj, pa.Array):
        arrays = [obj]
    else:
        return
    for array in arrays:  # the values (the last buffer): changing offsets would make reads go astray
        buf = [b for b in array.buffers() if b is not None][-1]
        if buf.is_mutable and buf.size:
            np.frombuffer(buf, np.uint8)[:] ^= 0xA5


# ---- the differential test ------------------------------------------------------------------------

class Samples(Dataset):
    """The broad samples by position (the dict's order), rebuilt the same in every process."""

    def __init__(self):
        self.names = list(broad_samples())
        self.items = [broad_samples()[n][0] for n in self.names]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_the_mutation_helper_reaches_what_it_claims_to():
    # the check below is only as good as mutate(): it must change every kind it can change
    immutable = {"read-only PickleBuffer", "ndarray read-only"}
    for name, (sample, _) in broad_samples().items():
        before = pickle.dumps(_comparable(sample))
        mutate(sample)
        assert (pickle.dumps(_comparable(sample)) != before) == (name not in immutable), name


def _comparable(x, seen=None):
    """A picklable picture of everything mutate() may change."""
    seen = set() if seen is None else seen
    if id(x) in seen:
        return "<seen>"
    seen.add(id(x))
    if isinstance(x, torch.Tensor):
        s = x.untyped_storage()
        return ("tensor", bytes(np.ctypeslib.as_array((ctypes.c_uint8 * s.nbytes()).from_address(s.data_ptr()))),
                _comparable(vars(x), seen))
    if isinstance(x, np.ndarray):
        return ("ndarray", x.tobytes())
    if isinstance(x, (bytearray, memoryview, pickle.PickleBuffer)):
        return bytes(memoryview(x))
    if type(x).__module__.startswith("pyarrow"):
        return repr(x)
    if isinstance(x, dict):
        return {k: _comparable(v, seen) for k, v in x.items()}
    if isinstance(x, (list, tuple, collections.deque)):
        return [_comparable(v, seen) for v in x]
    if isinstance(x, set):
        return sorted(map(repr, x))
    if hasattr(x, "__dict__"):
        return _comparable(vars(x), seen)
    return repr(x)


def test_a_hit_changed_in_place_never_changes_the_next_hit():
    base = Samples()
    pristine = broad_samples()
    ds = fastcollate.Cached(base, max_bytes=16 << 20)
    for i, name in enumerate(base.names):
        first = ds[i]  # the miss: the dataset's own object
        assert first is base.items[i]
        for read in range(3):
            hit = ds[i]
            assert_identical(hit, expected(name, pristine), f"{name} (hit {read})")
            mutate(hit)
    s = ds.stats()
    assert (s["inserts"], s["uncacheable"], s["hits"]) == (len(base), 0, 3 * len(base)), s


def test_an_arrow_formatted_hf_dataset_row_is_copied():
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_dict({"x": [[1.0, 2.0], [3.0, 4.0, 5.0]], "y": [0, 1]}).with_format("arrow")
    ds = fastcollate.Cached(hf, max_bytes=1 << 20)
    want = [hf[i] for i in range(2)]
    for i in range(2):
        ds[i]
        for _ in range(2):
            hit = ds[i]
            assert_identical(hit, want[i])
            mutate(hit)
    assert ds.stats()["hits"] == 4


def test_the_out_of_band_buffers_are_only_ours_and_read_only(monkeypatch):
    from fastcollate.data import cache_codec

    sample = {"t": torch.arange(6).reshape(2, 3)[:, 1], "a": np.arange(4.0)[::-1], "p": pickle.PickleBuffer(bytearray(8))}
    blob = cache_codec.encode(sample)
    assert len(blob.buffers) == 2  # the tensor's and the array's: the PickleBuffer went in band
    segment = np.zeros(blob.nbytes, np.uint8)
    blob.write(segment, 0)
    seen, real = [], pickle.loads

    def spy(data, buffers=()):
        buffers = list(buffers)
        seen.extend(buffers)
        return real(data, buffers=buffers)

    monkeypatch.setattr(cache_codec.pickle, "loads", spy)
    got = cache_codec.decode(memoryview(segment), 0)
    assert len(seen) == 2 and all(b.readonly for b in seen)
    assert_identical(got, dict(sample, p=bytearray(8)))


def check_then_mutate(sample):
    """A DataLoader transform: what it reads equals the pristine sample, then it changes it all."""
    from torch.utils.data import get_worker_info

    i, value = sample["i"], sample["value"]
    pristine = broad_samples()
    name = list(pristine)[i]
    where = f"{name} in worker {get_worker_info().id}"
    if isinstance(value, pickle.PickleBuffer):  # a miss: the dataset's own object
        assert bytes(memoryview(value)) == bytes(memoryview(pristine[name][0])), where
    else:
        assert_identical(value, expected(name, pristine), where)
    mutate(sample)
    return i


class Indexed(Samples):
    def __getitem__(self, i):
        return {"i": i, "value": self.items[i]}


def first_of(batch):
    return batch[0]


def test_forked_workers_that_change_every_hit_in_place_read_the_same_each_epoch():
    base = Indexed()
    ds = fastcollate.Cached(base, transform=check_then_mutate, max_bytes=16 << 20)
    loader = DataLoader(ds, batch_size=1, collate_fn=first_of, num_workers=2, multiprocessing_context="fork",
                        persistent_workers=True, timeout=120)
    for _ in range(3):
        assert sorted(loader) == list(range(len(base)))
    s = ds.stats()
    assert (s["inserts"], s["hits"], s["uncacheable"]) == (len(base), 2 * len(base), 0), s
    pristine = broad_samples()
    for i, name in enumerate(base.names):  # and the main process reads them unchanged too
        assert_identical(ds._get(i)["value"], expected(name, pristine), name)
