"""The differential fuzzer: seeded random batches through fastcollate and through torch, compared
exactly -- type, dtype, shape, strides, bytes (NaNs count) -- or the same exception class.

What is fuzzed, against what:
  * ``fastcollate.collate`` (and the pure-Python reference, and a forced 2-thread copy) against
    ``default_collate`` -- nested dicts / lists / tuples / namedtuples / custom Mappings and
    Sequences over tensors of every dtype and layout, numpy arrays and scalars, Python values,
    with odd samples at every position (fuzzcases.random_case);
  * ``Collator(pad=...)`` against the padding reference (``backend="python"``);
  * the gathers -- ``ArrayDataset`` (arrays, memmaps, tensors, Ragged, widening, tuple samples),
    ``TokenWindows``, ``from_hf`` -- against ``default_collate([ds[i] for i in indices])``;
  * a sample of the collate and padding cases inside DataLoader workers (fork and spawn):
    ``fastcollate.DataLoader`` against torch's DataLoader, batch for batch;
  * ``fastcollate.Cached``: every sample of the collate and padding cases, read back from the
    cache, against the sample the dataset gave (helpers.assert_identical: types, dtypes, shapes,
    strides, flags, bytes -- NaNs included).

Each test runs its slice of the seeds ``FASTCOLLATE_FUZZ_SEED`` (default 0) onwards; the number
of cases scales with ``FASTCOLLATE_FUZZ_N`` (default 8,000 collate cases, ~12,000 cases in all).
A longer local run:

    FASTCOLLATE_FUZZ_N=100000 FASTCOLLATE_FUZZ_SEED=7 python -m pytest -q tests/test_fuzz.py

A failure names its seed, shrinks the batch and prints Python that rebuilds it (fuzzcases.py).
"""
from __future__ import annotations

import logging
import os
import tempfile
import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import fastcollate
from fuzzcases import (code, difference, make, make_batch, outcome, random_case, random_columns, random_indices,
                       random_pad_case, reproducer, shrink, signature)
from helpers import assert_identical, assert_same

N = int(os.environ.get("FASTCOLLATE_FUZZ_N", "8000"))
SEED = int(os.environ.get("FASTCOLLATE_FUZZ_SEED", "0"))
CHUNKS = 8  # so that a failure in one slice still lets the others run


def seeds(part: int, of: int, n: int, stream: int) -> range:
    """Part `part` of `of` of n seeds of one stream (streams never share seeds)."""
    base = SEED + stream * 10**9
    return range(base + n * part // of, base + n * (part + 1) // of)


@pytest.fixture(autouse=True)
def _quiet():
    # the library logs each failed batch (what a user wants); thousands of expected errors here
    log = logging.getLogger("fastcollate")
    level = log.level
    log.setLevel(logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    log.setLevel(level)


def check_case(seed: int, samples: list[Any], candidate: Callable[[list[Any]], Any],
               oracle: Callable[[list[Any]], Any], call: str, oracle_call: str = "default_collate(batch)") -> None:
    """Fails, with the seed and a shrunk reproducer, where the two disagree on this batch."""
    got, want = outcome(candidate, samples), outcome(oracle, samples)
    why = difference(got, want, assert_same)
    if why is None:
        return
    kind = signature(got, want)

    def fails(s: list[Any]) -> bool:
        g, w = outcome(candidate, s), outcome(oracle, s)
        return difference(g, w, assert_same) is not None and signature(g, w) == kind

    small = shrink(samples, fails)
    small_why = difference(outcome(candidate, small), outcome(oracle, small), assert_same)
    pytest.fail(f"fuzz seed {seed} ({call}): {why}\nshrunk reproducer (run from tests/):\n"
                + reproducer(small, call, seed, small_why or why, oracle_call), pytrace=False)


@pytest.mark.parametrize("part", range(CHUNKS))
def test_collate_equals_default_collate(part):
    for seed in seeds(part, CHUNKS, N, stream=0):
        check_case(seed, random_case(seed), fastcollate.collate, default_collate, "fastcollate.collate(batch)")


_reference = fastcollate.Collator(backend="python")
_threaded = fastcollate.Collator(num_threads=2)


@pytest.mark.parametrize("part", range(2))
def test_reference_and_threads_equal_default_collate(part):
    # the pure-Python reference (the engine's slow path, the fallback) and a forced 2-thread copy
    for seed in seeds(part, 2, N // 8, stream=1):
        samples = random_case(seed)
        check_case(seed, samples, _reference, default_collate, "fastcollate.Collator(backend='python')(batch)")
        check_case(seed, samples, _threaded, default_collate, "fastcollate.Collator(num_threads=2)(batch)")


def _pad_collators(config: dict[str, Any]) -> tuple[Any, Any]:
    try:
        return fastcollate.Collator(**config), fastcollate.Collator(backend="python", **config)
    except ValueError:  # options the spec refuses (say, a clash with the mask key): not a batch case
        return None, None


@pytest.mark.parametrize("part", range(2))
def test_padding_equals_the_padding_reference(part):
    for seed in seeds(part, 2, N // 4, stream=2):
        config, samples = random_pad_case(seed)
        engine, ref = _pad_collators(config)
        if engine is None:
            continue
        check_case(seed, samples, engine, ref, f"fastcollate.Collator(**{config!r})(batch)",
                   f"fastcollate.Collator(backend='python', **{config!r})(batch)")


# ---- the gathers ---------------------------------------------------------------------------------

def _gathered(ds: Any, idx: Any, collate: Callable[[Any], Any]) -> tuple[str, Any]:
    try:
        return "ok", collate(ds.__getitems__(idx))
    except Exception as exc:
        return "raise", type(exc)


def _ordinary(ds: Any, idx: Any, collate: Callable[[Any], Any]) -> tuple[str, Any]:
    try:
        return "ok", collate([ds[i] for i in idx])
    except Exception as exc:
        return "raise", type(exc)


def _values_only(got: Any, want: Any) -> None:
    assert_same(got, want, nan_bits=False)


def _check_gather(seed: int, ds: Any, idx: Any, what: str, pad: dict | None = None, widened: bool = False) -> None:
    if pad is None:
        got, want = _gathered(ds, idx, fastcollate.collate), _ordinary(ds, idx, default_collate)
    else:
        got = _gathered(ds, idx, fastcollate.Collator(pad=pad))
        want = _ordinary(ds, idx, fastcollate.Collator(pad=pad, backend="python"))
    # through a dtype conversion a NaN's payload is torch's accident (see helpers.assert_same)
    why = difference(got, want, _values_only if widened else assert_same)
    if why is not None:
        pytest.fail(f"fuzz seed {seed}: {what}, indices {idx!r}, pad={pad}: {why}", pytrace=False)


@pytest.mark.parametrize("part", range(2))
def test_array_dataset_gathers_equal_default_collate(part, tmp_path):
    for seed in seeds(part, 2, N // 8, stream=3):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 24))
        columns, dtypes = random_columns(rng, n, str(tmp_path))
        try:
            ds = fastcollate.ArrayDataset(columns, dtypes=dtypes)
        except (ValueError, TypeError, KeyError):
            continue  # a widening the dataset refuses, with its own error (tested in test_arrays)
        what = f"ArrayDataset({ds!r})"
        for _ in range(3):
            idx = random_indices(rng, n)
            _check_gather(seed, ds, idx, what, widened=bool(dtypes))
            if isinstance(columns, dict) and rng.random() < 0.3:
                keys = [k for k in columns if getattr(ds[0][k], "ndim", 0) >= 1]
                if keys:
                    _check_gather(seed, ds, idx, what, pad={k: int(rng.integers(-1, 2)) for k in keys[:2]},
                                  widened=bool(dtypes))


@pytest.mark.parametrize("part", range(2))
def test_token_windows_gathers_equal_default_collate(part):
    for seed in seeds(part, 2, N // 20, stream=4):
        rng = np.random.default_rng(seed)
        dtype = str(rng.choice(["uint8", "uint16", "uint32", "int32", "int64"]))
        tokens = rng.integers(0, np.iinfo(dtype).max if dtype != "int64" else 2**40, int(rng.integers(2, 300)))
        seq_len = int(rng.integers(1, 20))
        stride = None if rng.random() < 0.5 else int(rng.integers(1, 8))
        try:
            ds = fastcollate.TokenWindows(tokens.astype(dtype), seq_len, stride=stride,
                                          dtype=torch.int32 if rng.random() < 0.3 else torch.int64)
        except ValueError:
            continue  # fewer tokens than one window
        for _ in range(3):
            _check_gather(seed, ds, random_indices(rng, len(ds)), repr(ds))


def test_from_hf_gathers_equal_default_collate():
    datasets = pytest.importorskip("datasets")
    for seed in seeds(0, 1, max(20, N // 80), stream=5):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 12))
        lens = rng.integers(0, 6, n)
        lens[0] = max(1, lens[0])  # all-empty lists are Arrow's list<null>, which from_hf refuses by name
        data: dict[str, Any] = {"ids": [[int(x) for x in rng.integers(0, 1000, k)] for k in lens],
                                "label": [int(x) for x in rng.integers(0, 5, n)]}
        if rng.random() < 0.5:
            data["score"] = [float(x) for x in rng.standard_normal(n)]
        if rng.random() < 0.5:
            data["vec"] = [[float(x) for x in rng.standard_normal(3)] for _ in range(n)]
        hf = datasets.Dataset.from_dict(data)
        if rng.random() < 0.5:
            hf = hf.with_format("numpy")
        ds = fastcollate.ArrayDataset.from_hf(hf)
        for _ in range(3):
            idx = random_indices(rng, n)
            if isinstance(idx, torch.Tensor):
                idx = idx.tolist()
            _check_gather(seed, ds, idx, f"from_hf({data!r})")
            _check_gather(seed, ds, idx, f"from_hf({data!r})", pad={"ids": int(rng.integers(-1, 2))})


# ---- inside DataLoader workers -------------------------------------------------------------------

class Recipes(Dataset):
    """Sample i made from its recipe in the worker (recipes pickle small, under spawn too)."""

    def __init__(self, samples: list[Any]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        return make(self.samples[i])


def _loader_outcomes(loader: Any, n: int) -> list[tuple[str, Any]]:
    """Each batch's value or exception class; torch's workers carry on after a batch raised."""
    out: list[tuple[str, Any]] = []
    it = iter(loader)
    for _ in range(n):
        try:
            out.append(("ok", next(it)))
        except StopIteration:
            raise AssertionError("the loader ended early")
        except Exception as exc:
            out.append(("raise", type(exc)))
    return out


def _in_a_worker(case: list[Any], collate_fn: Any, ref_fn: Any) -> tuple[Any, Any]:
    """The outcomes of this one batch through one forked worker of each loader."""
    kw = dict(batch_sampler=[list(range(len(case)))], num_workers=1, multiprocessing_context="fork", timeout=60)
    ds = Recipes(case)
    ours = fastcollate.DataLoader(ds, **kw) if collate_fn is None else fastcollate.DataLoader(ds, collate_fn=collate_fn, **kw)
    theirs = DataLoader(ds, **kw) if ref_fn is None else DataLoader(ds, collate_fn=ref_fn, **kw)
    return _loader_outcomes(ours, 1)[0], _loader_outcomes(theirs, 1)[0]


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("padded", [False, True], ids=["collate", "padding"])
def test_workers_equal_torch_workers(context, padded):
    count = max(30, N // 40)
    samples: list[Any] = []
    batches: list[list[int]] = []
    case_seeds: list[int] = []
    collate_fn = ref_fn = None
    for seed in seeds(0, 1, count, stream=6 if not padded else 7):
        if padded:
            config, case = random_pad_case(seed)
            # one padding config for the whole loader: the first case's (its samples are all dicts)
            if collate_fn is None:
                engine, ref = _pad_collators(config)
                if engine is None:
                    continue
                collate_fn, ref_fn = engine, ref
            elif set(config["pad"]) != set(collate_fn.pad and dict(collate_fn.pad.values)):
                continue
        else:
            case = random_case(seed)
        batches.append(list(range(len(samples), len(samples) + len(case))))
        case_seeds.append(seed)
        samples.extend(case)
    ds = Recipes(samples)
    kw = dict(batch_sampler=batches, num_workers=2, multiprocessing_context=context, timeout=120)
    if padded:
        ours = fastcollate.DataLoader(ds, collate_fn=collate_fn, **kw)
        theirs = DataLoader(ds, collate_fn=ref_fn, **kw)
    else:
        ours, theirs = fastcollate.DataLoader(ds, **kw), DataLoader(ds, **kw)
    got, want = _loader_outcomes(ours, len(batches)), _loader_outcomes(theirs, len(batches))
    for b, (g, w) in enumerate(zip(got, want)):
        why = difference(g, w, assert_same)
        if why is not None:
            case = [samples[i] for i in batches[b]]
            kind = signature(g, w)

            def fails(c: list[Any]) -> bool:
                o = _in_a_worker(c, collate_fn, ref_fn)
                return difference(*o, assert_same) is not None and signature(*o) == kind

            small = shrink(case, fails, budget=60)
            pytest.fail(f"fuzz seed {case_seeds[b]}, in {context} workers: {why}\nshrunk, in one forked worker: "
                        f"{difference(*_in_a_worker(small, collate_fn, ref_fn), assert_same)}\n"
                        + reproducer(small, "fastcollate.DataLoader(Recipes(batch_recipes), ...)", case_seeds[b],
                                     why, "torch's DataLoader"), pytrace=False)
    assert ours.stats()["ring_hits"] > 0  # the ring's path was the one compared


# ---- the sample cache ----------------------------------------------------------------------------

@pytest.mark.parametrize("part", range(2))
def test_cached_samples_equal_the_datasets(part):
    for seed in seeds(part, 2, N // 4, stream=8):
        recipes = random_case(seed) if seed % 3 else random_pad_case(seed)[1]
        samples = make_batch(recipes)
        ds = fastcollate.Cached(samples, max_bytes=1 << 24)
        for j, sample in enumerate(samples):
            assert ds[j] is sample  # the first fetch: the dataset's own
            try:
                assert_identical(ds[j], sample)
            except AssertionError as exc:
                pytest.fail(f"fuzz seed {seed}: sample {j} read back from fastcollate.Cached differs: {exc}\n"
                            f"rebuild it (run from tests/): from fuzzcases import *; sample = make({code(recipes[j])})",
                            pytrace=False)
        s = ds.stats()
        assert (s["hits"], s["inserts"], s["uncacheable"]) == (len(samples), len(samples), 0), (seed, s)
