"""One prepared run for a GPU machine: build, CUDA tests, measurements, RESULTS.md.

    python benchmarks/gpu_check.py              # ~5 minutes on one H200; rewrites benchmarks/RESULTS.md
    python benchmarks/gpu_check.py --dry-run    # the same logic on the CPU, tiny sizes, no build (a smoke test)

Prints a short table last. Not yet run on a GPU: no session so far has been lent one.
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
rows: list[tuple[str, str, str]] = []  # (check, result, target)


def sh(cmd: list[str], **kw) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT, **kw)


def build_and_test() -> None:
    env = dict(os.environ, FASTCOLLATE_FORCE_CUDA="1", MAX_JOBS=str(min(16, os.cpu_count() or 4)))
    rc = sh([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", "."], env=env)
    rows.append(("build (CPU+CUDA)", "ok" if rc == 0 else f"FAILED rc={rc}", "ok"))
    rc = sh([sys.executable, "-m", "pytest", "-q", "-x", "tests", "-m", "cuda"])
    rows.append(("pytest -m cuda", "ok" if rc == 0 else f"FAILED rc={rc}", "ok"))


def sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(dev, small: bool) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    import fastcollate
    from fastcollate import e2e
    from fastcollate.transforms import Normalize

    cuda = dev.type == "cuda"
    n_img, hw, steps = (32, 32, 6) if small else (256, 224, 40)
    workers = 2 if small else min(8, os.cpu_count() or 2)
    rows.append(("CUDA kernels built", str(fastcollate.cuda_kernels_built()), "True"))

    # 1. the prefetcher's single copy vs a raw pinned copy of the same bytes
    batch = [{"image": torch.randint(0, 256, (3, hw, hw), dtype=torch.uint8), "label": i} for i in range(n_img)]
    pinned_batch = fastcollate.Collator(pin_memory=cuda)(batch)
    nbytes = pinned_batch["image"].numel() + pinned_batch["label"].numel() * 8
    if cuda:
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        dst.copy_(src, non_blocking=True)
        sync(dev)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(50):
            dst.copy_(src, non_blocking=True)
        e.record()
        sync(dev)
        raw = s.elapsed_time(e) / 50 / 1e3
        p = fastcollate.CudaPrefetcher([pinned_batch] * 60, device=dev, depth=2)
        list(p)
        sync(dev)
        st = p.stats()
        ours = st["h2d_ms"] / 1e3 / max(1, st["batches"])
        rows.append(("H2D: prefetcher single copy / raw pinned copy_",
                     f"{nbytes / ours / 1e9:.1f} / {nbytes / raw / 1e9:.1f} GB/s ({100 * raw / ours:.0f}%); "
                     f"single-copy batches {st['single_copy_batches']}/{st['batches']}", ">= 90%"))

    # 2. a compute-bound model fed by a DataLoader
    class Images(Dataset):
        def __init__(self, n):
            self.data = torch.randint(0, 256, (64, 3, hw, hw), dtype=torch.uint8)
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return {"image": self.data[i % 64], "label": i % 10}

    width = 32 if small else 512
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, width // 2, 7, stride=2, padding=3), torch.nn.ReLU(),
        torch.nn.Conv2d(width // 2, width, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(width, 10),
    ).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    norm = Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], dtype=torch.bfloat16, keys=["image"],
                     channels_last=True)

    def step(x, y):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    ds = Images(steps * n_img)

    def run(batches, prep):
        it = iter(batches)
        for _ in range(2):
            step(*prep(next(it)))
        sync(dev)
        t, n = time.perf_counter(), 0
        for b in it:
            step(*prep(b))
            n += 1
        sync(dev)
        return (time.perf_counter() - t) / max(1, n)

    on_dev = norm({"image": ds.data[:1].repeat(n_img, 1, 1, 1).to(dev), "label": torch.zeros(n_img, dtype=torch.long, device=dev)})
    floor = run([on_dev] * steps, lambda b: (b["image"], b["label"]))
    plain = run(DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=cuda),
                lambda b: (norm.apply(b["image"].to(dev, non_blocking=True)), b["label"].to(dev, non_blocking=True)))
    pref = run(fastcollate.CudaPrefetcher(fastcollate.DataLoader(ds, batch_size=n_img, num_workers=workers),
                                          device=dev, transform=norm), lambda b: (b["image"], b["label"]))
    rows.append(("step: data already on the device (floor)", f"{floor * 1e3:.2f} ms", ""))
    rows.append(("step: DataLoader(pin_memory) + .to()", f"{plain * 1e3:.2f} ms ({plain / floor:.3f}x floor)", ""))
    try:
        from timm.data.loader import PrefetchLoader

        tl = PrefetchLoader(DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=True,
                                       collate_fn=lambda b: (torch.stack([s["image"] for s in b]),
                                                             torch.tensor([s["label"] for s in b]))),
                            mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), channels=3, device=dev)
        timm_t = run(tl, lambda b: (b[0].to(torch.bfloat16, memory_format=torch.channels_last), b[1]))
        rows.append(("step: timm PrefetchLoader", f"{timm_t * 1e3:.2f} ms ({timm_t / floor:.3f}x floor)", ""))
    except Exception as exc:  # timm missing (CPU dry run) or its API moved: say so, do not fail the run
        rows.append(("step: timm PrefetchLoader", f"n/a ({type(exc).__name__}: {str(exc)[:60]})", ""))
    rows.append(("step: fastcollate.DataLoader + CudaPrefetcher", f"{pref * 1e3:.2f} ms ({pref / floor:.3f}x floor)",
                 "<= 1.03x floor"))

    # 3. data-bound: the ring + pin_memory against torch's loader with the same workers
    def drain(loader, to_dev):
        t, n = time.perf_counter(), 0
        for b in loader:
            x = b["image"].to(dev, non_blocking=True) if to_dev else b["image"]
            n += x.shape[0]
        sync(dev)
        return n / (time.perf_counter() - t)

    torch_rate = drain(DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=cuda, persistent_workers=True), True)
    ring_loader = fastcollate.DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=cuda, persistent_workers=True)
    ring_rate = drain(fastcollate.CudaPrefetcher(ring_loader, device=dev), False)
    rows.append(("data-bound samples/s: torch pin_memory / ring + prefetcher",
                 f"{torch_rate:.0f} / {ring_rate:.0f} ({ring_rate / torch_rate:.2f}x); ring registered: "
                 f"{ring_loader.stats().get('ring_registered')}", ">= 1.5x"))

    # 4. corruption: every batch checked on the device while the device is kept busy
    class Tagged(Dataset):
        def __len__(self):
            return 64 * (10 if small else 50)

        def __getitem__(self, i):
            return {"image": torch.full((3, 64, 64), i % 251, dtype=torch.uint8), "tag": i % 251}

    bad = torch.zeros((), dtype=torch.long, device=dev)
    hs = getattr(torch.cuda, "host_memory_stats", lambda: {}) if cuda else (lambda: {})
    pf = fastcollate.CudaPrefetcher(fastcollate.DataLoader(Tagged(), batch_size=64, num_workers=2), device=dev, depth=3)
    allocs_after_warmup = None
    if cuda:
        torch.cuda.set_sync_debug_mode("error")
    try:
        for i, b in enumerate(pf):
            if cuda:
                torch.cuda._sleep(2_000_000)
            want = b["tag"].view(-1, 1, 1, 1).to(torch.uint8).expand_as(b["image"])
            bad += (b["image"] != want).any(dim=3).any(dim=2).any(dim=1).sum()
            if i == 5:
                allocs_after_warmup = hs().get("num_host_alloc", None)
        syncs = "0 (set_sync_debug_mode('error') raised nothing)" if cuda else "n/a (CPU)"
    except RuntimeError as exc:
        syncs = f"FAILED: {str(exc)[:80]}"
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(0)
    rows.append(("host syncs in the prefetcher's consumer loop", syncs, "0"))
    rows.append(("corrupted batches", str(int(bad.item())), "0"))
    end_allocs = hs().get("num_host_alloc", None)
    rows.append(("pinned allocations after warm-up",
                 "n/a" if allocs_after_warmup is None or end_allocs is None else str(end_allocs - allocs_after_warmup), "0"))

    # 5. train_one_epoch: bf16 and fp16 (GradScaler), fused AdamW; syncs counted in warn mode
    for dtype in (torch.bfloat16, torch.float16) if cuda else (torch.bfloat16,):
        net = e2e.small_convnet().to(dev)
        adam = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)
        loader = fastcollate.CudaPrefetcher(fastcollate.DataLoader(e2e.SyntheticImages(64 * steps),
                                                                   batch_size=64, num_workers=workers), device=dev)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                stats = fastcollate.train_one_epoch(net, loader, adam, amp_dtype=dtype, forward=e2e._forward)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
        n_sync = sum("synchroniz" in str(w.message) for w in caught)
        rows.append((f"train_one_epoch {str(dtype).split('.')[-1]}: syncs in {stats.steps} steps",
                     f"{n_sync} (loss {stats.loss:.3f}, skipped {stats.skipped_steps})",
                     "only the end-of-epoch reads (<= 4)"))

    # 6. StallMonitor verdicts
    class Slow(Images):
        def __getitem__(self, i):
            time.sleep(0.01)
            return super().__getitem__(i)

    def verdict(dataset, model_width):
        net = torch.nn.Sequential(torch.nn.Conv2d(3, model_width, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.Conv2d(model_width, model_width, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(model_width, 10)).to(dev)
        mon = fastcollate.StallMonitor()
        pf = fastcollate.CudaPrefetcher(fastcollate.DataLoader(dataset, batch_size=16, num_workers=1), device=dev)
        mon.attach(pf)
        fastcollate.train_one_epoch(net, pf, torch.optim.SGD(net.parameters(), lr=0.01), monitor=mon,
                                    forward=e2e._forward)
        return mon.report()["verdict"]

    rows.append(("StallMonitor: slow dataset", verdict(Slow(16 * 6), 8), "data-bound"))
    rows.append(("StallMonitor: heavy model", verdict(Images(16 * 6), 64 if small else 1024), "compute-bound"))


def report(dry_run: bool) -> None:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU dry run)"
    width = max(len(r[0]) for r in rows)
    lines = [f"| {'check'.ljust(width)} | result | target |", f"|{'-' * (width + 2)}|---|---|"]
    lines += [f"| {c.ljust(width)} | {r} | {t} |" for c, r, t in rows]
    table = "\n".join(lines)
    print(table)
    if dry_run:
        return
    head = (f"# GPU check\n\n{datetime.date.today()}, {gpu}, torch {torch.__version__} (CUDA {torch.version.cuda}); "
            f"command: `python benchmarks/gpu_check.py`\n\n")
    with open(os.path.join(ROOT, "benchmarks", "RESULTS.md"), "w") as f:
        f.write(head + table + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, no build, RESULTS.md untouched")
    args = ap.parse_args()
    import torch

    if not args.dry_run:
        build_and_test()
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    try:
        measure(dev, small=args.dry_run)
    finally:
        report(args.dry_run)


if __name__ == "__main__":
    main()
