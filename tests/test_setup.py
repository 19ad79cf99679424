"""setup.py's build decision, as a CUDA build of torch on a machine with nvcc and no GPU sees it."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import runpy, sys, torch
import torch.utils.cpp_extension as ce
torch.version.cuda = "13.0"                  # a CUDA build of torch ...
torch.cuda.is_available = lambda: False      # ... with no GPU visible
ce.CUDA_HOME = ce.CUDA_HOME or "/usr/local/cuda"
sys.argv = ["setup.py", "--name"]
runpy.run_path("setup.py", run_name="__main__")
"""


def _decision(env):
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return next(line for line in r.stdout.splitlines() if line.startswith("fastcollate build:"))


def test_no_gpu_visible_gets_a_default_arch_list():
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}
    env["TORCH_CUDA_ARCH_LIST"] = ""
    line = _decision(env)
    assert "CPU+CUDA" in line and "TORCH_CUDA_ARCH_LIST=8.0;9.0;10.0+PTX (default: no GPU visible)" in line


def test_an_explicit_arch_list_is_kept():
    line = _decision({"TORCH_CUDA_ARCH_LIST": "9.0"})
    assert line.endswith("TORCH_CUDA_ARCH_LIST=9.0")
