"""pytest-benchmark groups for batches from storage: one batch fetched and collated as a
DataLoader with 0 workers does it (``__getitems__`` / per-sample ``__getitem__``, then the
collate_fn), fastcollate's datasets vs what people write today, side by side per group.

    pytest benchmarks/bench_storage.py --benchmark-only --benchmark-group-by=group
"""
import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset, default_collate

import fastcollate
from fastcollate._bench import storage as sb
from held import run_held


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "train.bin"
    np.random.default_rng(0).integers(0, 50257, 1 << 22).astype(np.uint16).tofile(path)
    return np.memmap(path, dtype=np.uint16, mode="r")


def _run(benchmark, group, fn):
    run_held(benchmark, group, fn, rounds=20, iterations=5)


def _indices(n, batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    pool = [torch.randint(0, n, (batch,), generator=g).tolist() for _ in range(64)]
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % len(pool)
        return pool[state["i"]]
    return nxt


def test_token_windows(benchmark, tokens):
    ds = fastcollate.TokenWindows(tokens, 1024)
    nxt = _indices(len(ds), 64)
    _run(benchmark, "tokens 64x1024", lambda: fastcollate.collate(ds.__getitems__(nxt())))


def test_token_windows_map_style(benchmark, tokens):
    ds = sb.NaiveWindows(tokens, 1024)
    nxt = _indices(len(ds), 64)
    _run(benchmark, "tokens 64x1024", lambda: default_collate([ds[i] for i in nxt()]))


def test_token_windows_get_batch(benchmark, tokens):
    it = iter(sb.GetBatch(tokens, 1024, 64, 10**9))
    _run(benchmark, "tokens 64x1024", lambda: next(it))


@pytest.fixture(scope="module")
def features():
    g = torch.Generator().manual_seed(0)
    return torch.randn(100_000, 16, generator=g), torch.randint(0, 10, (100_000,), generator=g)


def test_array_dataset(benchmark, features):
    ds = fastcollate.ArrayDataset([features[0].numpy(), features[1].numpy()])
    nxt = _indices(len(ds), 2048)
    _run(benchmark, "features 2048 rows", lambda: fastcollate.collate(ds.__getitems__(nxt())))


def test_tensor_dataset(benchmark, features):
    ds = TensorDataset(*features)
    nxt = _indices(len(ds), 2048)
    _run(benchmark, "features 2048 rows", lambda: default_collate([ds[i] for i in nxt()]))


@pytest.fixture(scope="module")
def hf():
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset.from_dict(sb.token_lists(4096))


def test_from_hf_padding(benchmark, hf):
    ds = fastcollate.ArrayDataset.from_hf(hf)
    c = fastcollate.Collator(pad={"input_ids": 0})
    nxt = _indices(len(ds), 32)
    _run(benchmark, "hf 32 rows padded", lambda: c(ds.__getitems__(nxt())))


def test_hf_rows_usual_padding(benchmark, hf):
    nxt = _indices(len(hf), 32)
    _run(benchmark, "hf 32 rows padded", lambda: sb.usual_padding(hf.__getitems__(nxt())))
