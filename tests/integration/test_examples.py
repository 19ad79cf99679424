"""The framework examples run as a user runs them, and check their own claims (exit 1 if not)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("script,needs", [("hf_trainer.py", "transformers"), ("lightning_fit.py", "pytorch_lightning")])
def test_example_runs(script, needs):
    pytest.importorskip(needs)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--workers", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "identical" in r.stdout and "True" in r.stdout
