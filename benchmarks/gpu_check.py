"""One prepared run for a GPU machine: preflight, build, CUDA tests, measurements, RESULTS.md.

    python benchmarks/gpu_check.py                        # about 6 minutes on one H200 (run with a ~420 s limit)
    python benchmarks/gpu_check.py --dry-run --out DIR    # the same logic on the CPU, tiny sizes, no build (CI runs it)

Made for a machine that returns only what is written under $OUT (or --out) and 12,000
characters of output. Everything lands there as it happens: check.log (this run's own output),
build.log, pytest.log, stacks_*.txt (faulthandler dumps of sections that ran past their limit),
results.json (every row with its numeric figures and ok) and RESULTS.md (the table; also
benchmarks/RESULTS.md outside a dry run). Every row can fail: a row's ``ok`` is False when its
target is missed, or when its control shows the check could not have seen a failure (a
corruption check whose fences-off control shows no corruption is "blind"; a sync count whose
positive control is not counted "saw nothing"). Nothing waits without a bound: the build runs in
its own process group, killed on timeout; pytest runs explicit files with a per-test bound; each
section runs under a watchdog that dumps every stack to a file and moves on; the measurements
share --budget seconds (360 by default). Exit status: 0 all rows ok, 1 some row failed, 2 the
CUDA build failed.
"""
from __future__ import annotations

import argparse
import datetime
import faulthandler
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")
CUDA_TEST_FILES = ("tests/test_transforms.py", "tests/test_prefetch.py", "tests/test_arena.py")
BACKLOG_MS = 30.0  # GPU work queued ahead of each copy in the corruption rows: the slot is read this late


class Tee:
    """This run's output, also into check.log (only $OUT comes back)."""

    def __init__(self, stream, path: str) -> None:
        self.stream, self.file = stream, open(path, "a", buffering=1)

    def write(self, text: str) -> int:
        self.file.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.file.flush()
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()


class Report:
    """Rows as they are measured: printed at once, files rewritten after each."""

    def __init__(self, dirs: list[str], header: str) -> None:
        self.dirs, self.header = dirs, header
        self.rows: list[dict] = []
        self.lock = threading.Lock()

    def add(self, check: str, result: str, target: str = "", ok: bool | None = None, **figures) -> None:
        nums = {k: v for k, v in figures.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        facts = {k: v for k, v in figures.items() if k not in nums}
        with self.lock:
            self.rows.append({"check": check, "result": result, "target": target, "ok": ok, "figures": nums,
                              "facts": facts})
            mark = {True: "ok", False: "FAIL", None: "-"}[ok]
            print(f"ROW | {check} | {result} | {target} | {mark}", flush=True)
            self.write()

    def table(self) -> str:
        width = max([len(r["check"]) for r in self.rows] + [5])
        lines = [f"| {'check'.ljust(width)} | result | target | ok |", f"|{'-' * (width + 2)}|---|---|---|"]
        lines += [f"| {r['check'].ljust(width)} | {r['result']} | {r['target']} | "
                  f"{ {True: 'ok', False: 'FAIL', None: '-'}[r['ok']]} |" for r in self.rows]
        return "\n".join(lines)

    def write(self) -> None:
        for d in self.dirs:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "RESULTS.md"), "w") as f:
                f.write(self.header + self.table() + "\n")
            with open(os.path.join(d, "results.json"), "w") as f:
                json.dump({"header": self.header, "rows": self.rows}, f, indent=1, default=str)

    def failed(self) -> list[str]:
        return [r["check"] for r in self.rows if r["ok"] is False]


def run_logged(cmd: list[str], timeout: float, log: str, env: dict | None = None) -> tuple[int, str]:
    """cmd in its own process group, output to `log`; the whole group is killed on timeout.
    (rc, the log's tail); rc 124 on timeout."""
    print("+", " ".join(cmd), f"(log: {os.path.basename(log)})", flush=True)
    with open(log, "a") as f:
        f.write(f"\n+ {' '.join(cmd)}\n")
        f.flush()
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = 124
            f.write(f"\n[gpu_check: killed the process group after {timeout:.0f} s]\n")
    with open(log) as f:
        tail = f.read()[-4000:]
    return rc, tail


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
    import shutil

    import torch

    drv = version(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    shm = shutil.disk_usage("/dev/shm").free / 2**30 if os.path.exists("/dev/shm") else -1
    facts = {"torch": torch.__version__, "torch_cuda": str(torch.version.cuda), "gpu_driver": drv,
             "nvcc": version(["nvcc", "--version"]), "ninja": version(["ninja", "--version"]),
             "pytest": module_version("pytest"), "pytest_timeout": module_version("pytest_timeout"),
             "timm": module_version("timm")}
    rep.add("preflight", "; ".join(f"{k} {v}" for k, v in facts.items()), "", None, shm_free_gib=round(shm, 1),
            cores=os.cpu_count() or 0, **facts)


def build(rep: Report, out: str, timeout: float) -> bool:
    # CUDA 13 rejects archs below 7.5: an inherited list could fail the build, so it is forced
    env = dict(os.environ, FASTCOLLATE_FORCE_CUDA="1", TORCH_CUDA_ARCH_LIST="9.0",
               MAX_JOBS=str(os.cpu_count() or 4))
    log = os.path.join(out, "build.log")
    t0 = time.perf_counter()
    rc, _ = run_logged([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", "."],
                       timeout, log, env)
    if rc not in (0, 124):  # an old pip / setuptools: build in place instead
        rc, _ = run_logged([sys.executable, "setup.py", "build_ext", "--inplace"],
                           max(30.0, timeout - (time.perf_counter() - t0)), log, env)
    try:
        check = subprocess.run([sys.executable, "-c", "import fastcollate; print(fastcollate.cuda_kernels_built(), "
                                "fastcollate.backend())"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        said = check.stdout.strip() or check.stderr.strip()[-200:]
    except subprocess.TimeoutExpired:
        said = "import timed out"
    built = said == "True cpp"
    secs = time.perf_counter() - t0
    rep.add("build (CPU+CUDA, TORCH_CUDA_ARCH_LIST=9.0)", f"{'built' if built else 'NOT BUILT'} in {secs:.0f} s "
            f"(rc {rc}; kernels/backend: {said}; log build.log)", "built", built, seconds=round(secs, 1), rc=rc)
    return built


def pytest_bound() -> list[str]:
    """A per-test bound of 60 s: pytest-timeout's when it is installed, else a faulthandler
    that dumps the stacks and ends pytest (benchmarks/_pytest_bound.py)."""
    if importlib.util.find_spec("pytest_timeout") is not None:
        return ["--timeout=60"]
    return ["-p", "_pytest_bound"]


def summary_counts(text: str) -> dict[str, int]:
    counts = {}
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)", text):
        counts[word.rstrip("s") if word.startswith("error") else word] = int(n)
    m = re.search(r"(\d+)(?:/\d+)? tests? collected", text)
    if m:
        counts["collected"] = int(m.group(1))
    return counts


def cuda_tests(rep: Report, out: str, dry: bool) -> None:
    log = os.path.join(out, "pytest.log")
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *CUDA_TEST_FILES]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "benchmarks") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if dry:  # no GPU: every cuda test would skip; check that the files and the marker still select tests
        rc, tail = run_logged(cmd + ["--collect-only"], 240, log, env)
        c = summary_counts(tail)
        n = c.get("collected", 0)
        rep.add("pytest -m cuda (dry run: collected, not run)", f"{n} tests selected by -m cuda (rc {rc}; pytest.log)",
                ">= 1 selected", rc == 0 and n >= 1, selected=n, rc=rc)
        return
    rc, tail = run_logged(cmd + pytest_bound(), 300, log, env)
    c = summary_counts(tail)
    passed, failed, skipped, errors = (c.get(k, 0) for k in ("passed", "failed", "skipped", "error"))
    if rc == 124:
        verdict = "timed out (pytest.log)"
    elif passed == 0 and skipped > 0:
        verdict = "all skipped: no GPU seen by the tests"
    else:
        verdict = f"{passed} passed, {failed} failed, {errors} errors, {skipped} skipped"
    ok = rc == 0 and passed > 0 and failed == 0 and errors == 0
    rep.add("pytest -m cuda --timeout=60 (explicit files)", f"{verdict} (rc {rc})", "all passed, none skipped", ok,
            passed=passed, failed=failed, errors=errors, skipped=skipped, rc=rc)


class Sections:
    """Runs each measurement on a thread under a watchdog: past its limit (the section limit or
    what is left of the budget) every stack is dumped to stacks_<n>.txt, the row says so, and the
    run moves on to the next section."""

    def __init__(self, rep: Report, out: str, budget: float, limit: float) -> None:
        self.rep, self.out, self.limit = rep, out, limit
        self.deadline = time.monotonic() + budget
        self.n = 0

    def __call__(self, name: str):
        def wrap(fn):
            self.n += 1
            left = self.deadline - time.monotonic()
            if left < 5:
                self.rep.add(name, "not run: the measurement budget is spent", "", False)
                return fn
            limit = min(self.limit, left)
            box: dict = {}

            def target():
                try:
                    box["row"] = fn()
                except BaseException as exc:  # one failed section is a row; the others still run
                    box["error"] = exc
                    box["trace"] = traceback.format_exc()

            t0 = time.perf_counter()
            t = threading.Thread(target=target, name=f"gpu_check-{self.n}", daemon=True)
            t.start()
            t.join(limit)
            secs = time.perf_counter() - t0
            if t.is_alive():
                path = os.path.join(self.out, f"stacks_{self.n:02d}.txt")
                with open(path, "w") as f:
                    f.write(f"{name}: still running after {limit:.0f} s\n")
                    faulthandler.dump_traceback(f, all_threads=True)
                self.rep.add(name, f"TIMED OUT after {limit:.0f} s (stacks in {os.path.basename(path)})", "", False,
                             seconds=round(secs, 1))
            elif "error" in box:
                print(box["trace"], flush=True)
                exc = box["error"]
                self.rep.add(name, f"FAILED: {type(exc).__name__}: {str(exc)[:200]}", "", False, seconds=round(secs, 1))
            else:
                row = dict(box["row"])
                result, target_text, ok = row.pop("result"), row.pop("target", ""), row.pop("ok", None)
                self.rep.add(name, f"{result} [{secs:.1f} s]", target_text, ok, seconds=round(secs, 1), **row)
            return fn
        return wrap


def _is_sync(name: str) -> bool:
    return name.split("_v")[0] in SYNC_CALLS  # CUDA 12+ names carry a version suffix (..._v3020)


class SyncCounter:
    """Host synchronizations the CUDA runtime saw while fn() ran, on every thread (CUPTI's API
    records carry no thread id comparable with Python's). The profiler's own synchronize on exit
    is the baseline, measured by profiling an empty function; one deliberate synchronize must
    be counted, else the profiler saw nothing and a count of 0 would mean nothing."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.baseline = self.control = -1

    def raw(self, fn) -> int:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
        return sum(1 for e in prof.events() if _is_sync(e.name))

    def calibrate(self) -> dict:
        import torch

        if not self.cuda:
            return {"result": "n/a (CPU)", "target": "control counted"}
        self.raw(lambda: None)  # the profiler's first start costs more than the rest
        self.baseline = self.raw(lambda: None)
        self.control = self.raw(torch.cuda.synchronize) - self.baseline
        seen = self.control >= 1
        return {"result": (f"baseline {self.baseline} sync calls (empty function); one torch.cuda.synchronize() "
                           f"counted {self.control}" + ("" if seen else ": profiler saw nothing (CUPTI unavailable?)")),
                "target": "control counted >= 1", "ok": seen, "baseline": self.baseline, "control": self.control}

    @property
    def seen(self) -> bool:
        return self.control >= 1

    def count(self, fn) -> int | None:
        """Sync calls in fn() beyond the baseline; None when the profiler cannot see them."""
        if not self.cuda or not self.seen:
            fn()
            return None
        return self.raw(fn) - self.baseline


def sleep_cycles(dev, ms: float) -> int:
    """torch.cuda._sleep cycles that keep the GPU busy about `ms` milliseconds."""
    import torch

    if dev.type != "cuda":
        return 0
    torch.cuda._sleep(1 << 20)
    torch.cuda.synchronize(dev)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.cuda._sleep(1 << 22)
    e.record()
    e.synchronize()
    return int((1 << 22) / max(s.elapsed_time(e), 1e-3) * ms)


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


def tag_errors(x, k: int, bs: int, n: int):
    """Samples of batch k (sequential sampler) whose pixels are not all their tag: computed where
    x is, with no copy of the expected values from pageable memory (which could drain a stream)."""
    import torch

    want = (torch.arange(k * bs, min((k + 1) * bs, n), device=x.device) % 251).to(torch.uint8)
    return (x != want.view(-1, 1, 1, 1)).flatten(1).any(dim=1).sum()


class _Done:
    def query(self) -> bool:
        return True


def measure(section: Sections, dev, small: bool) -> None:
    import torch
    import torch.utils.data as tud
    from torch.utils.data import DataLoader, Dataset

    import fastcollate
    from fastcollate._bench import train_run as e2e
    from fastcollate.loader.ring import Ring, RingCollator
    from fastcollate.transforms import Normalize

    cuda = dev.type == "cuda"
    n_img, hw, steps = (32, 32, 6) if small else (256, 224, 40)
    workers = 2 if small else min(8, os.cpu_count() or 2)
    lw = dict(timeout=30) if workers else {}  # a hung worker raises instead of eating the lease
    MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    syncs = SyncCounter(cuda)
    backlog = sleep_cycles(dev, BACKLOG_MS)
    bs, n_tagged = 32, 32 * (6 if small else 24)

    def backlog_now(stream=None):
        if cuda:
            torch.cuda._sleep(backlog)

    def sync_all():
        if cuda:
            torch.cuda.synchronize(dev)

    @section("profiler: baseline and positive control for the sync counts")
    def _():
        return syncs.calibrate()

    @section("Normalize: kernel vs torch path (CPU, and CUDA with a tensor scale), bitwise")
    def _():
        if not cuda:
            return {"result": "n/a (CPU)"}
        out, good = [], True
        x = torch.randint(0, 256, (8, 3, 61, 57), dtype=torch.uint8, device=dev)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            n = Normalize(MEAN, STD, dtype=dtype, channels_last=True)
            k, bits = n.apply(x).cpu(), torch.int32 if dtype == torch.float32 else torch.int16
            same_cpu = torch.equal(k.view(bits), n._torch(x.cpu()).view(bits))
            same_gpu = torch.equal(k.view(bits), n._torch(x).cpu().view(bits))
            good = good and same_cpu and same_gpu
            out.append(f"{str(dtype)[6:]}: cpu {same_cpu}, cuda {same_gpu}")
        return {"result": "; ".join(out), "target": "all True", "ok": good}

    @section("H2D: prefetcher single copy / raw pinned copy_")
    def _():
        if not cuda:
            return {"result": "n/a (CPU)"}
        batch = [{"image": torch.randint(0, 256, (3, hw, hw), dtype=torch.uint8), "label": i} for i in range(n_img)]
        pinned_batch = fastcollate.Collator(pin_memory=True)(batch)
        nbytes = pinned_batch["image"].numel() + pinned_batch["label"].numel() * 8
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        for _ in range(5):
            dst.copy_(src, non_blocking=True)
        sync_all()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(50):
            dst.copy_(src, non_blocking=True)
        e.record()
        sync_all()
        raw = s.elapsed_time(e) / 50 / 1e3
        list(fastcollate.CudaPrefetcher([pinned_batch] * 5, device=dev, timeout=30))  # warm-up
        p = fastcollate.CudaPrefetcher([pinned_batch] * 60, device=dev, depth=2, timeout=30)
        list(p)
        sync_all()
        st = p.stats()
        ours = st["h2d_ms"] / 1e3 / max(1, st["batches"])
        share = raw / ours if ours > 0 else 0.0
        ours_gbps, raw_gbps = nbytes / max(ours, 1e-12) / 1e9, nbytes / raw / 1e9
        return {"result": f"{ours_gbps:.1f} / {raw_gbps:.1f} GB/s ({100 * share:.0f}%); "
                          f"single-copy {st['single_copy_batches']}/{st['batches']}",
                "target": ">= 90%, all single-copy", "ok": share >= 0.9 and st["single_copy_batches"] == st["batches"],
                "ours_gbps": ours_gbps, "raw_gbps": raw_gbps, "share": share}

    @section("failed cudaHostRegister leaves no CUDA error behind")
    def _():
        if not cuda:
            return {"result": "n/a (CPU)"}
        from fastcollate import _ext

        buf = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)  # already page-locked: register fails
        err = _ext._C.host_register(buf.data_ptr(), buf.numel())
        y = Normalize(MEAN, STD).apply(torch.zeros(1, 3, 4, 4, dtype=torch.uint8, device=dev))  # checks its launch
        z = (torch.ones(4, device=dev) * 2).sum()
        fine = bool(y.isfinite().all()) and z.item() == 8
        return {"result": f"register said {err[:60]!r}; next launches ok: {fine}", "target": "error text, ok True",
                "ok": bool(err) and fine}

    def tagged_loader(fenced: bool = True, persistent: bool = True, n: int = n_tagged):
        if fenced:
            return fastcollate.DataLoader(Tagged(n), batch_size=bs, num_workers=2, pin_memory=cuda,
                                          persistent_workers=persistent, **lw)
        # the control: page-locked slots whose fences are complete at once, i.e. no fences
        ring = Ring(6, 1 << 20, pin=cuda, fence=lambda stream=None: _Done())
        return tud.DataLoader(Tagged(n), batch_size=bs, num_workers=2, persistent_workers=persistent,
                              collate_fn=RingCollator(fastcollate.collate, ring), **lw)

    def plain_loop(loader, epochs: int = 2) -> tuple[int, int]:
        bad, n = torch.zeros((), dtype=torch.long, device=dev), 0
        for _epoch in range(epochs):
            for k, b in enumerate(loader):
                backlog_now()  # the copy below waits behind it: the slot is read ~BACKLOG_MS later
                x = b["image"].to(dev, non_blocking=True)
                bad += tag_errors(x, k, bs, n_tagged)
                n += 1
        sync_all()
        return int(bad.item()), n

    def corruption_row(fenced_bad: int, n: int, control_bad: int | None, st: dict, extra: str = "") -> dict:
        blind = control_bad is not None and control_bad == 0
        ok = fenced_bad == 0 and not blind
        text = f"{fenced_bad} of {n} corrupted; control {'n/a (CPU)' if control_bad is None else control_bad}"
        if blind:
            text += ": the control shows no corruption, so the check is blind"
        text += (f"; ring hits {st.get('ring_hits')}, fallbacks {st.get('ring_fallbacks')}, "
                 f"pinned {st.get('ring_pinned')}")
        return {"result": text + extra, "target": "0 corrupted, control > 0", "ok": ok, "corrupted": fenced_bad,
                "batches": n, "control_corrupted": -1 if control_bad is None else control_bad,
                "ring_hits": st.get("ring_hits", -1), "ring_fallbacks": st.get("ring_fallbacks", -1)}

    @section(f"ring + pin_memory, plain .to(non_blocking) behind a {BACKLOG_MS:.0f} ms GPU backlog: corruption "
             "(fences off: control)")
    def _():
        loader = tagged_loader()
        bad, n = plain_loop(loader)
        st = loader.stats()
        control = plain_loop(tagged_loader(fenced=False))[0] if cuda else None
        return corruption_row(bad, n, control, st)

    @section("side-stream copy + fastcollate.release_after, behind a GPU backlog: corruption (without it: control)")
    def _():
        def side_loop(loader, release: bool) -> tuple[int, int]:
            s = torch.cuda.Stream(device=dev) if cuda else None
            bad, n = torch.zeros((), dtype=torch.long, device=dev), 0
            for _epoch in range(2):
                for k, b in enumerate(loader):
                    if cuda:
                        with torch.cuda.stream(s):
                            backlog_now()
                            x = b["image"].to(dev, non_blocking=True)
                            bad += tag_errors(x, k, bs, n_tagged)
                            if release:
                                fastcollate.release_after(b, s)
                    else:
                        bad += tag_errors(b["image"], k, bs, n_tagged)
                        fastcollate.release_after(b, None)
                    n += 1
                    del b  # on the current stream, which has no backlog: its own fence completes at once
            sync_all()
            return int(bad.item()), n

        loader = tagged_loader()
        bad, n = side_loop(loader, True)
        st = loader.stats()
        control = side_loop(tagged_loader(), False)[0] if cuda else None
        return corruption_row(bad, n, control, st)

    @section("ring + pin_memory through CudaPrefetcher, backlog on the copy stream: corruption, sync calls")
    def _():
        loader = tagged_loader()
        bad = torch.zeros((), dtype=torch.long, device=dev)
        counted = [0]

        def slow_transform(b):  # runs on the side stream: the next copies queue behind it
            backlog_now()
            return b

        def consume():
            pf = fastcollate.CudaPrefetcher(loader, device=dev, depth=3, transform=slow_transform, timeout=30)
            for k, b in enumerate(pf):
                bad.add_(tag_errors(b["image"], k, bs, n_tagged))
                counted[0] += 1

        consume()  # warm-up epoch: fork, ring, first faults and registrations
        n = syncs.count(consume)
        sync_all()
        st = loader.stats()
        row = corruption_row(int(bad.item()), counted[0], None, st)
        seen = "profiler saw nothing" if n is None and cuda else ("n/a (CPU)" if n is None else str(n))
        row["result"] += f"; sync calls in the measured epoch {seen} ({', '.join(SYNC_CALLS)})"
        row.update(target="0 corrupted; 0 sync calls", ok=row["corrupted"] == 0 and (n is None or n == 0),
                   sync_calls=-1 if n is None else n)
        return row

    @section("2 epochs, non-persistent pin_memory ring loader (workers forked after the slots are page-locked)")
    def _():
        loader = tagged_loader(persistent=False)
        bad, n = torch.zeros((), dtype=torch.long, device=dev), 0
        for _epoch in range(2):
            for k, b in enumerate(loader):
                bad += tag_errors(b["image"].to(dev, non_blocking=True), k, bs, n_tagged)
                n += 1
        sync_all()
        st = loader.stats()
        bad_n = int(bad.item())
        want = 2 * (-(-n_tagged // bs))
        pinned_ok = st.get("ring_pinned") is True or not cuda
        return {"result": f"{bad_n} of {n} wrong; ring hits {st.get('ring_hits')}, pinned {st.get('ring_pinned')} "
                          f"({st.get('ring_pinned_bytes', 0) >> 20} MiB)",
                "target": f"0 wrong, {want} batches, ring hits > 0, pinned",
                "ok": bad_n == 0 and n == want and st.get("ring_hits", 0) > 0 and pinned_ok,
                "wrong": bad_n, "batches": n, "ring_hits": st.get("ring_hits", -1)}

    class Images(Dataset):
        def __init__(self, n):
            self.data = torch.randint(0, 256, (64, 3, hw, hw), dtype=torch.uint8)
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return {"image": self.data[i % 64], "label": i % 10}

    ds = Images(steps * n_img)

    @section("step: fastcollate.DataLoader + CudaPrefetcher vs data already on the device")
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
            sync_all()
            t, n = time.perf_counter(), 0
            for b in make():
                step(*prep(b))
                n += 1
            sync_all()
            return (time.perf_counter() - t) / max(1, n)

        on_dev = norm({"image": ds.data[:1].repeat(n_img, 1, 1, 1).to(dev),
                       "label": torch.zeros(n_img, dtype=torch.long, device=dev)})
        floor = timed(lambda: [on_dev] * steps, lambda b: (b["image"], b["label"]))
        plain_loader = DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=cuda, persistent_workers=True,
                                  **lw)
        plain = timed(lambda: plain_loader, lambda b: (norm.apply(b["image"].to(dev, non_blocking=True)),
                                                      b["label"].to(dev, non_blocking=True)))
        ours_loader = fastcollate.DataLoader(ds, batch_size=n_img, num_workers=workers, persistent_workers=True, **lw)
        pref = timed(lambda: fastcollate.CudaPrefetcher(ours_loader, device=dev, transform=norm, timeout=30),
                     lambda b: (b["image"], b["label"]))
        extra, figs = "", {}
        try:
            from timm.data.loader import PrefetchLoader

            timm_loader = DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=True, persistent_workers=True,
                                     collate_fn=_stack_pairs, **lw)
            tl = PrefetchLoader(timm_loader, mean=MEAN, std=STD, channels=3, device=dev)
            tt = timed(lambda: tl, lambda b: (b[0].to(torch.bfloat16, memory_format=torch.channels_last), b[1]))
            extra, figs = f"; timm PrefetchLoader {tt * 1e3:.2f} ms ({tt / floor:.3f}x)", {"timm_ms": tt * 1e3}
        except Exception as exc:  # timm missing (CPU dry run) or its API moved: say so
            extra = f"; timm n/a ({type(exc).__name__})"
        ratio = pref / floor
        return {"result": f"{pref * 1e3:.2f} ms ({ratio:.3f}x floor {floor * 1e3:.2f} ms); DataLoader(pin_memory) + "
                          f".to() {plain * 1e3:.2f} ms ({plain / floor:.3f}x){extra}",
                "target": "<= 1.03x floor", "ok": ratio <= 1.03 if cuda else None,
                "ours_ms": pref * 1e3, "floor_ms": floor * 1e3, "plain_ms": plain * 1e3, "ratio": ratio, **figs}

    @section("data-bound samples/s: torch pin_memory / ring + prefetcher (warm loaders)")
    def _():
        def rate(loader, to_dev):
            for b in loader:  # warm-up epoch (persistent workers stay)
                pass
            t, n = time.perf_counter(), 0
            for b in loader:
                x = b["image"].to(dev, non_blocking=True) if to_dev else b["image"]
                n += x.shape[0]
            sync_all()
            return n / (time.perf_counter() - t)

        torch_rate = rate(DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=cuda, persistent_workers=True,
                                     **lw), True)
        ring = fastcollate.DataLoader(ds, batch_size=n_img, num_workers=workers, pin_memory=cuda, persistent_workers=True,
                                      **lw)
        ring_rate = rate(fastcollate.CudaPrefetcher(ring, device=dev, timeout=30), False)
        ratio = ring_rate / torch_rate
        return {"result": f"{torch_rate:.0f} / {ring_rate:.0f} ({ratio:.2f}x); "
                          f"ring pinned {ring.stats().get('ring_pinned')}",
                "target": ">= 1.5x", "ok": ratio >= 1.5 if cuda else None, "torch_rate": torch_rate,
                "ours_rate": ring_rate, "ratio": ratio}

    @section("TokenWindows via the ring (pin_memory) + CudaPrefetcher: device batches vs default_collate; samples/s vs "
             "map-style + pin_memory + .to() of input and labels")
    def _():
        import numpy as np
        from torch.utils.data import default_collate

        from fastcollate._bench.storage import NaiveWindows

        tokens = np.random.default_rng(0).integers(0, 50257, (1 << 16) if small else (1 << 24)).astype(np.uint16)
        seq, tbs = (64, 8) if small else (1024, 64)
        ds_w = fastcollate.TokenWindows(tokens, seq)
        ring = fastcollate.DataLoader(ds_w, batch_size=tbs, num_workers=workers, pin_memory=cuda,
                                      persistent_workers=True, **lw)
        bad = n = 0
        for i, b in enumerate(fastcollate.CudaPrefetcher(ring, device=dev, timeout=30)):
            want = default_collate([ds_w[j] for j in range(i * tbs, min((i + 1) * tbs, len(ds_w)))])
            bad += not all(b[k].device.type == dev.type and torch.equal(b[k].cpu(), want[k]) for k in want)
            n += 1

        def rate(loader, theirs):
            t, count = time.perf_counter(), 0
            for b in loader:
                if theirs:  # the same work as ours: both tensors reach the device
                    x = b[0].to(dev, non_blocking=True)
                    b[1].to(dev, non_blocking=True)
                else:
                    x = b["input_ids"]
                count += x.shape[0]
            sync_all()
            return count / (time.perf_counter() - t)

        theirs = DataLoader(NaiveWindows(tokens, seq), batch_size=tbs, num_workers=workers, pin_memory=cuda,
                            persistent_workers=True, **lw)
        rate(theirs, True)  # warm-up epochs (persistent workers stay)
        pf = fastcollate.CudaPrefetcher(ring, device=dev, timeout=30)
        rate(pf, False)
        theirs_rate, ours_rate = rate(theirs, True), rate(pf, False)
        ratio = ours_rate / theirs_rate
        return {"result": f"{bad} of {n} batches differ; {ours_rate:.0f} / {theirs_rate:.0f} samples/s ({ratio:.2f}x); "
                          f"ring pinned {ring.stats().get('ring_pinned')}",
                "target": "0 differ; >= 2x", "ok": bad == 0 and (ratio >= 2 if cuda else True), "differ": bad,
                "batches": n, "ours_rate": ours_rate, "theirs_rate": theirs_rate, "ratio": ratio}

    @section("pinned allocations after warm-up (caching host allocator)")
    def _():
        if not cuda:
            return {"result": "n/a (CPU)", "target": "0"}
        loader = fastcollate.DataLoader(Tagged(64 * 20), batch_size=64, num_workers=2, **lw)
        p = fastcollate.CudaPrefetcher(loader, device=dev, timeout=30)
        list(p)
        before = torch.cuda.host_memory_stats().get("num_host_alloc")
        list(p)
        after = torch.cuda.host_memory_stats().get("num_host_alloc")
        grew = None if before is None else after - before
        return {"result": f"{grew} (pinned_bytes {p.stats()['pinned_bytes']})", "target": "0", "ok": grew == 0,
                "host_allocs": -1 if grew is None else grew}

    for dtype_name in ("bfloat16", "float16") if cuda else ("auto",):
        @section(f"train_one_epoch {dtype_name}, fused AdamW: host syncs (debug-mode warnings; profiler, all threads)")
        def _():
            dtype = getattr(torch, dtype_name, "auto")
            net = e2e.small_convnet().to(dev)
            adam = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=cuda or None)
            loader = fastcollate.CudaPrefetcher(fastcollate.DataLoader(e2e.SyntheticImages(64 * steps), batch_size=64,
                                                                       num_workers=workers, **lw), device=dev,
                                                timeout=30)
            fastcollate.train_one_epoch(net, loader, adam, amp_dtype=dtype, forward=e2e._forward)  # warm-up
            box = {}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                try:
                    n = syncs.count(lambda: box.update(stats=fastcollate.train_one_epoch(
                        net, loader, adam, amp_dtype=dtype, forward=e2e._forward)))
                finally:
                    if cuda:
                        torch.cuda.set_sync_debug_mode(0)
            stats = box["stats"]
            n_warn = sum("synchroniz" in str(w.message) for w in caught)
            seen = "profiler saw nothing" if n is None and cuda else ("n/a" if n is None else str(n))
            return {"result": f"{n_warn} warnings, {seen} sync calls in {stats.steps} steps (loss {stats.loss:.3f}, "
                              f"skipped {stats.skipped_steps})",
                    "target": "only the end-of-epoch reads (<= 4)", "ok": (n is None or n <= 4) and stats.steps > 0,
                    "warnings": n_warn, "sync_calls": -1 if n is None else n, "steps": stats.steps}

    class Slow(Images):
        def __getitem__(self, i):
            time.sleep(0.01)
            return super().__getitem__(i)

    def verdict(dataset, model_width) -> tuple[str, int]:
        net = torch.nn.Sequential(torch.nn.Conv2d(3, model_width, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.Conv2d(model_width, model_width, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                  torch.nn.Linear(model_width, 10)).to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        pf = fastcollate.CudaPrefetcher(fastcollate.DataLoader(dataset, batch_size=16, num_workers=1,
                                                               persistent_workers=True, **lw), device=dev, timeout=30)
        fastcollate.train_one_epoch(net, pf, opt, forward=e2e._forward)  # warm-up: worker start, cudnn, allocator
        mon = fastcollate.StallMonitor()
        mon.attach(pf)
        st = fastcollate.train_one_epoch(net, pf, opt, monitor=mon, forward=e2e._forward)
        return mon.report()["verdict"], st.steps

    @section("StallMonitor: slow dataset (warm loader, >= 30 steps)")
    def _():
        v, n = verdict(Slow(16 * 30), 8)
        # judged on a GPU only, like the next row: on a busy CPU (the dry run beside other jobs) the
        # CPU "model" can outlast 160 ms of sleep a batch, and the verdict is rightly compute-bound
        return {"result": f"{v} over {n} steps", "target": "data-bound",
                "ok": (v == "data-bound" if cuda else None) if n >= 30 else False, "steps": n}

    @section("StallMonitor: heavy model (warm loader, >= 30 steps)")
    def _():
        v, n = verdict(Images(16 * 30), 16 if small else 1024)  # the dry run's CPU judges nothing: small
        return {"result": f"{v} over {n} steps", "target": "compute-bound",
                "ok": (v == "compute-bound" if cuda else None) if n >= 30 else False, "steps": n}


def _stack_pairs(b):
    import torch

    return torch.stack([s["image"] for s in b]), torch.tensor([s["label"] for s in b])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, no build, benchmarks/RESULTS.md untouched")
    ap.add_argument("--out", default=None, help="where every file goes (default $OUT; a temporary folder in a dry run)")
    ap.add_argument("--budget", type=float, default=360, help="seconds for all the measurements together")
    ap.add_argument("--section-timeout", type=float, default=90, help="seconds one measurement may take")
    ap.add_argument("--build-timeout", type=float, default=300)
    args = ap.parse_args()
    out = args.out or os.environ.get("OUT") or (tempfile.mkdtemp(prefix="gpu_check_") if args.dry_run
                                                 else os.path.join(ROOT, "benchmarks", "gpu_check_out"))
    os.makedirs(out, exist_ok=True)
    sys.stdout = Tee(sys.stdout, os.path.join(out, "check.log"))  # type: ignore[assignment]
    sys.stderr = Tee(sys.stderr, os.path.join(out, "check.log"))  # type: ignore[assignment]
    # the last resort, past every other bound: every stack into $OUT, then exit
    backstop = open(os.path.join(out, "stacks_backstop.txt"), "w")
    faulthandler.dump_traceback_later(args.budget + args.build_timeout + 420, exit=True, file=backstop)
    import torch

    dirs = [out] + ([] if args.dry_run else [os.path.join(ROOT, "benchmarks")])
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.dry_run else "none (CPU dry run)"
    header = (f"# GPU check\n\n{datetime.date.today()}, {gpu}, torch {torch.__version__} (CUDA {torch.version.cuda}); "
              f"command: `python benchmarks/gpu_check.py{' --dry-run' if args.dry_run else ''}`\n\n")
    rep = Report(dirs, header)
    print(f"gpu_check: writing to {out}", flush=True)
    preflight(rep)
    if not args.dry_run and not build(rep, out, args.build_timeout):
        print("gpu_check: the CUDA extension did not build -- stopping here (no silent Python fallback)", flush=True)
        sys.exit(2)
    cuda_tests(rep, out, args.dry_run)
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    measure(Sections(rep, out, args.budget, args.section_timeout), dev, small=args.dry_run)
    print(rep.table(), flush=True)
    faulthandler.cancel_dump_traceback_later()
    backstop.close()
    if os.path.getsize(backstop.name) == 0:
        os.unlink(backstop.name)
    failed = rep.failed()
    if failed:
        print(f"gpu_check: {len(failed)} row(s) failed: {failed}", flush=True)
        sys.stdout.flush()
        os._exit(1)  # a timed-out section's thread may still run: do not wait for it
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
