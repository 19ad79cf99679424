"""Measuring loaders the way a user meets them: whole epochs, the loader's creation and its first
batch included, several settings side by side in alternating order, repeated until the spread
is known -- and a difference inside the spread is not called a win.

Used by fastcollate.doctor (the user's settings against the predicted best) and tune_loader
(a grid). On a shared or busy machine one run of each setting says little: a run's speed moves
with everything else the machine does, so every setting runs once per round, the order flips
each round (whoever goes first does not always pay the cold caches), and a setting is compared
with another round by round (paired ratios).
"""
from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from typing import Any, Callable, Iterable

import torch


def batch_len(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor of >= 1 dimension (1 if none)."""
    stack = [batch]
    while stack:
        x = stack.pop(0)
        if isinstance(x, torch.Tensor):
            if x.dim() > 0:
                return int(x.shape[0])
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            if x and not isinstance(x[0], (torch.Tensor, dict, list, tuple)):
                return len(x)  # a list of strings, say
            stack.extend(x)
    return 1


@dataclasses.dataclass
class Run:
    """One measured run: ``epochs`` whole epochs of a new loader."""

    samples: int
    batches: int
    wall_s: float
    epoch_s: list[float]
    first_batch_s: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0


MIN_RUN_S = 0.2  # a run shorter than this is repeated (a new loader each time) until it is not:
#                 long enough for a difference of 3x to be decided in one round (MIN_DECISIVE_S)


def run_epochs(make_loader: Callable[[], Iterable], epochs: int, step: Callable[[Any], Any] | None = None,
               on_batch: Callable[[Any, Any], None] | None = None, min_s: float = MIN_RUN_S,
               max_batches: int | None = None, charge_s: list[float] | None = None) -> Run:
    """``epochs`` epochs of ``make_loader()`` (made inside the timing), ``step(batch)`` after each
    batch; ``on_batch(loader, batch)`` is called untimed-ish (for memory samples). The loader is
    dropped (its workers joined) inside the timing too: a user pays that as well.

    A run of a few milliseconds (a cheap dataset) is at the mercy of one preemption: it is made
    again, new loader and all, until the runs add up to ``min_s``; the rate is over all of them,
    ``epoch_s`` and ``first_batch_s`` are the first one's. ``max_batches``: each epoch stops after
    that many batches (a time budget too small for whole epochs). ``charge_s``: seconds added to
    each epoch (by position) -- worker start-ups measured once elsewhere, where ``make_loader``
    hands back a loader whose workers were started before (a spawn context's start-up is seconds:
    paid in every round, it would be most of a measurement's time)."""
    gc.collect()
    samples = batches = 0
    epoch_s: list[float] = []
    first = None
    wall = 0.0
    while True:
        t0 = time.perf_counter()
        loader = make_loader()
        for _ in range(epochs):
            e0 = time.perf_counter()
            for k, batch in enumerate(loader):
                if first is None:
                    first = time.perf_counter() - t0
                if step is not None:
                    step(batch)
                samples += batch_len(batch)
                batches += 1
                if on_batch is not None:
                    on_batch(loader, batch)
                del batch
                if max_batches is not None and k + 1 >= max_batches:
                    break
            if len(epoch_s) < epochs:
                epoch_s.append(time.perf_counter() - e0 + (charge_s[len(epoch_s)] if charge_s else 0.0))
        del loader
        wall += time.perf_counter() - t0 + (sum(charge_s[:epochs]) if charge_s else 0.0)
        if wall >= min_s or batches == 0:
            return Run(samples, batches, wall, epoch_s, first or 0.0)


@dataclasses.dataclass
class Arm:
    """One setting's runs, round by round."""

    name: str
    runs: list[Run] = dataclasses.field(default_factory=list)

    @property
    def rates(self) -> list[float]:
        return [r.samples_per_s for r in self.runs]

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.runs else 0.0

    def spread(self) -> dict[str, float]:
        """min, max and the relative half-range of samples/s over the rounds."""
        rates = self.rates
        if not rates:
            return {"min": 0.0, "max": 0.0, "relative": 0.0, "rounds": 0}
        med = statistics.median(rates)
        return {"min": min(rates), "max": max(rates), "relative": (max(rates) - min(rates)) / (2 * med) if med else 0.0,
                "rounds": len(rates)}

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.runs)


def paired(base: Arm, other: Arm) -> dict[str, Any]:
    """other / base, round by round: the median ratio, its range, and whether ``other`` is a win
    (faster in every round) or a loss (slower in every round); otherwise the two are tied.

    Two settings that are the same win every one of n rounds by chance 1 in 2**n: 1 in 4 for two
    rounds. So a side wins in two rounds only by a clear margin (every round >= CLEAR_MARGIN);
    a smaller difference must hold over three rounds at least (1 in 8) -- else it is a tie."""
    ratios = [o.samples_per_s / b.samples_per_s for b, o in zip(base.runs, other.runs) if b.samples_per_s > 0]
    if not ratios:
        return {"ratio": 1.0, "min": 1.0, "max": 1.0, "win": False, "loss": False, "rounds": 0}
    # one round decides only a difference no run-to-run noise comes near (3x, runs of 0.2 s or
    # more: a preemption can double a run of a few milliseconds); otherwise every round of at
    # least two must agree
    long_enough = all(r.wall_s >= MIN_DECISIVE_S for r in base.runs[:1] + other.runs[:1])
    lo, hi = min(ratios), max(ratios)
    if len(ratios) >= 3:
        win, loss = lo > 1.0, hi < 1.0
    elif len(ratios) == 2:
        win, loss = lo >= CLEAR_MARGIN, hi <= 1 / CLEAR_MARGIN
    else:
        win = long_enough and lo >= OVERWHELMING
        loss = long_enough and hi <= 1 / OVERWHELMING
    return {"ratio": statistics.median(ratios), "min": lo, "max": hi, "win": win, "loss": loss, "rounds": len(ratios)}


CLEAR_MARGIN = 1.10  # two rounds decide a difference only when each round shows at least this
OVERWHELMING = 3.0  # a paired ratio past this (or under its inverse) is decided in one round
MIN_DECISIVE_S = MIN_RUN_S  # a run this long (repeated up to it if need be) can decide one round


def compare(arms: dict[str, Callable[[], Iterable]], epochs: int, step: Callable[[Any], Any] | None = None,
            base: str | None = None, min_rounds: int = 2, max_rounds: int = 5, budget_s: float | None = None,
            progress: Callable[[str], None] | None = None, decide_early: bool = True,
            max_batches: int | None = None, fill: bool = False,
            charge_s: dict[str, list[float]] | None = None) -> dict[str, Arm]:
    """Each arm (name -> loader factory) for ``epochs`` whole epochs per round, in alternating
    order, for at least ``min_rounds`` rounds and more (up to ``max_rounds``, inside
    ``budget_s``) while some arm's paired ratio against ``base`` is still undecided (rounds that
    disagree on which side of 1 it is) -- or, with ``fill``, as long as ``budget_s`` allows
    another round (more rounds: a firmer spread). ``max_batches``: of each epoch; ``charge_s``:
    an arm's start-ups charged per epoch (both as in run_epochs)."""
    names = list(arms)
    out = {n: Arm(n) for n in names}
    t0 = time.monotonic()
    for r in range(max_rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            if progress is not None:
                progress(f"round {r + 1}: {name}")
            out[name].runs.append(run_epochs(arms[name], epochs, step, max_batches=max_batches,
                                             charge_s=(charge_s or {}).get(name)))
        done = r + 1
        if done < min_rounds and not (decide_early and base is not None and base in out and len(names) > 1
                                      and all(paired(out[base], out[n])["win"] or paired(out[base], out[n])["loss"]
                                              for n in names if n != base)):
            continue
        elapsed = time.monotonic() - t0
        # the next round would end past the budget (filling it, a tenth over is closer than a round under)
        if budget_s is not None and elapsed / done * (done + 1) > budget_s * (1.1 if fill else 1.0):
            break
        if fill and budget_s is not None:
            continue
        if base is None or base not in out:
            break
        undecided = [n for n in names if n != base and not (paired(out[base], out[n])["win"]
                                                            or paired(out[base], out[n])["loss"])]
        if not undecided:
            break
        # a ratio within a few percent of 1 is a tie however many rounds it gets: stop there too
        if all(abs(paired(out[base], out[n])["ratio"] - 1.0) < 0.03 for n in undecided):
            break
    return out
