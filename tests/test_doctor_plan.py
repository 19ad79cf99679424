"""The doctor's decisions on given measurements (doctor_plan, the model, measure's rounds, the
words): what it may propose, what it predicts, how it spends a budget -- on made-up numbers, so
that no test here depends on how fast or busy the machine is."""
from __future__ import annotations

import time

import pytest
import torch

import fastcollate
import doctor_data as dd
from fastcollate.doctor import diagnose as doctor_mod
from fastcollate.doctor import plan as doctor_plan
from fastcollate.doctor import words as doctor_words
from fastcollate.tuning import measure, model

KINDS = ["torch", "torch+fastcollate", "fastcollate"]


def _profile(kind, workers, make=1e-3, main=1e-4, cpu=None):
    return model.Profile(kind, workers, make_s=[make] * 8, fetch_s=[0.9 * make] * 8, worker_cpu_s=cpu or make,
                         main_cpu_s=main, cpu_s=cpu)


def _lim(base, **kw):
    args = dict(cores=2, waiting=0.0, memory_workers=None, iterable=False, epoch=None, worker_init=False,
                main_fetch_ok=True, cache="no")
    args.update(kw)
    return doctor_plan.limits(base, KINDS, **args)


def test_an_iterable_dataset_keeps_its_worker_count():
    assert _lim(model.Setting("torch", 2), iterable=True).workers == [2]
    assert _lim(model.Setting("torch", 0), iterable=True).workers == [0, 1]  # the same stream either way
    lim = _lim(model.Setting("torch", 2), iterable=True)
    assert not lim.persistent_ok and "IterableDataset" in lim.why["iterable"]


def test_a_worker_init_fn_or_a_main_process_that_cannot_fetch_rules_out_main_process_loading():
    assert 0 not in _lim(model.Setting("torch", 2), worker_init=True).workers
    assert 0 in _lim(model.Setting("torch", 0), worker_init=True).workers  # the user runs without workers already
    assert 0 not in _lim(model.Setting("torch", 2), main_fetch_ok=False).workers


def test_an_epoch_dependent_dataset_never_gets_persistent_workers():
    base = model.Setting("torch", 2, 2, False)
    lim = _lim(base, epoch="Data.set_epoch")
    options = model.candidates(base, KINDS, lim.workers, 3, cacheable=False, persistent_ok=lim.persistent_ok)
    assert options and not any(s.persistent_workers for s in options)
    assert "persistent" in lim.why["epoch"]


def test_an_epoch_kept_in_shared_memory_allows_persistent_workers():
    import fastcollate.images as fi
    from fastcollate.doctor.proof import epoch_shared

    assert epoch_shared(fi.ImageFolder.__new__(fi.ImageFolder)) and not epoch_shared([1, 2])
    base = model.Setting("torch", 2, 2, False)
    lim = _lim(base, epoch="ImageFolder.set_epoch", epoch_shared=True)
    assert lim.persistent_ok and "reaches persistent workers" in lim.why["epoch"] and "cache" in lim.why["epoch"]


def test_waiting_fetches_allow_more_workers_than_cores_within_memory():
    assert max(_lim(model.Setting("torch", 0)).workers) == 2
    lim = _lim(model.Setting("torch", 0), waiting=0.95)
    assert max(lim.workers) == 16 and {4, 8} <= set(lim.workers) and "io" in lim.why
    assert max(_lim(model.Setting("torch", 0), waiting=0.95, memory_workers=5).workers) == 5


def test_with_waiting_fetches_the_plan_picks_more_workers_than_cores():
    # 8 ms a batch of which 0.4 ms on a CPU: 2 cores keep ~16 such workers busy
    base = model.Setting("torch", 2)
    profiles = {(k, w): _profile(k, int(w), make=8e-3, cpu=0.4e-3) for k in KINDS for w in (False, True)}
    work = model.Workload(batches=256, batch_size=16, epochs=1, cores=2)
    pl = doctor_plan.plan(base, profiles, work, _lim(base, waiting=0.95))
    assert pl.picks and pl.picks[0].num_workers > 2, pl.predicted[:3]
    cpu_bound = {(k, w): _profile(k, int(w), make=8e-3) for k in KINDS for w in (False, True)}
    pl = doctor_plan.plan(base, cpu_bound, work, _lim(base, waiting=0.0))
    assert all(s.num_workers <= 2 for _, s, _ in pl.predicted)


def test_a_conditional_cache_is_predicted_but_never_picked():
    base = model.Setting("torch", 0)
    profiles = {(k, w): _profile(k, int(w), make=20e-3) for k in KINDS for w in (False, True)}
    work = model.Workload(batches=64, batch_size=32, epochs=4, cores=2, cached_fetch_s=1e-4, cached_write_s=1e-3)
    sure = doctor_plan.plan(base, profiles, work, _lim(base, cache="yes"))
    assert sure.picks[0].cache  # proven: the cache wins on paper
    maybe = doctor_plan.plan(base, profiles, work, _lim(base, cache="conditional"))
    assert maybe.conditional is not None and maybe.conditional[1].cache
    assert not any(s.cache for s in maybe.picks) and not any(s.cache for _, s, _ in maybe.predicted)
    none = doctor_plan.plan(base, profiles, work, _lim(base, cache="no"))
    assert none.conditional is None and not any(s.cache for _, s, _ in none.predicted)


def test_measuring_batches_fit_the_budget():
    # 100 batches of 32 samples an epoch, 2 epochs, two arms at 3200 samples/s: 4 s a round
    assert doctor_plan.measuring_batches(100, 2, [3200, 3200], 60, batch_size=32) is None  # whole epochs fit
    k = doctor_plan.measuring_batches(100, 2, [3200, 3200], 4, batch_size=32)
    assert k == 50  # two rounds of the first 50 batches
    assert doctor_plan.measuring_batches(100, 2, [3200, 3200], 0.1, batch_size=32) == 0  # not even a few


class _FakeClock:
    def __init__(self):
        self.t = 0.0

    def monotonic(self):
        return self.t


def test_compare_fills_its_budget_with_rounds(monkeypatch):
    clock = _FakeClock()

    def run(make, epochs, step=None, max_batches=None, **_):
        clock.t += 1.0  # each run takes a second
        return measure.Run(samples=100, batches=10, wall_s=1.0, epoch_s=[1.0], first_batch_s=0.1)

    monkeypatch.setattr(measure, "run_epochs", run)
    monkeypatch.setattr(measure.time, "monotonic", clock.monotonic)
    arms = {"yours": None, "candidate 1": None}
    out = measure.compare(arms, 1, base="yours", min_rounds=2, max_rounds=50, budget_s=10, fill=True)
    assert len(out["yours"].runs) == 5 and clock.t == 10.0  # 2 s a round: 5 rounds in 10 s
    clock.t = 0.0
    out = measure.compare(arms, 1, base="yours", min_rounds=2, max_rounds=50, budget_s=10)
    assert len(out["yours"].runs) == 2  # tied ratios of 1.0 stop at once without fill


def test_a_run_is_charged_the_start_ups_measured_elsewhere():
    # a loader whose workers were started before the run: its epochs pay what the start-ups cost
    loader = [torch.zeros(4, 2)] * 3
    plain = measure.run_epochs(lambda: loader, 2, min_s=0.0)
    charged = measure.run_epochs(lambda: loader, 2, min_s=0.0, charge_s=[1.5, 0.5])
    assert 2.0 <= charged.wall_s < 2.0 + 1.0, (plain, charged)
    assert charged.epoch_s[0] >= 1.5 and 0.5 <= charged.epoch_s[1] < 1.5, charged.epoch_s
    assert charged.samples == plain.samples == 24


def test_the_budget_is_shared_among_the_phases(monkeypatch):
    # each phase is handed its share of budget_s: the look a deadline, the probes a time each,
    # the proof what its whole-epoch check may take, the rounds what is left
    seen: dict[str, list] = {"look": [], "probe": [], "prove": [], "compare": []}
    real_look, real_probe, real_prove, real_compare = (doctor_mod.look, doctor_mod.probe, doctor_mod.prove,
                                                        doctor_mod.measure.compare)

    def look(*a, deadline=None, **kw):
        seen["look"].append(deadline - time.perf_counter())
        return real_look(*a, deadline=deadline, **kw)

    def probe(*a, max_s=2.0, **kw):
        seen["probe"].append(max_s)
        return real_probe(*a, max_s=max_s, **kw)

    def prove(*a, allowed_s=5.0, **kw):
        seen["prove"].append(allowed_s)
        return real_prove(*a, allowed_s=allowed_s, **kw)

    def compare(*a, budget_s=None, **kw):
        seen["compare"].append(budget_s)
        return real_compare(*a, budget_s=budget_s, **kw)

    monkeypatch.setattr(doctor_mod, "look", look)
    monkeypatch.setattr(doctor_mod, "probe", probe)
    monkeypatch.setattr(doctor_mod, "prove", prove)
    monkeypatch.setattr(doctor_mod.measure, "compare", compare)
    # an idle machine of 2 cores, whatever runs beside this test: on a busy one the doctor plans
    # with the cores left, may predict no gain and then rightly measures nothing (seen as [] here)
    monkeypatch.setattr(doctor_mod.machine_load, "others_busy", lambda window: 0.0)
    monkeypatch.setattr(doctor_mod.node, "affinity_cores", lambda: 2)
    # a slow fetch in the main process: workers are predicted a clear gain, so the rounds run; its
    # epochs take ~0.1 s, so the look and the probes end well inside their shares even on a busy
    # machine, and the rounds find time left (a budget of 6 s was spent before them beside 3 busy
    # processes)
    budget = 12.0
    fastcollate.doctor(dd.SlowGetitem(n=256, per_sample=400e-6), batch_size=16, epochs=2, num_workers=0,
                       budget_s=budget)
    assert 0 < seen["look"][0] <= doctor_mod.LOOK_SHARE * budget
    assert seen["probe"] and sum(seen["probe"]) <= doctor_mod.PROBE_SHARE * budget + 1e-9
    assert seen["prove"] == [doctor_mod.PROOF_SHARE * budget]
    assert seen["compare"] and 0 < seen["compare"][0] < budget


def test_the_ceiling_line_agrees_with_a_measured_win():
    # a measured 1.10x and a replayed ceiling barely above the proposal: what data costs cannot be
    # under the 9% the win implies (it once said "at most 5%" beside it)
    from fastcollate.doctor import look as doctor_look

    seen = doctor_look.Look(profile=model.Profile("torch", 0, [0.01], [0.009], 0.01, 0.0), spikes_s=[0.0],
                            step_s=0.005, samples_per_s=100.0, batch_bytes=1 << 10, memory={}, report={})
    base = model.Setting("torch", 0)
    work = model.Workload(batches=10, batch_size=32, epochs=2, cores=2, step_s=0.005)
    verdict = {"ratio": 1.10, "min": 1.08, "max": 1.12, "rounds": 3, "win": True, "loss": False}
    facts = doctor_words.Facts(seen=seen, base=base, chosen=model.Setting("torch", 2), picks=[model.Setting("torch", 2)],
                               verdict=verdict, work=work, ceiling=1105.0, base_rate=1000.0, verified=True,
                               yours_rate=1000.0, measured_rate=1100.0)
    line = next(f for f in doctor_words.findings(facts) if "with data free" in f)
    share = float(line.split("costs ~")[1].split("%")[0]) / 100
    assert share >= 1 - 1 / 1.10 - 0.005, line


@pytest.mark.parametrize("growth, private, named", [(40.0, 60.0, True), (3.0, 60.0, False), (12.0, 60.0, False),
                                                    (70.0, 900.0, True)])
def test_copy_on_write_growth_is_named_relative_to_the_worker(growth, private, named):
    from fastcollate.tuning.memory import WorkerMemory

    mem = WorkerMemory()
    mem.first, mem.last = {1: private}, {1: private + growth}
    assert (mem.report()["finding"] == "copy_on_write") is named, mem.report()


def test_files_the_main_process_holds_open_are_not_the_datasets(tmp_path):
    # forked workers inherit the caller's open files (a log, pytest's capture): the proof must not
    # read them as files the dataset reads, which would make a deterministic dataset conditional
    from fastcollate.doctor import proof as doctor_proof

    held = open(tmp_path / "held.log", "w")
    try:
        proof = doctor_proof.prove(dd.Expensive(n=32, per_sample=1e-5), {"num_workers": 2}, 8, workers=2,
                                   allowed_s=30.0, use_workers=True, seed=0, say=lambda m: None)
        assert proof.verdict in ("proven", "sampled") and proof.files == [], proof
    finally:
        held.close()


def test_private_growth_without_a_drop_in_shared_pages_is_not_copy_on_write():
    # a JPEG decoder's buffers grow a worker's private memory and leave what it shares with its
    # parent alone: not copy-on-write; pages that stop being shared as private grows are
    from fastcollate.tuning.memory import WorkerMemory

    mem = WorkerMemory()
    mem.first, mem.last = {1: 60.0}, {1: 100.0}
    mem.shared_first, mem.shared_last = {1: 200.0}, {1: 199.0}
    assert mem.report()["finding"] is None and mem.report()["growth_mb"] == 1.0
    mem.shared_last = {1: 160.0}
    assert mem.report()["finding"] == "copy_on_write" and mem.report()["growth_mb"] == 40.0


def test_worker_start_up_grows_faster_beyond_the_cores():
    # side by side up to the cores (square root), queued for them beyond (in proportion): the
    # square root alone read an 8-worker epoch on 2 cores 33% too fast, a 3/4 power 23-31%
    start = model.start_cost
    assert start(0.01, 2, 0, 2) == 0.0
    assert start(0.01, 2, 2, 2) == pytest.approx(0.01)
    assert start(0.01, 1, 4, 4) == pytest.approx(0.02)                       # sqrt(4)
    assert start(0.01, 2, 8, 2) == pytest.approx(0.04)
    assert start(0.01, 4, 8, 2) == pytest.approx(0.02)                       # measured beyond the cores
    assert start(0.01, 2, 8, 2) > 0.01 * (8 / 2) ** 0.75