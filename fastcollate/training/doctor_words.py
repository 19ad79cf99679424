"""The doctor's words: what limits the loop now, what the proposal changes and why, computed from
the numbers of the run -- never a fixed list, never advice to use what is already used."""
from __future__ import annotations

import statistics
from typing import Any

from . import model

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


def findings(seen: Any, base: model.Setting, chosen: model.Setting, picks: list[model.Setting],
             verdict: dict[str, Any] | None, work: model.Workload, ceiling: float | None, cache_ok: bool,
             cache_why: str, memory: dict[str, Any], base_rate: float, verified: bool,
             batched: bool = False, cuda: bool = False, pinned: bool = False) -> list[str]:
    p = seen.profile
    out: list[str] = []
    st = _stations(seen, base, work)
    fetch = statistics.fmean(p.fetch_s) if p.fetch_s else 0.0
    per_sample = fetch / max(1, work.batch_size)
    where = f"{base.num_workers} workers" if base.num_workers else "the main process"
    out.append(f"per batch, in {where}: the dataset {_ms(fetch)} ({1e6 * per_sample:.0f} us a sample), the collate "
               f"{_ms(p.mean_make - fetch)}; the main process {_ms(p.main_cpu_s)} of its own work; the step "
               f"{_ms(work.step_s)}; {work.cores} cores")
    if base.num_workers and p.start_s > 0.05:
        out.append(f"starting {base.num_workers} workers takes {p.start_s:.2f} s "
                   f"{'once' if base.persistent_workers else 'every epoch'}")
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
    if ceiling is not None and base_rate > 0 and work.step_s > 0:
        out.append(f"with data free (one batch replayed) the loop runs at {ceiling:.0f} samples/s: data loading "
                   f"costs at most {max(0.0, 1 - base_rate / ceiling):.0%} of your loop's time")
    if verdict is not None:
        r = verdict
        span = over_rounds(f"{r['min']:.2f}", f"{r['max']:.2f}", r["rounds"], "x")
        if r["win"]:
            out.append(f"measured: the proposal is {r['ratio']:.2f}x your settings (every round faster: {span})")
        else:
            tried = "; ".join(r.get("candidate") or []) or "a candidate"
            predicted_gain = f"predicted {r['predicted_ratio']:.2f}x" if r.get("predicted_ratio") else "predicted faster"
            if r["loss"]:
                why = (" (a machine busy with other work gives extra workers less than its cores)"
                       if r.get("more_workers") else "")
                out.append(f"measured: the best candidate ({tried}; {predicted_gain}) was {r['ratio']:.2f}x your "
                           f"settings, slower in every round ({span}): your settings stay{why}")
            else:
                out.append(f"measured: the best candidate ({tried}; {predicted_gain}) was {r['ratio']:.2f}x your "
                           f"settings ({span}): inside the spread, so not a win; your settings stay")
    elif not verified and picks:
        out.append("predicted only (not measured): run it with verify=True (CLI: --fix) to apply and measure it")
    if work.epochs > 1:
        if cache_ok and not chosen.cache:
            tried = verified and any(q.cache for q in picks)
            out.append(f"the dataset could be cached ({cache_why}), but "
                       + ("the cache did not win here" if tried else "the model predicts no gain from it here"))
        elif not cache_ok and fetch > 0.5 * max(st.values(), default=0) and "not deterministic" in cache_why:
            out.append("the dataset is not deterministic, so it is not cached; if its random part is an "
                       "augmentation, cache the deterministic loading and keep the augmentation after it: "
                       "fastcollate.Cached(base, transform=augment)")
    if (not batched and per_sample > 0 and work.batch_size >= 8 and fetch > 0 and per_sample < 50e-6
            and limit == "dataset"):
        out.append("each sample costs little but is fetched one by one: a dataset with __getitems__ (or "
                   "fastcollate.ArrayDataset over arrays) fetches a batch in one call")
    if cuda:
        # advice only: the doctor's runs stay on the host, so the transfer is not measured here
        out.append("with a GPU: feed it through fastcollate.CudaPrefetcher(loader) -- the batch's one arena is "
                   "pinned and copied in one host-to-device copy on a side stream, overlapped with your step"
                   + (" -- and leave the loader's pin_memory=False (its pin thread pins leaf by leaf)" if pinned
                      else ""))
        if (limit == "dataset" and not cache_ok and "not deterministic" in cache_why):
            out.append("the random part of the dataset's work could run on the GPU: return the decoded sample "
                       "and apply the augmentation to the batch after the copy (CudaPrefetcher(loader, "
                       "transform=...)), where it is one kernel for the batch instead of Python per sample")
    if memory.get("finding") == "copy_on_write":
        out.append(f"each worker's private memory grew by ~{memory['growth_mb']:.0f} MB during the run: the dataset "
                   "holds Python objects that every worker touches (copy-on-write); keep it in numpy arrays "
                   "(fastcollate.ArrayDataset) so that workers share it instead of copying it")
    return out
