"""The doctor's proof that a dataset may be cached: ``dataset[i]`` is the same every time it is
fetched, whoever fetches it, under whatever seeds.

fastcollate.Cached keeps what the first fetch returned, so caching a dataset with any randomness
in it freezes that randomness (epoch 2 = epoch 1, row for row). Fetching a few indices twice in
the main process proves nothing: a flip with p = 0.1 passes that ~half the time, and randomness
drawn from a worker-seeded generator, from the epoch, from a minority class or from a file passes
it always. The proof here:

* **Epoch-dependent** datasets -- a ``set_epoch`` method or an ``epoch`` attribute anywhere in the
  chain of wrapped datasets -- change on purpose from epoch to epoch: never cached (and never given
  persistent workers, whose copies of the dataset would stay at the epoch they started in).
* The indices are the ones the user's loader fetches: its sampler's (or batch sampler's) epoch,
  not ``range(len(dataset))`` -- a custom sampler may yield string keys, a Subset a few indices.
* **Where and how the loader fetches**: in DataLoader workers started as the user's loader starts
  them (their ``worker_init_fn``, their multiprocessing context), through ``__getitems__`` where
  the dataset has one. A spread sample of the indices (64 at least) is fetched by two workers
  (different torch, numpy and ``random`` seeds, as torch gives each worker) and once more in the
  main process under other seeds; then, where the time allowed covers it, *every* index twice
  more, in other batches and another order. Each fetch is reduced, in the process that fetched it,
  to a digest of exactly what the cache would store (fastcollate.cache.codec: types, dtypes,
  shapes, strides, bytes). One difference anywhere is proof of randomness.
* What cannot be proven is never proposed as a change -- only named in a conditional line that
  says what the user must know to be true: when only the sample was checked (the whole dataset
  would take too long), or when the fetches read files (bytes read per sample, from the kernel's
  count), whose contents may change during training.

The global random states of the calling process (torch, numpy, ``random``) are restored afterwards.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import random
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.utils.data as tud

SAMPLE = 64           # indices in the spread sample, fetched in three contexts
FILE_BYTES = 256      # read() bytes per fetch beyond which it reads files (a worker's queue reads ~5 a sample)
_CHUNK_A, _CHUNK_B = 8, 5  # batch sizes of the two full passes: another batch, another position
_BATCH = "batch"      # what a worker reports for a __getitems__ that returns a batch, not samples


@dataclasses.dataclass
class Proof:
    """What the proof found. ``verdict``:

    - ``"proven"``: every index the loader fetches in an epoch gave equal samples in every context;
    - ``"sampled"``: the spread sample did, the rest was not checked (time);
    - ``"random"``: a fetch differed (``why`` says which index, in which contexts);
    - ``"epoch"``: the dataset changes with the epoch on purpose (``set_epoch``, ``epoch``);
    - ``"iterable"``, ``"keys"``, ``"batch"``, ``"uncacheable"``, ``"failed"``: the cache cannot serve
      it (an IterableDataset; keys that are not integers; a ``__getitems__`` that returns a batch;
      a sample the cache cannot store exactly; the fetch itself failed -- ``why`` says).
    """

    verdict: str
    why: str
    indices: int = 0               # in the loader's epoch
    checked: int = 0               # indices compared in at least two contexts
    contexts: list[str] = dataclasses.field(default_factory=list)
    file_bytes_per_sample: float = 0.0
    files: list[str] = dataclasses.field(default_factory=list)  # regular files a worker held open while fetching
    bytes_per_sample: float = 0.0  # in the cache's data segment (64-byte aligned), mean of the checked
    main_fetch_ok: bool = True     # whether the dataset can be fetched in the main process at all
    seconds: float = 0.0

    @property
    def reads_files(self) -> bool:
        return self.file_bytes_per_sample > FILE_BYTES or bool(self.files)

    def cacheable(self, files_static: bool = False) -> bool:
        """Whether the cache may be proposed as a change: proven, and no files read (or the user
        says they do not change)."""
        return self.verdict == "proven" and (files_static or not self.reads_files)

    def conditional(self, files_static: bool = False) -> bool:
        """Whether the cache may only be named on a condition the user must know to be true."""
        return self.verdict == "sampled" or (self.verdict == "proven" and not self.cacheable(files_static))


# ---- what the loader fetches --------------------------------------------------------------------

def epoch_shared(dataset: Any) -> bool:
    """Whether ``dataset`` keeps its epoch where every worker reads it (its class says
    ``epoch_reaches_workers = True``: fastcollate.images.ImageFolder), so that persistent
    workers follow ``set_epoch``."""
    return bool(getattr(type(dataset), "epoch_reaches_workers", False))


def epoch_attribute(dataset: Any) -> str | None:
    """The name of what makes ``dataset`` (or a dataset it wraps) change with the epoch: a
    ``set_epoch`` method or an ``epoch`` attribute; None when there is none."""
    seen: set[int] = set()
    stack = [dataset]
    while stack:
        ds = stack.pop()
        if ds is None or id(ds) in seen:
            continue
        seen.add(id(ds))
        if callable(getattr(type(ds), "set_epoch", None)):
            return f"{type(ds).__name__}.set_epoch"
        names = list(getattr(ds, "__dict__", {})) + [n for n in dir(type(ds)) if not n.startswith("__")]
        for name in names:
            if "epoch" in name.lower():
                return f"{type(ds).__name__}.{name}"
        inner = getattr(ds, "__dict__", {})
        stack.extend(v for k, v in inner.items() if k in ("dataset", "datasets", "base", "source") and v is not ds)
        stack.extend(d for v in inner.values() if isinstance(v, (list, tuple)) for d in v
                     if isinstance(d, tud.Dataset))
    return None


def epoch_indices(loader: Any, limit: int = 1 << 22) -> list[Any]:
    """The indices ``loader`` fetches in one epoch, in its order (at most ``limit``)."""
    source = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    out: list[Any] = []
    for item in source:
        if loader.batch_sampler is not None:
            out.extend(item)
        else:
            out.append(item)
        if len(out) >= limit:
            break
    return out


def integer_key(index: Any) -> bool:
    """Whether the cache files ``index`` under an integer (fastcollate.Cached's rule)."""
    if isinstance(index, bool):
        return False
    if isinstance(index, (int, np.integer)):
        return True
    return (isinstance(index, torch.Tensor) and index.dim() == 0 and not index.is_floating_point()
            and not index.is_complex() and index.dtype != torch.bool)


def spread(n: int, k: int) -> list[int]:
    """k positions spread evenly over range(n) (all of them when n <= k)."""
    if n <= k:
        return list(range(n))
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})


# ---- fetching, digested where it is fetched -------------------------------------------------------

def digest(sample: Any) -> tuple[str, int]:
    """(a digest of what the cache would store for sample, its bytes there); ("!why", 0) when the
    cache cannot store it."""
    from ..cache.codec import ALIGN, encode

    try:
        blob = encode(sample)
    except Exception as exc:  # refused (Uncacheable) or not picklable: the cache would not keep it
        return ("!" + f"{type(exc).__name__}: {exc}"[:200], 0)
    h = hashlib.blake2b(digest_size=16)
    h.update(blob.head)
    for b in blob.buffers:
        h.update(b)
    return (h.hexdigest(), -(-blob.nbytes // ALIGN) * ALIGN)


def digests(samples: Any) -> Any:
    """A DataLoader collate_fn that runs in the worker: each sample's digest, not the sample."""
    if not isinstance(samples, list):
        return _BATCH
    return [digest(s) for s in samples]


def fetch(dataset: Any, indices: Sequence[Any]) -> list[Any]:
    """The samples of ``indices`` as torch's map-style fetcher gets them (``__getitems__`` if any)."""
    getitems = getattr(dataset, "__getitems__", None)
    if getitems:
        out = getitems(list(indices))
        return out if isinstance(out, list) else _BATCH  # type: ignore[return-value]
    return [dataset[i] for i in indices]


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """torch, numpy and ``random`` seeded with ``seed``; the caller's states restored after."""
    states = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])


def open_files(pid: int) -> list[str]:
    """The regular files process ``pid`` holds open, leaving out Python's own (its prefix: modules,
    extensions) and anonymous memory (memfds, deleted files)."""
    import stat
    import sys

    skip = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            path = os.readlink(f"/proc/{pid}/fd/{fd}")
            mode = os.stat(f"/proc/{pid}/fd/{fd}").st_mode
        except OSError:
            continue
        if (stat.S_ISREG(mode) and path.startswith("/") and not path.endswith("(deleted)")
                and not path.startswith(("/dev/", "/proc/", "/memfd:")) and not path.startswith(skip)):
            out.append(path)
    return sorted(set(out))


def _rchar(pid: int | str = "self") -> int | None:
    """Bytes the process has read with read() and the like (files, pipes), from /proc."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class _Pass:
    """One context's fetches: each position's digest, and the bytes read per fetch."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.digests: dict[int, tuple[str, int]] = {}
        self.read_bytes = 0
        self.read_fetches = 0
        self.seconds = 0.0
        self.batch = False
        self.files: list[str] = []

    def add(self, positions: Sequence[int], out: Any) -> None:
        if isinstance(out, str) and out == _BATCH:
            self.batch = True
            return
        for p, d in zip(positions, out):
            self.digests[p] = d


def main_pass(dataset: Any, indices: Sequence[Any], positions: Sequence[int], seed: int, name: str) -> _Pass:
    """Fetches (in the main process) the indices at ``positions``, a batch of 8 at a time."""
    res = _Pass(name)
    r0, t0 = _rchar(), time.perf_counter()
    with seeded(seed):
        for k in range(0, len(positions), _CHUNK_A):
            chunk = positions[k:k + _CHUNK_A]
            res.add(chunk, digests(fetch(dataset, [indices[p] for p in chunk])))
    res.seconds = time.perf_counter() - t0
    r1 = _rchar()
    if r0 is not None and r1 is not None:
        res.read_bytes, res.read_fetches = r1 - r0, len(positions)
    return res


def worker_pass(dataset: Any, indices: Sequence[Any], batches: list[list[int]], labels: list[str], workers: int,
                seed: int, loader_kwargs: dict[str, Any]) -> dict[str, _Pass]:
    """Fetches, in ``workers`` DataLoader workers started as the user's loader starts them, the
    batches of positions ``batches`` (delivered in order; torch hands batch k to worker k mod
    ``workers`` and seeds each worker apart); batch k's digests go to the context ``labels[k]``."""
    out = {name: _Pass(name) for name in dict.fromkeys(labels)}
    kw = {k: v for k, v in loader_kwargs.items() if k in ("worker_init_fn", "multiprocessing_context", "timeout")}
    t0 = time.perf_counter()
    read = fetched = 0
    files: list[str] = []
    # a forked worker inherits every file this process holds open (a log, a test runner's
    # capture file): only what the workers opened themselves says the dataset reads files
    inherited = set(open_files(os.getpid()))
    with seeded(seed):
        loader = tud.DataLoader(dataset, batch_sampler=[[indices[p] for p in b] for b in batches],
                                num_workers=workers, collate_fn=digests, **kw)
        it = iter(loader)
        r0: dict[int, int] = {}
        for k, (b, name) in enumerate(zip(batches, labels)):
            out[name].add(b, next(it))
            if k == 0:  # the workers have started (their imports read files): count from here
                r0 = {p: v for w in getattr(it, "_workers", ()) if (v := _rchar(p := w.pid)) is not None}
            elif r0:
                fetched += len(b)
            if k == len(batches) - 1 and r0:  # before StopIteration ends the workers, and their counts
                read = sum(v - r0[p] for p in r0 if (v := _rchar(p)) is not None)
                files = sorted({f for p in r0 for f in open_files(p)} - inherited)
        del it, loader
    seconds = time.perf_counter() - t0
    for res in out.values():
        res.seconds = seconds * len(res.digests) / max(1, sum(len(b) for b in batches))
        if fetched:
            res.read_bytes, res.read_fetches = read, fetched
        res.files = files
    return out


# ---- the proof -------------------------------------------------------------------------------------

def prove(dataset: Any, loader_kwargs: dict[str, Any], batch_size: int | None, *, workers: int = 2,
          allowed_s: float = 5.0, use_workers: bool = True, seed: int = 0x5EED,
          say: Callable[[str], None] = lambda m: None) -> Proof:
    """Whether ``dataset``, fetched as a DataLoader with ``loader_kwargs`` fetches it, gives the
    same sample for an index every time (the module's docstring says how). ``allowed_s``: the
    time the whole-epoch check may take (estimated from the sample's before it starts)."""
    t_start = time.perf_counter()

    def done(verdict: str, why: str, **kw: Any) -> Proof:
        return Proof(verdict, why, seconds=time.perf_counter() - t_start, **kw)

    if isinstance(dataset, tud.IterableDataset):
        return done("iterable", "an IterableDataset has no indices to cache by")
    epoch = epoch_attribute(dataset)
    if epoch is not None:
        return done("epoch", f"it changes with the epoch on purpose ({epoch})")
    indices = epoch_indices(tud.DataLoader(dataset, batch_size=batch_size, **sampling_kwargs(loader_kwargs)))
    n = len(indices)
    if n == 0:
        return done("failed", "the loader fetches no index")
    bad = next((i for i in indices if not integer_key(i)), None)
    if bad is not None:
        return done("keys", f"its sampler yields keys like {bad!r} ({type(bad).__name__}): fastcollate.Cached "
                            "caches integer indices only", indices=n)
    sample = spread(n, SAMPLE)
    passes: list[_Pass] = []
    failures: list[str] = []
    if use_workers:
        # each batch of the sample twice in a row: to worker 0, then to worker 1
        pairs = [b for k in range(0, len(sample), _CHUNK_A) for b in (sample[k:k + _CHUNK_A],) * 2]
        say(f"proving the dataset deterministic: {len(sample)} of its {n} indices, in two workers")
        try:
            passes += worker_pass(dataset, indices, pairs, ["worker 0", "worker 1"] * (len(pairs) // 2), 2,
                                  seed + 1, loader_kwargs).values()
        except Exception as exc:  # the user's loader would fail alike: the probes will say so
            failures.append(f"in a worker: {type(exc).__name__}: {exc}")
    main_ok = True
    try:
        passes.append(main_pass(dataset, indices, sample, seed + 2, "the main process"))
    except Exception as exc:
        main_ok = False
        failures.append(f"in the main process: {type(exc).__name__}: {exc}")
    common: dict[str, Any] = {"indices": n, "main_fetch_ok": main_ok}
    if any(p.batch for p in passes):
        return done("batch", "its __getitems__ returns a batch, not a list of samples: the cache keeps samples",
                    **common)
    if len(passes) < 2:
        return done("failed", "it could not be fetched in two contexts (" + "; ".join(failures) + ")", **common)
    common.update(contexts=[p.name for p in passes], file_bytes_per_sample=_file_bytes(passes),
                  bytes_per_sample=_bytes_per_sample(passes), files=_files(passes))
    differs = _compare(passes, sample, indices)
    if differs is not None:
        return done(*differs, checked=len(sample), **common)
    if len(sample) == n:
        return done("proven", f"all {n} indices gave equal samples in {len(passes)} contexts", checked=n, **common)
    # the whole epoch, twice, in workers: batches of other sizes, the second pass in reverse order
    per_fetch = max(p.seconds / max(1, len(p.digests)) for p in passes)
    estimate = 2 * n * per_fetch / max(1, workers)
    if not use_workers or estimate > allowed_s:
        why = (f"{len(sample)} of its {n} indices were checked, in {len(passes)} contexts; all of them would "
               f"take ~{estimate:.0f} s" if use_workers else
               f"{len(sample)} of its {n} indices were checked, in the main process only")
        return done("sampled", why, checked=len(sample), **common)
    say(f"proving the dataset deterministic: all {n} indices, twice, in {workers} workers")
    forward = [list(range(k, min(n, k + _CHUNK_A))) for k in range(0, n, _CHUNK_A)]
    back = list(range(n))[::-1]
    backward = [back[k:k + _CHUNK_B] for k in range(0, n, _CHUNK_B)]
    labels = ["workers, forward"] * len(forward) + ["workers, in reverse"] * len(backward)
    try:
        passes += worker_pass(dataset, indices, forward + backward, labels, workers, seed + 3, loader_kwargs).values()
    except Exception as exc:
        return done("sampled", f"{len(sample)} of its {n} indices were checked; the whole epoch failed in workers "
                               f"({type(exc).__name__}: {exc})", checked=len(sample), **common)
    common.update(contexts=[p.name for p in passes], file_bytes_per_sample=_file_bytes(passes),
                  bytes_per_sample=_bytes_per_sample(passes), files=_files(passes))
    differs = _compare(passes, range(n), indices)
    if differs is not None:
        return done(*differs, checked=n, **common)
    return done("proven", f"all {n} indices gave equal samples, each fetched twice in workers (and {len(sample)} "
                          f"of them in {len(passes) - 2} more contexts)", checked=n, **common)


def sampling_kwargs(loader_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The DataLoader arguments that decide which indices an epoch fetches, in what order."""
    return {k: v for k, v in loader_kwargs.items() if k in ("shuffle", "sampler", "batch_sampler", "drop_last",
                                                              "generator")}


def _compare(passes: list[_Pass], positions: Any, indices: Sequence[Any]) -> tuple[str, str] | None:
    """("random", why) or ("uncacheable", why) at the first position where the passes disagree."""
    for p in positions:
        seen = [(q.name, q.digests[p]) for q in passes if p in q.digests]
        for _, d in seen:
            if d[0].startswith("!"):
                return "uncacheable", f"a sample cannot be cached exactly ({d[0][1:]})"
        if len({d[0] for _, d in seen}) > 1:
            a = seen[0]
            b = next(s for s in seen if s[1][0] != a[1][0])
            return "random", f"index {indices[p]!r} gave different samples in {a[0]} and in {b[0]}"
    return None


def _bytes_per_sample(passes: list[_Pass]) -> float:
    sizes = [d[1] for d in max(passes, key=lambda q: len(q.digests)).digests.values()]
    return sum(sizes) / max(1, len(sizes))


def _files(passes: list[_Pass]) -> list[str]:
    return sorted({f for p in passes for f in p.files})[:8]


def _file_bytes(passes: list[_Pass]) -> float:
    counted = [p for p in passes if p.read_fetches]
    return max((p.read_bytes / p.read_fetches for p in counted), default=0.0)




def as_list(samples: Any) -> Any:
    """A DataLoader collate_fn that hands the samples back as they are (a worker's, pickled)."""
    return samples


def some_samples(dataset: Any, loader_kwargs: dict[str, Any], batch_size: int | None, k: int, in_main: bool) -> list:
    """``k`` samples spread over the loader's epoch, fetched as the loader fetches them: in the
    main process where that works, else in one worker started as the user's loader starts it."""
    indices = epoch_indices(tud.DataLoader(dataset, batch_size=batch_size, **sampling_kwargs(loader_kwargs)))
    chosen = [indices[p] for p in spread(len(indices), k)]
    if not chosen:
        return []
    if in_main:
        out = fetch(dataset, chosen)
        return out if isinstance(out, list) else []
    kw = {n: v for n, v in loader_kwargs.items() if n in ("worker_init_fn", "multiprocessing_context", "timeout")}
    loader = tud.DataLoader(dataset, batch_sampler=[chosen], num_workers=1, collate_fn=as_list, **kw)
    out = next(iter(loader))
    return out if isinstance(out, list) else []


__all__ = ["Proof", "prove", "epoch_attribute", "epoch_shared", "epoch_indices", "integer_key", "digest", "digests", "seeded",
           "some_samples", "sampling_kwargs"]
