"""Batches that already are columns -- a ``pyarrow.Table`` (fastcollate.data.arrow_table) or a
dict of numpy arrays, what a distributed engine such as Ray Data hands the trainer -- turned
into a dict of tensors in ONE arena by the gather's row jobs (fastcollate.data.gather's
``GatherPlan`` over ``_C.gather``: the copies and conversions in C++, GIL released, threaded),
with the padding rules of fastcollate.core.pad.

What a batch becomes, column by column (Ray's default collate gives the same where it has a
rule: ``torch.as_tensor`` of the column as numpy):
  * numbers: ``[B]`` of the column's dtype; fixed-size rows (fixed-size lists, tensors, n-d
    numpy columns): ``[B, *row shape]``;
  * rows of a variable first dimension (Arrow lists, numpy object arrays of arrays): stacked
    ``[B, L, *trailing]`` when all have one length, else refused (``RuntimeError``, as Ray's
    default) unless the column is named in ``pad``;
  * padded columns: exactly the padding reference (``PadSpec.collate``) of the rows as numpy
    arrays -- the column's own dtype is kept -- with the mask and lengths appended after every
    column;
  * ``dtypes``: a torch dtype, or ``{column: dtype}``, converted as ``torch.as_tensor(x,
    dtype=...)`` converts (into int64, int32, float32, float64, float16, bfloat16, or the
    column's own dtype); padded columns are padded, then converted.

Zero-copy or one arena (``zero_copy``, ``pin_memory``): unpinned, a column whose rows already
are the batch tensor's bytes -- one contiguous run of one buffer (an Arrow column in one
non-empty chunk, sliced or not, of numbers other than bools, fixed-size lists or a fixed-shape
tensor column, no nulls; a C-contiguous numeric numpy column), not padded, not converted -- is
handed out as a tensor sharing that memory (what Ray's default collate does for numbers and
tensor columns: ``torch.as_tensor`` of a zero-copy numpy view) -- an Arrow column of such rows
in several chunks first combined into one buffer by Arrow, the copy Ray's default makes too
(fastcollate.data.arrow_table); every other column is copied into the batch's one arena. Pinned
(``pin_memory=True``: a GPU target, where one pinned arena moves in one host-to-device copy) or
``zero_copy=False``, every column goes into the arena.

Such a view shares memory with the batch it came from: it holds that memory alive (a view stays
valid after the table or array is dropped) and is never written by a later batch (Arrow buffers
are immutable; each batch has its own), but torch has no read-only tensors -- like Ray's own
views, it is writable although the memory may be the object store's, and a write in place
reaches the block that later epochs read: ``clone()`` before writing into it in place, or pass
``zero_copy=False``. Measured on the CPU (``fastcollate bench
--engines``): a view costs a few microseconds per column whatever its size, a copy the gather's
per-column planning plus the bytes, so the view wins for every column it applies to, many small
columns included; the arena pays where the batch goes on to a GPU.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import torch

from .. import _ext
from ..core.collator import usable_cores
from ..core.pad import PadSpec, check_fits
from .batch_column import BLOCK_BYTES, BatchColumn
from .columns import byte_span, spans_of, torch_dtype_of
from .gather import GatherPlan

# what the gather reads, and what it may convert into (csrc/engine/gather_rows.cpp)
GATHER_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
                 torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64)
CONVERTIBLE = (torch.int64, torch.int32, torch.float32, torch.float64, torch.float16, torch.bfloat16)
def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


class ColumnarCollator:
    """Columns in, a dict of tensors in one arena out: the engine behind
    ``fastcollate.ray.ArrowCollate`` / ``NumpyCollate``, with no Ray in it.

    Args:
        pad: ``{column: pad value}``: columns of variable-length rows padded (see
            fastcollate.core.pad for the rules; ``pad_to_multiple_of``, ``max_length``,
            ``padding_side``, ``return_mask``, ``mask_key``, ``mask_dtype``, ``lengths_key``,
            ``pad_if_present`` as in :class:`fastcollate.Collator`).
        dtypes: a torch dtype for every column, or ``{column: dtype}``.
        pin_memory: the arena in pinned memory (``"auto"``: when CUDA is available).
        num_threads: copy threads (default ``min(4, cores)``).
        columns: the columns to collate, in this order (default: all, in the batch's order).
        zero_copy: unpinned, hand out the columns whose layout allows it as tensors sharing the
            batch's memory instead of copying them into the arena (see the module's docstring);
            ignored with ``pin_memory=True`` (one pinned arena).

    >>> import numpy as np, fastcollate.data.columnar as c
    >>> out = c.ColumnarCollator(pad={"ids": 0}).numpy({"ids": np.array([np.arange(3), np.arange(1)], dtype=object)})
    >>> out["ids"].tolist(), out["attention_mask"].tolist()
    ([[0, 1, 2], [0, 0, 0]], [[1, 1, 1], [1, 0, 0]])
    """

    def __init__(self, pad: Mapping[str, int | float] | None = None, dtypes: Any = None,
                 pin_memory: bool | Literal["auto"] = False, *, num_threads: int | None = None,
                 columns: Sequence[str] | None = None, pad_to_multiple_of: int | None = None,
                 max_length: int | None = None, padding_side: Literal["right", "left"] = "right",
                 return_mask: bool = True, mask_key: str = "attention_mask", mask_dtype: torch.dtype = torch.int64,
                 lengths_key: str | None = None, pad_if_present: Mapping[str, int | float] | None = None,
                 zero_copy: bool = True) -> None:
        if not isinstance(zero_copy, bool):
            raise ValueError(f"fastcollate: zero_copy must be True or False, got {zero_copy!r}")
        if pin_memory == "auto":
            pin_memory = torch.cuda.is_available()
        if not isinstance(pin_memory, bool):
            raise ValueError(f"fastcollate: pin_memory must be True, False or 'auto', got {pin_memory!r}")
        if pin_memory and not torch.cuda.is_available():
            warnings.warn("fastcollate: pin_memory=True but CUDA is not available; arenas stay pageable", stacklevel=3)
            pin_memory = False
        if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                        or num_threads < 1):
            raise ValueError(f"fastcollate: num_threads must be a positive int, got {num_threads!r}")
        if dtypes is not None and not isinstance(dtypes, torch.dtype):
            if not isinstance(dtypes, Mapping) or not all(isinstance(d, torch.dtype) for d in dtypes.values()):
                raise TypeError(f"fastcollate: dtypes must be a torch.dtype or {{column: torch.dtype}}, got {dtypes!r}")
            dtypes = dict(dtypes)
        for d in [dtypes] if isinstance(dtypes, torch.dtype) else (dtypes or {}).values():
            if d not in CONVERTIBLE:
                raise ValueError(f"fastcollate: dtypes: no conversion into {d} (into "
                                 f"{', '.join(str(c) for c in CONVERTIBLE)} only)")
        if columns is not None:
            columns = list(columns)
            if not columns or len(set(columns)) != len(columns) or not all(isinstance(c, str) for c in columns):
                raise ValueError(f"fastcollate: columns must be distinct column names, got {columns!r}")
        self.spec = None if pad is None else PadSpec.make(pad, pad_to_multiple_of, max_length, padding_side,
                                                         return_mask, mask_key, mask_dtype, lengths_key,
                                                         pad_if_present)
        self.dtypes, self.pin_memory, self.num_threads, self.columns = dtypes, pin_memory, num_threads, columns
        self.zero_copy = zero_copy
        self._reader: Any = None  # the Arrow reader, made at the first table (it caches per schema)
        self._threads = num_threads or min(4, usable_cores())

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"zero_copy": True, **state})  # pickled before zero_copy existed: its default

    def __repr__(self) -> str:
        pad = "" if self.spec is None else f"pad={dict(self.spec.values)}, "
        return (f"{type(self).__name__}({pad}dtypes={self.dtypes}, pin_memory={self.pin_memory}, "
                f"columns={self.columns}, zero_copy={self.zero_copy})")

    # ------------------------------------------------------------------ inputs

    def arrow(self, table: Any) -> dict[str, torch.Tensor]:
        """A ``pyarrow.Table`` batch as a dict of tensors: in one arena, but for the columns handed
        out zero-copy (``zero_copy``, unpinned: see the module's docstring)."""
        if self._reader is None:
            from .arrow_table import TableReader

            self._reader = TableReader(self.columns)
        rows, cols = self._reader(table, self._viewable if self.zero_copy and not self.pin_memory else None)
        return self.collate_columns(rows, cols)

    def _viewable(self, key: str, src: torch.dtype, fixed: tuple[int, ...] | None) -> bool:
        """Whether the column ``key`` (of ``src`` elements, rows of shape ``fixed``) may be its
        own tensor: not padded (a column named in ``pad`` -- or in ``pad_if_present`` with rows
        to pad -- goes through the padding, errors included), not converted."""
        spec = self.spec
        if spec is not None and (any(k == key for k, _ in spec.values)
                                 or fixed != () and any(k == key for k, _ in spec.optional)):
            return False
        return self._dtype_of(key, src) == src

    def numpy(self, batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """A ``{column: numpy array}`` batch (Ray's numpy batch format) as a dict of tensors: in one
        arena, but for the columns handed out zero-copy (``zero_copy``, unpinned: see the module's
        docstring)."""
        if not isinstance(batch, Mapping):
            raise TypeError(f"fastcollate: expected a dict of numpy arrays, got {type(batch).__name__}")
        names = list(batch) if self.columns is None else self.columns
        missing = [n for n in names if n not in batch]
        if missing:
            raise KeyError(f"fastcollate: the batch has no column {missing[0]!r}; it has {list(batch)}")
        view = self._viewable if self.zero_copy and not self.pin_memory else None
        cols = [numpy_column(batch[n], n, view) for n in names]
        rows = {n: len(batch[n]) for n in names}
        if len(set(rows.values())) > 1:
            raise ValueError(f"fastcollate: the batch's columns have different numbers of rows: {rows}")
        return self.collate_columns(next(iter(rows.values()), 0), cols)

    # ------------------------------------------------------------------ the gather

    def _dtype(self, col: BatchColumn) -> torch.dtype:
        return self._dtype_of(col.key, col.src)

    def _dtype_of(self, key: str, src: torch.dtype) -> torch.dtype:
        if self.dtypes is None:
            return src
        if isinstance(self.dtypes, torch.dtype):
            return self.dtypes
        return self.dtypes.get(key, src)

    def collate_columns(self, rows: int, cols: list[BatchColumn]) -> dict[str, torch.Tensor]:
        """The batch of ``rows`` rows of ``cols``, gathered into one arena."""
        if _ext._C is None:
            raise RuntimeError(f"fastcollate: the columnar collate needs the compiled engine: {_ext.LOAD_ERROR}")
        by_key = {c.key: c for c in cols}
        if isinstance(self.dtypes, dict):
            unknown = [k for k in self.dtypes if k not in by_key]
            if unknown:
                raise KeyError(f"fastcollate: dtypes names column {unknown[0]!r}, the batch has {list(by_key)}")
        spec, padded = None, {}
        if self.spec is not None:
            present = tuple(k for k, _ in self.spec.optional if k in by_key and by_key[k].fixed != ())
            spec = self.spec._for(present)[0]  # the optional keys present join the padded ones
            padded = dict(spec.values)
            for k in padded:
                if k not in by_key:
                    raise KeyError(f"fastcollate: padded column {k!r} is not in the batch (it has {list(by_key)})")
                if by_key[k].fixed == ():
                    raise TypeError(f"fastcollate: padded column {k!r} holds one number per row; a padded column "
                                    "holds lists (or arrays) of a variable length")
            for k in (spec.mask_key, spec.lengths_key):
                if k is not None and k in by_key:
                    raise ValueError(f"fastcollate: the batch already has a {k!r} column; pass another "
                                     "mask_key/lengths_key or return_mask=False")
        kinds = _ext._C.JobKind
        plan = GatherPlan(rows)
        tail: list[dict[str, Any]] = []  # the mask and lengths go after every column, as padding appends them
        blocks: dict[tuple, list[BatchColumn]] = {}  # contiguous columns by (src, dst, row shape)
        dtypes = self.dtypes
        out: dict[str, torch.Tensor] = {}
        for col in cols:
            if col.view is not None:  # the reader's zero-copy tensor (asked for by arrow() / numpy())
                out[col.key] = col.view
                continue
            dst = col.src if dtypes is None else self._dtype(col)
            if col.block and rows and col.key not in padded:  # contiguous rows: copied with the others of its kind
                blocks.setdefault((col.src, dst, col.fixed), []).append(col)
                continue
            ptrs = col.ptrs if col.ptrs.dtype == np.int64 else col.ptrs.astype(np.int64)
            inner = _numel(col.trailing)
            if col.block and (col.key in padded or not rows):  # one address per row after all
                row_bytes = _numel(col.fixed) * col.src.itemsize
                ptrs = ptrs[0] + np.arange(rows, dtype=np.int64) * row_bytes
            if col.key in padded:
                lens = col.lens if col.lens is not None else np.full(rows, col.fixed[0], dtype=np.int64)
                trailing = col.trailing if col.lens is not None else col.fixed[1:]
                inner = _numel(trailing)
                value = padded[col.key]
                check_fits(value, col.src, f"fastcollate: column {col.key!r}")  # the reference pads in the column's dtype
                if dst != col.src:  # ... then converts: the pad value as the conversion makes it
                    value = torch.tensor(value, dtype=col.src).to(dst).item()
                longest = int(lens.max()) if rows else 0
                L = spec.target(longest if spec.max_length is None else min(longest, spec.max_length))
                left = spec.side == "left"
                plan.add(col.key, kinds.Rows, ptrs, lens, L, inner, col.src, dst, (rows, L, *trailing), value, left,
                         spans=col.spans)
                if col.key == spec.values[0][0]:
                    if spec.mask_key is not None:
                        tail.append(dict(key=spec.mask_key, kind=kinds.Mask, ptrs=None, lens=lens, L=L, inner=1,
                                         src=spec.mask_dtype, dst=spec.mask_dtype, shape=(rows, L), left=left))
                    if spec.lengths_key is not None:
                        tail.append(dict(key=spec.lengths_key, kind=kinds.Lengths, ptrs=None, lens=lens, L=L,
                                         inner=1, src=torch.int64, dst=torch.int64, shape=(rows,)))
                continue
            if col.fixed is None:
                lens = col.lens
                if rows and (lens != lens[0]).any():
                    bad = int(np.argmax(lens != lens[0]))
                    raise RuntimeError(f"fastcollate: column {col.key!r}: rows have different lengths (row 0: "
                                       f"{int(lens[0])}, row {bad}: {int(lens[bad])}); name it in pad= to pad "
                                       "them")
                length = int(lens[0]) if rows else 0
                shape = (rows, length, *col.trailing)
                L = length
            else:
                shape = (rows, *col.fixed)
                L, inner = 1, _numel(col.fixed)
            plan.add(col.key, kinds.Rows, ptrs, None, L, inner, col.src, dst, shape, spans=col.spans)
        groups = [_add_blocks(plan, kinds, rows, members, src, dst, fixed)
                  for (src, dst, fixed), members in blocks.items()]
        for job in tail:
            plan.add(**job)
        order = [c.key for c in cols] + [job["key"] for job in tail]
        if not plan.jobs and not groups:  # every column handed out zero-copy: no arena at all
            return out if list(out) == order else {key: out[key] for key in order}
        size = max(plan.nbytes, plan.align)
        if self.pin_memory:
            arena = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        else:
            arena = _ext._C.pool_allocate(size)
        views = plan.run(arena, self._threads)
        out.update((key, v) for (key, _), v in zip(plan.keys, views))
        for members, view in zip(groups, views[len(views) - len(tail) - len(groups):]):
            out.update(zip(members, view[:, :rows].unbind(0) if len(members) > 1 else [view]))
        # the batch's column order, padding's mask and lengths after
        return {key: out[key] for key in order}


def _add_blocks(plan: GatherPlan, kinds: Any, rows: int, members: list[BatchColumn], src: torch.dtype,
                dst: torch.dtype, fixed: tuple[int, ...]) -> list[str]:
    """Columns whose rows are contiguous, of one dtype and row shape -- a table's number columns
    -- as ONE job: column c is row c of a [C, L, *fixed] block, each row's length rounded up so
    that every column starts 64-byte aligned (the arena's rule for leaves), the rounding padded
    with zeros; column c's tensor is ``block[c, :rows]``."""
    inner = _numel(fixed)
    if len(members) == 1:
        plan.add(members[0].key, kinds.Rows, members[0].ptrs, None, rows, inner, src, dst, (rows, *fixed), rows=1,
                 spans=members[0].spans)
        return [members[0].key]
    step = plan.align // math.gcd(plan.align, inner * dst.itemsize)  # rows per aligned stride
    L = -(-rows // step) * step
    ptrs = np.concatenate([m.ptrs for m in members])
    plan.add(members[0].key, kinds.Rows, ptrs, np.full(len(members), rows, dtype=np.int64), L, inner, src, dst,
             (len(members), L, *fixed), rows=len(members), spans=np.concatenate([m.spans for m in members]))
    return [m.key for m in members]


# ---------------------------------------------------------------------- numpy batches

def _readable_dtype(arr: np.ndarray, key: str, where: str = "") -> torch.dtype:
    dtype = torch_dtype_of(arr.dtype.newbyteorder("=")) if arr.dtype.kind in "biuf" else None
    if dtype is None or dtype not in GATHER_DTYPES:
        raise TypeError(f"fastcollate: column {key!r}{where} is a numpy array of {arr.dtype}; NumpyCollate "
                        "collates arrays of numbers (and object arrays of such arrays)")
    return dtype


def _dense(arr: np.ndarray, keep: list) -> np.ndarray:
    """The array with C-ordered, native, aligned rows (a copy when it is not)."""
    if arr.flags.c_contiguous and arr.dtype.isnative and arr.flags.aligned:
        return arr
    arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("="))
    keep.append(arr)
    return arr


def _from_numpy(arr: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy``, silent for a read-only array (Ray hands those out from its object
    store and silences torch's "not writable" warning the same way)."""
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def numpy_column(arr: Any, key: str, view: Any = None) -> BatchColumn:
    """A numpy column as a gather column: ``[B, ...]`` numbers, or an object array of B arrays
    (rows of a variable first dimension, as Ray's numpy format gives list columns). ``view(key,
    dtype, row shape)``: whether the caller wants the column as a zero-copy tensor where it can
    be one (rows present, C-contiguous, native byte order, aligned: ``torch.from_numpy``)."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"fastcollate: column {key!r} is a {type(arr).__name__}; a numpy batch holds numpy arrays")
    if arr.ndim == 0:
        raise ValueError(f"fastcollate: column {key!r} is a 0-d array; a column has a row dimension")
    keep: list = []
    if arr.dtype != object:
        src = _readable_dtype(arr, key)
        if view is not None and len(arr) and arr.flags.c_contiguous and arr.dtype.isnative and arr.flags.aligned \
                and view(key, src, tuple(int(d) for d in arr.shape[1:])):
            return BatchColumn(key, src, np.zeros(0, dtype=np.int64), None, tuple(arr.shape[1:]), view=_from_numpy(arr))
        arr = _dense(arr, keep)
        keep.append(arr)
        fixed = tuple(int(d) for d in arr.shape[1:])
        spans = spans_of([byte_span(arr)])
        if arr.nbytes < BLOCK_BYTES:
            return BatchColumn(key, src, np.array([arr.ctypes.data], dtype=np.int64), None, fixed, (), keep, block=True,
                               spans=spans)
        ptrs = arr.ctypes.data + np.arange(arr.shape[0], dtype=np.int64) * (arr.strides[0] if arr.shape[0] > 1 else 0)
        return BatchColumn(key, src, ptrs, None, fixed, (), keep, spans=spans)
    if arr.ndim != 1:
        raise TypeError(f"fastcollate: column {key!r} is an object array of {arr.ndim} dimensions; NumpyCollate "
                        "reads 1-D object arrays of arrays")
    src, trailing, ref = None, None, 0
    ptrs = np.zeros(len(arr), dtype=np.int64)
    lens = np.zeros(len(arr), dtype=np.int64)
    shapes, spans = [], []
    for i, row in enumerate(arr):
        if not isinstance(row, np.ndarray) or row.dtype == object or row.ndim == 0:
            what = type(row).__name__ if not isinstance(row, np.ndarray) else f"a {row.ndim}-d {row.dtype} array"
            raise TypeError(f"fastcollate: column {key!r}: row {i} is {what}; an object column holds arrays of numbers")
        shapes.append(row.shape)
        if row.shape[0] == 0 and row.ndim == 1:
            continue  # an empty row carries no values: its dtype and trailing dims do not count (pad's rule)
        dtype = _readable_dtype(row, key, f", row {i},")
        if src is None:
            src, trailing, ref = dtype, row.shape[1:], i
        elif dtype != src:
            raise TypeError(f"fastcollate: column {key!r}: row {i} has dtype {row.dtype}, row {ref} has {src}")
        elif row.shape[1:] != trailing:
            raise RuntimeError(f"fastcollate: column {key!r}: row {i} has trailing dimensions {list(row.shape[1:])}, "
                               f"row {ref} has {list(trailing)}; only the first dimension may differ")
        row = _dense(row, keep)
        keep.append(row)
        ptrs[i], lens[i] = row.ctypes.data, row.shape[0]
        spans.append(byte_span(row))
    if src is None:  # no values at all: pad's rule for lists of nothing
        src, trailing = torch.int64 if not shapes else torch_dtype_of(arr[0].dtype) or torch.int64, ()
    return BatchColumn(key, src, ptrs, lens, None, tuple(trailing), keep, spans=spans_of(spans))
