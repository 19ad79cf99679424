"""The build record of the compiled engine: which torch it was built against, written beside it.

A C++ extension of torch is bound to the exact torch build it was compiled against (libtorch's C++
ABI is not stable across releases): loaded into another torch it fails with an undefined symbol
or, worse, loads and crashes. So the build writes a small record, ``_C.build.json``, next to
``_C*.so`` (setup.py's ``build_ext`` in a wheel, an editable install or ``--inplace``; the CMake
build into its build folder), and ``fastcollate._ext`` compares it with the running torch
*before* loading the module.

What counts as a mismatch (each is named in the message):

* the torch release, compared on its public version (``2.13.0``, ``2.14.0.dev20260501``; the
  ``+cpu``/``+cu128`` label aside);
* the C++11 ABI flag (``torch._C._GLIBCXX_USE_CXX11_ABI``);
* a CPU build of torch against a CUDA build (either way: the libraries differ, and a CPU-built
  engine on a CUDA torch lacks its CUDA kernels);
* the CUDA major version, when both are CUDA builds (``12.6`` against ``12.8`` is compatible);
* the Python minor version (the module's file name carries it: it would not even be found).

This file imports nothing from fastcollate (setup.py and CMake load it by path) and torch only
when asked about the running torch. As a script it writes the record for the torch in use:
``python fastcollate/_buildinfo.py OUT_DIR [--made-by cmake] [--cuda-kernels 0|1]``.
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Optional

RECORD_NAME = "_C.build.json"
FORMAT = 1
MODULE = "module"  # made_by of the record compiled into _C itself (torch's x.y.z and the ABI flag only)


def running(cuda_kernels: bool = False, made_by: str = "setup.py") -> dict[str, Any]:
    """The record of the torch and Python in this process (what a build made now would write)."""
    import torch

    return {
        "format": FORMAT,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": "{}.{}".format(*sys.version_info[:2]),
        "cuda_kernels": bool(cuda_kernels),
        "made_by": made_by,
    }


def write(out_dir: str, cuda_kernels: bool, made_by: str = "setup.py") -> str:
    """Write the record for the torch in use into ``out_dir``; returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, RECORD_NAME)
    with open(path, "w") as f:
        json.dump(running(cuda_kernels, made_by), f, indent=1, sort_keys=True)
        f.write("\n")
    return path


def read(pkg_dir: str) -> Optional[dict[str, Any]]:
    """The record beside the module in ``pkg_dir``, or None where there is none (a checkout never
    built, a CMake build copied in by hand, a build older than the record) or it cannot be read."""
    try:
        with open(os.path.join(pkg_dir, RECORD_NAME)) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and "torch" in rec else None


def release(version: str) -> str:
    """The public part of a torch version: ``2.13.0+cu128`` -> ``2.13.0``."""
    return str(version).split("+", 1)[0]


def base_release(version: str) -> str:
    """The numbers alone: ``2.14.0.dev20260501+cpu`` -> ``2.14.0`` (all torch's headers say)."""
    m = re.match(r"\d+(\.\d+)*", str(version))
    return m.group(0) if m else str(version)


def _cuda_major(cuda: Optional[str]) -> Optional[str]:
    return None if not cuda else str(cuda).split(".", 1)[0]


def describe(rec: dict[str, Any]) -> str:
    """``torch 2.13.0+cpu (CPU, C++11 ABI, Python 3.11)``."""
    parts = []
    if "torch_cuda" in rec:
        parts.append(f"CUDA {rec['torch_cuda']}" if rec["torch_cuda"] else "CPU")
    if "cxx11_abi" in rec:
        parts.append("C++11 ABI" if rec["cxx11_abi"] else "pre-C++11 ABI")
    if rec.get("python"):
        parts.append(f"Python {rec['python']}")
    return f"torch {rec.get('torch')}" + (f" ({', '.join(parts)})" if parts else "")


def mismatches(built: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between the build record and the running torch, in words; empty when none
    of it counts (see the module docstring for what does)."""
    out = []
    rel = base_release if built.get("made_by") == MODULE else release
    if rel(built.get("torch", "")) != rel(now["torch"]):
        out.append(f"the torch release differs ({rel(built.get('torch', ''))} vs {rel(now['torch'])})")
    if "cxx11_abi" in built and bool(built["cxx11_abi"]) != bool(now["cxx11_abi"]):
        out.append(f"the C++11 ABI flag differs ({int(bool(built['cxx11_abi']))} vs {int(bool(now['cxx11_abi']))})")
    b_cuda, n_cuda = built.get("torch_cuda"), now.get("torch_cuda")
    if "torch_cuda" in built and bool(b_cuda) != bool(n_cuda):  # (the module's own record does not say)
        out.append(f"it was built against a CUDA {b_cuda} build of torch and this torch is a CPU build" if b_cuda
                   else f"it was built against a CPU build of torch (no CUDA kernels) and this torch is a CUDA {n_cuda} build")
    elif b_cuda and _cuda_major(b_cuda) != _cuda_major(n_cuda):
        out.append(f"the CUDA major version differs ({b_cuda} vs {n_cuda})")
    if built.get("python") and built["python"] != now.get("python"):
        out.append(f"the Python version differs ({built['python']} vs {now.get('python')})")
    return out


def message(built: dict[str, Any], now: dict[str, Any], problems: list[str], rebuild: str, loaded: bool = False) -> str:
    """The one message a mismatch gives: both builds, what differs, and the fixes."""
    fate = "so it is not used" if loaded else "so it was not loaded"
    return (
        f"fastcollate: the compiled engine was built for {describe(built)}, "
        f"but this is {describe(now)}: {'; '.join(problems)}. "
        f"An extension built for another torch can fail with an undefined symbol or crash, {fate}. "
        f"Rebuild it against this torch: `{rebuild}`; or use the torch (and Python) it was built for. "
        "To run the pure-Python path instead (exact, but no faster than default_collate), "
        "set FASTCOLLATE_ALLOW_FALLBACK=1."
    )


def _main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description="write fastcollate's build record for the torch in use")
    p.add_argument("out_dir")
    p.add_argument("--made-by", default="cmake")
    p.add_argument("--cuda-kernels", type=int, default=0)
    args = p.parse_args(argv)
    path = write(args.out_dir, bool(args.cuda_kernels), args.made_by)
    print(f"fastcollate build record: {describe(running())} -> {path}")
    return 0


if __name__ == "__main__":
    # run as a script, this file's folder is sys.path[0]: fastcollate's own modules (ray.py,
    # transforms.py, ...) must not shadow what torch imports
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.exit(_main(sys.argv[1:]))
