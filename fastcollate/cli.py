"""`fastcollate bench` (also `python -m fastcollate bench`)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line and a non-zero exit
        self.exit(2, f"fastcollate: error: {message} (see `fastcollate {self.prog.split()[-1]} --help`)\n")


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from . import _ext, bench, workloads

    names = args.workloads.split(",") if args.workloads else list(workloads.WORKLOADS)
    unknown = [n for n in names if n not in workloads.WORKLOADS]
    if unknown:
        print(f"fastcollate: error: unknown workload(s) {', '.join(unknown)}; "
              f"choose from {', '.join(workloads.WORKLOADS)}", file=sys.stderr)
        return 2
    rounds, min_time = (2, 0.05) if args.quick else (args.rounds, args.min_time)
    _progress(f"fastcollate bench: backend={_ext.backend()}, torch {torch.__version__}, "
              f"{torch.get_num_threads()} intra-op threads, {rounds} rounds")
    rows = bench.run(names, rounds=rounds, min_time=min_time, progress=_progress)
    print(bench.format_table(rows))
    print("speedup = default_collate time / fastcollate time; of memcpy = a Tensor.copy_ of the same "
          "bytes into a reused buffer / fastcollate time (medians, measured side by side)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "backend": _ext.backend(), "rows": rows}, f, indent=2)
        _progress(f"wrote {args.json}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fastcollate", description="fastcollate: exact, compiled collate for PyTorch loaders")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    b = sub.add_parser("bench", help="collate benchmark: fastcollate vs default_collate vs memcpy")
    b.add_argument("--rounds", type=int, default=5, help="interleaved rounds per workload (median reported)")
    b.add_argument("--min-time", type=float, default=0.2, help="seconds of calls per timing")
    b.add_argument("--quick", action="store_true", help="2 short rounds (a smoke run)")
    b.add_argument("--workloads", help="comma-separated subset of the workloads")
    b.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    b.set_defaults(fn=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 2
    if getattr(args, "rounds", 1) < 1:
        parser.error("--rounds must be >= 1")
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
