"""A ``pyarrow.Table`` batch read as gather columns (what Ray Data hands an
``ArrowBatchCollateFn``): every column's rows as addresses into its Arrow buffers, every chunk,
sliced chunks included, without a Python object per row. The gather itself
(fastcollate.data.columnar) moves the bytes into one arena.

A column holds numbers (a ``[B]`` batch), fixed-size lists of numbers, nested too (``[B, d1, d2...]``),
fixed-shape tensors -- Ray's tensor extension (``ArrowTensorType``/``V2``) and Arrow's own
``fixed_shape_tensor`` -- (``[B, *shape]``), or lists of those (rows of a variable first
dimension: stacked when all are as long, padded when the column is named in ``pad=``). Every
chunk is checked once per batch by :func:`fastcollate.data.hf.check_list_chunk` (buffers that hold
what the lengths say, offsets that stay within the values) before anything is read through it,
and the offsets it returns are the ones the rows are read with. Nulls, strings, nested
variable lists, variable-shaped tensors and every other type are refused with the column named.

A column in several chunks is first validated by Arrow (``validate(full=True)``) and combined
into one chunk by Arrow (one copy in C++, as Ray's default collate combines every chunked column)
when its chunks average under :data:`COMBINE_BYTES` (reading many small chunks one by one costs
more Python than the copy) or when it is to be a view (unpinned, rows of one shape: the batch
tensor is one contiguous buffer either way, and this is the very copy Ray's default makes).
Otherwise -- large chunks going to the (pinned) arena -- the chunks are read one by one, straight
into the arena: one copy, not two.

Zero-copy: asked for it (``view=``), a column whose rows lie contiguous in one Arrow buffer --
one non-empty chunk (sliced or not) of numbers other than bools, of fixed-size lists of them, or
of a fixed-shape tensor column, no nulls -- is handed back as a tensor sharing that buffer
(``BatchColumn.view``, made through DLPack after the same checks), what Ray's default collate
does for numbers and tensor columns. The tensor holds the Arrow buffer (it stays valid after the
table is dropped) and Arrow buffers are immutable, so no later batch writes into it.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .batch_column import BLOCK_BYTES, BatchColumn
from .columns import byte_span, spans_of, torch_dtype_of
from .hf import ArrowDataError, check_list_chunk

_RAY_TENSORS = ("ray.data.arrow_tensor", "ray.data.arrow_tensor_v2")
_NATIVE_TENSOR = "arrow.fixed_shape_tensor"
_WHAT = ("numbers, fixed-size lists of numbers, fixed-shape tensor columns (Ray's tensor extension, Arrow's "
         "fixed_shape_tensor) and lists of those")


def _numeric(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _unsupported(name: str, typ: Any, why: str = "") -> TypeError:
    return TypeError(f"fastcollate: Arrow column {name!r} is {typ}{why}; ArrowCollate collates {_WHAT} (drop or "
                     "select columns: columns=, Dataset.select_columns)")


class _Layout:
    """What a column's type says about its rows: the storage type the chunks are read through,
    a fixed row shape (None: a variable first dimension), the element dtype."""

    def __init__(self, name: str, typ: Any) -> None:
        import pyarrow as pa

        self.name, self.extension = name, isinstance(typ, pa.BaseExtensionType)
        storage = typ.storage_type if self.extension else typ
        self.tensor: tuple[int, ...] | None = None  # a tensor extension's row shape
        if self.extension:
            ext = getattr(typ, "extension_name", "")
            if ext in _RAY_TENSORS or ext == _NATIVE_TENSOR:
                perm = getattr(typ, "permutation", None)
                if perm is not None and list(perm) != list(range(len(perm))):
                    raise _unsupported(name, typ, f" with dimensions permuted ({list(perm)})")
                self.tensor = tuple(int(d) for d in typ.shape)
            else:
                why = " (a variable-shaped tensor column)" if "variable_shaped" in ext else ""
                raise _unsupported(name, typ, why)
        self.variable = pa.types.is_list(storage) or pa.types.is_large_list(storage)
        inner = storage.value_type if self.variable else storage
        dims: list[int] = []
        while pa.types.is_fixed_size_list(inner):
            dims.append(int(inner.list_size))
            inner = inner.value_type
        if not _numeric(inner):
            nested = pa.types.is_list(inner) or pa.types.is_large_list(inner)
            raise _unsupported(name, typ, " (lists inside lists: only the outer list may vary)" if nested else "")
        if self.tensor is not None:
            per_row = math.prod(self.tensor)
            if dims and not self.variable and math.prod(dims) != per_row:
                raise _unsupported(name, typ, f" whose storage rows hold {math.prod(dims)} values, not {per_row}")
            if self.variable and dims:
                raise _unsupported(name, typ, " (tensor storage of nested lists)")
        self.dims = tuple(dims)  # fixed-size list dims under the (variable) row
        self.leaf = inner
        dtype = torch.bool if pa.types.is_boolean(inner) else torch_dtype_of(np.dtype(inner.to_pandas_dtype()))
        if dtype is None:  # pragma: no cover - every Arrow number type has a numpy one
            raise _unsupported(name, typ)
        self.dtype = dtype
        self.item = dtype.itemsize
        self.nested = self.variable or bool(dims)  # has list children (their nulls are checked too)
        self.plain = not self.nested and dtype != torch.bool  # numbers read in place: the fast path
        self.fixed, self.trailing = self.shape()
        self.per_row = math.prod(self.fixed) if self.fixed is not None else 1  # elements of a fixed row
        self.row_bytes = self.per_row * self.item
        # rows of one shape, stored as they are read: one chunk of them can be handed out zero-copy
        # (bools are bits in Arrow, bytes in torch: never)
        self.viewable = self.fixed is not None and dtype != torch.bool

    def shape(self) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
        """(fixed row shape or None, trailing dims after a variable first dimension)."""
        if self.tensor is not None:
            return self.tensor, ()
        if self.variable:
            return None, self.dims
        return self.dims, ()


def _elements(array: Any, layout: _Layout, keep: list) -> tuple[int, int, tuple[int, int]]:
    """(address of logical row 0's first element, elements per row, the [start, end) addresses of
    the buffer the elements lie in) of a numeric or fixed-size-list array, its slice offset and
    its children's applied. Bools are unpacked from their bits into a byte array held in ``keep``."""
    import pyarrow as pa

    typ = array.type
    if pa.types.is_fixed_size_list(typ):
        addr, per, span = _elements(array.values, layout, keep)
        size = int(typ.list_size)
        return addr + array.offset * size * per * layout.item, size * per, span
    if pa.types.is_boolean(typ):
        flat = np.ascontiguousarray(array.to_numpy(zero_copy_only=False), dtype=np.bool_)
        keep.append(flat)
        return flat.ctypes.data, 1, byte_span(flat)
    data = array.buffers()[1]
    return data.address + array.offset * layout.item, 1, byte_span(data)


def _nulls(array: Any, name: str, chunk: int, start: int, nested: bool = True) -> None:
    """Refuses nulls; ``start``: the batch row of the chunk's row 0; ``nested``: look into list children."""
    import pyarrow as pa

    if array.null_count:
        row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"fastcollate: Arrow column {name!r}, chunk {chunk}: {array.null_count} null row(s), the "
                         f"first is row {start + row} of the batch; ArrowCollate refuses nulls (Ray's default "
                         "collate makes them NaN, turning integers into float64): fill or drop them first "
                         "(Dataset.map_batches, Dataset.filter)")
    typ = array.type
    if nested and (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)):
        values = array.values
        if values.null_count:
            raise ValueError(f"fastcollate: Arrow column {name!r}, chunk {chunk}: its lists hold null values; "
                             "ArrowCollate refuses nulls (fill or drop them first)")
        _nulls(values, name, chunk, start)


class TableReader:
    """Reads the columns ``names`` (default: all) of ``pyarrow.Table`` batches as gather columns.
    What a column's type says (its _Layout) is worked out once per schema: the batches of one
    pipeline share theirs."""

    def __init__(self, names: Sequence[str] | None = None) -> None:
        self.names = None if names is None else list(names)
        self._cached: tuple[Any, list[tuple[int, _Layout]]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"names": self.names, "_cached": None}

    def _layouts(self, table: Any) -> list[tuple[int, _Layout]]:
        schema = table.schema
        hit = self._cached  # one read: other threads may replace it meanwhile
        if hit is not None and hit[0].equals(schema):
            return hit[1]
        names = schema.names
        if len(set(names)) != len(names):
            raise ValueError(f"fastcollate: the batch has duplicate column names: {names}")
        wanted = names if self.names is None else self.names
        missing = [n for n in wanted if n not in names]
        if missing:
            raise KeyError(f"fastcollate: the batch has no column {missing[0]!r}; it has {names}")
        layouts = [(names.index(n), _Layout(n, schema.field(n).type)) for n in wanted]
        self._cached = (schema, layouts)
        return layouts

    def __call__(self, table: Any, view: Callable[[str, torch.dtype, tuple[int, ...]], bool] | None = None
                 ) -> tuple[int, list[BatchColumn]]:
        """(rows, the batch's columns as gather columns). ``view(name, dtype, row shape)``: whether
        the caller wants a column as a zero-copy tensor where its layout allows one (None: never)."""
        import pyarrow as pa

        if not isinstance(table, pa.Table):
            raise TypeError(f"fastcollate: expected a pyarrow.Table batch, got {type(table).__name__}")
        columns = table.columns
        return table.num_rows, [
            _column(columns[i], layout, view is not None and layout.viewable and view(layout.name, layout.dtype,
                                                                                     layout.fixed))
            for i, layout in self._layouts(table)]


def table_columns(table: Any, names: Sequence[str] | None = None) -> tuple[int, list[BatchColumn]]:
    """(rows, the columns ``names`` of ``table`` -- all by default -- as gather columns)."""
    return TableReader(names)(table)


def _tensor(leaf: Any, layout: _Layout, rows: int) -> torch.Tensor:
    """A ``[rows, *fixed]`` tensor sharing the buffer of ``leaf``, a primitive Arrow array of
    exactly the rows' elements (its slice offset applied). DLPack keeps the array -- and so its
    buffer -- alive as long as the tensor; it raises no warning for Arrow's read-only memory."""
    try:
        flat = torch.from_dlpack(leaf)
    except (AttributeError, TypeError, BufferError, NotImplementedError, RuntimeError):  # pyarrow < 15
        data = leaf.buffers()[1]
        arr = np.frombuffer(data, dtype=np.dtype(leaf.type.to_pandas_dtype()), count=len(leaf),
                            offset=leaf.offset * layout.item)
        with warnings.catch_warnings():  # torch: "the given NumPy array is not writable" (as Ray silences it)
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(arr)
    if flat.dtype != layout.dtype:  # pragma: no cover - DLPack and numpy agree with the layout's dtype
        raise TypeError(f"fastcollate: Arrow column {layout.name!r}: a {flat.dtype} view for a {layout.dtype} column")
    return flat.view(rows, *layout.fixed)


def _view(array: Any, layout: _Layout, offsets: np.ndarray | None) -> torch.Tensor:
    """The rows of ``array`` (one checked chunk, a fixed row shape) as a zero-copy tensor."""
    import pyarrow as pa

    n, leaf = len(array), array
    if offsets is not None:  # Ray's tensor storage: a list whose rows all hold the shape's values (checked)
        leaf = leaf.values.slice(int(offsets[0]), n * layout.per_row)
    while pa.types.is_fixed_size_list(leaf.type):
        size = leaf.type.list_size
        leaf = leaf.values.slice(leaf.offset * size, len(leaf) * size)
    return _tensor(leaf, layout, n)


def _column(column: Any, layout: _Layout, view: bool = False) -> BatchColumn:
    k = column.num_chunks
    # small chunks on average? (cheap estimates: a chunk's Python wrapper costs microseconds, and
    # ChunkedArray.nbytes, which measures slices exactly, a hundred)
    if k > 1 and layout.fixed is not None:
        combine = len(column) * layout.row_bytes < COMBINE_BYTES * k
    else:
        combine = k > 1 and column.get_total_buffer_size() < COMBINE_LIST_BYTES * k
    # a view wanted (unpinned: the CPU) of rows in several chunks: one contiguous buffer either way,
    # and Arrow's concatenation is Ray's default's one copy -- never more work than it, whatever the size
    combined = _combined(column) if combine or view and k > 1 else None
    if combined is not None:  # one chunk, made by Arrow (after Arrow's full validation)
        col = _read([combined], layout, view)
        col.keep.append(combined)  # the addresses point into it (a view holds it by itself)
        return col
    chunks = column.chunks
    if k > 1:  # rows in one buffer: one non-empty chunk (the empty ones read nothing)
        view = view and sum(1 for c in chunks if len(c)) == 1
    return _read(chunks, layout, view)


def _read(chunks: list, layout: _Layout, view: bool) -> BatchColumn:
    name, fixed, trailing, per_row, row_bytes = layout.name, layout.fixed, layout.trailing, layout.per_row, \
        layout.row_bytes
    if layout.plain and not layout.extension and len(chunks) == 1:  # a number column in one chunk: the fast path
        array = chunks[0]
        check_list_chunk(array, name, 0)
        if array.null_count:
            _nulls(array, name, 0, 0)
        n = len(array)
        if view and n:
            return BatchColumn(name, layout.dtype, _NO_PTRS, None, fixed, (), view=_tensor(array, layout, n))
        data = array.buffers()[1]
        addr = data.address + array.offset * layout.item if n else 0
        spans = spans_of([byte_span(data)] if n else [])
        if n * row_bytes < BLOCK_BYTES:
            return BatchColumn(name, layout.dtype, np.array([addr], dtype=np.int64), None, fixed, (), block=True,
                               spans=spans)
        return BatchColumn(name, layout.dtype, addr + np.arange(n, dtype=np.int64) * row_bytes, None, fixed, (),
                           spans=spans)
    ptrs, lens, keep, spans = [], [], [], []
    start = 0  # the batch row of the chunk's first row
    for k, chunk in enumerate(chunks):
        array = chunk.storage if layout.extension else chunk
        offsets = check_list_chunk(array, name, k)  # before anything reads through it
        n = len(array)
        if not n:
            continue
        if array.null_count or layout.nested:
            _nulls(array, name, k, start)
        start += n
        if view and not layout.variable:  # the only rows, in this chunk's buffer: checked, handed out as they are
            return BatchColumn(name, layout.dtype, _NO_PTRS, None, fixed, (), view=_view(array, layout, None))
        if not layout.variable:  # numbers, fixed-size lists, tensors stored as fixed-size lists
            if layout.plain:
                data = array.buffers()[1]
                addr, span = data.address + array.offset * layout.item, byte_span(data)
            else:
                addr, _, span = _elements(array, layout, keep)
            spans.append(span)
            if len(chunks) == 1 and n * row_bytes < BLOCK_BYTES:
                return BatchColumn(name, layout.dtype, np.array([addr], dtype=np.int64), None, fixed, (), keep,
                                   block=True, spans=spans_of(spans))
            ptrs.append(addr + np.arange(n, dtype=np.int64) * row_bytes)
            continue
        addr, per, span = _elements(array.values, layout, keep)
        spans.append(span)
        if layout.tensor is not None:  # Ray's tensor storage: a list whose rows must all hold the shape's values
            if offsets[-1] - offsets[0] != n * per_row or (np.diff(offsets) != per_row).any():
                bad = int(np.flatnonzero(np.diff(offsets) != per_row)[0])
                raise ArrowDataError(f"fastcollate: Arrow column {name!r}, chunk {k}: tensor row {bad} holds "
                                     f"{int(offsets[bad + 1] - offsets[bad])} values, its shape {list(fixed)} "
                                     f"needs {per_row}: the data is truncated or corrupt")
            if view:
                return BatchColumn(name, layout.dtype, _NO_PTRS, None, fixed, (), view=_view(array, layout, offsets))
            first = addr + int(offsets[0]) * layout.item
            if len(chunks) == 1 and n * row_bytes < BLOCK_BYTES:
                return BatchColumn(name, layout.dtype, np.array([first], dtype=np.int64), None, fixed, (), keep,
                                   block=True, spans=spans_of(spans))
            ptrs.append(first + np.arange(n, dtype=np.int64) * row_bytes)
            continue
        lens.append(np.diff(offsets))
        ptrs.append(addr + offsets[:-1] * (per * layout.item))
    ptr = _joined(ptrs)
    if layout.variable and layout.tensor is None:
        return BatchColumn(name, layout.dtype, ptr, _joined(lens), None, trailing, keep, spans=spans_of(spans))
    return BatchColumn(name, layout.dtype, ptr, None, fixed, (), keep, spans=spans_of(spans))


_NO_PTRS = np.zeros(0, dtype=np.int64)  # a viewed column's: nothing to gather

# Chunks smaller than this on average are combined by Arrow (``ChunkedArray.combine_chunks``, one
# copy in C++, what Ray's default collate does with every chunked column) before they are read as
# one chunk: measured on a 2-core machine, reading a chunk costs tens of microseconds of Python
# (checks, addresses), so 24 chunks of a 256-row column took 5x Ray's default, and a number column
# in several chunks is gathered row by row. From about 1 MiB a chunk, combining and gathering
# cost the same (one copy each; the gather's is threaded): the chunks are gathered as they are.
# Variable lists (padded, or stacked) cost the gather less per chunk and the combination an extra
# copy of their values: it paid below about 128 KiB a chunk (0.76x at 272 KiB, 3.9x at 32 KiB).
COMBINE_BYTES = 1 << 20
COMBINE_LIST_BYTES = 128 << 10


def _combined(column: Any) -> Any:
    """``column``'s chunks as one Arrow array, or None when Arrow's full validation refuses them (the
    chunk-by-chunk checks then name the chunk and the fault) or Arrow cannot concatenate the type.
    Validated first: a concatenation reads every chunk's buffers through its offsets."""
    import pyarrow as pa

    try:
        column.validate(full=True)
        return column.combine_chunks()
    except (pa.ArrowException, TypeError, ValueError):
        return None


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
