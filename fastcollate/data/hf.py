"""``ArrayDataset.from_hf``: a Hugging Face ``datasets.Dataset`` read from its Arrow buffers.

Row i of a column is what ``dataset[i][name]`` is (Python numbers and lists; the dataset's
indices mapping -- shuffle, select -- applied), so samples are exactly the dataset's own. A batch
is gathered from the Arrow buffers: list columns through their values + offsets, every chunk,
without a Python object per row. ``datasets`` itself is never imported (only ``pyarrow``, which
it depends on).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from .arrays import ArrayDataset
from .columns import Source, torch_dtype_of


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
        for chunk in column.chunks:
            if chunk.null_count:
                self.why_slow = "it has null rows"
            if self.scalar:
                values = chunk
            else:
                values = chunk.values
                offsets = chunk.offsets.to_numpy().astype(np.int64)
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
        return ptr, length, rows, keep

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


def from_hf(dataset: Any, columns: Sequence[str] | None = None) -> ArrayDataset:
    """An :class:`ArrayDataset` over the numeric columns of a ``datasets.Dataset``.

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
    return ArrayDataset({name: _ArrowColumn(dataset, name) for name in names})
