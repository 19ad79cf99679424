"""One prepared run for a GPU machine: build, CUDA tests, measurements, RESULTS.md.

    python benchmarks/gpu_check.py            # ~5 minutes on one H200
Prints a short table last and writes benchmarks/RESULTS.md (date, GPU, torch, command).
Not run yet: no session so far has been lent a GPU (see RESULTS.md).
"""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def measure() -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    import fastcollate
    from fastcollate.transforms import Normalize

    dev = torch.device("cuda")
    rows.append(("CUDA kernels built", str(fastcollate.cuda_kernels_built()), "True"))

    # 1. the prefetcher's single copy vs a raw pinned copy of the same bytes
    batch = [{"image": torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8), "label": i} for i in range(256)]
    pinned_batch = fastcollate.Collator(pin_memory=True)(batch)
    nbytes = sum(t.numel() * t.element_size() for t in (pinned_batch["image"], pinned_batch["label"]))
    raw_src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    raw_dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)

    def timed(fn, n=50):
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / n / 1e3

    raw = timed(lambda: raw_dst.copy_(raw_src, non_blocking=True))
    p = fastcollate.CudaPrefetcher([pinned_batch] * 60, device=dev, depth=2)
    list(p)
    torch.cuda.synchronize()
    st = p.stats()
    ours = st["h2d_ms"] / 1e3 / max(1, st["batches"])
    rows.append(("H2D: prefetcher single copy / raw pinned copy_",
                 f"{nbytes / ours / 1e9:.1f} / {nbytes / raw / 1e9:.1f} GB/s ({100 * raw / ours:.0f}%)", ">= 90%"))

    # 2. compute-bound training fed by a DataLoader
    class Images(Dataset):
        def __init__(self, n):
            g = torch.Generator().manual_seed(0)
            self.data = torch.randint(0, 256, (64, 3, 224, 224), dtype=torch.uint8, generator=g)
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return {"image": self.data[i % 64], "label": i % 1000}

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 256, 7, stride=2, padding=3), torch.nn.ReLU(),
        torch.nn.Conv2d(256, 512, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(512, 512, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(512, 1000),
    ).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    norm = Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], dtype=torch.bfloat16, keys=["image"],
                     channels_last=True)

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    steps, bs = 40, 256
    ds = Images(steps * bs)

    def run(batches, prep):
        it = iter(batches)
        for _ in range(3):
            step(*prep(next(it)))
        torch.cuda.synchronize()
        t = time.perf_counter()
        n = 0
        for b in it:
            step(*prep(b))
            n += 1
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / max(1, n)

    on_gpu = norm({"image": ds.data[:1].repeat(bs, 1, 1, 1).to(dev), "label": torch.zeros(bs, dtype=torch.long, device=dev)})
    floor = run([on_gpu] * steps, lambda b: (b["image"], b["label"]))
    workers = min(8, os.cpu_count() or 2)
    plain = run(DataLoader(ds, batch_size=bs, num_workers=workers, pin_memory=True),
                lambda b: (norm.apply(b["image"].to(dev, non_blocking=True)), b["label"].to(dev, non_blocking=True)))
    pref = run(fastcollate.CudaPrefetcher(DataLoader(ds, batch_size=bs, num_workers=workers,
                                                     collate_fn=fastcollate.collate), device=dev, transform=norm),
               lambda b: (b["image"], b["label"]))
    rows.append(("step: data on GPU (floor)", f"{floor * 1e3:.2f} ms", ""))
    rows.append(("step: DataLoader(pin_memory) + .to()", f"{plain * 1e3:.2f} ms ({plain / floor:.3f}x)", ""))
    try:
        from timm.data.loader import PrefetchLoader

        tl = PrefetchLoader(DataLoader(ds, batch_size=bs, num_workers=workers, pin_memory=True,
                                       collate_fn=lambda b: (torch.stack([s["image"] for s in b]),
                                                             torch.tensor([s["label"] for s in b]))),
                            mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), channels=3, device=dev)
        timm_t = run(tl, lambda b: (b[0].to(torch.bfloat16, memory_format=torch.channels_last), b[1]))
        rows.append(("step: timm PrefetchLoader", f"{timm_t * 1e3:.2f} ms ({timm_t / floor:.3f}x)", ""))
    except Exception as exc:  # timm missing or API changed: say so, do not fail the run
        rows.append(("step: timm PrefetchLoader", f"n/a ({type(exc).__name__}: {exc})", ""))
    rows.append(("step: CudaPrefetcher", f"{pref * 1e3:.2f} ms ({pref / floor:.3f}x)", "<= 1.03x floor"))

    # 3. corruption: every batch checksummed on the GPU while the GPU is kept busy
    class Tagged(Dataset):
        def __len__(self):
            return 64 * 50

        def __getitem__(self, i):
            return {"image": torch.full((3, 64, 64), i % 251, dtype=torch.uint8), "tag": i % 251}

    bad = torch.zeros((), dtype=torch.long, device=dev)
    hs = getattr(torch.cuda, "host_memory_stats", lambda: {})
    pf = fastcollate.CudaPrefetcher(DataLoader(Tagged(), batch_size=64, num_workers=2, collate_fn=fastcollate.collate),
                                    device=dev, depth=3)
    allocs_after_warmup = None
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i, b in enumerate(pf):
            torch.cuda._sleep(2_000_000)
            want = b["tag"].view(-1, 1, 1, 1).to(torch.uint8).expand_as(b["image"])
            bad += (b["image"] != want).any(dim=(1, 2, 3)).sum()
            if i == 5:
                allocs_after_warmup = hs().get("num_host_alloc", None)
        syncs = "0 (set_sync_debug_mode('error') raised nothing)"
    except RuntimeError as exc:
        syncs = f"FAILED: {exc}"
    finally:
        torch.cuda.set_sync_debug_mode(0)
    rows.append(("host syncs in the consumer loop", syncs, "0"))
    rows.append(("corrupted batches", str(int(bad.item())), "0"))
    end_allocs = hs().get("num_host_alloc", None)
    rows.append(("pinned allocations after warm-up",
                 "n/a" if allocs_after_warmup is None else str(end_allocs - allocs_after_warmup), "0"))


def report() -> None:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    width = max(len(r[0]) for r in rows)
    lines = [f"| {'check'.ljust(width)} | result | target |", f"|{'-' * (width + 2)}|---|---|"]
    lines += [f"| {c.ljust(width)} | {r} | {t} |" for c, r, t in rows]
    table = "\n".join(lines)
    print(table)
    head = (f"# GPU check\n\n{datetime.date.today()}, {gpu}, torch {torch.__version__} (CUDA {torch.version.cuda}); "
            f"command: `python benchmarks/gpu_check.py`\n\n")
    with open(os.path.join(ROOT, "benchmarks", "RESULTS.md"), "w") as f:
        f.write(head + table + "\n")


if __name__ == "__main__":
    build_and_test()
    try:
        measure()
    finally:
        report()
