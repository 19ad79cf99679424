"""benchmarks/images.py runs end to end on a small folder, and its Pillow-SIMD contender runs in a
child whose PIL comes from the folder it is given, or refuses to run: a table that says
"Pillow-SIMD" must not have measured the Pillow the tests use."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_bench(tmp_path, site):
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "images.py"), "--photos", "imagenet",
                           "--n", "32", "--batch", "8", "--rounds", "1", "--no-peers", "--pillow-simd", str(site)],
                          capture_output=True, text=True, env=env, timeout=600)


def test_the_benchmark_measures_every_contender_and_the_pillow_simd_child_imports_the_folder_given(tmp_path):
    PIL = pytest.importorskip("PIL")
    pytest.importorskip("simplejpeg")
    site = tmp_path / "site"
    site.mkdir()
    os.symlink(os.path.dirname(PIL.__file__), site / "PIL")  # stands in for a Pillow-SIMD install
    r = run_bench(tmp_path, site)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and "images/s" not in line]
    names = [row.split(" | ")[0][2:] for row in rows]
    assert names[0] == "torch + Pillow v1, 2 workers"
    assert f"torch + Pillow-SIMD {PIL.__version__} v1, 2 workers" in names
    assert {"fastcollate exact, 2 threads", "fastcollate fast, 2 threads", "Python prototype, 2 threads"} <= set(names)
    for row in rows:
        assert float(row.split(" | ")[1]) > 0, row
    assert "entropy-decoding down to each box's last row alone" in r.stdout
    assert "- fastcollate exact, 2 threads, per round: " in r.stdout and "x Python prototype (" in r.stdout
    assert f"x torch + Pillow-SIMD {PIL.__version__} v1 (" in r.stdout  # the fastest peer: the only one here


def test_the_pillow_simd_child_refuses_a_folder_without_pil(tmp_path):
    pytest.importorskip("PIL")
    site = tmp_path / "empty"
    site.mkdir()
    r = run_bench(tmp_path, site)
    assert r.returncode != 0 and "not the one in" in r.stderr, r.stderr[-3000:]
