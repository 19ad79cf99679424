"""`fastcollate bench | tune | doctor` (also `python -m fastcollate ...`)."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
from typing import Any, Sequence


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line and a non-zero exit
        self.exit(2, f"fastcollate: error: {message} (see `{self.prog} --help`)\n")


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load_dataset(spec: str) -> Any:
    """'package.module:attr' -> the Dataset (attr may be a zero-argument factory)."""
    if ":" not in spec:
        raise CliError(f"--dataset must look like module:attr, got {spec!r}")
    mod_name, attr = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise CliError(f"cannot import {mod_name!r}: {exc}") from exc
    try:
        obj = getattr(mod, attr)
    except AttributeError as exc:
        raise CliError(f"{mod_name!r} has no attribute {attr!r}") from exc
    if callable(obj) and not hasattr(obj, "__getitem__"):
        obj = obj()
    if not hasattr(obj, "__getitem__"):
        raise CliError(f"{spec} is not a map-style dataset (no __getitem__)")
    return obj


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from . import _ext
    from ._bench import collate_bench as bench, train_run as e2e, workloads

    if args.engines:
        return _engines(args)
    if args.peers:
        args.peer_workloads = bool(args.workloads)
        bad = [n for n in (args.workloads or "").split(",") if n and n not in ("images", "tokens", "padded", "tabular")]
        if bad:
            raise CliError(f"unknown peers workload(s) {', '.join(bad)}; choose from images, tokens, padded, tabular")
        args.workloads_checked = True
    names = args.workloads.split(",") if args.workloads and not args.peers else list(workloads.WORKLOADS)
    unknown = [n for n in names if n not in workloads.WORKLOADS]
    if unknown:
        raise CliError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(workloads.WORKLOADS)}")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise CliError("--plot needs matplotlib: pip install 'fastcollate[plot]'") from exc
    rounds, min_time = (2, 0.05) if args.quick else (args.rounds, args.min_time)
    _progress(f"fastcollate bench: backend={_ext.backend()}, torch {torch.__version__}, "
              f"{torch.get_num_threads()} intra-op threads, {rounds} rounds")
    if args.sweep:
        return _sweep(args, rounds)
    if args.peers:
        return _peers(args)
    rows = bench.run(names, rounds=rounds, min_time=min_time, progress=_progress)
    print("collate (ratios measured side by side in this run):")
    print(bench.format_table(rows))
    print("speedup = default_collate time / fastcollate time; of memcpy = a Tensor.copy_ of the same "
          "bytes into a reused buffer / fastcollate time (medians)")
    pad_rows = bench.run_pad(rounds=rounds, min_time=min_time, progress=_progress)
    print("\npadding collate (Collator(pad=...)) vs the usual as_tensor + pad_sequence + mask:")
    print(bench.format_pad_table(pad_rows))
    loader_rows = bench.run_loaders(epochs=1 if args.quick else 3, progress=_progress)
    print("\nDataLoader with 2 workers: torch's vs fastcollate.DataLoader's worker ring (samples/s):")
    print(bench.format_loader_table(loader_rows))
    _progress("[loader] a new loader's first two epochs, torch's vs fastcollate's")
    startup = bench.measure_startup(rounds=1 if args.quick else 3, batches=4 if args.quick else 12)
    print("\na NEW loader, first epoch (workers started, ring made and first faulted inside the timing), then its"
          " second (persistent_workers=False: new workers again):")
    print(bench.format_startup(startup))
    from ._bench import storage as storage_bench

    storage_rows = storage_bench.run_storage(quick=args.quick, progress=_progress)
    print("\nbatches from storage (ArrayDataset / TokenWindows / from_hf) vs what people write today, "
          "through a DataLoader (samples/s):")
    print(storage_bench.format_storage_table(storage_rows))
    train_rows: list[dict[str, Any]] = []
    if not args.no_train:
        n = 512 if args.quick else 2048
        _progress(f"end-to-end: one epoch of a small convnet, {n} synthetic images, default_collate vs fastcollate")
        train_rows = e2e.compare(n=n, batch_size=64)
        print("\nend-to-end training (CPU autocast bf16, num_workers=0):")
        for r in train_rows:
            print(f"  {r['collate']:<15} {r['samples_per_s']:9.0f} samples/s  loss {r['loss']:.4f}")
        print("  stall breakdown (fastcollate): " + train_rows[-1]["summary"].replace("\n", "\n  "))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "backend": _ext.backend(), "collate": rows, "pad": pad_rows,
                       "loaders": loader_rows, "startup": startup, "storage": storage_rows,
                       "train": [{k: v for k, v in r.items() if k != "summary"} for r in train_rows]}, f, indent=2)
        _progress(f"wrote {args.json}")
    if args.plot:
        _plot(rows, args.plot)
        _progress(f"wrote {args.plot}")
    return 0


def _peers(args: argparse.Namespace) -> int:
    from ._bench import peers

    workers = args.workers if args.workers is not None else 2
    result = peers.run_peers(workers=workers, rounds=1 if args.quick else min(args.rounds, 5), quick=args.quick,
                             progress=_progress, only=args.workloads.split(",") if args.peer_workloads else None)
    print(peers.format_peers(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peers": result}, f, indent=2, default=str)
        _progress(f"wrote {args.json}")
    return 0


def _engines(args: argparse.Namespace) -> int:
    import importlib.util

    missing = [m for m in ("ray", "pydantic") if importlib.util.find_spec(m) is None]
    if missing:
        raise CliError(f"--engines needs Ray Data ({', '.join(missing)} missing): pip install 'fastcollate[ray]'")
    from ._bench import engines

    names = engines.NAMES
    only = args.workloads.split(",") if args.workloads else None
    bad = [n for n in only or () if n not in names]
    if bad:
        raise CliError(f"unknown engines workload(s) {', '.join(bad)}; choose from {', '.join(names)}")
    rounds, min_time = (2, 0.05) if args.quick else (args.rounds, args.min_time)
    _progress(f"fastcollate bench --engines: {rounds} rounds")
    collate_rows = engines.run_collate(rounds=rounds, min_time=min_time, only=only, progress=_progress)
    print("distributed engines, the collate call alone (Ray Data's batches: pyarrow Tables; medians of "
          f"{rounds} interleaved rounds):")
    print(engines.format_collate(collate_rows))
    epoch_rows = engines.run_epochs(batches=3 if args.quick else 16, rounds=1 if args.quick else rounds,
                                    only=only, progress=_progress)
    print("\nthe whole iter_torch_batches epoch on the CPU, Ray's iterator included (materialized dataset):")
    print(engines.format_epochs(epoch_rows))
    print(engines.NOTES)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"engines": {"collate": collate_rows, "epochs": epoch_rows}}, f, indent=2)
        _progress(f"wrote {args.json}")
    return 0


def _sweep(args: argparse.Namespace, rounds: int) -> int:
    from ._bench import sweep

    kw = dict(batch_sizes=(1, 16, 256), leaves=(1, 16)) if args.quick else {}
    rows = sweep.run(rounds=min(rounds, 3), min_time=0.02 if args.quick else 0.05, progress=_progress, **kw)
    print(f"how the cost grows: dict samples of {sweep.LEAF_FLOATS}-float tensors, side by side in this run:")
    print(sweep.format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sweep": rows}, f, indent=2)
        _progress(f"wrote {args.json}")
    if args.plot:
        sweep.plot(rows, args.plot)
        _progress(f"wrote {args.plot}")
    return 0


def _plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = [r["workload"] for r in rows]
    ax.barh(names, [r["speedup"] for r in rows], color="#3a7")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("speedup over default_collate (x)")
    ax.set_title("fastcollate vs default_collate")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def cmd_tune(args: argparse.Namespace) -> int:
    from .training.tune import tune_loader

    if args.batch_size < 1:
        raise CliError("--batch-size must be >= 1")
    if args.budget <= 0:
        raise CliError("--budget must be > 0 seconds")
    ds = _load_dataset(args.dataset)
    workers = [int(w) for w in args.workers.split(",")] if args.workers else None
    res = tune_loader(ds, args.batch_size, budget_s=args.budget, num_workers=workers, progress=True)
    print(res.format())
    best = {k: v for k, v in res.best.items() if k != "collate_fn"}
    print(f"best: {best}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"best": best, "table": res.table}, f, indent=2)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    import torch

    from . import _ext
    from ._bench import doctor, train_run as e2e

    workers = args.workers if args.workers is not None else min(2, len(os.sched_getaffinity(0)))
    print("fastcollate doctor")
    checks: list[tuple[str, str]] = [
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("CUDA (torch build)", str(torch.version.cuda)),
        ("GPU", torch.cuda.get_device_name() if torch.cuda.is_available() else "none visible"),
        ("compiled backend", _ext.backend() + ("" if _ext.LOAD_ERROR is None else f" ({_ext.LOAD_ERROR})")),
        ("CUDA kernels built", str(_ext.cuda_kernels_built())),
        ("pinned memory", _pinned_available()),
        ("cores", str(len(os.sched_getaffinity(0)))),
        ("/dev/shm", doctor.shm_line(workers)),
        ("FASTCOLLATE_DISABLE", os.environ.get("FASTCOLLATE_DISABLE", "unset")),
    ]
    width = max(len(k) for k, _ in checks)
    for k, v in checks:
        print(f"  {k:<{width}}  {v}")
    for path in (args.trace, args.plot):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise CliError(f"cannot write {path}: {os.path.dirname(os.path.abspath(path))} does not exist")
    if args.dataset:
        ds = _load_dataset(args.dataset)
        print(doctor.compare(ds, args.batch_size, workers, args.batches, args.trace, args.plot, progress=_progress))
        return 0
    _progress("diagnosis: a short training run with the stall monitor ...")
    r = e2e.run(n=256, batch_size=64, trace=True)
    print("  " + r["summary"].replace("\n", "\n  "))
    return 0


def _pinned_available() -> str:
    import torch

    if not torch.cuda.is_available():
        return "no (no CUDA)"
    try:
        torch.empty(1, pin_memory=True)
        return "yes"
    except RuntimeError as exc:
        return f"no ({exc})"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fastcollate", description="fastcollate: exact, compiled collate for PyTorch loaders")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    b = sub.add_parser("bench", help="collate benchmark + a small end-to-end training run with its stall breakdown")
    b.add_argument("--rounds", type=int, default=5, help="interleaved rounds per workload (median reported)")
    b.add_argument("--min-time", type=float, default=0.2, help="seconds of calls per timing")
    b.add_argument("--quick", action="store_true", help="short rounds and a short training run (a smoke run)")
    b.add_argument("--workloads", help="comma-separated subset of the collate workloads")
    b.add_argument("--no-train", action="store_true", help="skip the end-to-end training run")
    b.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    b.add_argument("--plot", metavar="PATH.png", help="also plot the speedups (the sweep: log-log; needs matplotlib)")
    b.add_argument("--sweep", action="store_true",
                   help="only the scaling sweep: batch size 1-4096 x leaves per sample 1-64, ns/leaf and GB/s")
    b.add_argument("--peers", action="store_true",
                   help="only the peers table: torch, SPDL, torchdata.nodes, Ray Data, get_batch, HF collators "
                        "(those installed) on image-folder, token, padded and tabular workloads")
    b.add_argument("--workers", type=int, help="--peers: workers (or threads) of every loader (default 2)")
    b.add_argument("--engines", action="store_true",
                   help="only the distributed engines table: Ray Data's default collate vs fastcollate.ray.ArrowCollate "
                        "(the call alone and the iter_torch_batches epoch; needs the ray extra)")
    b.set_defaults(fn=cmd_bench, peer_workloads=False)
    t = sub.add_parser("tune", help="pick DataLoader settings for a dataset by measurement")
    t.add_argument("--dataset", required=True, help="module:attr of a map-style Dataset (or a factory)")
    t.add_argument("--batch-size", type=int, required=True)
    t.add_argument("--budget", type=float, default=60.0, help="seconds for the whole sweep")
    t.add_argument("--workers", help="comma-separated worker counts to try (default: 0,1,2,4,... up to cores)")
    t.add_argument("--json", metavar="PATH")
    t.set_defaults(fn=cmd_tune)
    d = sub.add_parser("doctor", help="environment report and a diagnosis of a short run")
    d.add_argument("--dataset", help="module:attr of a Dataset to diagnose (default: embedded synthetic images)")
    d.add_argument("--batch-size", type=int, default=32)
    d.add_argument("--batches", type=int, default=16, help="batches per loader (a new loader each: first batch counts)")
    d.add_argument("--workers", type=int, help="num_workers of both loaders (default: min(2, cores))")
    d.add_argument("--trace", metavar="PATH.json", help="write fastcollate's run as a Chrome trace (Perfetto)")
    d.add_argument("--plot", metavar="PATH.png", help="draw fastcollate's run: timeline and stages (needs matplotlib)")
    d.set_defaults(fn=cmd_doctor)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 2
    if getattr(args, "rounds", 1) < 1:
        parser.error("--rounds must be >= 1")
    try:
        return int(args.fn(args))
    except CliError as exc:
        print(f"fastcollate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fastcollate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
