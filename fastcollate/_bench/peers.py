"""`fastcollate bench --peers`: fastcollate against the other libraries that do the same job, on
the same workloads, the same batch size and the same number of workers or threads, in one run:
torch's DataLoader, SPDL's thread pipelines, torchdata's nodes (threads and processes), Ray
Data, nanoGPT's get_batch, Hugging Face's padding collator -- each where it applies, skipped
(and named) where it is not installed. Samples/s of a steady epoch and the time to the first
batch of a new loader, medians of interleaved rounds with their spread; every peer's first batch
is first checked equal to torch's where their outputs are comparable. Ray Data runs in a process
of its own (fastcollate._bench.ray_peer: a Ray cluster here would install Ray's SIGTERM handler
beside the other loaders' workers), its epochs interleaved with the others' rounds."""
from __future__ import annotations

import dataclasses
import gc
import importlib.util
import os
import statistics
import tempfile
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader as TorchLoader, SequentialSampler, default_collate

from .._text import table_rule
from ..core.collator import Collator, collate as fast_collate
from ..data.arrays import TokenWindows
from ..loader.dataloader import DataLoader
from . import ray_peer
from . import image_bench as images
from .storage import GetBatch, NaiveWindows, token_lists, usual_padding, word_tokenizer
from .workloads import CachedSamples, small_fields


@dataclasses.dataclass
class Workload:
    name: str
    description: str
    dataset: Any                       # what the peers index (map-style)
    batch_size: int
    collate: Callable[[list], Any]      # what a user of the peers collates with (torch's rule)
    ours: Callable[[int], Any]          # workers -> fastcollate's loader over its own dataset / collator
    fast: Callable[[list], Any] = fast_collate  # fastcollate's collate for the same rule (a peer's collate_fn)
    quick: bool = False                 # built with the quick sizes (the Ray child builds the same rows)


def build_workloads(quick: bool, tmp: str) -> list[Workload]:
    n_img = 128 if quick else 512
    img = images.dataset(n=n_img)
    tokens = np.random.default_rng(0).integers(0, 50257, (1 << 18) if quick else (1 << 21)).astype(np.uint16)
    path = os.path.join(tmp, "tokens.bin")
    tokens.tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    naive = NaiveWindows(mm, 1024)
    windows = TokenWindows(mm, 1024)
    rows = token_lists(1024 if quick else 4096)
    row_samples = [{"input_ids": ids, "attention_mask": [1] * len(ids), "label": lab}
                   for ids, lab in zip(rows["input_ids"], rows["label"])]
    fields = CachedSamples(small_fields(256), 256 * (8 if quick else 32))
    pad = Collator(pad={"input_ids": 0})
    made = [
        Workload("images", f"image folder: {n_img} JPEGs, decode + random resized crop 224 + flip, CHW uint8",
                 img, 64, default_collate, lambda w: DataLoader(img, batch_size=64, num_workers=w,
                                                                persistent_workers=w > 0)),
        Workload("tokens", "TokenWindows 64 x 1024 over a uint16 memmap (peers: map-style windows)", naive, 64,
                 default_collate, lambda w: DataLoader(windows, batch_size=64, num_workers=w, persistent_workers=w > 0)),
        Workload("padded", "tokenized rows of 16-255 tokens, padded, batch 32", row_samples, 32, usual_padding,
                 lambda w: DataLoader(row_samples, batch_size=32, num_workers=w, collate_fn=pad,
                                      persistent_workers=w > 0), pad),
        Workload("tabular", "17-field samples (12 small tensors, 4 floats, int, str), batch 256", fields, 256,
                 default_collate, lambda w: DataLoader(fields, batch_size=256, num_workers=w, persistent_workers=w > 0)),
    ]
    for w in made:
        w.quick = quick
    return made


# ---- the peers: each makes an iterable of batches for (workload, workers), or says why it cannot

def _torch(w: Workload, n: int) -> Any:
    return TorchLoader(w.dataset, batch_size=w.batch_size, num_workers=n, collate_fn=w.collate,
                       persistent_workers=n > 0)


def _spdl(ours: bool) -> Callable[[Workload, int], Any]:
    def make(w: Workload, n: int) -> Any:
        from spdl.pipeline import PipelineBuilder

        fn = w.fast if ours else w.collate

        class Epochs:  # a pipeline runs once: a new one per epoch, as SPDL's examples do
            def __iter__(self):
                pipe = (PipelineBuilder().add_source(range(len(w.dataset)))
                        .pipe(w.dataset.__getitem__, concurrency=max(1, n), output_order="input")
                        .aggregate(w.batch_size).pipe(fn).add_sink(3).build(num_threads=max(1, n)))
                with pipe.auto_stop():
                    yield from pipe.get_iterator(timeout=120)
        return Epochs()
    return make


def _nodes(method: str) -> Callable[[Workload, int], Any]:
    def make(w: Workload, n: int) -> Any:
        import torchdata.nodes as tn

        if method == "process" and n == 0:
            raise _Skip("processes need workers")
        node = tn.SamplerWrapper(SequentialSampler(range(len(w.dataset))))
        node = tn.ParallelMapper(node, w.dataset.__getitem__, num_workers=max(1, n), method=method, in_order=True)
        node = tn.Mapper(tn.Batcher(node, w.batch_size, drop_last=False), w.collate)
        if torch.cuda.is_available():
            node = tn.PinMemory(node)
        return tn.Loader(tn.Prefetcher(node, prefetch_factor=2))
    return make


def _getbatch(w: Workload, n: int) -> Any:
    if w.name != "tokens":
        raise _Skip("tokens only")
    return TorchLoader(GetBatch(w.dataset.tokens, 1024, w.batch_size, len(w.dataset) // w.batch_size), batch_size=None,
                       num_workers=n, persistent_workers=n > 0)


def _hf_padding(w: Workload, n: int) -> Any:
    if w.name != "padded":
        raise _Skip("padded rows only")
    from transformers import DataCollatorWithPadding

    tok = word_tokenizer()
    return TorchLoader(w.dataset, batch_size=w.batch_size, num_workers=n, collate_fn=DataCollatorWithPadding(tok),
                       persistent_workers=n > 0)


_RAY: dict[bool, ray_peer.RayProcess] = {}  # quick -> the Ray child, started on first use


def _ray_process(quick: bool) -> ray_peer.RayProcess:
    if quick not in _RAY:
        _RAY[quick] = ray_peer.RayProcess(quick)
    return _RAY[quick]


def close_ray() -> None:
    """Ends the Ray child (and its cluster), if one was started."""
    while _RAY:
        _RAY.popitem()[1].close()


def _ray(peer: str) -> Callable[[Workload, int], Any]:
    # In its own process: with a Ray cluster started in this one, the interleaved rounds ended
    # with the other peers' DataLoader workers killed by SIGTERM (Ray's handler in the driver).
    def make(w: Workload, n: int) -> Any:
        process = _ray_process(w.quick)
        answer = process.ask(op="peers", workload=w.name)
        if "skip" in answer:
            raise _Skip(answer["skip"])
        return ray_peer.RemoteLoader(process, w.name, peer)
    return make


class _Skip(Exception):
    pass


PEERS: dict[str, Callable[[Workload, int], Any]] = {
    "torch DataLoader": _torch,
    "fastcollate.DataLoader": lambda w, n: w.ours(n),
    "SPDL threads + default_collate": _spdl(False),
    "SPDL threads + fastcollate's collate": _spdl(True),
    "torchdata.nodes threads": _nodes("thread"),
    "torchdata.nodes processes": _nodes("process"),
    "nanoGPT get_batch": _getbatch,
    "HF DataCollatorWithPadding": _hf_padding,
    ray_peer.DEFAULT: _ray(ray_peer.DEFAULT),
    ray_peer.OURS: _ray(ray_peer.OURS),
}
_MODULES = {"SPDL": "spdl", "torchdata.nodes": "torchdata.nodes", "HF": "transformers", "Ray": "ray"}
_NOT_HERE = {"ray"}  # found, never imported in this process (it runs in a child)


def _require(mod: str) -> None:
    """ImportError when ``mod`` is missing: imported, or only found for the peers run elsewhere."""
    if mod in _NOT_HERE:
        if importlib.util.find_spec(mod) is None:
            raise ImportError(f"No module named {mod!r}", name=mod)
        return
    __import__(mod)


def _first(loader: Any) -> Any:
    if isinstance(loader, ray_peer.RemoteLoader):
        return loader.first_batch()
    return next(iter(loader))


def _rows_of(batch: Any) -> int:
    first = batch
    while isinstance(first, (list, tuple)):
        first = first[0]
    if isinstance(first, dict):
        first = next(iter(first.values()))
    return int(first.shape[0]) if isinstance(first, torch.Tensor) else len(batch)


def _epoch(iterable: Any) -> tuple[int, float, float]:
    if isinstance(iterable, ray_peer.RemoteLoader):  # timed in its own process
        return iterable.epoch()
    t0 = time.perf_counter()
    first, n = None, 0
    for b in iterable:
        if first is None:
            first = time.perf_counter() - t0
        n += _rows_of(b)
    return n, first or 0.0, time.perf_counter() - t0


# peers whose first batch cannot equal torch's, and why
_NOT_COMPARABLE = {"nanoGPT get_batch": "n/a (random windows)"}


def _same(a: Any, b: Any) -> bool:
    if hasattr(a, "data") and type(a).__name__ == "BatchEncoding":  # HF's collator renames label -> labels
        a = {("label" if k == "labels" else k): v for k, v in a.data.items()}
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return all(k in b and _same(a[k], b[k]) for k in a)
    if isinstance(a, dict) or isinstance(b, dict):  # TokenWindows' dict vs the map-style (x, y) pair
        va, vb = (list(a.values()) if isinstance(a, dict) else a), (list(b.values()) if isinstance(b, dict) else b)
        return len(va) == len(vb) and all(_same(x, y) for x, y in zip(va, vb))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def run_peers(workers: int = 2, rounds: int = 3, quick: bool = False,
              progress: Callable[[str], None] | None = None, only: list[str] | None = None) -> dict[str, Any]:
    try:
        return _run_peers(workers, rounds, quick, progress, only)
    finally:
        close_ray()


def _run_peers(workers: int, rounds: int, quick: bool, progress: Callable[[str], None] | None,
               only: list[str] | None) -> dict[str, Any]:
    say = progress or (lambda s: None)
    rows, skipped = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in build_workloads(quick, tmp):
            if only and w.name not in only:
                continue
            makers: dict[str, Callable[[], Any]] = {}
            for peer, make in PEERS.items():
                mod = next((m for p, m in _MODULES.items() if peer.startswith(p)), None)
                try:
                    if mod is not None:
                        _require(mod)
                    if peer.startswith("Ray"):
                        say(f"[peers {w.name}] {peer}: in its own process")
                    make(w, workers)  # built once up front: a skip or a missing module shows here
                    makers[peer] = lambda make=make: make(w, workers)
                except _Skip:
                    continue
                except ImportError as exc:
                    skipped[peer] = f"not installed ({exc.name or exc})"
                except ray_peer.RayPeerError as exc:  # its process failed: a line that says so
                    skipped[peer] = f"failed in its own process: {str(exc)[:120]}"
            reference = next(iter(makers["torch DataLoader"]()))
            checked = {}
            for peer, make in makers.items():
                try:
                    first_batch = _first(make())
                    checked[peer] = _NOT_COMPARABLE.get(peer) or _same(first_batch, reference)
                except Exception as exc:  # a peer that fails on this workload: a row that says so
                    checked[peer] = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
            steady: dict[str, list[float]] = {p: [] for p in makers}
            first: dict[str, list[float]] = {p: [] for p in makers}
            loaders = {p: make() for p, make in makers.items()
                       if not (isinstance(checked[p], str) and checked[p].startswith("failed"))}
            for p, loader in loaders.items():
                _epoch(loader)  # warm: persistent workers up, caches filled
            for r in range(rounds):
                order = list(loaders) if r % 2 == 0 else list(reversed(loaders))
                for p in order:
                    say(f"[peers {w.name} {r + 1}/{rounds}] {p}")
                    n, _, t = _epoch(loaders[p])
                    steady[p].append(n / t)
                    _, f, _ = _epoch(makers[p]())  # a new loader: its start and first batch count
                    first[p].append(f)
            base = statistics.median(steady["torch DataLoader"]) if steady.get("torch DataLoader") else 0.0
            for p in makers:
                row = {"workload": w.name, "description": w.description, "peer": p, "equal": checked[p]}
                if steady[p]:
                    med = statistics.median(steady[p])
                    row.update(samples_per_s=med, spread=(min(steady[p]), max(steady[p])),
                               first_batch_s=statistics.median(first[p]), vs_torch=med / base if base else 0.0)
                rows.append(row)
            loaders.clear()  # before the next workload's workers fork: no peer's loader is inherited
            gc.collect()
    return {"rows": rows, "skipped": skipped, "workers": workers, "rounds": rounds}


def format_peers(result: dict[str, Any]) -> str:
    head = ("| workload | peer | samples/s (min-max) | vs torch | first batch s | equal batches |")
    lines = [f"against the alternatives: {result['workers']} workers/threads each, medians of {result['rounds']} "
             "interleaved rounds", "", head, table_rule(head)]
    for r in result["rows"]:
        if "samples_per_s" in r:
            lo, hi = r["spread"]
            lines.append(f"| {r['workload']} | {r['peer']} | {r['samples_per_s']:.0f} ({lo:.0f}-{hi:.0f}) | "
                         f"{r['vs_torch']:.2f}x | {r['first_batch_s']:.3f} | {r['equal']} |")
        else:
            lines.append(f"| {r['workload']} | {r['peer']} | - | - | - | {r['equal']} |")
    for peer, why in result["skipped"].items():
        lines.append(f"skipped: {peer}: {why}")
    if any(r["peer"].startswith("Ray") for r in result["rows"]):
        lines.append("Ray Data: run in a process of its own (python -m fastcollate._bench.ray_peer, ray.init(num_cpus=2)), "
                     "its epochs interleaved with the others' rounds; on tabular and padded only (the same rows; "
                     "tabular without its string field, which Ray's default collate refuses)")
    return "\n".join(lines)
