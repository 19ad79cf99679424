"""`fastcollate bench | tune | doctor` (also `python -m fastcollate ...`)."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
from typing import Any, Sequence

from ._cli_errors import failure, keep_traceback, one_line


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line and a non-zero exit
        self.exit(2, f"fastcollate: error: {message} (see `{self.prog} --help`)\n")


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load_dataset(spec: str) -> Any:
    """'package.module:attr' -> the Dataset: attr is the dataset, a Dataset class (made with no
    arguments) or a zero-argument function that returns the dataset."""
    if ":" not in spec:
        raise CliError(f"--dataset must look like module:attr, got {spec!r}")
    mod_name, attr = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise CliError(f"cannot import {mod_name!r}: {exc}") from exc
    except Exception as exc:  # the module's own code failed on import
        raise CliError(f"importing {mod_name!r} raised {one_line(exc)}") from None
    try:
        obj = getattr(mod, attr)
    except AttributeError as exc:
        raise CliError(f"{mod_name!r} has no attribute {attr!r}") from exc
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "__getitem__")):
        what = "a class, made with no arguments" if isinstance(obj, type) else "a function, called with no arguments"
        try:
            obj = obj()
        except Exception as exc:
            raise CliError(f"{spec} is {what}, and {attr}() raised {one_line(exc)}; give module:attr of the dataset "
                           "itself, or of a function that makes it") from None
    if not hasattr(obj, "__getitem__"):
        raise CliError(f"{spec} is not a map-style dataset (no __getitem__)")
    if not hasattr(type(obj), "__len__"):
        raise CliError(f"{spec} has no __len__: tune and doctor measure whole epochs of a map-style dataset "
                       "(__getitem__ and __len__)")
    try:
        len(obj)
    except Exception as exc:
        raise CliError(f"len({spec}) raised {one_line(exc)}") from None
    return obj


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from . import _ext
    from ._bench import collate_bench as bench, noise, train_run as e2e, workloads

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
    if args.markdown:
        if args.sweep or args.peers:
            raise CliError("--markdown writes the tables of a bench run: not with --sweep or --peers")
        _check_writable(args.markdown)
    rounds, min_time = (2, 0.05) if args.quick else (args.rounds, args.min_time)
    # the tables of whole epochs (loaders, a new loader, storage, training) cost more a round: about
    # half as many rounds, two at least where --rounds allows (one round has no spread)
    heavy = 2 if args.quick else max(min(args.rounds, 2), (args.rounds + 1) // 2)
    run = _BenchRun(args.quick)
    print(f"fastcollate bench: backend={_ext.backend()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} intra-op threads, {rounds} rounds; {run.start_line()}", flush=True)
    if args.sweep:
        return _sweep(args, rounds, run)
    if args.peers:
        return _peers(args)
    rows = run.table(lambda: bench.run(names, rounds=rounds, min_time=min_time, progress=_progress))
    print("collate (ratios measured side by side in each round):")
    print(bench.format_table(rows))
    print("speedup = default_collate time / fastcollate time; of memcpy = a Tensor.copy_ of the same "
          "bytes into a reused buffer / fastcollate time (medians over rounds, min-max in brackets)")
    run.warn(rows, rounds)
    if args.markdown:
        from ._bench import markdown

        markdown.write_collate(args.markdown, rows, args.argv, backend=_ext.backend(), quick=args.quick,
                               rounds=rounds, min_time=min_time, loads=run.loads[-1])
        _progress(f"wrote {args.markdown}")
    pad_rows = run.table(lambda: bench.run_pad(rounds=rounds, min_time=min_time, progress=_progress))
    run.show("Padding", "padding collate (Collator(pad=...)) vs the usual as_tensor + pad_sequence + mask:",
             bench.format_pad_table(pad_rows), pad_rows, rounds, args.markdown,
             "The padding collate, `Collator(pad=...)`, against the usual as_tensor + pad_sequence + mask.")
    loader_rows = run.table(lambda: bench.run_loaders(rounds=heavy, progress=_progress))
    run.show("Loaders", f"DataLoader with 2 workers: torch's vs fastcollate.DataLoader's worker ring (samples/s, "
             f"medians of {heavy} interleaved epochs):", bench.format_loader_table(loader_rows), loader_rows, heavy,
             args.markdown, "A DataLoader with 2 workers: torch's against fastcollate.DataLoader's worker ring. "
             f"Samples/s,\nmedians of {heavy} interleaved epochs.")
    _progress("[loader] a new loader's first two epochs, torch's vs fastcollate's")
    startup = run.table(lambda: [bench.measure_startup(rounds=heavy, batches=4 if args.quick else 12)])[0]
    run.show("A new loader", "a NEW loader, first epoch (workers started, ring made and first faulted inside the "
             "timing), then its second (persistent_workers=False: new workers again):",
             bench.format_startup(startup), [startup], heavy, args.markdown,
             "A NEW loader: its first epoch, then its second. The first epoch's timing includes the workers'\n"
             "start, the ring's creation and its first page faults. With persistent_workers=False, the second\n"
             "epoch starts new workers again.")
    from ._bench import storage as storage_bench

    storage_rows = run.table(lambda: storage_bench.run_storage(quick=args.quick, progress=_progress, rounds=heavy))
    run.show("Storage", "batches from storage (ArrayDataset / TokenWindows / from_hf) vs what people write today, "
             "through a DataLoader (samples/s):", storage_bench.format_storage_table(storage_rows), storage_rows,
             heavy, args.markdown, "Batches from storage (ArrayDataset, TokenWindows, from_hf) against what people "
             "write today,\nthrough a DataLoader. Samples/s.")
    train_rows: list[dict[str, Any]] = []
    if not args.no_train:
        n = 256 if args.quick else 2048
        _progress(f"end-to-end: one epoch of a small convnet, {n} synthetic images, default_collate vs fastcollate, "
                  f"{heavy} alternating rounds")
        # the ratio, and so the verdict, lives on fastcollate's row
        train_rows = run.table(lambda: e2e.compare(rounds=heavy, n=n, batch_size=64), judged=lambda rows: rows[1:])
        print(f"\nend-to-end training (CPU autocast bf16, num_workers=0; medians of {heavy} alternating rounds):")
        for r in train_rows:
            per = f"({min(r['rounds_samples_per_s']):.0f}-{max(r['rounds_samples_per_s']):.0f})"
            vs = (f"  {noise.ratio_cell(r['spread']['vs default_collate'])} default_collate's "
                  f"{noise.mark(r)}" if "spread" in r else "")
            print(f"  {r['collate']:<15} {r['samples_per_s']:9.0f} samples/s {per:<14} loss {r['loss']:.4f}{vs}")
        print("  stall breakdown (fastcollate, its last round): " + train_rows[-1]["summary"].replace("\n", "\n  "))
        run.warn(train_rows[1:], heavy)
    run.finish()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "backend": _ext.backend(), **run.summary(), "collate": rows,
                       "pad": pad_rows, "loaders": loader_rows, "startup": startup, "storage": storage_rows,
                       "train": [{k: v for k, v in r.items() if k != "summary"} for r in train_rows]},
                      f, indent=2)
        _progress(f"wrote {args.json}")
    if args.plot:
        _plot(rows, args.plot)
        _progress(f"wrote {args.plot}")
    return 0


class _BenchRun:
    """The load average over a bench run and each of its tables, the noise verdict of every row,
    and the closing summary: what `bench` needs to say whether its numbers can be trusted."""

    def __init__(self, quick: bool) -> None:
        from ._bench import noise

        self.noise, self.quick = noise, quick
        self.start, self.end = noise.load_now(), None
        self.loads: list[tuple[float | None, float | None]] = []
        self.tables: list[list[dict[str, Any]]] = []

    def start_line(self) -> str:
        return self.noise.load_line(self.start, None)

    def table(self, measure: Any, judged: Any = None) -> list[dict[str, Any]]:
        """Measure a table (a callable returning rows), noting the load before and after it, and
        judge its rows (those ``judged(rows)`` picks: the ones that carry a ratio)."""
        before = self.noise.load_now()
        rows = measure()
        self.loads.append((before, self.noise.load_now()))
        verdict = judged(rows) if judged else rows
        self.noise.judge_rows(verdict, self.loads[-1])
        self.tables.append(verdict)
        return rows

    def warn(self, rows: list[dict[str, Any]], rounds: int) -> None:
        for line in self._warnings(rows, rounds):
            print(line)

    def _warnings(self, rows: list[dict[str, Any]], rounds: int) -> list[str]:
        return self.noise.warning_lines(rows, lambda r: r.get("description", "?"), rounds,
                                        self.noise.advice(self.quick))

    def show(self, title: str, intro: str, table: str, rows: list[dict[str, Any]], rounds: int,
             markdown_path: str | None, page_intro: str | None = None) -> None:
        """Print a table with its noise lines -- and, with --markdown, add it to that file, under
        ``page_intro`` (the page's words for ``intro``) where given."""
        print("\n" + intro)
        print(table)
        self.warn(rows, rounds)
        if markdown_path:
            from ._bench import markdown

            markdown.append_table(markdown_path, title, page_intro or intro, table, self._warnings(rows, rounds),
                                  self.loads[-1])

    def finish(self) -> None:
        self.end = self.noise.load_now()
        flagged, total = self.noise.count(self.tables)
        print("\n" + self.noise.load_line(self.start, self.end))
        if flagged:
            print(f"{self.noise.MARK} noise: {flagged} of {total} timed rows cannot be trusted (marked "
                  f"{self.noise.MARK}, reasons under each table); {self.noise.advice(self.quick)}")
        else:
            print(f"noise: none of the {total} timed rows flagged (in each, the rounds agree on the side of 1 and "
                  "are separable from it; no impossible figure; the machine was not busy)")

    def summary(self) -> dict[str, Any]:
        usable, online = self.noise.cores()
        flagged, total = self.noise.count(self.tables)
        return {"load_average": {"start": self.start, "end": self.end, "usable_cores": usable,
                                 "online_cores": online},
                "noise": {"flagged_rows": flagged, "rows": total, "ceiling_limit": self.noise.CEILING_LIMIT}}


def _peers(args: argparse.Namespace) -> int:
    from ._bench import peers

    if args.workers is not None and args.workers < 0:
        raise CliError(f"--workers must be >= 0, got {args.workers}")
    # the image-folder workload writes JPEGs with Pillow: checked before any peer runs
    if not args.peer_workloads or "images" in args.workloads.split(","):
        _need_module("PIL", "bench --peers (its image-folder workload)", "pillow")
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


def _sweep(args: argparse.Namespace, rounds: int, run: _BenchRun) -> int:
    from ._bench import sweep

    kw = dict(batch_sizes=(1, 16, 256), leaves=(1, 16)) if args.quick else {}
    rounds = min(rounds, 3)
    rows = run.table(lambda: sweep.run(rounds=rounds, min_time=0.02 if args.quick else 0.05, progress=_progress,
                                       **kw))
    print(f"how the cost grows: dict samples of {sweep.LEAF_FLOATS}-float tensors, side by side in each round:")
    print(sweep.format_table(rows))
    run.warn(rows, rounds)
    run.finish()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**run.summary(), "sweep": rows}, f, indent=2)
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


def _check_writable(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"cannot write {path}: {folder} does not exist")


def _workers_list(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        workers = [int(w) for w in text.split(",") if w.strip() != ""]
    except ValueError:
        raise CliError(f"--workers must be comma-separated whole numbers (e.g. 0,1,2), got {text!r}") from None
    if not workers or any(w < 0 for w in workers):
        raise CliError(f"--workers must list worker counts >= 0 (e.g. 0,1,2), got {text!r}")
    return workers


def _need_module(name: str, why: str, extra: str) -> None:
    try:
        importlib.import_module(name)
    except ImportError:
        raise CliError(f"{why} needs {extra.split()[0]}: pip install {extra}") from None


def _dataset_needs(spec: str) -> None:
    """Optional packages a dataset of ours needs, checked before anything runs."""
    if spec.split(":", 1)[0] == "fastcollate._bench.image_bench":
        _need_module("PIL", "the image-folder workload", "pillow")


def cmd_tune(args: argparse.Namespace) -> int:
    from .doctor.tune import tune_loader

    if args.batch_size < 1:
        raise CliError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.budget <= 0:
        raise CliError(f"--budget must be > 0 seconds, got {args.budget}")
    if args.epochs < 1:
        raise CliError(f"--epochs must be >= 1, got {args.epochs}")
    if args.ranks is not None and args.ranks < 1:
        raise CliError(f"--ranks must be >= 1, got {args.ranks}")
    workers = _workers_list(args.workers)
    _dataset_needs(args.dataset)
    ds = args.loaded_dataset = _load_dataset(args.dataset)
    res = tune_loader(ds, args.batch_size, budget_s=args.budget, num_workers=workers, epochs=args.epochs,
                      progress=True, ranks=args.ranks)
    print(res.format())
    print(res.verdict())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res.to_dict(), f, indent=2, default=str)
    return 0


def _loader_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if args.loader_kwargs:
        try:
            kwargs = json.loads(args.loader_kwargs)
        except json.JSONDecodeError as exc:
            raise CliError(f"--loader-kwargs must be a JSON object, e.g. '{{\"num_workers\": 2}}': {exc}") from None
        if not isinstance(kwargs, dict):
            raise CliError(f"--loader-kwargs must be a JSON object, got {args.loader_kwargs!r}")
    if args.workers is not None:
        kwargs["num_workers"] = args.workers
    w = kwargs.get("num_workers", 0)
    if not isinstance(w, int) or w < 0:
        raise CliError(f"num_workers must be a whole number >= 0, got {w!r}")
    for key in ("batch_size", "collate_fn", "dataset"):
        if key in kwargs:
            raise CliError(f"--loader-kwargs: pass {key} {'with --batch-size' if key == 'batch_size' else 'another way'}, "
                           "not in the JSON")
    return kwargs


def cmd_doctor(args: argparse.Namespace) -> int:
    import torch

    from . import _ext
    from ._bench import train_run as e2e
    from ._bench import shm_report as env

    if args.batch_size < 1:
        raise CliError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.epochs < 1:
        raise CliError(f"--epochs must be >= 1, got {args.epochs}")
    if args.workers is not None and args.workers < 0:
        raise CliError(f"--workers must be >= 0, got {args.workers}")
    if args.budget is not None and not args.budget > 0:
        raise CliError(f"--budget must be > 0 seconds, got {args.budget}")
    if args.ranks is not None and args.ranks < 1:
        raise CliError(f"--ranks must be >= 1, got {args.ranks}")
    if args.fix and args.predict_only:
        raise CliError("--fix and --predict-only contradict each other: the doctor proves its proposal unless "
                       "--predict-only")
    kwargs = _loader_kwargs(args) if args.dataset else {}
    for path in (args.trace, args.plot, args.json):
        if path:
            _check_writable(path)
    if args.plot:
        _need_module("matplotlib", "--plot", "matplotlib")
    if args.dataset:
        _dataset_needs(args.dataset)
    workers = kwargs.get("num_workers", min(2, len(os.sched_getaffinity(0))))
    print("fastcollate doctor")
    checks: list[tuple[str, str]] = [
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("CUDA (torch build)", str(torch.version.cuda)),
        ("GPU", torch.cuda.get_device_name() if torch.cuda.is_available() else "none visible"),
        ("compiled backend", _ext.backend() + ("" if _ext.LOAD_ERROR is None else f" ({_ext.LOAD_ERROR})")),
        ("CUDA kernels built", str(_ext.cuda_kernels_built())),
        ("engine built for", _ext.built_for()),
        ("pinned memory", _pinned_available()),
        ("cores", str(len(os.sched_getaffinity(0)))),
        ("/dev/shm", env.shm_line(workers)),
        ("FASTCOLLATE_DISABLE", os.environ.get("FASTCOLLATE_DISABLE", "unset")),
    ]
    width = max(len(k) for k, _ in checks)
    for k, v in checks:
        print(f"  {k:<{width}}  {v}")
    if args.dataset:
        from .doctor.diagnose import doctor
        from .doctor.text import format_diagnosis

        from .doctor.diagnose import LoaderArgumentsError

        ds = args.loaded_dataset = _load_dataset(args.dataset)
        try:
            d = doctor(ds, batch_size=args.batch_size, epochs=args.epochs, loader=args.loader,
                       verify=not args.predict_only, budget_s=args.budget, files_static=args.files_static,
                       ranks=args.ranks, trace=args.trace, plot=args.plot,
                       progress=lambda m: _progress(f"doctor: {m}"), **kwargs)
        except LoaderArgumentsError as exc:
            raise CliError(f"--loader-kwargs: {str(exc).removeprefix('fastcollate.doctor: ')}") from None
        print(format_diagnosis(d, args.dataset))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(d.to_dict(), f, indent=2)
        return 0
    _progress("diagnosis: a short training run with the stall monitor (pass --dataset module:attr to diagnose yours)")
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
    b.add_argument("--markdown", metavar="PATH.md",
                   help="also write the run's tables (collate, padding, loaders, a new loader, storage) as "
                        "Markdown, headed by the command, machine and torch that made them (the docs' benchmark "
                        "pages)")
    b.add_argument("--plot", metavar="PATH.png", help="also plot the speedups (the sweep: log-log; needs matplotlib)")
    b.add_argument("--sweep", action="store_true",
                   help="only the scaling sweep: batch size 1-4096 x leaves per sample 1-64, ns/leaf and GB/s")
    b.add_argument("--peers", action="store_true",
                   help="only the peers table: torch, SPDL, torchdata.nodes, get_batch, HF collators "
                        "(those installed) on image-folder, token, padded and tabular workloads (Ray Data: "
                        "see --engines)")
    b.add_argument("--workers", type=int, help="--peers: workers (or threads) of every loader (default 2)")
    b.add_argument("--engines", action="store_true",
                   help="only the distributed engines table: Ray Data's default collate vs fastcollate.ray.ArrowCollate "
                        "(the call alone and the iter_torch_batches epoch; needs the ray extra)")
    b.set_defaults(fn=cmd_bench, peer_workloads=False)
    t = sub.add_parser("tune", help="pick DataLoader settings for a dataset by measurement")
    t.add_argument("--dataset", required=True,
                   help="module:attr of a map-style Dataset, a Dataset class (made with no arguments) or a factory")
    t.add_argument("--batch-size", type=int, required=True)
    t.add_argument("--budget", type=float, default=60.0, help="seconds for the whole sweep")
    t.add_argument("--workers", help="comma-separated worker counts to try, more than the cores allowed (marked); "
                        "default: 0,1,2,4,... up to twice the usable cores")
    t.add_argument("--epochs", type=int, default=1, help="whole epochs per measured run (a new loader each)")
    t.add_argument("--ranks", type=int,
                   help="processes of your job on this node, sharing its cores (default: LOCAL_WORLD_SIZE)")
    t.add_argument("--json", metavar="PATH")
    t.set_defaults(fn=cmd_tune)
    d = sub.add_parser("doctor", help="environment report; with --dataset: diagnose, propose and prove the fix")
    d.add_argument("--dataset",
                   help="module:attr of your map-style Dataset, a Dataset class (made with no arguments) or a factory")
    d.add_argument("--batch-size", type=int, default=32)
    d.add_argument("--loader-kwargs", metavar="JSON",
                   help="the DataLoader arguments you use now, e.g. '{\"num_workers\": 2, \"shuffle\": true}'")
    d.add_argument("--loader", choices=("torch", "fastcollate"), default="torch",
                   help="the loader you use now: torch's DataLoader or fastcollate.DataLoader")
    d.add_argument("--workers", type=int, help="shorthand for num_workers in --loader-kwargs")
    d.add_argument("--epochs", type=int, default=2, help="whole epochs per run (more shows the start-up and the cache)")
    d.add_argument("--predict-only", action="store_true",
                   help="predict only: do not run the proposal against your settings (by default it is proven, "
                        "alternating rounds, as fastcollate.doctor does)")
    d.add_argument("--fix", action="store_true", help=argparse.SUPPRESS)  # the old opt-in to proving: now the default
    d.add_argument("--budget", type=float,
                   help="seconds for the whole diagnosis, kept within 20%% (default: as long as the epochs take)")
    d.add_argument("--files-static", action="store_true",
                   help="the files your dataset reads do not change while it trains: a dataset proven "
                        "deterministic that reads files may then be cached")
    d.add_argument("--ranks", type=int,
                   help="processes of your job on this node, sharing its cores and memory (default: LOCAL_WORLD_SIZE)")
    d.add_argument("--json", metavar="PATH", help="also write the diagnosis as JSON")
    d.add_argument("--trace", metavar="PATH.json", help="write the traced run of your settings as a Chrome trace")
    d.add_argument("--plot", metavar="PATH.png", help="draw the traced run: timeline and stages (needs matplotlib)")
    d.set_defaults(fn=cmd_doctor)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, as a results file names it
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
    except Exception as exc:  # the dataset's error, or any other: one line, the traceback kept in a file
        where = keep_traceback(exc, args.command)
        print(f"fastcollate {args.command}: {failure(exc, getattr(args, 'loaded_dataset', None))} "
              f"(traceback: {where})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
