"""benchmarks/gpu_check.py is the one prepared run for a GPU session: its logic must keep
working, so CI runs it on the CPU with tiny sizes (--dry-run: no build, benchmarks/ untouched)
and checks that every row is produced and that the results land in $OUT as they are measured."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_check_dry_run(tmp_path):
    results = os.path.join(ROOT, "benchmarks", "RESULTS.md")
    before = open(results).read()
    env = dict(os.environ, OUT=str(tmp_path), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--dry-run", "--budget", "280"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("ROW | ")]
    assert rows[0].startswith("ROW | preflight | torch ")
    for name in ("plain loop .to(non_blocking)", "through CudaPrefetcher", "step: fastcollate.DataLoader",
                 "data-bound samples/s", "TokenWindows via the ring", "train_one_epoch auto", "StallMonitor: slow dataset",
                 "StallMonitor: heavy model"):
        assert any(name in row for row in rows), name
    assert any("corrupted batches" in row and "| 0 of" in row for row in rows)
    assert any("TokenWindows via the ring" in row and "| 0 of" in row for row in rows)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["rows"]) == len(rows) and (tmp_path / "RESULTS.md").read_text().count("\n| ") == len(rows) + 1
    assert open(results).read() == before
