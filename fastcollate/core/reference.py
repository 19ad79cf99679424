"""The pure-Python semantics of fastcollate: torch's default_collate, rule for rule, with errors
that name the key path, the sample and what differed.

It is the test oracle, the fallback when the compiled engine is missing, and the slow path the
engine hands anything it cannot place exactly (mixed dtypes, odd types, every error case).
It honours ``torch.utils.data._utils.collate.default_collate_fn_map`` as default_collate does,
including entries a user registered.
"""
from __future__ import annotations

import collections.abc
import copy
import re
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils import collate as _tc

from .tree import rebuild_mapping

_STR_OBJ_DTYPE = re.compile(r"[SaUO]")
_UNSUPPORTED_TYPE = "batch must contain tensors, numpy arrays, numbers, dicts or lists"
_SPARSE = {torch.sparse_coo, torch.sparse_csr, torch.sparse_bsr, torch.sparse_csc, torch.sparse_bsc}

Path = tuple


def format_path(path: Sequence[Any]) -> str:
    """``("image", 1)`` -> ``"batch['image'][1]"``."""
    return "batch" + "".join(f"[{k!r}]" for k in path)


def _where(path: Path) -> str:
    return f"fastcollate: {format_path(path)}"


def type_name(obj: Any) -> str:
    t = type(obj)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def rewrap(exc: BaseException, message: str) -> BaseException:
    """The same exception class with a better message; the original stays as the cause."""
    try:
        new = type(exc)(message)
    except Exception:
        return exc
    new.__cause__ = exc
    return new


def _first_odd_sample(batch: Sequence[Any]) -> str:
    t0 = type(batch[0])
    for i, x in enumerate(batch):
        if type(x) is not t0:
            return f"sample {i} is {type_name(x)}, sample 0 is {type_name(batch[0])}: "
    return ""


_UNSUPPORTED_LAYOUT = ("Batches of {kind} tensors are not currently supported by the default collate_fn; "
                "please provide a custom collate_fn to handle them appropriately.")


def _in_worker() -> bool:
    return get_worker_info() is not None


# ---------------------------------------------------------------- leaves


def _tensors(batch, path, worker, shared):
    elem = batch[0]
    if elem.is_nested:  # torch's words first (code and tests match them), then where
        raise RuntimeError(_UNSUPPORTED_LAYOUT.format(kind="nested") + f" (fastcollate: {_where(path)}: sample 0 is a "
                           "nested tensor; fastcollate's pad= pads variable-length leaves)")
    if elem.layout in _SPARSE:
        raise RuntimeError(_UNSUPPORTED_LAYOUT.format(kind="sparse") + f" (fastcollate: {_where(path)}: sample 0 is a "
                           f"sparse tensor, {elem.layout})")
    for i, t in enumerate(batch):  # types first: torch.stack rejects a non-tensor before shapes
        if not isinstance(t, torch.Tensor):
            # in a worker default_collate first sums the samples' numel(): an AttributeError there
            cls = AttributeError if shared and not hasattr(t, "numel") else TypeError
            raise cls(f"{_where(path)}: sample {i} is {type_name(t)}, sample 0 is a Tensor")
    if not isinstance(batch, (list, tuple)):
        # default_collate hands the batch itself to torch.stack, which takes a list or a tuple only
        raise TypeError(f"{_where(path)}: a batch of tensors must be a list or tuple of samples, got "
                        f"{type_name(batch)} (torch.stack refuses it, so default_collate does too; a "
                        f"__getitems__ that returns one stacked tensor should return a list of samples)")
    for i, t in enumerate(batch):
        if t.shape != elem.shape:
            raise RuntimeError(
                f"{_where(path)}: sample {i} has shape {list(t.shape)}, sample 0 has {list(elem.shape)} "
                f"(stack expects each tensor to be equal size)"
            )
    out = None
    if worker:
        # default_collate stacks into elem's dtype here (out=), which also fixes the casting rules
        if shared:
            numel = sum(x.numel() for x in batch)
            storage = elem._typed_storage()._new_shared(numel, device=elem.device)
            out = elem.new(storage).resize_(len(batch), *list(elem.size()))
        else:
            out = elem.new_empty((len(batch), *elem.size()))
    try:
        return torch.stack(list(batch), 0, out=out)
    except Exception as exc:
        dtypes = sorted({str(t.dtype) for t in batch})
        extra = f" (sample dtypes: {', '.join(dtypes)})" if len(dtypes) > 1 else ""
        raise rewrap(exc, f"{_where(path)}: {exc}{extra}") from exc


def _numpy_arrays(batch, path, worker, shared):
    elem = batch[0]
    if _STR_OBJ_DTYPE.search(elem.dtype.str) is not None:
        raise TypeError(
            f"{_where(path)}: sample 0 is a numpy array of dtype {elem.dtype}; default_collate: "
            f"{_UNSUPPORTED_TYPE}; found {elem.dtype}"
        )
    tensors = []
    for i, b in enumerate(batch):
        try:
            tensors.append(torch.as_tensor(b))
        except Exception as exc:
            what = f"numpy array of dtype {b.dtype}" if hasattr(b, "dtype") else type_name(b)
            raise rewrap(exc, f"{_where(path)}: sample {i} ({what}) cannot become a tensor: {exc}") from exc
    return _collate(tensors, path, worker, shared)


def _scalars(convert: Callable[[Any], torch.Tensor]):
    def collate_scalars(batch, path, worker, shared):
        try:
            return convert(batch)
        except Exception as exc:
            detail = _first_odd_sample(batch)
            if not detail and isinstance(batch[0], int):
                big = next((i for i, x in enumerate(batch) if not -(2**63) <= int(x) < 2**63), None)
                if big is not None:
                    detail = f"sample {big} ({batch[big]}) does not fit in int64: "
            raise rewrap(exc, f"{_where(path)}: {detail}{exc}") from exc

    return collate_scalars


def _strings(batch, path, worker, shared):
    return batch


_HANDLERS: dict[Callable, Callable] = {
    _tc.collate_tensor_fn: _tensors,
    _tc.collate_float_fn: _scalars(lambda b: torch.tensor(b, dtype=torch.float64)),
    _tc.collate_int_fn: _scalars(torch.tensor),
    _tc.collate_str_fn: _strings,
}
if hasattr(_tc, "collate_numpy_array_fn"):
    _HANDLERS[_tc.collate_numpy_array_fn] = _numpy_arrays
    _HANDLERS[_tc.collate_numpy_scalar_fn] = _scalars(torch.as_tensor)

# what default_collate_fn_map held when fastcollate was imported; the compiled engine knows
# exactly these rules and nothing a user registers later
STOCK_FN_MAP = dict(_tc.default_collate_fn_map)


_STOCK_ITEMS = tuple(STOCK_FN_MAP.items())


def fn_map_is_stock() -> bool:
    m = _tc.default_collate_fn_map
    if len(m) != len(_STOCK_ITEMS):
        return False
    for k, v in _STOCK_ITEMS:  # a plain loop: this runs on every batch
        if m.get(k) is not v:
            return False
    return True


def _lookup(elem: Any) -> Callable | None:
    fn_map = _tc.default_collate_fn_map
    fn = fn_map.get(type(elem))
    if fn is not None:
        return fn
    for collate_type, fn in fn_map.items():
        if isinstance(elem, collate_type):
            return fn
    return None


# ---------------------------------------------------------------- containers


def mapping_column(batch: Sequence[Any], key: Any, path: Sequence[Any] = ()) -> list[Any]:
    """``[d[key] for d in batch]`` of mapping samples, with the error naming the sample that lacks it."""
    elem = batch[0]
    column = []
    for i, d in enumerate(batch):
        try:
            column.append(d[key])
        except KeyError:
            keys = list(d) if isinstance(d, collections.abc.Mapping) else "?"
            raise KeyError(
                f"{_where(tuple(path))}: sample {i} has no key {key!r} (sample 0 has keys {list(elem)}, "
                f"sample {i} has {keys})"
            ) from None
        except TypeError as exc:
            raise TypeError(
                f"{_where(tuple(path))}: sample {i} is {type_name(d)}, sample 0 is a mapping "
                f"({type_name(elem)}): {exc}"
            ) from exc
    return column


def _mapping(batch, path, worker, shared):
    elem = batch[0]
    values = {key: _collate(mapping_column(batch, key, path), path + (key,), worker, shared) for key in elem}
    return rebuild_mapping(elem, values)


def _transposed(batch, path):
    try:
        return list(zip(*batch))
    except TypeError as exc:
        odd = next((i for i, s in enumerate(batch) if not isinstance(s, collections.abc.Iterable)), 0)
        raise TypeError(
            f"{_where(path)}: sample {odd} is {type_name(batch[odd])}, sample 0 is a sequence "
            f"({type_name(batch[0])}): {exc}"
        ) from exc


def _named_tuple(batch, path, worker, shared):
    columns = _transposed(batch, path)
    return type(batch[0])(*(_collate(c, path + (j,), worker, shared) for j, c in enumerate(columns)))


def _sequence(batch, path, worker, shared):
    elem = batch[0]
    size = len(elem)
    for i, s in enumerate(batch):
        try:
            n = len(s)
        except TypeError as exc:
            raise TypeError(
                f"{_where(path)}: sample {i} is {type_name(s)}, sample 0 is a sequence of length {size}: {exc}"
            ) from exc
        if n != size:
            raise RuntimeError(
                f"{_where(path)}: sample {i} has length {n}, sample 0 has length {size} "
                "(each element in list of batch should be of equal size)"
            )
    columns = _transposed(batch, path)
    values = [_collate(c, path + (j,), worker, shared) for j, c in enumerate(columns)]
    if isinstance(elem, tuple):
        return values
    try:
        if isinstance(elem, collections.abc.MutableSequence):
            clone = copy.copy(elem)
            for j, v in enumerate(values):
                clone[j] = v
            return clone
        return type(elem)(values)
    except TypeError:
        return values


def _collate(batch, path: Path, worker: bool, shared: bool):
    try:
        elem = batch[0]
    except (IndexError, KeyError, TypeError) as exc:
        n = len(batch) if isinstance(batch, collections.abc.Sized) else None
        what = "an empty batch" if n == 0 else f"a {type_name(batch)} (it must be a sequence of samples)"
        raise rewrap(exc, f"{_where(path)}: cannot collate {what}") from exc
    fn = _lookup(elem)
    if fn is not None:
        handler = _HANDLERS.get(fn)
        if handler is None:  # registered by the user: called exactly as default_collate would
            return fn(batch, collate_fn_map=_tc.default_collate_fn_map)
        return handler(batch, path, worker, shared)
    if isinstance(elem, collections.abc.Mapping):
        return _mapping(batch, path, worker, shared)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return _named_tuple(batch, path, worker, shared)
    if isinstance(elem, collections.abc.Sequence):
        return _sequence(batch, path, worker, shared)
    raise TypeError(
        f"{_where(path)}: cannot collate sample 0 of type {type_name(elem)}; "
        f"default_collate: {_UNSUPPORTED_TYPE}; found {type(elem)}"
    )


def collate(batch: Sequence[Any]) -> Any:
    """default_collate's result for ``batch``, computed in pure Python, with better errors.

    >>> collate([{"x": 1}, {"x": 2}])
    {'x': tensor([1, 2])}
    """
    worker = _in_worker()
    return _collate(batch, (), worker, worker)


def collate_subtree(samples: Sequence[Any], path: Sequence[Any]) -> Any:
    """What the compiled engine calls for a part of the batch off its fast path."""
    worker = _in_worker()
    return _collate(samples, tuple(path), worker, worker)
