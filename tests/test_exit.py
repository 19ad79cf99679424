"""The interpreter's exit with threads inside the compiled engine: no abort ("terminate called
without an active exception", exit code 134), no hang -- the engine closes to other threads at
exit and lets those inside finish and park (csrc/python/nogil.h)."""
import os
import subprocess
import sys

import pytest

import fastcollate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(fastcollate.backend() != "cpp", reason="the compiled engine")

# The daemon threads hand every batch to the main thread, which frees it: a daemon thread that
# frees any torch tensor while Python finalizes can abort the process by itself -- torch releases
# the GIL in every tensor's dealloc (THPVariable_clear), and CPython < 3.14 ends a thread that takes
# it back then with pthread_exit, inside that noexcept scope (pytorch/pytorch#38228, open since
# 2020; its repro is `a + a` in a daemon thread). A core dump of the 1-in-~370 abort this test saw
# beside a CPU load had exactly that stack, with no frame of fastcollate's. What is tested here is
# the engine's own exit, so the daemons free nothing.
DAEMON = r"""
import queue, sys, threading, time, torch, fastcollate
batch = [torch.ones(1 << 16) for _ in range(64)]   # 16 MB a batch: most of a call is the GIL-free copy
started = threading.Event()
made = queue.SimpleQueue()

def loop():
    while True:
        made.put(fastcollate.collate(batch))
        started.set()

for _ in range(2):
    threading.Thread(target=loop, daemon=True).start()
started.wait()
deadline = time.perf_counter() + float(sys.argv[1])
while True:
    try:  # the main thread frees what the daemons made
        made.get_nowait()
    except queue.Empty:
        pass
    if time.perf_counter() >= deadline:
        break
print("main done")
"""

# an atexit hook registered before fastcollate's runs after it (last in, first out): the thread
# that exits may still use the engine, and must not be parked
LATE = r"""
import atexit, torch
def late():
    out = fastcollate.collate([torch.ones(1 << 16) for _ in range(64)])
    print("late hook", int(out.sum()))
atexit.register(late)
import fastcollate
"""


@pytest.mark.parametrize("delay", ["0.0", "0.003", "0.02", "0.05"])
def test_exit_while_daemon_threads_collate(delay):
    # before the gate, 20 of 20 such exits aborted with SIGABRT after "main done"
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", DAEMON, delay], capture_output=True, text=True, timeout=120,
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
        assert out.returncode == 0 and "main done" in out.stdout, (out.returncode, out.stderr[-2000:])
        assert "terminate called" not in out.stderr


def test_the_exiting_thread_still_uses_the_engine_in_a_late_atexit_hook():
    out = subprocess.run([sys.executable, "-c", LATE], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0 and f"late hook {64 << 16}" in out.stdout, out.stderr[-2000:]
