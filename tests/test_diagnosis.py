"""The diagnosis on recorded traces: each stall is a synthetic trace -- stage spans, worker
timelines, the loop's wait and compute, all in made-up seconds -- and the stage it names follows
from those numbers alone, on any machine however busy. tests/test_trace.py checks that real
loaders fill such traces across processes."""
from __future__ import annotations

import pytest

from fastcollate.core import trace as _trace
from fastcollate.doctor import diagnosis


def traced(batches=12, workers=2, fetch=0.032, collate=0.0002, sampler=0.0, rebuild=0.0, transfer=0.0,
           slow_worker=None, slow_factor=1.0, idle=0.0, ring="ring", samples=8, step=0.0):
    """A trace of one epoch: batch i made by worker i % workers (the main process with 0
    workers), each worker's batches back to back but for ``idle`` seconds between them; the
    consumer asks for batch i when the step of batch i - 1 ends. Returns (tracer, wall_s)."""
    tracer = _trace.Tracer(256)
    busy_until = {w: 0.0 for w in range(max(1, workers))}
    asked = 0.0
    for i in range(batches):
        w = i % workers if workers else -1
        scale = slow_factor if w == slow_worker else 1.0
        rec = tracer.record(0, 0, i)
        rec.worker, rec.samples, rec.ring, rec.nbytes = w, samples, ring, 1 << 20
        t0 = busy_until[max(w, 0)]
        if sampler:
            tracer.span(rec, "sampler", t0 - sampler, t0)
        f1 = t0 + fetch * scale
        c1 = f1 + collate * scale
        tracer.span(rec, "fetch", t0, f1)
        tracer.span(rec, "collate", f1, c1)
        tracer.worker_busy(1000 + max(w, 0) if workers else 1, w, t0, c1)
        rec.slowest = (i * samples + 3, fetch * scale / samples)
        ready = c1 + rebuild
        if rebuild:
            tracer.span(rec, "rebuild", c1, ready)
        if transfer:
            tracer.span(rec, "transfer", ready, ready + transfer)
            ready += transfer
        busy_until[max(w, 0)] = c1 + idle
        got = max(asked, ready)
        tracer.span(rec, "wait", asked, got)
        tracer.span(rec, "compute", got, got + step)
        asked = got + step
    return tracer, asked


def diagnose(tracer, wall, compute=None, wait=None, info=None):
    wait = tracer.stages["wait"].total if wait is None else wait
    compute = tracer.stages["compute"].total if compute is None else compute
    return diagnosis.diagnose(tracer, wall, wait, compute, info)


def test_a_slow_getitem_is_the_dataset():
    tracer, wall = traced()
    d = diagnose(tracer, wall)
    assert d["bottleneck"] == "dataset", d["facts"]
    assert "__getitem__" in d["advice"][0] and d["advice"][1].startswith("slowest sample: index ")
    assert {w["id"] for w in d["workers"]} == {0, 1} and all(w["batches"] == 6 for w in d["workers"])


def test_one_slow_worker_is_a_straggler():
    tracer, wall = traced(batches=16, fetch=0.008, slow_worker=1, slow_factor=12)
    d = diagnose(tracer, wall)
    assert d["bottleneck"] == "straggler" and d["facts"]["straggler"]["id"] == 1
    assert d["advice"][0].startswith("worker 1 takes 12.0x the others' time per batch")


@pytest.mark.parametrize("batches, factor", [(14, 12), (16, 0.99 * diagnosis.STRAGGLER_RATIO)])
def test_no_straggler_from_few_batches_or_a_small_ratio(batches, factor):
    # 7 batches a worker say nothing of one worker's mean; under STRAGGLER_RATIO is no straggler
    tracer, wall = traced(batches=batches, fetch=0.008, slow_worker=1, slow_factor=factor)
    d = diagnose(tracer, wall)
    assert d["bottleneck"] == "dataset" and "straggler" not in d["facts"]


def test_a_slow_batch_sampler_is_the_sampler():
    tracer, wall = traced(fetch=0.0005, sampler=0.03)
    d = diagnose(tracer, wall)
    assert d["bottleneck"] == "sampler" and "precompute the index lists" in d["advice"][0]


def test_a_slow_custom_collate_is_the_collate():
    tracer, wall = traced(fetch=0.0005, collate=0.03, ring="custom")
    d = diagnose(tracer, wall)
    assert d["bottleneck"] == "collate" and "your collate_fn" in " ".join(d["advice"])


def test_a_heavy_collate_in_the_main_process_is_the_collate():
    # 32 ready-made 1 MB samples a batch: the copy outweighs the fetch, in the main process
    tracer, wall = traced(batches=3, workers=0, fetch=0.00003, collate=0.008, samples=32)
    d = diagnose(tracer, wall, info={"float_images": False})
    assert d["bottleneck"] == "collate" and [w["id"] for w in d["workers"]] == ["main"]
    assert d["facts"]["workers"] == 0


def test_a_slow_prefetcher_transform_is_the_transfer():
    tracer, wall = traced(fetch=0.0005, transfer=0.03)
    d = diagnose(tracer, wall)
    assert d["bottleneck"] == "transfer" and "pin/H2D/transforms take 30.0 ms" in d["advice"][0]


def test_a_slow_step_is_compute_with_batches_waiting():
    tracer, wall = traced(fetch=0.0005, step=0.03)
    d = diagnose(tracer, wall)
    assert d["facts"]["wait_fraction"] < diagnosis.DATA_BOUND_FRACTION
    assert d["bottleneck"] == "compute" and d["queue"]["mean_ready"] >= 1 and "wait ready" in d["advice"][0]


def test_idle_workers_while_the_loop_waits_point_at_the_main_process():
    # every batch's fetch is the largest cost, yet the workers are idle 3/4 of their time
    tracer, wall = traced(fetch=0.004, idle=0.012, rebuild=0.001)
    d = diagnose(tracer, wall)
    assert d["facts"]["busy"] < diagnosis.BUSY_FRACTION
    assert d["bottleneck"] == "main" and d["facts"]["idle_workers"] and "fewer workers" in d["advice"][0]


def test_a_loop_busy_outside_its_step_is_the_main_process():
    tracer, wall = traced(fetch=0.0005, step=0.001)
    d = diagnose(tracer, 1.0, compute=0.2, wait=0.05)  # 75% of the wall neither step nor wait
    assert d["bottleneck"] == "main" and "outside the step and the data wait" in d["advice"][0]


def test_data_bound_with_nothing_traced_says_so():
    d = diagnosis.diagnose(_trace.Tracer(8), 1.0, 0.9, 0.05)
    assert d["bottleneck"] is None and "trace holds no stage times" in d["advice"][0]


def _advised_workers(d):
    import re
    m = re.search(r"raise num_workers to ~(\d+)", " ".join(d["advice"]))
    return int(m.group(1)) if m else None


@pytest.mark.parametrize("blocked", [0.0, 0.9])
def test_the_advice_is_the_models_on_this_ranks_share(monkeypatch, blocked):
    # 2 of 8 cores' worth of ranks: the monitor advises within this rank's share (4 cores), and the
    # count is the one the doctor's model gives for the same measurements; fetches that wait 90%
    # off the CPU may take more workers than the share's cores
    from fastcollate.tuning import model
    monkeypatch.setattr("fastcollate.tuning.node.affinity_cores", lambda: 8)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    tracer, wall = traced(batches=24, workers=1, fetch=0.032, step=0.002)
    for rec in tracer.records.values():
        rec.fetch_cpu_s, rec.fetch_blocked_s = 0.032 * (1 - blocked), 0.032 * blocked
    d = diagnose(tracer, wall)
    assert d["bottleneck"] == "dataset"
    want, rates = model.fewest_workers(0.0322, 0.0322 * (1 - blocked), 0.0, 0.002, 4)
    assert _advised_workers(d) == want
    assert "this rank's 4 cores (of 8, 2 ranks on the node)" in d["advice"][0]
    if blocked:
        assert want > 4, rates
    else:
        assert want <= 4, rates
