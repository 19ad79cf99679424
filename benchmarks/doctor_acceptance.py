"""The doctor's acceptance, measured (not a unit test: every figure here is a timing, and a busy
machine moves it). On the misconfigured pipelines of tests/doctor_data.py, one lever each:

* ``grid``: its proposal reaches >= 90% of the best of a grid measured here (workers 0/1/2 -- and
  4/8 where the fetches wait on I/O -- x prefetch 2/4/8 x torch's loader with either collate and
  fastcollate.DataLoader), its prediction is within 25% of what it measured, and it takes less
  than half the grid's time;
* ``budget``: the whole call within +-20% of ``budget_s``;
* ``adversarial``: datasets whose randomness a weak check misses (a flip, the epoch, a
  worker-seeded generator, a minority class, a file) never get the cache, in ``--runs`` runs each,
  and what the doctor proposes for them does not change a batch (tests/test_doctor.py checks the
  same, on fewer runs).

    python benchmarks/doctor_acceptance.py [grid|budget|adversarial|all] [--runs 20] [--markdown FILE]

Prints one row per case with PASS/FAIL and the figures, and the load average before and after
(a busy machine is named, not hidden).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch.utils.data as tud  # noqa: E402

import doctor_data as dd  # noqa: E402
import fastcollate  # noqa: E402
from fastcollate.tuning import measure  # noqa: E402

KINDS = ("torch", "torch+fastcollate", "fastcollate")


def _maker(ds, batch_size, kind, w, pf, base):
    kw = {k: v for k, v in base.items() if k not in ("num_workers", "prefetch_factor", "collate_fn")}
    kw.update(batch_size=batch_size, num_workers=w)
    if w:
        kw["prefetch_factor"] = pf
    else:
        kw.pop("multiprocessing_context", None)
        kw.pop("persistent_workers", None)
    if kind == "torch+fastcollate":
        kw["collate_fn"] = fastcollate.collate
    cls = fastcollate.DataLoader if kind == "fastcollate" else tud.DataLoader
    return lambda: cls(ds, **kw)


def grid(ds, batch_size, epochs, step, base, workers=(0, 1, 2), prefetch=(2, 4, 8)):
    """Every grid setting once: (samples/s by setting, seconds it took)."""
    t0 = time.monotonic()
    rates = {}
    for kind, w in itertools.product(KINDS, workers):
        for pf in (prefetch if w else (2,)):
            run = measure.run_epochs(_maker(ds, batch_size, kind, w, pf, base), epochs, step)
            rates[(kind, w, pf)] = run.samples_per_s
    return rates, time.monotonic() - t0


def check(name, ds, batch_size, epochs=2, step=None, workers=(0, 1, 2), **base):
    t0 = time.monotonic()
    d = fastcollate.doctor(ds, batch_size=batch_size, epochs=epochs, step=step, **base)
    doctor_s = time.monotonic() - t0
    rates, grid_s = grid(ds, batch_size, epochs, step, base, workers)
    best = max(rates, key=rates.get)
    proposal = d.loader
    arms = measure.compare({"proposal": lambda: proposal(ds), "grid best": _maker(ds, batch_size, *best, base)},
                           epochs, step, base="grid best", min_rounds=2, max_rounds=3, decide_early=False)
    ratio = measure.paired(arms["grid best"], arms["proposal"])
    p = d.proposal
    measured = p["measured_samples_per_s"] if p["changes"] else d.baseline["samples_per_s"]
    predicted = p["predicted_samples_per_s"]
    checks = {"of grid best >= 90%": ratio["max"] >= 0.9,
              "predicted within 25%": abs(predicted - measured) <= 0.25 * measured,
              "under half the grid's time": doctor_s < 0.5 * grid_s}
    return {"case": name, "pass": all(checks.values()), "failed": [k for k, v in checks.items() if not v],
            "figures": f"proposal {p['changes'] or 'none'}: predicted {predicted:.0f}, measured {measured:.0f}; grid "
                       f"best {best} {rates[best]:.0f}; proposal/grid best {ratio['ratio']:.2f} "
                       f"({ratio['min']:.2f}-{ratio['max']:.2f}); doctor {doctor_s:.1f} s, grid {grid_s:.1f} s"}


def _chosen(name, words):
    return not words or any(w in name for w in words)


GRID = [
    ("slow __getitem__, main process", lambda: (dd.SlowGetitem(n=1024, per_sample=300e-6), 16),
     dict(epochs=1, num_workers=0)),
    ("spawned workers every epoch", lambda: (dd.Cheap(n=256), 32),
     dict(epochs=3, num_workers=2, multiprocessing_context="spawn", persistent_workers=False)),
    ("tiny batches", lambda: (dd.Cheap(n=1024), 2), dict(epochs=1, num_workers=2)),
    ("rare slow samples, prefetch 1", lambda: (dd.RareSlow(n=384), 8),
     dict(epochs=1, workers=(0, 1, 2, 4, 8), num_workers=2, prefetch_factor=1)),
    ("many fields, default_collate", lambda: (dd.ManyFields(n=8192, fields=40), 64), dict(epochs=1, num_workers=2)),
    ("compute-bound step", lambda: (dd.Cheap(n=256), 32), dict(epochs=1, step=dd.compute_step(0.05), num_workers=0)),
    ("I/O: 3 ms wait a sample", lambda: (dd.Sleepy(n=512, wait=3e-3), 16),
     dict(epochs=1, workers=(0, 1, 2, 4, 8), num_workers=2)),
    ("transfer-bound: large batches of small images", lambda: (dd.SmallImages(n=8192, per_sample=20e-6), 512),
     dict(epochs=2, num_workers=2)),
    ("re-spawned workers, CPU-bound fetch", lambda: (dd.Parsed(n=4096), 32),
     dict(epochs=3, num_workers=1, multiprocessing_context="spawn", persistent_workers=False)),
]


def grid_cases(words=()):
    for name, make, kw in GRID:
        if _chosen(name, words):
            ds, batch_size = make()
            yield check(name, ds, batch_size, **kw)


def budget_cases(words=()):
    for budget in (5.0, 15.0):
        if not _chosen(f"budget_s={budget:g}", words):
            continue
        t0 = time.monotonic()
        fastcollate.doctor(dd.SlowGetitem(n=2048, per_sample=300e-6), batch_size=16, epochs=2, num_workers=0,
                           budget_s=budget)
        took = time.monotonic() - t0
        yield {"case": f"budget_s={budget:g}", "pass": abs(took - budget) <= 0.2 * budget, "failed": [],
               "figures": f"took {took:.1f} s ({took / budget:.0%} of the budget)"}


def _adversarial(tmp):
    path = os.path.join(tmp, "records.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(64 * 1024))
    return [("flip p=0.1", dd.Flip(), {"num_workers": 2}),
            ("set_epoch", dd.EpochDependent(), {"num_workers": 2, "persistent_workers": False}),
            ("worker-seeded generator", dd.WorkerSeeded(), {"num_workers": 2, "worker_init_fn": dd.seed_worker}),
            ("minority class", dd.Minority(), {"num_workers": 0}),
            ("reads a file", dd.ReadsFile(path), {"num_workers": 0})]


def adversarial_cases(runs, words=()):
    with tempfile.TemporaryDirectory() as tmp:
        for name, ds, kw in _adversarial(tmp):
            if not _chosen(name, words):
                continue
            cached = persistent = 0
            t0 = time.monotonic()
            for _ in range(runs):
                d = fastcollate.doctor(ds, batch_size=8, epochs=2, verify=False, **kw)
                cached += bool(d.proposal["cache"])
                persistent += bool(d.proposal["settings"].get("persistent_workers")) and name == "set_epoch"
            yield {"case": f"adversarial: {name}", "pass": cached == 0 and persistent == 0, "failed": [],
                   "figures": f"cache proposed in {cached}/{runs} runs; persistent workers for set_epoch "
                              f"{persistent}/{runs}; {time.monotonic() - t0:.0f} s"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", nargs="?", default="all", choices=("grid", "budget", "adversarial", "all"))
    ap.add_argument("--runs", type=int, default=20, help="doctor runs per adversarial dataset")
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--cases", help="only the cases whose name holds one of these comma-separated words")
    args = ap.parse_args()
    words = [w.strip() for w in (args.cases or "").split(",") if w.strip()]
    rows = []
    print(f"load average (1 min) at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    parts = {"grid": grid_cases, "budget": budget_cases, "adversarial": lambda w: adversarial_cases(args.runs, w)}
    for which in (parts if args.which == "all" else [args.which]):
        for row in parts[which](words):
            rows.append(row)
            print(f"{'PASS' if row['pass'] else 'FAIL'}  {row['case']}: {row['figures']}"
                  + (f"  [failed: {', '.join(row['failed'])}]" if row["failed"] else ""), flush=True)
    end = f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}"
    print(end)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("| case | verdict | figures |\n|---|---|---|\n")
            for r in rows:
                f.write(f"| {r['case']} | {'pass' if r['pass'] else 'FAIL: ' + ', '.join(r['failed'])} | "
                        f"{r['figures']} |\n")
            f.write(f"\n{end}\n")
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
