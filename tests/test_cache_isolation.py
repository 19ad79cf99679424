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
from cache_samples import expected, kinds as broad_samples
from helpers import assert_identical

C = _ext._C


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
    immutable = {"read-only PickleBuffer", "numpy read-only", "empty with strides", "numpy empty"}
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
    from fastcollate.cache import codec as cache_codec

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
