"""num_workers="auto" inside the frameworks that re-create the loader: the median samples/s of
epochs 4-6 with "auto" against the best fixed setting of {0, 2, 8} workers, each measured through
the same framework path in the same run (docs/benchmarks/auto_frameworks.md).

    python benchmarks/auto_frameworks.py [--epochs 6] [--frameworks plain,accelerate,...] \
        [--markdown docs/benchmarks/auto_frameworks.md]

Frameworks: plain (a loop over the loader), accelerate (prepare(), one process), lightning (fit on
one device: the loader is kept), lightning-ddp (fit with strategy="ddp" on 2 CPU processes: the
loader is re-created with a DistributedSampler), accelerate-2 (``accelerate launch`` with 2 CPU
processes). Pipelines: memory (in-memory tensors: no workers is best) and wait (each sample
waits 3 ms, as on a slow disk: many more workers than cores is best). Each (framework, pipeline,
setting) is one fresh process; a 2-process run reports rank 0's epochs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from typing import Sequence

import torch
import torch.utils.data as tud

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
SETTINGS = ["auto", 0, 2, 8]
ACCEPT = 0.8  # of the best fixed setting's samples/s: the acceptance the page states
FRAMEWORKS = ["plain", "accelerate", "lightning", "lightning-ddp", "accelerate-2"]


class Memory(tud.Dataset):
    """Cheap samples already in memory: a worker costs more than it brings."""

    def __init__(self, n: int = 4096) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.x[i, 0]


class Wait(tud.Dataset):
    """Samples that wait 3 ms each (I/O): workers beyond the cores pay."""

    def __len__(self) -> int:
        return 384

    def __getitem__(self, i: int):
        time.sleep(0.003)
        return torch.full((16,), float(i)), torch.tensor(float(i))


PIPELINES = {"memory": (Memory, 64), "wait": (Wait, 16)}


def _loader(pipeline: str, setting):
    import fastcollate

    make, batch = PIPELINES[pipeline]
    return fastcollate.DataLoader(make(), batch_size=batch, shuffle=True,
                                  num_workers="auto" if setting == "auto" else int(setting))


def _step(model, opt, batch) -> None:
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def run_plain(pipeline, setting, epochs, wrap=None):
    torch.manual_seed(0)
    loader = _loader(pipeline, setting)
    if wrap is not None:
        loader = wrap(loader)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    rates = []
    for _ in range(epochs):
        t0, n = time.perf_counter(), 0
        for batch in loader:
            _step(model, opt, batch)
            n += len(batch[0])
        rates.append(n / (time.perf_counter() - t0))
    return rates, _final(loader)


def _final(loader) -> dict:
    log = getattr(loader, "auto_log", [])
    return {"workers": int(loader.num_workers), "decisions": len(log)}


def run_accelerate(pipeline, setting, epochs):
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    rates, final = run_plain(pipeline, setting, epochs, wrap=acc.prepare)
    return rates, final, acc.process_index


def run_lightning(pipeline, setting, epochs, ddp: bool):
    import logging

    import pytorch_lightning as pl

    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(16, 1)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x).squeeze(1), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.rates: list[float] = []

        def on_train_epoch_start(self, trainer, module) -> None:
            self.t0, self.n = time.perf_counter(), 0

        def on_train_batch_end(self, trainer, module, outputs, batch, i) -> None:
            self.n += len(batch[0])

        def on_train_epoch_end(self, trainer, module) -> None:
            self.rates.append(self.n / (time.perf_counter() - self.t0))

    torch.manual_seed(0)
    loader = _loader(pipeline, setting)  # made before fit and passed to it
    clock = Clock()
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=2 if ddp else 1,
                         strategy="ddp" if ddp else "auto", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[clock])
    trainer.fit(Module(), loader)
    return clock.rates, _final(trainer.train_dataloader), trainer.global_rank


def one(framework: str, pipeline: str, setting, epochs: int) -> dict | None:
    """One run in this process; rank 0's result (None on other ranks)."""
    rank = 0
    if framework == "plain":
        rates, final = run_plain(pipeline, setting, epochs)
    elif framework.startswith("accelerate"):
        rates, final, rank = run_accelerate(pipeline, setting, epochs)
    else:
        rates, final, rank = run_lightning(pipeline, setting, epochs, ddp=framework == "lightning-ddp")
    if rank != 0:
        return None
    return {"framework": framework, "pipeline": pipeline, "setting": setting, "rates": rates, **final}


def launch(framework: str, pipeline: str, setting, epochs: int) -> dict:
    args = ["--one", framework, pipeline, str(setting), "--epochs", str(epochs)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if framework == "accelerate-2":
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", HERE, *args]
    else:
        cmd = [sys.executable, HERE, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{framework} {pipeline} {setting} gave no result:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


def tail_rate(rates: list[float]) -> float:
    return statistics.median(rates[3:6] if len(rates) >= 6 else rates[-3:])


def markdown(rows: list[tuple], epochs: int, load0: float, load1: float, printed: Sequence[str] = ()) -> str:
    """The page: its header, the table, what the rows say and ``printed``, the rows as main printed them."""
    lines = ["# num_workers=\"auto\" inside the frameworks", "",
             "Written by `benchmarks/auto_frameworks.py`. [One node, many ranks](../node.md) says how the auto",
             "mode follows a re-created loader.", "",
             f"Made by `python benchmarks/auto_frameworks.py --epochs {epochs} --markdown "
             "docs/benchmarks/auto_frameworks.md`",
             f"on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} cores, torch {torch.__version__}. Load average "
             f"{load0:.2f} at the start, {load1:.2f} at the end.", "",
             "Each cell is the median samples/s of epochs 4-6 of one fresh run. In a 2-process run it is rank",
             "0's. The columns and pipelines:", "",
             "- *best fixed*: the best of 0, 2 and 8 workers, each run through the same framework path.",
             "- *memory*: in-memory samples. No workers is best.",
             "- *wait*: each sample waits 3 ms. Many workers are best.", "",
             f"The acceptance is {ACCEPT:.0%} of the best fixed.", "",
             "| framework | pipeline | auto | workers at the end | best fixed (workers) | auto / best |",
             "|---|---|---|---|---|---|"]
    for fw, pl_, auto, w, _n, best, rate in rows:
        lines.append(f"| {fw} | {pl_} | {auto:,.0f}/s | {w} | {rate:,.0f}/s ({best}) | {auto / rate:.0%} |")
    if rows:
        failed = [f"{fw} {pl_}" for fw, pl_, auto, _w, _n, _b, rate in rows if auto / rate < ACCEPT]
        said = ["Every row passes." if not failed else
                f"{len(failed)} of {len(rows)} rows fail the acceptance: {', '.join(failed)}.",
                "The auto loader starts at 2 workers. It moves after its first epoch and settles after its second."]
        # where the rows settled, said only where it is what this run's rows show
        memory = {w for _fw, pl_, _a, w, *_ in rows if pl_ == "memory"}
        wait = {fw: w for fw, pl_, _a, w, *_ in rows if pl_ == "wait"}
        wait_as_said = all(w == (4 if fw == "lightning-ddp" else 8) for fw, w in wait.items())
        if memory == {0}:
            said.append("It settles on no workers for the in-memory pipeline.")
        if wait and wait_as_said:
            said.append("For the waiting one it settles on 8 workers" + (", or on 4 under DDP, where two ranks share the "
                        f"{os.cpu_count()} cores" if "lightning-ddp" in wait else "") + ".")
        if memory - {0} or not wait_as_said:
            said.append("The *workers at the end* column says where each row settled.")
        lines += ["", *textwrap.wrap(" ".join(said), 94)]
    if any(fw in ("lightning-ddp", "accelerate", "accelerate-2") for fw, *_ in rows):
        lines += ["", "Lightning under DDP re-creates the loader with a DistributedSampler. accelerate builds torch's",
                  "DataLoader from the attributes. tests/test_auto_follow.py checks that the batches equal a fixed",
                  "loader's."]
    if printed:
        lines += ["", "Raw rows, as the script printed them:", "", "```text", *printed, "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", nargs=3, metavar=("FRAMEWORK", "PIPELINE", "SETTING"), help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--pipelines", default=",".join(PIPELINES))
    ap.add_argument("--markdown", help="also write the table as Markdown")
    args = ap.parse_args()
    if args.one:
        framework, pipeline, setting = args.one
        out = one(framework, pipeline, setting if setting == "auto" else int(setting), args.epochs)
        if out is not None:
            print("RESULT " + json.dumps(out), flush=True)
        return 0
    load0 = os.getloadavg()[0]
    rows, printed = [], []
    for framework in args.frameworks.split(","):
        for pipeline in args.pipelines.split(","):
            got = {s: launch(framework, pipeline, s, args.epochs) for s in SETTINGS}
            fixed = {s: tail_rate(got[s]["rates"]) for s in SETTINGS[1:]}
            best = max(fixed, key=fixed.get)
            auto = tail_rate(got["auto"]["rates"])
            row = (framework, pipeline, auto, got["auto"]["workers"], got["auto"]["decisions"], best, fixed[best])
            rows.append(row)
            printed.append(f"{framework:13s} {pipeline:7s} auto {auto:9,.0f}/s (settled on {row[3]} workers, "
                           f"{row[4]} records)  best fixed: {best} workers {fixed[best]:9,.0f}/s  -> "
                           f"{auto / fixed[best]:.0%}  [fixed: {', '.join(f'{s}: {v:,.0f}' for s, v in fixed.items())}]")
            print(printed[-1], flush=True)
    load1 = os.getloadavg()[0]
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, args.epochs, load0, load1, printed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
