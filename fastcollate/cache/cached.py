"""fastcollate.Cached: a dataset whose samples, once fetched, are kept in shared memory that
every DataLoader worker reads.

How it works. ``Cached(dataset)`` makes two shared segments, each a sparse memfd (no /dev/shm, so
a container's small /dev/shm is no limit; nothing is allocated until written): a control block
of int64 words -- 16 header words (shared counters, the allocator, the full flag), then 3 words
per index (state, offset, length) -- and a data segment of ``max_bytes``. The first time index
``i`` is fetched (by any worker, or the main process), the fetching process claims entry ``i``
(an atomic compare-and-swap: empty -> its pid), asks the dataset for the sample, serializes it
(fastcollate.cache.codec: exact, a tensor view stores only the bytes it spans), reserves
room with the shared bump allocator, writes, and publishes the entry (release ordering: the bytes
are visible to whoever sees the entry published). Afterwards any process reads it: a lookup is
one atomic load (acquire); published -> the sample is rebuilt from the shared bytes as new
objects (nothing that comes back is a view of the cache); anything else -> a miss, and the
sample comes from the dataset. Nobody ever waits for anybody: an entry being written by another
process is a miss for the reader. The protocol and the words live in C++
(csrc/engine/cache_state.h); the words are named in ``_C.cache_words``.

Workers. Forked workers inherit the segments; spawn and forkserver workers receive their memfds
(fastcollate.core.shm.send_segment, whatever torch's sharing strategy: torch's ``file_system``
one would copy a segment into /dev/shm and unmap it under the main process) when the DataLoader
sends them the dataset (``Cached.__reduce__``), so every worker, persistent or not, shares one
cache, and ``stats()`` in the main process counts them all. A plain pickle in a process that has
the cache is that same wrapper; in another process (a framework that ships the dataset
elsewhere) it becomes a new, empty cache over the unpickled dataset.

One cache per node. Under a launcher that runs several ranks on a node (torchrun's
``LOCAL_WORLD_SIZE`` > 1), or given one ``group=``, the ranks that wrap the same dataset share
one cache: the first to get there makes the segments (and computes the default ``max_bytes``:
one budget for the node), the others map the same memfds (fastcollate.cache.per_node: a
registry file per cache, the memfds opened through ``/proc/<pid>/fd`` of a live holder after an
inode check). Every rank inserts what it fetches and every rank, and each of its workers, reads
everything; the protocol is the one above (claims are pids, and a node's ranks share a pid
namespace), so a rank killed mid-insert is reclaimed like a worker. A rank that exits takes
nothing from the others, and a rank that starts again joins what they hold; where torchrun may
restart all the ranks at once, a keeper process holds the cache in between. The ranks find the
same cache by key: ``name=``, else the dataset's type and how many node-wide Cached of that
type the process made before it (a key that holds another type, length or explicit
``max_bytes`` is refused, naming both). Same type and length is not enough: the rank that makes
the cache records the dataset's fingerprint (fastcollate.cache.identity: its attributes,
arrays, file list and files' mtimes, hashed), and a rank whose fingerprint differs is refused with
the parts that differ; where the fingerprint could only sample, a joining rank also compares a
few cached samples with its own. ``key=`` names the content instead (different keys, different
caches). ``node=False`` keeps a cache private, ``node=True``
shares outside a launcher too. ``stats()`` counts the whole node; its ``rank`` entry, this
rank's own.

A transparent wrapper (fastcollate.cache.wrapper). Attributes Cached does not own are the
dataset's: ``ds.classes`` reads ``ds.dataset.classes``, ``ds.set_epoch(e)`` calls the dataset's,
and ``ds.rng = ...`` (a ``worker_init_fn`` on ``get_worker_info().dataset``) sets it on the
dataset. Cached owns ``dataset``, ``transform``, ``max_bytes`` and its cache's handles. A change
made in the main process reaches workers exactly when torch would send it: workers started after
it (non-persistent ones, each epoch) see it; persistent workers keep the dataset they started
with. ``copy.copy`` is a new wrapper over the same dataset object and the same cache (set its
``transform`` freely); ``copy.deepcopy`` copies the dataset and the transform and makes a new,
empty, private cache of the same ``max_bytes`` -- the copy's dataset may diverge (``val.split =
"val"``), so it must not be served the original's samples.

Exact. A cached sample equals the one the dataset returned the first time: types, dtypes, shapes,
strides, requires_grad, bytes, and Python objects as pickle gives them (codec.py lists what
comes back how, and what is refused). A sample that cannot be stored exactly is never cached: it
is fetched from the dataset every time (counted in ``uncacheable``). Cached caches *whatever the
first fetch returned*: wrap only a deterministic dataset (one whose ``dataset[i]`` is the same
every time) and put random augmentation in ``transform``, which runs on every ``__getitem__``
after the cache, hit or miss, so it stays random per epoch. Integer indices in ``[0,
len(dataset))`` are cached -- a Python ``int``, a numpy integer (``SubsetRandomSampler`` over an
array, ``Subset`` with numpy indices) or a 0-dim integer CPU tensor (a sampler over a tensor) --
under their int value; the dataset is still called with the index it was given. Any other key
(bool, float, negative, a slice, a string) goes to the dataset uncached. ``__getitems__`` (batch
fetching) is kept when the dataset has it: lookups per index, one ``dataset.__getitems__`` call
for the misses. Where that call returns a batch (a dict, a tensor: anything but a list or tuple
of one sample per index), nothing is cached from it: the dataset's batch is passed through as
torch would pass it to the collate_fn (said once; a ``transform``, which applies to one sample,
is then refused with a TypeError).

Bounded. ``max_bytes`` (default: :func:`default_max_bytes`, half the memory available to the
process when the cache is made -- for a node-wide cache, to the rank that makes it:
fastcollate.cache.room) caps the data segment, at most
``MAX_BYTES`` (2**46: the segment is mapped whole in every process). An entry costs its sample's
serialized size rounded up to 64 bytes; the index costs 24 bytes per sample of the dataset,
touched as it fills. A sample too big for the room left is refused alone (``refused_full``; it is
fetched from the dataset every time, and never serialized again) and smaller ones are still
inserted; the cache becomes full when a refusal finds less room than a typical entry (the mean
cached one): from then on nothing is inserted or even serialized, every published entry is still
served, and the rest are misses. Nothing is ever evicted, so no reader can see its bytes change.
The memory is shared (shmem, charged once to the container's cgroup, not once per worker) and
freed when the last process holding the cache lets it go. A writer that dies mid-insert (or is
interrupted: every claim a fetch holds is released on any exception) leaves its entry to be
reclaimed by the next process that finds its pid gone (counted in ``reclaimed``); the bytes it
had reserved stay allocated. (Should the kernel give that pid to a new process first, the entry
stays a miss until that one ends.)

Time. ``stats()`` also gives the time spent in hits (``hit_s``: reading and rebuilding), in the
dataset on misses (``fetch_s``), in inserts (``insert_s``) and in ``transform`` (``transform_s``),
summed over every process holding the cache (and, in ``rank``, over this rank's), so one traced run says what a sample costs cached and uncached;
:meth:`Cached.estimate` measures the same on samples in hand before any cache exists.

Without the compiled engine (or with ``FASTCOLLATE_DISABLE=1``) Cached passes every fetch through
to the dataset and caches nothing.
"""
from __future__ import annotations

import copy
import logging
import os
import statistics
import time
import uuid
import weakref
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from .. import _ext
from ..core.collator import disabled
from ..core.shm import pid_alive, send_segment, shared_segment
from . import identity as cache_identity
from . import per_node as cache_node
from .codec import ALIGN, Uncacheable, decode, encode
from .room import DEFAULT_FRACTION, default_max_bytes, memory_available
from .wrapper import DatasetWrapper

__all__ = ["Cached", "default_max_bytes", "memory_available", "DEFAULT_FRACTION", "MAX_BYTES"]

logger = logging.getLogger("fastcollate")
# the most max_bytes may be: the data segment is mapped whole into every process that holds the
# cache, and x86-64 gives a process 2**47 bytes of address space in all
MAX_BYTES = 1 << 46
_CACHES: "weakref.WeakValueDictionary[str, Cached]" = weakref.WeakValueDictionary()
_MISS = object()
_LOCAL = ("_seg", "_warned", "_batches")  # this process's own notes about a cache, never copied or sent


def _warn_once(cache: "Cached", key: str, msg: str) -> None:
    seen = cache.__dict__.setdefault("_warned", set())
    if key not in seen:
        seen.add(key)
        logger.warning(msg)


def _entry_of(index: Any) -> int | None:
    """The int an index is cached under: a Python int, a numpy integer, a 0-dim integer CPU
    tensor (never a bool, a float or a timedelta); None for any other key."""
    if type(index) is int:
        return index
    if isinstance(index, np.integer) and not isinstance(index, np.timedelta64):
        return int(index)
    if isinstance(index, torch.Tensor) and index.dim() == 0 and index.device.type == "cpu" and \
            index.dtype != torch.bool and not index.is_floating_point() and not index.is_complex():
        return int(index)
    return None


def _is_samples(got: Any, n: int) -> bool:
    """Whether a ``__getitems__`` result is n samples (a list or tuple of them), not a batch."""
    return type(got) in (list, tuple) and len(got) == n


def _check_max_bytes(max_bytes: Any) -> int:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)) or max_bytes < 0:
        raise ValueError(f"fastcollate.Cached: max_bytes must be an int >= 0, got {max_bytes!r}")
    if max_bytes > MAX_BYTES:
        raise ValueError(f"fastcollate.Cached: max_bytes={int(max_bytes)} is more than a cache can map: at most "
                         f"MAX_BYTES = 2**46 ({MAX_BYTES} bytes), as the data segment is mapped whole into every "
                         "process that holds the cache")
    return int(max_bytes)


def _segments(entries: int, max_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """New, empty segments (a control block for ``entries`` indices, ``max_bytes`` of data)."""
    C = _ext._C
    ctrl = shared_segment(C.cache_ctrl_words(entries) * 8, "fastcollate-cache-index").view(torch.int64)
    try:
        data = shared_segment(max_bytes, "fastcollate-cache")
    except RuntimeError as exc:
        raise RuntimeError(f"fastcollate.Cached: could not map a data segment of max_bytes={max_bytes} "
                           f"bytes ({exc}); give a smaller max_bytes") from exc
    C.cache_init(ctrl, entries, max_bytes)
    return ctrl, data


def _default_max_bytes() -> int:
    return _check_max_bytes(default_max_bytes())


class Cached(DatasetWrapper, Dataset):
    """``dataset`` with a shared-memory sample cache that DataLoader workers fill in the first
    epoch and all read afterwards; ``transform`` runs after the cache, on every fetch.

    Args:
        dataset: a map-style dataset with ``__len__``. Wrap only a deterministic one: the cache
            keeps whatever ``dataset[i]`` returned the first time.
        transform: ``sample -> sample``, applied after the cache on every ``__getitem__`` (random
            augmentation stays random per epoch).
        max_bytes: the most bytes the cached samples may take (default
            :func:`default_max_bytes`: half the memory available now; at most ``MAX_BYTES``); a
            sample that does not fit the room left is fetched from ``dataset`` every time, and
            once the room left is less than a typical sample nothing more is inserted. For a
            node-wide cache: the node's budget, computed once by the rank that makes the cache.
        name: the key the ranks of a node share this cache under (default: the dataset's type and
            how many node-wide Cached of that type this process made before it); give each
            dataset its own, the same on every rank, when ranks may make them in different orders.
        node: None (the default): one cache for the whole node when the launcher runs several
            ranks on it (``LOCAL_WORLD_SIZE`` > 1) or a ``group`` is given; True: node-wide
            whatever the launcher says; False: private to this process and its workers.
        group: the ranks that share (default: ``FASTCOLLATE_CACHE_GROUP``, else the job the
            launcher names: ``TORCHELASTIC_RUN_ID``, ``MASTER_ADDR:MASTER_PORT``, SLURM's job).
        key: what the dataset is, in your words, for a node-wide cache: it replaces the
            fingerprint the ranks otherwise compare (fastcollate.cache.identity), and
            different keys are different caches (a per-rank shard: ``key=f"shard-{rank}"``).
            Without it, a rank whose dataset differs from the cache's (same type and length,
            other content) is refused with the parts that differ, never served the other's samples.

    Works with torch's and fastcollate's DataLoader, any number of workers, persistent or not,
    fork, spawn or forkserver, either sharing strategy; ``stats()`` in the main process counts
    every worker. A transparent wrapper: attributes it does not own (anything but ``dataset``,
    ``transform``, ``max_bytes`` and the cache's handles) are read from and set on ``dataset``.
    ``copy.copy`` shares the dataset and the cache; ``copy.deepcopy`` copies the dataset and
    makes a new, empty, private cache. Under torchrun the ranks of a node share one cache
    (fastcollate.cache.per_node). The module's docstring (fastcollate.cache.cached) says how, and
    what it costs.

    >>> import torch, fastcollate
    >>> base = [torch.arange(3) * i for i in range(8)]
    >>> ds = fastcollate.Cached(base, transform=lambda x: x + 1, max_bytes=1 << 20)
    >>> [ds[i].tolist() for i in (2, 2)]
    [[1, 3, 5], [1, 3, 5]]
    >>> s = ds.stats(); (s["hits"], s["misses"], s["inserts"])
    (1, 1, 1)
    """

    # the wrapper's own attributes (fastcollate.cache.wrapper): every other one is the dataset's
    _own_attributes = frozenset({"dataset", "transform", "max_bytes", "id", "entries", "ctrl", "data", "_local",
                                 "_node", *_LOCAL})

    def __init__(self, dataset: Any, transform: Callable[[Any], Any] | None = None,
                 max_bytes: int | None = None, *, name: str | None = None, node: bool | None = None,
                 group: str | None = None, key: str | None = None) -> None:
        if isinstance(dataset, IterableDataset):
            raise TypeError("fastcollate.Cached: an IterableDataset has no indices to cache by; wrap a map-style "
                            "dataset (one with __getitem__ and __len__)")
        try:
            len(dataset)
        except TypeError as exc:
            raise TypeError(f"fastcollate.Cached: the dataset ({type(dataset).__name__}) has no len(), which "
                            f"sizes the cache's index") from exc
        if transform is not None and not callable(transform):
            raise TypeError(f"fastcollate.Cached: transform must be callable or None, got {type(transform).__name__}")
        for arg, value in (("name", name), ("group", group), ("key", key)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise TypeError(f"fastcollate.Cached: {arg} must be a non-empty str or None, got {value!r}")
        if node not in (None, True, False):
            raise TypeError(f"fastcollate.Cached: node must be None (share when the launcher runs several ranks "
                            f"on this node), True or False, got {node!r}")
        if max_bytes is not None:
            max_bytes = _check_max_bytes(max_bytes)
        self.dataset = dataset
        self.transform = transform
        self._open(max_bytes, cache_node.group_for(node, group), name, key)

    def _open(self, max_bytes: int | None, group: str | None = None, name: str | None = None,
              key: str | None = None) -> None:
        """Makes this wrapper's cache for len(dataset) entries: new, empty segments of max_bytes
        (None: the default), or, with a group, the node's cache under its key, joined or made."""
        self.id = uuid.uuid4().hex
        self.entries = int(len(self.dataset))
        self.ctrl: torch.Tensor | None = None
        self.data: torch.Tensor | None = None
        self._local: torch.Tensor | None = None  # this rank's own counters, where the cache is the node's
        self._node: cache_node.NodeCache | None = None
        if _ext._C is None:
            self.max_bytes = _default_max_bytes() if max_bytes is None else max_bytes
            logger.warning("fastcollate.Cached: the compiled engine is not loaded (%s); nothing is cached, every "
                           "sample comes from the dataset", _ext.LOAD_ERROR)
        elif group is not None and self._join(max_bytes, group, cache_node.key_for(self.dataset, name), key):
            C = _ext._C
            self._local = shared_segment(C.cache_ctrl_words(0) * 8, "fastcollate-cache-rank").view(torch.int64)
            C.cache_init(self._local, 0, 0)
        else:
            self.max_bytes = _default_max_bytes() if max_bytes is None else max_bytes
            self.ctrl, self.data = _segments(self.entries, self.max_bytes)
        _CACHES[self.id] = self

    def _join(self, max_bytes: int | None, group: str, key: str, given: str | None) -> bool:
        """Whether this wrapper now holds the node's cache under key (False: keep a private one)."""
        try:
            self.ctrl, self.data, self.max_bytes, self._node = cache_node.open_node(
                group, key, self.dataset, self.entries, max_bytes, _default_max_bytes,
                lambda size: _segments(self.entries, size), cache_identity.fingerprint(self.dataset, given))
        except cache_node.Unreachable as exc:
            logger.warning("fastcollate.Cached: %s; this process keeps a private cache", exc)
            return False
        if self._node.check:
            self._spot_check()
        return True

    def _spot_check(self) -> None:
        """Where the fingerprints could only sample: a few samples already in the node's cache,
        fetched from this rank's dataset and compared; a difference lets the cache go and raises."""
        C = _ext._C
        words = C.cache_words
        table = self.ctrl[words["header"]:words["header"] + self.entries * words["entry_words"]]
        states = table.view(self.entries, words["entry_words"])[:, words["entry_state"]]
        ready = cache_identity.evenly((states == C.cache_states["ready"]).nonzero().flatten().numpy())
        segment = self._segment()

        def cached(i: int) -> tuple[np.ndarray, Callable[[], Any]]:
            span = C.cache_find(self.ctrl, i)
            return segment[0][span.offset:span.offset + span.length], lambda: decode(segment[1], span.offset)

        bad = cache_identity.spot_check(ready, cached, lambda i: self.dataset[i], encode)
        if bad is None:
            return
        node, fp = self._node, self._node.fingerprint
        self.ctrl = self.data = self._node = None
        self.__dict__.pop("_seg", None)
        node.leave()
        raise ValueError(
            f"fastcollate.Cached: this dataset is not the one the node's cache under {node.key!r} holds: sample {bad} "
            f"from it differs from the cached sample {bad}. The fingerprints agreed but could only sample "
            f"({'; '.join(fp.sampled) if fp is not None else 'unknown'}), so the samples were compared. If the "
            "ranks wrap different data, give each its own key -- Cached(ds, key=f'shard-{rank}') -- or node=False; "
            "if the dataset is not deterministic (dataset[i] differs from call to call), do not cache it: put the "
            "random part in transform=")

    # -- copies and sharing with workers
    def __copy__(self) -> "Cached":
        # a new wrapper (its own transform, its own id) over the same dataset object and the same cache
        new = type(self).__new__(type(self))
        new.__dict__.update((k, v) for k, v in self.__dict__.items() if k not in ("_warned", "_batches"))
        new.__dict__["id"] = uuid.uuid4().hex
        _CACHES[new.id] = new
        return new

    def __deepcopy__(self, memo: dict) -> "Cached":
        # the dataset and the transform copied, and a new, empty cache: the copy's dataset may
        # diverge from this one's, so it must never be served this one's samples
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            if k not in self._own_attributes or k in ("dataset", "transform", "max_bytes"):
                new.__dict__[k] = copy.deepcopy(v, memo)
        new._open(new.max_bytes)  # private, even when this one is the node's: the ranks' copies may differ
        return new

    def __reduce__(self):
        from multiprocessing import context

        if self.ctrl is not None and context.get_spawning_popen() is not None:
            # a spawn/forkserver worker being started: the segments travel as their memfds, never
            # through torch's sharing strategy; a forked worker inherits them and pickles nothing
            state = {k: v for k, v in self.__dict__.items() if k not in _LOCAL}
            state["ctrl"], state["data"] = send_segment(self.ctrl), send_segment(self.data)
            if self._local is not None:
                state["_local"] = send_segment(self._local)
            return (_worker_cache, (state, type(self)))
        # a plain pickle is the same wrapper where it exists: never a copy of the cache
        return (_same_cache, (self.id, self.dataset, self.transform, self.max_bytes))

    def __repr__(self) -> str:
        node = "" if self._node is None else f", node-wide: {self._node.key!r}"
        return f"Cached({self.dataset!r}, transform={self.transform!r}, max_bytes={self.max_bytes}{node})"

    def __len__(self) -> int:
        return len(self.dataset)

    # -- fetching
    def __getitem__(self, index: Any) -> Any:
        sample = self._get(index)
        return sample if self.transform is None else self._transform(sample)

    @property
    def __getitems__(self) -> Callable[[Sequence[Any]], Any]:
        # torch's fetcher calls dataset.__getitems__(indices) when the dataset has one: so does this
        # wrapper, exactly when the wrapped dataset has one
        if getattr(self.dataset, "__getitems__", None) is None:
            raise AttributeError("__getitems__")
        return self._getitems

    def _active(self) -> bool:
        return self.ctrl is not None and not disabled()

    def _transform(self, sample: Any) -> Any:
        if self.ctrl is None:
            return self.transform(sample)
        t0 = time.perf_counter_ns()
        out = self.transform(sample)
        self._count("transform_ns", time.perf_counter_ns() - t0)
        return out

    def _count(self, name: str, value: int) -> None:
        C = _ext._C
        C.cache_add(self.ctrl, C.cache_words[name], value)
        if self._local is not None:
            C.cache_add(self._local, C.cache_words[name], value)

    def _index(self, index: Any) -> int:
        """The entry of ``index``, or -1 for a key that is not cached."""
        i = _entry_of(index)
        return i if i is not None and 0 <= i < self.entries and self._active() else -1

    def _segment(self) -> tuple[np.ndarray, memoryview]:
        seg = self.__dict__.get("_seg")
        if seg is None:  # this process's view of the data segment, made once
            arr = self.data.numpy()
            seg = self.__dict__["_seg"] = (arr, memoryview(arr))
        return seg

    def _read(self, i: int) -> Any:
        t0 = time.perf_counter_ns()
        span = _ext._C.cache_find(self.ctrl, i)
        if span.offset < 0:
            return _MISS
        sample = decode(self._segment()[1], span.offset)
        self._count("hits", 1)
        self._count("hit_ns", time.perf_counter_ns() - t0)
        return sample

    def _claim(self, i: int, pid: int) -> bool:
        """Whether this process now holds entry i, to insert the sample it is about to fetch."""
        C = _ext._C
        claim = C.cache_claim(self.ctrl, i, pid)
        if claim.outcome == C.cache_claims["busy"] and claim.holder != pid and not pid_alive(claim.holder):
            # its writer died mid-insert: the entry is free again (the writer's reserved bytes stay)
            C.cache_release(self.ctrl, i, claim.holder, 0, reclaimed=True)
            claim = C.cache_claim(self.ctrl, i, pid)
        return claim.outcome == C.cache_claims["claimed"]

    def _fetch(self, indices: list[Any], entries: list[int], batched: bool = False) -> Any:
        """The dataset's samples for indices (``batched``: one ``__getitems__`` call, else
        ``dataset[index]``), each inserted whose entry this process could claim; or, when
        ``__getitems__`` returned a batch rather than samples, that batch in a _Batch."""
        pid = os.getpid()
        held: dict[int, int] = {}  # position -> entry this call claimed and has not yet published or given up
        try:
            for p, i in enumerate(entries):
                if i >= 0 and self._claim(i, pid):
                    held[p] = i
            t0 = time.perf_counter_ns()
            got = self.dataset.__getitems__(indices) if batched else [self.dataset[index] for index in indices]
            self._count("misses", len(indices))
            self._count("fetch_ns", time.perf_counter_ns() - t0)
            if not _is_samples(got, len(indices)):
                return _Batch(got)  # nothing is cached from a batch
            for p in list(held):
                self._insert(held[p], pid, got[p])
                del held[p]
            return got
        finally:  # an exception (a failed fetch, Ctrl-C mid-insert): no entry stays claimed
            for i in held.values():
                _ext._C.cache_release(self.ctrl, i, pid, 0)

    def _insert(self, i: int, pid: int, sample: Any) -> None:
        """Publishes sample as entry i (held by pid), or gives the entry up: uncacheable, or refused
        for want of room. On an exception the caller releases the claim."""
        C = _ext._C
        t0 = time.perf_counter_ns()
        try:
            blob = encode(sample)
        except Exception as exc:  # refused (Uncacheable) or not picklable: fetched every time
            C.cache_release(self.ctrl, i, pid, C.cache_states["uncacheable"])
            why = str(exc) if isinstance(exc, Uncacheable) else f"{type(exc).__name__}: {exc}"
            _warn_once(self, f"uncacheable:{type(exc).__name__}:{why[:60]}",
                       f"fastcollate.Cached: sample {i} is not cached ({why}); it is fetched from the dataset every "
                       "time")
            return
        offset = C.cache_reserve(self.ctrl, i, pid, blob.nbytes)
        if offset < 0:  # refused for want of room: the entry is marked so, never tried again
            self._warn_refused(i, blob.nbytes)
            return
        blob.write(self._segment()[0], offset)
        if C.cache_publish(self.ctrl, i, pid, offset, blob.nbytes) and self._local is not None:
            C.cache_add(self._local, C.cache_words["inserts"], 1)  # the shared words count it in the engine
            C.cache_add(self._local, C.cache_words["payload"], blob.nbytes)
        self._count("insert_ns", time.perf_counter_ns() - t0)

    def _warn_refused(self, i: int, nbytes: int) -> None:
        words = _ext._C.cache_words
        header = self.ctrl[:words["header"]].tolist()
        room, need = self.max_bytes - header[words["top"]], -(-nbytes // ALIGN) * ALIGN
        said = (f"fastcollate.Cached: sample {i} ({nbytes} bytes serialized, {need} in the cache) does not fit the "
                f"{room} bytes left of max_bytes={self.max_bytes}")
        if header[words["full"]]:
            inserts = max(1, header[words["inserts"]])
            _warn_once(self, "full", f"{said}, less than a typical cached sample ({header[words['payload']] // inserts} "
                                     "bytes): the cache is full. Cached samples are still served; no more are "
                                     "inserted, and the others are fetched from the dataset every time")
        else:
            _warn_once(self, "refused", f"{said}: it is not cached and is fetched from the dataset every time; "
                                        "smaller samples are still inserted (stats()['refused_full'] counts the "
                                        "samples refused so)")

    def _get(self, index: Any) -> Any:
        i = self._index(index)
        if i >= 0:
            sample = self._read(i)
            if sample is not _MISS:
                return sample
        elif not self._active():
            return self.dataset[index]
        return self._fetch([index], [i])[0]

    def _getitems(self, indices: Sequence[Any]) -> Any:
        if not self._active() or self.__dict__.get("_batches"):  # passed through
            got = self.dataset.__getitems__(indices)
            return self._batch(got) if not _is_samples(got, len(indices)) else self._transformed(list(got))
        keys = list(indices)
        out: list[Any] = [_MISS] * len(keys)
        entries = [self._index(k) for k in keys]
        for p, i in enumerate(entries):
            if i >= 0:
                out[p] = self._read(i)
        missing = [p for p, s in enumerate(out) if s is _MISS]
        if missing:
            fetched = self._fetch([keys[p] for p in missing], [entries[p] for p in missing], batched=True)
            if isinstance(fetched, _Batch):  # the dataset returns batches: never cached, passed through
                self.__dict__["_batches"] = True
                return self._batch(fetched.batch if len(missing) == len(keys) else self.dataset.__getitems__(indices))
            for p, sample in zip(missing, fetched):
                out[p] = sample
        return self._transformed(out)

    def _transformed(self, samples: list[Any]) -> list[Any]:
        return samples if self.transform is None else [self._transform(s) for s in samples]

    def _batch(self, batch: Any) -> Any:
        """A batch the dataset's ``__getitems__`` returned (not a list of samples), as torch would
        hand it to the collate_fn; a per-sample transform cannot apply to it."""
        name = type(self.dataset).__name__
        if self.transform is not None:
            raise TypeError(f"fastcollate.Cached: {name}.__getitems__ returned a batch ({type(batch).__name__}), not "
                            f"a list of samples, and transform= applies to one sample; apply it in the dataset or "
                            "the collate_fn, or wrap a dataset whose __getitems__ returns a list of samples")
        _warn_once(self, "batches", f"fastcollate.Cached: {name}.__getitems__ returns a batch "
                                    f"({type(batch).__name__}), not a list of samples: its batches are passed "
                                    "through as they are and nothing is cached from them")
        return batch

    # -- measuring
    def stats(self) -> dict[str, Any]:
        """What every process holding this cache did with it so far (shared counters): ``hits``,
        ``misses``, ``inserts`` (samples cached), ``bytes`` (of the data segment in use),
        ``payload_bytes`` (of the cached entries), ``capacity`` (max_bytes), ``full``,
        ``refused_full``, ``uncacheable``, ``reclaimed``, ``entries`` (the dataset's length when
        wrapped), and the seconds spent in ``hit_s``, ``fetch_s`` (the dataset, on misses),
        ``insert_s`` and ``transform_s``; ``enabled`` is False when nothing can be cached (no
        compiled engine). Where the cache is node-wide (``node`` True, under ``node_key``) those
        sum over every rank of the node and their workers, ``holders`` is how many ranks hold it
        now, and ``rank`` has this rank's own (it and its workers): ``hits``, ``misses``,
        ``inserts``, ``payload_bytes`` and the four times; for a private cache ``rank`` repeats
        the totals and ``holders`` is 1."""
        if self.ctrl is None:
            return {"enabled": False, "hits": 0, "misses": 0, "inserts": 0, "bytes": 0, "capacity": 0,
                    "entries": self.entries, "node": False, "holders": 0}
        words = _ext._C.cache_words
        header = self.ctrl[:words["header"]].tolist()
        own = header if self._local is None else self._local[:words["header"]].tolist()

        def w(name: str, of: list[int] = header) -> int:
            return int(of[words[name]])

        out = {"enabled": True, "hits": w("hits"), "misses": w("misses"), "inserts": w("inserts"),
               "bytes": w("top"), "payload_bytes": w("payload"), "capacity": w("capacity"),
               "full": bool(w("full")), "refused_full": w("refused_full"), "uncacheable": w("uncacheable"),
               "reclaimed": w("reclaimed"), "entries": w("entries"),
               "hit_s": w("hit_ns") / 1e9, "fetch_s": w("fetch_ns") / 1e9, "insert_s": w("insert_ns") / 1e9,
               "transform_s": w("transform_ns") / 1e9,
               "node": self._node is not None, "holders": 1 if self._node is None else self._node.holders(),
               "rank": {"hits": w("hits", own), "misses": w("misses", own), "inserts": w("inserts", own),
                        "payload_bytes": w("payload", own), "hit_s": w("hit_ns", own) / 1e9,
                        "fetch_s": w("fetch_ns", own) / 1e9, "insert_s": w("insert_ns", own) / 1e9,
                        "transform_s": w("transform_ns", own) / 1e9}}
        if self._node is not None:
            out["node_key"] = self._node.key
        return out

    @staticmethod
    def estimate(samples: Iterable[Any], repeats: int = 3) -> dict[str, Any]:
        """What caching these samples would cost, measured here without a cache: for a model of
        a cached epoch before making one (fastcollate's doctor uses it on samples it fetched).

        Returns ``samples``, ``cacheable`` (how many can be cached exactly), ``bytes_per_sample``
        (what each takes in the data segment, 64-byte aligned), ``write_s_per_sample`` and
        ``read_s_per_sample`` (serializing + copying in, and reading back as new objects: the
        median over ``repeats`` rounds, per cacheable sample). A cached epoch's per-sample work in
        a worker is then ``read_s_per_sample`` plus the transform's time; the whole dataset needs
        about ``len(dataset) * bytes_per_sample`` of ``max_bytes``.

        >>> import torch, fastcollate
        >>> e = fastcollate.Cached.estimate([torch.zeros(1000) for _ in range(4)])
        >>> e["cacheable"], e["bytes_per_sample"] > 4000
        (4, True)
        """
        samples = list(samples)
        cacheable = []
        for s in samples:
            try:
                encode(s)
            except Exception:  # refused or not picklable: never cached
                continue
            cacheable.append(s)
        writes, reads, nbytes = [], [], 0
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            blobs = [encode(s) for s in cacheable]
            sizes = [-(-b.nbytes // ALIGN) * ALIGN for b in blobs]
            offsets = np.cumsum([0] + sizes[:-1]).tolist()
            segment = np.empty(max(1, sum(sizes)), np.uint8)
            for b, o in zip(blobs, offsets):
                b.write(segment, o)
            t1 = time.perf_counter()
            view = memoryview(segment)
            for o in offsets:
                decode(view, o)
            t2 = time.perf_counter()
            writes.append(t1 - t0)
            reads.append(t2 - t1)
            nbytes = sum(sizes)
        k = max(1, len(cacheable))
        return {"samples": len(samples), "cacheable": len(cacheable), "bytes_per_sample": nbytes / k,
                "write_s_per_sample": statistics.median(writes) / k,
                "read_s_per_sample": statistics.median(reads) / k}


class _Batch:
    """What _fetch returns when the dataset's ``__getitems__`` gave a batch, not samples."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch


def _worker_cache(state: dict[str, Any], cls: type = None) -> Cached:
    cache = (cls or Cached).__new__(cls or Cached)
    cache.__dict__.update(state)
    return _CACHES.setdefault(cache.id, cache)


def _same_cache(cache_id: str, dataset: Any, transform: Any, max_bytes: int) -> Cached:
    cache = _CACHES.get(cache_id)
    return cache if cache is not None else Cached(dataset, transform, max_bytes, node=False)
