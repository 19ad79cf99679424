"""Beyond one node, on paper: cache hit rate and cache memory per node for M nodes x N ranks.

A simulation, not a measurement: no sample is fetched, no time is taken. The index streams are
the real samplers' -- torch's ``DistributedSampler`` (shuffle=True) and
``fastcollate.NodeAffineSampler``, each driven with ``set_epoch`` -- and the caches follow
``fastcollate.Cached``'s rules: a fetched index is inserted on a miss, first come first cached,
until the cache's budget is spent; nothing is evicted. Every sample has the same size, so memory
is counted in units of the dataset (1.00 = a whole copy of it). The ranks fetch in lock-step:
at step t every rank fetches its t-th index, the node's ranks in local-rank order, so the insert
order of a node-wide cache is its ranks' streams interleaved.

The schemes, each with a per-node budget (a fraction of the dataset):

* ``private``: today's cache, one per rank (each rank caches only what it fetched), under
  DistributedSampler; the node's budget is split evenly between its N ranks;
* ``node``: one node-wide cache (the union of the node's ranks' fetches), under DistributedSampler;
* ``affine``: one node-wide cache under NodeAffineSampler;
* ``store``: what a cluster-wide store would give under DistributedSampler -- every node's budget
  a shard of it, index i held by node ``i % M`` -- with the share of its hits that cross the
  network (not something fastcollate builds: it says where one would pay).

A second table (``--stats``) compares the samplers' batches: the variance, over steps, of the
global batch's mean label on a class-sorted dataset (an ImageFolder), against the closed forms
for a simple random sample (DistributedSampler) and a stratified one (NodeAffineSampler, given its
partition); and how far one node's mean label, over one epoch and over all of them, is from the
dataset's.

    python benchmarks/node_cache_sim.py                                   # the tables, printed
    python benchmarks/node_cache_sim.py --markdown docs/benchmarks/node_cache.md
    python benchmarks/node_cache_sim.py --nodes 4 --per-node 8 --budgets 0.25 --epochs 3 --no-stats
"""
from __future__ import annotations

import argparse
import datetime
import math
import shlex
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from fastcollate import NodeAffineSampler

SCHEMES = ("private", "node", "affine", "store")
SCHEME_WORDS = {
    "private": "a private cache per rank (DistributedSampler)",
    "node": "one node-wide cache (DistributedSampler)",
    "affine": "one node-wide cache (NodeAffineSampler)",
    "store": "a cluster-wide store, sharded i % M (DistributedSampler)",
}


def epoch_streams(sampler_class: Callable, n: int, nodes: int, per_node: int, epochs: int,
                  seed: int) -> list[np.ndarray]:
    """Each epoch's indices as an array [ranks, steps], from the sampler itself via set_epoch."""
    ranks = nodes * per_node
    if sampler_class is NodeAffineSampler:
        samplers = [NodeAffineSampler(range(n), ranks, r, shuffle=True, seed=seed, local_world_size=per_node)
                    for r in range(ranks)]
    else:
        samplers = [sampler_class(range(n), num_replicas=ranks, rank=r, shuffle=True, seed=seed)
                    for r in range(ranks)]
    out = []
    for epoch in range(epochs):
        for s in samplers:
            s.set_epoch(epoch)
        out.append(np.array([list(s) for s in samplers], dtype=np.int64).reshape(ranks, -1))
    return out


@dataclass
class Cache:
    """Fill once, never evict: a miss is inserted while there is room, in fetch order."""
    n: int
    capacity: int
    held: np.ndarray = field(init=False)
    count: int = 0

    def __post_init__(self) -> None:
        self.held = np.zeros(self.n, dtype=bool)

    def fetch(self, stream: np.ndarray) -> np.ndarray:
        """Fetches ``stream`` in order; returns which fetches hit."""
        if not len(stream):
            return np.zeros(0, dtype=bool)
        was = self.held[stream]
        first = np.zeros(len(stream), dtype=bool)
        first[np.unique(stream, return_index=True)[1]] = True  # a repeat (padding) can hit its own insert
        new = first & ~was
        insert = new & (np.cumsum(new) <= self.capacity - self.count)
        self.held[stream[insert]] = True
        self.count += int(insert.sum())
        return was | (~first & self.held[stream])


@dataclass
class Row:
    nodes: int
    per_node: int
    budget: float
    scheme: str
    hit: list[float]              # per epoch, all fetches
    rank_range: tuple[float, float]  # the ranks' lowest and highest hit rate in the last epoch
    held: list[float]             # per epoch's end: the most any node holds, in datasets
    remote: list[float] | None = None  # store: the share of hits served by another node


def simulate(n: int, nodes: int, per_node: int, budgets: Sequence[float], epochs: int, seed: int = 0,
             schemes: Sequence[str] = SCHEMES) -> list[Row]:
    """Every scheme and budget for one (nodes, per_node), over ``epochs`` epochs."""
    streams = {"ds": epoch_streams(DistributedSampler, n, nodes, per_node, epochs, seed)}
    if "affine" in schemes:
        streams["affine"] = epoch_streams(NodeAffineSampler, n, nodes, per_node, epochs, seed)
    rows = []
    for budget in budgets:
        for scheme in schemes:
            rows.append(_run(scheme, streams["affine" if scheme == "affine" else "ds"], n, nodes, per_node, budget))
    return rows


def _run(scheme: str, streams: list[np.ndarray], n: int, nodes: int, per_node: int, budget: float) -> Row:
    ranks = nodes * per_node
    node_of = np.repeat(np.arange(nodes), per_node)
    if scheme == "private":
        caches = [Cache(n, int(budget * n) // per_node) for _ in range(ranks)]
    else:
        caches = [Cache(n, int(budget * n)) for _ in range(nodes)]
    hit, held, remote, rank_hits = [], [], [], np.zeros(ranks)
    for epoch_idx in streams:
        hits = np.zeros(epoch_idx.shape, dtype=bool)  # [ranks, steps]
        served_remote = 0
        if scheme == "private":
            for r in range(ranks):
                hits[r] = caches[r].fetch(epoch_idx[r])
        elif scheme in ("node", "affine"):
            for k in range(nodes):
                block = epoch_idx[k * per_node:(k + 1) * per_node]
                hits[k * per_node:(k + 1) * per_node] = caches[k].fetch(block.T.reshape(-1)).reshape(block.T.shape).T
        else:  # store: the whole cluster in lock-step, each index to its shard
            flat = epoch_idx.T.reshape(-1)
            fetcher = np.tile(node_of, epoch_idx.shape[1])
            shard = flat % nodes
            got = np.zeros(len(flat), dtype=bool)
            for k in range(nodes):
                mine = shard == k
                got[mine] = caches[k].fetch(flat[mine])
            served_remote = int((got & (shard != fetcher)).sum())
            hits = got.reshape(epoch_idx.shape[1], ranks).T
        hit.append(float(hits.mean()) if hits.size else 0.0)
        rank_hits = hits.mean(axis=1) if hits.size else np.zeros(ranks)
        if scheme == "private":
            held.append(max(sum(caches[r].count for r in range(k * per_node, (k + 1) * per_node))
                            for k in range(nodes)) / n)
        else:
            held.append(max(c.count for c in caches) / n)
        remote.append(served_remote / max(1, int(hits.sum())))
    return Row(nodes, per_node, budget, scheme, hit, (float(rank_hits.min()), float(rank_hits.max())), held,
               remote if scheme == "store" else None)


def expected_hit(scheme: str, nodes: int, per_node: int, budget: float, epoch: int) -> float:
    """The closed form the simulation should land near (large n; fill order ignored)."""
    if epoch == 0:
        return 0.0
    if scheme == "private":  # a rank fetches a uniform index, held if that rank fetched it before
        return min(1 - (1 - 1 / (nodes * per_node)) ** epoch, budget / per_node)
    if scheme == "node":
        return min(1 - (1 - 1 / nodes) ** epoch, budget)
    return min(1.0, budget * nodes)  # affine, store: a node's part (a shard) is 1/M of the dataset


# --- the samplers' batches


@dataclass
class Stats:
    nodes: int
    per_node: int
    batch: int                      # global batch: ranks x per-rank batch
    var_ds: float                   # variance over steps of the global batch's mean label
    var_affine: float
    theory_ds: float                # simple random sample without replacement
    theory_affine: float            # stratified over the fixed partition, given the partition
    node_epoch: float               # RMS of (a node's mean label in one epoch - the dataset's), closed form
    node_all_ds: float              # RMS over nodes of (a node's mean label over all epochs - the dataset's)
    node_all_affine: float          # ... over 20 partition seeds: a node's part's mean, whatever the epochs
    seen_ds: float                  # the share of the dataset a node has seen after all epochs
    seen_affine: float


def batch_stats(n: int, nodes: int, per_node: int, per_rank_batch: int, epochs: int, classes: int = 10,
                seed: int = 0, partition_seeds: int = 20) -> Stats:
    """The samplers' batches over a class-sorted dataset (label y_i = i * classes // n)."""
    y = (np.arange(n) * classes // n).astype(np.float64)
    ranks, b = nodes * per_node, nodes * per_node * per_rank_batch
    out = {}
    for name, cls in (("ds", DistributedSampler), ("affine", NodeAffineSampler)):
        means, node_sum, node_count = [], np.zeros(nodes), np.zeros(nodes)
        seen = [np.zeros(n, dtype=bool) for _ in range(nodes)]
        for idx in epoch_streams(cls, n, nodes, per_node, epochs, seed):
            steps = idx.shape[1] // per_rank_batch
            full = idx[:, :steps * per_rank_batch].reshape(ranks, steps, per_rank_batch)
            means += list(y[full].mean(axis=(0, 2)))
            for k in range(nodes):
                mine = idx[k * per_node:(k + 1) * per_node].reshape(-1)
                node_sum[k] += y[mine].sum()
                node_count[k] += len(mine)
                seen[k][mine] = True
        out[name] = (float(np.var(means, ddof=1)), _rms(node_sum / node_count - y.mean()),
                     float(np.mean([s.mean() for s in seen])))
    s2, m = float(np.var(y, ddof=1)), n / nodes
    nb = per_node * per_rank_batch

    def owners(partition_seed: int) -> np.ndarray:
        return NodeAffineSampler(range(n), ranks, 0, seed=partition_seed, local_world_size=per_node).owners().numpy()

    own = owners(seed)
    theory_affine = sum(float(np.var(y[own == k], ddof=1)) / nb * (1 - nb / int((own == k).sum()))
                        for k in range(nodes)) / nodes ** 2
    parts_off = [y[o == k].mean() - y.mean() for o in map(owners, range(seed, seed + partition_seeds))
                 for k in range(nodes)]
    return Stats(nodes, per_node, b, out["ds"][0], out["affine"][0], s2 / b * (1 - b / n), theory_affine,
                 math.sqrt(s2 / m * (1 - m / n)), out["ds"][1], _rms(parts_off), out["ds"][2], out["affine"][2])


def _rms(values) -> float:
    return float(np.sqrt(np.mean(np.square(values))))


# --- tables


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x < 0.995 or x == 1 else f"{100 * x:.1f}%"


def cache_table(rows: list[Row]) -> list[str]:
    epochs = len(rows[0].hit)
    head = (["M nodes", "N ranks", "budget", "cache"] + [f"hit e{e}" for e in range(epochs)]
            + [f"ranks e{epochs - 1}", "held e0", f"held e{epochs - 1}", "remote"])
    lines = [_md_row(head), _md_row(["---"] * len(head))]
    for r in rows:
        lo, hi = r.rank_range
        lines.append(_md_row([str(r.nodes), str(r.per_node), f"{100 * r.budget:.0f}%", r.scheme]
                             + [_pct(h) for h in r.hit] + [_pct(lo) if _pct(lo) == _pct(hi) else f"{_pct(lo)}-{_pct(hi)}"]
                             + [f"{r.held[0]:.3f}", f"{r.held[-1]:.3f}"]
                             + [_pct(r.remote[-1]) if r.remote is not None else "—"]))
    return lines


def stats_table(stats: list[Stats], epochs: int) -> list[str]:
    head = ["M nodes", "N ranks", "global batch", "var DS", "var affine", "affine/DS", "theory DS",
            "theory affine", "node off, 1 epoch", f"node off, {epochs} epochs DS", f"... affine",
            "seen DS", "seen affine"]
    lines = [_md_row(head), _md_row(["---"] * len(head))]
    for s in stats:
        lines.append(_md_row([str(s.nodes), str(s.per_node), str(s.batch), f"{s.var_ds:.4f}", f"{s.var_affine:.4f}",
                              f"{s.var_affine / s.var_ds:.2f}", f"{s.theory_ds:.4f}", f"{s.theory_affine:.4f}",
                              f"{s.node_epoch:.3f}", f"{s.node_epoch / math.sqrt(epochs):.3f} ({s.node_all_ds:.3f})",
                              f"{s.node_epoch:.3f} ({s.node_all_affine:.3f})",
                              _pct(s.seen_ds), _pct(s.seen_affine)]))
    return lines


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000, help="samples in the dataset (default 10000)")
    p.add_argument("--nodes", type=_ints, default=[1, 2, 4, 8], help="M, comma-separated (default 1,2,4,8)")
    p.add_argument("--per-node", type=_ints, default=[2, 8], help="N ranks per node (default 2,8)")
    p.add_argument("--budgets", type=_floats, default=[1.0, 0.5, 0.25],
                   help="per-node cache budget, as a fraction of the dataset (default 1,0.5,0.25)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schemes", default=",".join(SCHEMES), help=f"a subset of {','.join(SCHEMES)}")
    p.add_argument("--no-stats", action="store_true", help="leave out the samplers' batch statistics")
    p.add_argument("--stats-epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=4, help="per-rank batch of the statistics (default 4)")
    p.add_argument("--markdown", metavar="PATH", help="also write the tables, headed by the command, to PATH")
    args = p.parse_args(argv)
    schemes = [s for s in args.schemes.split(",") if s]
    bad = [s for s in schemes if s not in SCHEMES]
    if bad or args.n < 1 or args.epochs < 1 or min(args.nodes + args.per_node) < 1 or \
            not all(0 < b <= 1 for b in args.budgets):
        print(f"node_cache_sim: error: schemes must be among {','.join(SCHEMES)}, n, epochs, nodes and "
              f"ranks >= 1, budgets in (0, 1]", file=sys.stderr)
        return 2
    rows = []
    for nodes in args.nodes:
        for per_node in args.per_node:
            print(f"simulating {nodes} node(s) x {per_node} rank(s) ...", file=sys.stderr, flush=True)
            rows += simulate(args.n, nodes, per_node, args.budgets, args.epochs, args.seed, schemes)
    command = "python benchmarks/node_cache_sim.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    today = datetime.date.today().isoformat()
    # tests/test_node_cache_sim.py reads the torch version, n, seed and epochs back from this sentence
    out = ["# Beyond one node: the simulation's tables", "",
           "Written by `benchmarks/node_cache_sim.py`. These tables are computed, not measured.",
           "[One node, many ranks](../node.md) says what they mean.", "",
           f"Made by `{command.strip()}` on",
           f"{today} with torch {torch.__version__}. The simulation uses a dataset of {args.n} equal-sized samples,",
           f"seed {args.seed}, {args.epochs} epochs.", "",
           "## Cache hit rate and memory per node", "",
           "Each *hit* cell is the hit rate of every fetch in one epoch; e0 fills the cache. The other",
           "columns:", "",
           "- *ranks*: the lowest and the highest rank's hit rate in the last epoch.",
           "- *held*: the most any node's cache(s) hold after the epoch, in datasets. For private caches,",
           "  it is their sum.",
           "- *remote*: the share of the store's hits that another node served.", "",
           "The caches:", ""]
    out += [f"- *{s}*: {SCHEME_WORDS[s]}." for s in schemes] + [""]
    out += cache_table(rows)
    if not args.no_stats:
        print("batch statistics ...", file=sys.stderr, flush=True)
        stats = [batch_stats(args.n, m, k, args.batch_size, args.stats_epochs, seed=args.seed)
                 for m in args.nodes if m > 1 for k in args.per_node]
        if stats:
            out += ["", "## The samplers' batches", "",
                    f"The samplers' batches over {args.stats_epochs} epochs of a class-sorted dataset: 10 classes, "
                    "label = class, as",
                    f"an ImageFolder. The per-rank batch is {args.batch_size}. *DS* is DistributedSampler. "
                    "The columns:", "",
                    "- *var*: the variance over steps of the global batch's mean label, measured.",
                    "- *theory*: its closed form. For DS, that of a simple random sample without replacement. For",
                    "  affine, that of a sample stratified over the sampler's partition (seed's partition).",
                    "- *node off*: the RMS difference between one node's mean label and the dataset's (4.5).",
                    "  - *1 epoch*: the closed form, the same for either sampler.",
                    f"  - *{args.stats_epochs} epochs*: the closed form, with the measured figure in brackets. "
                    "Under DS, each epoch",
                    "    gives a node a fresh random 1/M, so the difference shrinks as 1/sqrt(epochs). It is measured",
                    "    over the M nodes of the run. Under the affine sampler, a node always gets its own part. It",
                    "    is measured over 20 partition seeds.",
                    "- *seen*: the share of the dataset one node has seen by the end.", ""]
            out += stats_table(stats, args.stats_epochs)
    text = "\n".join(out) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
