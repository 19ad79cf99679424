"""benchmarks/gpu_check.py is the one prepared run for a GPU session: its logic must keep
working, so CI runs it on the CPU with tiny sizes (--dry-run: no build, RESULTS.md untouched)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_check_dry_run():
    results = os.path.join(ROOT, "benchmarks", "RESULTS.md")
    before = open(results).read()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--dry-run"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    table = r.stdout
    assert "| corrupted batches" in table and "| 0 | 0 |" in table
    # the verdicts themselves are tested in test_monitor_tune.py; here: every row is produced
    for row in ("step: fastcollate.DataLoader + CudaPrefetcher", "data-bound samples/s",
                "train_one_epoch bfloat16", "StallMonitor: slow dataset", "StallMonitor: heavy model"):
        assert row in table, row
    assert open(results).read() == before
