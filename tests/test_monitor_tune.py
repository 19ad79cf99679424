"""StallMonitor verdicts on deliberately slow data / slow compute; tune_loader in its budget."""
import gc
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastcollate


class Slow(Dataset):
    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return {"x": torch.randn(8), "y": torch.randn(())}


def _train(delay_data, delay_model):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def forward(self, x):
            time.sleep(delay_model)
            return self.lin(x).squeeze(1)

    model = M()
    mon = fastcollate.StallMonitor()
    loader = DataLoader(Slow(64, delay_data), batch_size=8, collate_fn=fastcollate.collate)
    fastcollate.train_one_epoch(model, loader, torch.optim.SGD(model.parameters(), lr=0.01), monitor=mon,
                                forward=lambda m, b: torch.nn.functional.mse_loss(m(b["x"]), b["y"]))
    return mon.report(), mon.summary()


def test_slow_dataset_is_data_bound():
    report, text = _train(delay_data=0.003, delay_model=0.0)
    assert report["verdict"] == "data-bound", report
    assert report["data_wait_fraction"] > 0.5 and report["steps"] == 8
    assert "num_workers" in text


def test_slow_model_is_compute_bound():
    # A full collection in a process that has run the whole suite can take a
    # good part of the 8 steps' compute; collect first so the verdict is about
    # the loop, not the test process's garbage (CI once saw 'data-bound' here).
    gc.collect()
    report, text = _train(delay_data=0.0, delay_model=0.05)
    assert report["verdict"] == "compute-bound", report
    assert report["data_wait_fraction"] < 0.15
    assert "compute-bound" in text


def test_monitor_standalone_wrap_and_compute():
    mon = fastcollate.StallMonitor()
    for _ in mon.wrap(DataLoader(Slow(12, 0.004), batch_size=4)):
        with mon.compute():
            pass
    r = mon.report()
    assert r["steps"] == 3 and r["verdict"] == "data-bound" and r["wall_s"] >= r["data_wait_s"] > 0


def test_monitor_overhead_is_small():
    mon = fastcollate.StallMonitor()
    t0 = time.perf_counter()
    for _ in mon.wrap(range(2000)):
        with mon.compute():
            pass
    per_step = (time.perf_counter() - t0) / 2000
    assert per_step < 100e-6  # against steps of milliseconds: well under 1%


def test_distributed_report_without_a_process_group_is_local():
    mon = fastcollate.StallMonitor()
    assert "slowest_rank" not in mon.report(distributed=True)


def test_tune_loader_within_budget_with_a_consistent_table():
    ds = Slow(10_000, 0.0005)
    t0 = time.monotonic()
    res = fastcollate.tune_loader(ds, 16, budget_s=6, num_workers=[0, 1, 2, 64], prefetch_factors=(2,), progress=False)
    elapsed = time.monotonic() - t0
    assert elapsed < 6 + 2.5, elapsed
    rows = res.table
    assert {r["num_workers"] for r in rows} <= {0, 1, 2}, "never more workers than cores"
    assert {(r["num_workers"], r["collate"]) for r in rows} == {(w, c) for w in (0, 1, 2) for c in ("fastcollate", "default")}
    measured = [r for r in rows if r["batches_per_s"] > 0]
    assert measured and res.best["batches_per_s"] == max(r["batches_per_s"] for r in measured)
    assert res.best["num_workers"] in (0, 1, 2)
    loader = DataLoader(ds, batch_size=16, **{k: v for k, v in res.best.items() if k not in ("batches_per_s", "collate")})
    next(iter(loader))
    assert "batches/s" in res.format()


def test_tune_loader_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        fastcollate.tune_loader([], 0)
    with pytest.raises(ValueError, match="cores"):
        fastcollate.tune_loader([1], 1, num_workers=[10_000])
