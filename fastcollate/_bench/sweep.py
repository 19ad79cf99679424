"""`fastcollate bench --sweep`: how the cost grows -- batch size 1 to 4,096 and tensor leaves per
sample 1 to 64 (dict samples of 16-float tensors), fastcollate vs default_collate side by side,
ns per leaf and GB/s. The picture of where fastcollate stops mattering. Each speedup is the median
of the per-round ratios with its min-max; ``noise`` flags the rows that cannot be trusted."""
from __future__ import annotations

import statistics
from typing import Any, Callable

import torch
from torch.utils.data import default_collate

from . import noise
from .._text import table_rule
from .collate_bench import time_per_call
from ..core.collator import Collator

BATCH_SIZES = (1, 4, 16, 64, 256, 1024, 4096)
LEAVES = (1, 4, 16, 64)
LEAF_FLOATS = 16


def samples(batch_size: int, leaves: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(batch_size * 100 + leaves)
    return [{f"x{k}": torch.randn(LEAF_FLOATS, generator=g) for k in range(leaves)} for _ in range(batch_size)]


def run(rounds: int = 3, min_time: float = 0.05, progress: Callable[[str], None] | None = None,
        batch_sizes: tuple[int, ...] = BATCH_SIZES, leaves: tuple[int, ...] = LEAVES) -> list[dict[str, Any]]:
    fast = Collator()
    rows = []
    configs = [(b, k) for k in leaves for b in batch_sizes]
    for i, (b, k) in enumerate(configs):
        if progress:
            progress(f"[sweep {i + 1}/{len(configs)}] batch {b} x {k} leaves")
        batch = samples(b, k)
        t_d, t_f = [], []
        for _ in range(rounds):  # interleaved: noise hits both
            t_d.append(time_per_call(lambda: default_collate(batch), min_time))
            t_f.append(time_per_call(lambda: fast(batch), min_time))
        d, f = statistics.median(t_d), statistics.median(t_f)
        n, nbytes = b * k, b * k * LEAF_FLOATS * 4
        speedup = noise.spread(noise.ratio_rounds(t_d, t_f))
        rows.append({"batch_size": b, "leaves_per_sample": k, "leaves": n, "bytes": nbytes,
                     "description": f"batch {b} x {k} leaves",
                     "default_ns_per_leaf": d * 1e9 / n, "fastcollate_ns_per_leaf": f * 1e9 / n,
                     "default_gb_s": nbytes / d / 1e9, "fastcollate_gb_s": nbytes / f / 1e9,
                     "speedup": speedup["median"], "rounds": rounds,
                     "rounds_ns_per_leaf": {"default": [t * 1e9 / n for t in t_d],
                                            "fastcollate": [t * 1e9 / n for t in t_f]},
                     "spread": {"speedup": speedup}})
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'batch':>5} | {'leaves/sample':>13} | {'default ns/leaf':>15} | {'fastcollate ns/leaf':>19} | "
            f"{'default GB/s':>12} | {'fastcollate GB/s':>16} | {'speedup (min-max)':>17} | noise |")
    lines = [head, table_rule(head)]
    for r in rows:
        lines.append(f"| {r['batch_size']:>5} | {r['leaves_per_sample']:>13} | {r['default_ns_per_leaf']:15.0f} | "
                     f"{r['fastcollate_ns_per_leaf']:19.0f} | {r['default_gb_s']:12.2f} | {r['fastcollate_gb_s']:16.2f} | "
                     f"{noise.ratio_cell(r['spread']['speedup']):>17} | {noise.mark(r):^5} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """ns per leaf against leaves per batch, log-log, one line per leaves-per-sample and side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k in sorted({r["leaves_per_sample"] for r in rows}):
        sub = sorted((r for r in rows if r["leaves_per_sample"] == k), key=lambda r: r["leaves"])
        xs = [r["leaves"] for r in sub]
        (line,) = ax.plot(xs, [r["fastcollate_ns_per_leaf"] for r in sub], marker="o", label=f"fastcollate, {k}/sample")
        ax.plot(xs, [r["default_ns_per_leaf"] for r in sub], marker="x", ls="--", color=line.get_color(),
                label=f"default_collate, {k}/sample")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"tensor leaves per batch (batch size x leaves per sample; {LEAF_FLOATS} floats each)")
    ax.set_ylabel("ns per leaf")
    ax.set_title("collate cost per leaf as batches grow")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
