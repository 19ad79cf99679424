"""The columns of fastcollate.data.arrays' datasets: where row i's bytes are (for the gather) and
what row i is in plain Python (for ``ds[i]``): numpy arrays and memmaps, CPU tensors, ragged
values + offsets, token windows. Memmaps pickle as their file and are checked against it
shrinking."""
from __future__ import annotations

import mmap
import os
from typing import Any, Sequence

import numpy as np
import torch

# dtypes a gather may widen into (any column may also keep its own dtype)
_WIDEN = (torch.int64, torch.int32, torch.float32, torch.float64, torch.float16, torch.bfloat16)
_GATHER_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
                  torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64}


def torch_dtype_of(np_dtype: np.dtype) -> torch.dtype | None:
    try:
        return torch.from_numpy(np.empty(0, dtype=np_dtype)).dtype
    except (TypeError, ValueError):
        return None


def _address(arr: Any) -> int:
    return arr.data_ptr() if isinstance(arr, torch.Tensor) else arr.__array_interface__["data"][0]


def byte_span(x: Any) -> tuple[int, int]:
    """[start, end) addresses of the memory ``x`` may be read from: a numpy array's (any
    strides), a tensor's whole storage, a pyarrow Buffer. The gathers check every row they read
    against these before copying (csrc/engine/gather_rows.cpp: check_jobs)."""
    if isinstance(x, torch.Tensor):
        storage = x.untyped_storage()
        return storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    if isinstance(x, np.ndarray):
        lo, hi = _byte_bounds(x)
        return int(lo), int(hi)
    return int(x.address), int(x.address) + int(x.size)  # a pyarrow Buffer


try:  # numpy >= 2
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # pragma: no cover - numpy 1.x
    _byte_bounds = np.byte_bounds


def spans_of(parts: Sequence[tuple[int, int]]) -> np.ndarray:
    """A [k, 2] int64 array of [start, end) spans, what a gather job's ``spans`` takes."""
    return np.asarray(parts, dtype=np.int64).reshape(-1, 2)


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


def readable(arr: Any) -> tuple[torch.dtype | None, str | None]:
    """The column's torch dtype, and why the gather cannot read it (None: it can)."""
    if isinstance(arr, torch.Tensor):
        if arr.device.type != "cpu":
            return arr.dtype, f"it is on {arr.device}"
        if arr.requires_grad or arr.is_sparse or arr.is_nested or arr.is_quantized:
            return arr.dtype, "it is not a plain dense tensor"
        dtype = arr.dtype
    else:
        dtype = torch_dtype_of(arr.dtype)
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


class HeldArray:
    """An array column held by a dataset: pickled so that memmaps are mapped again."""

    def __init__(self, arr: Any) -> None:
        self.arr = arr
        self.mm = _Memmap.of(arr)
        # this process's address of row 0 and the row stride in bytes (an unpickled copy, in a
        # spawned worker, reads its own)
        self.address = _address(arr)
        self.stride0 = _strides_bytes(arr)[0] if arr.ndim else 0
        self.span = byte_span(arr)

    def __reduce__(self):
        if self.mm is not None:
            return (_reopen, (self.mm, self.arr.dtype, tuple(self.arr.shape)))
        return (HeldArray, (self.arr,))

    def check(self, key: Any) -> None:
        if self.mm is not None:
            self.mm.check(key)


def _reopen(mm: _Memmap, dtype: np.dtype, shape: tuple[int, ...]) -> HeldArray:
    return HeldArray(mm.reopen(dtype, shape))


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

    def spans(self) -> np.ndarray | None:
        """The [start, end) addresses (a [k, 2] int64 array) of the memory every row lies in;
        None: unknown, and the gather leaves the batch to the ordinary path."""
        return None

    def affine(self) -> tuple[int, int, int] | None:
        """(address, row stride, shift) in bytes when row r always starts at address + r * stride
        + shift and all rows have ``fixed`` positions (scalars: one); None otherwise."""
        return None

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


def convert_row(x: Any, dtype: torch.dtype | None) -> Any:
    if dtype is None:
        return x
    # the copy keeps rows of read-only memmaps writable; the conversion is torch's own
    t = torch.from_numpy(np.array(x)) if not isinstance(x, torch.Tensor) else x
    return t.to(dtype, copy=True)


class ArraySource(Source):
    """A source whose rows live in one held array (``holder``)."""

    holder: HeldArray

    def check(self) -> None:
        self.holder.check(self.key)

    def spans(self) -> np.ndarray:
        return spans_of([self.holder.span])

    @property
    def needs_check(self) -> bool:
        return self.holder.mm is not None


class DenseSource(ArraySource):
    """Row i is ``arr[i]`` (a numpy row, a numpy scalar for 1-D arrays, or a tensor view)."""

    def __init__(self, arr: Any, key: Any, dtype: torch.dtype | None) -> None:
        self.key, self.holder = key, HeldArray(arr)
        self.n = int(arr.shape[0])
        self.src, self.why_slow = readable(arr)
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
        return convert_row(self.arr[i], self.convert)

    def ptrs(self, rows: np.ndarray) -> np.ndarray:
        return self.holder.address + rows * self.holder.stride0

    def affine(self) -> tuple[int, int, int]:
        return self.holder.address, self.holder.stride0, 0


class RaggedSource(ArraySource):
    """Row i is ``values[offsets[i]:offsets[i + 1]]``."""

    def __init__(self, ragged: "Ragged", key: Any, dtype: torch.dtype | None) -> None:
        values = ragged.values
        self.key, self.holder, self.offsets = key, HeldArray(values), ragged.offsets
        self.n = len(self.offsets) - 1
        self.src, self.why_slow = readable(values)
        self.convert = dtype  # dtypes= makes rows tensors of that dtype (None: rows as indexed)
        self.out = dtype or self.src
        self.trailing = tuple(int(s) for s in values.shape[1:])
        self._lens = np.diff(self.offsets)
        _check_widening(key, self.src, dtype)

    def row(self, i: int) -> Any:
        return convert_row(self.holder.arr[int(self.offsets[i]):int(self.offsets[i + 1])], self.convert)

    def ptrs(self, rows: np.ndarray) -> np.ndarray:
        return self.holder.address + self.offsets[rows] * self.holder.stride0

    def lens(self, rows: np.ndarray) -> np.ndarray:
        return self._lens[rows]

    def all_lengths(self) -> np.ndarray:
        return self._lens.copy()


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


def make_source(col: Any, key: Any, dtype: torch.dtype | None) -> Source:
    if isinstance(col, Source):
        if dtype is not None:
            raise ValueError(f"fastcollate.ArrayDataset: column {key!r}: dtypes= applies to arrays and Ragged only")
        col.key = key
        return col
    if isinstance(col, Ragged):
        return RaggedSource(col, key, dtype)
    if not isinstance(col, (np.ndarray, torch.Tensor)):
        raise TypeError(f"fastcollate.ArrayDataset: column {key!r} is a {type(col).__name__}; columns are numpy "
                        "arrays (memmaps included), CPU tensors or fastcollate.Ragged")
    if col.ndim < 1:
        raise ValueError(f"fastcollate.ArrayDataset: column {key!r} is 0-d; a column needs a row dimension")
    return DenseSource(col, key, dtype)


class Window(ArraySource):
    """``tokens[i * stride + shift : ... + seq_len]`` as ``dtype``: one side of a window."""

    def __init__(self, holder: HeldArray, src: torch.dtype, why_slow: str | None, n: int, seq_len: int, stride: int,
                 shift: int, dtype: torch.dtype) -> None:
        self.holder, self.src, self.why_slow = holder, src, why_slow
        self.n, self.fixed, self.stride, self.shift, self.out = n, seq_len, stride, shift, dtype

    def row(self, i: int) -> Any:
        start = i * self.stride + self.shift
        return convert_row(self.holder.arr[start:start + self.fixed], self.out)

    def ptrs(self, rows: np.ndarray) -> np.ndarray:
        return self.holder.address + (rows * (self.stride * self.holder.stride0) + self.shift * self.holder.stride0)

    def affine(self) -> tuple[int, int, int]:
        h = self.holder
        return h.address, self.stride * h.stride0, self.shift * h.stride0

