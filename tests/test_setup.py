"""setup.py: its build decision (as a CUDA build of torch on a machine with nvcc and no GPU sees it),
its flags, where an editable install keeps its objects, and what it says while it compiles."""
import json
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
    return next(line for line in r.stderr.splitlines() if line.startswith("fastcollate build:"))  # said on stderr


def test_no_gpu_visible_gets_a_default_arch_list():
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}
    env["TORCH_CUDA_ARCH_LIST"] = ""
    line = _decision(env)
    assert "CPU+CUDA" in line and "TORCH_CUDA_ARCH_LIST=8.0;9.0;10.0+PTX (default: no GPU visible)" in line


def test_an_explicit_arch_list_is_kept():
    line = _decision({"TORCH_CUDA_ARCH_LIST": "9.0"})
    assert line.endswith("TORCH_CUDA_ARCH_LIST=9.0")


# setup.py's own objects, loaded as pip runs it (setup() itself only answers --name here)
PROBE = r"""
import json, os, runpy, subprocess, sys, time
sys.argv = ["setup.py", "--name"]
g = runpy.run_path("setup.py", run_name="__main__")
from setuptools.dist import Distribution
out = {"cxx_flags": g["cxx_flags"]}
for editable in (False, True):
    dist = Distribution({"name": "fastcollate", "ext_modules": [g["ext"]], "cmdclass": {"build_ext": g["BuildWithRecord"]}})
    cmd = g["BuildWithRecord"](dist)
    cmd.editable_mode = editable
    cmd.ensure_finalized()
    out[f"build_temp_editable={editable}"] = os.path.abspath(cmd.build_temp)
log = g["BUILD_LOG"]
log.path = os.environ["PROBE_LOG"]
log.open()
here = g["HERE"]
with g["ninja_progress"](time.monotonic()):  # what ninja -v writes to fd 1, then a compiler warning
    subprocess.run(["printf", "[1/2] c++ -MMD -c -c %s/csrc/engine/copy.cpp -o x.o -O3\\nwarning: unused x\\n" % here])
ninja_log = os.environ["PROBE_LOG"] + ".ninja_log"
with open(ninja_log, "w") as f:
    f.write("# ninja log v5\n0\t1500\t0\t/b/csrc/engine/old.o\tx\n")
offset = os.path.getsize(ninja_log)
with open(ninja_log, "a") as f:
    f.write("0\t2500\t0\t%s/csrc/python/pad.o\ty\n0\t900\t0\t%s/csrc/engine/copy.o\tz\n"
            % (os.path.dirname(ninja_log), os.path.dirname(ninja_log)))
out["compiled"] = g["_compiled_since"](ninja_log, offset)
print("PROBE " + json.dumps(out), flush=True)
"""


def _probe(tmp_path, **env):
    log = tmp_path / "build.log"
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PROBE_LOG": str(log), **env})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("PROBE "))[6:])
    return out, r, log.read_text()


def test_no_debug_info_unless_asked(tmp_path):
    # Python's CFLAGS carry -g: debug info for all of torch's headers (a 47 MB module, a third of the compile)
    out, _, _ = _probe(tmp_path, FASTCOLLATE_DEBUG="")
    assert "-g0" in out["cxx_flags"] and "-O3" in out["cxx_flags"]
    out, _, _ = _probe(tmp_path, FASTCOLLATE_DEBUG="1")
    assert out["cxx_flags"][:2] == ["-O0", "-g"] and "-g0" not in out["cxx_flags"]


def test_an_editable_install_keeps_its_objects_in_build(tmp_path):
    out, _, _ = _probe(tmp_path)
    kept = out["build_temp_editable=True"]
    # setuptools gives an editable build a new temporary folder each time: nothing would be reused
    assert kept.startswith(os.path.join(ROOT, "build", "editable-py")) and "-torch" in kept, kept
    assert out["build_temp_editable=False"] != kept  # other builds keep setuptools' own folder


def test_the_build_says_each_file_and_keeps_the_commands_in_its_log(tmp_path):
    _, r, log = _probe(tmp_path)
    said = [line for line in r.stderr.splitlines() if line.startswith("fastcollate build: [")]
    assert len(said) == 1 and said[0].startswith("fastcollate build: [1/2] csrc/engine/copy.cpp ("), r.stderr
    assert "warning: unused x" in r.stdout and "-MMD" not in r.stdout  # the compiler's words pass, commands do not
    assert "[1/2] c++ -MMD" in log and "fastcollate build: [1/2] csrc/engine/copy.cpp" in log
    assert "fastcollate build: CPU" in log or "fastcollate build: CPU+CUDA" in log  # the decision, said before


def test_the_summary_counts_only_this_builds_compiles(tmp_path):
    out, _, _ = _probe(tmp_path)
    assert out["compiled"] == [[2.5, "csrc/python/pad"], [0.9, "csrc/engine/copy"]]
