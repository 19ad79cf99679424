"""fastcollate.doctor: look at the user's pipeline, predict the fix, apply it, prove it.

1. Look: one traced run of the user's own settings (their dataset, DataLoader arguments and
   step), whole epochs: the stage each batch waits for, every station's CPU per batch (the main
   process's and the workers', from the kernel's clocks), the workers' start-up, their private
   memory. Short probes measure the same for what the user does not run now (main-process
   loading, workers, fastcollate's collate or ring), and the cache's read cost where a cache is
   allowed.
2. Predict: the model (fastcollate.training.model) gives samples/s for every candidate setting
   -- workers bounded by the cores and the memory, prefetch, persistent workers, the loader, the
   cache -- and the best one or two are kept. Nothing is run for the rest.
3. Prove: the user's settings and those candidates run side by side, whole epochs with the
   loader's creation included, in alternating order, round after round until the spread is
   known (fastcollate.training.measure). A candidate is proposed only when it wins every round;
   otherwise the user's settings stay, and the doctor says so.

It never changes results: fastcollate's collate replaces only torch's default_collate (the same
values, bitwise); the cache only for a dataset proven deterministic (the same index fetched twice
gives equal samples), whose cached samples equal the dataset's.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable

import torch
import torch.utils.data as tud

from ..core.collator import collate as fast_collate, usable_cores
from . import measure, model
from .doctor_look import Look, deterministic, look, probe, replay_ceiling, waiting_share
from .doctor_words import MIN_GAIN
from .memory import WorkerMemory, available_bytes

KINDS = {"torch": "torch's DataLoader, default_collate", "torch+fastcollate": "torch's DataLoader, fastcollate.collate",
         "fastcollate": "fastcollate.DataLoader (the ring)"}
_DEFAULT_COLLATES = (None, tud.default_collate)


@dataclasses.dataclass
class Diagnosis:
    """What the doctor found and proposes; ``to_dict()`` is JSON-safe."""

    bottleneck: str | None
    baseline: dict[str, Any]
    proposal: dict[str, Any]
    ceiling_samples_per_s: float | None
    memory: dict[str, Any]
    findings: list[str]
    elapsed_s: float
    predictions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    _make: Any = dataclasses.field(default=None, repr=False)
    _settings: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    def loader(self, dataset: Any) -> Any:
        """A ready loader over ``dataset`` built with the proposal (the cache included)."""
        return self._make(dataset)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if not k.startswith("_")}
        return json.loads(json.dumps(out, default=str))

    def code(self) -> str:
        """The proposal as code a user pastes."""
        p = self.proposal
        args = ", ".join(f"{k}={_py(v)}" for k, v in (self._settings or p["settings"]).items())
        ds = "fastcollate.Cached(dataset)" if p["cache"] else "dataset"
        cls = "fastcollate.DataLoader" if p["loader"] == "fastcollate" else "torch.utils.data.DataLoader"
        return f"loader = {cls}({ds}, {args})"


def _py(v: Any) -> str:
    if v is fast_collate:
        return "fastcollate.collate"
    if callable(v):
        return getattr(v, "__qualname__", None) or repr(v)
    return repr(v)


class _Builder:
    """Makes the loader of a setting: the user's other DataLoader arguments kept."""

    def __init__(self, batch_size: int, kwargs: dict[str, Any]) -> None:
        self.batch_size = batch_size
        self.kwargs = dict(kwargs)
        self.user_collate = self.kwargs.pop("collate_fn", None)
        self.prefetch_factor = self.kwargs.get("prefetch_factor")
        self.given = dict(kwargs)  # as the user passed them
        for k in ("num_workers", "prefetch_factor", "persistent_workers"):
            self.kwargs.pop(k, None)

    def settings(self, s: model.Setting) -> dict[str, Any]:
        kw: dict[str, Any] = {"batch_size": self.batch_size, **self.kwargs, "num_workers": s.num_workers}
        if s.num_workers:
            kw["prefetch_factor"] = s.prefetch_factor
            kw["persistent_workers"] = s.persistent_workers
        else:
            kw.pop("multiprocessing_context", None)
            kw.pop("timeout", None)
        if s.kind == "torch+fastcollate":
            kw["collate_fn"] = fast_collate
        elif self.user_collate is not None and not (s.kind == "torch" and self.user_collate is fast_collate):
            # the user's own collate goes with every loader kind: its results must not change
            # (fastcollate.DataLoader keeps it too, on the exact path where the ring cannot serve it)
            kw["collate_fn"] = self.user_collate
        return kw

    def make(self, s: model.Setting, dataset: Any) -> Callable[[], Any]:
        def build() -> Any:
            from ..loader.dataloader import DataLoader as RingLoader

            ds = dataset
            if s.cache and not _is_cached(dataset):
                from ..data.cache import Cached

                ds = Cached(dataset)
            cls = RingLoader if s.kind == "fastcollate" else tud.DataLoader
            return cls(ds, **self.settings(s))
        return build


def _kinds(user_collate: Any, base_kind: str) -> list[str]:
    if user_collate in _DEFAULT_COLLATES:
        return ["torch", "torch+fastcollate", "fastcollate"]
    if user_collate is fast_collate:
        return ["torch+fastcollate", "fastcollate"]
    return [base_kind]  # the user's own collate, in the loader they use: its results must not change


class LoaderArgumentsError(ValueError):
    """The DataLoader arguments given to the doctor are refused by the loader itself."""


def _check_arguments(builder: _Builder, base: model.Setting, dataset: Any) -> None:
    """The user's settings, constructed once before anything runs: torch checks most of its
    arguments there (the rest -- prefetch_factor -- only when an epoch starts, as an assert)."""
    pf = builder.prefetch_factor
    if pf is not None and (not isinstance(pf, int) or pf < 1):
        raise LoaderArgumentsError(f"fastcollate.doctor: prefetch_factor must be a whole number >= 1, got {pf!r}")
    from ..loader.dataloader import DataLoader as RingLoader

    cls = RingLoader if base.kind == "fastcollate" else tud.DataLoader
    try:
        cls(dataset, batch_size=builder.batch_size, **builder.given)
    except (ValueError, TypeError) as exc:
        raise LoaderArgumentsError(f"fastcollate.doctor: the DataLoader refuses your arguments: {exc}") from exc


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) else None


def _is_cached(dataset: Any) -> bool:
    from ..data.cache import Cached

    return isinstance(dataset, Cached)


def _base_kind(loader: str, user_collate: Any) -> str:
    if loader == "fastcollate":
        return "fastcollate"
    return "torch+fastcollate" if user_collate is fast_collate else "torch"


def doctor(dataset: Any, *, batch_size: int, epochs: int = 2, step: Callable[[Any], Any] | None = None,
           budget_s: float | None = None, loader: str = "torch", verify: bool = True,
           progress: Callable[[str], None] | None = None, trace: str | None = None, plot: str | None = None,
           **loader_kwargs: Any) -> Diagnosis:
    """Diagnose the data pipeline of ``dataset`` loaded with the DataLoader settings you use now
    (``batch_size`` and ``loader_kwargs``; ``loader="fastcollate"`` if you use
    fastcollate.DataLoader), running ``step(batch)`` per batch if given; propose the settings
    that make it fastest, measured against yours.

    Returns a :class:`Diagnosis`: the bottleneck, your baseline, the proposal (settings, loader,
    cache, the changes, predicted and measured samples/s), the ceiling (the same loop with data
    free: one batch replayed), the workers' memory, findings in words. ``verify=False`` predicts
    only (the proposal's ``measured_samples_per_s`` is then None). ``budget_s`` bounds the
    measuring rounds. ``trace`` / ``plot``: write the traced run of your settings as a Chrome
    trace (Perfetto) / a PNG.

    >>> import torch, fastcollate
    >>> ds = [torch.ones(4) for _ in range(64)]
    >>> d = fastcollate.doctor(ds, batch_size=16, epochs=1, verify=False)
    >>> d.proposal["loader"] in ("torch", "fastcollate")
    True
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"fastcollate.doctor: batch_size must be a positive int, got {batch_size!r}")
    if epochs < 1:
        raise ValueError(f"fastcollate.doctor: epochs must be >= 1, got {epochs}")
    if loader not in ("torch", "fastcollate"):
        raise ValueError(f"fastcollate.doctor: loader must be 'torch' or 'fastcollate', got {loader!r}")
    if not hasattr(dataset, "__len__"):
        raise TypeError("fastcollate.doctor: the dataset needs a __len__ (a map-style dataset)")
    say = progress or (lambda msg: None)
    t_start = time.monotonic()
    builder = _Builder(batch_size, loader_kwargs)
    user_collate = builder.user_collate
    kinds = _kinds(user_collate, _base_kind(loader, user_collate))
    base_w = _int(loader_kwargs.get("num_workers", 0)) or 0
    base = model.Setting(_base_kind(loader, user_collate), base_w, _int(loader_kwargs.get("prefetch_factor")) or 2,
                         bool(loader_kwargs.get("persistent_workers", False)) and base_w > 0)
    _check_arguments(builder, base, dataset)
    cores = usable_cores()
    cache_bytes = 0
    drop_last = bool(loader_kwargs.get("drop_last", False))
    work = model.Workload(model.batches_per_epoch(len(dataset), batch_size, drop_last), batch_size, epochs, cores)

    say("looking: your settings, traced")
    seen: Look = look(builder.make(base, dataset), epochs, step, base_w, kind=base.kind, trace=trace, plot=plot)
    seen.waiting = waiting_share(dataset)
    work.step_s = seen.step_s
    profiles: dict[tuple[str, bool], model.Profile] = {}
    bytes_per_batch = seen.batch_bytes
    # your settings have no workers: what a worker holds is read off the probes that have them
    probe_memory = WorkerMemory() if not base_w else None
    # main-process loading first: its probes time batches of microseconds, which the exit of the
    # previous probe's workers (their memory returned to the kernel) would slow
    for with_workers in (False, True):
        for kind in kinds:
            if kind == "fastcollate" and not with_workers and ("torch+fastcollate", False) in profiles:
                # without workers fastcollate.DataLoader is torch's loader with fastcollate's collate
                profiles[(kind, False)] = dataclasses.replace(profiles[("torch+fastcollate", False)], kind=kind)
                continue
            say(f"probing {KINDS[kind]}, {'workers' if with_workers else 'main-process loading'}")
            # one worker on a machine of several cores: what a worker costs without contention
            w = max(1, min(cores, 2) - 1) if with_workers else 0
            s = model.Setting(kind, w, 2, False)
            profiles[(kind, with_workers)] = probe(builder.make(s, dataset), w, kind, work.batches, seen,
                                                   probe_memory if with_workers else None)
    if probe_memory is not None and probe_memory.last:
        seen.memory = {**probe_memory.report(), "measured_in": "short probes with workers; your settings have none"}

    cache_ok, cache_why = False, "not checked"
    if epochs > 1 and _is_cached(dataset):
        cache_why = "it is a fastcollate.Cached already"
    elif epochs > 1:
        from ..data.cache import Cached, default_max_bytes

        det = deterministic(dataset)
        n = len(dataset)
        est = Cached.estimate([dataset[(k * 7919) % n] for k in range(min(8, n))]) if n else None
        need = (est["bytes_per_sample"] * n) if est else 0
        cap = default_max_bytes()
        if not det:
            cache_why = "the dataset is not deterministic (the same index fetched twice differs)"
        elif est is None or est["cacheable"] < est["samples"]:
            cache_why = "some of its samples cannot be cached exactly (see fastcollate.Cached)"
        elif need > cap:
            cache_why = f"its samples need ~{need / 2**20:.0f} MB, more than the cache may hold ({cap / 2**20:.0f} MB)"
        else:
            cache_ok, cache_why = True, f"deterministic, ~{need / 2**20:.0f} MB of the {cap / 2**20:.0f} MB it may hold"
            # a cached batch's fetch: reading its samples back, as a worker does after epoch 1
            work.cached_fetch_s = est["read_s_per_sample"] * batch_size
            work.cached_write_s = est["write_s_per_sample"] * batch_size
            cache_bytes = need

    # memory: each worker holds its private memory plus prefetch x batch bytes in flight
    per_worker = (seen.memory["growth_mb"] + max(seen.memory["workers_private_mb"] or [0.0])) * 2**20
    room = available_bytes() - (cache_bytes if cache_ok else 0)
    max_workers = cores
    if per_worker > 0:
        max_workers = max(0, min(cores, int(room * 0.5 // (per_worker + 8 * bytes_per_batch))))

    options = model.candidates(base, kinds, cores, epochs, cache_ok, max_workers)
    predicted = []
    for s in options:
        prof = profiles.get((s.kind, s.num_workers > 0))
        if prof is None:
            continue
        p = model.predict(s, prof, work)
        predicted.append((p["samples_per_s"], s, p))
    predicted.sort(key=lambda t: -t[0])
    if any(seen.spikes_s):
        predicted = _deeper_on_ties(predicted)
    base_pred = next(p for p in predicted if p[1].key() == base.key())[0]
    # the best, and the best that differs from it in kind of change (another loader or no cache)
    picks = [predicted[0][1]] if predicted[0][1].key() != base.key() else []
    for rate, s, _ in predicted[1:]:
        # a second candidate only when the model cannot tell it from the first (a close call
        # between two kinds of change): each one measured costs rounds of whole epochs
        if len(picks) >= 2 or rate < 0.95 * predicted[0][0]:
            break
        if s.key() != base.key() and all(s.kind != q.kind or s.cache != q.cache for q in picks):
            picks.append(s)
    # only what the model says is worth it: below MIN_GAIN the findings say "your settings stay",
    # and a measured "win" there would be two tied settings that happened to alternate well
    rate = {s.key(): r for r, s, _ in predicted}
    picks = [s for s in picks if rate[s.key()] >= MIN_GAIN * base_pred]

    arms: dict[str, Callable[[], Any]] = {"yours": builder.make(base, dataset)}
    for i, s in enumerate(picks):
        arms[f"candidate {i + 1}"] = builder.make(s, dataset)
    measured: dict[str, measure.Arm] = {}
    if verify and picks:
        say(f"measuring your settings and {len(picks)} candidate(s), whole epochs, alternating")
        measured = measure.compare(arms, epochs, step, base="yours", min_rounds=2, max_rounds=3,
                                   budget_s=budget_s, progress=lambda m: say("  " + m))
    elif verify:
        say("measuring your settings")
        measured = measure.compare({"yours": arms["yours"]}, epochs, step, min_rounds=2, max_rounds=2)

    from .doctor_words import bottleneck_of, changes, findings

    ceiling = replay_ceiling(seen, step, work)
    chosen, verdict = base, None
    if measured and picks:
        ranked = sorted(((measure.paired(measured["yours"], measured[f"candidate {i + 1}"]), s)
                         for i, s in enumerate(picks)), key=lambda t: -t[0]["ratio"])
        best_ratio, best = ranked[0]
        # what was tried, for the words: a loss says why only where the reason is known
        verdict = {**best_ratio, "candidate": changes(base, best), "more_workers": best.num_workers > base.num_workers,
                   "predicted_ratio": rate[best.key()] / base_pred if base_pred > 0 else None}
        if best_ratio["win"]:
            chosen = best
    elif picks and not verify:
        chosen = picks[0]

    def rate_of(s: model.Setting) -> float:
        return next((r for r, q, _ in predicted if q.key() == s.key()), 0.0)

    base_arm = measured.get("yours")
    chosen_name = next((f"candidate {i + 1}" for i, s in enumerate(picks) if s is chosen), "yours")
    proposal = {"settings": _jsonable(builder.settings(chosen)), "loader": "fastcollate" if chosen.kind == "fastcollate"
                else "torch", "cache": chosen.cache, "changes": changes(base, chosen),
                "predicted_samples_per_s": rate_of(chosen),
                "measured_samples_per_s": measured[chosen_name].median if chosen_name in measured else None,
                "measured_ratio": verdict, "memory_mb": _memory_cost(chosen, seen, bytes_per_batch, cache_bytes)}
    baseline = {"settings": _jsonable(builder.settings(base)), "loader": loader,
                # without the measuring rounds (verify=False), the traced run's rate: tracing included
                "samples_per_s": base_arm.median if base_arm else seen.samples_per_s, "measured": bool(base_arm),
                "predicted_samples_per_s": base_pred,
                "spread": base_arm.spread() if base_arm else None}
    words = findings(seen, base, chosen, picks, verdict, work, ceiling, cache_ok, cache_why, seen.memory,
                     base_pred, verify, batched=hasattr(dataset, "__getitems__"),
                     cuda=torch.cuda.is_available(), pinned=bool(loader_kwargs.get("pin_memory")))
    d = Diagnosis(bottleneck=bottleneck_of(seen, base, chosen, work, base_pred, rate_of(chosen)), baseline=baseline,
                  proposal=proposal, ceiling_samples_per_s=ceiling, memory=seen.memory, findings=words,
                  elapsed_s=time.monotonic() - t_start,
                  predictions=[{"setting": dataclasses.asdict(s), "predicted_samples_per_s": r}
                               for r, s, _ in predicted[:8]])
    d._make = lambda ds: builder.make(chosen, ds)()
    d._settings = builder.settings(chosen)
    return d


def _deeper_on_ties(predicted: list[tuple]) -> list[tuple]:
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


def _memory_cost(s: model.Setting, seen: Look, batch_bytes: int, cache_bytes: int) -> dict[str, float]:
    """What a setting holds in memory, in MB: each worker's private memory (as measured) and the
    batches in flight (workers x prefetch_factor, plus the ring's spare slots), and the cache."""
    mb = 1 / 2**20
    private = max(seen.memory.get("workers_private_mb") or [0.0])
    in_flight = (s.num_workers * s.prefetch_factor + (5 if s.kind == "fastcollate" and s.num_workers else 0)) \
        * batch_bytes * mb if s.num_workers else batch_bytes * mb
    out = {"workers": round(s.num_workers * private, 1), "batches_in_flight": round(in_flight, 1),
           "cache": round(cache_bytes * mb, 1) if s.cache else 0.0}
    out["total"] = round(sum(out.values()), 1)
    return out


def _jsonable(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: (_py(v) if callable(v) else v) for k, v in kw.items()}


def default_progress(msg: str) -> None:
    print(f"doctor: {msg}", flush=True)


__all__ = ["Diagnosis", "doctor", "LoaderArgumentsError"]
