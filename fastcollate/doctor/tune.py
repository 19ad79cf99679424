"""tune_loader: pick DataLoader settings by measurement, inside a time budget -- whole epochs with
the loader's start-up, alternating rounds, the spread reported, and a difference inside the
spread never called a win.

The grid is num_workers x prefetch_factor x the loader: torch's DataLoader with default_collate,
with fastcollate.collate, and fastcollate.DataLoader (the ring). Every worker count asked for is
measured, more than the usable cores included (workers whose fetches wait on I/O overlap beyond
the cores); such rows are marked. Every setting runs once per round, the order reversed each round; later rounds
keep only the settings still in reach of the fastest (their ranges overlap), so the budget goes
where the answer is still open. fastcollate.doctor predicts instead of sweeping: use it to
find the fix; use this to check a grid you care about.
"""
from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from typing import Any, Callable, Sequence

from torch.utils.data import DataLoader, Dataset

from .._text import table_rule
from ..core.collator import collate as fast_collate, usable_cores
from ..tuning import measure
from ..tuning.memory import worker_pids

LOADERS = ("torch", "torch+fastcollate", "fastcollate")
# what each kind of loader is, in words (a collate_fn of the user's replaces default_collate)
LOADER_NAMES = {"torch": "torch's DataLoader with default_collate",
                "torch+fastcollate": "torch's DataLoader with fastcollate.collate",
                "fastcollate": "fastcollate.DataLoader"}
# worker counts beyond this many per usable core are refused: processes that only contend
MAX_WORKERS_PER_CORE = 8


@dataclasses.dataclass
class TuneResult:
    best: dict[str, Any]      # DataLoader keyword arguments of the chosen setting (batch_size aside)
    table: list[dict[str, Any]]
    loader_kind: str = "torch"  # "torch" (torch.utils.data.DataLoader) or "fastcollate" (fastcollate.DataLoader)
    tied: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # rows within the spread of the fastest
    batch_size: int = 1
    rounds: int = 0  # rounds the chosen setting was measured
    kind: str = ""  # the chosen loader among LOADERS ("" in results made before it was recorded: from loader_kind)
    cores: int = 0  # the usable cores (this rank's share of the node's) the rows with more workers are marked against
    node: dict[str, Any] = dataclasses.field(default_factory=dict)  # fastcollate.tuning.node.NodeShare, as a dict

    def loader(self, dataset: Any, **overrides: Any) -> Any:
        """A loader over ``dataset`` with the chosen settings."""
        from ..loader.dataloader import DataLoader as RingLoader

        cls = RingLoader if self.loader_kind == "fastcollate" else DataLoader
        return cls(dataset, **{"batch_size": self.batch_size, **self.best, **overrides})

    def format(self) -> str:
        head = (f"| {'workers':>7} | {'prefetch':>8} | {'loader':<17} | {'samples/s':>9} | {'spread':>15} | "
                f"{'rounds':>6} | {'peak RSS MB':>11} | status |")
        lines = [head, table_rule(head)]
        for r in self.table:
            sps = f"{r['samples_per_s']:9.0f}" if r["samples_per_s"] else " " * 9
            spread = f"{r['min']:.0f}-{r['max']:.0f}" if r["rounds"] else ""
            rss = f"{r['peak_rss_mb']:11.0f}" if r["peak_rss_mb"] else " " * 11
            note = "; " + r["note"] if r.get("note") else ""
            lines.append(f"| {r['num_workers']:>7} | {str(r['prefetch_factor']):>8} | {r['loader']:<17} | {sps} | "
                         f"{spread:>15} | {r['rounds']:>6} | {rss} | {r['status']}{note} |")
        return "\n".join(lines)

    def loader_name(self) -> str:
        """The chosen loader in words: torch's DataLoader with default_collate (or with your
        collate_fn) or with fastcollate.collate, or fastcollate.DataLoader."""
        kind = self.kind or ("fastcollate" if self.loader_kind == "fastcollate" else "torch")
        if kind == "torch" and self.best.get("collate_fn") not in (None, fast_collate):
            return "torch's DataLoader with your collate_fn"
        return LOADER_NAMES[kind]

    def verdict(self) -> str:
        top = self.best
        name = f"{self.loader_name()}, num_workers={top.get('num_workers')}"
        if top.get("num_workers", 0) > self.cores > 0:
            name += f" (more workers than the {self.cores} usable cores)"
        if self.node.get("ranks", 1) > 1:
            # every rank of the node runs its loader at once: the rows were planned for this rank's share
            name += (f" -- per rank, for {self.node['ranks']} ranks on this node (this one's share: "
                     f"{self.cores} cores; measured alone, so run it beside the others to confirm)")
        measured = [r for r in self.table if r.get("samples_per_s")]
        if self.table and len(measured) == 1:
            failed = sum(r["status"].startswith("error") for r in self.table)
            unrun = len(self.table) - 1 - failed
            rest = "".join(f"; {n} other setting{'s' if n > 1 else ''} {what}" for n, what in
                           ((failed, "failed (see the table)"), (unrun, "did not fit the budget: raise budget_s"))
                           if n)
            return f"best: {name} -- the only setting measured, so nothing was compared with it{rest}"
        if len(self.tied) > 1:
            others = ", ".join(f"{r['loader']}/{r['num_workers']}w/pf{r['prefetch_factor']}" for r in self.tied[1:4])
            how = ("within 10% of each other in the one round the budget allowed" if self.rounds < 2
                   else "tied within the spread")
            return (f"best: {name} -- {how} with {others}: the fastest median is not a win over "
                    "them; the one with the fewest workers is chosen")
        if self.rounds < 2:
            return (f"best: {name} (ahead of every other setting by more than 10% in the one round the budget "
                    "allowed; raise budget_s for a spread)")
        return f"best: {name} (faster than every other setting in every round)"

    def to_dict(self) -> dict[str, Any]:
        best = {k: (("fastcollate.collate" if v is fast_collate else repr(v)) if callable(v) else v)
                for k, v in self.best.items()}
        return {"best": best, "loader": self.loader_kind, "kind": self.kind, "loader_name": self.loader_name(),
                "usable_cores": self.cores, "node": self.node, "table": self.table, "tied": self.tied}


def _candidates(num_workers: Sequence[int] | None, cores: int) -> list[int]:
    """The worker counts to measure: all of those asked for (refusing only counts no machine runs
    well, beyond MAX_WORKERS_PER_CORE per core); by default 0, 1, 2, 4, 8... up to twice the usable
    cores. Beyond the cores, workers pay only while their fetches wait (files, network, decoding
    that releases the GIL in another process): twice the cores is where such datasets usually stop
    gaining, and a CPU-bound dataset shows its loss there at the cost of one more row."""
    if num_workers is None:
        return sorted({w for w in (0, 1, 2, 4, 8, 16, 32, 64) if w <= 2 * cores} | {cores, 2 * cores})
    limit = max(MAX_WORKERS_PER_CORE * cores, 16)
    too_many = [w for w in num_workers if w > limit]
    if too_many:
        raise ValueError(f"tune_loader: {too_many[0]} workers on {cores} usable cores is more than "
                         f"{MAX_WORKERS_PER_CORE} a core (at most {limit} here)")
    return sorted(set(num_workers))


def _kwargs(loader: str, w: int, pf: int | None, collate_fn: Callable | None, shuffle: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"num_workers": w, "shuffle": shuffle}
    if w:
        kw.update(prefetch_factor=pf, persistent_workers=False)
    if loader == "torch+fastcollate":
        kw["collate_fn"] = fast_collate
    elif collate_fn is not None:
        kw["collate_fn"] = collate_fn
    return kw


def tune_loader(dataset: Dataset, batch_size: int, *, collate_fn: Callable | None = None,
                budget_s: float = 60.0, num_workers: Sequence[int] | None = None,
                prefetch_factors: Sequence[int] = (2, 4), pin_memory: Sequence[bool] | None = None,
                compare_default: bool = True, loaders: Sequence[str] | None = None, epochs: int = 1,
                progress: bool = True, shuffle: bool = False, warmup_batches: int | None = None,
                ranks: int | None = None) -> TuneResult:
    """Measure num_workers x prefetch_factor x loader (torch's with default_collate or
    fastcollate.collate, fastcollate.DataLoader), each setting for ``epochs`` whole epochs of a
    new loader, in alternating rounds within ``budget_s``; report samples/s with its spread and
    the peak RSS, and choose the fastest -- or, when the fastest is inside another setting's
    spread, the one of those with the fewest workers.

    ``collate_fn``: your own collate (then only torch's loader with it is measured).
    ``ranks``: the processes of your job on this node (default: ``LOCAL_WORLD_SIZE`` under
    torchrun), which share its cores: the default grid and the rows marked "more workers than
    the cores" use this rank's share (fastcollate.tuning.node), and the verdict says so.
    ``res.loader(dataset)`` makes the chosen loader; ``res.best`` holds its keyword arguments.

    >>> import torch, fastcollate
    >>> ds = [torch.zeros(4) for _ in range(64)]
    >>> res = fastcollate.tune_loader(ds, 8, budget_s=4, num_workers=[0], progress=False)
    >>> res.best["num_workers"]
    0
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"tune_loader: batch_size must be >= 1, got {batch_size}")
    if budget_s <= 0:
        raise ValueError(f"tune_loader: budget_s must be > 0, got {budget_s}")
    if epochs < 1:
        raise ValueError(f"tune_loader: epochs must be >= 1, got {epochs}")
    from ..tuning import node as node_share

    if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1):
        raise ValueError(f"tune_loader: ranks must be an int >= 1, got {ranks!r}")
    share = node_share.share(ranks=ranks)
    cores = min(usable_cores(), share.cores)
    workers = _candidates(num_workers, cores)
    if not workers or workers[0] < 0:
        raise ValueError(f"tune_loader: num_workers must list counts >= 0, got {num_workers!r}")
    kinds = list(loaders) if loaders is not None else (
        ["torch"] if collate_fn is not None else (list(LOADERS) if compare_default else ["torch+fastcollate", "fastcollate"]))
    bad = [k for k in kinds if k not in LOADERS]
    if bad:
        raise ValueError(f"tune_loader: loaders must be among {LOADERS}, got {bad}")
    pins = list(pin_memory) if pin_memory is not None else [False]
    configs = []
    for kind in kinds:
        for w in workers:
            for pf in (prefetch_factors if w else [None]):
                for pin in pins:
                    configs.append((kind, w, pf, pin))
    from ..loader.dataloader import DataLoader as RingLoader

    def factory(cfg: tuple) -> Callable[[], Any]:
        kind, w, pf, pin = cfg
        cls = RingLoader if kind == "fastcollate" else DataLoader
        return lambda: cls(dataset, batch_size=batch_size, pin_memory=pin, **_kwargs(kind, w, pf, collate_fn, shuffle))

    arms = {cfg: measure.Arm(str(cfg)) for cfg in configs}
    status = {cfg: "ok" for cfg in configs}
    first_error: BaseException | None = None
    peak = {cfg: 0.0 for cfg in configs}
    deadline = time.monotonic() + budget_s
    alive = list(configs)
    rounds = 0
    while alive and time.monotonic() < deadline:
        order = alive if rounds % 2 == 0 else alive[::-1]
        for i, cfg in enumerate(order):
            if time.monotonic() >= deadline:
                break
            if progress:
                bar = "#" * int(20 * i / max(1, len(order)))
                print(f"\rtune round {rounds + 1} [{bar:<20}] {i}/{len(order)} {cfg[0]} workers={cfg[1]} "
                      f"prefetch={cfg[2]}   ", end="", file=sys.stderr, flush=True)
            try:
                def watch(loader: Any, batch: Any, cfg: tuple = cfg) -> None:
                    it = getattr(loader, "_iterator", None)
                    peak[cfg] = max(peak[cfg], _rss_mb(worker_pids(it) if it is not None else []))
                with warnings.catch_warnings():
                    # torch warns at every loader with more workers than cores: the table marks those rows
                    warnings.filterwarnings("ignore", message=".*worker processes in total", category=UserWarning)
                    arms[cfg].runs.append(measure.run_epochs(factory(cfg), epochs, on_batch=_every(8, watch)))
            except Exception as exc:  # a setting that cannot run is a row, not the end of the sweep
                status[cfg] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:120]
                if first_error is None:
                    first_error = exc
        rounds += 1
        alive = [c for c in alive if status[c] == "ok" and arms[c].runs]
        if rounds >= 2 and alive:
            top = max(alive, key=lambda c: arms[c].median)
            # keep only what is still in reach of the fastest: ranges that overlap its range
            alive = [c for c in alive if c == top or arms[c].spread()["max"] >= arms[top].spread()["min"]]
            if len(alive) == 1 or rounds >= 5:
                break
    if progress:
        print(f"\rtune: {rounds} round(s) done{' ' * 60}", file=sys.stderr, flush=True)
    table = []
    for cfg in configs:
        kind, w, pf, pin = cfg
        sp = arms[cfg].spread()
        st = status[cfg] if arms[cfg].runs or status[cfg] != "ok" else "skipped (budget)"
        table.append({"loader": kind, "num_workers": w, "prefetch_factor": pf, "pin_memory": pin,
                      "samples_per_s": arms[cfg].median, "min": sp["min"], "max": sp["max"], "rounds": sp["rounds"],
                      "peak_rss_mb": peak[cfg], "status": st,
                      "note": f"more workers than the {cores} usable cores" if w > cores else ""})
    measured = [r for r, cfg in zip(table, configs) if r["samples_per_s"] > 0]
    if not measured:
        if first_error is not None:
            raise first_error  # every setting that ran failed: the dataset's (or loader's) own error, as raised
        raise RuntimeError(f"tune_loader: no setting finished a measured run within budget_s={budget_s:g} s; "
                           "raise budget_s")
    pick, tied = choose(measured)
    best = _kwargs(pick["loader"], pick["num_workers"], pick["prefetch_factor"], collate_fn, shuffle)
    best["pin_memory"] = pick["pin_memory"]
    best.pop("shuffle", None)
    if shuffle:
        best["shuffle"] = True
    return TuneResult(best=best, table=table, loader_kind="fastcollate" if pick["loader"] == "fastcollate" else "torch",
                      tied=tied if len(tied) > 1 else [], batch_size=batch_size, rounds=pick["rounds"],
                      kind=pick["loader"], cores=cores, node=share.to_dict())


def choose(measured: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The setting to pick among measured rows, and the rows tied with the fastest: a setting whose
    range over its rounds reaches the fastest one's is not beaten by it; a row of one round has no
    range, and one round tells apart only differences beyond measure.CLEAR_MARGIN. Among tied
    rows, the one with the fewest workers (the cheapest) is chosen."""
    top = max(measured, key=lambda r: r["samples_per_s"])
    tied = sorted([r for r in measured if r["max"] >= top["min"]
                   or (min(r["rounds"], top["rounds"]) < 2
                       and r["samples_per_s"] * measure.CLEAR_MARGIN >= top["samples_per_s"])],
                  key=lambda r: -r["samples_per_s"])
    pick = min(tied, key=lambda r: (r["num_workers"], -r["samples_per_s"])) if len(tied) > 1 else top
    return pick, tied


def _every(n: int, fn: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    count = [0]

    def call(loader: Any, batch: Any) -> None:
        count[0] += 1
        if count[0] % n == 1:
            fn(loader, batch)
    return call


def _rss_mb(pids: Sequence[int]) -> float:
    import os

    total = 0
    for pid in [os.getpid(), *pids]:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            pass
    return total / 2**20


__all__ = ["TuneResult", "tune_loader", "LOADERS", "LOADER_NAMES"]
