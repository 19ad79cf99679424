"""The doctor's words: what limits the loop now, what the proposal changes and why, computed from
the numbers of the run -- never a fixed list, never advice to use what is already used."""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from ..tuning import model

MIN_GAIN = 1.05  # a predicted gain below this is no reason to change anything

_KIND_WORDS = {"torch": "torch's DataLoader with default_collate",
               "torch+fastcollate": "torch's DataLoader with collate_fn=fastcollate.collate",
               "fastcollate": "fastcollate.DataLoader (the worker ring)"}


def _ms(s: float) -> str:
    return f"{1e3 * s:.2f} ms"


def over_rounds(lo: str, hi: str, rounds: int, unit: str = "") -> str:
    """A measured span in words: "1.68-1.75x over 2 rounds", or "15.06x in one round" (a
    difference past measure.OVERWHELMING is decided in one)."""
    if rounds == 1:
        return f"{lo}{unit} in one round"
    return f"{lo}-{hi}{unit} over {rounds} rounds"


def _stations(seen: Any, base: model.Setting, work: model.Workload) -> dict[str, float]:
    """Seconds per batch each station needs in the user's settings (the largest limits them)."""
    p = seen.profile
    fetch = statistics.fmean(p.fetch_s) if p.fetch_s else 0.0
    make = p.mean_make
    if base.num_workers:
        per_worker = make / max(1, base.num_workers) / max(1.0, p.contention)
        share = fetch / make if make else 0.0
        return {"dataset": per_worker * share, "collate": per_worker * (1 - share), "main": p.main_cpu_s,
                "compute": work.step_s,
                "startup": p.start_s * (1 if base.persistent_workers else work.epochs) / max(1, work.batches * work.epochs)}
    return {"dataset": fetch, "collate": make - fetch, "main": p.main_cpu_s, "compute": work.step_s, "startup": 0.0}


def bottleneck_of(seen: Any, base: model.Setting, chosen: model.Setting, work: model.Workload, base_rate: float,
                  chosen_rate: float) -> str:
    """The stage that limits the user's loop: the station with the largest demand per batch (the
    step is 'compute'; worker start-up, spread over the batches, is 'startup'); 'straggler'
    when rare slow batches, delivered in order, cost more than their mean. A slow batch is one
    whose fetch took far more CPU or waiting than the typical one (seen.spikes_s) -- not one that
    a busy machine's scheduler held up, which on a cheap dataset is most of the outliers."""
    st = _stations(seen, base, work)
    name = max(st, key=st.__getitem__)
    make = seen.profile.make_s
    if name in ("dataset", "collate") and base.num_workers and len(make) >= 8:
        med = statistics.median(make)
        if med > 0 and max(seen.spikes_s, default=0.0) > 4 * med:
            return "straggler"
    return name


def changes(base: model.Setting, chosen: model.Setting) -> list[str]:
    out = []
    if chosen.kind != base.kind:
        out.append(f"{_KIND_WORDS[base.kind]} -> {_KIND_WORDS[chosen.kind]}")
    if chosen.num_workers != base.num_workers:
        out.append(f"num_workers {base.num_workers} -> {chosen.num_workers}")
    if chosen.num_workers and chosen.prefetch_factor != base.prefetch_factor:
        out.append(f"prefetch_factor {base.prefetch_factor} -> {chosen.prefetch_factor}")
    if chosen.num_workers and chosen.persistent_workers != base.persistent_workers:
        out.append(f"persistent_workers {base.persistent_workers} -> {chosen.persistent_workers}")
    if chosen.cache and not base.cache:
        out.append("cache the samples: fastcollate.Cached(dataset)")
    return out


@dataclasses.dataclass
class Facts:
    """What the words are computed from: the run, the decision, the proof, the machine."""

    seen: Any
    base: model.Setting
    chosen: model.Setting
    picks: list[model.Setting]
    verdict: dict[str, Any] | None
    work: model.Workload
    ceiling: float | None = None
    cache_state: str = "no"        # "yes" | "conditional" | "no"
    cache_why: str = "not checked"
    memory: dict[str, Any] = dataclasses.field(default_factory=dict)
    base_rate: float = 0.0
    verified: bool = True
    batched: bool = False
    cuda: bool = False
    pinned: bool = False
    limits: Any = None             # plan.Limits
    conditional: tuple[float, model.Setting] | None = None
    proof: Any = None              # proof.Proof
    share: Any = None              # fastcollate.tuning.node.NodeShare
    load: dict[str, Any] | None = None
    cut: int | None = None         # batches of each epoch measured (None: whole epochs)
    budget_s: float | None = None
    measured_rate: float | None = None  # the proposal's, measured
    epoch_attr: str | None = None
    yours_rate: float | None = None     # the user's settings: measured, else as traced


def findings(f: Facts) -> list[str]:
    seen, base, chosen, picks, verdict, work = f.seen, f.base, f.chosen, f.picks, f.verdict, f.work
    p = seen.profile
    out: list[str] = []
    st = _stations(seen, base, work)
    fetch = statistics.fmean(p.fetch_s) if p.fetch_s else 0.0
    per_sample = fetch / max(1, work.batch_size)
    where = f"{base.num_workers} workers" if base.num_workers else "the main process"
    out.append(f"per batch of {work.batch_size} samples, in {where}: the dataset {_ms(fetch)} "
               f"({1e6 * per_sample:.0f} us a sample), the collate {_ms(p.mean_make - fetch)}; the main process "
               f"{_ms(p.main_cpu_s)} of its own work; the step {_ms(work.step_s)}; {work.batches} batches an epoch")
    out += _machine(f)
    if seen.waiting >= 0.3:
        out.append(f"the fetches wait {seen.waiting:.0%} of their time off the CPU (reading files or the network, "
                   "sleeping): workers overlap that waiting, so more of them than cores can pay")
    if base.num_workers and p.start_s > 0.05:
        out.append(f"starting {base.num_workers} workers takes {p.start_s:.2f} s "
                   f"{'once' if base.persistent_workers else 'every epoch'}")
    if f.limits is not None:
        out += [why for key, why in f.limits.why.items() if key != "io"]
    if f.epoch_attr and base.persistent_workers:
        out.append(f"your persistent workers keep the copy of the dataset they started with: {f.epoch_attr} called "
                   "in the main process does not reach them (torch does not send it), so they serve the epoch they "
                   "started in; use persistent_workers=False with an epoch-dependent dataset")
    limit = max(st, key=st.__getitem__)
    if not picks:
        # (with picks, the model did predict a gain: the measured verdict below says what became of it)
        if limit == "compute":
            out.append(f"the step takes {_ms(work.step_s)} a batch, more than anything the loader does: no loader "
                       "change will help (predicted gain ~1.0x); speed comes from the model side")
        elif limit == "main":
            out.append(f"the main process's own work ({_ms(p.main_cpu_s)} a batch) limits the loop: no loader "
                       "setting moves it (predicted gain ~1.0x); make the loop lighter (logging, host syncs)")
        else:
            out.append("no loader setting predicts a gain of 5% or more: your settings stay")
    out += _ceiling(f)
    if verdict is not None:
        out += _verdict(f)
    elif not f.verified and picks:
        out.append("predicted only (not measured): run it with verify=True (the CLI does by default) to apply and "
                   "measure it")
    if f.verified and f.cut == 0:
        out.append(f"measured nothing: the budget ({f.budget_s:g} s) left no time for a round of a few batches of "
                   "each setting; the figures are predictions (raise budget_s)")
    elif f.cut:
        out.append(f"measured on the first {f.cut} of the {work.batches} batches of each epoch (budget_s "
                   f"{f.budget_s:g} s), loader creation included")
    out += _cache_words(f, fetch, st)
    if (not f.batched and per_sample > 0 and work.batch_size >= 8 and fetch > 0 and per_sample < 50e-6
            and limit == "dataset"):
        out.append("each sample costs little but is fetched one by one: a dataset with __getitems__ (or "
                   "fastcollate.ArrayDataset over arrays) fetches a batch in one call")
    if f.cuda:
        # advice only: the doctor's runs stay on the host, so the transfer is not measured here
        out.append("with a GPU: feed it through fastcollate.CudaPrefetcher(loader) -- the batch's one arena is "
                   "pinned and copied in one host-to-device copy on a side stream, overlapped with your step"
                   + (" -- and leave the loader's pin_memory=False (its pin thread pins leaf by leaf)" if f.pinned
                      else ""))
        if limit == "dataset" and f.cache_state == "no" and "differ" in f.cache_why:
            out.append("the random part of the dataset's work could run on the GPU: return the decoded sample "
                       "and apply the augmentation to the batch after the copy (CudaPrefetcher(loader, "
                       "transform=...)), where it is one kernel for the batch instead of Python per sample")
    mem = f.memory
    if mem.get("finding") == "copy_on_write":
        out.append(f"each worker's private memory grew by ~{mem['growth_mb']:.0f} MB during the run: the dataset "
                   "holds Python objects that every worker touches (copy-on-write); keep it in numpy arrays "
                   "(fastcollate.ArrayDataset) so that workers share it instead of copying it")
    return out


def _machine(f: Facts) -> list[str]:
    """Which rank was measured and its share of the node; the machine's load."""
    out = []
    if f.share is not None and f.share.ranks > 1:
        out.append(f"measured on {f.share.describe()}: the plan stays within this rank's share")
    load = f.load or {}
    others = load.get("others_busy_cores")
    if others is not None and others >= 0.5:
        out.append(f"the machine was busy: other processes kept ~{others:.1f} cores busy when the doctor started "
                   f"(load average {load.get('load_average_start') or 0:.1f}); it planned with "
                   f"{_cores(load.get('cores_planned'))}, and the measured ratios hold for a machine this busy")
    return out


def _cores(n: Any) -> str:
    return f"{n} core" if n == 1 else f"{n} cores"


def _ceiling(f: Facts) -> list[str]:
    """The loop with data free against the user's rate: what data loading costs. The ceiling is
    never below a rate measured with data (the doctor lifts it to the fastest), so the share said
    here is never below what a measured win implies."""
    if f.ceiling is None or f.work.step_s <= 0 or not f.yours_rate:
        return []
    share = max(0.0, 1 - f.yours_rate / f.ceiling)
    how = "measured" if f.verified and f.cut != 0 else "as traced"
    return [f"with data free (one batch replayed) the loop runs at {f.ceiling:.0f} samples/s against your "
            f"{f.yours_rate:.0f} ({how}): waiting for data costs ~{share:.0%} of your loop's time"]


def _verdict(f: Facts) -> list[str]:
    r = f.verdict
    span = over_rounds(f"{r['min']:.2f}", f"{r['max']:.2f}", r["rounds"], "x")
    if r["win"]:
        return [f"measured: the proposal is {r['ratio']:.2f}x your settings (every round faster: {span})"]
    tried = "; ".join(r.get("candidate") or []) or "a candidate"
    predicted_gain = f"predicted {r['predicted_ratio']:.2f}x" if r.get("predicted_ratio") else "predicted faster"
    if r["loss"]:
        why = (" (a machine busy with other work gives extra workers less than its cores)"
               if r.get("more_workers") else "")
        return [f"measured: the best candidate ({tried}; {predicted_gain}) was {r['ratio']:.2f}x your settings, "
                f"slower in every round ({span}): your settings stay{why}"]
    return [f"measured: the best candidate ({tried}; {predicted_gain}) was {r['ratio']:.2f}x your settings "
            f"({span}): inside the spread, so not a win; your settings stay"]


def _cache_words(f: Facts, fetch: float, st: dict[str, float]) -> list[str]:
    if f.work.epochs <= 1:
        return []
    if f.cache_state == "yes" and not f.chosen.cache:
        tried = f.verified and any(q.cache for q in f.picks)
        return [f"the dataset could be cached ({f.cache_why}), but "
                + ("the cache did not win here" if tried else "the model predicts no gain from it here")]
    if f.cache_state == "conditional" and f.conditional is not None:
        rate, _ = f.conditional
        gain = rate / f.base_rate if f.base_rate > 0 else 0.0
        if gain < MIN_GAIN:
            return []
        proof = f.proof
        if proof is not None and proof.verdict == "proven":
            read = ", ".join(proof.files[:2]) or f"~{proof.file_bytes_per_sample / 1e3:.1f} kB a sample"
            what = (f"every sample was the same on every fetch, but the fetches read files ({read}), and a cache "
                    "keeps the first read for good: true only if the files do not change during training (then "
                    "pass files_static=True, CLI --files-static, and the doctor measures it)")
        else:
            what = (f"{f.cache_why.split(';')[0]}: true only if every sample is the same on every fetch (a cache "
                    "keeps the first fetch for good; a larger budget_s lets the doctor check them all)")
        return [f"not proposed, on a condition you must know to be true: caching the samples "
                f"(fastcollate.Cached(dataset)) is predicted {gain:.2f}x your settings; {what}"]
    if f.cache_state == "no" and fetch > 0.5 * max(st.values(), default=0) and "differ" in f.cache_why:
        return [f"the dataset is not deterministic ({f.cache_why}), so it is not cached; if its random part is an "
                "augmentation, cache the deterministic loading and keep the augmentation after it: "
                "fastcollate.Cached(base, transform=augment)"]
    return []
