"""Exact comparison of collate outputs: same container types, same tensor dtype/shape and the
same bytes (so NaN payloads and -0.0 count)."""
from __future__ import annotations

import math
from typing import Any

import torch

from fastcollate.core.tree import iter_tensors


def tensor_bytes(t: torch.Tensor) -> bytes:
    # a fresh 1-D copy: a contiguous tensor may still carry an odd stride on a size-1 dimension
    t = torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().resolve_conj().resolve_neg().reshape(-1))
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _canonical_nans(t: torch.Tensor) -> torch.Tensor:
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return t
    t = t.detach().resolve_conj().resolve_neg().clone()
    if t.is_complex():
        r = torch.view_as_real(t)
        r[r.isnan()] = float("nan")
        return t
    t[t.isnan()] = float("nan")
    return t


def assert_same(got: Any, want: Any, where: str = "batch", contiguous: bool = True, nan_bits: bool = True) -> None:
    """contiguous (the default): also require `got`'s strides to be `want`'s, i.e. default_collate's
    memory format (channels_last samples stay channels_last outside workers); False: values only.
    nan_bits=False: a NaN must be a NaN at the same place, its sign and payload aside -- for values
    converted between dtypes, where torch's own conversions give payloads that depend on the
    element's position (its vectorized loop keeps them, its scalar tail does not)."""
    assert type(got) is type(want), f"{where}: type {type(got)} != {type(want)}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{where}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert got.device == want.device, f"{where}: device {got.device} != {want.device}"
        assert not contiguous or got.numel() == 0 or got.stride() == want.stride(), \
            f"{where}: strides {got.stride()} != {want.stride()}"
        assert got.requires_grad == want.requires_grad, f"{where}: requires_grad differs"
        if not nan_bits:
            got, want = _canonical_nans(got), _canonical_nans(want)
        assert tensor_bytes(got) == tensor_bytes(want), f"{where}: values differ"
    elif isinstance(want, dict) or hasattr(want, "keys") and hasattr(want, "items"):
        assert list(got.keys()) == list(want.keys()), f"{where}: keys {list(got.keys())} != {list(want.keys())}"
        for k in want.keys():
            assert_same(got[k], want[k], f"{where}[{k!r}]", contiguous, nan_bits)
        if isinstance(want, dict) and hasattr(want, "__dict__"):
            assert vars(got) == vars(want), f"{where}: attributes differ"
    elif isinstance(want, (list, tuple)) or (hasattr(want, "__len__") and hasattr(want, "__getitem__")
                                             and not isinstance(want, (str, bytes))):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]", contiguous, nan_bits)
    elif isinstance(want, float) and math.isnan(want):
        assert isinstance(got, float) and math.isnan(got), f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    return list(iter_tensors(obj))


def resumed_epoch(make, head):
    """An epoch of loaders built by ``make()`` (stateful ones), interrupted after ``head``
    batches and resumed from its state_dict in a new loader: the batches, and that loader."""
    first = make()
    it = iter(first)
    batches = [next(it) for _ in range(head)]
    state = first.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    return batches + list(resumed), resumed


def assert_resumes_as_torchdata(dataset, workers, head, batches, ring_hits):
    """An epoch of fastcollate.StatefulDataLoader over ``dataset()``, interrupted after ``head``
    batches and resumed from its state_dict, equals torchdata's uninterrupted epoch (shuffled,
    seeded); with workers, the resumed loader's batches came through the ring."""
    import fastcollate
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make(cls):
        return cls(dataset(), batch_size=4, num_workers=workers, shuffle=True,
                   generator=torch.Generator().manual_seed(3))

    full = list(make(StatefulDataLoader))
    got, resumed = resumed_epoch(lambda: make(fastcollate.StatefulDataLoader), head)
    assert len(got) == len(full) == batches
    for a, b in zip(got, full, strict=True):  # one at a time, as a training loop holds them
        assert_same(a, b)
    if workers:
        assert resumed.stats()["ring_hits"] == ring_hits


def _float_bits(x: float) -> bytes:
    import struct

    return struct.pack("<d", x)


_ATOMS = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset)


def assert_identical(got: Any, want: Any, where: str = "sample", _memo: dict | None = None) -> None:
    """Stricter than assert_same, for one sample that went through a cache (not a collated batch):
    the exact type at every level; a tensor's dtype, shape, strides (empty tensors' too), layout,
    device, requires_grad, conjugate/negative bits, inference-ness and bytes; a numpy array's dtype
    (byte order included), shape, strides, writeable and contiguity flags and bytes; a numpy
    scalar's dtype and bytes; pyarrow arrays, tables and buffers by ``equals``; floats and complex
    numbers bit for bit (NaN payloads, -0.0);
    mappings key by key in order; sequences item by item; other objects by ``==`` and their
    attributes; and an object that appears twice in ``want`` is one object in ``got``."""
    import numpy as np

    memo = {} if _memo is None else _memo
    assert type(got) is type(want), f"{where}: type {type(got)} != {type(want)}"
    if not isinstance(want, _ATOMS):
        if id(want) in memo:
            assert memo[id(want)] is got, f"{where}: the same object twice in the sample is two objects"
            return
        memo[id(want)] = got
    if isinstance(want, torch.Tensor):
        for attr in ("dtype", "shape", "layout", "device", "requires_grad"):
            assert getattr(got, attr) == getattr(want, attr), \
                f"{where}: {attr} {getattr(got, attr)} != {getattr(want, attr)}"
        assert got.stride() == want.stride(), f"{where}: strides {got.stride()} != {want.stride()}"
        for flag in ("is_conj", "is_neg", "is_inference"):
            assert getattr(got, flag)() == getattr(want, flag)(), f"{where}: {flag}() differs"
        assert got.is_leaf == want.is_leaf, f"{where}: is_leaf differs"
        assert tensor_bytes(got) == tensor_bytes(want), f"{where}: values differ"
        if type(want) is not torch.Tensor or vars(want):
            assert_identical(vars(got), vars(want), f"{where}.__dict__", memo)
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.dtype.str == want.dtype.str, \
            f"{where}: dtype {got.dtype.str} != {want.dtype.str}"
        assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
        assert got.strides == want.strides, f"{where}: strides {got.strides} != {want.strides}"
        for flag in ("WRITEABLE", "C_CONTIGUOUS", "F_CONTIGUOUS"):
            assert got.flags[flag] == want.flags[flag], f"{where}: flag {flag} {got.flags[flag]} != {want.flags[flag]}"
        assert got.tobytes() == want.tobytes(), f"{where}: values differ"
    elif type(want).__module__.startswith("pyarrow") and hasattr(want, "equals"):  # arrays, tables, buffers
        assert want.equals(got), f"{where}: {type(want).__name__} differs: {got!r} != {want!r}"
    elif isinstance(want, np.generic):
        assert got.dtype == want.dtype and got.dtype.str == want.dtype.str, \
            f"{where}: dtype {got.dtype} != {want.dtype}"
        assert got.tobytes() == want.tobytes(), f"{where}: {got!r} != {want!r} (bytes)"
    elif isinstance(want, float):
        assert _float_bits(got) == _float_bits(want), f"{where}: {got!r} != {want!r} (bits)"
    elif isinstance(want, complex):
        assert (_float_bits(got.real), _float_bits(got.imag)) == (_float_bits(want.real), _float_bits(want.imag)), \
            f"{where}: {got!r} != {want!r} (bits)"
    elif isinstance(want, (str, bytes, bytearray, int, type(None))):
        assert got == want, f"{where}: {got!r} != {want!r}"
    elif hasattr(want, "keys") and hasattr(want, "items"):
        assert list(got.keys()) == list(want.keys()), f"{where}: keys {list(got.keys())} != {list(want.keys())}"
        for k in want.keys():
            assert_identical(got[k], want[k], f"{where}[{k!r}]", memo)
    elif isinstance(want, (list, tuple)) or (hasattr(want, "__len__") and hasattr(want, "__getitem__")):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i in range(len(want)):
            assert_identical(got[i], want[i], f"{where}[{i}]", memo)
    elif isinstance(want, (set, frozenset)):
        assert got == want, f"{where}: {got!r} != {want!r}"
    elif hasattr(want, "__dict__"):
        assert_identical(vars(got), vars(want), f"{where}.__dict__", memo)
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"
    if hasattr(want, "__dict__") and not isinstance(want, (torch.Tensor, type)) and \
            (hasattr(want, "keys") or isinstance(want, (list, tuple))):
        assert_identical(vars(got), vars(want), f"{where}.__dict__", memo)


def wait_until(condition, timeout: float = 30.0, poll: float = 0.005) -> bool:
    """Poll ``condition()`` until it is true or ``timeout`` seconds have passed; its last value.
    For what another thread or process does on its own time: a deadline, never a duration, so
    generous (30 s) that only a hang reaches it, and a busy machine never does."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return bool(condition())
        time.sleep(poll)
    return True


def in_thread(fn, timeout: float = 60.0):
    """fn() on a daemon thread: its value, or its exception re-raised; a deadlock fails the test
    after ``timeout`` seconds instead of hanging the suite (a bound only a hang reaches)."""
    import threading

    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # pragma: no cover - reported below
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"deadlocked: still running after {timeout} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")
