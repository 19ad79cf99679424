"""collate and Collator: the arena policy (shared in workers, pinned on request, pooled
otherwise), the thread count, the kill switch, stats and error logging. The work itself is
fastcollate._C's; the semantics are fastcollate.reference's."""
from __future__ import annotations

import logging
import os
import threading
import warnings
from collections import Counter
from typing import Any, Literal, Sequence

import torch
from torch.utils.data import default_collate, get_worker_info

from .. import _ext
from . import trace as _trace

from . import reference
from .pad import PadSpec
from .shm import shared_segment

logger = logging.getLogger("fastcollate")

_lock = threading.Lock()
_py_counts: Counter = Counter()


def _count(key: str) -> None:
    with _lock:
        _py_counts[key] += 1


def disabled() -> bool:
    """True when ``FASTCOLLATE_DISABLE=1``: every collate is torch's default_collate itself.

    Read on every batch, so setting it takes effect at once (and in workers started after).
    """
    value = os.environ.get("FASTCOLLATE_DISABLE")
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def alloc_shared(nbytes: int) -> torch.Tensor:
    """A worker batch's arena: shared memory that reaches the main process without /dev/shm
    (sent as torch sends its own: in torch's DataLoader a batch is what default_collate's is)."""
    return shared_segment(nbytes, "fastcollate-batch")


# Inside a DataLoader worker, where a collate's arena comes from: set for the time of one
# collate_fn call by whoever wraps it (the worker ring's RingCollator), read by every Collator
# that runs inside that call -- a Collator subclass's own __call__, or a collate_fn that wraps
# or post-processes ours, included.
_worker_arena = threading.local()


class worker_arenas:
    """``with worker_arenas(alloc):`` -- Collators running in this thread take their worker
    arenas from ``alloc`` (nbytes -> uint8 tensor) instead of a new shared segment."""

    def __init__(self, alloc: Any) -> None:
        self.alloc = alloc

    def __enter__(self) -> "worker_arenas":
        self.prev = getattr(_worker_arena, "alloc", None)
        _worker_arena.alloc = self.alloc
        return self

    def __exit__(self, *exc: Any) -> None:
        _worker_arena.alloc = self.prev



def _alloc_pinned(nbytes: int) -> torch.Tensor:
    # torch's caching host allocator: event-guarded reuse of pinned blocks (sizes rounded up)
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _summary(batch: Any, limit: int = 300) -> str:
    """Batch size and the leaf shapes of sample 0, for error logs."""
    try:
        n = len(batch)
        first = batch[0]
    except Exception:
        return f"a {type(batch).__name__}"
    parts: list[str] = []

    def visit(x: Any, where: str) -> None:
        if len(parts) > 24:
            return
        if isinstance(x, torch.Tensor):
            shape = "nested" if x.is_nested else list(x.shape)
            parts.append(f"{where}: {x.dtype} {shape}")
        elif hasattr(x, "dtype") and hasattr(x, "shape"):
            parts.append(f"{where}: {x.dtype} {list(x.shape)}")
        elif isinstance(x, dict):
            for k, v in x.items():
                visit(v, f"{where}[{k!r}]")
        elif isinstance(x, (list, tuple)) and len(x) <= 64:
            for i, v in enumerate(x):
                visit(v, f"{where}[{i}]")
        else:
            parts.append(f"{where}: {type(x).__name__}")

    try:
        visit(first, "sample0")
    except Exception:  # the summary must never replace the error it describes
        parts.append("...")
    text = ", ".join(parts)
    return f"{n} samples; {text[:limit]}{'...' if len(text) > limit else ''}"


def _report(exc: Exception, batch: Any) -> None:
    """The batch's shape summary, once. In a DataLoader worker it rides on the exception (a note,
    shown in the traceback torch re-raises in the main process) instead of a log line per
    worker; in the main process it is logged. The library's logger has a NullHandler: nothing
    reaches stderr unless the application configured logging."""
    summary = _summary(batch)
    if get_worker_info() is not None:
        if hasattr(exc, "add_note"):
            exc.add_note(f"fastcollate: the batch: {summary}")
        return
    logger.error("collate failed: %s: %s [%s]", type(exc).__name__, exc, summary)


def _gather_hook(batch: Any) -> Any:
    """A batch object's own gather (``__fastcollate_gather__(alloc, threads, pad)``, which
    fastcollate.Gathered has: the collated batch, or None for the ordinary path), or None."""
    if type(batch) is list:  # what torch's fetcher gives every other dataset: no lookup
        return None
    return getattr(batch, "__fastcollate_gather__", None)


class Collator:
    """A drop-in ``collate_fn``: default_collate's result, every tensor leaf a view of one arena.

    Args:
        pin_memory: write the arena straight into pinned memory (main process only; ``"auto"``:
            when CUDA is available). In DataLoader workers the arena is always shared memory.
        num_threads: threads for the copy; default 1 in worker processes, ``min(4, cores)``
            elsewhere.
        backend: ``"auto"`` (the compiled engine when it loaded), ``"cpp"`` (require it) or
            ``"python"`` (the pure-Python reference).
        pad: ``{key: pad value}`` for top-level leaves of variable length (tensors, numpy arrays,
            lists of numbers), padded straight into the arena; see fastcollate.core.pad for the rules.
        pad_to_multiple_of, max_length, padding_side: the padded length is the batch's longest
            (each truncated to max_length), rounded up to the multiple; padding on the right or left.
        return_mask, mask_key, mask_dtype: a ``[B, L]`` mask (1 real, 0 padding) of the first
            padded key, ``attention_mask`` int64 by default (Hugging Face's convention).
        lengths_key: also return the per-sample lengths of the first padded key under this key.
        pad_if_present: ``{key: pad value}`` padded when sample 0 carries the key as a sequence;
            default: what a Hugging Face tokenizer returns beside input_ids (``attention_mask`` 0,
            padded rather than made again; ``token_type_ids`` 0; ``special_tokens_mask`` 1).
            ``Collator.for_tokenizer(tokenizer)`` reads the pad id and side from a tokenizer.

    >>> import torch, fastcollate
    >>> c = fastcollate.Collator()
    >>> out = c([{"x": torch.ones(2), "y": 1}, {"x": torch.zeros(2), "y": 2}])
    >>> out["x"].shape, out["y"].tolist()
    (torch.Size([2, 2]), [1, 2])
    """

    def __init__(
        self,
        *,
        pin_memory: bool | Literal["auto"] = False,
        num_threads: int | None = None,
        backend: Literal["auto", "cpp", "python"] = "auto",
        pad: dict[Any, int | float] | None = None,
        pad_to_multiple_of: int | None = None,
        max_length: int | None = None,
        padding_side: Literal["right", "left"] = "right",
        return_mask: bool = True,
        mask_key: Any = "attention_mask",
        mask_dtype: torch.dtype = torch.int64,
        lengths_key: Any = None,
        pad_if_present: dict[Any, int | float] | None = None,
    ) -> None:
        if pin_memory == "auto":
            pin_memory = torch.cuda.is_available()
        if not isinstance(pin_memory, bool):
            raise ValueError(f"fastcollate: pin_memory must be True, False or 'auto', got {pin_memory!r}")
        if pin_memory and not torch.cuda.is_available():
            # as torch's DataLoader does: say so once and carry on unpinned
            warnings.warn("fastcollate: pin_memory=True but CUDA is not available; arenas stay pageable",
                          stacklevel=2)
            pin_memory = False
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"fastcollate: num_threads must be a positive int, got {num_threads!r}")
        if backend not in ("auto", "cpp", "python"):
            raise ValueError(f"fastcollate: backend must be 'auto', 'cpp' or 'python', got {backend!r}")
        if backend == "cpp" and _ext._C is None:
            raise RuntimeError(f"fastcollate: the compiled engine is not available: {_ext.LOAD_ERROR}")
        self.pad = None if pad is None else PadSpec.make(pad, pad_to_multiple_of, max_length, padding_side,
                                                         return_mask, mask_key, mask_dtype, lengths_key,
                                                         pad_if_present)
        # a picklable (collated batch, the samples) -> batch step (Collator.for_tokenizer's)
        self.postprocess: Any = None
        self.pin_memory = pin_memory
        self.num_threads = num_threads
        self.backend = "python" if backend == "python" or _ext._C is None else "cpp"
        self._main_threads = num_threads or min(4, usable_cores())

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, *, label_pad: int = -100, causal_lm: bool = False,
                      seq2seq: bool | None = None, pad_to_multiple_of: int | None = None,
                      max_length: int | None = None, **kwargs: Any) -> "Collator":
        """A Collator for tokenizer rows whose batches equal a Hugging Face collator's, tensor for
        tensor: the first of ``tokenizer.model_input_names`` padded with ``pad_token_id`` on
        ``tokenizer.padding_side``, ``attention_mask`` (padded, or made when the rows lack it and the
        tokenizer returns one), ``token_type_ids`` and ``special_tokens_mask`` padded when the rows
        carry them -- by fastcollate's engine, into one arena -- and every other key as
        ``tokenizer.pad`` converts it (Python floats: float32).

        Labels:

        * ``seq2seq=None`` (default): scalar labels and float sequences (multi-label targets) as
          ``DataCollatorWithPadding`` gives them (``label`` / ``label_ids`` renamed ``labels``; Python
          floats float32); integer sequence labels as ``DataCollatorForSeq2Seq`` pads them
          (``label_pad``, their own longest rounded up to ``pad_to_multiple_of``, int64); bool
          sequences need ``seq2seq=False`` (``label_pad`` does not fit a bool);
        * ``seq2seq=True``: exactly ``DataCollatorForSeq2Seq(label_pad_token_id=label_pad)``
          (``labels=None`` when the rows carry none; float labels truncated to int64 as there);
        * ``seq2seq=False``: exactly ``DataCollatorWithPadding`` (labels never padded);
        * ``causal_lm=True``: exactly ``DataCollatorForLanguageModeling(mlm=False)``: labels made
          from the input ids, pad id -> ``label_pad``.

        ``max_length`` truncates (Hugging Face's collators do not); other keyword arguments go to
        ``Collator``. Where transformers refuses a batch fastcollate may still collate it.

        >>> class Tok:  # any object with a tokenizer's attributes
        ...     model_input_names, pad_token_id, pad_token_type_id, padding_side = ["input_ids", "attention_mask"], 0, 0, "right"
        >>> c = Collator.for_tokenizer(Tok())
        >>> out = c([{"input_ids": [5, 6, 7], "label": 0.5}, {"input_ids": [8], "label": 2.0}])
        >>> out["input_ids"].tolist(), out["labels"].dtype
        ([[5, 6, 7], [8, 0, 0]], torch.float32)
        """
        from .tokenizer import settings

        kw, post = settings(tokenizer, label_pad=label_pad, causal_lm=causal_lm, seq2seq=seq2seq,
                            pad_to_multiple_of=pad_to_multiple_of, max_length=max_length)
        c = cls(**kw, **kwargs)
        c.postprocess = post(c.pad)
        return c

    def __repr__(self) -> str:
        pad = "" if self.pad is None else f", pad={dict(self.pad.values)}"
        return f"Collator(pin_memory={self.pin_memory}, num_threads={self.num_threads}, backend={self.backend!r}{pad})"

    def __call__(self, batch: Sequence[Any]) -> Any:
        return self.run(batch)

    def run(self, batch: Sequence[Any], worker_alloc: Any = None) -> Any:
        """Collate; ``worker_alloc`` (nbytes -> uint8 tensor) replaces the shared-memory arena
        inside DataLoader workers (the worker ring uses it)."""
        if disabled():
            _count("disabled_batches")
            return default_collate(batch)
        if _trace.enabled():
            _trace.note_collate("fastcollate")
        try:
            out = self._collate(batch, worker_alloc)
            return out if self.postprocess is None else self.postprocess(out, batch)
        except Exception as exc:
            _count(f"errors.{type(exc).__name__}")
            _report(exc, batch)
            raise

    @property
    def compiled(self) -> bool:
        """Whether batches go through the compiled engine (not the reference)."""
        return self.backend == "cpp" and reference.fn_map_is_stock()

    def planned_bytes(self, batch: Sequence[Any]) -> int:
        """The arena size a batch needs (walk only: nothing allocated or copied)."""
        if _ext._C is None:
            raise RuntimeError("fastcollate: planned_bytes needs the compiled engine")
        if _gather_hook(batch) is not None:
            batch = list(batch)
        return int(_ext._C.plan_bytes(batch, reference.collate_subtree, self._pad_engine(batch)))

    def _collate(self, batch: Sequence[Any], worker_alloc: Any = None) -> Any:
        if not self.compiled:
            # the engine knows default_collate's stock rules, not types a user registered
            _count("python_batches")
            return reference.collate(batch) if self.pad is None else self.pad.collate(batch)
        in_worker = get_worker_info() is not None
        if in_worker:
            alloc = worker_alloc or getattr(_worker_arena, "alloc", None) or alloc_shared
            threads = self.num_threads or 1
        else:
            alloc, threads = (_alloc_pinned if self.pin_memory else None), self._main_threads
        hook = _gather_hook(batch)
        if hook is not None:  # rows of an ArrayDataset: gathered without per-sample Python
            out = hook(alloc, threads, self.pad)
            if out is not None:  # counted by the engine (gathered_batches)
                return out
            batch = list(batch)  # the ordinary path, and its errors
        elif not isinstance(batch, (list, tuple)) and _first_is_tensor(batch):
            return reference.collate(batch)  # default_collate refuses it (torch.stack): the same error
        # in_main: outside a worker torch.stack keeps channels_last samples channels_last (in a
        # worker it stacks into a contiguous out= tensor), and large batches may be streamed
        return _ext._C.collate(batch, alloc, threads, reference.collate_subtree, self._pad_engine(batch),
                               not in_worker)

    def _pad_engine(self, batch: Sequence[Any]) -> Any:
        if self.pad is None:
            return None
        try:
            elem = batch[0]
        except (IndexError, TypeError, KeyError):
            return self.pad.engine()  # the engine reports the empty / odd batch
        return self.pad.engine_for(elem)


def _first_is_tensor(batch: Any) -> bool:
    try:
        return isinstance(batch[0], torch.Tensor)
    except Exception:
        return False


DEFAULT_COLLATOR = Collator()  # what fastcollate.collate calls; the ring adopts it


def collate(batch: Sequence[Any]) -> Any:
    """Exactly ``torch.utils.data.default_collate(batch)``, faster: use it as ``collate_fn``.

    >>> import torch, fastcollate
    >>> fastcollate.collate([(torch.tensor([1, 2]), 0), (torch.tensor([3, 4]), 1)])
    [tensor([[1, 2],
            [3, 4]]), tensor([0, 1])]
    """
    return DEFAULT_COLLATOR(batch)


def stats() -> dict[str, Any]:
    """Counters of this process (each DataLoader worker has its own).

    batches, bytes (arena bytes), tensor_leaves, deferred_leaves (computed by the Python
    reference), arenas_allocated / arenas_reused (pool misses / hits), arenas_unpooled (made past
    the pool cap), arenas_evicted, arenas_in_use, pool_bytes, pool_idle_bytes, pool_limit_bytes,
    python_batches, disabled_batches, gathered_batches (ArrayDataset batches gathered from their
    columns), and errors by exception type.
    """
    out: dict[str, Any] = dict(_ext._C.stats()) if _ext._C is not None else {}
    with _lock:
        counts = dict(_py_counts)
    out["python_batches"] = counts.pop("python_batches", 0)
    out["disabled_batches"] = counts.pop("disabled_batches", 0)
    out.setdefault("gathered_batches", 0)
    out["errors"] = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith("errors.")}
    out["backend"] = _ext.backend()
    return out


def reset_stats() -> None:
    """Zero the counters (the pool's contents are kept)."""
    with _lock:
        _py_counts.clear()
    if _ext._C is not None:
        _ext._C.reset_counters()


def set_pool_limit(nbytes: int) -> None:
    """Cap the bytes the pageable arena pool may hold (default 2 GiB, or FASTCOLLATE_POOL_BYTES).

    Arenas past the cap are still made, outside the pool, and freed when their batch dies.
    """
    if nbytes < 0:
        raise ValueError(f"fastcollate: the pool limit must be >= 0, got {nbytes}")
    if _ext._C is not None:
        _ext._C.pool_set_limit(int(nbytes))


def trim_pool() -> None:
    """Free every idle arena of the pool now."""
    if _ext._C is not None:
        _ext._C.pool_trim()
