"""The auto mode's decision (``fastcollate.DataLoader(num_workers="auto")``): from the measurements
of the epoch that just ended, the setting of the next one. Pure: nothing runs here, so every
decision is tested on made-up measurements (tests/test_auto.py); fastcollate.loader.autotune measures
and applies.

Hill-climbing with the doctor's model (fastcollate.tuning.model): the measured epoch becomes a
Profile (each batch's time in a worker, its CPU and its waiting, the main process's CPU per batch,
the worker start-up, the step, the slow batches), the model predicts every allowed setting --
corrected by how far its prediction for the epoch just measured was from the measurement -- and
the best one is tried when it is predicted to gain at least MIN_GAIN over what was measured. The next epoch
measures it: a change that measured a loss is reverted (and never tried again); one that held is
kept and the climb goes on from it. When no untried setting is predicted to gain MIN_GAIN the
loader settles and stops exploring -- a loop that is already fine is left alone after its first
epoch. What is allowed: workers within this rank's share of the node's cores (more only where the
fetches mostly wait, as the doctor allows: fastcollate.tuning.model.worker_counts), and within a
memory budget (each worker's private memory and the batches it holds in flight, at most
MEMORY_FRACTION of the rank's memory share).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from . import model

MIN_GAIN = 1.10        # a change is tried only when predicted to gain at least this
CLOSE = 0.97           # settings predicted within 3% of the best: the cheapest of them is taken
CALIBRATION_LIMIT = 4.0  # the model's measured/predicted ratio is trusted within 1/4x-4x
MIN_BATCHES = 8        # an epoch that delivered fewer decides nothing
MAX_REVERTS = 3        # after this many changes that measured a loss, the loader settles
MEMORY_FRACTION = 0.5  # of the rank's memory share, what the workers may plan with
PREFETCH = (2, 4, 8)
OTHERS_COUNT = 0.5     # other processes' busy cores below this are noise, not a core taken
UNMEASURED_WORKER_MB = 64.0  # a worker's private memory before one has been measured
RECEIVE_S = 100e-6     # the main process's work a batch from a worker, before it is measured
START_S = 0.05         # a forked worker's start-up, before it is measured
REPLAY = 1024          # batches of an epoch the model plays out (a longer epoch: its start-up scaled down)
_MB = float(1 << 20)


@dataclasses.dataclass(frozen=True)
class Choice:
    """A setting the auto mode runs: ``workers`` processes, each with at most ``prefetch``
    batches outstanding (0 with no workers: torch's ``prefetch_factor=None``)."""

    workers: int
    prefetch: int = 2

    def __post_init__(self) -> None:
        if self.workers == 0 and self.prefetch:
            object.__setattr__(self, "prefetch", 0)

    def __str__(self) -> str:
        return f"num_workers {self.workers}" + (f", prefetch_factor {self.prefetch}" if self.workers else "")

    @property
    def prefetch_factor(self) -> int | None:
        return self.prefetch if self.workers else None


def transition(a: Choice, b: Choice) -> str:
    """``a -> b`` in words, each changed field with its arrow."""
    if a.workers != b.workers:
        out = f"num_workers {a.workers} -> {b.workers}"
        if b.workers and a.workers and a.prefetch != b.prefetch:
            return out + f", prefetch_factor {a.prefetch} -> {b.prefetch}"
        return out + (f" (prefetch_factor {b.prefetch})" if b.workers else "")
    return f"prefetch_factor {a.prefetch} -> {b.prefetch} (num_workers {a.workers})"


@dataclasses.dataclass
class EpochMeasure:
    """What one epoch measured (fastcollate.loader.autotune fills it; tests make it up). Times are
    sums over the epoch, in seconds.

    The consumer's side: ``wait_s`` inside ``next()``, ``step_s`` between batches (the loop's own
    work), ``main_cpu_s`` the consuming thread's CPU inside ``next()`` (with no workers: the
    fetch and the collate too), ``main_blocked_s`` of ``next()``'s time off the CPU the part it
    blocked on its own (I/O, sleeps: with no workers the fetch's waiting), ``process_cpu_s`` the
    main process's CPU over the epoch (every thread: the step's too), ``first_s`` from the
    epoch's start to its first batch (worker start-up included when ``started``).

    The workers' side (the sums over workers of this epoch's fetches; in the main process with no
    workers): ``fetch_s`` and ``collate_s`` wall time, ``fetch_cpu_s`` the fetching thread's CPU
    (collate included), ``fetch_blocked_s`` the time it blocked on its own, ``worker_cpu_s`` the
    workers' process CPU (sending included), ``worker_batches`` the batches they made, and
    ``worker_mb`` the largest private memory of a worker. ``others_busy``: the cores that other
    processes kept busy meanwhile (the kernel's busy time less this loop's). ``spikes``: the batches
    that took several times the typical one (rare slow samples, which deeper prefetching hides) and
    ``spike_s`` their excess, in all. ``first_make_s``: the first batch's own time in the worker
    that made it (a slow sample in it is not the pool's start-up)."""

    epoch: int
    choice: Choice
    batches: int
    samples: int
    wall_s: float
    wait_s: float = 0.0
    step_s: float = 0.0
    main_cpu_s: float = 0.0
    main_blocked_s: float = 0.0
    process_cpu_s: float = 0.0
    first_s: float = 0.0
    started: bool = False
    whole: bool = True
    worker_batches: int = 0
    fetch_s: float = 0.0
    collate_s: float = 0.0
    fetch_cpu_s: float = 0.0
    fetch_blocked_s: float = 0.0
    worker_cpu_s: float = 0.0
    worker_mb: float = 0.0
    batch_bytes: int = 0
    others_busy: float = 0.0  # cores other processes kept busy meanwhile (the machine's, not this loop's)
    spikes: int = 0           # batches that took far longer than the others (rare slow samples)...
    spike_s: float = 0.0      # ... and their time beyond a typical batch, in all
    first_make_s: float = 0.0  # the epoch's first batch's own time in its worker (0: not measured)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    def steady_rate(self) -> float:
        """Samples/s after the first batch: what persistent workers give once started (a restart's
        start-up is paid once, not every epoch)."""
        if self.batches < 2 or self.wall_s <= self.first_s:
            return self.samples_per_s
        return self.samples * (self.batches - 1) / self.batches / (self.wall_s - self.first_s)

    @property
    def wait_share(self) -> float:
        busy = self.wait_s + self.step_s
        return self.wait_s / busy if busy > 0 else 0.0

    def per_batch(self) -> dict[str, float]:
        """Seconds a batch: fetch, collate, step, worker CPU, and the fetches' waiting share."""
        made = max(1, self.worker_batches)
        cpu, blocked = self.fetch_cpu_s, self.fetch_blocked_s
        return {"fetch": self.fetch_s / made, "collate": self.collate_s / made,
                "step": self.step_s / max(1, self.batches),
                "cpu": (self.worker_cpu_s or self.fetch_cpu_s) / made,
                "waiting": blocked / (cpu + blocked) if cpu + blocked > 0 else 0.0}

    def evidence(self) -> str:
        """The measured rates, in words (a log line's middle)."""
        p = self.per_batch()
        others = f"; other processes kept {self.others_busy:.1f} cores busy" if self.others_busy >= OTHERS_COUNT else ""
        return (f"measured {self.samples_per_s:,.0f} samples/s over {self.batches} batches, the loop waited "
                f"{self.wait_share:.0%} of its time; a batch: fetch {1e3 * p['fetch']:.2f} ms, collate "
                f"{1e3 * p['collate']:.2f} ms, step {1e3 * p['step']:.2f} ms, "
                f"{'worker' if self.choice.workers else 'main-process'} CPU {1e3 * p['cpu']:.2f} ms "
                f"(fetches {p['waiting']:.0%} waiting){others}")


@dataclasses.dataclass(frozen=True)
class Budget:
    """What this rank may plan with: ``cores`` and ``memory_bytes`` of its share of the node
    (fastcollate.tuning.node.share)."""

    cores: int
    memory_bytes: int
    words: str = ""
    affinity: int = 0  # the cores this process may run on (0: as many as ``cores``)

    @classmethod
    def of(cls, share: Any) -> "Budget":
        from .node import affinity_cores

        return cls(cores=max(1, int(share.cores)), memory_bytes=int(share.memory_bytes),
                   words=f"{share.describe()}, {share.memory_bytes / 2**30:.1f} GiB" if share.ranks <= 1
                   else share.describe(), affinity=affinity_cores())

    def planned(self, others_busy: float) -> int:
        """The cores to plan with while other processes keep ``others_busy`` cores busy: the share,
        less what they leave of this process's cores (as the doctor plans)."""
        if others_busy < OTHERS_COUNT:
            return self.cores
        return max(1, min(self.cores, int((self.affinity or self.cores) - others_busy + 0.5)))


@dataclasses.dataclass
class Limits:
    """What the auto mode may change. ``workers``: tune num_workers (else it stays
    ``start.workers``); ``prefetch``: tune prefetch_factor; ``min_workers``: 1 with a
    worker_init_fn (loading in the main process would never run it); ``persistent``: the user's
    persistent_workers (compare steady rates: a restart's start-up is paid once)."""

    workers: bool = True
    prefetch: bool = True
    min_workers: int = 0
    persistent: bool = False
    batches_per_epoch: int | None = None
    prefetch_value: int = 2  # the prefetch_factor when it is not tuned (the user's)


@dataclasses.dataclass
class Record:
    """One decision, made at the start of epoch ``epoch + 1`` from epoch ``epoch``'s measurements
    (``epoch`` -1: the start, nothing measured). ``action``: "start", "change", "revert" or
    "keep". ``str(record)`` is its log line."""

    epoch: int
    action: str
    before: Choice
    after: Choice
    reason: str
    measured: EpochMeasure | None = None
    predicted: float | None = None          # samples/s predicted for ``after``
    predicted_before: float | None = None   # ... and for ``before``, from the same profile
    settled: bool = False

    def __str__(self) -> str:
        head = "fastcollate auto: "
        if self.action == "start":
            return f"{head}epoch 0 starts with {self.after}: {self.reason}"
        when = f"after epoch {self.epoch}: "
        evidence = f"{self.measured.evidence()}; " if self.measured is not None else ""
        if self.action == "keep":
            return f"{head}{when}keep {self.after}: {evidence}{self.reason}"
        return f"{head}{when}{self.action} {transition(self.before, self.after)}: {evidence}{self.reason}"

    def to_dict(self) -> dict[str, Any]:
        out = {"epoch": self.epoch, "action": self.action, "from": str(self.before), "to": str(self.after),
               "reason": self.reason, "predicted": self.predicted, "predicted_before": self.predicted_before,
               "settled": self.settled}
        if self.measured is not None:
            out.update(samples_per_s=self.measured.samples_per_s, wait_share=self.measured.wait_share,
                       **{f"{k}_s" if k != "waiting" else k: v for k, v in self.measured.per_batch().items()})
        return out


@dataclasses.dataclass
class State:
    """The climb so far: the setting now, what each setting measured, the change being judged."""

    current: Choice
    limits: Limits
    measured: dict[Choice, float] = dataclasses.field(default_factory=dict)  # the comparable rate, latest
    tabu: set[Choice] = dataclasses.field(default_factory=set)               # measured a loss
    # the directions a loss closed: ("workers", n, +1) rules out n workers and more, -1 n and fewer;
    # ("prefetch", w, p, +1) likewise for prefetch at w workers
    closed: list[tuple] = dataclasses.field(default_factory=list)
    pending: tuple[Choice, float, float] | None = None  # (from, its measured rate, predicted rate of current)
    settled: bool = False
    reverts: int = 0
    with_workers: EpochMeasure | None = None   # the latest epoch with workers
    in_main: EpochMeasure | None = None        # the latest epoch without
    start: tuple[float, int] | None = None     # the latest worker start-up measured (seconds, workers)
    # measured / predicted samples/s of the latest epoch with workers (True) and without (False):
    # the model's error for that way of loading, which its other predictions are corrected by
    calibration: dict[bool, float] = dataclasses.field(default_factory=dict)
    worker_mb: float = 0.0                     # the largest private memory a worker has had
    batch_bytes: int = 0

    def rate(self, m: EpochMeasure) -> float:
        return m.steady_rate() if self.limits.persistent else m.samples_per_s

    def close(self, before: Choice, tried: Choice) -> None:
        """``tried`` measured a loss against ``before``: the step and any further in its direction
        are not taken again (a smaller step the same way still may be)."""
        self.tabu.add(tried)
        if tried.workers != before.workers:
            self.closed.append(("workers", tried.workers, 1 if tried.workers > before.workers else -1))
        else:
            self.closed.append(("prefetch", tried.workers, tried.prefetch, 1 if tried.prefetch > before.prefetch else -1))

    def is_closed(self, c: Choice) -> bool:
        if c in self.tabu:
            return True
        for rule in self.closed:
            if rule[0] == "workers" and (c.workers - rule[1]) * rule[2] >= 0:
                return True
            if rule[0] == "prefetch" and c.workers == rule[1] and (c.prefetch - rule[2]) * rule[3] >= 0:
                return True
        return False


def cores_in_words(n: int) -> str:
    return f"{n} core" if n == 1 else f"{n} cores"


def start_choice(cores: int, limits: Limits, workers: int | None = None, prefetch: int | None = None) -> Choice:
    """Where the climb starts, nothing measured: ``min(2, cores)`` workers (at least
    ``limits.min_workers``), prefetch_factor 2 -- or what the user fixed."""
    w = workers if workers is not None else max(limits.min_workers, min(2, max(1, cores)))
    return Choice(w, prefetch if prefetch is not None else 2)


def replay(typical: float, m: EpochMeasure, batches: int) -> list[float]:
    """Each batch's time for the model to play out in order: ``typical``, and the epoch's slow
    batches (``m.spikes`` of them, each ``m.spike_s / m.spikes`` longer) spread evenly -- so that
    prefetching, which hides them, is predicted to."""
    n = max(1, min(batches, REPLAY))
    out = [typical] * n
    k = min(n, round(m.spikes * n / max(1, batches))) if m.spikes else 0
    if k == 0 and m.spikes:
        k = 1
    if k:
        extra = m.spike_s / m.spikes
        for i in range(k):
            out[(2 * i + 1) * n // (2 * k)] += extra
    return out


def _profiles(state: State) -> dict[bool, model.Profile]:
    """The model's Profile of loading with workers (True) and in the main process (False), each
    from the latest epoch that ran so, else derived from the other."""
    out: dict[bool, model.Profile] = {}
    m = state.with_workers
    persistent = state.limits.persistent
    if m is not None and m.worker_batches:
        n = m.worker_batches
        make = (m.fetch_s + m.collate_s) / n
        cpu = m.fetch_cpu_s / n
        # how much slower than its own CPU and waiting a batch ran: the others on the cores (other
        # workers, the main process, other processes) preempting it
        alone = (m.fetch_cpu_s + m.fetch_blocked_s) / n
        contention = max(1.0, make / alone) if alone > 0 else 1.0
        start_s, start_w = state.start or (0.0, max(1, m.choice.workers))
        makes = replay(max(0.0, (m.fetch_s + m.collate_s - m.spike_s) / n), m, m.batches)
        out[True] = model.Profile(kind="fastcollate", workers=m.choice.workers, make_s=makes,
                                  fetch_s=[x * m.fetch_s / max(1e-12, m.fetch_s + m.collate_s) for x in makes],
                                  worker_cpu_s=max(cpu, m.worker_cpu_s / n), main_cpu_s=m.main_cpu_s / max(1, m.batches),
                                  start_s=0.0 if persistent else start_s, start_workers=start_w,
                                  contention=contention, cpu_s=cpu)
    m0 = state.in_main
    if True not in out and m0 is not None and m0.batches:
        # nothing measured with workers yet: a worker makes each batch as the main process did
        # (fetch + collate, its CPU and its waiting), the main process receives it (a prior:
        # RECEIVE_S), and a pool starts in START_S (a prior: the next epoch measures both)
        n = m0.batches
        makes = replay(max(0.0, (m0.wait_s - m0.spike_s) / n), m0, n)
        cpu = m0.main_cpu_s / n
        out[True] = model.Profile(kind="fastcollate", workers=1, make_s=makes, fetch_s=makes, worker_cpu_s=cpu,
                                  main_cpu_s=RECEIVE_S, start_s=0.0 if persistent else START_S, start_workers=1,
                                  cpu_s=cpu)
    if m0 is not None and m0.batches:
        n = m0.batches
        make = m0.wait_s / n  # the whole of next(): sampler, fetch, collate
        cpu = m0.main_cpu_s / n
        out[False] = model.Profile(kind="fastcollate", workers=0, make_s=replay(max(0.0, make - m0.spike_s / n), m0, n),
                                   fetch_s=[0.0], worker_cpu_s=cpu, main_cpu_s=0.0,
                                   epoch_s=max(0.0, m0.first_s - make), cpu_s=cpu)
    elif True in out:
        # a batch made in the main process: the worker's CPU and its own waiting, no sending,
        # no rebuild (the CPU clock is not slowed by other processes; the wall clock is)
        n = max(1, m.worker_batches)
        makes = replay(max(0.0, (m.fetch_cpu_s + m.fetch_blocked_s) / n - m.spike_s / n), m, m.batches)
        out[False] = model.Profile(kind="fastcollate", workers=0, make_s=makes, fetch_s=[0.0],
                                   worker_cpu_s=m.fetch_cpu_s / n, main_cpu_s=0.0, cpu_s=m.fetch_cpu_s / n)
    return out


def waiting_share(state: State) -> float:
    """The share of a fetch's time spent blocked (I/O, sleeps) rather than on a CPU."""
    m = state.with_workers if state.with_workers is not None else state.in_main
    if m is None:
        return 0.0
    cpu = m.fetch_cpu_s if m.choice.workers else m.main_cpu_s
    blocked = m.fetch_blocked_s if m.choice.workers else m.main_blocked_s
    return blocked / (cpu + blocked) if cpu + blocked > 0 else 0.0


def allowed(state: State, budget: Budget) -> tuple[list[Choice], str]:
    """The settings the climb may try, and the budget in words."""
    lim = state.limits
    waiting = waiting_share(state)
    per_worker = (state.worker_mb or UNMEASURED_WORKER_MB) * _MB
    room = MEMORY_FRACTION * budget.memory_bytes
    if lim.workers:
        counts = [w for w in model.worker_counts(budget.cores, waiting) if w >= lim.min_workers]
        if lim.batches_per_epoch:
            counts = [w for w in counts if w <= max(1, lim.batches_per_epoch)]
    else:
        counts = [state.current.workers]
    prefetch = sorted(set(PREFETCH) | {state.current.prefetch or 2}) if lim.prefetch else [lim.prefetch_value]
    out = []
    for w in counts or [state.current.workers]:
        for pf in (prefetch if w else [0]):
            c = Choice(w, pf)
            # each worker: its private memory, and up to prefetch batches of its own in flight
            if w and w * (per_worker + pf * state.batch_bytes) > room and c != state.current:
                continue
            out.append(c)
    top = max(c.workers for c in out)
    words = f"{cores_in_words(budget.cores)}, {budget.memory_bytes / 2**30:.1f} GiB"
    if budget.words and budget.words != words:
        words += f" ({budget.words})"
    if top > budget.cores:
        words += f"; the fetches wait {waiting:.0%} of their time, so up to {top} workers"
    return out, words


def predict(state: State, c: Choice, m: EpochMeasure, budget: Budget,
            profiles: dict[bool, model.Profile]) -> float | None:
    """Samples/s the model predicts for ``c`` under epoch ``m``'s workload."""
    prof = profiles.get(c.workers > 0)
    if prof is None:
        return None
    batches = max(1, m.batches if m.whole else (state.limits.batches_per_epoch or m.batches))
    if batches > REPLAY:  # the first REPLAY batches, with the epoch's start-up in proportion
        scale = REPLAY / batches
        prof = dataclasses.replace(prof, start_s=prof.start_s * scale, epoch_s=prof.epoch_s * scale)
        batches = REPLAY
    step = m.step_s / max(1, m.batches)
    step_cpu = max(0.0, m.process_cpu_s - m.main_cpu_s) >= 0.5 * m.step_s if m.step_s > 0 else True
    work = model.Workload(batches=batches, batch_size=max(1, round(m.samples / max(1, m.batches))), epochs=1,
                          cores=budget.cores, step_s=step, step_cpu=step_cpu)
    s = model.Setting("fastcollate", c.workers, max(1, c.prefetch), state.limits.persistent and c.workers > 0)
    return model.predict(s, prof, work)["samples_per_s"]


def _note(state: State, m: EpochMeasure) -> None:
    if m.choice.workers:
        state.with_workers = m
        if m.started and m.worker_batches:
            make = m.first_make_s or (m.fetch_s + m.collate_s) / m.worker_batches
            state.start = (max(0.0, m.first_s - make), m.choice.workers)
    else:
        state.in_main = m
    state.worker_mb = max(state.worker_mb, m.worker_mb)
    state.batch_bytes = max(state.batch_bytes, m.batch_bytes)
    state.measured[m.choice] = state.rate(m)


def decide(state: State, m: EpochMeasure, budget: Budget) -> Record | None:
    """The next epoch's setting from epoch ``m``: a Record (``record.after`` is it, also
    ``state.current``), or None when the epoch delivered no batch at all (an iterator made and
    dropped: nothing to say)."""
    cur = state.current
    if m.batches == 0:
        return None
    if m.batches < MIN_BATCHES:
        return Record(m.epoch, "keep", cur, cur, f"only {m.batches} batches measured (fewer than {MIN_BATCHES}): "
                      "nothing decided", measured=m, settled=state.settled)
    _note(state, m)
    rate = state.rate(m)
    how = "steady samples/s" if state.limits.persistent else "samples/s"
    held = ""
    if state.pending is not None:
        before, before_rate, promised = state.pending
        state.pending = None
        held = f"the change held ({rate:,.0f} {how} against {before_rate:,.0f} with {before}); "
        if rate < before_rate:
            state.close(before, cur)
            state.reverts += 1
            state.current = before
            state.settled = state.reverts >= MAX_REVERTS
            return Record(m.epoch, "revert", cur, before,
                          f"{rate:,.0f} {how} against {before_rate:,.0f} with {before} (predicted {promised:,.0f}): "
                          f"a loss, reverted{'; settled' if state.settled else ''}", measured=m,
                          predicted=state.measured.get(before), settled=state.settled)
    if state.settled:
        return Record(m.epoch, "keep", cur, cur, held + "settled", measured=m, settled=True)
    planned = budget.planned(m.others_busy)
    if planned != budget.cores:
        budget = dataclasses.replace(budget, cores=planned, words=f"other processes kept {m.others_busy:.1f} of "
                                     f"{budget.affinity or budget.cores} cores busy"
                                     + (f"; the share: {budget.words}" if budget.words else ""))
    profiles = _profiles(state)
    options, words = allowed(state, budget)
    here = predict(state, cur, m, budget, profiles)
    if here is not None and here > 0 and rate > 0:
        # what the model got wrong about this epoch, it gets wrong about the settings that load the
        # same way: their predictions are scaled by it. The other way's, until measured, are taken
        # at face value: that is how the climb comes to try it -- a worker can be several times
        # slower than the main process at the same fetch (many small fields: a forked worker's
        # first touch of each cached object copies its page), which no worker measurement shows.
        # Scaled by this error instead, main-process loading was never tried there (23% of the
        # grid's best, docs/benchmarks/auto.md)
        state.calibration[cur.workers > 0] = min(CALIBRATION_LIMIT, max(1 / CALIBRATION_LIMIT, rate / here))
    scored = []
    for c in options:
        if c == cur or state.is_closed(c) or c in state.measured:
            continue  # a setting measured already is known: the climb does not go back to it
        p = predict(state, c, m, budget, profiles)
        if p is not None:
            scored.append((p * state.calibration.get(c.workers > 0, 1.0), c))
    if here is None or not scored:
        state.settled = True
        return Record(m.epoch, "keep", cur, cur, f"{held}nothing else to try within {words}; settled", measured=m,
                      predicted_before=here, settled=True)
    top = max(p for p, _ in scored)
    # among the settings predicted as good as the best, the cheapest: fewest workers, least prefetch
    best_p, best = min((t for t in scored if t[0] >= CLOSE * top), key=lambda t: (t[1].workers, t[1].prefetch))
    gain = best_p / rate if rate > 0 else float("inf")
    model_said = f"the model said {here:,.0f} for it" if here is not None else ""
    if gain >= MIN_GAIN:
        state.pending = (cur, rate, best_p)
        state.current = best
        return Record(m.epoch, "change", cur, best, f"{held}predicted {best_p:,.0f} samples/s, {gain:.2f}x the "
                      f"{rate:,.0f} measured ({model_said}: its predictions corrected by that); within {words}",
                      measured=m, predicted=best_p, predicted_before=here)
    state.settled = True
    return Record(m.epoch, "keep", cur, cur,
                  f"{held}no other setting is predicted to gain {MIN_GAIN - 1:.0%} (the best, {best}: predicted "
                  f"{best_p:,.0f} samples/s, {gain:.2f}x the {rate:,.0f} measured; {model_said}); settled",
                  measured=m, predicted=rate, predicted_before=here, settled=True)


__all__ = ["Choice", "EpochMeasure", "Budget", "Limits", "Record", "State", "start_choice", "decide", "allowed",
           "predict", "waiting_share", "transition", "MIN_GAIN", "MIN_BATCHES"]
