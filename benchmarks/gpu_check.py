"""One prepared run for a GPU machine: preflight, build, CUDA tests, measurements, RESULTS.md.

    python benchmarks/gpu_check.py              # a few minutes on one H200
    python benchmarks/gpu_check.py --dry-run    # the same logic on the CPU, tiny sizes, no build (CI runs it)

Made for a machine that returns only what is written under $OUT and gives one command 10
minutes: every row is printed and flushed as soon as it is measured, and RESULTS.md plus
results.json (every figure) are rewritten after each row -- into $OUT when it is set, and into
benchmarks/ (not in a dry run). Each section runs on its own (a failure is a row, not the end),
every subprocess and loader wait has a timeout, and faulthandler dumps every thread's stack and
exits inside --budget seconds, so a hang still brings the rows measured so far home.
"""
from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")


class Report:
    """Rows as they are measured: printed at once, files rewritten after each."""

    def __init__(self, dirs: list[str], header: str) -> None:
        self.dirs, self.header = dirs, header
        self.rows: list[dict] = []

    def add(self, check: str, result: str, target: str = "", **figures) -> None:
        self.rows.append({"check": check, "result": result, "target": target, "figures": figures})
        print(f"ROW | {check} | {result} | {target}", flush=True)
        self.write()

    def table(self) -> str:
        width = max([len(r["check"]) for r in self.rows] + [5])
        lines = [f"| {'check'.ljust(width)} | result | target |", f"|{'-' * (width + 2)}|---|---|"]
        lines += [f"| {r['check'].ljust(width)} | {r['result']} | {r['target']} |" for r in self.rows]
        return "\n".join(lines)

    def write(self) -> None:
        for d in self.dirs:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "RESULTS.md"), "w") as f:
                f.write(self.header + self.table() + "\n")
            with open(os.path.join(d, "results.json"), "w") as f:
                json.dump({"header": self.header, "rows": self.rows}, f, indent=1, default=str)


def sh(cmd: list[str], timeout: float, **kw) -> tuple[int, str]:
    print("+", " ".join(cmd), flush=True)
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as exc:
        return 124, f"timed out after {timeout:.0f} s: {(exc.stdout or '')[-500:]}"
    out = (r.stdout or "") + (r.stderr or "")
    print(out[-3000:], flush=True)
    return r.returncode, out


def version(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (r.stdout or r.stderr).strip().splitlines()[-1][:100] if (r.stdout or r.stderr) else f"rc={r.returncode}"
    except Exception as exc:  # a tool that is not there is a preflight fact, not a failure
        return f"not found ({type(exc).__name__})"


def module_version(name: str) -> str:
    try:
        mod = __import__(name)
        return getattr(mod, "__version__", "present")
    except Exception as exc:
        return f"missing ({type(exc).__name__})"


def preflight(rep: Report) -> None:
    import torch

    drv = version(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    shm = shutil.disk_usage("/dev/shm").free / 2**30 if os.path.exists("/dev/shm") else -1
    facts = {"torch": torch.__version__, "torch CUDA": str(torch.version.cuda), "GPU, driver": drv,
             "nvcc": version(["nvcc", "--version"]), "ninja": version(["ninja", "--version"]),
             "setuptools": module_version("setuptools"), "pytest": module_version("pytest"),
             "timm": module_version("timm"), "free /dev/shm GiB": f"{shm:.1f}", "cores": str(os.cpu_count())}
    rep.add("preflight", "; ".join(f"{k} {v}" for k, v in facts.items()), "", **facts)


def build(rep: Report) -> bool:
    env = dict(os.environ, FASTCOLLATE_FORCE_CUDA="1", TORCH_CUDA_ARCH_LIST=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"),
               MAX_JOBS=str(os.cpu_count() or 4))
    t0 = time.perf_counter()
    rc, out = sh([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", "."],
                 timeout=420, env=env)
    if rc != 0:  # an old pip / setuptools: build in place instead
        rc, out = sh([sys.executable, "setup.py", "build_ext", "--inplace"], timeout=420, env=env)
    check = subprocess.run([sys.executable, "-c", "import fastcollate; print(fastcollate.cuda_kernels_built(), "
                            "fastcollate.backend())"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    built = check.stdout.strip() == "True cpp"
    rep.add("build (CPU+CUDA, arch 9.0)", f"{'ok' if built else 'FAILED'} in {time.perf_counter() - t0:.0f} s "
            f"(rc {rc}; kernels/backend: {check.stdout.strip() or check.stderr.strip()[-200:]})", "ok")
    if not built:
        print("gpu_check: the CUDA extension did not build -- stopping here (no silent Python fallback)", flush=True)
    return built


def cuda_tests(rep: Report) -> None:
    rc, out = sh([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests", "-p", "no:cacheprovider",
                  "--ignore=tests/integration"], timeout=300)
    tail = [line for line in out.splitlines() if "passed" in line or "failed" in line or "error" in line.lower()]
    rep.add("pytest -m cuda", (tail[-1] if tail else f"rc {rc}")[:200], "all passed")


def sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def sync_calls(fn, cuda: bool) -> tuple[int, int]:
    """(sync API calls on this thread, on all threads) while fn() runs, from torch.profiler."""
    if not cuda:
        fn()
        return 0, 0
    from torch.profiler import ProfilerActivity, profile

    me = threading.get_native_id()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
    events = [e for e in prof.events() if e.name in SYNC_CALLS]
    return sum(1 for e in events if getattr(e, "thread", None) == me), len(events)


class Tagged:
    """Samples whose pixels all equal a tag known from the index: a batch whose slot was
    rewritten before its copy completed cannot pass."""

    def __init__(self, n: int, hw: int = 64) -> None:
        self.n, self.hw = n, hw

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        import torch

        return {"image": torch.full((3, self.hw, self.hw), i % 251, dtype=torch.uint8), "tag": i % 251}


def measure(rep: Report, dev, small: bool, run) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    import fastcollate
    from fastcollate._bench import train_run as e2e
    from fastcollate.transforms import Normalize

    cuda = dev.type == "cuda"
    n_img, hw, steps = (32, 32, 6) if small else (256, 224, 40)
    workers = 2 if small else min(8, os.cpu_count() or 2)
    lw = dict(timeout=120) if workers else {}  # a hung worker raises instead of eating the lease
    MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

    @run("Normalize: kernel vs torch path (CPU, and CUDA with a tensor scale), bitwise")
    def _():
        if not cuda:
            return "n/a (CPU)", ""
        out = []
        x = torch.randint(0, 256, (8, 3, 61, 57), dtype=torch.uint8, device=dev)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            n = Normalize(MEAN, STD, dtype=dtype, channels_last=True)
            k, bits = n.apply(x).cpu(), torch.int32 if dtype == torch.float32 else torch.int16
            same_cpu = torch.equal(k.view(bits), n._torch(x.cpu()).view(bits))
            same_gpu = torch.equal(k.view(bits), n._torch(x).cpu().view(bits))
            scalar = x.to(torch.float32).div_(255.0).sub_(torch.tensor(MEAN, device=dev).view(-1, 1, 1)).div_(
                torch.tensor(STD, device=dev).view(-1, 1, 1)).to(dtype).cpu()
            out.append(f"{str(dtype)[6:]}: cpu {same_cpu}, cuda {same_gpu}, python-scalar div {torch.equal(k.contiguous().view(bits), scalar.view(bits))}")
        return "; ".join(out), "cpu True, cuda True"

    @run("H2D: prefetcher single copy / raw pinned copy_")
    def _():
        if not cuda:
            return "n/a (CPU)", ""
        batch = [{"image": torch.randint(0, 256, (3, hw, hw), dtype=torch.uint8), "label": i} for i in range(n_img)]
        pinned_batch = fastcollate.Collator(pin_memory=True)(batch)
        nbytes = pinned_batch["image"].numel() + pinned_batch["label"].numel() * 8
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        for _ in range(5):
            dst.copy_(src, non_blocking=True)
        sync(dev)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(50):
            dst.copy_(src, non_blocking=True)
        e.record()
        sync(dev)
        raw = s.elapsed_time(e) / 50 / 1e3
        list(fastcollate.CudaPrefetcher([pinned_batch] * 5, device=dev))  # warm-up: stream, events, allocator
        p = fastcollate.CudaPrefetcher([pinned_batch] * 60, device=dev, depth=2)
        list(p)
        sync(dev)
        st = p.stats()
        ours = st["h2d_ms"] / 1e3 / max(1, st["batches"])
        return (f"{nbytes / ours / 1e9:.1f} / {nbytes / raw / 1e9:.1f} GB/s ({100 * raw / ours:.0f}%); single-copy "
                f"batches {st['single_copy_batches']}/{st['batches']}; pinned_bytes {st['pinned_bytes']}"), ">= 90%"

    @run("failed cudaHostRegister leaves no CUDA error behind")
    def _():
        if not cuda:
            return "n/a (CPU)", ""
        from fastcollate import _ext

        buf = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)  # already page-locked: register fails
        err = _ext._C.host_register(buf.data_ptr(), buf.numel())
        y = Normalize(MEAN, STD).apply(torch.zeros(1, 3, 4, 4, dtype=torch.uint8, device=dev))  # checks its launch
        z = (torch.ones(4, device=dev) * 2).sum()
        sync(dev)
        return f"register said {err[:60]!r}; next launches ok: {bool(y.isfinite().all()) and z.item() == 8}", "error text, ok True"

    def ring_loader(n):
        return fastcollate.DataLoader(Tagged(n), batch_size=32, num_workers=2, pin_memory=cuda, persistent_workers=True,
                                      **lw)

    @run("ring + pin_memory, plain loop .to(non_blocking) with the GPU kept busy: corrupted batches")
    def _():
        loader = ring_loader(32 * (8 if small else 200))
        bad = torch.zeros((), dtype=torch.long, device=dev)
        n = 0
        for epoch in range(2):
            for b in loader:
                tag = b["tag"].clone()  # the true value, read before this batch can be released
                if cuda:
                    torch.cuda._sleep(1_000_000)  # the copy below waits behind this: the slot is read late
                x = b["image"].to(dev, non_blocking=True)
                want = tag.to(dev, non_blocking=True).view(-1, 1, 1, 1).to(torch.uint8)
                bad += (x != want).flatten(1).any(dim=1).sum()
                n += 1
        st = loader.stats()
        return (f"{int(bad.item())} of {n}; ring hits {st['ring_hits']}, fallbacks {st['ring_fallbacks']}, pinned "
                f"{st['ring_pinned']} ({st['ring_pinned_bytes'] >> 20} MiB), pending {st['ring_slots_pending']}"), "0"

    @run("ring + pin_memory through CudaPrefetcher, GPU kept busy: corrupted batches, host syncs (consumer/all threads)")
    def _():
        loader = ring_loader(32 * (8 if small else 200))
        bad = torch.zeros((), dtype=torch.long, device=dev)
        counted = [0]

        def consume():
            for b in fastcollate.CudaPrefetcher(loader, device=dev, depth=3):
                if cuda:
                    torch.cuda._sleep(1_000_000)
                bad.add_((b["image"] != b["tag"].view(-1, 1, 1, 1).to(torch.uint8)).flatten(1).any(dim=1).sum())
                counted[0] += 1

        consume()  # warm-up epoch: fork, ring, first faults and registrations
        if cuda:
            torch.cuda.set_sync_debug_mode("error")
        try:
            mine, everyone = sync_calls(consume, cuda)
            debug = "set_sync_debug_mode('error') raised nothing"
        except RuntimeError as exc:
            mine, everyone, debug = -1, -1, f"sync debug mode raised: {str(exc)[:80]}"
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
        return (f"{int(bad.item())} of {counted[0]}; sync API calls {mine} consumer / {everyone} all threads "
                f"({', '.join(SYNC_CALLS)}); {debug}"), "0; 0 consumer"

    class Images(Dataset):
        def __init__(self, n):
            self.data = torch.randint(0, 256, (64, 3, hw, hw), dtype=torch.uint8)
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return {"image": self.data[i % 64], "label": i % 10}

    ds = Images(steps * n_img)

    @run("step: fastcollate.DataLoader + CudaPrefetcher vs data already on the device")
    def _():
        width = 32 if small else 512
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, width // 2, 7, stride=2, padding=3), torch.nn.ReLU(),
            torch.nn.Conv2d(width // 2, width, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(width, 10),
        ).to(dev, memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        norm = Normalize(MEAN, STD, dtype=torch.bfloat16, keys=["image"], channels_last=True)

        def step(x, y):
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        def timed(make, prep):
            for b in make():  # warm-up pass: workers, ring, allocator, cudnn autotune
                step(*prep(b))
            sync(dev)
            t, n = time.perf_counter(), 0
            for b in make():
                step(*prep(b))
                n += 1
            sync(dev)
            return (time.perf_counter() - t) / max(1, n)

        on_dev = norm({"image": ds.data[:1].repeat(n_img, 1, 1, 1).to(dev),
                       "label": torch.zeros(n_img, dtype=torch.long, device=dev)})
        floor = timed(lambda: [on_dev] * steps, lambda b: (b["image"], b["label"]))
        plain_loader = DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=cuda, persistent_workers=True, **lw)
        plain = timed(lambda: plain_loader, lambda b: (norm.apply(b["image"].to(dev, non_blocking=True)),
                                                      b["label"].to(dev, non_blocking=True)))
        ours_loader = fastcollate.DataLoader(ds, batch_size=n_img, num_workers=workers, persistent_workers=True, **lw)
        pref = timed(lambda: fastcollate.CudaPrefetcher(ours_loader, device=dev, transform=norm),
                     lambda b: (b["image"], b["label"]))
        extra = ""
        try:
            from timm.data.loader import PrefetchLoader

            timm_loader = DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=True, persistent_workers=True,
                                     collate_fn=_stack_pairs, **lw)
            tl = PrefetchLoader(timm_loader, mean=MEAN, std=STD, channels=3, device=dev)
            tt = timed(lambda: tl, lambda b: (b[0].to(torch.bfloat16, memory_format=torch.channels_last), b[1]))
            extra = f"; timm PrefetchLoader {tt * 1e3:.2f} ms ({tt / floor:.3f}x)"
        except Exception as exc:  # timm missing (CPU dry run) or its API moved: say so
            extra = f"; timm n/a ({type(exc).__name__})"
        return (f"{pref * 1e3:.2f} ms ({pref / floor:.3f}x floor {floor * 1e3:.2f} ms); DataLoader(pin_memory) + .to() "
                f"{plain * 1e3:.2f} ms ({plain / floor:.3f}x){extra}"), "<= 1.03x floor"

    @run("data-bound samples/s: torch pin_memory / ring + prefetcher (warm loaders)")
    def _():
        def rate(loader, to_dev):
            for b in loader:  # warm-up epoch (persistent workers stay)
                pass
            t, n = time.perf_counter(), 0
            for b in loader:
                x = b["image"].to(dev, non_blocking=True) if to_dev else b["image"]
                n += x.shape[0]
            sync(dev)
            return n / (time.perf_counter() - t)

        torch_rate = rate(DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=cuda, persistent_workers=True,
                                     **lw), True)
        ring = fastcollate.DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=cuda, persistent_workers=True,
                                      **lw)
        ring_rate = rate(fastcollate.CudaPrefetcher(ring, device=dev), False)
        return (f"{torch_rate:.0f} / {ring_rate:.0f} ({ring_rate / torch_rate:.2f}x); ring pinned "
                f"{ring.stats().get('ring_pinned')}"), ">= 1.5x"

    @run("TokenWindows via the ring (pin_memory) + CudaPrefetcher: device batches vs default_collate; samples/s vs "
         "map-style + pin_memory + .to()")
    def _():
        import numpy as np
        from torch.utils.data import default_collate

        from fastcollate._bench.storage import NaiveWindows

        tokens = np.random.default_rng(0).integers(0, 50257, (1 << 16) if small else (1 << 24)).astype(np.uint16)
        seq, bs = (64, 8) if small else (1024, 64)
        ds_w = fastcollate.TokenWindows(tokens, seq)
        ring = fastcollate.DataLoader(ds_w, batch_size=bs, num_workers=workers, pin_memory=cuda,
                                      persistent_workers=True, **lw)
        bad = n = 0
        for i, b in enumerate(fastcollate.CudaPrefetcher(ring, device=dev)):
            want = default_collate([ds_w[j] for j in range(i * bs, min((i + 1) * bs, len(ds_w)))])
            bad += not all(b[k].device.type == dev.type and torch.equal(b[k].cpu(), want[k]) for k in want)
            n += 1

        def rate(loader, to_dev):
            t, count = time.perf_counter(), 0
            for b in loader:
                x = b[0].to(dev, non_blocking=True) if to_dev else b["input_ids"]
                count += x.shape[0]
            sync(dev)
            return count / (time.perf_counter() - t)

        theirs = DataLoader(NaiveWindows(tokens, seq), batch_size=bs, num_workers=workers, pin_memory=cuda,
                            persistent_workers=True, **lw)
        rate(theirs, True)  # warm-up epochs (persistent workers stay)
        pf = fastcollate.CudaPrefetcher(ring, device=dev)
        rate(pf, False)
        theirs_rate, ours_rate = rate(theirs, True), rate(pf, False)
        return (f"{bad} of {n} batches differ; {ours_rate:.0f} / {theirs_rate:.0f} samples/s "
                f"({ours_rate / theirs_rate:.2f}x); ring pinned {ring.stats().get('ring_pinned')}"), "0 differ; >= 2x"

    @run("pinned allocations after warm-up (caching host allocator)")
    def _():
        if not cuda:
            return "n/a (CPU)", "0"
        loader = fastcollate.DataLoader(Tagged(64 * 20), batch_size=64, num_workers=2, **lw)
        p = fastcollate.CudaPrefetcher(loader, device=dev)
        list(p)
        before = torch.cuda.host_memory_stats().get("num_host_alloc")
        list(p)
        after = torch.cuda.host_memory_stats().get("num_host_alloc")
        return f"{None if before is None else after - before} (pinned_bytes {p.stats()['pinned_bytes']})", "0"

    for dtype_name in ("bfloat16", "float16") if cuda else ("auto",):
        @run(f"train_one_epoch {dtype_name}, fused AdamW: syncs (debug-mode warnings; profiler consumer/all)")
        def _():
            dtype = getattr(torch, dtype_name, "auto")
            net = e2e.small_convnet().to(dev)
            adam = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=cuda or None)
            loader = fastcollate.CudaPrefetcher(fastcollate.DataLoader(e2e.SyntheticImages(64 * steps), batch_size=64,
                                                                       num_workers=workers, **lw), device=dev)
            fastcollate.train_one_epoch(net, loader, adam, amp_dtype=dtype, forward=e2e._forward)  # warm-up
            box = {}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                try:
                    mine, everyone = sync_calls(lambda: box.update(stats=fastcollate.train_one_epoch(
                        net, loader, adam, amp_dtype=dtype, forward=e2e._forward)), cuda)
                finally:
                    if cuda:
                        torch.cuda.set_sync_debug_mode(0)
            stats = box["stats"]
            n_sync = sum("synchroniz" in str(w.message) for w in caught)
            return (f"{n_sync} warnings, {mine}/{everyone} sync calls in {stats.steps} steps (loss {stats.loss:.3f}, "
                    f"skipped {stats.skipped_steps})"), "only the end-of-epoch reads (<= 4)"

    class Slow(Images):
        def __getitem__(self, i):
            time.sleep(0.01)
            return super().__getitem__(i)

    def verdict(dataset, model_width):
        net = torch.nn.Sequential(torch.nn.Conv2d(3, model_width, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.Conv2d(model_width, model_width, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                  torch.nn.Linear(model_width, 10)).to(dev)
        mon = fastcollate.StallMonitor()
        pf = fastcollate.CudaPrefetcher(fastcollate.DataLoader(dataset, batch_size=16, num_workers=1, **lw), device=dev)
        mon.attach(pf)
        fastcollate.train_one_epoch(net, pf, torch.optim.SGD(net.parameters(), lr=0.01), monitor=mon,
                                    forward=e2e._forward)
        return mon.report()["verdict"]

    @run("StallMonitor: slow dataset")
    def _():
        return verdict(Slow(16 * 6), 8), "data-bound"

    @run("StallMonitor: heavy model")
    def _():
        return verdict(Images(16 * 6), 64 if small else 1024), "compute-bound"


def _stack_pairs(b):
    import torch

    return torch.stack([s["image"] for s in b]), torch.tensor([s["label"] for s in b])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, no build, benchmarks/RESULTS.md untouched")
    ap.add_argument("--budget", type=float, default=540, help="seconds before every stack is dumped and the run exits")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(args.budget, exit=True)
    import torch

    out = os.environ.get("OUT")
    dirs = ([out] if out else []) + ([] if args.dry_run else [os.path.join(ROOT, "benchmarks")])
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.dry_run else "none (CPU dry run)"
    header = (f"# GPU check\n\n{datetime.date.today()}, {gpu}, torch {torch.__version__} (CUDA {torch.version.cuda}); "
              f"command: `python benchmarks/gpu_check.py{' --dry-run' if args.dry_run else ''}`\n\n")
    rep = Report(dirs, header)

    def run(name):
        def wrap(fn):
            t0 = time.perf_counter()
            try:
                result, target = fn()
                rep.add(name, f"{result} [{time.perf_counter() - t0:.1f} s]", target)
            except Exception as exc:  # one failed section is a row; the others still run
                traceback.print_exc()
                rep.add(name, f"FAILED: {type(exc).__name__}: {str(exc)[:160]}", "")
            return fn
        return wrap

    preflight(rep)
    if not args.dry_run:
        if not build(rep):
            sys.exit(2)
        cuda_tests(rep)
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    measure(rep, dev, small=args.dry_run, run=run)
    print(rep.table(), flush=True)
    failed = [r["check"] for r in rep.rows if r["result"].startswith("FAILED")]
    if failed:
        print(f"gpu_check: {len(failed)} section(s) failed: {failed}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
