"""`fastcollate bench --engines`: the trainer end of a distributed engine, Ray Data, side by
side in one run -- Ray's default collate (what ``iter_torch_batches`` uses without a
``collate_fn``) against ``fastcollate.ray.ArrowCollate`` -- on the batches Ray hands a collate
(``pyarrow.Table``s):

  (a) 2,048 rows x 16 float32 features (a tensor column, as Ray stores numpy rows) + an int64 label,
      and the same features as 16 float32 columns;
  (b) 256 rows of token lists (16-512 tokens) padded, with a mask: Ray's default cannot pad, so
      its side is what a Ray user writes (the rows through Ray's numpy conversion, then
      ``pad_sequence`` and a mask from the lengths, in an ``ArrowBatchCollateFn``);
  (c) 64 rows of uint8 3x224x224 images, a tensor-extension column, + an int64 label.

First the collate call alone (medians of interleaved rounds, the previous batch held alive),
then the whole ``iter_torch_batches`` epoch both ways over a materialized dataset of the same
batches (Ray's streaming executor and prefetching around the collate). Every pair is first
checked to give equal batches (keys, dtypes, shapes, bytes).
"""
from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .._text import table_rule
from .collate_bench import time_per_call


def _tables(rows_scale: int = 1) -> dict[str, tuple[str, Any, dict[str, Any], int]]:
    """name -> (description, one batch as a pyarrow.Table, ArrowCollate's arguments, batch size)."""
    import pyarrow as pa
    from ray.data.extensions import ArrowTensorArray

    rng = np.random.default_rng(0)

    def features(n: int) -> Any:
        return pa.table({"x": ArrowTensorArray.from_numpy(rng.standard_normal((n, 16)).astype(np.float32)),
                         "label": pa.array(rng.integers(0, 10, n))})

    def columns(n: int) -> Any:
        cols = {f"f{i}": pa.array(rng.standard_normal(n).astype(np.float32)) for i in range(16)}
        cols["label"] = pa.array(rng.integers(0, 10, n))
        return pa.table(cols)

    def tokens(n: int) -> Any:
        lens = rng.integers(16, 513, n)
        return pa.table({"input_ids": pa.array([rng.integers(5, 50000, k) for k in lens], pa.list_(pa.int64())),
                         "label": pa.array(rng.integers(0, 2, n))})

    def images(n: int) -> Any:
        return pa.table({"image": ArrowTensorArray.from_numpy(rng.integers(0, 255, (n, 3, 224, 224), dtype=np.uint8)),
                         "label": pa.array(rng.integers(0, 10, n))})

    k = rows_scale
    return {
        "features": ("(a) 2048 x 16 float32 features (tensor column) + int64", features(2048 * k), {}, 2048),
        "columns": ("(a) 2048 x 16 float32 columns + int64", columns(2048 * k), {}, 2048),
        "tokens": ("(b) 256 token lists 16-512, padded + mask", tokens(256 * k), {"pad": {"input_ids": 0}}, 256),
        "images": ("(c) 64 x uint8 3x224x224 (tensor column) + int64", images(64 * k), {}, 64),
    }


def _ray_side(name: str, pinned: bool = False) -> Any:
    """Ray's default collate (as iter_torch_batches makes it on the CPU), or, for the padded
    rows, what a Ray user writes: Ray's numpy conversion of the rows + pad_sequence + a mask;
    ``pinned``: then every tensor pinned, as ``iter_torch_batches(pin_memory=True)`` does."""
    from ray.data.collate_fn import ArrowBatchCollateFn, DefaultCollateFn

    if pinned:
        from ray.data.util.torch_utils import pin_tensors_to_memory

        base = _ray_side(name)
        return lambda table: pin_tensors_to_memory(base(table))
    if name != "tokens":
        return DefaultCollateFn(combine_chunks=True)

    class PadSequence(ArrowBatchCollateFn):
        def __call__(self, batch: Any) -> dict[str, torch.Tensor]:
            from torch.nn.utils.rnn import pad_sequence

            ids = [torch.as_tensor(a) for a in batch.column("input_ids").to_numpy(zero_copy_only=False)]
            lens = torch.tensor([len(t) for t in ids])
            padded = pad_sequence(ids, batch_first=True, padding_value=0)
            return {"input_ids": padded, "label": torch.as_tensor(batch.column("label").to_numpy()),
                    "attention_mask": (torch.arange(padded.shape[1])[None, :] < lens[:, None]).long()}

    return PadSequence()


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].is_pinned() == b[k].is_pinned()
        and a[k].contiguous().view(torch.uint8).equal(b[k].contiguous().view(torch.uint8)) for k in a)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "the given NumPy array is not writable" (Ray's zero-copy)
        yield


def run_collate(rounds: int = 5, min_time: float = 0.2, only: list[str] | None = None,
                progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The collate call alone: Ray's side vs ArrowCollate on one batch, medians of interleaved rounds."""
    from ..ray import ArrowCollate

    say = progress or (lambda s: None)
    out = []
    # on a GPU machine also pinned, both ways: what feeding the GPU asks of each
    modes = [False, True] if torch.cuda.is_available() else [False]
    with _quiet():
        for name, (label, table, kw, _) in _tables().items():
            if only and name not in only:
                continue
            for pinned in modes:
                theirs, ours = _ray_side(name, pinned), ArrowCollate(pin_memory=pinned, **kw)
                equal = _same(ours(table), theirs(table))
                t_ray, t_ours = [], []
                for r in range(rounds):
                    say(f"[engines collate {name}{' pinned' if pinned else ''} {r + 1}/{rounds}]")
                    pair = [(t_ray, theirs), (t_ours, ours)]
                    for times, fn in (pair if r % 2 == 0 else pair[::-1]):
                        times.append(time_per_call(lambda: fn(table), min_time))
                ray_s, ours_s = statistics.median(t_ray), statistics.median(t_ours)
                out.append({"workload": name, "description": label + (", pinned" if pinned else ""),
                            "pinned": pinned, "equal": equal, "ray_ms": ray_s * 1e3, "ours_ms": ours_s * 1e3,
                            "speedup": ray_s / ours_s, "rounds": rounds, "batch_mb": table.nbytes / 1e6})
    return out


def run_epochs(batches: int = 8, rounds: int = 3, only: list[str] | None = None,
               progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The whole iter_torch_batches epoch, both ways, over a materialized dataset of ``batches`` batches."""
    import ray

    say = progress or (lambda s: None)
    started = not ray.is_initialized()
    if started:
        say("[engines] starting a local Ray cluster (num_cpus=2)")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    old_bars = ctx.enable_progress_bars
    ctx.enable_progress_bars = False
    out = []
    try:
        with _quiet():
            _epoch_rows(batches, rounds, only, say, out)
    finally:
        ctx.enable_progress_bars = old_bars
        if started:
            ray.shutdown()
    return out


def _epoch_rows(batches: int, rounds: int, only: list[str] | None, say: Callable[[str], None],
                out: list[dict[str, Any]]) -> None:
    import ray

    from ..ray import ArrowCollate

    for name, (label, table, kw, bs) in _tables(rows_scale=batches).items():
        if only and name not in only:
            continue
        ds = ray.data.from_arrow(table).materialize()
        sides = {"ray": _ray_side(name), "ours": ArrowCollate(**kw)}

        def epoch(fn: Any) -> tuple[float, int, Any]:
            t0, n, first = time.perf_counter(), 0, None
            for b in ds.iter_torch_batches(batch_size=bs, collate_fn=fn, device="cpu"):
                first = b if first is None else first
                n += 1
            return time.perf_counter() - t0, n, first

        _, _, a = epoch(sides["ray"])  # warm, and the first batches compared
        _, _, b = epoch(sides["ours"])
        times: dict[str, list[float]] = {k: [] for k in sides}
        n = 0
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for k in order:
                say(f"[engines epoch {name} {r + 1}/{rounds}] {k}")
                t, n, _ = epoch(sides[k])
                times[k].append(t)
        ray_s, ours_s = statistics.median(times["ray"]), statistics.median(times["ours"])
        out.append({"workload": name, "description": label, "equal": _same(b, a), "batches": n,
                    "ray_epoch_ms": ray_s * 1e3, "ours_epoch_ms": ours_s * 1e3, "speedup": ray_s / ours_s,
                    "rounds": rounds})


def format_collate(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'workload':<62} |     MB | {'Ray default':>11} | {'ArrowCollate':>12} | speedup | equal |")
    lines = [head, table_rule(head)]
    for r in rows:
        lines.append(f"| {r['description']:<62} | {r['batch_mb']:6.2f} | {r['ray_ms']:8.3f} ms | "
                     f"{r['ours_ms']:9.3f} ms | {r['speedup']:6.2f}x | {str(r['equal']):<5} |")
    return "\n".join(lines)


def format_epochs(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'workload':<62} | batches | {'Ray default':>11} | {'ArrowCollate':>12} | speedup | equal |")
    lines = [head, table_rule(head)]
    for r in rows:
        lines.append(f"| {r['description']:<62} | {r['batches']:7d} | {r['ray_epoch_ms']:8.1f} ms | "
                     f"{r['ours_epoch_ms']:9.1f} ms | {r['speedup']:6.2f}x | {str(r['equal']):<5} |")
    return "\n".join(lines)


NOTES = ("Ray default: Ray's DefaultCollateFn as iter_torch_batches uses it on the CPU (tokens: Ray's numpy rows + "
         "pad_sequence + a mask, since Ray's default cannot pad; pinned: then pin_tensors_to_memory, as "
         "iter_torch_batches(pin_memory=True) does) vs fastcollate.ray.ArrowCollate(pin_memory=...). Unpinned, Ray's "
         "default returns tensor columns as zero-copy views of the Arrow buffers -- no arena, pageable: the copy "
         "towards the GPU is still to come -- where ArrowCollate copies every column into one arena, which "
         "CudaPrefetcher moves in one H2D copy.")
