"""The gather of an ArrayDataset batch. Datasets whose columns all have rows of one length at
affine addresses (TokenWindows, arrays, memmaps, tensors) get a compiled template, built once
(``_C.FixedGather``, csrc/python/gather_fixed.cpp): a batch is one call. Every other batch
(padding, ragged and Arrow columns) is planned here (row addresses, lengths, output shapes,
arena offsets) over numpy index arithmetic and its bytes moved and converted by
``fastcollate._C.gather`` (csrc/python/gather.cpp). Both run the same row jobs without the GIL
(csrc/engine/gather_rows.cpp). The exactness rule is the library's: a gathered batch equals
``default_collate([ds[i] for i in indices])`` (or the padding reference of the same samples)
element for element, dtype and shape; whenever the gather cannot promise that (rows of unequal
length with no padding, a dtype or layout it does not read, pad values that do not fit, ...) it
returns None and the batch is materialized and goes the ordinary way, errors included.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from .. import _ext
from ..core.pad import PadSpec, check_fits

_COMPILED = True  # tests turn the fixed-row template off to compare it with the planned path


class GatherPlan:
    """The jobs of one gather (``_C.GatherJob``, see csrc/python/gather.cpp) and where their
    outputs go in the arena (each at a multiple of ``_C.align``)."""

    def __init__(self, rows: int) -> None:
        self.B = rows
        self.nbytes = 0
        self.align = _ext._C.align
        self.jobs: list[Any] = []
        self.keys: list[tuple[Any, bool]] = []  # (key, a list of [B] tensors rather than one tensor)

    def add(self, key: Any, kind: Any, ptrs: np.ndarray | None, lens: np.ndarray | None, L: int, inner: int,
            src: torch.dtype, dst: torch.dtype, shape: tuple[int, ...], pad: Any = 0, left: bool = False,
            as_list: bool = False, rows: int | None = None, spans: np.ndarray | None = None) -> None:
        """A job of ``kind`` (a ``_C.JobKind``) writing the [shape] output of ``key``; ``rows``
        (default: the batch's) lets a contiguous source be one row of ``L`` positions: one copy,
        no per-row addresses. ``spans``: the [k, 2] [start, end) addresses a rows job may read
        (the engine checks every row against them before writing anything)."""
        at = self.nbytes
        size = _numel(shape) * dst.itemsize
        self.nbytes = at + (size + self.align - 1) // self.align * self.align
        self.jobs.append(_ext._C.GatherJob(
            kind=kind, offset=at, ptrs=None if ptrs is None else torch.from_numpy(ptrs),
            lens=None if lens is None else torch.from_numpy(lens), rows=self.B if rows is None else rows, L=L,
            inner=inner, src=src, dst=dst, pad=pad, left=left, transposed=as_list, shape=shape,
            spans=None if spans is None else torch.from_numpy(np.ascontiguousarray(spans, dtype=np.int64))))
        self.keys.append((key, as_list))

    def run(self, arena: torch.Tensor, threads: int) -> list[Any]:
        """The jobs run into ``arena``: each job's output view (None where it has no shape). A row
        that would read outside its source raises ValueError naming the column."""
        try:
            return _ext._C.gather(arena, self.jobs, threads)
        except ValueError as exc:
            msg = str(exc)
            job = _job_index(msg)
            if job is None or job >= len(self.keys):
                raise
            raise ValueError(f"fastcollate: column {self.keys[job][0]!r}: {msg}") from None


def _job_index(msg: str) -> int | None:
    import re

    m = re.search(r"job (\d+), row", msg)
    return int(m.group(1)) if m else None


def _numel(shape: Sequence[int]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _int64(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.int64 and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=np.int64)


def _template(layout: Any) -> Any:
    """The dataset's compiled fixed-row gather, or None when a column is not fixed and affine."""
    cached = layout.compiled.get("fixed", False)
    if cached is not False:
        return cached
    columns = []
    for s in layout.sources.values():
        where = s.affine()
        if where is None or s.lists:
            columns = None
            break
        spans = s.spans()
        if spans is None or len(spans) != 1:
            columns = None
            break
        base, row_stride, shift = where
        columns.append(_ext._C.FixedColumn(base=base, row_stride=row_stride, shift=shift, L=1 if s.scalar else s.fixed,
                                           inner=_numel(s.trailing), src=s.src, dst=s.out, trailing=list(s.trailing),
                                           scalar=s.scalar, lo=int(spans[0, 0]), hi=int(spans[0, 1])))
    template = None if columns is None else _ext._C.FixedGather(list(layout.sources), layout.mapping, layout.n,
                                                                columns, tuple(layout.sources.values()))
    layout.compiled["fixed"] = template
    return template


def gather(ds: Any, indices: Any, alloc: Any, threads: int, pad: PadSpec | None) -> Any:
    """The collated batch of rows ``indices`` of ArrayDataset ``ds``, gathered into one arena
    (``alloc``: nbytes -> uint8 tensor, None for the pageable pool); None when only the ordinary
    path can promise default_collate's result."""
    layout = ds.layout
    sources = layout.sources
    if layout.slow or _ext._C is None:
        return None
    if pad is None and _COMPILED:
        template = _template(layout)
        if template is not None:
            for s in layout.checked:
                s.check()
            out = template(indices, alloc, threads)
            if out is not None:
                return out
    rows = ds.rows(indices)
    B = len(rows)
    if B == 0:
        return None
    for s in layout.checked:
        s.check()
    spec = None
    if pad is not None:
        if not layout.mapping:
            return None
        present = tuple(k for k, _ in pad.optional if k in sources and not sources[k].scalar)
        spec = pad._for(present)[0]
        if any(k not in sources or sources[k].scalar for k, _ in spec.values):
            return None
        if any(k is not None and k in sources for k in (spec.mask_key, spec.lengths_key)):
            return None
    spans = {key: s.spans() for key, s in sources.items()}
    if any(v is None for v in spans.values()):
        return None  # memory the engine cannot bound: the ordinary path
    kinds = _ext._C.JobKind
    plan = GatherPlan(B)
    padded = dict(spec.values) if spec is not None else {}
    tail: list[dict[str, Any]] = []  # the mask and lengths go after every column, as padding appends them
    for key, s in sources.items():
        ptrs = _int64(s.ptrs(rows))
        lens = s.lens(rows)
        inner = _numel(s.trailing)
        if key in padded:
            lens = np.full(B, s.fixed, dtype=np.int64) if lens is None else _int64(lens)
            dtype = s.pad_dtype(lens)
            try:
                check_fits(padded[key], dtype, "")
            except ValueError:
                return None  # the reference's error
            longest = int(lens.max())
            L = spec.target(longest if spec.max_length is None else min(longest, spec.max_length))
            left = spec.side == "left"
            plan.add(key, kinds.Rows, ptrs, lens, L, inner, s.src, dtype, (B, L, *s.trailing), padded[key], left,
                     spans=spans[key])
            if key == spec.values[0][0]:
                if spec.mask_key is not None:
                    tail.append(dict(key=spec.mask_key, kind=kinds.Mask, ptrs=None, lens=lens, L=L, inner=1,
                                     src=spec.mask_dtype, dst=spec.mask_dtype, shape=(B, L), left=left))
                if spec.lengths_key is not None:
                    tail.append(dict(key=spec.lengths_key, kind=kinds.Lengths, ptrs=None, lens=lens, L=L, inner=1,
                                     src=torch.int64, dst=torch.int64, shape=(B,)))
            continue
        if lens is not None:
            if (lens != lens[0]).any():
                return None  # unequal rows: default_collate's own error, from the ordinary path
            length = int(lens[0])
        else:
            length = 1 if s.scalar else s.fixed
        if s.lists and not s.scalar:  # default_collate of list rows: one [B] tensor per position
            plan.add(key, kinds.Rows, ptrs, None, length, 1, s.src, s.list_dtype(), (length, B), as_list=True,
                     spans=spans[key])
            continue
        shape = (B,) if s.scalar else (B, length, *s.trailing)
        plan.add(key, kinds.Rows, ptrs, None, length, inner, s.src, s.out, shape, spans=spans[key])
    for job in tail:
        plan.add(**job)
    size = max(plan.nbytes, plan.align)
    arena = _ext._C.pool_allocate(size) if alloc is None else alloc(size)
    views = plan.run(arena, threads)
    values = {key: list(v.unbind(0)) if as_list else v for (key, as_list), v in zip(plan.keys, views)}
    # default_collate: a list for tuple samples; a dict in the samples' key order, padding's
    # mask and lengths appended
    return values if layout.mapping else list(values.values())
