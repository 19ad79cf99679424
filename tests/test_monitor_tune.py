"""StallMonitor verdicts on slow data / slow compute, and tune_loader's budget, decided on a
virtual clock (tests/virtual_clock.py): the sleeps below move that clock and take no time, so a
busy machine cannot turn "data-bound" into "compute-bound". What the monitor costs per step is a
speed: benchmarks/bench_monitor.py."""
import json
import time
import weakref

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastcollate
from fastcollate.training import loop, monitor
from fastcollate.doctor import tune
from fastcollate.tuning import measure
from virtual_clock import VirtualClock


class Slow(Dataset):
    def __init__(self, n, delay, sleep=time.sleep):
        self.n, self.delay, self.sleep = n, delay, sleep

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.sleep(self.delay)
        return {"x": torch.randn(8), "y": torch.randn(())}


@pytest.fixture
def clock(monkeypatch):
    """The monitor's and the training loop's clock, moved only by clock.sleep."""
    return VirtualClock().install(monkeypatch, monitor, loop)


def _train(clock, delay_data, delay_model):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def forward(self, x):
            clock.sleep(delay_model)
            return self.lin(x).squeeze(1)

    model = M()
    mon = fastcollate.StallMonitor()
    loader = DataLoader(Slow(64, delay_data, clock.sleep), batch_size=8, collate_fn=fastcollate.collate)
    fastcollate.train_one_epoch(model, loader, torch.optim.SGD(model.parameters(), lr=0.01), monitor=mon,
                                forward=lambda m, b: torch.nn.functional.mse_loss(m(b["x"]), b["y"]))
    return mon.report(), mon.summary()


def test_slow_dataset_is_data_bound(clock):
    report, text = _train(clock, delay_data=0.003, delay_model=0.0)
    assert report["verdict"] == "data-bound", report
    assert report["steps"] == 8 and report["data_wait_s"] == pytest.approx(64 * 0.003)
    assert report["data_wait_fraction"] == pytest.approx(1.0) and report["compute_s"] == pytest.approx(0.0)
    assert "num_workers" in text


def test_slow_model_is_compute_bound(clock):
    # (on real clocks CI once saw 'data-bound' here: a garbage collection or a preemption
    # during the fetch outweighed 8 steps of 50 ms)
    report, text = _train(clock, delay_data=0.0, delay_model=0.05)
    assert report["verdict"] == "compute-bound", report
    assert report["data_wait_fraction"] == pytest.approx(0.0) and report["compute_s"] == pytest.approx(8 * 0.05)
    assert report["wall_s"] == pytest.approx(8 * 0.05)
    assert "compute-bound" in text


def test_the_verdict_turns_where_the_wait_crosses_the_data_bound_fraction(clock):
    # each step: 1 s of compute and a wait just under / just over DATA_BOUND_FRACTION of the wall
    f = monitor.DATA_BOUND_FRACTION
    for wait, want in ((0.9 * f / (1 - 0.9 * f), "compute-bound"), (1.1 * f / (1 - 1.1 * f), "data-bound")):
        mon = fastcollate.StallMonitor()
        for _ in mon.wrap(DataLoader(Slow(4, wait / 2, clock.sleep), batch_size=2)):
            with mon.compute():
                clock.sleep(1.0)
        assert mon.report()["verdict"] == want, (wait, mon.report())


def test_monitor_standalone_wrap_and_compute(clock):
    mon = fastcollate.StallMonitor()
    for _ in mon.wrap(DataLoader(Slow(12, 0.004, clock.sleep), batch_size=4)):
        with mon.compute():
            clock.sleep(0.001)
    r = mon.report()
    assert r["steps"] == 3 and r["verdict"] == "data-bound"
    assert r["data_wait_s"] == pytest.approx(3 * 0.016) and r["compute_s"] == pytest.approx(3 * 0.001)
    assert r["wall_s"] == pytest.approx(3 * 0.017) and r["compute_source"] == "host clock"


def test_monitor_counts_every_step_of_a_long_loop(clock):
    # what each step costs in real time is benchmarks/bench_monitor.py's business
    mon = fastcollate.StallMonitor()
    for _ in mon.wrap(range(2000)):
        with mon.compute():
            clock.sleep(0.002)
    r = mon.report()
    assert r["steps"] == 2000 and r["compute_s"] == pytest.approx(4.0) and r["data_wait_s"] == 0.0
    assert r["verdict"] == "compute-bound"


def test_distributed_report_without_a_process_group_is_local():
    mon = fastcollate.StallMonitor()
    assert "slowest_rank" not in mon.report(distributed=True)


def test_distributed_report_names_the_rank_that_waited_longest(clock, monkeypatch):
    # the gathered waits are injected (the other ranks' numbers as all_gather would bring them):
    # which rank is named follows from them alone. The multi-process tests (test_ddp.py,
    # test_multinode.py) check the collective itself.
    import torch.distributed as dist

    others = {0: 0.5, 2: 3.25, 3: 0.75}  # this process is rank 1
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)

    def all_gather(out, mine):
        for r, t in enumerate(out):
            t.copy_(mine if r == 1 else torch.tensor([others[r], 10.0], dtype=torch.float64))

    monkeypatch.setattr(dist, "all_gather", all_gather)
    mon = fastcollate.StallMonitor()
    for _ in mon.wrap(DataLoader(Slow(8, 0.25, clock.sleep), batch_size=4)):  # 2 s of waiting
        with mon.compute():
            clock.sleep(1.0)
    r = mon.report(distributed=True)
    assert r["rank_wait_s"] == pytest.approx([0.5, 2.0, 3.25, 0.75]) and r["rank"] == 1
    assert r["slowest_rank"] == 2 and r["straggler_cost_s"] == pytest.approx(3.25 - 0.5)
    assert "slowest rank 2 waited 3.25s" in mon.format(r)


def test_tune_loader_measures_whole_epochs_of_every_loader():
    # real loaders, real runs: which settings are measured and how the choice follows from the
    # rows; how long it took is not asserted (the budget's logic is the next test's, on a virtual clock)
    ds = Slow(256, 0.0003)
    res = fastcollate.tune_loader(ds, 16, budget_s=8, num_workers=[0, 1, 2], prefetch_factors=(2,), progress=False)
    rows = res.table
    assert {(r["num_workers"], r["loader"]) for r in rows} == {(w, k) for w in (0, 1, 2)
                                                                for k in ("torch", "torch+fastcollate", "fastcollate")}
    measured = [r for r in rows if r["samples_per_s"] > 0]
    assert measured and all(r["min"] <= r["samples_per_s"] <= r["max"] for r in measured)
    # the choice is the fastest, or one inside its spread (never a win that the spread does not support)
    top = max(measured, key=lambda r: r["samples_per_s"])
    chosen = [r for r in measured if r["loader"] == ("fastcollate" if res.loader_kind == "fastcollate" else r["loader"])
              and r["num_workers"] == res.best["num_workers"]]
    assert chosen and any(r["max"] >= top["min"] for r in chosen)
    if res.tied:
        # tied: ranges over rounds that overlap, or -- a row of one round has no range -- within 10%
        assert all(r["max"] >= top["min"] or (min(r["rounds"], top["rounds"]) < 2
                                              and r["samples_per_s"] * measure.CLEAR_MARGIN >= top["samples_per_s"])
                   for r in res.tied), res.tied
        assert "tied within the spread" in res.verdict() or "one round" in res.verdict()
    batch = next(iter(res.loader(ds)))
    assert batch["y"].shape == (16,)
    assert "samples/s" in res.format() and "spread" in res.format()


def test_tune_loader_starts_no_run_past_its_budget(monkeypatch):
    # every run takes 1.5 s of a virtual clock: inside a budget of 8 s, runs start at 0, 1.5, ...,
    # 7.5 and no later; the sweep ends one run past the budget at most, the rest of the grid
    # unmeasured; the rates depend on the setting alone, so the choice is known too
    clock = VirtualClock().install(monkeypatch, tune)
    monkeypatch.setattr(tune, "usable_cores", lambda: 2)
    start, run_s, budget = clock(), 1.5, 8.0
    started = []

    def run_epochs(make_loader, epochs, step=None, on_batch=None, min_s=measure.MIN_RUN_S):
        loader = make_loader()  # made, never iterated: no worker starts
        started.append(clock() - start)
        clock.sleep(run_s)
        rate = 1000.0 * (1 + loader.num_workers)
        return measure.Run(int(rate * run_s), 16, run_s, [run_s] * epochs, 0.01)

    monkeypatch.setattr(measure, "run_epochs", run_epochs)
    res = fastcollate.tune_loader(Slow(256, 0.0), 16, budget_s=budget, num_workers=[0, 1, 2],
                                  prefetch_factors=(2,), progress=False)
    assert started == [0.0, 1.5, 3.0, 4.5, 6.0, 7.5] and all(t < budget for t in started)
    assert clock() - start <= budget + run_s
    assert [r["status"] for r in res.table].count("skipped (budget)") == 9 - len(started)
    assert res.best["num_workers"] == 2 and res.rounds == 1 and "one round" in res.verdict()


def test_tune_loader_never_calls_noise_a_win():
    from fastcollate.doctor.tune import TuneResult  # noqa: F401
    from fastcollate.tuning import measure

    base, same = measure.Arm("a"), measure.Arm("b")
    for a, b in ((100, 104), (100, 97), (101, 99)):
        base.runs.append(measure.Run(a, 1, 1.0, [1.0], 0.1))
        same.runs.append(measure.Run(b, 1, 1.0, [1.0], 0.1))
    verdict = measure.paired(base, same)
    assert not verdict["win"] and not verdict["loss"]
    faster = measure.Arm("c")
    for a in (120, 118, 125):
        faster.runs.append(measure.Run(a, 1, 1.0, [1.0], 0.1))
    assert measure.paired(base, faster)["win"] and measure.paired(faster, base)["loss"]
    # two rounds decide only a clear margin: a 3% lead in both of two rounds happens by chance 1 in 4
    two, close = measure.Arm("two"), measure.Arm("close")
    for a, b in ((100, 103), (100, 104)):
        two.runs.append(measure.Run(a, 1, 1.0, [1.0], 0.1))
        close.runs.append(measure.Run(b, 1, 1.0, [1.0], 0.1))
    assert not measure.paired(two, close)["win"] and not measure.paired(close, two)["loss"]
    clear = measure.Arm("clear")
    for b in (115, 120):
        clear.runs.append(measure.Run(b, 1, 1.0, [1.0], 0.1))
    assert measure.paired(two, clear)["win"]


def test_tune_loader_picks_no_winner_from_one_round_of_noise():
    from fastcollate.doctor.tune import TuneResult, choose

    def row(w, sps, lo, hi, rounds):
        return {"loader": "torch", "num_workers": w, "prefetch_factor": 2, "samples_per_s": sps, "min": lo, "max": hi,
                "rounds": rounds}

    # one round each: 4% apart is not told apart -- the cheaper setting, called a tie
    pick, tied = choose([row(0, 1000, 1000, 1000, 1), row(2, 1040, 1040, 1040, 1)])
    assert pick["num_workers"] == 0 and len(tied) == 2
    res = TuneResult(best={"num_workers": 0}, table=[], tied=tied, rounds=1)
    assert "one round" in res.verdict() and "every round" not in res.verdict()
    # one round, 1.5x apart: the faster, but said to be unconfirmed
    pick, tied = choose([row(0, 1000, 1000, 1000, 1), row(2, 1500, 1500, 1500, 1)])
    assert pick["num_workers"] == 2 and len(tied) == 1
    assert "one round" in TuneResult(best={"num_workers": 2}, table=[], rounds=1).verdict()
    # ranges over rounds that overlap: tied; apart: the faster
    assert len(choose([row(0, 1000, 950, 1100, 3), row(2, 1050, 1020, 1080, 3)])[1]) == 2
    pick, tied = choose([row(0, 1000, 950, 1010, 3), row(2, 1200, 1150, 1250, 3)])
    assert pick["num_workers"] == 2 and len(tied) == 1


def _row(w, sps, lo, hi, rounds, loader="torch", status="ok"):
    return {"loader": loader, "num_workers": w, "prefetch_factor": 2 if w else None, "pin_memory": False,
            "samples_per_s": sps, "min": lo, "max": hi, "rounds": rounds, "peak_rss_mb": 0.0, "status": status,
            "note": ""}


def test_tune_keeps_every_worker_count_asked_for():
    from fastcollate.doctor.tune import _candidates

    # more workers than cores is legitimate where fetches wait on I/O: measured, never dropped
    assert _candidates([0, 4, 8], cores=2) == [0, 4, 8]
    assert _candidates(None, cores=2) == [0, 1, 2, 4]  # by default up to twice the cores
    assert _candidates(None, cores=6) == [0, 1, 2, 4, 6, 8, 12]
    with pytest.raises(ValueError, match="2 usable cores"):
        _candidates([0, 17], cores=2)  # beyond 8 a core (16 at least): refused, not dropped


def test_tune_marks_the_rows_with_more_workers_than_cores():
    from fastcollate.doctor.tune import TuneResult

    over = dict(_row(4, 900, 880, 910, 2), note="more workers than the 2 usable cores")
    res = TuneResult(best={"num_workers": 4}, table=[_row(0, 500, 490, 510, 2), over], rounds=2, kind="torch", cores=2)
    line = next(l for l in res.format().splitlines() if l.startswith("|       4 |"))
    assert "ok; more workers than the 2 usable cores" in line
    assert "num_workers=4 (more workers than the 2 usable cores)" in res.verdict()


@pytest.mark.parametrize("kind,collate,name", [
    ("torch", None, "torch's DataLoader with default_collate"),
    ("torch+fastcollate", fastcollate.collate, "torch's DataLoader with fastcollate.collate"),
    ("fastcollate", None, "fastcollate.DataLoader"),
    ("torch", len, "torch's DataLoader with your collate_fn"),
])
def test_tune_verdict_names_the_loader_exactly(kind, collate, name):
    from fastcollate.doctor.tune import TuneResult, choose

    rows = [_row(0, 500, 490, 510, 3, loader=kind), _row(2, 900, 880, 910, 3, loader=kind)]
    pick, tied = choose(rows)
    best = {"num_workers": pick["num_workers"], **({"collate_fn": collate} if collate else {})}
    res = TuneResult(best=best, table=rows, loader_kind="fastcollate" if kind == "fastcollate" else "torch",
                     tied=[], rounds=pick["rounds"], kind=kind, cores=2)
    assert res.verdict() == f"best: {name}, num_workers=2 (faster than every other setting in every round)"
    assert "loader," not in res.verdict()


def test_tune_verdict_of_a_lone_measurement_claims_no_comparison():
    from fastcollate.doctor.tune import TuneResult

    rows = [_row(0, 500, 490, 510, 3, loader="torch+fastcollate"),
            _row(2, 0.0, 0.0, 0.0, 0, status="error: ValueError: bad"), _row(1, 0.0, 0.0, 0.0, 0, status="skipped (budget)")]
    res = TuneResult(best={"num_workers": 0}, table=rows, rounds=3, kind="torch+fastcollate", cores=2)
    verdict = res.verdict()
    assert "every round" not in verdict and "faster" not in verdict, verdict
    assert verdict == ("best: torch's DataLoader with fastcollate.collate, num_workers=0 -- the only setting measured, "
                       "so nothing was compared with it; 1 other setting failed (see the table); 1 other setting did "
                       "not fit the budget: raise budget_s")
    alone = TuneResult(best={"num_workers": 0}, table=rows[:1], rounds=3, kind="torch+fastcollate", cores=2)
    assert alone.verdict().endswith("the only setting measured, so nothing was compared with it")


def test_tune_raises_the_datasets_own_error_when_nothing_ran():
    class Broken(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            raise KeyError(f"sample {i} has no label")

    with pytest.raises(KeyError, match="sample 0 has no label"):
        fastcollate.tune_loader(Broken(), 4, budget_s=5, num_workers=[0], progress=False)


def test_tune_loader_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        fastcollate.tune_loader([], 0)
    with pytest.raises(ValueError, match="cores"):
        fastcollate.tune_loader([1], 1, num_workers=[10_000])


def test_untraced_advice_leaves_out_what_the_loop_already_does(clock):
    # data-bound either way; only what the loop does not do yet is advised
    mon = fastcollate.StallMonitor()
    for _ in mon.wrap(DataLoader(Slow(32, 0.003, clock.sleep), batch_size=8)):
        with mon.compute():
            pass
    plain = mon.report()
    assert plain["verdict"] == "data-bound"
    assert any("fastcollate.collate" in a for a in plain["advice"])
    # the advice reads the loader (the verdict above is what picks its list)
    ours = DataLoader(Slow(32, 0.0), batch_size=8, collate_fn=fastcollate.collate)
    ring = fastcollate.DataLoader(Slow(32, 0.0), batch_size=8, num_workers=1)
    for loader in (ours, ring):
        advice = monitor._advice("data-bound", weakref.ref(loader), None)
        assert advice and not any("fastcollate.collate" in a for a in advice), advice


def test_uint8_images_are_not_told_to_ship_uint8():
    from fastcollate.training.monitor import _advice, batch_info

    assert batch_info(torch.zeros(2, 3, 8, 8, dtype=torch.uint8)) == {"float_images": False}
    assert batch_info({"x": torch.zeros(2, 3, 8, 8)}) == {"float_images": True}
    advice = _advice("copy-bound", None, {"float_images": False})
    assert not any("ship uint8" in a for a in advice)
    assert any("ship uint8" in a for a in _advice("copy-bound", None, {"float_images": True}))


def test_traced_advice_is_only_what_the_numbers_say(clock, monkeypatch):
    from fastcollate.core import trace as _trace

    clock.install_now(monkeypatch, _trace)  # main-process loading: every span on the virtual clock
    mon = fastcollate.StallMonitor(trace=True)
    try:
        for _ in mon.wrap(DataLoader(Slow(32, 0.003, clock.sleep), batch_size=8)):
            with mon.compute():
                pass
        r = mon.report()
    finally:
        mon.close()
    assert r["bottleneck"] == "dataset" and r["stages"]["fetch"]["p50_ms"] == pytest.approx(24.0)
    assert r["advice"] == r["findings"]  # no fixed hint appended beside the computed ones


def test_a_run_of_a_few_milliseconds_is_repeated_with_a_new_loader_until_it_is_long_enough(monkeypatch):
    clock = VirtualClock().install(monkeypatch, measure)
    made = []

    def make():
        made.append(1)
        clock.sleep(0.01)  # each run: 10 ms
        return DataLoader(list(range(32)), batch_size=8)

    run = measure.run_epochs(make, 2, min_s=0.045)
    assert len(made) == 5 and run.wall_s == pytest.approx(0.05)
    # every loader made ran its epochs whole: the samples and batches are all of theirs
    assert run.samples == 32 * 2 * len(made) and run.batches == 4 * 2 * len(made)
    assert len(run.epoch_s) == 2  # the first run's epochs, as one run would give them
    # a long run is run once
    made.clear()
    slow = measure.run_epochs(lambda: (made.append(1), DataLoader(Slow(8, 0.01, clock.sleep), batch_size=4))[1], 1,
                              min_s=0.05)
    assert len(made) == 1 and slow.samples == 8 and slow.wall_s == pytest.approx(0.08)


def test_tune_plans_with_this_ranks_share_of_the_node(monkeypatch):
    # two ranks on a node of 2 cores: each may plan with 1; the grid and the verdict say so
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "3")
    from fastcollate.tuning import node

    monkeypatch.setattr(node, "affinity_cores", lambda: 2)
    monkeypatch.setattr(tune, "usable_cores", lambda: 2)
    res = fastcollate.tune_loader(list(range(64)), 16, budget_s=30, num_workers=[0, 1, 2], prefetch_factors=(2,),
                                  loaders=["torch"], progress=False)
    assert res.cores == 1 and res.node["ranks"] == 2 and res.to_dict()["node"]["local_rank"] == 1
    marked = {r["num_workers"] for r in res.table if r["note"]}
    assert marked == {2}, res.table
    assert "per rank, for 2 ranks on this node" in res.verdict()
    with pytest.raises(ValueError, match="ranks must be an int >= 1"):
        fastcollate.tune_loader(list(range(8)), 4, ranks=0, progress=False)


def test_reports_and_traces_name_the_rank_under_a_launcher(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "5")
    mon = fastcollate.StallMonitor(trace=True)
    for _ in mon.wrap(DataLoader(list(range(8)), batch_size=4)):
        pass
    r = mon.report()
    assert r["measured_by"] == "rank 5 (local 1 of 2 on this node)"
    assert mon.format(r).startswith("rank 5 (local 1 of 2 on this node): ")
    trace = json.loads(open(mon.save_trace(str(tmp_path / "t.json"))).read())
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert names and all(n.startswith("rank 5 ") for n in names)
    assert trace["otherData"]["fastcollate"]["measured_by"].startswith("rank 5")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.delenv("RANK")
    assert "measured_by" not in mon.report()
