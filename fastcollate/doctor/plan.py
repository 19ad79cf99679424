"""The doctor's decision, from measurements in hand: which settings may be proposed at all (what
must not change a batch, what the node's share and the memory allow), what each is predicted to
give, and which one or two are worth measuring. Pure: no loader runs here, so the decisions are
tested on made-up measurements (tests/test_doctor_plan.py)."""
from __future__ import annotations

import dataclasses
from ..tuning import model
from .words import MIN_GAIN


@dataclasses.dataclass
class Limits:
    """What may change. ``workers``: the worker counts allowed; ``persistent_ok``: whether
    persistent workers may be proposed (else the user's choice stays); ``cache``: "yes" (proven),
    "conditional" (only named, on a condition the user must know), "no"; ``why``: for each limit
    that applies, the reason in words (the findings say them)."""

    kinds: list[str]
    workers: list[int]
    persistent_ok: bool = True
    cache: str = "no"
    why: dict[str, str] = dataclasses.field(default_factory=dict)


def limits(base: model.Setting, kinds: list[str], *, cores: int, waiting: float, memory_workers: int | None,
           iterable: bool, epoch: str | None, worker_init: bool, main_fetch_ok: bool, cache: str,
           epoch_shared: bool = False) -> Limits:
    """The settings the doctor may propose for the user's ``base``:

    - workers up to what the cores allow, beyond them where fetches wait (``waiting``, 0-1),
      bounded by memory (``memory_workers``);
    - an IterableDataset keeps the user's worker count (each worker iterates its own copy of the
      stream: another count changes how it is split, so the batches), except 0 <-> 1, which
      iterate the same stream;
    - with a ``worker_init_fn`` (and workers), or a dataset that cannot be fetched in the main
      process, no main-process loading: it would never run the user's initialisation;
    - an epoch-dependent dataset (``epoch`` names what) or an IterableDataset: no change to
      persistent workers, whose copies of the dataset keep the state they started with."""
    why: dict[str, str] = {}
    counts = model.worker_counts(cores, waiting, memory_workers)
    if waiting >= 0.3 and max(counts) > cores:
        why["io"] = (f"the fetches wait {waiting:.0%} of their time (I/O or sleeps), off the CPU: up to "
                     f"{max(counts)} workers are considered on {cores} cores")
    if iterable:
        counts = sorted({base.num_workers} | ({0, 1} if base.num_workers <= 1 else set()))
        why["iterable"] = ("an IterableDataset: each worker iterates its own copy of the stream, so another number of "
                           f"workers changes the batches; num_workers stays {base.num_workers}")
    if (worker_init and base.num_workers) or not main_fetch_ok:
        counts = [w for w in counts if w] or [base.num_workers]
        why["main"] = ("your worker_init_fn prepares each worker: loading in the main process would skip it"
                       if worker_init and base.num_workers else
                       "the dataset cannot be fetched in the main process: loading stays in workers")
    persistent_ok = not ((epoch and not epoch_shared) or iterable)
    if epoch and epoch_shared:  # its epoch lives in shared memory (fastcollate.images.ImageFolder)
        why["epoch"] = (f"the dataset changes with the epoch ({epoch}, which reaches persistent workers too): "
                        "a cache would freeze it -- none is proposed")
    elif epoch:
        why["epoch"] = (f"the dataset changes with the epoch ({epoch}): persistent workers would keep the epoch "
                        "they started in, and a cache would freeze it -- neither is proposed")
    return Limits(kinds=list(kinds), workers=counts, persistent_ok=persistent_ok, cache=cache, why=why)


@dataclasses.dataclass
class Plan:
    """The predictions, best first, and what is worth measuring."""

    predicted: list[tuple[float, model.Setting, dict[str, float]]]
    picks: list[model.Setting]
    base_rate: float
    conditional: tuple[float, model.Setting] | None = None  # the best cached setting, where the cache is conditional

    def rate(self, s: model.Setting) -> float:
        return next((r for r, q, _ in self.predicted if q.key() == s.key()), 0.0)


def plan(base: model.Setting, profiles: dict[tuple[str, bool], model.Profile], work: model.Workload, lim: Limits,
         slow_batches: bool = False, epochs: int | None = None) -> Plan:
    """Predicts every allowed setting from the profile measured for its loader kind; keeps the
    best, and a second when the model cannot tell it from the first and it is another kind of
    change -- only those predicted at least MIN_GAIN over the user's settings (below that, a
    measured "win" would be two tied settings that happened to alternate well)."""
    options = model.candidates(base, lim.kinds, lim.workers, epochs or work.epochs, lim.cache != "no",
                               lim.persistent_ok)
    predicted = []
    for s in options:
        prof = profiles.get((s.kind, s.num_workers > 0))
        if prof is None:
            continue
        p = model.predict(s, prof, work)
        predicted.append((p["samples_per_s"], s, p))
    predicted.sort(key=lambda t: -t[0])
    if slow_batches:
        predicted = deeper_on_ties(predicted)
    conditional = None
    if lim.cache == "conditional":
        # named on a condition, never proposed: the best cached setting is kept aside
        best_cached = next(((r, s) for r, s, _ in predicted if s.cache), None)
        predicted = [t for t in predicted if not t[1].cache]
        conditional = best_cached
    base_rate = next((r for r, s, _ in predicted if s.key() == base.key()), 0.0)
    picks = [predicted[0][1]] if predicted and predicted[0][1].key() != base.key() else []
    for rate, s, _ in predicted[1:]:
        # each one measured costs rounds of whole epochs: a second only on a close call between
        # two kinds of change
        if len(picks) >= 2 or rate < 0.95 * predicted[0][0]:
            break
        if s.key() != base.key() and all(s.kind != q.kind or s.cache != q.cache for q in picks):
            picks.append(s)
    rates = {s.key(): r for r, s, _ in predicted}
    picks = [s for s in picks if rates[s.key()] >= MIN_GAIN * base_rate]
    return Plan(predicted=predicted, picks=picks, base_rate=base_rate, conditional=conditional)


def deeper_on_ties(predicted: list[tuple]) -> list[tuple]:
    """Among settings predicted equal (within 2%) that differ only in ``prefetch_factor``, the
    deepest first. With slow batches in the dataset the model replays the traced run's once, and
    a real run's jitter moves them: a deeper queue hides that too (measured on RareSlow, 2 cores:
    prefetch 8 was 1.09x prefetch 4, which the model predicted equal). Its memory is stated."""
    if not predicted:
        return predicted
    top, lead = predicted[0][0], predicted[0][1]
    tied = [t for t in predicted if t[0] >= 0.98 * top and (t[1].kind, t[1].num_workers, t[1].persistent_workers,
                                                             t[1].cache) == (lead.kind, lead.num_workers,
                                                                             lead.persistent_workers, lead.cache)]
    ids = {id(t) for t in tied}
    return sorted(tied, key=lambda t: -t[1].prefetch_factor) + [t for t in predicted if id(t) not in ids]


def measuring_batches(batches: int, epochs: int, arms: list[float], remaining_s: float, rounds: int = 2,
                      batch_size: float = 1.0) -> int | None:
    """How many batches of each epoch the measuring rounds can afford in ``remaining_s`` seconds:
    None for whole epochs, 0 when not even a few batches fit. ``arms``: each arm's predicted
    samples/s."""
    per_round = sum(epochs * batches * batch_size / r for r in arms if r > 0)
    if per_round <= 0 or rounds * per_round <= remaining_s:
        return None
    k = int(batches * remaining_s / (rounds * per_round))
    return k if k >= 4 else 0


__all__ = ["Limits", "Plan", "limits", "plan", "deeper_on_ties", "measuring_batches"]
