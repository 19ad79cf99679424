"""benchmarks/gpu_check.py is the one prepared run for a GPU session: its logic must keep
working, so CI runs it on the CPU with tiny sizes (--dry-run: no build, benchmarks/ untouched)
and checks that every row is produced, green, and that the logs and results land in --out."""
import json
import os
import subprocess
import sys

import pytest

from helpers import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def test_gpu_check_dry_run(tmp_path):
    results = os.path.join(ROOT, "benchmarks", "RESULTS.md")
    before = open(results).read()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OUT", None)
    # the limits are a GPU session's (a 90 s section, a 360 s budget); on a busy CPU the dry run
    # took 129 s and a section 62 s beside 4 busy processes on 2 cores, so it gets limits only a
    # hang reaches: 600 s a section, 1200 s in all. Its rows judge no speed on the CPU.
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--dry-run",
                        "--out", str(tmp_path), "--budget", "1200", "--section-timeout", "600"],
                       capture_output=True, text=True, env=env, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("ROW | ")]
    assert rows[0].startswith("ROW | preflight | torch ")
    for name in ("pytest -m cuda", "profiler: baseline", "plain .to(non_blocking)", "release_after",
                 "through CudaPrefetcher", "non-persistent pin_memory", "step: fastcollate.DataLoader",
                 "data-bound samples/s", "TokenWindows via the ring", "train_one_epoch auto",
                 "StallMonitor: slow dataset", "StallMonitor: heavy model"):
        assert sum(name in row for row in rows) == 1, name
    assert not any(row.endswith("| FAIL") for row in rows), [row for row in rows if row.endswith("| FAIL")]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["rows"]) == len(rows) and (tmp_path / "RESULTS.md").read_text().count("\n| ") == len(rows) + 1
    by_name = {row["check"]: row for row in saved["rows"]}
    corruption = [row for name, row in by_name.items() if "corruption" in name]
    assert len(corruption) == 3 and all(row["figures"]["corrupted"] == 0 and row["figures"]["batches"] > 0
                                        for row in corruption)
    assert all(isinstance(v, (int, float)) for row in saved["rows"] for v in row["figures"].values())
    sections = saved["rows"][2:]  # after preflight and pytest: the watched sections, each timed
    assert sections and all("seconds" in row["figures"] for row in sections)
    tests = next(row for name, row in by_name.items() if name.startswith("pytest -m cuda"))
    assert tests["ok"] is True and tests["figures"]["selected"] >= 1
    for log in ("check.log", "pytest.log"):
        assert (tmp_path / log).stat().st_size > 0, log
    assert "ROW | StallMonitor: heavy model" in (tmp_path / "check.log").read_text()
    assert not list(tmp_path.glob("stacks_*.txt"))  # no section ran past its limit
    assert open(results).read() == before


def test_a_section_past_its_limit_dumps_stacks_and_the_run_moves_on(tmp_path):
    import threading

    import gpu_check

    rep = gpu_check.Report([str(tmp_path)], "# t\n\n")
    section = gpu_check.Sections(rep, str(tmp_path), budget=30, limit=0.5)
    gate = threading.Event()

    @section("hangs")
    def _():
        gate.wait(30)
        return {"result": "never"}

    @section("next")
    def _():
        return {"result": "measured", "ok": True, "value": 3}

    gate.set()
    assert [(r["check"], r["ok"]) for r in rep.rows] == [("hangs", False), ("next", True)]
    assert "TIMED OUT" in rep.rows[0]["result"] and rep.rows[1]["figures"]["value"] == 3
    stacks = (tmp_path / "stacks_01.txt").read_text()
    assert "hangs: still running" in stacks and "in wait" in stacks


@pytest.mark.parametrize("text, want", [
    ("3 passed, 2 skipped in 1.0s", {"passed": 3, "skipped": 2}),
    ("12 skipped, 400 deselected in 3.2s", {"skipped": 12, "deselected": 400}),
    ("1 failed, 4 passed, 1 error in 9s", {"failed": 1, "passed": 4, "error": 1}),
    ("5/400 tests collected (395 deselected) in 1.1s", {"collected": 5, "deselected": 395}),
])
def test_pytest_summaries_are_read_right(text, want):
    import gpu_check

    got = gpu_check.summary_counts(text)
    assert {k: got[k] for k in want} == want


def test_all_skipped_is_a_failure(tmp_path, monkeypatch):
    import gpu_check

    monkeypatch.setattr(gpu_check, "run_logged", lambda *a, **k: (0, "20 skipped, 300 deselected in 2.0s"))
    rep = gpu_check.Report([str(tmp_path)], "")
    gpu_check.cuda_tests(rep, str(tmp_path), dry=False)
    assert rep.rows[0]["ok"] is False and "all skipped" in rep.rows[0]["result"]


def test_a_build_that_runs_past_its_timeout_is_killed_with_its_children(tmp_path):
    import gpu_check

    log = str(tmp_path / "build.log")
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('child', p.pid, flush=True); time.sleep(60)")
    # the timeout under test: 3 s, against the ~0.1 s the child takes to start its own child and
    # print (30x; beside 4 busy processes on 2 cores, well under a second)
    rc, tail = gpu_check.run_logged([sys.executable, "-c", code], 3, log)
    assert rc == 124 and "killed the process group" in tail
    child = int(tail.split("child ")[1].split()[0])

    def gone():  # the orphan is reaped by init once killed
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        return False

    assert wait_until(gone, poll=0.05), f"the build's child {child} outlived the kill"
