"""The differential fuzzer's cases: seeded random batches, a shrinker, and reproducers.

A case is a list of samples whose leaves are *recipes* -- ``Leaf(kind, dtype, shape, layout,
seed)`` -- made into values by :func:`make`. Recipes keep a failing case small to print and
exact to replay: the reproducer a failure prints is Python code that imports this module and
rebuilds the batch value for value.

Batches are built the way real ones differ: every sample follows one schema (nested dicts,
lists, tuples, namedtuples, custom Mappings and Sequences over tensors of every dtype and
layout, numpy arrays and scalars, Python numbers, strings, bytes, None), then some leaves of
some samples are made odd -- another dtype (type promotion), another layout, a shape off by
one, another type, the same object again -- and some containers lose a key or an item.
"""
from __future__ import annotations

import collections
import collections.abc
import dataclasses
import math
import pickle
from typing import Any, Callable

import numpy as np
import torch

TORCH_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16",
                "bfloat16", "float32", "float64", "complex64", "complex128", "float8_e4m3fn"]
COMMON_DTYPES = ["uint8", "int32", "int64", "float32", "float64", "bool", "float16", "bfloat16", "complex64"]
NP_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16",
             "float32", "float64", "complex64", "complex128"]
TENSOR_LAYOUTS = ["contig", "contig", "contig", "t", "chw", "perm", "step", "laststep", "cl", "cl3d", "expand",
                  "offset", "conj", "neg", "scalar"]
NUMPY_LAYOUTS = ["C", "C", "F", "T", "readonly", "byteswap", "negstride", "step"]
PY_KINDS = ["int", "float", "bool", "str", "bytes", "bigint", "none", "nan"]


@dataclasses.dataclass(frozen=True)
class Leaf:
    """A value to make: kind in tensor / numpy / npscalar / py."""

    kind: str
    dtype: str
    shape: tuple[int, ...] = ()
    layout: str = "contig"
    seed: int = 0

    def __repr__(self) -> str:
        return f"Leaf({self.kind!r}, {self.dtype!r}, {self.shape!r}, {self.layout!r}, {self.seed})"


# ---- containers a user's samples are made of -------------------------------------------------

class Frozen(collections.abc.Mapping):
    """A read-only Mapping: default_collate rebuilds it as type(elem)(dict)."""

    def __init__(self, data: Any = ()) -> None:
        self._d = dict(data)

    def __getitem__(self, k: Any) -> Any:
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Frozen) and self._d == other._d

    def __repr__(self) -> str:
        return f"Frozen({self._d!r})"


class Seq(collections.abc.Sequence):
    """A read-only Sequence that can be built from a list."""

    def __init__(self, items: Any = ()) -> None:
        self._items = list(items)

    def __getitem__(self, i: Any) -> Any:
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Seq) and self._items == other._items

    def __repr__(self) -> str:
        return f"Seq({self._items!r})"


NT1 = collections.namedtuple("NT1", ["a"])
NT2 = collections.namedtuple("NT2", ["a", "b"])
NT3 = collections.namedtuple("NT3", ["a", "b", "c"])
NAMEDTUPLES = {1: NT1, 2: NT2, 3: NT3}
CONTAINERS = ["dict", "dict", "dict", "odict", "frozen", "list", "list", "tuple", "tuple", "nt", "seq"]


@dataclasses.dataclass
class Node:
    """A container of a sample: kind, and its children as (key, child) pairs."""

    kind: str
    items: list[tuple[Any, Any]]


# ---- making values ----------------------------------------------------------------------------

def _values(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    if dtype == "bool":
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    if dtype.startswith(("uint", "int")):
        info = np.iinfo(dtype)
        lo, hi = max(int(info.min), -1000), min(int(info.max), 1000)
        v = rng.integers(lo, hi + 1, n)
        extremes = np.array([info.min, info.max], dtype=dtype)
        out = v.astype(dtype)
        if n and rng.random() < 0.3:
            out[rng.integers(0, n)] = extremes[rng.integers(0, 2)]
        return out.reshape(shape)
    v = rng.standard_normal(n) * 100
    if n and rng.random() < 0.3:
        v[rng.integers(0, n)] = [np.nan, -0.0, np.inf, -np.inf][rng.integers(0, 4)]
    if dtype.startswith("complex"):
        v = v + 1j * rng.standard_normal(n)
    return v.reshape(shape)


def torch_dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def _tensor(leaf: Leaf) -> torch.Tensor:
    rng = np.random.default_rng(leaf.seed)
    shape, layout, dtype = tuple(leaf.shape), leaf.layout, torch_dtype_of(leaf.dtype)

    def filled(s: tuple[int, ...]) -> torch.Tensor:
        v = _values("float64" if leaf.dtype in ("bfloat16", "float8_e4m3fn") else
                    "complex128" if leaf.dtype.startswith("complex") else leaf.dtype, s, rng)
        t = torch.from_numpy(np.ascontiguousarray(v))
        return t.to(dtype)

    if layout == "scalar":
        return filled(()).reshape(())
    d = len(shape)
    if layout == "t" and d >= 2:
        s = shape[:-2] + (shape[-1], shape[-2])
        return filled(s).transpose(-1, -2)
    if layout == "chw" and d == 3:  # a PILToTensor-style CHW view of HWC memory
        return filled((shape[1], shape[2], shape[0])).permute(2, 0, 1)
    if layout == "perm" and d >= 2:
        perm = list(rng.permutation(d))
        inv = [perm.index(i) for i in range(d)]
        return filled(tuple(shape[p] for p in perm)).permute(*inv)
    if layout == "step" and d >= 1:
        return filled((shape[0] * 2,) + shape[1:])[::2]
    if layout == "laststep" and d >= 1:
        return filled(shape[:-1] + (shape[-1] * 3,))[..., ::3]
    if layout == "cl" and d == 4:
        return filled(shape).contiguous(memory_format=torch.channels_last)
    if layout == "cl3d" and d == 5:
        return filled(shape).contiguous(memory_format=torch.channels_last_3d)
    if layout == "expand" and d >= 1:
        k = int(rng.integers(0, d))
        return filled(shape[:k] + (1,) + shape[k + 1:]).expand(*shape)
    if layout == "offset":
        return filled((int(np.prod(shape)) + 3,))[3:].view(shape)
    if layout == "conj" and dtype.is_complex:
        return filled(shape).conj()
    if layout == "neg" and (dtype.is_complex or dtype.is_floating_point) and dtype.itemsize >= 2:
        return torch._neg_view(filled(shape))
    return filled(shape)


def _numpy(leaf: Leaf) -> np.ndarray:
    rng = np.random.default_rng(leaf.seed)
    shape, layout = tuple(leaf.shape), leaf.layout
    a = np.ascontiguousarray(_values(leaf.dtype, shape, rng)).astype(leaf.dtype)
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "T" and a.ndim >= 2:
        return np.ascontiguousarray(a.swapaxes(-1, -2)).swapaxes(-1, -2)
    if layout == "readonly":
        a.flags.writeable = False
        return a
    if layout == "byteswap" and a.dtype.itemsize > 1:
        return a.astype(a.dtype.newbyteorder())
    if layout == "negstride" and a.ndim >= 1:
        return np.ascontiguousarray(a[::-1])[::-1]
    if layout == "step" and a.ndim >= 1:
        return np.repeat(a, 2, axis=0)[::2]
    return a


def _python(leaf: Leaf) -> Any:
    rng = np.random.default_rng(leaf.seed)
    kind = leaf.dtype
    if kind == "int":
        return int(rng.integers(-2**40, 2**40))
    if kind == "bigint":
        return [2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**70][int(rng.integers(0, 5))]
    if kind == "float":
        return float(rng.standard_normal() * 10)
    if kind == "nan":
        return [math.nan, -0.0, math.inf, -math.inf][int(rng.integers(0, 4))]
    if kind == "bool":
        return bool(rng.integers(0, 2))
    if kind == "str":
        return "s" * int(rng.integers(0, 4))
    if kind == "bytes":
        return b"b" * int(rng.integers(0, 4))
    return None


_made: dict[int, Any] = {}


def make_leaf(leaf: Leaf) -> Any:
    if leaf.kind == "pylist":  # tokenizer output: a list of Python numbers
        rng = np.random.default_rng(leaf.seed)
        n = leaf.shape[0] if leaf.shape else 0
        if leaf.dtype == "bigint":
            return [int(x) for x in rng.integers(0, 100, n)][:-1] + [2**64] if n else []
        return _values(leaf.dtype, (n,), rng).tolist()
    if leaf.kind == "tensor":
        return _tensor(leaf)
    if leaf.kind == "numpy":
        return _numpy(leaf)
    if leaf.kind == "npscalar":
        return _numpy(Leaf("numpy", leaf.dtype, (), "C", leaf.seed))[()]
    return _python(leaf)


def make(tree: Any, shared: dict | None = None) -> Any:
    """The value of a sample tree (Leaf, Node, or ("same", Leaf): the one object made for that leaf
    in this batch, as a dataset that returns a cached tensor does)."""
    shared = {} if shared is None else shared
    if isinstance(tree, Leaf):
        return make_leaf(tree)
    if isinstance(tree, tuple) and tree and tree[0] == "same":
        if tree[1] not in shared:
            shared[tree[1]] = make_leaf(tree[1])
        return shared[tree[1]]
    kind, items = tree.kind, tree.items
    vals = [(k, make(v, shared)) for k, v in items]
    if kind == "dict":
        return dict(vals)
    if kind == "odict":
        return collections.OrderedDict(vals)
    if kind == "frozen":
        return Frozen(vals)
    if kind == "list":
        return [v for _, v in vals]
    if kind == "tuple":
        return tuple(v for _, v in vals)
    if kind == "seq":
        return Seq(v for _, v in vals)
    if kind.startswith("nt"):
        return NAMEDTUPLES[len(vals)](*(v for _, v in vals))
    raise AssertionError(kind)


def make_batch(samples: list[Any]) -> list[Any]:
    shared: dict = {}
    return [make(s, shared) for s in samples]


# ---- random schemas and their odd samples -------------------------------------------------------

def _shape(rng: np.random.Generator, layout: str) -> tuple[int, ...]:
    need = {"t": 2, "perm": 2, "chw": 3, "cl": 4, "cl3d": 5}.get(layout)
    d = need if need is not None and (layout not in ("t", "perm") or rng.random() < 0.7) else int(rng.integers(0, 4))
    if layout in ("t", "perm"):
        d = max(d, int(rng.integers(2, 4)))
    if layout == "scalar":
        return ()
    sizes = [int(rng.integers(1, 5)) for _ in range(d)]
    if sizes and rng.random() < 0.08:
        sizes[int(rng.integers(0, d))] = 0  # zero-size dimension
    return tuple(sizes)


def random_leaf(rng: np.random.Generator) -> Leaf:
    r = rng.random()
    seed = int(rng.integers(0, 2**31))
    if r < 0.55:
        dtype = str(rng.choice(COMMON_DTYPES if rng.random() < 0.7 else TORCH_DTYPES))
        layout = str(rng.choice(TENSOR_LAYOUTS))
        return Leaf("tensor", dtype, _shape(rng, layout), layout, seed)
    if r < 0.72:
        layout = str(rng.choice(NUMPY_LAYOUTS))
        return Leaf("numpy", str(rng.choice(NP_DTYPES)), _shape(rng, "t" if layout == "T" else "contig"), layout, seed)
    if r < 0.8:
        return Leaf("npscalar", str(rng.choice(NP_DTYPES)), (), "C", seed)
    return Leaf("py", str(rng.choice(PY_KINDS, p=[0.3, 0.25, 0.1, 0.1, 0.08, 0.05, 0.04, 0.08])), (), "", seed)


def random_schema(rng: np.random.Generator, depth: int = 0) -> Any:
    if depth >= 3 or rng.random() < (0.35 if depth else 0.15):
        return random_leaf(rng)
    kind = str(rng.choice(CONTAINERS))
    width = int(rng.integers(1, 4 if kind == "nt" else 5))
    if kind == "nt":
        kind = f"nt{width}"
    keys = [f"k{i}" for i in range(width)] if kind in ("dict", "odict", "frozen") else list(range(width))
    return Node(kind, [(k, random_schema(rng, depth + 1)) for k in keys])


def _reseed(tree: Any, rng: np.random.Generator) -> Any:
    """The schema with fresh values: another sample made by the same code."""
    if isinstance(tree, Leaf):
        return dataclasses.replace(tree, seed=int(rng.integers(0, 2**31)))
    return Node(tree.kind, [(k, _reseed(v, rng)) for k, v in tree.items])


def _odd_leaf(leaf: Leaf, rng: np.random.Generator) -> Any:
    """Sample p's value of a leaf, made odd one way."""
    seed = int(rng.integers(0, 2**31))
    how = rng.random()
    if leaf.kind == "tensor":
        if how < 0.45:  # type promotion (or a float8 that cannot promote)
            return dataclasses.replace(leaf, dtype=str(rng.choice(TORCH_DTYPES)), seed=seed)
        if how < 0.7:  # another layout of the same shape
            layouts = [x for x in TENSOR_LAYOUTS if x not in ("scalar",)]
            return dataclasses.replace(leaf, layout=str(rng.choice(layouts)), seed=seed)
        if how < 0.82 and leaf.shape:  # a shape off by one
            shape = list(leaf.shape)
            k = int(rng.integers(0, len(shape)))
            shape[k] = max(0, shape[k] + int(rng.choice([-1, 1])))
            return dataclasses.replace(leaf, shape=tuple(shape), layout="contig", seed=seed)
        if how < 0.9:
            return Leaf("numpy", str(rng.choice(NP_DTYPES)), leaf.shape, "C", seed)
        return random_leaf(rng)
    if leaf.kind == "numpy":
        if how < 0.5:
            return dataclasses.replace(leaf, dtype=str(rng.choice(NP_DTYPES)), seed=seed)
        if how < 0.8:
            return dataclasses.replace(leaf, layout=str(rng.choice(NUMPY_LAYOUTS)), seed=seed)
        if how < 0.9:
            return Leaf("tensor", str(rng.choice(COMMON_DTYPES)), leaf.shape, "contig", seed)
        return random_leaf(rng)
    if leaf.kind == "npscalar":
        if how < 0.6:
            return dataclasses.replace(leaf, dtype=str(rng.choice(NP_DTYPES)), seed=seed)
        return Leaf("py", str(rng.choice(["int", "float", "bool"])), (), "", seed)
    if how < 0.7:
        return Leaf("py", str(rng.choice(PY_KINDS)), (), "", seed)
    return random_leaf(rng)


def _mutate(tree: Any, rng: np.random.Generator, rate: float) -> Any:
    if isinstance(tree, Leaf):
        if rng.random() >= rate:
            return tree
        if rng.random() < 0.1:
            return ("same", tree)  # the same object as the first sample that holds it
        return _odd_leaf(tree, rng)
    items = [(k, _mutate(v, rng, rate)) for k, v in tree.items]
    kind = tree.kind
    r = rng.random()
    if r < rate * 0.3 and len(items) > 1:
        items.pop(int(rng.integers(0, len(items))))  # a missing key, or a length off by one
        if kind.startswith("nt"):
            kind = f"nt{len(items)}"
    elif r < rate * 0.45:
        key = f"x{int(rng.integers(0, 3))}" if kind in ("dict", "odict", "frozen") else len(items)
        items.append((key, random_leaf(rng)))  # an extra key, or one more item
        if kind.startswith("nt"):
            kind = f"nt{min(len(items), 3)}"
            items = items[:3]
    elif r < rate * 0.55 and kind in ("dict", "odict", "frozen"):
        items = items[::-1]  # same keys, another order
    elif r < rate * 0.6:
        kind = str(rng.choice(CONTAINERS))  # another container type
        if kind == "nt":
            items = items[:3]
            kind = f"nt{len(items)}"
        if kind in ("dict", "odict", "frozen") and not all(isinstance(k, str) for k, _ in items):
            items = [(f"k{k}", v) for k, v in items]
    return Node(kind, items)


def random_case(seed: int) -> list[Any]:
    """The samples (recipe trees) of one random batch."""
    rng = np.random.default_rng(seed)
    schema = random_schema(rng)
    B = int(rng.choice([1, 2, 2, 3, 3, 4, 5, 8, 16]))
    samples = [_reseed(schema, rng) for _ in range(B)]
    odd = rng.random()
    if odd < 0.55:  # one odd sample, at any position
        p = int(rng.integers(0, B))
        samples[p] = _mutate(samples[p], rng, rate=float(rng.choice([0.2, 0.5, 1.0])))
    elif odd < 0.7:  # several
        for p in range(B):
            if rng.random() < 0.4:
                samples[p] = _mutate(samples[p], rng, rate=0.3)
    return samples


# ---- comparing, shrinking, reproducing -----------------------------------------------------------

def outcome(fn: Callable[[list[Any]], Any], samples: list[Any]) -> tuple[str, Any]:
    try:
        return "ok", fn(make_batch(samples))
    except Exception as exc:  # the class is what must agree
        return "raise", type(exc)


def difference(got: tuple[str, Any], want: tuple[str, Any], same: Callable[[Any, Any], None]) -> str | None:
    """None when the outcomes agree (same exception class, or the same value), else what differs."""
    if got[0] != want[0]:
        g = got[1].__name__ if got[0] == "raise" else "a value"
        w = want[1].__name__ if want[0] == "raise" else "a value"
        return f"got {g}, the oracle gives {w}"
    if got[0] == "raise":
        return None if got[1] is want[1] else f"raised {got[1].__name__}, the oracle raises {want[1].__name__}"
    try:
        same(got[1], want[1])
    except AssertionError as exc:
        return str(exc) or "values differ"
    return None


def signature(got: tuple[str, Any], want: tuple[str, Any]) -> tuple[str, str]:
    """The kind of a disagreement, kept while a failing case shrinks."""
    def name(o: tuple[str, Any]) -> str:
        return o[1].__name__ if o[0] == "raise" else "value"
    return name(got), name(want)


def _without(tree: Any, path: tuple) -> Any:
    """The tree with the child at path removed (None if the path is not there)."""
    if not isinstance(tree, Node):
        return None
    k, rest = path[0], path[1:]
    for i, (key, child) in enumerate(tree.items):
        if key != k:
            continue
        items = list(tree.items)
        if not rest:
            if len(items) == 1:
                return None
            items.pop(i)
        else:
            sub = _without(child, rest)
            if sub is None:
                return None
            items[i] = (key, sub)
        kind = tree.kind if not tree.kind.startswith("nt") else f"nt{len(items)}"
        return Node(kind, items)
    return None


def _hoist(tree: Any, path: tuple) -> Any:
    """The tree with the container at path replaced by its child path[-1] (unchanged if absent)."""
    if not isinstance(tree, Node):
        return tree
    if len(path) == 1:
        for key, child in tree.items:
            if key == path[0]:
                return child
        return tree
    items = [(key, _hoist(child, path[1:]) if key == path[0] else child) for key, child in tree.items]
    return Node(tree.kind, items)


def _paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    if not isinstance(tree, Node):
        return []
    out = []
    for k, child in tree.items:
        out.append(prefix + (k,))
        out.extend(_paths(child, prefix + (k,)))
    return out


def shrink(samples: list[Any], fails: Callable[[list[Any]], bool], budget: int = 300) -> list[Any]:
    """A smaller batch that still fails: fewer samples, then fewer keys/items in every sample."""
    tries = 0
    changed = True
    while changed and tries < budget:
        changed = False
        for i in range(len(samples)):
            if len(samples) > 1 and i < len(samples):
                cand = samples[:i] + samples[i + 1:]
                tries += 1
                if fails(cand):
                    samples, changed = cand, True
                    break
        if changed:
            continue
        paths = sorted({p for s in samples for p in _paths(s)}, key=len)
        edits = [lambda s, p=p: _without(s, p) or s for p in paths] + [lambda s, p=p: _hoist(s, p) for p in paths]
        for edit in edits:
            cand = [edit(s) if isinstance(s, Node) else s for s in samples]
            if cand == samples:
                continue
            tries += 1
            if fails(cand):
                samples, changed = cand, True
                break
    return samples


def code(tree: Any) -> str:
    if isinstance(tree, Leaf):
        return repr(tree)
    if isinstance(tree, tuple) and tree and tree[0] == "same":
        return f"('same', {tree[1]!r})"
    inner = ", ".join(f"({k!r}, {code(v)})" for k, v in tree.items)
    return f"Node({tree.kind!r}, [{inner}])"


def reproducer(samples: list[Any], call: str, seed: int, why: str, oracle: str = "default_collate(batch)") -> str:
    """Python that rebuilds the batch and shows the difference (run from tests/)."""
    lines = ",\n    ".join(code(s) for s in samples)
    return (f"# fuzz seed {seed}: {why}\n"
            f"import torch, fastcollate\nfrom torch.utils.data import default_collate\n"
            f"from fuzzcases import Leaf, Node, make_batch\n"
            f"batch = make_batch([\n    {lines},\n])\n"
            f"print({call})\nprint({oracle})\n")


def picklable(samples: list[Any]) -> bool:
    try:
        pickle.dumps(make_batch(samples))
        return True
    except Exception:
        return False


# ---- padded batches ------------------------------------------------------------------------------

PAD_DTYPES = ["int64", "int32", "uint8", "float32", "float16", "bfloat16", "bool", "float64", "int16"]
PAD_VALUES = [0, 0, -100, 1, 300, 0.5, -1]


def _sequence_leaf(rng: np.random.Generator, kind: str, dtype: str, trailing: tuple[int, ...], length: int,
                   layout: str) -> Leaf:
    seed = int(rng.integers(0, 2**31))
    if kind == "pylist":
        return Leaf("pylist", dtype, (length,), "", seed)
    return Leaf(kind, dtype, (length, *trailing), layout, seed)


def random_pad_case(seed: int) -> tuple[dict[str, Any], list[Any]]:
    """(Collator keyword arguments, samples) of a padded batch, with odd samples as above."""
    rng = np.random.default_rng(seed)
    nkeys = int(rng.integers(1, 3))
    keys = ["input_ids", "labels", "feats"][:nkeys]
    multiple = rng.choice([None, None, 1, 4, 8])
    multiple = None if multiple is None else int(multiple)
    max_length = None
    if rng.random() < 0.3:
        max_length = int(rng.integers(0, 3)) * (multiple or 1) + (0 if multiple else int(rng.integers(0, 4)))
    config = dict(pad={k: PAD_VALUES[int(rng.integers(0, len(PAD_VALUES)))] for k in keys},
                  pad_to_multiple_of=multiple, max_length=max_length,
                  padding_side=str(rng.choice(["right", "left"])),
                  return_mask=bool(rng.random() < 0.8),
                  mask_dtype=getattr(torch, str(rng.choice(["int64", "int32", "bool", "uint8"]))),
                  lengths_key="lengths" if rng.random() < 0.4 else None)
    columns = {}
    for k in keys:
        kind = str(rng.choice(["tensor", "tensor", "numpy", "pylist"]))
        dtype = str(rng.choice(["int64", "float32", "bool"])) if kind == "pylist" else str(rng.choice(PAD_DTYPES))
        if kind == "numpy" and dtype == "bfloat16":
            dtype = "float32"
        trailing = () if kind == "pylist" or rng.random() < 0.6 else tuple(int(x) for x in rng.integers(1, 4, int(rng.integers(1, 3))))
        layout = str(rng.choice(["contig", "contig", "t", "step"])) if kind == "tensor" else \
            str(rng.choice(["C", "C", "F", "step"]))
        columns[k] = (kind, dtype, trailing, layout)
    others = [random_leaf(rng) for _ in range(int(rng.integers(0, 3)))]
    tokenizer = rng.random() < 0.25
    B = int(rng.choice([1, 2, 3, 4, 8]))
    samples = []
    for _ in range(B):
        items = []
        first_len = None
        for k in keys:
            kind, dtype, trailing, layout = columns[k]
            n = int(rng.integers(0, 7))
            first_len = n if first_len is None else first_len
            items.append((k, _sequence_leaf(rng, kind, dtype, trailing, n, layout)))
        if tokenizer:  # what a tokenizer returns beside input_ids
            items.append(("attention_mask", Leaf("pylist", "int64", (first_len,), "", 0)))
        for j, o in enumerate(others):
            items.append((f"o{j}", dataclasses.replace(o, seed=int(rng.integers(0, 2**31)))))
        samples.append(Node("dict", items))
    if rng.random() < 0.5:  # an odd sample
        p = int(rng.integers(0, B))
        node = samples[p]
        i = int(rng.integers(0, len(node.items)))
        key, leaf = node.items[i]
        how = rng.random()
        items = list(node.items)
        if how < 0.15:
            items.pop(i)  # a missing (padded) key
        elif how < 0.3 and isinstance(leaf, Leaf) and leaf.kind in ("tensor", "numpy"):
            items[i] = (key, dataclasses.replace(leaf, dtype=str(rng.choice(PAD_DTYPES[:7]))
                                                 if leaf.kind == "tensor" else "int32"))
        elif how < 0.45 and isinstance(leaf, Leaf) and leaf.kind in ("tensor", "numpy") and len(leaf.shape) >= 1:
            items[i] = (key, dataclasses.replace(leaf, shape=leaf.shape + (2,)))  # trailing dims differ
        elif how < 0.55:
            items[i] = (key, Leaf("py", str(rng.choice(["int", "float", "str", "none"])), (), "", 1))
        elif how < 0.65:
            items[i] = (key, Leaf("tensor", "int64", (), "scalar", 2))  # a 0-d tensor
        elif how < 0.75 and isinstance(leaf, Leaf) and leaf.kind == "pylist":
            items[i] = (key, Leaf("pylist", str(rng.choice(["float32", "bool", "bigint"])), leaf.shape, "", 3))
        elif how < 0.85 and isinstance(leaf, Leaf):
            items[i] = (key, dataclasses.replace(leaf, shape=(0,) + tuple(leaf.shape[1:])))  # empty
        else:
            items.append(("lengths" if rng.random() < 0.5 else "attention_mask",
                          Leaf("pylist", "int64", (2,), "", 4)))  # a key the batch adds itself
        samples[p] = Node("dict", items)
    return config, samples


# ---- datasets the gathers read -------------------------------------------------------------------

GATHER_NP = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "float16", "float32",
             "float64", "complex64"]
WIDEN = [None, None, None, "int64", "int32", "float32", "float64", "float16", "bfloat16"]


def random_columns(rng: np.random.Generator, n: int, tmp: str | None) -> tuple[Any, dict]:
    """(columns, dtypes=) of a random ArrayDataset of n rows: arrays, memmaps, tensors, Ragged,
    1-D columns, some strided; some widened."""
    from fastcollate import Ragged

    cols: dict[str, Any] = {}
    dtypes: dict[str, Any] = {}
    for j in range(int(rng.integers(1, 4))):
        key = f"c{j}"
        dtype = str(rng.choice(GATHER_NP))
        kind = str(rng.choice(["array", "array", "memmap", "tensor", "ragged", "scalar", "strided"]))
        row = tuple(int(x) for x in rng.integers(0, 4, int(rng.integers(0, 3))))
        if kind == "memmap" and tmp is None:
            kind = "array"
        if kind == "scalar":
            cols[key] = _values(dtype, (n,), rng).astype(dtype)
        elif kind == "ragged":
            lens = rng.integers(0, 5, n)
            offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            cols[key] = Ragged(_values(dtype, (int(offsets[-1]), *row), rng).astype(dtype), offsets)
        elif kind == "tensor":
            t = torch.from_numpy(np.ascontiguousarray(_values(dtype, (n, *row), rng)).astype(dtype))
            cols[key] = t.to(torch.bfloat16) if dtype == "float32" and rng.random() < 0.3 else t
        elif kind == "memmap":
            import os
            path = os.path.join(tmp, f"{key}-{int(rng.integers(0, 2**31))}.bin")
            m = np.memmap(path, dtype=dtype, mode="w+", shape=(n, *row))
            m[...] = _values(dtype, (n, *row), rng).astype(dtype)
            m.flush()
            cols[key] = np.memmap(path, dtype=dtype, mode="r", shape=(n, *row))
        elif kind == "strided":
            cols[key] = np.repeat(_values(dtype, (n, *row), rng).astype(dtype), 2, axis=0)[::2]
        else:
            cols[key] = np.ascontiguousarray(_values(dtype, (n, *row), rng).astype(dtype))
        widen = WIDEN[int(rng.integers(0, len(WIDEN)))]
        if widen is not None:
            dtypes[key] = getattr(torch, widen)
    if rng.random() < 0.3:  # tuple samples, as TensorDataset's
        keys = list(cols)
        return [cols[k] for k in keys], {keys.index(k): v for k, v in dtypes.items()}
    return cols, dtypes


def random_indices(rng: np.random.Generator, n: int) -> Any:
    B = int(rng.integers(1, 12))
    idx = [int(i) for i in rng.integers(-n, n, B)]
    r = rng.random()
    if r < 0.04:
        idx.append(n + int(rng.integers(0, 3)))  # out of range
    elif r < 0.06:
        idx = []
    elif r < 0.12:
        return np.array(idx, dtype=np.int64)
    elif r < 0.16:
        return torch.tensor(idx)
    elif r < 0.2:
        return tuple(idx)
    return idx
