"""`fastcollate bench`'s "batches from storage" table: ArrayDataset / TokenWindows / from_hf
through a DataLoader vs what people write today, side by side in one run (interleaved rounds,
medians of samples per second). Every pair is first checked to produce equal batches, so the
table compares the same work. Each speedup is the median of the per-round ratios, printed with its
min-max (``noise`` flags a row whose rounds cannot be trusted)."""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchLoader, Dataset, IterableDataset, TensorDataset, default_collate

from . import noise
from ..data.arrays import ArrayDataset, TokenWindows
from .._text import table_rule
from ..core.collator import Collator
from ..loader.dataloader import DataLoader


class NaiveWindows(Dataset):
    """The usual map-style token dataset: one window of seq_len + 1 tokens made int64 with
    ``torch.from_numpy(tokens[s:s+L+1].astype(np.int64))``, returned as its (x, y) pair of views;
    default_collate stacks them."""

    def __init__(self, tokens: np.ndarray, seq_len: int) -> None:
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - self.seq_len - 1) // self.seq_len + 1

    def __getitem__(self, i: int) -> Any:
        s, L = i * self.seq_len, self.seq_len
        w = torch.from_numpy(self.tokens[s:s + L + 1].astype(np.int64))
        return w[:-1], w[1:]


class GetBatch(IterableDataset):
    """nanoGPT's hand-written get_batch (random windows, torch.stack), as an iterable dataset so
    that it can run in workers too; each worker yields its share of ``batches``."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, batches: int) -> None:
        self.tokens, self.seq_len, self.batch_size, self.batches = tokens, seq_len, batch_size, batches

    def __iter__(self) -> Iterator[Any]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        share = self.batches if info is None else len(range(info.id, self.batches, info.num_workers))
        data, L = self.tokens, self.seq_len
        for _ in range(share):
            ix = torch.randint(len(data) - L - 1, (self.batch_size,)).tolist()
            x = torch.stack([torch.from_numpy(data[i:i + L].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + L].astype(np.int64)) for i in ix])
            yield x, y


def _rate(loader: Any, rows: Callable[[Any], int]) -> float:
    """Samples per second over one epoch (workers already started: persistent, warmed)."""
    t0, n = time.perf_counter(), 0
    for batch in loader:
        n += rows(batch)
        del batch
    return n / (time.perf_counter() - t0)


def _warm(loader: Any) -> Any:
    it = iter(loader)
    next(it)
    del it
    return loader


def _rows(batch: Any) -> int:
    first = next(iter(batch.values())) if hasattr(batch, "values") else batch[0]  # dicts, BatchEncoding
    return len(first)


def _loader_kw(workers: int) -> dict[str, Any]:
    return dict(num_workers=workers, persistent_workers=True) if workers else {}


def _compare(rounds: int, variants: dict[str, Any]) -> dict[str, list[float]]:
    """Samples/s of each variant in each round (one epoch each, interleaved)."""
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, loader in variants.items():
            rates[name].append(_rate(loader, _rows))
    return rates


def _row(description: str, workers: int, rates: dict[str, list[float]], baselines: dict[str, str]) -> dict[str, Any]:
    """A storage row: fastcollate's ("ours") rate against each baseline (label -> its key in
    rates), medians, every round, and each ratio's spread."""
    ours = rates["ours"]
    spread = {label: noise.spread(noise.ratio_rounds(ours, rates[key])) for label, key in baselines.items()}
    return {"description": description, "num_workers": workers, "rounds": len(ours),
            "ours": statistics.median(ours),
            "baselines": {label: statistics.median(rates[key]) for label, key in baselines.items()},
            "speedup": {label: s["median"] for label, s in spread.items()},
            "rounds_per_s": {"ours": ours, **{label: rates[key] for label, key in baselines.items()}},
            "spread": spread}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return sorted(a) == sorted(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a.dtype == b.dtype and torch.equal(a, b)


def measure_tokens(tokens: np.ndarray, workers: int, rounds: int, seq_len: int = 1024, batch_size: int = 64) -> dict:
    ours_ds = TokenWindows(tokens, seq_len)
    naive_ds = NaiveWindows(tokens, seq_len)
    idx = [5, 0, 17]
    ours_b = Collator()(ours_ds.__getitems__(idx))
    naive_b = default_collate([naive_ds[i] for i in idx])
    assert _same([ours_b["input_ids"], ours_b["labels"]], naive_b), "token windows differ from the naive dataset"
    batches = len(ours_ds) // batch_size
    kw = _loader_kw(workers)
    variants = {
        "ours": _warm(DataLoader(ours_ds, batch_size=batch_size, shuffle=True, drop_last=True, **kw)),
        "map": _warm(TorchLoader(naive_ds, batch_size=batch_size, shuffle=True, drop_last=True, **kw)),
        "get_batch": _warm(TorchLoader(GetBatch(tokens, seq_len, batch_size, batches), batch_size=None, **kw)),
    }
    r = _compare(rounds, variants)
    return _row(f"TokenWindows {batch_size} x {seq_len}, uint16 memmap, {workers} workers", workers, r,
                {"map-style + default_collate": "map", "hand-written get_batch": "get_batch"})


def measure_features(workers: int, rounds: int, rows: int = 100_000, batch_size: int = 2048) -> dict:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(rows, 16, generator=g), torch.randint(0, 10, (rows,), generator=g)
    ours_ds, theirs_ds = ArrayDataset([x.numpy(), y.numpy()]), TensorDataset(x, y)
    idx = [9, 3, 3]
    assert _same(Collator()(ours_ds.__getitems__(idx)), default_collate([theirs_ds[i] for i in idx]))
    kw = _loader_kw(workers)
    r = _compare(rounds, {
        "ours": _warm(DataLoader(ours_ds, batch_size=batch_size, shuffle=True, **kw)),
        "tensor": _warm(TorchLoader(theirs_ds, batch_size=batch_size, shuffle=True, **kw)),
    })
    return _row(f"ArrayDataset {batch_size} rows x 16 float32 + int64, {workers} workers", workers, r,
                {"TensorDataset + default_collate": "tensor"})


def token_lists(rows: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    lens = rng.integers(16, 256, rows)
    return {"input_ids": [rng.integers(5, 20, k).tolist() for k in lens], "label": rng.integers(0, 2, rows).tolist()}


def measure_hf(workers: int, rounds: int, rows: int = 8192, batch_size: int = 32) -> dict | None:
    try:
        import datasets
    except ImportError:
        return None
    # input_ids as int32: how a tokenizer's map stores them
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                  "label": datasets.Value("int64")})
    hf = datasets.Dataset.from_dict(token_lists(rows), features=features)
    ours_ds = ArrayDataset.from_hf(hf)
    tok = word_tokenizer()
    if tok is not None:
        import transformers

        theirs_fn: Any = transformers.DataCollatorWithPadding(tok)
        ours_fn = Collator.for_tokenizer(tok)
        label = "datasets rows + DataCollatorWithPadding"
    else:
        theirs_fn, ours_fn = usual_padding, Collator(pad={"input_ids": 0})
        label = "datasets rows + pad_sequence + mask"
    idx = [4, 0, 9]
    assert _same(ours_fn(ours_ds.__getitems__(idx)), dict(theirs_fn([hf[i] for i in idx])))
    kw = _loader_kw(workers)
    r = _compare(rounds, {
        "ours": _warm(DataLoader(ours_ds, batch_size=batch_size, shuffle=True, collate_fn=ours_fn, **kw)),
        "theirs": _warm(TorchLoader(hf, batch_size=batch_size, shuffle=True, collate_fn=theirs_fn, **kw)),
    })
    return _row(f"from_hf + padding, {batch_size} rows of 16-255 tokens, {workers} workers", workers, r,
                {label: "theirs"})


def usual_padding(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    from torch.nn.utils.rnn import pad_sequence

    ids = [torch.as_tensor(r["input_ids"]) for r in rows]
    lens = torch.tensor([len(t) for t in ids])
    padded = pad_sequence(ids, batch_first=True, padding_value=0)
    return {"input_ids": padded, "label": torch.tensor([r["label"] for r in rows]),
            "attention_mask": (torch.arange(padded.shape[1])[None, :] < lens[:, None]).long()}


def word_tokenizer() -> Any:
    """A word-level tokenizer built in memory (nothing is downloaded), or None."""
    try:
        import tokenizers
        import transformers
    except ImportError:
        return None
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]"] + [f"w{i}" for i in range(30)])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                                model_input_names=["input_ids", "attention_mask"])


def run_storage(quick: bool = False, progress: Callable[[str], None] | None = None,
                rounds: int | None = None) -> list[dict[str, Any]]:
    rounds = rounds or (2 if quick else 3)  # two at least: one round has no spread
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.bin")
        n_tokens = (1 << 21) if quick else (1 << 23)
        np.random.default_rng(0).integers(0, 50257, n_tokens).astype(np.uint16).tofile(path)
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        steps: list[tuple[str, Callable[[], dict | None]]] = [
            ("tokens, 0 workers", lambda: measure_tokens(tokens, 0, rounds)),
            ("tokens, 2 workers", lambda: measure_tokens(tokens, 2, rounds)),
            ("features", lambda: measure_features(0, rounds)),
            ("hf", lambda: measure_hf(0, rounds, rows=2048 if quick else 8192)),
        ]
        for i, (name, step) in enumerate(steps):
            if progress:
                progress(f"[storage {i + 1}/{len(steps)}] {name}")
            row = step()
            if row is not None:
                out.append(row)
    return out


MARK_HEAD = "noise"


def format_storage_table(rows: Iterable[dict[str, Any]]) -> str:
    """One line per (workload, baseline); the noise mark on each line of a flagged row."""
    head = (f"| {'workload':<58} | {'fastcollate':>11} | {'baseline':<40} | {'baseline':>9} | "
            f"{'speedup (min-max)':>17} | {MARK_HEAD} |")
    lines = [head, table_rule(head)]
    for r in rows:
        for name, rate in r["baselines"].items():
            s = r["spread"][name]
            flagged = noise.MARK if noise.flagged_figure(r, name) else ""
            lines.append(f"| {r['description']:<58} | {r['ours']:9.0f}/s | {name:<40} | {rate:7.0f}/s | "
                         f"{noise.ratio_cell(s):>17} | {flagged:^{len(MARK_HEAD)}} |")
    return "\n".join(lines)
