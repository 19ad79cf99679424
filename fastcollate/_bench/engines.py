"""`fastcollate bench --engines`: the trainer end of a distributed engine, Ray Data, side by
side in one run -- Ray's default collate (what ``iter_torch_batches`` uses without a
``collate_fn``) against ``fastcollate.ray.ArrowCollate`` -- on the batches Ray hands a collate
(``pyarrow.Table``s), one workload per kind of column:

  images    64 rows of uint8 3x224x224 (a tensor column) + an int64 label;
  features  2,048 rows x 16 float32 features (a tensor column, as Ray stores numpy rows) + int64;
  columns   the same features as 16 float32 columns + int64 (a numeric table);
  wide      256 rows x 128 float32 columns + int64 (many small columns);
  lists     2,048 rows of a fixed-size list<float32>[16] + a bool flag + int64;
  tokens    256 rows of token lists (16-512 tokens) padded, with a mask: Ray's default cannot pad,
            so its side is what a Ray user writes (the rows through Ray's numpy conversion, then
            ``pad_sequence`` and a mask from the lengths, in an ``ArrowBatchCollateFn``);
  blocks    the images stored in blocks of 40 rows: every batch spans two or three blocks (chunks);
  chunks    the numeric table stored in blocks of 10 rows (``from_items`` makes up to 200 blocks):
            every batch of 256 spans 26 or 27 small chunks.

First the collate call alone (medians of interleaved rounds, the previous batch held alive), with
the columns each side hands out zero-copy; then the whole ``iter_torch_batches`` epoch both ways
over a materialized dataset (Ray's iterator, prefetching and format conversion around the
collate): medians of interleaved rounds, each side's spread (max - min over the rounds) printed,
and a row marked when a spread exceeds the difference between the two medians (the difference is
then within the noise). Every pair is first checked to give equal batches (keys, dtypes, shapes,
bytes).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
import warnings
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .._text import table_rule
from .collate_bench import time_per_call


@dataclasses.dataclass
class Kind:
    """One kind of column: ``make(rows, rng)`` gives a table of ``rows`` rows; ``block_rows``: the
    dataset's block size when batches should span blocks (None: one block)."""

    label: str
    make: Callable[[int, Any], Any]
    batch_size: int
    kw: dict = dataclasses.field(default_factory=dict)
    block_rows: int | None = None


def _kinds() -> dict[str, Kind]:
    import pyarrow as pa
    from ray.data.extensions import ArrowTensorArray

    def images(n: int, rng: Any) -> Any:
        return pa.table({"image": ArrowTensorArray.from_numpy(rng.integers(0, 255, (n, 3, 224, 224), dtype=np.uint8)),
                         "label": pa.array(rng.integers(0, 10, n))})

    def features(n: int, rng: Any) -> Any:
        return pa.table({"x": ArrowTensorArray.from_numpy(rng.standard_normal((n, 16)).astype(np.float32)),
                         "label": pa.array(rng.integers(0, 10, n))})

    def columns(k: int) -> Callable[[int, Any], Any]:
        def make(n: int, rng: Any) -> Any:
            cols = {f"f{i}": pa.array(rng.standard_normal(n).astype(np.float32)) for i in range(k)}
            cols["label"] = pa.array(rng.integers(0, 10, n))
            return pa.table(cols)
        return make

    def lists(n: int, rng: Any) -> Any:
        return pa.table({"emb": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 16).astype(
                            np.float32)), 16),
                         "flag": pa.array(rng.random(n) < 0.5), "label": pa.array(rng.integers(0, 10, n))})

    def tokens(n: int, rng: Any) -> Any:
        lens = rng.integers(16, 513, n)
        return pa.table({"input_ids": pa.array([rng.integers(5, 50000, k) for k in lens], pa.list_(pa.int64())),
                         "label": pa.array(rng.integers(0, 2, n))})

    return {
        "images": Kind("image column: 64 x uint8 3x224x224 (tensor) + int64", images, 64),
        "features": Kind("tensor column: 2048 x 16 float32 + int64", features, 2048),
        "columns": Kind("numeric table: 2048 x 16 float32 columns + int64", columns(16), 2048),
        "wide": Kind("many small columns: 256 x 128 float32 columns + int64", columns(128), 256),
        "lists": Kind("fixed-size lists: 2048 x list<float32>[16] + bool + int64", lists, 2048),
        "tokens": Kind("token lists 16-512, padded + mask: 256 rows", tokens, 256, {"pad": {"input_ids": 0}}),
        "blocks": Kind("image column in blocks of 40: batches of 64 span 2-3 chunks", images, 64, block_rows=40),
        "chunks": Kind("numeric table in blocks of 10: batches of 256 span 26-27 chunks", columns(16), 256,
                       block_rows=10),
    }


NAMES = ("images", "features", "columns", "wide", "lists", "tokens", "blocks", "chunks")


def _batch(kind: Kind) -> Any:
    """One batch as Ray hands it to a collate: a slice of one block, or chunks of several."""
    import pyarrow as pa

    size, block = kind.batch_size, kind.block_rows
    table = kind.make(size + (block or 0), np.random.default_rng(0))
    if block is None:
        return table.slice(0, size)
    # the batch starts mid-block: a slice of each block it spans, one chunk each
    start, parts = block // 2, []
    while start < block // 2 + size:
        end = min((start // block + 1) * block, block // 2 + size)
        parts.append(table.slice(start, end - start).combine_chunks())
        start = end
    return pa.concat_tables(parts)


def _blocks(kind: Kind, batches: int) -> list[Any]:
    """The epoch's dataset as blocks (tables)."""
    table = kind.make(kind.batch_size * batches, np.random.default_rng(1))
    if kind.block_rows is None:
        return [table]
    return [table.slice(i, kind.block_rows).combine_chunks() for i in range(0, table.num_rows, kind.block_rows)]


def ray_side(name: str, pinned: bool = False) -> Any:
    """Ray's default collate (as iter_torch_batches makes it on the CPU), or, for the padded
    rows, what a Ray user writes: Ray's numpy conversion of the rows + pad_sequence + a mask;
    ``pinned``: then every tensor pinned, as ``iter_torch_batches(pin_memory=True)`` does."""
    from ray.data.collate_fn import ArrowBatchCollateFn, DefaultCollateFn

    if pinned:
        from ray.data.util.torch_utils import pin_tensors_to_memory

        base = ray_side(name)
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


def zero_copy_columns(out: dict[str, torch.Tensor], table: Any) -> list[str]:
    """The keys of ``out`` whose tensor lies in one of ``table``'s Arrow buffers."""
    import pyarrow as pa

    spans = []
    for col in table.columns:
        for chunk in col.chunks:
            arr = chunk.storage if isinstance(chunk.type, pa.BaseExtensionType) else chunk
            spans += [(b.address, b.address + b.size) for b in arr.buffers() if b is not None]
    return [k for k, t in out.items() if any(lo <= t.data_ptr() < hi for lo, hi in spans)]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "the given NumPy array is not writable" (Ray's zero-copy)
        yield


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover - no load average on this platform
        return float("nan")


def run_collate(rounds: int = 5, min_time: float = 0.2, only: list[str] | None = None,
                progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The collate call alone: Ray's side vs ArrowCollate on one batch, medians of interleaved rounds."""
    from ..ray import ArrowCollate

    say = progress or (lambda s: None)
    out = []
    # on a GPU machine also pinned, both ways: what feeding the GPU asks of each
    modes = [False, True] if torch.cuda.is_available() else [False]
    with _quiet():
        for name, kind in _kinds().items():
            if only and name not in only:
                continue
            table = _batch(kind)
            for pinned in modes:
                theirs, ours = ray_side(name, pinned), ArrowCollate(pin_memory=pinned, **kind.kw)
                # unpinned, also everything copied into one arena: what the zero-copy rule is measured against
                arena = ArrowCollate(zero_copy=False, **kind.kw) if not pinned else None
                a, b = ours(table), theirs(table)
                equal = _same(a, b) and (arena is None or _same(arena(table), b))
                views = (len(zero_copy_columns(b, table)), len(zero_copy_columns(a, table)), len(a))
                del a, b
                t_ray, t_ours, t_arena = [], [], []
                for r in range(rounds):
                    say(f"[engines collate {name}{' pinned' if pinned else ''} {r + 1}/{rounds}]")
                    sides = [(t_ray, theirs), (t_ours, ours)] + ([(t_arena, arena)] if arena is not None else [])
                    for times, fn in (sides if r % 2 == 0 else sides[::-1]):
                        times.append(time_per_call(lambda: fn(table), min_time))
                ray_s, ours_s = statistics.median(t_ray), statistics.median(t_ours)
                out.append({"workload": name, "description": kind.label + (", pinned" if pinned else ""),
                            "pinned": pinned, "equal": equal, "ray_ms": ray_s * 1e3, "ours_ms": ours_s * 1e3,
                            "arena_ms": statistics.median(t_arena) * 1e3 if t_arena else None,
                            "speedup": ray_s / ours_s, "rounds": rounds, "batch_mb": table.nbytes / 1e6,
                            "chunks": max(c.num_chunks for c in table.columns), "ray_views": views[0],
                            "ours_views": views[1], "columns": views[2]})
    return out


def run_epochs(batches: int = 16, rounds: int = 5, only: list[str] | None = None,
               progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The whole iter_torch_batches epoch, both ways, over a materialized dataset of ``batches``
    batches; a local Ray cluster (``num_cpus=2``) is started here unless one is running."""
    import ray

    say = progress or (lambda s: None)
    started = not ray.is_initialized()
    if started:
        say("[engines] starting a local Ray cluster (num_cpus=2)")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    old_bars = ctx.enable_progress_bars
    ctx.enable_progress_bars = False
    out: list[dict[str, Any]] = []
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

    for name, kind in _kinds().items():
        if only and name not in only:
            continue
        ds = ray.data.from_arrow(_blocks(kind, batches)).materialize()
        # Ray's side: its default (collate_fn=None: DefaultCollateFn(combine_chunks=True) on the CPU)
        sides = {"ray": None if name != "tokens" else ray_side(name), "ours": ArrowCollate(**kind.kw)}

        def epoch(fn: Any) -> tuple[float, int, Any]:
            t0, n, first = time.perf_counter(), 0, None
            for b in ds.iter_torch_batches(batch_size=kind.batch_size, collate_fn=fn, device="cpu"):
                first = b if first is None else first
                n += 1
            return time.perf_counter() - t0, n, first

        _, _, a = epoch(sides["ray"])  # warm, and the first batches compared
        _, _, b = epoch(sides["ours"])
        equal = _same(b, a)
        del a, b
        times: dict[str, list[float]] = {k: [] for k in sides}
        n = 0
        load = [_load()]
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for k in order:
                say(f"[engines epoch {name} {r + 1}/{rounds}] {k}")
                t, n, _ = epoch(sides[k])
                times[k].append(t)
        load.append(_load())
        ray_s, ours_s = statistics.median(times["ray"]), statistics.median(times["ours"])
        spread_ray, spread_ours = max(times["ray"]) - min(times["ray"]), max(times["ours"]) - min(times["ours"])
        out.append({"workload": name, "description": kind.label, "equal": equal, "batches": n,
                    "ray_epoch_ms": ray_s * 1e3, "ours_epoch_ms": ours_s * 1e3, "speedup": ray_s / ours_s,
                    "ray_spread_ms": spread_ray * 1e3, "ours_spread_ms": spread_ours * 1e3,
                    "round_speedups": [r / o for r, o in zip(times["ray"], times["ours"])],
                    "within_noise": max(spread_ray, spread_ours) > abs(ray_s - ours_s),
                    "rounds": rounds, "load": max(load)})


def format_collate(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'workload':<64} | chunks |     MB | {'Ray default':>11} | {'ArrowCollate':>12} | speedup | "
            "zero-copy Ray / ours | all in one arena | equal |")
    lines = [head, table_rule(head)]
    for r in rows:
        views = f"{r['ray_views']} / {r['ours_views']} of {r['columns']}"
        arena = f"{r['arena_ms']:9.3f} ms" if r.get("arena_ms") is not None else "-"
        lines.append(f"| {r['description']:<64} | {r['chunks']:6d} | {r['batch_mb']:6.2f} | {r['ray_ms']:8.3f} ms | "
                     f"{r['ours_ms']:9.3f} ms | {r['speedup']:6.2f}x | {views:<20} | {arena:>16} | "
                     f"{str(r['equal']):<5} |")
    if any(r.get("arena_ms") is not None for r in rows):
        lines.append("all in one arena: ArrowCollate(zero_copy=False), every column copied (what pin_memory=True "
                     "does, pageable here)")
    return "\n".join(lines)


def format_epochs(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'workload':<64} | batches | {'Ray default (spread)':>20} | {'ArrowCollate (spread)':>21} | "
            "speedup | per round     | equal |")
    lines = [head, table_rule(head)]
    noisy = []
    for r in rows:
        per = r["round_speedups"]
        mark = "*" if r["within_noise"] else " "
        if r["within_noise"]:
            noisy.append(r["workload"])
        lines.append(f"| {r['description']:<64} | {r['batches']:7d} | "
                     f"{r['ray_epoch_ms']:8.1f} ms ({r['ray_spread_ms']:5.1f}) | "
                     f"{r['ours_epoch_ms']:9.1f} ms ({r['ours_spread_ms']:5.1f}) | {r['speedup']:5.2f}x{mark} | "
                     f"{min(per):5.2f}-{max(per):5.2f}x | {str(r['equal']):<5} |")
    if rows:
        lines.append(f"medians of {rows[0]['rounds']} interleaved rounds; spread: max - min over the rounds (ms); "
                     f"per round: the range of Ray's time / ArrowCollate's in each round; load average up to "
                     f"{max(r['load'] for r in rows):.1f} on {os.cpu_count()} cores")
    if noisy:
        lines.append(f"warning: * {', '.join(noisy)}: a spread exceeds the difference between the medians; "
                     "the two are equal within the noise of this run")
    return "\n".join(lines)


NOTES = ("Ray default: iter_torch_batches without a collate_fn (DefaultCollateFn(combine_chunks=True) on the CPU; "
         "tokens: Ray's numpy rows + pad_sequence + a mask, since Ray's default cannot pad; pinned: then "
         "pin_tensors_to_memory, as iter_torch_batches(pin_memory=True) does) vs "
         "fastcollate.ray.ArrowCollate(pin_memory=...). Unpinned, both hand out a column whose rows lie in one Arrow "
         "buffer as a zero-copy view of it (ArrowCollate also for fixed-size lists), and such a column in several "
         "chunks after Arrow has combined them (both); ArrowCollate copies the rest -- bools, padding -- into one "
         "arena with its threads, where Ray converts through numpy. Pinned, ArrowCollate copies everything into one "
         "pinned arena, which CudaPrefetcher moves in one H2D copy.")
