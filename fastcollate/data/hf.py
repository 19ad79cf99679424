"""``ArrayDataset.from_hf``: a Hugging Face ``datasets.Dataset`` read from its Arrow buffers.

Row i of a column is what ``dataset[i][name]`` is (Python numbers and lists; the dataset's
indices mapping -- shuffle, select -- applied), so samples are exactly the dataset's own. A batch
is gathered from the Arrow buffers: list columns through their values + offsets, every chunk,
without a Python object per row. ``datasets`` itself is never imported (only ``pyarrow``, which
it depends on).

Arrow read from a file is trusted by nothing downstream: a truncated or tampered cache file whose
list offsets run past its values makes every reader (``datasets``' own row access, a gather) read
past the mapping, and the process dies of SIGBUS. :func:`check_list_chunk` checks a chunk's
buffers and offsets once, where fastcollate takes Arrow input, and refuses it with the column and
the chunk named.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from .columns import Source, byte_span, spans_of, torch_dtype_of


class ArrowDataError(ValueError):
    """An Arrow chunk whose buffers do not hold what its lengths and offsets say (a truncated or
    corrupt file): reading it would read past its memory."""


def _need(buf: Any, nbytes: int, where: str, what: str) -> None:
    have = 0 if buf is None else buf.size
    if nbytes > have:
        raise ArrowDataError(f"fastcollate: Arrow {where}: its {what} buffer holds {have} bytes, its length needs "
                             f"{nbytes}: the data is truncated or corrupt (a damaged cache file? delete it and "
                             "let it be written again)")


def _check_flat(array: Any, where: str) -> None:
    """A fixed-width array (numbers, bools): validity and data buffers cover offset + length."""
    end = array.offset + len(array)
    if end == 0:
        return
    bufs = array.buffers()
    if bufs[0] is not None:
        _need(bufs[0], (end + 7) // 8, where, "validity")
    _need(bufs[1], (end * array.type.bit_width + 7) // 8, where, "values")


def check_list_chunk(array: Any, column: str, chunk: int) -> np.ndarray | None:
    """Check one Arrow chunk before anything reads through it; return its list offsets.

    ``array`` is a ``pyarrow.Array`` (one chunk of ``column``): a list, large list or
    fixed-size list of numbers (nested lists too), or numbers. Checked: every buffer holds the
    array's offset + length (validity, offsets, values); list offsets start at >= 0, never
    decrease, and end within the values. A failure raises :class:`ArrowDataError` (a
    ``ValueError``) naming the column and the chunk. Returns the offsets as int64, relative to
    ``array.values`` (what ``array.offsets`` gives), for list and large list arrays; None otherwise.

    Cost: O(1) buffer checks and one vectorized pass over the offsets (n + 1 integers): call it
    once per chunk where the input is taken (fastcollate's ``from_hf`` at construction, not per
    batch; ``fastcollate.ray.ArrowCollate`` on each batch, which is its input).

    >>> import pyarrow as pa
    >>> check_list_chunk(pa.array([[1, 2], [3]]), "input_ids", 0)
    array([0, 2, 3])
    """
    import pyarrow as pa

    where = f"column {column!r}, chunk {chunk}"
    typ = array.type
    n, start = len(array), array.offset
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        bufs = array.buffers()  # [validity, offsets, then the values' buffers]
        if bufs[0] is not None and n:
            _need(bufs[0], (start + n + 7) // 8, where, "validity")
        width = 8 if pa.types.is_large_list(typ) else 4
        values = array.values
        kind = np.int64 if width == 8 else np.int32
        if n == 0:  # no row reads anything; the one offset, where there is one, as array.offsets gives it
            held = (bufs[1].size if bufs[1] is not None else 0) >= (start + 1) * width
            offsets = np.frombuffer(bufs[1], dtype=kind, count=start + 1)[start:].astype(np.int64) if held \
                else np.zeros(1, dtype=np.int64)
        else:
            _need(bufs[1], (start + n + 1) * width, where, "offsets")
            raw = np.frombuffer(bufs[1], dtype=kind, count=start + n + 1)
            offsets = raw[start:].astype(np.int64, copy=False)
            steps = np.diff(offsets)
            if 0 <= offsets[0] and offsets[-1] <= len(values) and steps.min() >= 0:
                # the usual case: non-decreasing from >= 0 up to <= the values, so every offset is within
                # them -- one row included (its two offsets are checked like any others')
                _check_child(values, column, chunk, where)
                return offsets
            hint = "the data is truncated or corrupt (a damaged cache file? delete it and let it be written again)"
            past = offsets > len(values)
            if past.any():
                at = int(np.argmax(past))
                row = f"row {at - 1} ends" if at else "row 0 starts"
                raise ArrowDataError(f"fastcollate: Arrow {where}: list offsets run past the values ({row} at offset "
                                     f"{int(offsets[at])}, the chunk has {len(values)} values): {hint}")
            if offsets[0] < 0:
                raise ArrowDataError(f"fastcollate: Arrow {where}: the first list offset is {int(offsets[0])}: {hint}")
            down = steps < 0
            if down.any():
                row = int(np.argmax(down))
                raise ArrowDataError(f"fastcollate: Arrow {where}: list offsets decrease at row {row} "
                                     f"({int(offsets[row])} -> {int(offsets[row + 1])}): {hint}")
        _check_child(values, column, chunk, where)
        return offsets
    if pa.types.is_fixed_size_list(typ):
        bufs = array.buffers()
        if bufs[0] is not None and n:
            _need(bufs[0], (start + n + 7) // 8, where, "validity")
        values = array.values
        if (start + n) * typ.list_size > len(values):
            raise ArrowDataError(f"fastcollate: Arrow {where}: {start + n} rows of {typ.list_size} need "
                                 f"{(start + n) * typ.list_size} values, it has {len(values)}: the data is "
                                 "truncated or corrupt")
        _check_child(values, column, chunk, where)
        return None
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        _check_flat(array, where)
        return None
    raise TypeError(f"fastcollate: Arrow {where}: cannot check a {typ} chunk (numbers and lists of numbers only)")


def _check_child(values: Any, column: str, chunk: int, where: str) -> None:
    try:
        check_list_chunk(values, column, chunk)
    except ArrowDataError as e:
        raise ArrowDataError(str(e).replace(where, where + " (its list values)", 1)) from None


def _kind(t: Any) -> str | None:
    import pyarrow as pa

    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    return None


class _ArrowColumn(Source):
    lists = True

    def __init__(self, dataset: Any, name: str) -> None:
        import pyarrow as pa

        self.dataset, self.key, self.n = dataset, name, len(dataset)
        typ = dataset.data.table.schema.field(name).type
        self.scalar = not (pa.types.is_list(typ) or pa.types.is_large_list(typ))
        value_type = typ if self.scalar else typ.value_type
        self.kind = _kind(value_type)
        if self.kind is None:
            raise TypeError(f"fastcollate.ArrayDataset.from_hf: column {name!r} is {typ}; gathered columns hold "
                            "numbers or lists of numbers (choose them with columns=)")
        self.src = torch.bool if self.kind == "bool" else torch_dtype_of(np.dtype(value_type.to_pandas_dtype()))
        # what default_collate makes of Python numbers: int64, float64, bool
        self.out = {"bool": torch.bool, "int": torch.int64, "float": torch.float64}[self.kind]
        if self.src == torch.uint64:
            self.why_slow = "uint64 values may not fit int64"
        self._t: tuple | None = None
        self._tables()  # read now: what cannot be gathered is known before the first batch

    def __getstate__(self) -> dict[str, Any]:
        # the buffer addresses are this process's: a spawned worker reads them again
        return {**self.__dict__, "_t": None}

    def _tables(self) -> tuple:
        if self._t is None:
            self._t = self._build()
        return self._t

    def _build(self) -> tuple:
        column = self.dataset.data.table.column(self.key)
        ptrs, lens, keep = [], [], []
        for k, chunk in enumerate(column.chunks):
            offsets = check_list_chunk(chunk, self.key, k)  # once per chunk: nothing reads past a bad file
            if chunk.null_count:
                self.why_slow = "it has null rows"
            values = chunk if self.scalar else chunk.values
            if values.null_count:
                self.why_slow = "it has null values"
                values = values.fill_null(0)
            flat = values.to_numpy(zero_copy_only=self.kind != "bool" and not values.null_count)
            if self.kind == "bool":
                flat = np.ascontiguousarray(flat, dtype=np.bool_)  # Arrow packs bools in bits
            keep.append(flat)
            base, item = flat.__array_interface__["data"][0], flat.itemsize
            if self.scalar:
                ptrs.append(base + np.arange(len(flat), dtype=np.int64) * item)
            else:
                ptrs.append(base + offsets[:-1] * item)
                lens.append(np.diff(offsets))
        empty = np.zeros(0, dtype=np.int64)
        ptr = np.concatenate(ptrs) if ptrs else empty
        length = (np.concatenate(lens) if lens else empty) if not self.scalar else None
        mapping = getattr(self.dataset, "_indices", None)
        rows = None if mapping is None else mapping.column(0).to_numpy().astype(np.int64)
        if rows is not None and len(rows) and (rows.min() < 0 or rows.max() >= len(ptr)):
            raise ArrowDataError(f"fastcollate: the indices mapping of column {self.key!r} points at row "
                                 f"{int(rows.max() if rows.max() >= len(ptr) else rows.min())} of a table of "
                                 f"{len(ptr)} rows: the indices cache file is corrupt")
        return ptr, length, rows, keep, spans_of([byte_span(f) for f in keep])

    def spans(self) -> np.ndarray:
        return self._tables()[4]

    def _mapped(self, rows: np.ndarray) -> np.ndarray:
        mapping = self._tables()[2]
        return rows if mapping is None else mapping[rows]

    def row(self, i: int) -> Any:
        j = int(self._mapped(np.asarray([i]))[0])
        return self.dataset.data.table.column(self.key)[j].as_py()

    def ptrs(self, rows: np.ndarray) -> np.ndarray:
        self._tables()
        return self._t[0][self._mapped(rows)]

    def lens(self, rows: np.ndarray) -> np.ndarray | None:
        return None if self.scalar else self._tables()[1][self._mapped(rows)]

    def all_lengths(self) -> np.ndarray:
        if self.scalar:
            return np.zeros(self.n, dtype=np.int64)
        return self.lens(np.arange(self.n, dtype=np.int64))

    def pad_dtype(self, lens: np.ndarray) -> torch.dtype:
        # padding's rule for lists: bool, else int64, else float32; only empty lists: int64
        if not lens.any():
            return torch.int64
        return {"bool": torch.bool, "int": torch.int64, "float": torch.float32}[self.kind]

    def list_dtype(self) -> torch.dtype:
        return self.out


def sources(dataset: Any, columns: Sequence[str] | None = None) -> dict[str, Source]:
    """The numeric columns of a ``datasets.Dataset`` as gathered sources, for
    ``ArrayDataset.from_hf`` (which builds the dataset: this module needs nothing of arrays.py).

    Sample i is ``{name: dataset[i][name]}`` (Python numbers and lists, the dataset's indices
    mapping applied); a batch is gathered from the Arrow buffers. Columns must hold numbers
    or lists of numbers; choose them with ``columns`` (default: all).
    """
    if not hasattr(dataset, "data") or not hasattr(getattr(dataset, "data"), "table"):
        raise TypeError(f"fastcollate.ArrayDataset.from_hf: expected a datasets.Dataset, got {type(dataset).__name__}")
    names = list(dataset.column_names if columns is None else columns)
    missing = [c for c in names if c not in dataset.column_names]
    if missing:
        raise KeyError(f"fastcollate.ArrayDataset.from_hf: no column {missing[0]!r}; the dataset has "
                       f"{dataset.column_names}")
    return {name: _ArrowColumn(dataset, name) for name in names}
