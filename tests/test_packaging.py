"""The sdist holds everything the build needs (every C++/CUDA source and header, the CMake build,
the build record's writer) and no build output. The wheel built from it, installed without a
compiler, is checked by .ci/wheel.sh (it compiles: minutes, so not here)."""
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _build_installed() -> bool:
    # the checkout's build/ folder (an editable install's objects) is found as a namespace package
    # named `build` (origin None): only a real one counts
    spec = importlib.util.find_spec("build")
    return spec is not None and spec.origin is not None

pytestmark = [
    pytest.mark.skipif(not os.path.isfile(os.path.join(ROOT, "setup.py")), reason="needs the checkout (setup.py)"),
    pytest.mark.skipif(not _build_installed(), reason="needs `pip install build`"),
]


def test_the_sdist_holds_what_the_build_needs(tmp_path):
    # from a clean copy: setuptools also packs what an old *.egg-info/SOURCES.txt lists, which would
    # hide a file MANIFEST.in no longer names
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "*.egg-info", "build", "build-cmake", "dist", "__pycache__", ".hypothesis", ".pytest_cache", ".benchmarks"))
    # --no-isolation: setup.py imports the torch installed here (an isolated env would fetch one)
    r = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(src)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)  # not the checkout: its build/
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]                # folder would shadow the package
    (sdist,) = [p for p in os.listdir(tmp_path) if p.endswith(".tar.gz")]
    with tarfile.open(tmp_path / sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    needed = {"setup.py", "pyproject.toml", "MANIFEST.in", "CMakeLists.txt", "README.md", "fastcollate/_buildinfo.py"}
    for d, _, files in os.walk(os.path.join(ROOT, "csrc")):
        needed |= {os.path.relpath(os.path.join(d, f), ROOT) for f in files if not f.startswith(".")}
    assert any(n.startswith("csrc/engine/") and n.endswith(".h") for n in needed)  # headers are the usual miss
    assert not needed - names, f"the sdist lacks {sorted(needed - names)}"
    outputs = [n for n in names if n.endswith(".so") or n.endswith("_C.build.json")]
    assert not outputs, f"build outputs in the sdist: {outputs}"
