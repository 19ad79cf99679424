"""The doctor under torchrun: N ranks on one node, each diagnosing its loader at the same time.

Each rank plans with its share of the node (fastcollate.tuning.node: the affinity's cores divided
by LOCAL_WORLD_SIZE), so the workers it proposes, times the ranks, stay within the node's cores
for a CPU-bound fetch -- and what it predicts is what a rank gets while the others run theirs.
This runs that check (a timing: a benchmark, not a unit test):

    python benchmarks/doctor_ranks.py [--ranks 2] [--markdown FILE]

launches ``torch.distributed.run --standalone --nproc_per_node N`` (gloo) over this file; every
rank runs ``fastcollate.doctor`` on a CPU-bound dataset loaded in the main process (the
misconfiguration), then all ranks run the proposal together (a barrier starts them), and rank 0
reports per rank: the proposed workers, the prediction, the rate measured together, and PASS/FAIL
for "workers x ranks <= node cores" and "prediction within 25% of the rate measured together".
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def rank_main(out: str, n: int, per_sample: float, batch_size: int, epochs: int) -> None:
    import torch.distributed as dist

    import doctor_data as dd
    import fastcollate
    from fastcollate.tuning import measure
    from fastcollate.tuning import node

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = dd.SlowGetitem(n=n, per_sample=per_sample)
    dist.barrier()
    t0 = time.monotonic()
    d = fastcollate.doctor(ds, batch_size=batch_size, epochs=epochs, num_workers=0, verify=False)
    doctor_s = time.monotonic() - t0
    dist.barrier()  # every rank runs the proposal at once: the rate they get together
    run = measure.run_epochs(lambda: d.loader(ds), epochs)
    dist.barrier()
    row = {"rank": rank, "share": node.share().describe(), "node_cores": node.affinity_cores(),
           "ranks": dist.get_world_size(), "workers": d.proposal["settings"].get("num_workers", 0),
           "changes": d.proposal["changes"], "predicted": d.proposal["predicted_samples_per_s"],
           "together": run.samples_per_s, "doctor_s": doctor_s, "load": d.load}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(row, f, default=str)
    dist.destroy_process_group()


def launch(ranks: int, args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        # the rank's arguments travel in the environment: torchrun parses options after the script too
        job = json.dumps({"out": out, "n": args.n, "per_sample": args.per_sample, "batch_size": args.batch_size,
                          "epochs": args.epochs})
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               os.path.abspath(__file__)]
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1", "DOCTOR_RANKS_JOB": job})
        return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(ranks)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--per-sample", type=float, default=300e-6, help="CPU seconds a sample costs to fetch")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--markdown", metavar="FILE")
    if "DOCTOR_RANKS_JOB" in os.environ:  # a rank, started by launch()
        rank_main(**json.loads(os.environ["DOCTOR_RANKS_JOB"]))
        return 0
    args = p.parse_args()
    load0 = os.getloadavg()[0]
    rows = launch(args.ranks, args)
    load1 = os.getloadavg()[0]
    cores = rows[0]["node_cores"]
    total_workers = sum(r["workers"] for r in rows)
    lines = [f"`python benchmarks/doctor_ranks.py --ranks {args.ranks}`: {args.ranks} ranks (torchrun, gloo) on a "
             f"node of {cores} cores, SlowGetitem(n={args.n}, {args.per_sample * 1e6:.0f} us CPU a sample), "
             f"batch {args.batch_size}, num_workers=0 given; load average {load0:.2f} before, {load1:.2f} after.", "",
             "| rank | its share | proposed | predicted samples/s | measured together | error | doctor s |",
             "|---|---|---|---|---|---|---|"]
    ok = total_workers <= cores
    for r in rows:
        err = r["predicted"] / r["together"] - 1 if r["together"] else float("inf")
        ok &= abs(err) <= 0.25
        lines.append(f"| {r['rank']} | {r['share']} | {'; '.join(r['changes']) or 'no change'} | "
                     f"{r['predicted']:.0f} | {r['together']:.0f} | {err:+.0%} | {r['doctor_s']:.1f} |")
    lines += ["", f"workers x ranks: {total_workers} on {cores} cores; every prediction within 25% of the rate "
                  f"measured together: {'PASS' if ok else 'FAIL'}"]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text + "\n\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
