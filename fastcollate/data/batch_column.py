"""A column of a batch as the columnar gather reads it (BatchColumn): what the readers make (the
Arrow tables' in arrow_table.py, numpy's in columnar.py) and the collator consumes -- a module of
its own so that neither reader needs the other's."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .columns import spans_of

# a fixed-width column smaller than this, contiguous, is copied as one block (one row job of all
# its rows); larger ones keep an address per row, so that the copy threads can share its rows
BLOCK_BYTES = 1 << 20


@dataclasses.dataclass
class BatchColumn:
    """One column of a batch, for the gather: row i is ``lens[i]`` (or the fixed shape's)
    elements of ``src`` at address ``ptrs[i]``.

    ``fixed``: every row's shape (``()``: one number per row, a ``[B]`` batch), or None when
    rows have a variable first dimension (``lens``) followed by ``trailing``. ``block``: the rows
    are contiguous from ``ptrs[0]`` (one address), copied as one piece. ``keep`` holds whatever
    the addresses point into that the caller would not otherwise keep alive. ``spans``: the
    [start, end) addresses ([k, 2] int64) of the memory the rows lie in -- taken from the buffers
    themselves, not from the offsets -- against which the engine checks every row it reads.
    ``view``: the column already as its batch tensor, zero-copy (sharing the memory the rows lie
    in, holding it alive), when the reader was asked for one and the layout allows it; nothing
    is gathered for it then (``ptrs`` is empty).
    """

    key: str
    src: torch.dtype
    ptrs: np.ndarray
    lens: np.ndarray | None
    fixed: tuple[int, ...] | None
    trailing: tuple[int, ...] = ()
    keep: list = dataclasses.field(default_factory=list)
    block: bool = False
    spans: np.ndarray = dataclasses.field(default_factory=lambda: spans_of([]))
    view: torch.Tensor | None = None


__all__ = ["BLOCK_BYTES", "BatchColumn"]
