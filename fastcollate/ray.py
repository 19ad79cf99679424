"""Ray Data's trainer end: collate objects for ``iter_torch_batches(collate_fn=...)`` that turn
a batch into a dict of tensors. Feeding a GPU (``pin_memory=True``), the batch is ONE pinned
arena -- the copies in C++ with the GIL released, padding included -- that
:class:`fastcollate.CudaPrefetcher` moves in one copy. On the CPU (unpinned), the columns Ray's
default collate hands out zero-copy (numbers, tensor columns in one chunk) are handed out
zero-copy here too, sharing the Arrow buffers; such columns in several chunks are combined by
Arrow (the one copy Ray's default makes) and handed out; only the rest (padding, conversions,
bools) is copied into one arena: never more copying than Ray's default.

This is the only module of fastcollate that imports ``ray`` (``import fastcollate`` never does);
the work is fastcollate.data.columnar's (Ray-free).

>>> import ray, fastcollate
>>> from fastcollate.ray import ArrowCollate
>>> ds = ray.data.from_items([{"x": [1.0, 2.0], "y": 0}, {"x": [3.0, 4.0], "y": 1}])  # doctest: +SKIP
>>> batches = ds.iter_torch_batches(batch_size=2, collate_fn=ArrowCollate(pin_memory=True), device="cpu")  # doctest: +SKIP
>>> for batch in fastcollate.CudaPrefetcher(batches): ...  # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

import numpy as np
import torch
from ray.data.collate_fn import ArrowBatchCollateFn, NumpyBatchCollateFn

from .data.columnar import ColumnarCollator

__all__ = ["ArrowCollate", "NumpyCollate"]


class _Options:
    """What both collates take; the engine is a picklable ColumnarCollator."""

    def __init__(self, pad: Mapping[str, int | float] | None = None, dtypes: Any = None,
                 pin_memory: bool | Literal["auto"] = False, *, num_threads: int | None = None,
                 columns: Sequence[str] | None = None, pad_to_multiple_of: int | None = None,
                 max_length: int | None = None, padding_side: Literal["right", "left"] = "right",
                 return_mask: bool = True, mask_key: str = "attention_mask", mask_dtype: torch.dtype = torch.int64,
                 lengths_key: str | None = None, pad_if_present: Mapping[str, int | float] | None = None,
                 zero_copy: bool = True) -> None:
        super().__init__()
        self.engine = ColumnarCollator(pad, dtypes, pin_memory, num_threads=num_threads, columns=columns,
                                       pad_to_multiple_of=pad_to_multiple_of, max_length=max_length,
                                       padding_side=padding_side, return_mask=return_mask, mask_key=mask_key,
                                       mask_dtype=mask_dtype, lengths_key=lengths_key, pad_if_present=pad_if_present,
                                       zero_copy=zero_copy)

    def __repr__(self) -> str:
        return repr(self.engine).replace(type(self.engine).__name__, type(self).__name__, 1)


class ArrowCollate(_Options, ArrowBatchCollateFn):
    """A ``pyarrow.Table`` batch -> ``{column: tensor}``: with ``pin_memory=True`` (a GPU target)
    or ``zero_copy=False``, every tensor a view of one arena (pinned where CUDA is available);
    unpinned (the default), a column whose rows lie contiguous in one Arrow buffer -- one
    non-empty chunk of numbers (not bools), fixed-size lists or a fixed-shape tensor column -- is
    a tensor sharing that buffer, as Ray's default collate hands out numbers and tensor columns;
    such a column in several chunks is combined by Arrow (as Ray's default does) and that one
    buffer handed out; the other columns (bools, lists, padded, converted) are copied into one
    arena. Any column in many small chunks is combined by Arrow before it is read (see
    fastcollate.data.arrow_table).

    Shared memory: a zero-copy tensor keeps its Arrow buffer alive (valid after the batch is
    dropped) and no later batch writes into it, but torch has no read-only tensors: writing into
    it in place (``x.sub_(mean)``, ``x[i] = ...``) writes into Ray's block in the object store,
    and later epochs of a materialized dataset read the written values -- exactly as with Ray's
    default collate, whose views are the same. ``clone()`` before writing in place, or pass
    ``zero_copy=False`` (every column copied into the arena, as before). No warning is raised
    for the read-only memory (the view is made through DLPack; Ray silences torch's).

    Columns: numbers, fixed-size lists (nested too), fixed-shape tensor columns (Ray's tensor
    extension, Arrow's ``fixed_shape_tensor``) and lists of those; any number of chunks, sliced
    or not. The result equals Ray's default collate (``iter_torch_batches`` without a
    ``collate_fn``) in keys, dtypes, shapes and bytes wherever that has a rule; list columns
    named in ``pad`` equal ``fastcollate.Collator(pad=...)``'s padding reference of the rows as
    numpy arrays (the column's dtype kept), mask and lengths included. Refused, with the column
    named: nulls (``ValueError``; Ray's default makes them NaN), strings, nested variable lists,
    variable-shaped tensors and other types (``TypeError``: select the numeric columns with
    ``columns=``), unequal list rows not named in ``pad`` (``RuntimeError``, as Ray's default),
    corrupt buffers and offsets (``fastcollate.data.hf.ArrowDataError``, checked per chunk by
    ``check_list_chunk`` before anything is read).

    Args: see :class:`fastcollate.data.columnar.ColumnarCollator` (``pad``, ``dtypes``,
    ``pin_memory``, ``num_threads``, ``columns``, ``zero_copy``, and the padding options of
    :class:`fastcollate.Collator`).

    >>> import pyarrow as pa
    >>> out = ArrowCollate(pad={"ids": 0})(pa.table({"ids": [[1, 2, 3], [4]], "y": [0, 1]}))
    >>> out["ids"].tolist(), out["attention_mask"].tolist(), out["y"].dtype
    ([[1, 2, 3], [4, 0, 0]], [[1, 1, 1], [1, 0, 0]], torch.int64)
    """

    def __call__(self, batch: Any) -> dict[str, torch.Tensor]:
        return self.engine.arrow(batch)


class NumpyCollate(_Options, NumpyBatchCollateFn):
    """A ``{column: numpy array}`` batch (Ray's numpy batch format) -> ``{column: tensor}``:
    ``torch.as_tensor`` of each column, as Ray's own numpy conversion gives it (object arrays of
    equal-shape arrays stacked), with ``pad`` for object columns of arrays of a variable length.
    Unpinned, a C-contiguous numeric column is handed out zero-copy (``torch.from_numpy``: it
    shares the array's memory, as ``torch.as_tensor`` does), the rest copied into one arena;
    pinned or ``zero_copy=False``, all of it in one arena. Arguments as :class:`ArrowCollate`'s.

    >>> out = NumpyCollate()({"x": np.ones((2, 3), dtype=np.float32), "y": np.arange(2)})
    >>> out["x"].shape, out["y"].tolist()
    (torch.Size([2, 3]), [0, 1])
    """

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return self.engine.numpy(batch)
