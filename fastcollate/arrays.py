"""Datasets over arrays that are already in memory (numpy arrays, memmaps, CPU tensors, ragged
values + offsets) whose batches skip per-sample Python: ``__getitems__`` returns a
:class:`Gathered` batch that fastcollate's collate turns into tensors by gathering the indexed
rows of every column straight into the batch's arena (``fastcollate._C.gather``: no GIL,
threaded, dtype widening on the way). Any other collate_fn sees ordinary samples: a Gathered
batch is a sequence whose items are made on access, each exactly ``dataset[i]``.

The exactness rule is the library's: a gathered batch equals ``default_collate([ds[i] for i in
indices])`` (or ``Collator(pad=...)`` of the same samples) element for element, dtype and shape;
whenever the gather cannot promise that (rows of unequal length with no padding, a dtype or
layout it does not read, pad values that do not fit, ...) the batch is materialized and goes the
ordinary way, errors included.
"""
from __future__ import annotations

import collections.abc
import mmap
import os
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from . import _ext
from .pad import PadSpec, _check_fits

_ALIGN = 64
_ROWS, _MASK, _LENGTHS = 0, 1, 2
# dtypes a gather may widen into (any column may also keep its own dtype)
_WIDEN = (torch.int64, torch.int32, torch.float32, torch.float64, torch.float16, torch.bfloat16)
_GATHER_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
                  torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64}


def _torch_dtype(np_dtype: np.dtype) -> torch.dtype | None:
    try:
        return torch.from_numpy(np.empty(0, dtype=np_dtype)).dtype
    except (TypeError, ValueError):
        return None


def _address(arr: Any) -> int:
    return arr.data_ptr() if isinstance(arr, torch.Tensor) else arr.__array_interface__["data"][0]


def _strides_bytes(arr: Any) -> tuple[int, ...]:
    if isinstance(arr, torch.Tensor):
        return tuple(s * arr.element_size() for s in arr.stride())
    return tuple(arr.strides)


def _rows_contiguous(arr: Any) -> bool:
    """Whether each row (every dimension after the first) is one dense C-ordered block."""
    shape, strides = tuple(arr.shape), _strides_bytes(arr)
    item = arr.element_size() if isinstance(arr, torch.Tensor) else arr.itemsize
    expect = item
    for size, stride in zip(reversed(shape[1:]), reversed(strides[1:])):
        if size != 1 and stride != expect:
            return False
        expect *= size
    return True


def _readable(arr: Any) -> tuple[torch.dtype | None, str | None]:
    """The column's torch dtype, and why the gather cannot read it (None: it can)."""
    if isinstance(arr, torch.Tensor):
        if arr.device.type != "cpu":
            return arr.dtype, f"it is on {arr.device}"
        if arr.requires_grad or arr.is_sparse or arr.is_nested or arr.is_quantized:
            return arr.dtype, "it is not a plain dense tensor"
        dtype = arr.dtype
    else:
        dtype = _torch_dtype(arr.dtype)
        if dtype is None:
            return None, f"numpy dtype {arr.dtype} has no torch equivalent"
        if not arr.dtype.isnative or not arr.flags.aligned:
            return dtype, "it is byte-swapped or unaligned"
    if dtype not in _GATHER_DTYPES:
        return dtype, f"dtype {dtype} is not gathered"
    if not _rows_contiguous(arr):
        return dtype, "its rows are not contiguous"
    return dtype, None


class _Memmap:
    """A numpy memmap column: pickled as its file and place (a spawned worker maps the file
    again instead of receiving a copy), and checked against the file shrinking under it."""

    def __init__(self, arr: np.memmap) -> None:
        self.filename = arr.filename
        base = arr._mmap  # shared by every view of one memmap
        granule = arr.offset - arr.offset % mmap.ALLOCATIONGRANULARITY
        self.start = granule + (_address(arr) - np.frombuffer(base, dtype=np.uint8).ctypes.data)
        self.end = self.start + arr.nbytes
        self.mode = "r" if arr.mode in ("r", "c") else "r+"

    @staticmethod
    def of(arr: Any) -> "_Memmap | None":
        if (isinstance(arr, np.memmap) and getattr(arr, "_mmap", None) is not None and arr.filename
                and arr.flags.c_contiguous):
            return _Memmap(arr)
        return None

    def check(self, key: Any) -> None:
        try:
            size = os.stat(self.filename).st_size
        except OSError as exc:
            raise RuntimeError(f"fastcollate.ArrayDataset: column {key!r}: its memmap file {self.filename} cannot "
                               f"be read: {exc}") from exc
        if size < self.end:
            raise RuntimeError(f"fastcollate.ArrayDataset: column {key!r}: the memmap file {self.filename} is now "
                               f"{size} bytes, shorter than the {self.end} it was mapped with (it shrank after it "
                               "was opened)")

    def reopen(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.memmap:
        return np.memmap(self.filename, dtype=dtype, mode=self.mode, offset=self.start, shape=shape)


class _Array:
    """An array column held by a dataset: pickled so that memmaps are mapped again."""

    def __init__(self, arr: Any) -> None:
        self.arr = arr
        self.mm = _Memmap.of(arr)
        # this process's address of row 0 and the row stride in bytes (an unpickled copy, in a
        # spawned worker, reads its own)
        self.address = _address(arr)
        self.stride0 = _strides_bytes(arr)[0] if arr.ndim else 0

    def __reduce__(self):
        if self.mm is not None:
            return (_reopen, (self.mm, self.arr.dtype, tuple(self.arr.shape)))
        return (_Array, (self.arr,))

    def check(self, key: Any) -> None:
        if self.mm is not None:
            self.mm.check(key)


def _reopen(mm: _Memmap, dtype: np.dtype, shape: tuple[int, ...]) -> _Array:
    return _Array(mm.reopen(dtype, shape))


class Source:
    """One column: how many rows, where row i's bytes are, what row i is in plain Python, and
    what default_collate / padding make of a batch of those rows."""

    key: Any = None
    n: int = 0
    src: torch.dtype | None = None  # element dtype in memory
    out: torch.dtype | None = None  # dtype of a collated batch (rows of tensors / arrays)
    trailing: tuple[int, ...] = ()  # dimensions after a row's length
    scalar = False                  # row i is a 0-d value: a batch is [B]
    lists = False                   # row i is a Python list / number (Hugging Face datasets)
    why_slow: str | None = None     # set when the gather cannot read it
    needs_check = False             # check() does something (a memmap's file is stat'ed)

    def row(self, i: int) -> Any:
        raise NotImplementedError

    def ptrs(self, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def lens(self, rows: np.ndarray) -> np.ndarray | None:
        """Per-row lengths (the first dimension of each row), or None when all are ``fixed``."""
        return None

    fixed: int | None = None  # the length of every row, when they all have one

    def all_lengths(self) -> np.ndarray:
        return np.full(self.n, 0 if self.fixed is None else self.fixed, dtype=np.int64)

    def check(self) -> None:
        """Raises when what the rows live in changed under the dataset (a memmap that shrank)."""

    def pad_dtype(self, lens: np.ndarray) -> torch.dtype:
        return self.out

    def list_dtype(self) -> torch.dtype:
        return self.out


def _check_widening(key: Any, src: torch.dtype | None, dtype: torch.dtype | None) -> None:
    if dtype is not None and dtype != src and (src not in _GATHER_DTYPES or dtype not in _WIDEN):
        raise ValueError(f"fastcollate.ArrayDataset: column {key!r}: no widening from {src} into {dtype} "
                         f"(into {', '.join(str(d) for d in _WIDEN)} only)")


def _convert_row(x: Any, dtype: torch.dtype | None) -> Any:
    if dtype is None:
        return x
    # the copy keeps rows of read-only memmaps writable; the conversion is torch's own
    t = torch.from_numpy(np.array(x)) if not isinstance(x, torch.Tensor) else x
    return t.to(dtype, copy=True)


class _Dense(Source):
    """Row i is ``arr[i]`` (a numpy row, a numpy scalar for 1-D arrays, or a tensor view)."""

    def __init__(self, arr: Any, key: Any, dtype: torch.dtype | None) -> None:
        self.key, self.holder = key, _Array(arr)
        self.n = int(arr.shape[0])
        self.src, self.why_slow = _readable(arr)
        self.convert = dtype  # dtypes= makes rows tensors of that dtype (None: rows as indexed)
        self.out = dtype or self.src
        self.scalar = arr.ndim == 1
        self.fixed = None if self.scalar else int(arr.shape[1])
        self.trailing = tuple(int(s) for s in arr.shape[2:])
        if self.scalar and self.convert is None and self.src == torch.uint64 and not isinstance(arr, torch.Tensor):
            self.why_slow = "numpy uint64 scalars do not become a tensor"
        _check_widening(key, self.src, dtype)

    @property
    def arr(self) -> Any:
        return self.holder.arr

    def row(self, i: int) -> Any:
        return _convert_row(self.arr[i], self.convert)

    def ptrs(self, rows: np.ndarray) -> np.ndarray:
        return self.holder.address + rows * self.holder.stride0

    def check(self) -> None:
        self.holder.check(self.key)

    @property
    def needs_check(self) -> bool:
        return self.holder.mm is not None


class _Ragged(Source):
    """Row i is ``values[offsets[i]:offsets[i + 1]]``."""

    def __init__(self, ragged: "Ragged", key: Any, dtype: torch.dtype | None) -> None:
        values = ragged.values
        self.key, self.holder, self.offsets = key, _Array(values), ragged.offsets
        self.n = len(self.offsets) - 1
        self.src, self.why_slow = _readable(values)
        self.convert = dtype  # dtypes= makes rows tensors of that dtype (None: rows as indexed)
        self.out = dtype or self.src
        self.trailing = tuple(int(s) for s in values.shape[1:])
        self._lens = np.diff(self.offsets)
        _check_widening(key, self.src, dtype)

    def row(self, i: int) -> Any:
        return _convert_row(self.holder.arr[int(self.offsets[i]):int(self.offsets[i + 1])], self.convert)

    def ptrs(self, rows: np.ndarray) -> np.ndarray:
        return self.holder.address + self.offsets[rows] * self.holder.stride0

    def lens(self, rows: np.ndarray) -> np.ndarray:
        return self._lens[rows]

    def all_lengths(self) -> np.ndarray:
        return self._lens.copy()

    def check(self) -> None:
        self.holder.check(self.key)

    @property
    def needs_check(self) -> bool:
        return self.holder.mm is not None


class Ragged:
    """A variable-length column: row i is ``values[offsets[i]:offsets[i + 1]]`` (the Arrow /
    CSR layout). ``values``: a numpy array or CPU tensor (rows may have trailing dimensions);
    ``offsets``: ``n + 1`` non-decreasing integers within ``len(values)``.

    >>> import numpy as np, fastcollate
    >>> r = fastcollate.Ragged(np.arange(6), [0, 2, 2, 6])
    >>> len(r), r[2].tolist()
    (3, [2, 3, 4, 5])
    """

    def __init__(self, values: Any, offsets: Any) -> None:
        if isinstance(values, torch.Tensor) or isinstance(values, np.ndarray):
            pass
        else:
            values = np.asarray(values)
        if values.ndim < 1:
            raise ValueError("fastcollate.Ragged: values must have at least one dimension")
        offsets = offsets.numpy() if isinstance(offsets, torch.Tensor) else np.asarray(offsets)
        if offsets.ndim != 1 or len(offsets) < 1 or offsets.dtype.kind not in "iu":
            raise ValueError(f"fastcollate.Ragged: offsets must be a 1-D integer array of n + 1 entries, got "
                             f"{offsets.dtype} of shape {list(offsets.shape)}")
        offsets = offsets.astype(np.int64)
        steps = np.diff(offsets)
        if offsets[0] < 0 or offsets[-1] > len(values) or (steps < 0).any():
            bad = int(np.argmax(steps < 0)) if (steps < 0).any() else (0 if offsets[0] < 0 else len(offsets) - 1)
            raise ValueError(f"fastcollate.Ragged: offsets must be non-decreasing within [0, {len(values)}]; "
                             f"offsets[{bad}]..: {offsets[bad:bad + 2].tolist()}")
        self.values, self.offsets = values, offsets

    @staticmethod
    def from_sequences(seqs: Sequence[Any], dtype: Any = None) -> "Ragged":
        """Concatenates sequences (lists, arrays) into one values array and their offsets."""
        arrays = [np.asarray(s, dtype=dtype) for s in seqs]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype or np.int64)
        return Ragged(values, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Any:
        return self.values[int(self.offsets[i]):int(self.offsets[i + 1])]


def _source(col: Any, key: Any, dtype: torch.dtype | None) -> Source:
    if isinstance(col, Source):
        if dtype is not None:
            raise ValueError(f"fastcollate.ArrayDataset: column {key!r}: dtypes= applies to arrays and Ragged only")
        col.key = key
        return col
    if isinstance(col, Ragged):
        return _Ragged(col, key, dtype)
    if not isinstance(col, (np.ndarray, torch.Tensor)):
        raise TypeError(f"fastcollate.ArrayDataset: column {key!r} is a {type(col).__name__}; columns are numpy "
                        "arrays (memmaps included), CPU tensors or fastcollate.Ragged")
    if col.ndim < 1:
        raise ValueError(f"fastcollate.ArrayDataset: column {key!r} is 0-d; a column needs a row dimension")
    return _Dense(col, key, dtype)


class ArrayDataset(Dataset):
    """A map-style dataset whose sample i is row i of every column.

    Args:
        columns: ``{key: column}`` (samples are dicts) or a sequence of columns (samples are
            tuples, as TensorDataset's). A column is a numpy array (a memmap too), a CPU tensor,
            or :class:`Ragged` values + offsets; all have the same number of rows.
        dtypes: ``{key: torch dtype}`` to widen a column into (int64, int32, float32, float64,
            float16, bfloat16): its rows are then tensors of that dtype, converted as torch's
            ``.to`` converts, and the gather converts on the way into the arena.

    ``ds[i]`` is an ordinary sample (``{key: column[i]}``), so the dataset works with any
    collate_fn and loader; ``ds.__getitems__(indices)``, which torch's DataLoader calls once
    per batch, returns a :class:`Gathered` batch that fastcollate's collate (and any
    :class:`fastcollate.Collator`, padding included) gathers in C++ without per-sample Python.

    >>> import numpy as np, torch, fastcollate
    >>> ds = fastcollate.ArrayDataset({"x": np.arange(12, dtype=np.float32).reshape(6, 2), "y": np.arange(6)})
    >>> batch = fastcollate.collate(ds.__getitems__([4, 1]))
    >>> batch["x"].tolist(), batch["y"].tolist()
    ([[8.0, 9.0], [2.0, 3.0]], [4, 1])
    """

    def __init__(self, columns: Mapping[Any, Any] | Sequence[Any], *, dtypes: Mapping[Any, Any] | None = None) -> None:
        self._mapping = isinstance(columns, collections.abc.Mapping)
        items = list(columns.items()) if self._mapping else list(enumerate(columns))
        if not items:
            raise ValueError("fastcollate.ArrayDataset: needs at least one column")
        dtypes = dict(dtypes or {})
        unknown = [k for k in dtypes if k not in dict(items)]
        if unknown:
            raise KeyError(f"fastcollate.ArrayDataset: dtypes= names columns that do not exist: {unknown}")
        self._sources: dict[Any, Source] = {k: _source(c, k, dtypes.get(k)) for k, c in items}
        sizes = {k: s.n for k, s in self._sources.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"fastcollate.ArrayDataset: columns have different numbers of rows: {sizes}")
        self._n = next(iter(sizes.values()))
        self._refresh()

    def _refresh(self) -> None:
        # per batch, only these are looked at: whether any column forbids the gather, and the
        # columns whose storage can change under them (memmaps)
        self._slow = any(s.why_slow is not None for s in self._sources.values())
        self._checked = [s for s in self._sources.values() if s.needs_check]

    @staticmethod
    def from_hf(dataset: Any, columns: Sequence[str] | None = None) -> "ArrayDataset":
        """The numeric columns of a Hugging Face ``datasets.Dataset``, gathered from its Arrow
        buffers; see :func:`fastcollate.hf.from_hf`."""
        from .hf import from_hf

        return from_hf(dataset, columns)

    @property
    def columns(self) -> list[Any]:
        return list(self._sources)

    def __len__(self) -> int:
        return self._n

    def _row_index(self, i: Any) -> int:
        try:
            j = int(i)
        except TypeError:
            raise TypeError(f"{type(self).__name__}: indices must be integers, got {type(i).__name__}") from None
        if j != i or isinstance(i, bool):
            raise TypeError(f"{type(self).__name__}: indices must be integers, got {i!r}")
        if not -self._n <= j < self._n:
            raise IndexError(f"{type(self).__name__}: index {j} is out of range for column {self.columns[0]!r} of "
                             f"{self._n} rows")
        return j + self._n if j < 0 else j

    def __getitem__(self, i: Any) -> Any:
        j = self._row_index(i)
        for s in self._checked:
            s.check()
        values = [s.row(j) for s in self._sources.values()]
        return dict(zip(self._sources, values)) if self._mapping else tuple(values)

    def __getitems__(self, indices: Sequence[int]) -> "Gathered":
        return Gathered(self, indices)

    def rows(self, indices: Any) -> np.ndarray:
        """The indices as row numbers (int64, negatives from the end), each checked in range."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(f"{type(self).__name__}: a batch's indices must be a flat sequence of integers, got "
                            f"{idx.dtype} of shape {list(idx.shape)}")
        idx = idx.astype(np.int64, copy=False)
        if not idx.size:
            return idx
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -self._n or hi >= self._n:
            j = hi if hi >= self._n else lo
            raise IndexError(f"{type(self).__name__}: index {j} is out of range for column {self.columns[0]!r} of "
                             f"{self._n} rows")
        return idx + self._n * (idx < 0) if lo < 0 else idx

    def lengths(self, key: Any) -> np.ndarray:
        """Every row's length in column ``key`` (for LengthGroupedSampler)."""
        return self._sources[key].all_lengths()

    def __repr__(self) -> str:
        cols = ", ".join(f"{k!r}: {s.out}{'' if s.scalar else ' ' + ('ragged' if s.fixed is None else str(s.fixed))}"
                         for k, s in self._sources.items())
        return f"{type(self).__name__}({self._n} rows; {cols})"


class Gathered(collections.abc.Sequence):
    """What ``ArrayDataset.__getitems__`` returns: the batch's indices, a sequence whose item j
    is ``dataset[indices[j]]`` (made on access), and which fastcollate's collate gathers."""

    __slots__ = ("dataset", "indices")

    def __init__(self, dataset: ArrayDataset, indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, j: Any) -> Any:
        if isinstance(j, slice):
            return [self.dataset[i] for i in list(self.indices)[j]]
        return self.dataset[self.indices[j]]

    def __iter__(self) -> Iterator[Any]:
        return (self.dataset[i] for i in self.indices)

    def __repr__(self) -> str:
        return f"Gathered({len(self)} rows of {self.dataset!r})"


# ----------------------------------------------------------------- the gather


class _Plan:
    """The jobs of one gather (see csrc/gather.cpp) and where their outputs go in the arena."""

    def __init__(self, rows: int) -> None:
        self.B = rows
        self.nbytes = 0
        self.jobs: list[tuple] = []
        self.keys: list[tuple[Any, bool]] = []  # (key, a list of [B] tensors rather than one tensor)

    def add(self, key: Any, kind: int, ptrs: np.ndarray | None, lens: np.ndarray | None, L: int, inner: int,
            src: torch.dtype, dst: torch.dtype, shape: tuple[int, ...], pad: Any = 0, left: bool = False,
            as_list: bool = False) -> None:
        at = self.nbytes
        size = _numel(shape) * dst.itemsize
        self.nbytes = at + (size + _ALIGN - 1) // _ALIGN * _ALIGN
        p = None if ptrs is None else torch.from_numpy(ptrs)
        n = None if lens is None else torch.from_numpy(lens)
        self.jobs.append((kind, at, p, n, self.B, L, inner, src, dst, pad, left, as_list, shape))
        self.keys.append((key, as_list))


def _numel(shape: Sequence[int]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _int64(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.int64 and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=np.int64)


def gather(batch: Gathered, alloc: Any, threads: int, pad: PadSpec | None) -> Any:
    """The collated batch, gathered into one arena (``alloc``: nbytes -> uint8 tensor, None for
    the pageable pool); None when only the ordinary path can promise default_collate's result."""
    ds = batch.dataset
    sources = ds._sources
    if ds._slow or _ext._C is None:
        return None
    rows = ds.rows(batch.indices)
    B = len(rows)
    if B == 0:
        return None
    for s in ds._checked:
        s.check()
    spec = None
    if pad is not None:
        if not ds._mapping:
            return None
        present = tuple(k for k, _ in pad.optional if k in sources and not sources[k].scalar)
        spec = pad._for(present)[0]
        if any(k not in sources or sources[k].scalar for k, _ in spec.values):
            return None
        if any(k is not None and k in sources for k in (spec.mask_key, spec.lengths_key)):
            return None
    plan = _Plan(B)
    padded = dict(spec.values) if spec is not None else {}
    tail: list[tuple] = []  # the mask and lengths go after every column, as padding appends them
    for key, s in sources.items():
        ptrs = _int64(s.ptrs(rows))
        lens = s.lens(rows)
        inner = _numel(s.trailing)
        if key in padded:
            lens = np.full(B, s.fixed, dtype=np.int64) if lens is None else _int64(lens)
            dtype = s.pad_dtype(lens)
            try:
                _check_fits(padded[key], dtype, "")
            except ValueError:
                return None  # the reference's error
            longest = int(lens.max())
            L = spec.target(longest if spec.max_length is None else min(longest, spec.max_length))
            left = spec.side == "left"
            plan.add(key, _ROWS, ptrs, lens, L, inner, s.src, dtype, (B, L, *s.trailing), padded[key], left)
            if key == spec.values[0][0]:
                if spec.mask_key is not None:
                    tail.append((spec.mask_key, _MASK, None, lens, L, 1, spec.mask_dtype, spec.mask_dtype, (B, L), 1,
                                 left))
                if spec.lengths_key is not None:
                    tail.append((spec.lengths_key, _LENGTHS, None, lens, L, 1, torch.int64, torch.int64, (B,)))
            continue
        if lens is not None:
            if (lens != lens[0]).any():
                return None  # unequal rows: default_collate's own error, from the ordinary path
            length = int(lens[0])
        else:
            length = 1 if s.scalar else s.fixed
        if s.lists and not s.scalar:  # default_collate of list rows: one [B] tensor per position
            plan.add(key, _ROWS, ptrs, None, length, 1, s.src, s.list_dtype(), (length, B), as_list=True)
            continue
        shape = (B,) if s.scalar else (B, length, *s.trailing)
        plan.add(key, _ROWS, ptrs, None, length, inner, s.src, s.out, shape)
    for job in tail:
        plan.add(*job)
    size = max(plan.nbytes, _ALIGN)
    arena = _ext._C.pool_allocate(size) if alloc is None else alloc(size)
    views = _ext._C.gather(arena, plan.jobs, threads)
    values = {key: list(v.unbind(0)) if as_list else v for (key, as_list), v in zip(plan.keys, views)}
    # default_collate: a list for tuple samples; a dict in the samples' key order, padding's
    # mask and lengths appended
    return values if ds._mapping else list(values.values())


# ----------------------------------------------------------------- token windows


class _Window(Source):
    """``tokens[i * stride + shift : ... + seq_len]`` as ``dtype``: one side of a window."""

    def __init__(self, holder: _Array, src: torch.dtype, why_slow: str | None, n: int, seq_len: int, stride: int,
                 shift: int, dtype: torch.dtype) -> None:
        self.holder, self.src, self.why_slow = holder, src, why_slow
        self.n, self.fixed, self.stride, self.shift, self.out = n, seq_len, stride, shift, dtype

    def row(self, i: int) -> Any:
        start = i * self.stride + self.shift
        return _convert_row(self.holder.arr[start:start + self.fixed], self.out)

    def ptrs(self, rows: np.ndarray) -> np.ndarray:
        h = self.holder
        return h.address + (rows * (self.stride * h.stride0) + self.shift * h.stride0)

    def check(self) -> None:
        self.holder.check(self.key)

    @property
    def needs_check(self) -> bool:
        return self.holder.mm is not None


class TokenWindows(ArrayDataset):
    """Training windows over one long token array (the nanoGPT layout: a ``uint16`` memmap).

    Sample i is ``{"input_ids": w[:-1], "labels": w[1:]}`` with ``w`` the ``seq_len + 1``
    tokens from ``i * stride`` as a ``dtype`` tensor (``stride`` defaults to ``seq_len``: every
    token is a label once). ``tokens``: a 1-D numpy array / memmap or CPU tensor of uint8,
    uint16, uint32, int32 or int64 (any integer dtype); the gather widens on the way.

    >>> import numpy as np, fastcollate
    >>> ds = fastcollate.TokenWindows(np.arange(10, dtype=np.uint16), seq_len=4)
    >>> len(ds), ds[1]["input_ids"].tolist(), ds[1]["labels"].tolist()
    (2, [4, 5, 6, 7], [5, 6, 7, 8])
    """

    def __init__(self, tokens: Any, seq_len: int, stride: int | None = None, dtype: torch.dtype = torch.int64) -> None:
        if not isinstance(tokens, (np.ndarray, torch.Tensor)):
            raise TypeError(f"fastcollate.TokenWindows: tokens must be a numpy array, memmap or CPU tensor, got "
                            f"{type(tokens).__name__}")
        src, why = _readable(tokens)
        integer = src is not None and not src.is_floating_point and not src.is_complex and src != torch.bool
        if tokens.ndim != 1 or not integer:
            raise TypeError(f"fastcollate.TokenWindows: tokens must be a 1-D array of integers, got "
                            f"{tokens.dtype} of shape {list(tokens.shape)}")
        for name, v in (("seq_len", seq_len), ("stride", stride)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"fastcollate.TokenWindows: {name} must be a positive int, got {v!r}")
        if dtype not in (torch.int64, torch.int32):
            raise ValueError(f"fastcollate.TokenWindows: dtype must be torch.int64 or torch.int32, got {dtype}")
        stride = seq_len if stride is None else stride
        total = int(tokens.shape[0])
        if total < seq_len + 1:
            raise ValueError(f"fastcollate.TokenWindows: {total} tokens make no window of seq_len + 1 = "
                             f"{seq_len + 1}")
        n = (total - seq_len - 1) // stride + 1
        holder = _Array(tokens)
        self.seq_len, self.stride, self.dtype = seq_len, stride, dtype
        super().__init__({key: _Window(holder, src, why, n, seq_len, stride, shift, dtype)
                          for key, shift in (("input_ids", 0), ("labels", 1))})

    @property
    def tokens(self) -> Any:
        return self._sources["input_ids"].holder.arr

    def __getitem__(self, i: Any) -> Any:
        j = self._row_index(i)
        src = self._sources["input_ids"]
        src.check()
        start = j * self.stride
        window = _convert_row(self.tokens[start:start + self.seq_len + 1], self.dtype)
        return {"input_ids": window[:-1], "labels": window[1:]}

    def __repr__(self) -> str:
        return (f"TokenWindows({self._n} windows of {self.seq_len} + 1 over {self.tokens.shape[0]} "
                f"{self.tokens.dtype} tokens, stride {self.stride}, {self.dtype})")
