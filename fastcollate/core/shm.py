"""Shared memory that DataLoader workers can send to the main process without /dev/shm.

Containers give /dev/shm 64 MB unless told otherwise, and torch's workers put every batch there
(then die with a bus error once the batches in flight outgrow it). A sparse memfd is anonymous
shared memory with no name in /dev/shm and no quota there; torch already knows how to send a
storage made over a file descriptor (its file_descriptor strategy passes the descriptor, and
its file_system strategy, asked to share a storage that has one, does the same), so a batch
whose arena is a memfd crosses the worker queue as torch's own batches do, /dev/shm untouched.

A segment that must stay *one* memory in every process (the sample cache's) is not left to
torch's strategy, though: under ``set_sharing_strategy("file_system")`` torch shares a storage by
moving it into a /dev/shm file -- a copy of the whole segment, and the old mapping freed under
whoever still points into it. ``send_segment`` passes the memfd itself to a process being
started (multiprocessing's ``DupFd``, as for any descriptor a spawn or forkserver child inherits),
whatever the strategy.
"""
from __future__ import annotations

import os
from multiprocessing import reduction
from typing import Any

import torch

MEMFD = hasattr(os, "memfd_create")


def shared_segment(nbytes: int, name: str = "fastcollate") -> torch.Tensor:
    """A uint8 tensor over shared memory torch can send to other processes: a sparse memfd
    where Linux has one (no pages until written), else torch's own shared segment."""
    if MEMFD:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(1, nbytes))
            storage = torch.UntypedStorage._new_shared_fd_cpu(fd, max(1, nbytes))  # maps a dup of fd
        finally:
            os.close(fd)
    else:  # pragma: no cover - not Linux
        storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def send_segment(segment: torch.Tensor) -> Any:
    """What pickles ``segment`` (a tensor over a whole shared_segment, any dtype) into a process
    being started (spawn, forkserver: while multiprocessing's spawning popen exists) as the same
    memory: its descriptor, duplicated for the child, never through torch's sharing strategy."""
    if not MEMFD:  # pragma: no cover - not Linux: torch's own segment, torch's way
        return segment
    fd, size = segment_fd(segment)
    return _SentSegment(fd, size, segment.dtype)


def segment_fd(segment: torch.Tensor) -> tuple[int, int]:
    """(descriptor, bytes) of the memfd under ``segment`` (a tensor over a whole shared_segment,
    any dtype): the descriptor its storage keeps open for as long as it lives -- asking torch for
    it copies nothing, as the storage is a memfd already."""
    return segment.untyped_storage()._share_fd_cpu_()


def map_fd(fd: int, nbytes: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """The shared memory behind ``fd`` (nbytes of it) mapped here as a ``dtype`` tensor; the
    storage keeps its own duplicate of fd, so the caller still owns (and closes) ``fd``."""
    storage = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(dtype)


class _SentSegment:
    __slots__ = ("fd", "nbytes", "dtype")

    def __init__(self, fd: int, nbytes: int, dtype: torch.dtype) -> None:
        self.fd, self.nbytes, self.dtype = fd, nbytes, dtype

    def __reduce__(self):
        return (receive_segment, (reduction.DupFd(self.fd), self.nbytes, self.dtype))


def receive_segment(dupfd: Any, nbytes: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """The receiving side of send_segment: the segment mapped here (shared), as a ``dtype`` tensor."""
    fd = dupfd.detach()
    try:
        return map_fd(fd, nbytes, dtype)
    finally:
        os.close(fd)


# Batch arenas made in this process that may be sent by reference (fastcollate.loader.wire):
# storage (its StorageImpl address) -> [a weak reference to it, the reference object the wire
# made for it or None, a note]. A dead storage's address may be reused: the weak reference tells.
_SENDABLE: dict[int, list] = {}
_pruned_at = [64]


def pid_alive(pid: int) -> bool:
    """Whether process pid is alive (a zombie -- exited, not yet reaped -- is not): how the ring
    and the sample cache tell a dead worker's claim from a live one's."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - another user's process
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def process_start(pid: int) -> int | None:
    """When process pid started (clock ticks since boot, /proc/<pid>/stat's field 22), or None
    when there is no such process: a pid and its start time name one process, even after the
    kernel gives the pid to another."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def batch_arena(nbytes: int, note: Any = None) -> torch.Tensor:
    """A batch's arena in a DataLoader worker: a shared segment (see shared_segment) recorded as
    one of fastcollate's, which the worker sends by reference rather than as torch would;
    ``note`` travels with the reference (the ring a fallback arena belongs to)."""
    arena = shared_segment(nbytes, "fastcollate-batch")
    if MEMFD:
        remember(arena.untyped_storage(), None, note)
    return arena


def remember(storage: torch.UntypedStorage, ref: Any, note: Any = None) -> list:
    """Records a storage as one that is sent by reference (``ref``: the reference object, or
    None until the wire makes one); returns its registry entry."""
    from torch.multiprocessing.reductions import StorageWeakRef

    entry = _SENDABLE[storage._cdata] = [StorageWeakRef(storage), ref, note]
    if len(_SENDABLE) > 2 * _pruned_at[0]:  # drop the entries of storages that died
        for key in [k for k, v in _SENDABLE.items() if v[0].expired()]:
            del _SENDABLE[key]
        _pruned_at[0] = max(64, len(_SENDABLE))
    return entry


def sendable(storage: torch.UntypedStorage) -> list | None:
    """The registry entry ([weak reference, reference object, note]) of a live batch arena, else None."""
    entry = _SENDABLE.get(storage._cdata)
    if entry is None or entry[0].expired():
        return None
    return entry
