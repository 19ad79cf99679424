"""From a trace to a finding: per-stage metrics, per-worker busy fractions, the queue of ready
batches, and the stage the loop waits for, with advice specific to it.

How it decides (the README states the same):
  * the consumer waits for data less than DATA_BOUND_FRACTION of the loop's wall time:
    ``compute`` -- batches are ready when the step asks (the queue says how many);
  * else each stage's cost per batch is what it takes the pipeline to make one batch there:
    fetch and collate divided by the number of workers that ran them (they run in parallel;
    main-process loading counts as one), the sampler, the main process's rebuild and the
    prefetcher's pin/H2D/transforms at face value (each is one thread). The largest names the
    bottleneck: ``dataset``, ``collate``, ``sampler``, ``main`` or ``transfer``;
  * ``straggler`` instead of dataset/collate when one worker's mean time per batch is at least
    STRAGGLER_RATIO times the median of the others';
  * ``main`` also when the loop waits little, computes little, and spends more than
    MAIN_FRACTION of its time elsewhere (work outside the step and the data wait).
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Iterable

from ..tuning import model, node

DATA_BOUND_FRACTION = 0.15
STRAGGLER_RATIO = 2.0
MAIN_FRACTION = 0.35
BOTTLENECKS = ("dataset", "collate", "sampler", "straggler", "main", "transfer", "compute")


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def stage_table(tracer: Any) -> dict[str, dict[str, float]]:
    """stage -> total_s (all batches), p50/p95/max in ms (p50/p95 over the recent window), count."""
    out = {}
    for name, st in tracer.stages.items():
        if st.count:
            recent = list(st.recent)
            out[name] = {"total_s": st.total, "p50_ms": 1e3 * _quantile(recent, 0.5),
                         "p95_ms": 1e3 * _quantile(recent, 0.95), "max_ms": 1e3 * st.max, "count": st.count}
    return out


def worker_table(tracer: Any) -> list[dict[str, Any]]:
    rows = []
    for w in sorted(tracer.workers.values(), key=lambda w: (w["id"], w["first"])):
        life = w["last"] - w["first"]
        rows.append({"id": w["id"] if w["id"] >= 0 else "main", "pid": w["pid"], "batches": w["batches"],
                     "busy_s": w["busy_s"], "busy_fraction": min(1.0, w["busy_s"] / life) if life > 0 else 1.0,
                     "mean_batch_ms": 1e3 * w["busy_s"] / max(1, w["batches"])})
    return rows


def queue_depth(records: Iterable[Any]) -> dict[str, Any]:
    """Batches ready and waiting each time the consumer asked for one: those of the same
    loader and epoch, at or after the one it asked for, already made (worker put it in the
    queue, or the prefetcher finished it) -- computed from the records, no sampling cost."""
    by_epoch: dict[tuple[int, int], list[Any]] = {}
    for r in records:
        by_epoch.setdefault((r.loader, r.epoch), []).append(r)
    depths = []
    for recs in by_epoch.values():
        made = sorted((r.index, _made_at(r)) for r in recs if _made_at(r) is not None)
        for r in recs:
            asked = r.spans.get("wait", r.spans.get("deliver", (None,)))[0]
            if asked is None:
                continue
            depths.append(sum(1 for i, t in made if i >= r.index and t <= asked))
    if not depths:
        return {"steps": 0}
    return {"steps": len(depths), "mean_ready": statistics.fmean(depths), "p50_ready": _quantile(depths, 0.5),
            "min_ready": min(depths), "max_ready": max(depths),
            "ready_fraction": sum(1 for d in depths if d > 0) / len(depths)}


def _made_at(r: Any) -> float | None:
    for stage in ("transfer", "collate"):
        if stage in r.spans:
            return r.spans[stage][1]
    return None


def _mean(stages: dict[str, Any], name: str) -> float:
    st = stages.get(name)
    return st["total_s"] / st["count"] if st and st["count"] else 0.0


BUSY_FRACTION = 0.6  # workers busier than this are the stage; idler ones wait for the main process
MIN_BATCHES_PER_WORKER = 8  # fewer and one worker's mean says nothing about a straggler


def diagnose(tracer: Any, wall_s: float, wait_s: float, compute_s: float,
             batch_info: dict[str, Any] | None = None) -> dict[str, Any]:
    stages = stage_table(tracer)
    workers = worker_table(tracer)
    records = list(tracer.records.values())
    queue = queue_depth(records)
    wait_frac = wait_s / wall_s if wall_s > 0 else 0.0
    compute_frac = compute_s / wall_s if wall_s > 0 else 0.0
    in_workers = [w for w in workers if w["id"] != "main"]
    nworkers = len({w["id"] for w in in_workers})
    parallel = max(1, nworkers)
    costs = {"dataset": _mean(stages, "fetch") / parallel, "collate": _mean(stages, "collate") / parallel,
             "sampler": _mean(stages, "sampler"), "main": _mean(stages, "rebuild"),
             "transfer": _mean(stages, "transfer")}
    busy = statistics.fmean([w["busy_fraction"] for w in in_workers]) if in_workers else 1.0
    facts: dict[str, Any] = {"wait_fraction": wait_frac, "compute_fraction": compute_frac, "workers": nworkers,
                             "costs_ms": {k: 1e3 * v for k, v in costs.items()}, "busy": busy,
                             "float_images": None if batch_info is None else batch_info.get("float_images")}
    straggler = _straggler(in_workers)
    if straggler is not None:
        facts["straggler"] = straggler
    if wait_frac < DATA_BOUND_FRACTION:
        other = 1.0 - wait_frac - compute_frac
        bottleneck = "main" if compute_frac < 0.5 and other > MAIN_FRACTION else "compute"
        facts["other_fraction"] = other
    elif not stages or max(costs.values()) <= 0:
        bottleneck = None  # data-bound, and nothing traced to say where
    else:
        bottleneck = max(costs, key=costs.__getitem__)
        if bottleneck in ("dataset", "collate") and straggler is not None:
            bottleneck = "straggler"
        elif bottleneck in ("dataset", "collate") and nworkers and busy < BUSY_FRACTION:
            # the loop waits, yet the workers idle: what they make is not taken faster than this
            bottleneck = "main"
            facts["idle_workers"] = True
    return {"bottleneck": bottleneck, "stages": stages, "workers": workers, "queue": queue,
            "facts": facts, "advice": advice(bottleneck, stages, workers, queue, facts, records)}


def _straggler(workers: list[dict[str, Any]]) -> dict[str, Any] | None:
    # per worker id (a non-persistent loader's workers are new processes each epoch)
    by_id: dict[Any, list[float]] = {}
    for w in workers:
        by_id.setdefault(w["id"], []).append(w["mean_batch_ms"])
    if len(by_id) < 2 or any(w["batches"] < MIN_BATCHES_PER_WORKER for w in workers):
        return None
    means = {k: statistics.fmean(v) for k, v in by_id.items()}
    slow = max(means, key=means.__getitem__)
    others = statistics.median([m for k, m in means.items() if k != slow])
    if others <= 0 or means[slow] < STRAGGLER_RATIO * others:
        return None
    return {"id": slow, "ratio": means[slow] / others, "mean_batch_ms": means[slow]}


def _slowest_sample(records: list[Any], worker: Any = None) -> tuple[Any, float] | None:
    best = None
    for r in records:
        if r.slowest is not None and (worker is None or r.worker == worker):
            if best is None or r.slowest[1] > best[1]:
                best = r.slowest
    return best


def _workers_wanted(stages: dict, records: list[Any], per_batch: float, cores: int) -> int:
    # the doctor's and the auto mode's model, fed with what this trace measured: a fetch's CPU
    # part (the rest waited off the CPU, where more workers than cores still help), the main
    # process's rebuild, the step -- on the host CPU unless the trace timed it on a GPU
    traced = [r for r in records if r.fetch_cpu_s is not None]
    fetched = sum(r.fetch_cpu_s + (r.fetch_blocked_s or 0.0) for r in traced)
    waited = sum(r.fetch_blocked_s or 0.0 for r in traced)
    cpu = per_batch * (1.0 - waited / fetched) if fetched > 0 else per_batch
    step = _mean(stages, "compute")
    want, _ = model.fewest_workers(per_batch, cpu, _mean(stages, "rebuild"), step, cores,
                                   step_cpu=not any(r.gpu_ms for r in records))
    return want


def advice(bottleneck: str | None, stages: dict, workers: list, queue: dict, facts: dict,
           records: list[Any]) -> list[str]:
    mine = node.share()  # under torchrun, this rank's part of the node, not every core
    cores = mine.cores
    on = (f"{cores} cores" if mine.ranks <= 1 else
          f"this rank's {cores} core{'s' if cores != 1 else ''} (of {mine.node_cores}, {mine.ranks} ranks on the node)")
    n = facts["workers"]
    fetch, collate = _mean(stages, "fetch"), _mean(stages, "collate")
    per_batch = fetch + collate
    samples = [r.samples for r in records if r.samples]
    per_sample_ms = 1e3 * fetch / statistics.fmean(samples) if samples else 0.0
    busy = statistics.fmean([w["busy_fraction"] for w in workers if w["id"] != "main"]) if n else 1.0
    want = _workers_wanted(stages, records, per_batch, cores) if per_batch > 0 else n
    if bottleneck == "dataset":
        share = fetch / per_batch if per_batch else 0.0
        where = (f"workers are busy {busy:.0%} of the time, {share:.0%} of it in the dataset's __getitem__"
                 if n else f"loading runs in the main process, {share:.0%} of it in the dataset's __getitem__")
        more = (f"raise num_workers to ~{want}" if want > n else
                "every core already runs a worker: only a cheaper dataset (or more cores) moves this"
                if busy >= 0.8 else "the workers are not all busy: fastcollate.doctor measures what helps")
        out = [f"{where} (p50 {per_sample_ms:.2f} ms a sample, {1e3 * fetch:.1f} ms a batch); {n} workers on "
               f"{on}: {more}"]
        slow = _slowest_sample(records)
        if slow is not None:
            out.append(f"slowest sample: index {slow[0]}, {1e3 * slow[1]:.1f} ms")
        out.append("the dataset is the stage: cache decoded samples, decode smaller images, or move "
                   "augmentation to the GPU (fastcollate.transforms); a faster collate cannot help here")
        return out
    if bottleneck == "collate":
        kinds = {r.ring for r in records if r.ring}
        out = [f"the collate takes {1e3 * collate:.1f} ms a batch (p95 {stages['collate']['p95_ms']:.1f} ms), "
               f"{collate / per_batch:.0%} of each batch's making; {n} workers on {on}"]
        if "custom" in kinds:
            out.append("it is your collate_fn: move per-sample work (tokenizing, augmenting) into the dataset, "
                       "or use fastcollate.Collator(pad=...) for padding")
        else:
            mb = statistics.fmean([r.nbytes for r in records if r.nbytes] or [0]) / 2**20
            more = f"raise num_workers to ~{want}" if want > n else ""
            if facts.get("float_images"):
                out.append(f"fastcollate's collate writes {mb:.1f} MB a batch of float images: ship uint8 and "
                           f"normalize on the GPU (transforms.Normalize){', or ' + more if more else ''}")
            elif more:
                out.append(f"fastcollate's collate writes {mb:.1f} MB a batch: {more}")
            else:
                out.append(f"fastcollate's collate writes {mb:.1f} MB a batch on every core already: fewer or "
                           "smaller fields per sample is what is left")
        return out
    if bottleneck == "straggler":
        s = facts["straggler"]
        slow = _slowest_sample(records, s["id"])
        where = f" (slowest sample: index {slow[0]}, {slow[1]:.2f} s)" if slow is not None else ""
        return [f"worker {s['id']} takes {s['ratio']:.1f}x the others' time per batch{where}",
                "one worker holds the rest back (in-order delivery waits for it): look at what its samples have "
                "in common (size, a slow disk, a remote read), or use in_order=False"]
    if bottleneck == "sampler":
        return [f"the sampler takes {1e3 * _mean(stages, 'sampler'):.2f} ms per batch in the main process, which "
                "workers cannot share: precompute the index lists, or make the batch sampler cheaper"]
    if bottleneck == "transfer":
        out = [f"pin/H2D/transforms take {1e3 * _mean(stages, 'transfer'):.1f} ms a batch on the prefetch thread"]
        if facts.get("float_images") is not False:
            out.append("ship uint8 and normalize on the GPU (transforms.Normalize): 4x fewer bytes than float32")
        out.append("raise the prefetcher depth so copies overlap more compute")
        return out
    if bottleneck == "main":
        if facts.get("idle_workers"):
            return [f"the loop waits for data while the workers are busy only {busy:.0%} of the time: the main "
                    f"process's handling of each batch (rebuild {1e3 * _mean(stages, 'rebuild'):.2f} ms, the queue, "
                    "the loop) limits it, not the dataset; fewer workers or main-process loading may be faster "
                    "(fastcollate.doctor predicts and measures it)"]
        if facts.get("other_fraction", 0) > MAIN_FRACTION:
            return [f"the loop spends {facts['other_fraction']:.0%} of its time outside the step and the data wait: "
                    "logging, metrics or host syncs (.item()) in the loop"]
        return [f"the main process rebuilds each batch in {1e3 * _mean(stages, 'rebuild'):.2f} ms: fewer, larger "
                "leaves per batch, or fastcollate.DataLoader's ring"]
    if bottleneck == "compute":
        if queue.get("steps"):
            return [f"batches wait ready in the queue at {queue['ready_fraction']:.0%} of steps (mean "
                    f"{queue['mean_ready']:.1f} ready): compute-bound; speed comes from the model side now",
                    "try a bigger batch, bfloat16 autocast, channels_last, torch.compile"]
        return ["the data pipeline keeps up: compute-bound; speed comes from the model side now"]
    return ["data-bound, but the trace holds no stage times: wrap a DataLoader (torch's or fastcollate's) with "
            "StallMonitor(trace=True)"]
