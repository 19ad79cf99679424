"""What a dataset is made of, for the node-wide cache: the fingerprint the ranks compare before
they share one cache, and the spot check that backs it where the fingerprint could only sample.

Why. The ranks of a node find one cache by its key (``name=``, else the dataset's type and
ordinal). Two ranks that wrap different data of one type and length -- a per-rank shard, train
and val splits of one size, a file list built with another seed -- would otherwise share a
cache and serve each other's samples. The rank that makes the cache records the dataset's
fingerprint; a rank that joins computes its own and is refused on any difference, with the
parts that differ named.

The fingerprint. A hash of the dataset's type, its length, the size and mtime of the file that
defines its class, and what the object holds, walked: every attribute (``__dict__`` and
``__slots__``), recursively; numbers, strings and bytes by value; lists, tuples and dicts in
order, sets by their sorted element hashes; tensors and arrays by dtype, shape and bytes;
functions and classes by qualified name; a 🤗 ``datasets.Dataset`` by its own ``_fingerprint``;
random generators by type only (their state is the random part, not the data). Strings that
name existing files add the file's size and mtime (up to ``STAT_PATHS`` of them, evenly spaced),
so data rewritten between two attempts of a job is not served from the old cache.

Bounded. The walk reads at most ``MAX_OBJECTS`` objects and hashes at most ``MAX_BYTES`` bytes
of arrays (an array up to ``WHOLE_ARRAY`` bytes whole, a larger one in ``CHUNKS`` evenly spaced
chunks). Where it had to sample -- an array too large, too many objects, an object it cannot
see into (a C extension's handle), a tensor on a GPU -- the fingerprint says so
(``complete`` False, ``sampled`` says what), and a rank joining the cache also spot-checks up to
``SPOT_CHECKS`` samples already in it: fetched from its own dataset, compared with the cached
bytes (then, if the bytes differ, value by value). A dataset whose state differs harmlessly
between ranks (a counter, the rank's id) can name its identity itself: ``key=`` replaces the
fingerprint, and different keys are different caches.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import io
import logging
import os
import random
import stat
import sys
import threading
import types
from typing import Any, Callable

import numpy as np
import torch

__all__ = ["Fingerprint", "fingerprint", "spot_check", "same_value", "evenly"]

MAX_OBJECTS = 200_000      # objects the walk visits at most
MAX_BYTES = 64 << 20       # array bytes it hashes at most, over the whole dataset
WHOLE_ARRAY = 8 << 20      # an array up to this size is hashed whole
CHUNKS, CHUNK = 64, 4096   # a larger one: this many evenly spaced chunks of this many bytes
LONG_LIST = 4096           # a list longer than this of plain values is hashed from its repr at once
STAT_PATHS = 256           # file paths whose size and mtime are read at most, evenly spaced
MAX_DEPTH = 12
SPOT_CHECKS = 4
PART_LIMIT = 32            # top-level attributes named apart (the rest hashed as one part)

_PLAIN = (str, int, float, bool, type(None), bytes, complex)
_RNG = (random.Random, np.random.Generator, np.random.RandomState, torch.Generator)
# process-local machinery, hashed by type only: a logger's caches and handlers, a thread's ids,
# locks and open files differ between ranks holding the same data
_LOCAL = (logging.Logger, logging.Handler, logging.Manager, threading.Thread, io.IOBase,
          type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Event)


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """A dataset's identity for the node cache: ``digest`` (hex), one digest per ``parts`` name
    (type, length, code, files, each top-level attribute), whether the walk saw everything
    (``complete``; else ``sampled`` says what it sampled), and the user's ``key`` where given."""

    digest: str
    parts: dict[str, str]
    complete: bool
    sampled: tuple[str, ...] = ()
    key: str | None = None

    def record(self) -> dict[str, Any]:
        return {"digest": self.digest, "parts": dict(self.parts), "complete": self.complete,
                "sampled": list(self.sampled), "key": self.key}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> "Fingerprint":
        return cls(digest=str(rec["digest"]), parts=dict(rec.get("parts", {})), complete=bool(rec.get("complete")),
                   sampled=tuple(rec.get("sampled", ())), key=rec.get("key"))

    def differing(self, other: "Fingerprint") -> list[str]:
        """The parts whose digests differ (or that only one of the two has)."""
        names = list(self.parts) + [n for n in other.parts if n not in self.parts]
        return [n for n in names if self.parts.get(n) != other.parts.get(n)]


def _hex(h: "hashlib._Hash") -> str:
    return h.hexdigest()[:32]


class _Walk:
    """One fingerprint's walk: the budget it has left and what it had to sample."""

    def __init__(self) -> None:
        self.objects = 0
        self.bytes = 0
        self.sampled: list[str] = []
        self.paths: list[str] = []
        self.seen: dict[int, int] = {}
        self.keep: list[Any] = []  # objects whose ids are in seen stay alive until the walk ends

    def sample(self, why: str) -> None:
        if why not in self.sampled and len(self.sampled) < 8:
            self.sampled.append(why)

    # -- values
    def feed(self, h: "hashlib._Hash", obj: Any, depth: int = 0) -> None:
        self.objects += 1
        if self.objects > MAX_OBJECTS:
            self.sample(f"more than {MAX_OBJECTS} objects")
            h.update(b"~")
            return
        if isinstance(obj, int) and not isinstance(obj, bool) and obj.bit_length() > 4096:
            h.update(b"bigint:" + obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True))
            return
        if isinstance(obj, (bool, int, float, complex, type(None))):
            h.update(f"{type(obj).__name__}:{obj!r};".encode())
            return
        if isinstance(obj, str):
            self._str(h, obj)
            return
        if isinstance(obj, (bytes, bytearray, memoryview)):
            view = memoryview(obj)
            flat = np.frombuffer(view.cast("B") if view.c_contiguous else view.tobytes(), np.uint8)  # no copy
            h.update(b"b%d:" % flat.size)
            self._bytes(h, flat, "a bytes value")
            return
        if isinstance(obj, enum.Enum):
            h.update(f"enum:{type(obj).__qualname__}.{obj.name};".encode())
            return
        if isinstance(obj, os.PathLike):
            path = os.fspath(obj)
            self._str(h, path if isinstance(path, str) else os.fsdecode(path))
            return
        if isinstance(obj, (types.BuiltinFunctionType, type, types.ModuleType)):
            h.update(f"code:{_qualname(obj)};".encode())
            return
        if isinstance(obj, _LOCAL):
            h.update(f"local:{_qualname(type(obj))};".encode())
            return
        if isinstance(obj, _RNG):
            h.update(f"rng:{type(obj).__qualname__};".encode())  # the random part, not the data
            return
        if depth > MAX_DEPTH:
            self.sample(f"objects nested deeper than {MAX_DEPTH}")
            h.update(f"deep:{type(obj).__qualname__};".encode())
            return
        ref = self.seen.get(id(obj))
        if ref is not None:  # a cycle, or one object reached twice: its place, not its content again
            h.update(b"@%d;" % ref)
            return
        self.seen[id(obj)] = len(self.seen)
        self.keep.append(obj)
        if isinstance(obj, torch.Tensor):
            self._tensor(h, obj)
        elif isinstance(obj, np.ndarray):
            self._ndarray(h, obj, depth)
        elif isinstance(obj, np.generic):
            h.update(f"np:{obj.dtype.str}:".encode() + obj.tobytes())
        elif isinstance(obj, (list, tuple)):
            self._sequence(h, obj, depth)
        elif type(obj) is dict or isinstance(obj, (set, frozenset)):
            # order-free, as == is: each item alone, the digests sorted (an order from iterating a
            # set changes with the hash seed); items walked with a scratch `seen`, so that their
            # ordinals do not depend on that order either
            items = obj.items() if isinstance(obj, dict) else ((v,) for v in obj)
            digests = []
            for item in items:
                e = hashlib.blake2b()
                outer, self.seen = self.seen, dict(self.seen)
                try:
                    for v in item:
                        self.feed(e, v, depth + 1)
                finally:
                    self.seen = outer
                digests.append(e.digest())
            h.update(f"{type(obj).__qualname__}[{len(obj)}]:".encode() + b"".join(sorted(digests)))
        elif isinstance(obj, dict):  # an OrderedDict, a defaultdict...: in order
            h.update(f"{type(obj).__qualname__}[{len(obj)}]:".encode())
            for k, v in obj.items():
                self.feed(h, k, depth + 1)
                self.feed(h, v, depth + 1)
        elif isinstance(obj, types.MethodType):
            h.update(b"method:")
            self.feed(h, obj.__func__, depth + 1)
            self.feed(h, obj.__self__, depth + 1)
        elif isinstance(obj, types.FunctionType):
            self._function(h, obj, depth)
        elif isinstance(obj, types.CodeType):
            self._code(h, obj, depth)
        elif isinstance(obj, functools.partial):
            h.update(b"partial:")
            self.feed(h, obj.func, depth + 1)
            self.feed(h, obj.args, depth + 1)
            self.feed(h, obj.keywords, depth + 1)
        else:
            self._object(h, obj, depth)

    def _function(self, h: "hashlib._Hash", fn: types.FunctionType, depth: int) -> None:
        """A function by what it computes: its code, defaults and captured values, and its file's
        size and mtime (a transform edited between two attempts of a job is another one)."""
        h.update(f"function:{_qualname(fn)};".encode())
        self._code(h, fn.__code__, depth)
        self.feed(h, fn.__defaults__, depth + 1)
        self.feed(h, fn.__kwdefaults__, depth + 1)
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                value = "<empty cell>"
            self.feed(h, value, depth + 1)
        path = getattr(fn.__code__, "co_filename", None)
        if path and os.path.isabs(path):
            self.paths.append(path)

    def _code(self, h: "hashlib._Hash", code: types.CodeType, depth: int) -> None:
        h.update(b"co:" + code.co_code)
        for c in code.co_consts:
            self.feed(h, c, depth + 1)
        h.update("/".join(code.co_names).encode())

    def _str(self, h: "hashlib._Hash", s: str) -> None:
        data = s.encode("utf-8", "surrogatepass")
        h.update(b"s%d:" % len(data) + data)
        if os.sep in s and len(s) < 4096:
            self.paths.append(s)

    def _bytes(self, h: "hashlib._Hash", flat: np.ndarray, what: str) -> None:
        """Hashes the uint8 bytes ``flat``: whole where the budget allows, else evenly spaced chunks."""
        n = flat.size
        if n <= WHOLE_ARRAY and self.bytes + n <= MAX_BYTES:
            self.bytes += n
            h.update(memoryview(np.ascontiguousarray(flat)))
            return
        self.sample(f"{what} of {n} bytes (hashed in {CHUNKS} chunks of {CHUNK})")
        step = max(CHUNK, n // CHUNKS)
        for start in range(0, n, step):
            h.update(memoryview(np.ascontiguousarray(flat[start:start + CHUNK])))
        self.bytes += min(n, CHUNKS * CHUNK)

    def _tensor(self, h: "hashlib._Hash", t: torch.Tensor) -> None:
        h.update(f"tensor:{t.dtype}:{tuple(t.shape)}:{t.layout}:".encode())
        if t.layout != torch.strided or t.is_nested or t.device.type != "cpu":
            self.sample(f"a {t.device.type} tensor ({t.layout}): its shape only")
            return
        t = t.detach()
        if t.is_quantized:
            self.sample("a quantized tensor: its shape only")
            return
        if t.numel() == 0:
            return
        t = t.resolve_conj().resolve_neg()
        if not t.is_contiguous():
            if t.numel() * t.element_size() > WHOLE_ARRAY:
                flat = torch.linspace(0, t.numel() - 1, CHUNKS * CHUNK // t.element_size()).long()
                self.sample(f"a non-contiguous tensor of {tuple(t.shape)} (hashed at {len(flat)} elements)")
                t = t[torch.unravel_index(flat, t.shape)]  # those elements alone: no whole copy
            t = t.contiguous()
        self._bytes(h, t.reshape(-1).view(torch.uint8).numpy(), "a tensor")

    def _ndarray(self, h: "hashlib._Hash", a: np.ndarray, depth: int) -> None:
        h.update(f"ndarray:{a.dtype.str}:{a.shape}:".encode())
        filename = getattr(a, "filename", None)
        if isinstance(a, np.memmap) and filename:
            self._str(h, str(filename))
            h.update(f"offset:{getattr(a, 'offset', 0)};".encode())
        if a.dtype.hasobject:
            self._sequence(h, a.ravel().tolist(), depth)
            return
        if a.size == 0:
            return
        if not a.flags.c_contiguous:
            if a.nbytes > WHOLE_ARRAY and a.ndim > 0:
                flat = np.linspace(0, a.size - 1, CHUNKS * CHUNK // a.itemsize).astype(np.int64)
                self.sample(f"a non-contiguous array of {a.shape} (hashed at {len(flat)} elements)")
                a = a[np.unravel_index(flat, a.shape)]  # those elements alone: no whole copy
            a = np.ascontiguousarray(a)
        self._bytes(h, a.reshape(-1).view(np.uint8), "an array")

    def _sequence(self, h: "hashlib._Hash", seq: Any, depth: int) -> None:
        h.update(f"{type(seq).__qualname__}[{len(seq)}]:".encode())
        if len(seq) > LONG_LIST and _plain_sample(seq):
            # a long list of plain values (a file list of (path, label) pairs): repr is exact for
            # them and runs in C, where a walk would visit every element in Python
            step = 65536  # in slices: a 10M-entry list never becomes one giant string
            texts = (repr(seq[i:i + step]) for i in range(0, len(seq), step))
            e = hashlib.blake2b()
            plain = True
            for text in texts:
                if " at 0x" in text:
                    plain = False
                    break
                e.update(text.encode("utf-8", "surrogatepass"))
            if plain:
                h.update(e.digest())
                for i in np.linspace(0, len(seq) - 1, min(len(seq), STAT_PATHS)).astype(np.int64):
                    for v in (seq[i] if isinstance(seq[i], (tuple, list)) else (seq[i],)):
                        if isinstance(v, str) and os.sep in v:
                            self.paths.append(v)
                return
        for v in seq:
            self.feed(h, v, depth + 1)

    def _object(self, h: "hashlib._Hash", obj: Any, depth: int) -> None:
        h.update(f"object:{_qualname(type(obj))}:".encode())
        own = _own_fingerprint(obj)
        if own is not None:
            h.update(b"own:" + own.encode())
            return
        state = _state(obj)
        if state is None:
            self.sample(f"a {_qualname(type(obj))} (nothing to read inside it)")
            return
        for k, v in state:
            self.feed(h, k, depth + 1)
            self.feed(h, v, depth + 1)

    def files(self) -> str | None:
        """The size and mtime of up to STAT_PATHS of the regular files named, evenly spaced in
        sorted order (directories left out: any new file changes their mtime)."""
        paths = sorted(set(self.paths))
        if not paths:
            return None
        h = hashlib.blake2b()
        picks = np.linspace(0, len(paths) - 1, min(len(paths), STAT_PATHS)).astype(np.int64)
        for i in sorted(set(picks.tolist())):
            try:
                st = os.stat(paths[i])
            except (OSError, ValueError):
                continue
            if stat.S_ISREG(st.st_mode):
                h.update(f"{paths[i]}:{st.st_size}:{st.st_mtime_ns};".encode("utf-8", "surrogatepass"))
        return _hex(h)


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None) or ''}.{getattr(obj, '__qualname__', None) or type(obj).__qualname__}"


def _plain_sample(seq: Any) -> bool:
    """Whether evenly spaced elements of seq are plain values or short tuples of them."""
    for i in np.linspace(0, len(seq) - 1, 64).astype(np.int64):
        v = seq[i]
        items = v if isinstance(v, (tuple, list)) and len(v) <= 8 else (v,)
        if not all(type(x) in _PLAIN for x in items):
            return False
    return True


def _own_fingerprint(obj: Any) -> str | None:
    """A 🤗 datasets object's own content fingerprint (its ``_fingerprint``, read from its own
    __dict__: a wrapper forwarding attributes to one must not pass for it)."""
    if not (type(obj).__module__ or "").startswith("datasets"):
        return None
    try:
        own = vars(obj).get("_fingerprint")
    except TypeError:
        return None
    return own if isinstance(own, str) and own else None


def _state(obj: Any) -> list[tuple[str, Any]] | None:
    """An object's attributes in a fixed order (its __dict__'s, then its slots'); None where it
    has neither. An object may name its identity itself: ``_fastcollate_identity()`` (what its
    samples depend on; a dataset's per-process notes and counters left out). Values a
    ``functools.cached_property`` put in __dict__ are left out: only some ranks may have read them."""
    ident = getattr(type(obj), "_fastcollate_identity", None)
    if callable(ident):
        return [("identity", ident(obj))]
    out: list[tuple[str, Any]] = []
    found = False
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        found = True
        lazy = {k for k in d if isinstance(getattr(type(obj), k, None), functools.cached_property)}
        out.extend((k, v) for k, v in d.items() if k not in lazy)
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            found = True
            stored = f"_{cls.__name__.lstrip('_')}{name}" if name.startswith("__") and not name.endswith("__") else name
            try:
                out.append((name, object.__getattribute__(obj, stored)))
            except AttributeError:
                out.append((name, "<unset>"))
    return out if found else None


def _code_part(dataset: Any) -> str:
    """The size and mtime of the file that defines the dataset's class (ranks run the same code;
    a restart after an edit must not read what the old code cached)."""
    module = sys.modules.get(type(dataset).__module__)
    path = getattr(module, "__file__", None)
    try:
        st = os.stat(path) if path else None
    except OSError:
        st = None
    return f"{path}:{st.st_size}:{st.st_mtime_ns}" if st else f"{path}"


def fingerprint(dataset: Any, key: str | None = None) -> Fingerprint:
    """The fingerprint of ``dataset`` (see the module's docstring); with ``key``, the key alone:
    the user's word for what the dataset is.

    >>> a, b = fingerprint(list(range(5))), fingerprint(list(range(1, 6)))
    >>> a.complete, a.digest == fingerprint(list(range(5))).digest, a.differing(b)
    (True, True, ['items'])
    """
    if key is not None:
        digest = _hex(hashlib.blake2b(b"key:" + key.encode("utf-8", "surrogatepass")))
        return Fingerprint(digest=digest, parts={"key": digest}, complete=True, key=key)
    walk = _Walk()
    parts: dict[str, str] = {}

    def part(name: str, feed: Callable[["hashlib._Hash"], None]) -> None:
        h = hashlib.blake2b()
        feed(h)
        parts[name] = _hex(h)

    part("type", lambda h: h.update(_qualname(type(dataset)).encode()))
    try:
        length = len(dataset)
    except TypeError:
        length = None
    part("length", lambda h: h.update(repr(length).encode()))
    part("code", lambda h: h.update(_code_part(dataset).encode("utf-8", "surrogatepass")))
    state = _state(dataset) if not isinstance(dataset, (list, tuple, dict, torch.Tensor, np.ndarray)) else None
    own = _own_fingerprint(dataset)  # a 🤗 datasets.Dataset names its content itself
    if own is not None:
        part("content", lambda h: h.update(own.encode()))
    elif state is None:
        part("items", lambda h: walk.feed(h, dataset))
    else:
        walk.seen[id(dataset)] = 0
        rest = hashlib.blake2b()
        for n, (k, v) in enumerate(state):
            if n < PART_LIMIT:
                part(f"attribute {k}", lambda h, v=v: walk.feed(h, v, 1))
            else:
                walk.feed(rest, k, 1)
                walk.feed(rest, v, 1)
        if len(state) > PART_LIMIT:
            parts["other attributes"] = _hex(rest)
    files = walk.files()
    if files is not None:
        parts["files"] = files
    total = hashlib.blake2b()
    for name, digest in parts.items():
        total.update(f"{name}={digest};".encode())
    return Fingerprint(digest=_hex(total), parts=parts, complete=not walk.sampled, sampled=tuple(walk.sampled))


# ---- the spot check ------------------------------------------------------------------------------

def same_value(a: Any, b: Any) -> bool:
    """Whether two samples hold the same values: tensors and arrays by dtype, shape and bytes
    (NaNs count as equal to themselves), containers element by element, anything else by ==."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape or a.layout != b.layout or a.device != b.device:
            return False
        return a.layout != torch.strided or a.numel() == 0 or bool(
            torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.hasobject:
            return all(same_value(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))
        return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    try:
        return bool(a == b)
    except Exception:  # an object whose == raises (an array-like): not provably the same
        return False


def spot_check(ready: list[int], cached: Callable[[int], tuple[np.ndarray, Any]],
               fetch: Callable[[int], Any], encode: Callable[[Any], Any]) -> int | None:
    """The first of ``ready`` (entries already in the cache) whose sample from this process's
    dataset differs from the cached one, or None. ``cached(i)``: (its bytes, a callable that
    decodes them);
    ``fetch(i)``: the dataset's sample; ``encode``: the cache's codec. Samples the codec refuses
    are skipped (they were never cached)."""
    for i in ready:
        sample = fetch(i)
        try:
            blob = encode(sample)
        except Exception:
            continue
        stored, decoded = cached(i)
        if blob.nbytes == stored.size:
            mine = np.zeros(blob.nbytes, np.uint8)
            blob.write(mine, 0)
            if np.array_equal(mine, stored):
                continue
        if not same_value(sample, decoded()):  # the bytes can differ for equal values (a set's order)
            return i
    return None


def evenly(indices: np.ndarray, most: int = SPOT_CHECKS) -> list[int]:
    """Up to ``most`` of ``indices``, evenly spaced."""
    if len(indices) <= most:
        return [int(i) for i in indices]
    return [int(indices[j]) for j in np.linspace(0, len(indices) - 1, most).astype(np.int64)]
