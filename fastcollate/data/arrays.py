"""Datasets over arrays that are already in memory (numpy arrays, memmaps, CPU tensors, ragged
values + offsets) whose batches skip per-sample Python: ``__getitems__`` returns a
:class:`Gathered` batch that fastcollate's collate turns into tensors by gathering the indexed
rows of every column straight into the batch's arena (fastcollate.data.gather). Any other collate_fn
sees ordinary samples: a Gathered batch is a sequence whose items are made on access, each
exactly ``dataset[i]``.
"""
from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .columns import Ragged, Source, Window, HeldArray, convert_row, readable, make_source

__all__ = ["ArrayDataset", "GatherLayout", "Gathered", "Ragged", "TokenWindows"]


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
        self._sources: dict[Any, Source] = {k: make_source(c, k, dtypes.get(k)) for k, c in items}
        sizes = {k: s.n for k, s in self._sources.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"fastcollate.ArrayDataset: columns have different numbers of rows: {sizes}")
        self._n = next(iter(sizes.values()))
        self._refresh()

    def _refresh(self) -> None:
        # one check per held array (TokenWindows' two columns share theirs): a stat() each
        holders = {id(getattr(s, "holder", s)): s for s in reversed(self._sources.values()) if s.needs_check}
        self.layout = GatherLayout(self._sources, self._mapping, self._n,
                                   slow=any(s.why_slow is not None for s in self._sources.values()),
                                   checked=list(reversed(holders.values())))

    def __setstate__(self, state: dict[str, Any]) -> None:
        # datasets pickled before the layout existed carried its parts as attributes
        for stale in ("_slow", "_checked", "_compiled", "layout"):
            state.pop(stale, None)
        self.__dict__.update(state)
        self._refresh()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("layout", None)  # rebuilt on load (it holds this process's compiled gather)
        return state

    @staticmethod
    def from_hf(dataset: Any, columns: Sequence[str] | None = None) -> "ArrayDataset":
        """An ArrayDataset over the numeric columns of a Hugging Face ``datasets.Dataset``.

        Sample i is ``{name: dataset[i][name]}`` (Python numbers and lists, the dataset's indices
        mapping applied); a batch is gathered from the Arrow buffers. Columns must hold numbers
        or lists of numbers; choose them with ``columns`` (default: all)."""
        from .hf import sources

        return ArrayDataset(sources(dataset, columns))

    @property
    def columns(self) -> list[Any]:
        return list(self._sources)

    def ungathered(self) -> dict[Any, str]:
        """The columns the gather cannot read, each with why; while there is one, every batch
        is materialized and collated the ordinary way (still exact, without the speed)."""
        return {k: s.why_slow for k, s in self._sources.items() if s.why_slow is not None}

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
        for s in self.layout.checked:
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


class _Compiled(dict):
    """What the gather builds once per dataset (its compiled template, which holds this
    process's addresses): pickled empty, so an unpickled copy builds its own."""

    def __reduce__(self):
        return (_Compiled, ())


@dataclasses.dataclass(eq=False)
class GatherLayout:
    """What the gather (fastcollate.data.gather) reads of an ArrayDataset: its columns, whether
    samples are dicts, the row count, whether any column forbids the gather, the columns whose
    storage can change under them (memmaps: checked once per batch), and a per-process cache."""

    sources: dict[Any, Source]
    mapping: bool
    n: int
    slow: bool
    checked: list[Source]
    compiled: _Compiled = dataclasses.field(default_factory=_Compiled)


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

    def __fastcollate_gather__(self, alloc: Any, threads: int, pad: Any) -> Any:
        """The hook fastcollate's collate calls on a batch that has it: the collated batch
        gathered into one arena (``alloc``: nbytes -> uint8 tensor, None for the pool), or None
        when only the ordinary path (the batch's samples, one by one) can promise the result."""
        from .gather import gather

        return gather(self.dataset, self.indices, alloc, threads, pad)


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
        src, why = readable(tokens)
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
        holder = HeldArray(tokens)
        self.seq_len, self.stride, self.dtype = seq_len, stride, dtype
        super().__init__({key: Window(holder, src, why, n, seq_len, stride, shift, dtype)
                          for key, shift in (("input_ids", 0), ("labels", 1))})

    @property
    def tokens(self) -> Any:
        return self._sources["input_ids"].holder.arr

    def __getitem__(self, i: Any) -> Any:
        j = self._row_index(i)
        src = self._sources["input_ids"]
        src.check()
        start = j * self.stride
        window = convert_row(self.tokens[start:start + self.seq_len + 1], self.dtype)
        return {"input_ids": window[:-1], "labels": window[1:]}

    def __repr__(self) -> str:
        return (f"TokenWindows({self._n} windows of {self.seq_len} + 1 over {self.tokens.shape[0]} "
                f"{self.tokens.dtype} tokens, stride {self.stride}, {self.dtype})")
