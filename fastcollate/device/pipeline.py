"""A background-thread prefetch pipeline: one thread pulls items from a source, runs a stage on
each, and hands results through a bounded queue, in order. Knows nothing about devices, so the
CPU tests exercise exactly the code the GPU path runs.

Lifecycle: every item, then StopIteration (every time after, too). An exception in the source
or the stage is re-raised in the consumer with its type and traceback. Breaking out of the loop,
close() and garbage collection stop the thread and join it; the thread notices a stop between
items, so the bound is one item's fetch. The consumer never waits on a thread that is gone: its
wait polls the queue and checks the producer is alive (and gives up after ``get_timeout``
seconds when one is set), raising an error that names what it waited for.
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from typing import Any, Callable, Iterable

_ITEM, _DONE, _ERROR = 0, 1, 2


class PipelineStats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items = 0
        self.wait_s = 0.0
        self.high_water = 0
        self.epochs = 0


def _produce(source: Iterable, stage: Callable[[Any], Any], q: "queue.Queue", stop: threading.Event,
             stats: PipelineStats, on_start: Callable[[], None] | None) -> None:
    it = None
    try:
        if on_start is not None:
            on_start()
        it = iter(source)
        while not stop.is_set():
            try:
                item = next(it)
            except StopIteration:
                break
            out = stage(item)
            while not stop.is_set():
                try:
                    q.put((_ITEM, out), timeout=0.05)
                    break
                except queue.Full:
                    continue
            with stats.lock:
                stats.high_water = max(stats.high_water, q.qsize())
        message = (_DONE, None)
    except BaseException as exc:  # delivered to the consumer, never swallowed
        message = (_ERROR, exc)
    finally:
        del it  # a DataLoader iterator shuts its workers down when dropped
    while not stop.is_set():
        try:
            q.put(message, timeout=0.05)
            return
        except queue.Full:
            continue


def _drain(q: "queue.Queue") -> None:
    try:  # discarded items are dropped here, one by one (a held copy waits in its __del__)
        while True:
            q.get_nowait()
    except queue.Empty:
        pass


def _shutdown(q: "queue.Queue", stop: threading.Event, thread: threading.Thread, timeout: float) -> None:
    stop.set()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        _drain(q)  # make room so a blocked put() returns and sees the stop
        if thread is threading.current_thread():
            return
        thread.join(timeout=0.05)
    _drain(q)  # what the thread put after the last drain: released now, not with the epoch


class Producer:
    """The producer thread of one pass over the source, and its consumer's iterator. Not
    restartable: make a new one per epoch."""

    def __init__(self, source: Iterable, stage: Callable[[Any], Any], depth: int, stats: PipelineStats,
                 *, name: str = "fastcollate-prefetch", on_start: Callable[[], None] | None = None,
                 join_timeout: float = 10.0, get_timeout: float | None = None) -> None:
        if depth < 1:
            raise ValueError(f"fastcollate: depth must be >= 1, got {depth}")
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._stats = stats
        self._done = False
        self._name = name
        self._get_timeout = get_timeout
        # the thread must not reference self, or an abandoned epoch could never be collected
        self._thread = threading.Thread(target=_produce, args=(source, stage, self._q, self._stop, stats, on_start),
                                        name=name, daemon=True)
        self._finalizer = weakref.finalize(self, _shutdown, self._q, self._stop, self._thread, join_timeout)
        with stats.lock:
            stats.epochs += 1
        self._thread.start()

    def __iter__(self) -> "Producer":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        t0 = time.perf_counter()
        kind, payload = self._get()
        waited = time.perf_counter() - t0
        with self._stats.lock:
            self._stats.wait_s += waited
        if kind == _ITEM:
            with self._stats.lock:
                self._stats.items += 1
            return payload
        self._done = True
        self.close()
        if kind == _ERROR:
            raise payload
        raise StopIteration

    POLL_S = 0.1

    def _get(self) -> tuple[int, Any]:
        deadline = None if self._get_timeout is None else time.monotonic() + self._get_timeout
        while True:
            try:
                return self._q.get(timeout=self.POLL_S)
            except queue.Empty:
                pass
            if not self._thread.is_alive():
                try:  # what it put just before it ended
                    return self._q.get_nowait()
                except queue.Empty:
                    self._done = True
                    self.close()
                    raise RuntimeError(f"fastcollate: the producer thread {self._name!r} ended without delivering "
                                       "the next item or an error (waited for the next batch from the loader)") \
                        from None
            if deadline is not None and time.monotonic() > deadline:
                # the thread is stuck in the loader: it is told to stop, and joined by close() or
                # garbage collection, not here (that join could take as long as the stuck fetch)
                self._done = True
                self._stop.set()
                raise TimeoutError(f"fastcollate: no batch from the producer thread {self._name!r} within "
                                   f"{self._get_timeout:g} s (waited for the next batch from the loader; the thread "
                                   "is still alive, so the loader or the copy stage is slow or stuck)")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread and join it (bounded by one item's fetch)."""
        self._done = True
        self._finalizer()
