"""How fastcollate.Cached stores a sample: pickle (protocol 5) with reductions of its own for
tensors and numpy arrays, so that a cached sample equals the dataset's exactly and a view costs
only the bytes it spans.

* A ``torch.Tensor`` (the exact type; dense, on the CPU) stores the bytes between the first and
  the last element its view reaches -- ``big[i]`` stores row i, never ``big``'s storage -- out of
  band, and comes back as a new tensor made by ``torch.empty_strided`` with the same dtype, shape
  and strides (so the same memory format; its storage is just that span, so ``storage_offset``
  may differ), ``requires_grad``, conjugate and negative bits, and inference-ness.
* A numpy ``ndarray`` (the exact type, no object fields) the same way: the same dtype (byte order
  and fields included), shape, strides (negative ones too) and ``writeable`` flag; C- and
  F-ordered arrays come back owning their memory.
* A tensor subclass (``nn.Parameter``) or a tensor with attributes set on it: torch's own pickling,
  which keeps them (and stores its whole storage).
* Anything else: pickle's own reductions -- the same types, values and order as ``pickle.loads(
  pickle.dumps(x))`` gives (floats bit for bit, NaN payloads included; an object that appears twice
  comes back as one object). Buffers other reductions offer out of band (pyarrow arrays and
  tables, ``pickle.PickleBuffer``, PEP 574 classes) are kept in band, as a plain pickle keeps them:
  they come back over new bytes (a read-only buffer) or a new bytearray (a writable one) -- a
  ``PickleBuffer`` itself comes back as that bytes or bytearray, as pickle gives it.
* Refused -- the sample is then never cached, it is fetched from the dataset every time --:
  sparse, quantized, nested, named, non-CPU and non-leaf ``requires_grad`` tensors, ndarray
  subclasses (a memmap row: its file and mode would not come back) and object arrays (their
  strides would not), and anything pickle cannot pickle.

Two views of one storage come back as two tensors with their own memory (what each holds is equal;
a write into one no longer shows in the other). Every read makes new objects: a transform that
changes a sample in place never changes what is cached. Only our own tensor and ndarray buffers
are stored out of band, and ``decode`` hands them to their reconstructors read-only; those copy
them into new memory, so no object that comes back is a view of the cache (tests/
test_cache_isolation.py changes every hit in place and reads again).

An entry's bytes (offsets relative to its start, little-endian int64; buffers 64-byte aligned):
``[n buffers][pickle length][n x (buffer offset, buffer length)][pickle][buffers...]``.
"""
from __future__ import annotations

import io
import pickle
import struct
from typing import Any, Callable

import numpy as np
import torch

ALIGN = 64
_HEAD = struct.Struct("<qq")


class Uncacheable(Exception):
    """A sample the cache cannot store exactly (the message says which part and why)."""


# ---- writing --------------------------------------------------------------------------------------

def _tensor_span(t: torch.Tensor) -> int:
    """Elements from the first to the last one the view reaches (torch strides are >= 0)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _reduce_tensor(t: torch.Tensor, own: Callable[[Any], pickle.PickleBuffer]) -> Any:
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        raise Uncacheable(f"a {t.layout} tensor{' (quantized)' if t.is_quantized else ''}")
    if t.device.type != "cpu":
        raise Uncacheable(f"a tensor on {t.device} (the cache holds host memory)")
    if t.dim() and any(name is not None for name in getattr(t, "names", ())):  # older torch: named tensors
        raise Uncacheable("a named tensor")
    if t.requires_grad and not t.is_leaf:
        raise Uncacheable("a non-leaf tensor that requires grad")
    if type(t) is not torch.Tensor or torch._utils._get_obj_state(t):
        return NotImplemented  # torch's own pickling keeps a subclass and attributes set on a tensor
    conj, neg = t.is_conj(), t.is_neg()
    base = t.detach()
    if conj:  # the memory holds the unconjugated values; the bit is set again on the way out
        base = base.conj()
    if neg:
        base = torch._neg_view(base)
    span = _tensor_span(t)
    raw = base.as_strided((span,), (1,), base.storage_offset()).view(torch.uint8) if span else \
        torch.empty(0, dtype=torch.uint8)
    flags = (bool(t.requires_grad), conj, neg, t.is_inference())
    return _tensor, (own(raw.numpy()), t.dtype, tuple(t.shape), tuple(t.stride()), flags)


class _Raw:
    """The bytes [address, address + nbytes) of an array's memory, as numpy sees a buffer (the
    array is kept alive by the reference)."""

    def __init__(self, array: np.ndarray, address: int, nbytes: int) -> None:
        self.array = array
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, True), "version": 3}


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def _reduce_ndarray(a: np.ndarray, own: Callable[[Any], pickle.PickleBuffer]) -> Any:
    if a.dtype.hasobject:
        raise Uncacheable(f"a numpy array of {a.dtype} (holds Python objects)")
    item = a.dtype.itemsize
    if item == 0:
        raise Uncacheable(f"a numpy array of {a.dtype} (zero-size items)")
    shape, strides = tuple(a.shape), tuple(a.strides)
    if a.size == 0:
        lo, nbytes = 0, 0
    else:
        lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
        hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
        nbytes = hi - lo + item
    raw = np.asarray(_Raw(a, a.__array_interface__["data"][0] + lo, nbytes)) if nbytes else np.empty(0, np.uint8)
    if a.size and lo == 0 and strides == _c_strides(shape, item):
        order = "C"
    elif a.size and lo == 0 and strides[::-1] == _c_strides(shape[::-1], item):
        order = "F"
    else:
        order = ""
    return _ndarray, (own(raw), a.dtype, shape, strides, -lo, order, bool(a.flags.writeable))


class _Pickler(pickle.Pickler):
    """Protocol 5 with our reductions. Only the buffers our own reductions make go out of band
    (into the entry, read back by ``_tensor``/``_ndarray``, which copy); every other buffer a
    reduction offers (a pyarrow buffer, a ``pickle.PickleBuffer``, a PEP 574 class) stays in
    band, so that reading it back makes new bytes or bytearrays, as a plain pickle does, and
    never a view of the cache."""

    def __init__(self, file: io.BytesIO, buffers: list[memoryview]) -> None:
        own: dict[int, pickle.PickleBuffer] = {}  # id -> our buffer (held: ids stay unique)

        def out_of_band(buf: pickle.PickleBuffer) -> bool:
            if own.get(id(buf)) is not buf:
                return True  # in band: pickled (and unpickled) as bytes or a bytearray, a copy
            buffers.append(buf.raw())
            return False

        # a closure, not a bound method: no reference cycle keeps the pickler's memo (and the
        # buffers its objects export) alive after the sample is encoded
        super().__init__(file, protocol=5, buffer_callback=out_of_band)
        self._own = own

    def _own_buffer(self, raw: Any) -> pickle.PickleBuffer:
        buf = pickle.PickleBuffer(raw)
        self._own[id(buf)] = buf
        return buf

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is np.ndarray:
            return _reduce_ndarray(obj, self._own_buffer)
        if isinstance(obj, torch.Tensor):
            return _reduce_tensor(obj, self._own_buffer)
        if isinstance(obj, np.ndarray):
            raise Uncacheable(f"a {kind.__module__}.{kind.__qualname__} (an ndarray subclass)")
        return NotImplemented


class Encoded:
    """A sample's entry, ready to be written: its length, and the parts to copy."""

    __slots__ = ("head", "buffers", "offsets", "nbytes")

    def __init__(self, pickled: bytes, buffers: list[memoryview]) -> None:
        table_len = _HEAD.size + 16 * len(buffers)
        end = table_len + len(pickled)
        offsets = []
        for b in buffers:
            end = -(-end // ALIGN) * ALIGN
            offsets.append(end)
            end += b.nbytes
        table = struct.pack(f"<{2 * len(buffers)}q", *[v for o, b in zip(offsets, buffers) for v in (o, b.nbytes)])
        self.head = _HEAD.pack(len(buffers), len(pickled)) + table + pickled
        self.buffers, self.offsets, self.nbytes = buffers, offsets, end

    def write(self, segment: np.ndarray, offset: int) -> None:
        """Copies the entry into segment (a uint8 array) at offset."""
        segment[offset:offset + len(self.head)] = np.frombuffer(self.head, np.uint8)
        for o, b in zip(self.offsets, self.buffers):
            if b.nbytes:
                segment[offset + o:offset + o + b.nbytes] = np.frombuffer(b, np.uint8)


def encode(sample: Any) -> Encoded:
    """The sample's entry; raises Uncacheable (or pickle's own error) when it cannot be stored."""
    buffers: list[memoryview] = []
    out = io.BytesIO()
    _Pickler(out, buffers).dump(sample)
    return Encoded(out.getvalue(), buffers)


# ---- reading --------------------------------------------------------------------------------------

def decode(view: memoryview, offset: int) -> Any:
    """The sample whose entry starts at offset of view (the data segment's bytes): new objects.
    The out-of-band buffers are all our own reductions' (see _Pickler), whose reconstructors copy
    out of them; they are handed over read-only, so nothing can write the cache through them."""
    nbuf, plen = _HEAD.unpack_from(view, offset)
    table = struct.unpack_from(f"<{2 * nbuf}q", view, offset + _HEAD.size) if nbuf else ()
    start = offset + _HEAD.size + 16 * nbuf
    buffers = [view[offset + table[2 * k]:offset + table[2 * k] + table[2 * k + 1]].toreadonly() for k in range(nbuf)]
    return pickle.loads(view[start:start + plen], buffers=buffers)


def _tensor(buf: Any, dtype: torch.dtype, shape: tuple[int, ...], strides: tuple[int, ...],
            flags: tuple) -> torch.Tensor:
    requires_grad, conj, neg, inference = flags
    if inference:  # made under inference mode, as the dataset's was
        with torch.inference_mode():
            return _tensor(buf, dtype, shape, strides, (False, conj, neg, False))
    out = torch.empty_strided(shape, strides, dtype=dtype)
    src = np.frombuffer(buf, np.uint8)
    if src.size:
        torch.empty(0, dtype=torch.uint8).set_(out.untyped_storage()).numpy()[:] = src
    if conj:
        out = out.conj()
    if neg:
        out = torch._neg_view(out)
    if requires_grad:
        out.requires_grad_(True)
    return out


def _ndarray(buf: Any, dtype: np.dtype, shape: tuple[int, ...], strides: tuple[int, ...], lo: int, order: str,
             writeable: bool) -> np.ndarray:
    src = np.frombuffer(buf, np.uint8)
    if order:  # C- or F-ordered: an array that owns its memory, as np.empty (and most arrays) do
        out = np.empty(shape, dtype, order=order)
        (out if order == "C" else out.T).reshape(-1).view(np.uint8)[:] = src
    else:
        memory = np.empty(src.size, np.uint8)
        memory[:] = src
        out = np.ndarray(shape, dtype, buffer=memory, offset=lo, strides=strides)
    out.flags.writeable = writeable
    return out
