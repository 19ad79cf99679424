"""Leaves of a collated batch and rebuilding it with new leaves, keeping its container types."""
from __future__ import annotations

import collections.abc
import copy
from typing import Any, Callable, Iterator

import torch


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, collections.abc.Mapping):
        for v in obj.values():
            yield from iter_tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from iter_tensors(v)


def rebuild_mapping(elem: collections.abc.Mapping, values: dict) -> Any:
    """default_collate's rule for the mapping that comes back: a shallow copy of sample 0 updated
    with the new values when it is mutable, else type(sample 0)(values), and a plain dict when
    either raises TypeError."""
    try:
        if isinstance(elem, collections.abc.MutableMapping):
            clone = copy.copy(elem)
            clone.update(values)
            return clone
        return type(elem)(values)
    except TypeError:
        return values


def map_tensors(obj: Any, fn: Callable[[Any], Any], leaf_type: type = torch.Tensor) -> Any:
    """obj with every leaf of leaf_type (tensors by default) replaced by fn(leaf); str, numbers
    and other leaves untouched; containers keep their types."""
    if isinstance(obj, leaf_type):
        return fn(obj)
    if type(obj) is dict:  # the common case first: an ABC isinstance costs more than the rest of a leaf
        return {k: map_tensors(v, fn, leaf_type) for k, v in obj.items()}
    if isinstance(obj, collections.abc.Mapping):
        values = {k: map_tensors(v, fn, leaf_type) for k, v in obj.items()}
        return values if type(obj) is dict else rebuild_mapping(obj, values)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(v, fn, leaf_type) for v in obj))
    if isinstance(obj, list):
        out = [map_tensors(v, fn, leaf_type) for v in obj]
        if type(obj) is list:
            return out
        clone = copy.copy(obj)
        clone[:] = out
        return clone
    if isinstance(obj, tuple):
        return type(obj)(map_tensors(v, fn, leaf_type) for v in obj) if type(obj) is tuple else tuple(map_tensors(v, fn, leaf_type) for v in obj)
    return obj
