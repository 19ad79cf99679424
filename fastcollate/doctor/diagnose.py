"""fastcollate.doctor: look at the user's pipeline, predict the fix, apply it, prove it.

1. Look: one traced run of the user's own settings (their dataset, DataLoader arguments and
   step), whole epochs: the stage each batch waits for, every station's CPU per batch (the main
   process's and the workers', from the kernel's clocks), how long fetches wait off the CPU, the
   workers' start-up, their private memory, the batches an epoch really has. Short probes measure
   the same for what the user does not run now (main-process loading, workers, fastcollate's
   collate or ring). Where a cache could serve, the proof (proof.py) fetches the loader's
   indices in several contexts under several seeds, and the cache's costs are measured.
2. Predict: the model (fastcollate.tuning.model) gives samples/s for every setting the doctor
   may propose (plan.py: nothing that changes a batch; workers within this rank's share of
   the node's cores, beyond them where fetches wait, within memory) and the best one or two are
   kept. Nothing is run for the rest.
3. Prove: the user's settings and those candidates run side by side, whole epochs with the
   loader's creation included, in alternating order, round after round until the spread is
   known (fastcollate.tuning.measure). A candidate is proposed only when it wins every round;
   otherwise the user's settings stay, and the doctor says so.

It never changes results: fastcollate's collate replaces only torch's default_collate (the same
values, bitwise); workers and prefetching change when a batch is made, not what it holds (an
IterableDataset keeps its worker count, an epoch-dependent dataset its persistence); the cache
only for a dataset proven deterministic on every index its loader fetches, whose cached samples
equal the dataset's. ``budget_s`` bounds the whole call: each phase gets its share.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import time
from typing import Any, Callable

import torch
import torch.utils.data as tud

from ..core.collator import collate as fast_collate
from ..tuning import load as machine_load, node
from ..tuning import measure, model
from ..tuning.memory import WorkerMemory
from .look import Look, look, probe, replay_ceiling
from .plan import limits, measuring_batches, plan
from .proof import Proof, epoch_attribute, epoch_shared, prove, some_samples

KINDS = {"torch": "torch's DataLoader, default_collate", "torch+fastcollate": "torch's DataLoader, fastcollate.collate",
         "fastcollate": "fastcollate.DataLoader (the ring)"}
_DEFAULT_COLLATES = (None, tud.default_collate)
# a budget's shares: the traced look, the probes, the proof; the measuring rounds get the rest
LOOK_SHARE, PROBE_SHARE, PROOF_SHARE = 0.3, 0.2, 0.1


@dataclasses.dataclass
class Diagnosis:
    """What the doctor found and proposes; ``print(d)`` shows the report, ``to_dict()`` is
    JSON-safe, ``code()`` is the proposal as code, ``loader(dataset)`` builds it."""

    bottleneck: str | None
    baseline: dict[str, Any]
    proposal: dict[str, Any]
    ceiling_samples_per_s: float | None
    memory: dict[str, Any]
    findings: list[str]
    elapsed_s: float
    predictions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    node: dict[str, Any] = dataclasses.field(default_factory=dict)   # the rank measured and its share of the node
    load: dict[str, Any] = dataclasses.field(default_factory=dict)   # the machine's load during the run
    cache: dict[str, Any] = dataclasses.field(default_factory=dict)  # the proof, and the cache's verdict
    _make: Any = dataclasses.field(default=None, repr=False)
    _settings: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    def loader(self, dataset: Any) -> Any:
        """A ready loader over ``dataset`` built with the proposal (the cache included)."""
        return self._make(dataset)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if not k.startswith("_")}
        return json.loads(json.dumps(out, default=str))

    def code(self) -> str:
        """The proposal as code a user pastes: arguments that are not literals (a sampler, a
        lambda) are named, with a line that says they are yours, as you pass them now."""
        p = self.proposal
        yours: list[str] = []
        args = []
        for k, v in (self._settings or p["settings"]).items():
            text = _py(v)
            if text is None:
                yours.append(f"{k} = ...  # your {type(v).__name__}, as you pass it now")
                text = k
            args.append(f"{k}={text}")
        ds = "fastcollate.Cached(dataset)" if p["cache"] else "dataset"
        cls = "fastcollate.DataLoader" if p["loader"] == "fastcollate" else "torch.utils.data.DataLoader"
        return "\n".join(yours + [f"loader = {cls}({ds}, {', '.join(args)})"])

    def __str__(self) -> str:
        from .text import format_diagnosis

        return format_diagnosis(self)


def _py(v: Any) -> str | None:
    """v as Python source, or None when it is an object only the user's code can name."""
    if v is fast_collate:
        return "fastcollate.collate"
    if isinstance(v, (bool, int, float, str, type(None))):
        return repr(v)
    if isinstance(v, (list, tuple)) and all(_py(x) is not None for x in v) and len(v) <= 16:
        return repr(v)
    name = getattr(v, "__qualname__", "")
    if callable(v) and name and "<" not in name and getattr(v, "__module__", None):
        return name  # a function or class of theirs, by the name they gave it
    return None


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

    def make(self, s: model.Setting, dataset: Any, node: bool | None = False) -> Callable[[], Any]:
        # the probes' caches stay private (node=False): under torchrun a node-wide one would be
        # keyed by how many each rank made, and the ranks' probes need not be as many
        def build() -> Any:
            from ..loader.dataloader import DataLoader as RingLoader

            ds = dataset
            if s.cache and not _is_cached(dataset):
                from ..cache.cached import Cached

                ds = Cached(dataset, node=node)
            cls = RingLoader if s.kind == "fastcollate" else tud.DataLoader
            return cls(ds, **self.settings(s))
        return build


def _spawn_start_s(s: model.Setting, builder: _Builder, seen: Look,
                   profiles: dict[tuple[str, bool], model.Profile], cores: int) -> float:
    """Seconds setting ``s`` takes to start its workers where they start by spawn or forkserver (a
    new interpreter that imports torch: a second or more; a fork is a tenth of that and is
    measured as it comes): 0.0 where that does not apply or was not measured."""
    if not s.num_workers:
        return 0.0
    ctx = builder.kwargs.get("multiprocessing_context")
    method = ctx if isinstance(ctx, str) or ctx is None else ctx.get_start_method()
    if method is None:
        # the platform's default, without fixing it (get_context() would)
        method = mp.get_start_method(allow_none=True) or mp.get_all_start_methods()[0]
    if method == "fork":
        return 0.0
    ref = seen.profile if seen.profile.workers else profiles.get((s.kind, True))
    if ref is None or ref.start_s <= 0:
        return 0.0
    return model.start_cost(ref.start_s, ref.start_workers, s.num_workers, cores)


def _start(loaders: list[Any]) -> None:
    """Starts the workers of ``loaders`` (persistent workers) side by side, one batch taken from
    each and the pass left (the next iter() resets the workers to a new epoch, as torch does for
    persistent workers)."""
    passes = [iter(loader) for loader in loaders]  # each starts its processes: they import at once
    for it in passes:
        next(it, None)


def _kinds(user_collate: Any, base_kind: str) -> list[str]:
    if user_collate in _DEFAULT_COLLATES:
        return ["torch", "torch+fastcollate", "fastcollate"]
    if user_collate is fast_collate:
        return ["torch+fastcollate", "fastcollate"]
    return [base_kind]  # the user's own collate, in the loader they use: its results must not change


class LoaderArgumentsError(ValueError):
    """The DataLoader arguments given to the doctor are refused by the loader itself, or make a
    loop with no batch."""


def _check_arguments(builder: _Builder, base: model.Setting, dataset: Any) -> int | None:
    """The user's settings, constructed once before anything runs: torch checks most of its
    arguments there (the rest -- prefetch_factor -- only when an epoch starts, as an assert).
    Returns the loader's batches per epoch where it knows them (``len(loader)``)."""
    pf = builder.prefetch_factor
    if pf is not None and (not isinstance(pf, int) or pf < 1):
        raise LoaderArgumentsError(f"fastcollate.doctor: prefetch_factor must be a whole number >= 1, got {pf!r}")
    from ..loader.dataloader import DataLoader as RingLoader

    cls = RingLoader if base.kind == "fastcollate" else tud.DataLoader
    try:
        loader = cls(dataset, batch_size=builder.batch_size, **builder.given)
    except (ValueError, TypeError) as exc:
        raise LoaderArgumentsError(f"fastcollate.doctor: the DataLoader refuses your arguments: {exc}") from exc
    try:
        n = len(loader)
    except TypeError:  # an IterableDataset without __len__: the look counts them
        return None
    if n == 0:
        drop = builder.given.get("drop_last", False)
        size = _size(dataset)
        raise LoaderArgumentsError(
            "fastcollate.doctor: your loader yields no batch" + (
                f" (drop_last=True and batch_size={builder.batch_size} > the {size} samples it fetches)" if drop
                else f" (it fetches {size} samples)"))
    return n


def _size(dataset: Any) -> str:
    try:
        return str(len(dataset))
    except TypeError:
        return "an unknown number of"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) else None


def _is_cached(dataset: Any) -> bool:
    from ..cache.cached import Cached

    return isinstance(dataset, Cached)


def _base_kind(loader: str, user_collate: Any) -> str:
    if loader == "fastcollate":
        return "fastcollate"
    return "torch+fastcollate" if user_collate is fast_collate else "torch"


class _Clock:
    """The call's time budget: each phase's share of what is left (None without a budget)."""

    def __init__(self, budget_s: float | None) -> None:
        self.start = time.monotonic()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float | None:
        return None if self.budget_s is None else max(0.0, self.budget_s - self.elapsed())

    def share(self, fraction: float) -> float | None:
        return None if self.budget_s is None else self.budget_s * fraction


def doctor(dataset: Any, *, batch_size: int, epochs: int = 2, step: Callable[[Any], Any] | None = None,
           budget_s: float | None = None, loader: str = "torch", verify: bool = True, files_static: bool = False,
           ranks: int | None = None, progress: Callable[[str], None] | None = None, trace: str | None = None,
           plot: str | None = None, **loader_kwargs: Any) -> Diagnosis:
    """Diagnose the data pipeline of ``dataset`` loaded with the DataLoader settings you use now
    (``batch_size`` and ``loader_kwargs``; ``loader="fastcollate"`` if you use
    fastcollate.DataLoader), running ``step(batch)`` per batch if given; propose the settings
    that make it fastest, measured against yours.

    Returns a :class:`Diagnosis` (``print(d)`` shows the report): the bottleneck, your baseline,
    the proposal (settings, loader, cache, the changes, predicted and measured samples/s), the
    ceiling (the same loop with data free: one batch replayed), the workers' memory, the
    machine's load, the rank measured and its share of the node, findings in words.

    ``verify=False`` predicts only (the proposal's ``measured_samples_per_s`` is then None).
    ``budget_s`` bounds the whole call (each phase gets its share; whole epochs are measured where
    they fit, the first batches of each epoch where they do not). ``files_static=True`` says that
    the files the dataset reads do not change during training: a dataset proven deterministic
    that reads files may then be cached (without it, the cache is only named, on that condition).
    ``ranks``: the processes of your job on this node (default: ``LOCAL_WORLD_SIZE``), which share
    its cores and memory. ``trace`` / ``plot``: write the traced run of your settings as a Chrome
    trace (Perfetto) / a PNG.

    >>> import torch, fastcollate
    >>> ds = [torch.ones(4) for _ in range(64)]
    >>> d = fastcollate.doctor(ds, batch_size=16, epochs=1, verify=False)
    >>> d.proposal["loader"] in ("torch", "fastcollate")
    True
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"fastcollate.doctor: batch_size must be a positive int, got {batch_size!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"fastcollate.doctor: epochs must be an int >= 1, got {epochs!r}")
    if loader not in ("torch", "fastcollate"):
        raise ValueError(f"fastcollate.doctor: loader must be 'torch' or 'fastcollate', got {loader!r}")
    if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, (int, float))
                                 or not budget_s > 0):
        raise ValueError(f"fastcollate.doctor: budget_s must be a number of seconds > 0 (or None), got {budget_s!r}")
    iterable = isinstance(dataset, tud.IterableDataset)
    if not iterable and not hasattr(dataset, "__getitem__"):
        raise TypeError(f"fastcollate.doctor: the dataset ({type(dataset).__name__}) has no __getitem__ and is not "
                        "an IterableDataset")
    say = progress or (lambda msg: None)
    clock = _Clock(budget_s)
    builder = _Builder(batch_size, loader_kwargs)
    user_collate = builder.user_collate
    kinds = _kinds(user_collate, _base_kind(loader, user_collate))
    base_w = _int(loader_kwargs.get("num_workers", 0)) or 0
    base = model.Setting(_base_kind(loader, user_collate), base_w, _int(loader_kwargs.get("prefetch_factor")) or 2,
                         bool(loader_kwargs.get("persistent_workers", False)) and base_w > 0)
    per_epoch = _check_arguments(builder, base, dataset)

    # the machine: this rank's share of the node, and what other processes keep busy now
    others = machine_load.others_busy(0.1 if budget_s is not None and budget_s < 5 else 0.25)
    share = node.share(ranks=ranks)
    cores = share.cores
    if others is not None and others >= 0.5:
        cores = max(1, min(cores, int(node.affinity_cores() - others + 0.5)))
    load = {"load_average_start": machine_load.load_average(), "others_busy_cores": others,
            "cores_planned": cores, "share": share.describe()}

    say("looking: your settings, traced")
    look_deadline = None if budget_s is None else time.perf_counter() + clock.share(LOOK_SHARE)
    seen: Look = look(builder.make(base, dataset), epochs, step, base_w, kind=base.kind, trace=trace, plot=plot,
                      deadline=look_deadline)
    if seen.batches == 0:
        raise LoaderArgumentsError("fastcollate.doctor: your loader yielded no batch in the look (an empty dataset, "
                                   "or drop_last with fewer samples than batch_size)")
    batches = seen.epoch_batches or per_epoch or seen.batches
    samples_per_batch = max(1, round(seen.samples / max(1, seen.batches)))
    work = model.Workload(batches, samples_per_batch, epochs, cores, step_s=seen.step_s)

    # the cache: proven, conditional or not at all
    epoch_attr = epoch_attribute(dataset)
    proof: Proof | None = None
    cache_state, cache_why, cache_bytes = "no", "not checked (one epoch: a cache pays from the second)", 0
    if _is_cached(dataset):
        cache_why = "it is a fastcollate.Cached already"
    elif epochs > 1:
        allowed = clock.share(PROOF_SHARE) if budget_s is not None else max(5.0, seen.wall_s)
        proof = prove(dataset, loader_kwargs, batch_size, workers=max(1, min(cores, 4)), allowed_s=allowed,
                      say=say)
        cache_state, cache_why, cache_bytes = _cache_verdict(proof, dataset, loader_kwargs, batch_size, work,
                                                            files_static)
    main_ok = proof.main_fetch_ok if proof is not None else True

    # memory: each worker holds its private memory plus prefetch x batch bytes in flight
    per_worker_mb = seen.memory.get("growth_mb", 0.0) + max(seen.memory.get("workers_private_mb") or [0.0])
    room = share.memory_bytes - (cache_bytes if cache_state != "no" else 0)
    memory_workers = None
    if per_worker_mb > 0:
        memory_workers = max(0, int(room * 0.5 // (per_worker_mb * 2**20 + 8 * seen.batch_bytes)))
    lim = limits(base, kinds, cores=cores, waiting=seen.waiting, memory_workers=memory_workers, iterable=iterable,
                 epoch=epoch_attr, worker_init=loader_kwargs.get("worker_init_fn") is not None,
                 main_fetch_ok=main_ok, cache=cache_state, epoch_shared=epoch_shared(dataset))

    profiles = _probes(builder, dataset, kinds, lim.workers, base_w, cores, work, seen, clock, say)
    pl = plan(base, profiles, work, lim, slow_batches=any(seen.spikes_s))
    picks = pl.picks

    arms: dict[str, Callable[[], Any]] = {}
    charges: dict[str, list[float]] = {}
    kept: list[Any] = []
    for name, s in [("yours", base)] + [(f"candidate {i + 1}", s) for i, s in enumerate(picks)]:
        start = _spawn_start_s(s, builder, seen, profiles, cores) if verify else 0.0
        if start:
            # workers that start a new interpreter: started once here, kept over the rounds, and
            # each round charged the start-ups the setting pays (once, or once an epoch when not
            # persistent) -- measured once, by the look or a probe
            charges[name] = [start] * epochs if not s.persistent_workers else [start] + [0.0] * (epochs - 1)
            kept.append(builder.make(dataclasses.replace(s, persistent_workers=True), dataset)())
            arms[name] = lambda loader=kept[-1]: loader
        else:
            arms[name] = builder.make(s, dataset)
    if charges:
        _start(kept)
        say(f"workers started by {builder.kwargs.get('multiprocessing_context')!s}: started once, "
            f"{charges.get('yours', [0.0])[0]:.2f} s each start (measured) charged to the rounds")
    measured: dict[str, measure.Arm] = {}
    cut = None  # batches of each epoch the measuring rounds ran (None: whole epochs)
    if verify:
        left = clock.left()
        if left is not None:
            left = max(0.0, left - 0.05 * budget_s)  # the words, the ceiling
            cut = measuring_batches(batches, epochs, [pl.base_rate] + [pl.rate(s) for s in picks], left,
                                    batch_size=samples_per_batch)
        if cut == 0:
            say("the budget leaves no time to measure: predicted only")
        else:
            say(f"measuring your settings{f' and {len(picks)} candidate(s)' if picks else ''}, "
                f"{'whole epochs' if cut is None else f'the first {cut} batches of each epoch'}, alternating")
            measured = measure.compare(arms, epochs, step, base="yours", min_rounds=2,
                                       max_rounds=3 if budget_s is None else 50, budget_s=left,
                                       progress=lambda m: say("  " + m), max_batches=cut,
                                       fill=budget_s is not None, charge_s=charges)
    del arms, kept  # the kept loaders' workers end here

    from .words import Facts, bottleneck_of, changes, findings

    chosen, verdict = base, None
    if measured and picks:
        ranked = sorted(((measure.paired(measured["yours"], measured[f"candidate {i + 1}"]), s)
                         for i, s in enumerate(picks)), key=lambda t: -t[0]["ratio"])
        best_ratio, best = ranked[0]
        # what was tried, for the words: a loss says why only where the reason is known
        verdict = {**best_ratio, "candidate": changes(base, best), "more_workers": best.num_workers > base.num_workers,
                   "predicted_ratio": pl.rate(best) / pl.base_rate if pl.base_rate > 0 else None}
        if best_ratio["win"]:
            chosen = best
    elif picks and not verify:
        chosen = picks[0]

    base_arm = measured.get("yours")
    chosen_name = next((f"candidate {i + 1}" for i, s in enumerate(picks) if s is chosen), "yours")
    chosen_measured = measured[chosen_name].median if chosen_name in measured else None
    ceiling = replay_ceiling(seen, step, work, max_s=None if budget_s is None else 0.05 * budget_s)
    if ceiling is not None:
        # the loop with data free is at least as fast as any loop measured with data
        ceiling = max([ceiling] + [a.median for a in measured.values()])
    load["load_average_end"] = machine_load.load_average()
    proposal = {"settings": _jsonable(builder.settings(chosen)), "loader": "fastcollate" if chosen.kind == "fastcollate"
                else "torch", "cache": chosen.cache, "changes": changes(base, chosen),
                "predicted_samples_per_s": pl.rate(chosen), "measured_samples_per_s": chosen_measured,
                "measured_ratio": verdict, "memory_mb": _memory_cost(chosen, seen, seen.batch_bytes, cache_bytes),
                "measured_batches_per_epoch": cut}
    baseline = {"settings": _jsonable(builder.settings(base)), "loader": loader,
                # without the measuring rounds (verify=False), the traced run's rate: tracing included
                "samples_per_s": base_arm.median if base_arm else seen.samples_per_s, "measured": bool(base_arm),
                "predicted_samples_per_s": pl.base_rate, "spread": base_arm.spread() if base_arm else None}
    facts = Facts(seen=seen, base=base, chosen=chosen, picks=picks, verdict=verdict, work=work, ceiling=ceiling,
                  cache_state=cache_state, cache_why=cache_why, memory=seen.memory, base_rate=pl.base_rate,
                  verified=verify, batched=bool(getattr(dataset, "__getitems__", None)),
                  cuda=torch.cuda.is_available(), pinned=bool(loader_kwargs.get("pin_memory")), limits=lim,
                  conditional=pl.conditional, proof=proof, share=share, load=load, cut=cut, budget_s=budget_s,
                  measured_rate=chosen_measured, epoch_attr=epoch_attr,
                  yours_rate=baseline["samples_per_s"])
    words = findings(facts)
    cache_info = {"state": cache_state, "why": cache_why, "bytes": cache_bytes,
                  "proof": dataclasses.asdict(proof) if proof is not None else None}
    d = Diagnosis(bottleneck=bottleneck_of(seen, base, chosen, work, pl.base_rate, pl.rate(chosen)),
                  baseline=baseline, proposal=proposal, ceiling_samples_per_s=ceiling, memory=seen.memory,
                  findings=words, elapsed_s=clock.elapsed(),
                  predictions=[{"setting": dataclasses.asdict(s), "predicted_samples_per_s": r}
                               for r, s, _ in pl.predicted[:8]],
                  node=share.to_dict(), load=load, cache=cache_info)
    d._make = lambda ds: builder.make(chosen, ds, node=None)()  # the proposal, built: node-wide under a launcher
    d._settings = builder.settings(chosen)
    return d


def _cache_verdict(proof: Proof, dataset: Any, loader_kwargs: dict[str, Any], batch_size: int,
                   work: model.Workload, files_static: bool) -> tuple[str, str, int]:
    """("yes" | "conditional" | "no", why, bytes the cache needs) from the proof; where the cache
    may be named at all, its read and write costs are measured on a few samples (into ``work``)."""
    from ..cache.cached import Cached, default_max_bytes

    if not (proof.cacheable(files_static) or proof.conditional(files_static)):
        return "no", proof.why, 0
    need = int(proof.bytes_per_sample * proof.indices)
    cap = default_max_bytes()
    if need > cap:
        return "no", (f"its samples need ~{need / 2**20:.0f} MB, more than the cache may hold "
                      f"({cap / 2**20:.0f} MB)"), 0
    try:
        est = Cached.estimate(some_samples(dataset, loader_kwargs, batch_size, 8, proof.main_fetch_ok))
    except Exception as exc:  # the samples could not be had to time: the cache is not modelled
        return "no", f"its samples could not be fetched to time the cache ({type(exc).__name__}: {exc})", 0
    if est["cacheable"] < est["samples"] or not est["samples"]:
        return "no", "some of its samples cannot be cached exactly (see fastcollate.Cached)", 0
    # a cached batch's fetch: reading its samples back, as a worker does after epoch 1
    work.cached_fetch_s = est["read_s_per_sample"] * work.batch_size
    work.cached_write_s = est["write_s_per_sample"] * work.batch_size
    size = f"~{need / 2**20:.0f} MB of the {cap / 2**20:.0f} MB it may hold"
    if proof.cacheable(files_static):
        how = "; its files do not change, you said" if proof.reads_files else ""
        return "yes", f"proven deterministic: {proof.why}{how}; {size}", need
    return "conditional", f"{proof.why}; {size}", need


def _probes(builder: _Builder, dataset: Any, kinds: list[str], workers: list[int], base_w: int, cores: int,
            work: model.Workload, seen: Look, clock: _Clock, say: Callable[[str], None]
            ) -> dict[tuple[str, bool], model.Profile]:
    """Each loader kind's profile, main-process loading (where allowed) and with workers."""
    profiles: dict[tuple[str, bool], model.Profile] = {}
    # your settings have no workers: what a worker holds is read off the probes that have them
    probe_memory = WorkerMemory() if not base_w else None
    modes = [m for m in (False, True) if (0 in workers if not m else any(workers))]
    n_probes = max(1, len(modes) * len(kinds))
    max_s = 2.0 if clock.budget_s is None else max(0.05, clock.share(PROBE_SHARE) / n_probes)
    # main-process loading first: its probes time batches of microseconds, which the exit of the
    # previous probe's workers (their memory returned to the kernel) would slow
    for with_workers in modes:
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
                                                   probe_memory if with_workers else None, max_s=max_s)
    if probe_memory is not None and probe_memory.last:
        seen.memory = {**probe_memory.report(), "measured_in": "short probes with workers; your settings have none"}
    return profiles


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
    return {k: (v if isinstance(v, (bool, int, float, str, type(None))) else (_py(v) or f"<your {type(v).__name__}>"))
            for k, v in kw.items()}


def default_progress(msg: str) -> None:
    print(f"doctor: {msg}", flush=True)


__all__ = ["Diagnosis", "doctor", "LoaderArgumentsError"]
