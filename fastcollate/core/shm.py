"""Shared memory that DataLoader workers can send to the main process without /dev/shm.

Containers give /dev/shm 64 MB unless told otherwise, and torch's workers put every batch there
(then die with a bus error once the batches in flight outgrow it). A sparse memfd is anonymous
shared memory with no name in /dev/shm and no quota there; torch already knows how to send a
storage made over a file descriptor (its file_descriptor strategy passes the descriptor, and
its file_system strategy, asked to share a storage that has one, does the same), so a batch
whose arena is a memfd crosses the worker queue as torch's own batches do, /dev/shm untouched.
"""
from __future__ import annotations

import os

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
