#!/usr/bin/env bash
# The wheel as a user without a compiler meets it. `python -m build` makes the sdist and then the
# wheel *from the unpacked sdist*, which proves the sdist holds everything the build needs (one
# compile: a few minutes on 2 cores). The wheel goes into a fresh venv whose PATH holds no compiler;
# a smoke test and a fast subset of the tests run there against the installed package, not this
# checkout. The venv gets torch, then the wheel with its declared dependencies, and `import
# fastcollate` and a smoke test run there before anything the tests need is added: a module-level
# import missing from [project] dependencies fails here, as it would for a user.
# Needs the torch, setuptools, wheel and ninja of README command 1 already installed.
#   bash .ci/wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python -m pip install -q build
# --no-isolation: the build uses the torch installed here (an isolated env would fetch a CUDA torch)
# run from elsewhere: in the checkout, the editable install's build/ folder would be imported as the
# `build` package (a namespace package shadows the installed one: "No module named build.__main__")
repo=$(pwd)
(cd "$work" && python -m build --no-isolation --outdir "$work/dist" "$repo") > "$work/build.log" 2>&1 \
  || { tail -60 "$work/build.log"; exit 1; }
grep "^fastcollate build" "$work/build.log" | sort -u || true
sdist=$(ls "$work"/dist/*.tar.gz) wheel=$(ls "$work"/dist/*.whl)
echo "wheel: built $(basename "$sdist") and $(basename "$wheel") ($((SECONDS - start)) s)"
missing=$(comm -23 <(git ls-files csrc fastcollate CMakeLists.txt setup.py pyproject.toml MANIFEST.in | sort) \
                   <(tar tzf "$sdist" | sed 's|^[^/]*/||' | sort))
[[ -z $missing ]] || { echo "wheel: the sdist lacks: $missing"; exit 1; }
python -m zipfile -l "$wheel" | grep -q "fastcollate/_C.build.json" || { echo "wheel: no build record in the wheel"; exit 1; }

# a fresh venv with the very torch release the wheel was built against and nothing else (never a
# bare `torch`, which would fetch a multi-GB CUDA build; a local version such as +cpu is left to
# pip's index): what the wheel needs beyond torch must come from its own declared dependencies
torch_pin=$(python -c "import torch; print(torch.__version__.split('+')[0])")
python -m venv "$work/venv"
"$work/venv/bin/python" -m pip install "torch==$torch_pin" > "$work/pip.log" 2>&1 || { tail -30 "$work/pip.log"; exit 1; }
# PATH with nothing on it but the venv's python: no compiler can be found, nor anything else
mkdir "$work/bin"
printf '#!/bin/sh\nexec %q "$@"\n' "$work/venv/bin/python" > "$work/bin/python"
chmod +x "$work/bin/python"
# the test files chosen (fast, no optional framework), copied away from the checkout
mkdir "$work/tests"
cp tests/conftest.py tests/helpers.py tests/sample_data.py tests/package_copy.py tests/test_torch_mismatch.py tests/test_semantics.py \
   tests/test_errors.py tests/test_killswitch.py tests/test_loader.py "$work/tests/"
(
  export PATH="$work/bin"
  unset PYTHONPATH
  for cc in gcc cc c++ g++ clang nvcc; do
    if command -v "$cc" > /dev/null; then echo "wheel: a compiler is on PATH ($cc)"; exit 1; fi
  done
  python -m pip install "$wheel" > "$work/pip-wheel.log" 2>&1 || { tail -30 "$work/pip-wheel.log"; exit 1; }
  cd "$work"
  # torch, the wheel and what the wheel declares: nothing the tests bring is installed yet
  python -c "import importlib.util; assert importlib.util.find_spec('pytest') is None, 'pytest is already installed'"
  python - <<'PYEOF'
import os, sysconfig
import torch
from torch.utils.data import DataLoader as TorchLoader, default_collate
import fastcollate

site = os.path.realpath(sysconfig.get_paths()["platlib"])
assert os.path.realpath(fastcollate.__file__).startswith(site + os.sep), f"not the installed package: {fastcollate.__file__}"
assert fastcollate.backend() == "cpp", f"compiled engine did not load: {fastcollate._ext.LOAD_ERROR}"
samples = [{"x": torch.arange(6.0).view(2, 3) + i, "y": i, "s": str(i)} for i in range(16)]
out, ref = fastcollate.collate(samples[:4]), default_collate(samples[:4])
assert torch.equal(out["x"], ref["x"]) and torch.equal(out["y"], ref["y"]) and out["s"] == ref["s"]
got = list(fastcollate.DataLoader(samples, batch_size=4, num_workers=2))
want = list(TorchLoader(samples, batch_size=4, num_workers=0))
assert len(got) == len(want) == 4
assert all(torch.equal(g["x"], w["x"]) and torch.equal(g["y"], w["y"]) and g["s"] == w["s"] for g, w in zip(got, want))
# the image stage: compiled, and decoding with the libjpeg the wheel carries (not the system's)
import fastcollate.images as fi
assert fi.available(), fi.why_not()
jpegs = {line.split()[-1] for line in open("/proc/self/maps") if "libjpeg" in line}
here = os.path.dirname(os.path.realpath(fastcollate.__file__))
assert jpegs and all(p.startswith(here + os.sep) for p in jpegs), f"libjpeg loaded from {jpegs}, not the wheel's"
print(f"wheel smoke OK: {fastcollate.__file__}, backend cpp, built for {fastcollate._ext.built_for()}, "
      f"JPEG stage compiled ({fastcollate._ext._C.jpeg_version}, {sorted(jpegs)[0]})")
PYEOF
  # only now what the tests need (the package's own dependencies are installed already)
  python -m pip install pytest > "$work/pip-tests.log" 2>&1 || { tail -30 "$work/pip-tests.log"; exit 1; }
  cd "$work/tests" && python -m pytest -q -p no:cacheprovider .
)
echo "wheel: sdist, wheel from the sdist, install without a compiler, smoke and tests: $((SECONDS - start)) s"
