"""fastcollate.DataLoader where torch's DataLoader works: iterated in a process other than the one
that made it (a forked child, a spawned or forkserver Process it is passed to, mp.spawn), no
attribute torch's loader lacks that a framework would take for a protocol (state_dict), and
batches held by the thousand without running out of file descriptors."""
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.utils.data as tud

import fastcollate
import loader_classes as lc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOADER = fastcollate.DataLoader(lc.data(), batch_size=8, num_workers=2)  # module level: made at import


def _sums(loader):
    """Each batch's content, as plain Python: what a child sends back."""
    return [(b["x"].sum().item(), b["y"].tolist()) for b in loader]


def _want():
    return _sums(tud.DataLoader(lc.data(), batch_size=8))


def _child(loader, queue):
    try:
        queue.put(("ok", _sums(loader), loader.stats()))
    except BaseException as exc:  # pragma: no cover - reported to the parent
        queue.put(("error", f"{type(exc).__name__}: {exc}", None))


def _spawned(rank, loader, path):
    torch.save(_sums(loader), path)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_loader_passed_to_another_process_yields_its_batches(method):
    loader = fastcollate.DataLoader(lc.data(), batch_size=8, num_workers=2)
    next(iter(loader))  # used in the parent first: its ring is the parent's
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    p = ctx.Process(target=_child, args=(loader, queue))
    p.start()
    status, sums, stats = queue.get(timeout=120)
    p.join(60)
    assert status == "ok", sums
    assert sums == _want()
    assert stats["ring"] and stats["ring_hits"] == 5  # a ring of the child's own
    assert _sums(loader) == _want()  # the parent's still works


def test_a_module_level_loader_in_a_forked_child():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = 0
        try:
            ok = int(_sums(LOADER) == _want())
        finally:
            os.write(w, str(ok).encode())
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 8) == b"1"


def test_mp_spawn_with_a_loader(tmp_path):
    loader = fastcollate.DataLoader(lc.data(), batch_size=8, num_workers=2)
    path = str(tmp_path / "sums.pt")
    torch.multiprocessing.spawn(_spawned, args=(loader, path), nprocs=1, join=True)
    assert torch.load(path) == _want()


def test_no_attribute_torchs_loader_lacks():
    # hasattr-based protocols (Lightning's checkpointing of stateful loaders) must see torch's loader
    for name in ("state_dict", "load_state_dict"):
        assert hasattr(fastcollate.DataLoader, name) == hasattr(tud.DataLoader, name)
    extra = {n for n in dir(fastcollate.DataLoader) if not n.startswith("_")} - set(dir(tud.DataLoader))
    assert extra == {"stats", "ring_stats", "auto_log"}, extra


HOLD = r"""
import resource, sys, torch, fastcollate
limit, n, width = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

class DS(torch.utils.data.Dataset):
    def __len__(self):
        return n
    def __getitem__(self, i):
        return {"x": torch.full((width,), i, dtype=torch.int32), "y": i}

loader = fastcollate.DataLoader(DS(), batch_size=1, num_workers=2, prefetch_factor=4)
held = list(loader)
assert len(held) == n
for i, b in enumerate(held):
    assert b["y"].item() == i and int(b["x"][0, 0]) == i and int(b["x"][0, -1]) == i, i
stats = loader.stats()
assert stats["ring_fallbacks"] >= n - stats["ring_slots"], stats   # most of them outside the ring
print("held", len(held), "fds", len(__import__("os").listdir("/proc/self/fd")), stats["ring_fallbacks"])
"""


def _hold(n, width=4, limit=1024, env=None):
    out = subprocess.run([sys.executable, "-c", HOLD, str(limit), str(n), str(width)], cwd=ROOT, capture_output=True,
                         text=True, timeout=3600, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    _, count, _, fds, fallbacks = out.stdout.split()[:5]
    assert int(count) == n and int(fds) < 64 and int(fallbacks) > n // 2, out.stdout


# 100,000 small batches read into the main process (each ~5 ms of a 2-core machine's time);
# FASTCOLLATE_HELD_BATCHES sets another count. 141 s beside 4 busy processes on 2 cores, and a
# busier machine stretches it further: the subprocess's 3600 s is a deadline only a hang reaches.
@pytest.mark.parametrize("n", [int(os.environ.get("FASTCOLLATE_HELD_BATCHES", 100_000))])
def test_held_batches_keep_no_file_descriptors(n):
    _hold(n, limit=1024)


def test_held_mapped_batches_keep_no_file_descriptors():
    # arenas of 4 MB and more are mapped, not read: the mapping keeps the pages, not the descriptor.
    # FASTCOLLATE_MAP_BYTES=0 maps every one, so that small batches take that path too, by the
    # thousand, under a limit far below their count
    _hold(3000, width=1024, limit=256, env={"FASTCOLLATE_MAP_BYTES": "0"})
    _hold(40, width=(5 << 20) // 4, limit=32)  # 5 MB batches: mapped at the default threshold


def _reader(queue, results):
    batch = queue.get()
    results.put((batch["x"].sum().item(), batch["y"].tolist()))


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_held_batch_sent_on_to_another_process(method, mapped, monkeypatch):
    from fastcollate.loader import wire

    monkeypatch.setattr(wire, "MAP_MIN_BYTES", 0 if mapped else 1 << 40)
    # 40 batches held, a ring of 2 x 1 + 5 slots: the first batches are ring slots, the last are
    # arenas received outside the ring (read into this process's memory, or mapped)
    loader = fastcollate.DataLoader(lc.data(320), batch_size=8, num_workers=2, prefetch_factor=1)
    held = list(loader)
    stats = loader.stats()
    assert stats["ring_fallbacks"] >= len(held) - stats["ring_slots"] > 0, stats
    ctx = torch.multiprocessing.get_context(method)
    for batch in (held[0], held[-1]):
        q, results = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=_reader, args=(q, results))
        p.start()
        q.put(batch)
        assert results.get(timeout=120) == (batch["x"].sum().item(), batch["y"].tolist())
        p.join(60)
