"""num_workers="auto": the decision on made-up measurements (fastcollate.tuning.decide: no clock is
read, nothing depends on the machine's speed), and the loader end to end with the decisions
scripted -- the batches equal a fixed loader's while the setting changes, every decision is
logged with its evidence, persistent workers are restarted to resize, and everything a loader
was (len, pickling, with_ring) still is."""
from __future__ import annotations

import logging
import os
import pickle

import pytest
import torch
import torch.utils.data as tud

import fastcollate
from fastcollate.tuning import node
from fastcollate.tuning import decide as plan
from helpers import assert_same

GIB = 1 << 30
BUDGET = plan.Budget(cores=2, memory_bytes=8 * GIB, words="2 cores")


def measure(choice, *, batches=64, batch_size=16, fetch=4e-3, collate=0.2e-3, cpu=None, blocked=0.0, step=0.1e-3,
            main=0.05e-3, epoch=0, start=0.05, worker_mb=40.0, batch_bytes=4096, cores=2):
    """One epoch's measurements as a pipeline of these costs would give them (a rough in-order
    model: a batch every max(make / workers, main + step) once the workers run)."""
    cpu = fetch + collate - blocked if cpu is None else cpu
    make = fetch + collate
    w = choice.workers
    if w:
        per = max(make / min(w, cores + w * blocked / make), main + step)
        wall = start + make + batches * per
        wait = wall - batches * step
        return plan.EpochMeasure(epoch=epoch, choice=choice, batches=batches, samples=batches * batch_size,
                                 wall_s=wall, wait_s=wait, step_s=batches * step, main_cpu_s=batches * main,
                                 process_cpu_s=batches * (main + step), first_s=start + make, started=True,
                                 worker_batches=batches, fetch_s=batches * fetch, collate_s=batches * collate,
                                 fetch_cpu_s=batches * cpu, fetch_blocked_s=batches * blocked,
                                 worker_cpu_s=batches * cpu * 1.05, worker_mb=worker_mb, batch_bytes=batch_bytes)
    wall = batches * (make + main + step)
    return plan.EpochMeasure(epoch=epoch, choice=choice, batches=batches, samples=batches * batch_size, wall_s=wall,
                             wait_s=batches * (make + main), step_s=batches * step, main_cpu_s=batches * (cpu + main),
                             main_blocked_s=batches * blocked, process_cpu_s=batches * (cpu + main + step),
                             first_s=make + main, worker_batches=batches, fetch_s=batches * fetch,
                             collate_s=batches * collate, fetch_cpu_s=batches * cpu, fetch_blocked_s=batches * blocked,
                             batch_bytes=batch_bytes)


def state(w=2, prefetch=2, **limits):
    return plan.State(current=plan.Choice(w, prefetch), limits=plan.Limits(**limits))


# ---- the decision ---------------------------------------------------------------------------------

def test_a_cpu_bound_fetch_in_the_main_process_gets_workers_up_to_the_share():
    st = state(0)
    rec = plan.decide(st, measure(plan.Choice(0), fetch=10e-3), BUDGET)
    assert rec.action == "change" and rec.after.workers == 2 and st.current == rec.after
    assert rec.predicted > 1.5 * rec.predicted_before
    one_core = plan.Budget(cores=1, memory_bytes=8 * GIB)
    rec = plan.decide(state(0), measure(plan.Choice(0), fetch=10e-3), one_core)
    assert rec.after.workers <= 1  # a CPU-bound fetch: never past the cores (one core: nothing to gain)


def test_an_io_bound_fetch_gets_more_workers_than_cores():
    st = state(2)
    m = measure(plan.Choice(2), fetch=20e-3, collate=0.1e-3, cpu=0.5e-3, blocked=19.6e-3)
    rec = plan.decide(st, m, BUDGET)
    assert rec.action == "change" and rec.after.workers > 2, str(rec)
    assert "wait" in rec.reason and "up to" in rec.reason  # the log says why past the cores


def test_a_compute_bound_loop_is_left_alone_after_its_first_epoch():
    st = state(2)
    rec = plan.decide(st, measure(plan.Choice(2), fetch=2e-3, step=20e-3), BUDGET)
    assert rec.action == "keep" and rec.settled and st.current == plan.Choice(2, 2)
    assert "no other setting is predicted to gain 10%" in rec.reason
    for e in range(1, 4):  # settled: it stays, whatever the next epochs measure
        rec = plan.decide(st, measure(plan.Choice(2), fetch=30e-3, step=1e-4, epoch=e), BUDGET)
        assert rec.action == "keep" and rec.after == plan.Choice(2, 2) and rec.reason == "settled"


def test_a_change_that_measured_a_loss_is_reverted_and_never_tried_again():
    st = state(0)
    first = plan.decide(st, measure(plan.Choice(0), fetch=10e-3), BUDGET)
    assert first.action == "change"
    tried = first.after
    # the new setting measured slower than the old one (whatever the model said)
    worse = measure(tried, fetch=40e-3, epoch=1)
    assert worse.samples_per_s < st.measured[plan.Choice(0)]
    rec = plan.decide(st, worse, BUDGET)
    assert rec.action == "revert" and rec.before == tried and rec.after == plan.Choice(0)
    assert st.current == plan.Choice(0) and tried in st.tabu and "a loss" in rec.reason
    for e in range(2, 6):
        rec = plan.decide(st, measure(st.current, fetch=10e-3, epoch=e), BUDGET)
        # nor anything further that way: no more workers than the step that lost (any prefetch)
        assert rec.after.workers < tried.workers


def test_a_change_that_held_is_kept_and_the_climb_settles():
    st = state(0)
    plan.decide(st, measure(plan.Choice(0), fetch=10e-3), BUDGET)
    seen = [st.current]
    for e in range(1, 8):
        rec = plan.decide(st, measure(st.current, fetch=10e-3, epoch=e), BUDGET)
        seen.append(st.current)
        if rec.settled:
            break
    assert rec.settled and st.current.workers == 2
    assert "the change held" in "".join(str(r) for r in [rec]) or rec.reason == "settled"
    assert len(seen) <= 6  # a few epochs at most: every setting is tried once


def test_the_rank_share_bounds_the_workers(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(node.os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setattr(node.os, "cpu_count", lambda: 4)
    budget = plan.Budget.of(node.share(available_bytes=16 * GIB))
    assert budget.cores == 2 and budget.memory_bytes == 8 * GIB
    st = state(0)
    rec = plan.decide(st, measure(plan.Choice(0), fetch=10e-3, cores=4), budget)
    assert rec.after.workers == 2  # 4 cores on the node, 2 ranks: 2 for this one
    options, words = plan.allowed(st, budget)
    assert max(c.workers for c in options) == 2 and "2 cores" in words
    # two ranks on 2 cores: the loader starts with this rank's one core
    monkeypatch.setattr(node.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(node.os, "cpu_count", lambda: 2)
    loader = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")
    assert loader.num_workers == 1
    assert "min(2, this rank's 1 core)" in str(loader._auto.log[0] if loader._auto.log else loader._auto._why)


def test_a_busy_machine_plans_with_the_cores_left_and_the_model_is_corrected_by_what_it_measured():
    # 46 ms of CPU a batch, 8 batches an epoch, a pool that takes 0.4 s to start, another process
    # on one of the 2 cores: the model (told 1 core) is corrected by the epoch it mispredicted
    st = state(2)
    m = measure(plan.Choice(2), fetch=46e-3, batches=8, start=0.4)
    m.others_busy = 1.1
    rec = plan.decide(st, m, plan.Budget(cores=2, memory_bytes=8 * GIB, affinity=2))
    assert rec.action == "change" and rec.after == plan.Choice(0), str(rec)
    assert "within 1 core" in rec.reason and "other processes kept 1.1 of 2 cores busy" in rec.reason
    assert "corrected" in rec.reason and 0.25 <= st.calibration[True] <= 4
    assert "other processes kept 1.1 cores busy" in str(rec)  # the evidence says it too


def test_a_slow_sample_in_the_first_batch_is_not_the_pools_start_up():
    st = state(2)
    m = measure(plan.Choice(2), fetch=4e-3, start=0.02)
    m.first_s += 0.03  # the first batch held a 30 ms sample
    m.first_make_s = 4.2e-3 + 0.03
    plan.decide(st, m, BUDGET)
    assert st.start[0] == pytest.approx(0.02, abs=1e-3) and st.start[1] == 2


def test_the_memory_budget_bounds_the_workers():
    small = plan.Budget(cores=8, memory_bytes=int(1.2 * 200 * (1 << 20)))  # room for one 100 MB worker
    st = state(1)
    rec = plan.decide(st, measure(plan.Choice(1, 2), fetch=10e-3, worker_mb=100.0, cores=8), small)
    assert rec.after.workers <= 1, str(rec)


def test_only_prefetch_is_tuned_when_the_workers_are_yours():
    st = state(2, workers=False)
    opts, _ = plan.allowed(st, BUDGET)
    assert {c.workers for c in opts} == {2} and {c.prefetch for c in opts} == {2, 4, 8}


def test_a_worker_init_fn_rules_out_main_process_loading():
    st = state(2, min_workers=1)
    opts, _ = plan.allowed(st, BUDGET)
    assert min(c.workers for c in opts) == 1


def test_a_short_epoch_decides_nothing_and_an_empty_one_says_nothing():
    st = state(2)
    rec = plan.decide(st, measure(plan.Choice(2), batches=3), BUDGET)
    assert rec.action == "keep" and not rec.settled and "only 3 batches" in rec.reason
    assert plan.decide(st, measure(plan.Choice(2), batches=0), BUDGET) is None


def test_a_record_is_its_log_line():
    st = state(0)
    rec = plan.decide(st, measure(plan.Choice(0), fetch=10e-3), BUDGET)
    line = str(rec)
    assert line.startswith("fastcollate auto: after epoch 0: change num_workers 0 -> 2")
    for word in ("samples/s", "waited", "fetch", "collate", "step", "CPU", "predicted"):
        assert word in line
    d = rec.to_dict()
    assert d["from"] == "num_workers 0" and d["to"] == "num_workers 2, prefetch_factor 2" and d["samples_per_s"] > 0


# ---- the loader -----------------------------------------------------------------------------------

class Squares(tud.Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        return {"x": torch.arange(4, dtype=torch.float32) * i, "y": i}


def scripted(*choices):
    """A decide that changes the setting to each of ``choices`` in turn (one per epoch), with the
    real measurements as evidence."""
    plan_ = list(choices)

    def decide(st, m, budget):
        if not plan_:
            st.settled = True
            return plan.Record(m.epoch, "keep", st.current, st.current, "settled", measured=m, settled=True)
        before, st.current = st.current, plan_.pop(0)
        return plan.Record(m.epoch, "change", before, st.current, "scripted", measured=m, predicted=1.0)
    return decide


def epochs(loader, n):
    out = []
    for _ in range(n):
        out.append([b for b in loader])
    return out


@pytest.mark.parametrize("persistent", [False, True])
def test_batches_equal_a_fixed_loaders_while_the_setting_changes(persistent):
    kw = dict(batch_size=8, shuffle=True, persistent_workers=persistent)
    torch.manual_seed(0)  # the shuffle draws from torch's global generator, every epoch
    fixed = epochs(fastcollate.DataLoader(Squares(), num_workers=2, **kw), 4)
    torch.manual_seed(0)
    auto = fastcollate.DataLoader(Squares(), num_workers="auto", **kw)
    auto._auto.decide = scripted(plan.Choice(0), plan.Choice(3, 4), plan.Choice(1, 2))
    got = epochs(auto, 4)
    assert [r.after.workers for r in auto.auto_log if r.action == "change"] == [0, 3, 1]
    assert auto.num_workers == 1 and auto.prefetch_factor == 2
    for a, b in zip(fixed, got):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)


def test_persistent_workers_are_restarted_only_to_resize():
    loader = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto", persistent_workers=True)
    loader._auto.decide = scripted(plan.Choice(2, 2), plan.Choice(3, 2))  # a first "change" to the same: kept
    pids = []
    for _ in range(4):
        for _b in loader:
            pass
        pids.append(sorted(w.pid for w in loader._iterator._workers))
    assert pids[0] == pids[1] and len(pids[2]) == 3 and pids[2] == pids[3] and not set(pids[1]) & set(pids[2])


def test_every_decision_is_logged_with_its_evidence(caplog):
    loader = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")
    loader._auto.decide = scripted(plan.Choice(1, 4))
    with caplog.at_level(logging.INFO, logger="fastcollate"):
        epochs(loader, 4)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fastcollate auto:")]
    # the start, the change, the keep that settles it; a settled loader logs nothing more
    assert lines == [str(r) for r in loader.auto_log] and len(lines) == 3 and loader.auto_log[-1].settled
    assert loader._auto.last.epoch == 2 and loader._auto.last.choice == plan.Choice(1, 4)
    assert "epoch 0 starts with num_workers 2, prefetch_factor 2" in lines[0] and "cores" in lines[0]
    assert "change num_workers 2 -> 1, prefetch_factor 2 -> 4" in lines[1]
    for line in lines[1:]:
        assert "samples/s over 12 batches" in line and "fetch" in line and "collate" in line and "step" in line
    m = loader.auto_log[1].measured
    assert m.worker_batches == 12 and m.fetch_cpu_s > 0 and m.batches == 12 and m.samples == 96


def test_the_real_decision_runs_end_to_end():
    loader = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")
    epochs(loader, 3)
    log = loader.auto_log
    assert log[0].action == "start" and all(r.action in ("keep", "change", "revert") for r in log[1:])
    assert len(log) == 3 and 0 <= loader.num_workers <= 8 * node.share().cores


def test_main_process_epochs_are_measured_too():
    loader = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")
    loader._auto.decide = scripted(plan.Choice(0))
    epochs(loader, 3)
    m = loader.auto_log[2].measured
    assert m.choice == plan.Choice(0) and m.worker_batches == 12 and m.fetch_s > 0 and m.main_cpu_s > 0


def test_len_state_pickling_and_with_ring_are_unaffected():
    loader = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")
    assert len(loader) == 12 and not hasattr(loader, "state_dict")
    assert isinstance(loader.num_workers, int) and loader.prefetch_factor == 2
    epochs(loader, 2)
    copy = pickle.loads(pickle.dumps(loader))
    assert [str(r) for r in copy.auto_log] == [str(r) for r in loader.auto_log]
    assert [len(e) for e in epochs(copy, 2)] == [12, 12]
    assert [str(r) for r in copy.auto_log[:len(loader.auto_log)]] == [str(r) for r in loader.auto_log]
    assert copy._auto.last is not None and copy._auto.last.batches == 12  # measured after the copy too
    assert pickle.loads(pickle.dumps(loader.collate_fn)).inner is fastcollate.collate
    assert fastcollate.DataLoader(Squares(), batch_size=8).auto_log == []

    class Mine(tud.DataLoader):
        pass

    Loader = fastcollate.with_ring(Mine)
    assert len([b for b in Loader(Squares(), batch_size=8, num_workers=2)]) == 12
    with pytest.raises(ValueError, match="fastcollate.DataLoader's"):
        Loader(Squares(), batch_size=8, num_workers="auto")


@pytest.mark.parametrize("kw, match", [({"num_workers": "fast"}, "num_workers must be an int or \"auto\", got 'fast'"),
                                       ({"prefetch_factor": "deep", "num_workers": 2}, "prefetch_factor must be")])
def test_bad_values_raise_a_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        fastcollate.DataLoader(Squares(), batch_size=8, **kw)


class Stream(tud.IterableDataset):
    def __iter__(self):
        info = tud.get_worker_info()
        wid, n = (info.id, info.num_workers) if info else (0, 1)
        return iter(range(wid, 64, n))


def test_an_iterable_dataset_refuses_auto_workers_but_tunes_prefetch():
    with pytest.raises(ValueError, match="IterableDataset"):
        fastcollate.DataLoader(Stream(), batch_size=4, num_workers="auto")
    loader = fastcollate.DataLoader(Stream(), batch_size=4, num_workers=2, prefetch_factor="auto")
    fixed = epochs(fastcollate.DataLoader(Stream(), batch_size=4, num_workers=2), 3)
    loader._auto.decide = scripted(plan.Choice(2, 8), plan.Choice(2, 4))
    got = epochs(loader, 3)
    assert loader.num_workers == 2 and loader.prefetch_factor == 4
    assert [[b.tolist() for b in e] for e in got] == [[b.tolist() for b in e] for e in fixed]
    assert fastcollate.DataLoader(Squares(), batch_size=8, prefetch_factor="auto").prefetch_factor is None


def test_worker_init_fn_still_runs_and_stays_yours():
    calls = torch.zeros(4, dtype=torch.int64).share_memory_()

    def init(worker_id):
        calls[worker_id] += 1

    loader = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto", worker_init_fn=init)
    loader._auto.decide = scripted(plan.Choice(3, 2))
    epochs(loader, 2)
    assert loader.worker_init_fn is init and calls.tolist() == [2, 2, 1, 0]
    assert loader._auto.state.limits.min_workers == 1


def test_a_dropped_auto_loader_frees_its_workers_at_once():
    import gc

    gc.disable()  # no collection: only reference counts may free it (a cycle would keep the workers)
    try:
        loader = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto", persistent_workers=True)
        loader._auto.frozen = True  # measuring, never changing: the pool stays
        epochs(loader, 2)
        workers = list(loader._iterator._workers)
        assert workers and all(w.is_alive() for w in workers)
        del loader
        assert not any(w.is_alive() for w in workers)
    finally:
        gc.enable()


def rare_slow_epoch():
    """2 workers, prefetch 2, 48 batches of 8: most ~0.5 ms, 10 (after the first) 30 ms longer --
    one sample in 37 waits 30 ms; in order, each slow batch holds up the ones behind it (the
    figures of a measured epoch of benchmarks/auto_mode.py's rare-slow case, 2 cores)."""
    m = measure(plan.Choice(2, 2), batches=48, batch_size=8, fetch=7.1e-3, collate=0.15e-3, blocked=6.4e-3,
                step=0.1e-3, start=0.03)
    m.spikes, m.spike_s = 10, 0.304
    m.wall_s, m.first_s, m.first_make_s = 0.397, 0.062, 0.032
    m.wait_s = m.wall_s - m.step_s
    return m


def test_rare_slow_batches_get_more_workers_and_deeper_prefetch_not_the_main_process():
    st = state(2)
    rec = plan.decide(st, rare_slow_epoch(), BUDGET)
    # the model plays the slow batches out in order: two workers cannot hide them, more can
    assert rec.action == "change" and rec.after.workers >= 4, str(rec)
    assert 0.7 <= st.calibration[True] <= 1.3, st.calibration


def test_the_way_of_loading_not_measured_yet_is_taken_at_face_value_so_that_it_gets_tried():
    # the model was 2x fast on this epoch with workers; main-process loading, never measured, is
    # predicted from the workers' own CPU and waiting -- which a forked worker can inflate several
    # times (copy-on-write of cached samples): its prediction is not scaled by the workers' error
    m = rare_slow_epoch()
    m.wall_s *= 2
    m.wait_s = m.wall_s - m.step_s
    st = state(2)
    rec = plan.decide(st, m, BUDGET)
    assert st.calibration[True] < 0.5 and False not in st.calibration
    raw = plan.predict(st, plan.Choice(0), m, BUDGET, plan._profiles(st))
    assert rec.after == plan.Choice(0) and rec.predicted == pytest.approx(raw, rel=1e-9), str(rec)
