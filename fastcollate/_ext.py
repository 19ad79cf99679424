"""Loads the compiled engine, fastcollate._C.

Before loading it, the build record beside it (``_C.build.json``, see ``_buildinfo``) is compared
with the running torch. A build for another torch (release, C++11 ABI, CPU vs CUDA, CUDA major,
Python) raises ImportError with one message naming both and the rebuild command, instead of an
undefined symbol or a crash inside the loader. ``FASTCOLLATE_ALLOW_FALLBACK=1`` — or
``FASTCOLLATE_DISABLE=1``, the rollback to default_collate, which must work whatever the build —
turns that error into one warning and the pure-Python path, without loading the module.

Without the module at all (a checkout never built), the pure-Python reference serves, with one
warning, so a missing build degrades instead of failing the training job.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import warnings
from types import ModuleType
from typing import Any, Optional

import torch  # noqa: F401  (loads libc10/libtorch, which _C links against)

from . import _buildinfo

logger = logging.getLogger("fastcollate")
logger.addHandler(logging.NullHandler())  # a library logs; the application decides what is shown

ALLOW_FALLBACK_ENV = "FASTCOLLATE_ALLOW_FALLBACK"
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def _env_on(name: str) -> bool:
    value = os.environ.get(name)
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def rebuild_command(pkg_dir: str = _PKG_DIR) -> str:
    """The command that rebuilds the engine against the torch in use: from the checkout when this
    package lives in one (an editable or in-place build), else from the sdist or a checkout."""
    root = os.path.dirname(pkg_dir)
    if os.path.isfile(os.path.join(root, "setup.py")) and os.path.isdir(os.path.join(root, "csrc")):
        return f"cd {root} && pip install --no-build-isolation -e ."
    return ("pip install --no-build-isolation --no-deps --force-reinstall "
            "<the fastcollate sdist (fastcollate-*.tar.gz) or a checkout's folder>")


def _run_as_cli() -> bool:
    """Whether this process is fastcollate's own command line: the ``fastcollate`` script or
    ``python -m fastcollate`` (which import the package before their main can catch anything)."""
    argv = list(getattr(sys, "orig_argv", ()))
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "fastcollate":
        return True
    return bool(sys.argv) and os.path.basename(sys.argv[0]) == "fastcollate"


def _refuse_or_fall_back(msg: str) -> ImportError:
    """A mismatch: ImportError, unless the user opted into the pure-Python path. Under the CLI
    (``fastcollate doctor`` is what the docs send a user to), the same message as its one error
    line and exit status 2, instead of an import traceback."""
    if not (_env_on(ALLOW_FALLBACK_ENV) or _env_on("FASTCOLLATE_DISABLE")):
        if _run_as_cli():
            print(f"fastcollate: error: {msg.removeprefix('fastcollate: ')}", file=sys.stderr)
            raise SystemExit(2)
        raise ImportError(msg)
    why = ALLOW_FALLBACK_ENV if _env_on(ALLOW_FALLBACK_ENV) else "FASTCOLLATE_DISABLE"
    full = f"{msg} ({why} is set: the compiled engine is not used; the pure-Python path serves.)"
    warnings.warn(full, RuntimeWarning, stacklevel=3)
    logger.warning(full)
    return ImportError(msg)


BUILD: Optional[dict[str, Any]] = _buildinfo.read(_PKG_DIR)  # the record beside the module, if any
RUNNING: dict[str, Any] = _buildinfo.running()
_C: ModuleType | None = None
LOAD_ERROR: BaseException | None = None
_problems = _buildinfo.mismatches(BUILD, RUNNING) if BUILD is not None else []

if _problems:  # checked before loading: a module built for another torch can crash on load
    LOAD_ERROR = _refuse_or_fall_back(_buildinfo.message(BUILD, RUNNING, _problems, rebuild_command()))
else:
    try:
        from fastcollate import _C  # type: ignore[attr-defined]
    except ImportError as exc:  # pragma: no cover - exercised by the fallback test in a subprocess
        LOAD_ERROR = exc
        _msg = (
            f"fastcollate: the compiled engine could not be loaded ({exc}); using the pure-Python "
            "fallback, which is exact but no faster than default_collate. Rebuild with "
            f"`{rebuild_command()}`"
        )
        warnings.warn(_msg, RuntimeWarning, stacklevel=2)
        logger.warning(_msg)
    else:
        if BUILD is None:
            # No record (a CMake build copied in, a build older than the record): the module says
            # itself which torch release it was compiled against.
            compiled = {**(getattr(_C, "build_info", None) or {}), "made_by": _buildinfo.MODULE}
            _problems = _buildinfo.mismatches(compiled, RUNNING) if compiled.get("torch") else []
            if _problems:
                _C = None
                LOAD_ERROR = _refuse_or_fall_back(_buildinfo.message(compiled, RUNNING, _problems, rebuild_command(), loaded=True))
del _problems

if _C is not None and hasattr(_C, "close_for_exit"):
    # before Python finalizes, threads still inside the engine (daemon threads collating) are let
    # finish their copy and parked: taking the GIL back during finalization would abort the
    # process after the program has finished (see csrc/python/nogil.h)
    atexit.register(_C.close_for_exit, 2.0)


def backend() -> str:
    """``"cpp"`` when the compiled engine is in use, ``"python"`` for the fallback.

    >>> import fastcollate
    >>> fastcollate.backend() in ("cpp", "python")
    True
    """
    return "cpp" if _C is not None else "python"


def built_for() -> str:
    """The torch the compiled engine was built for, in words (``"unknown"`` without a record).

    >>> import fastcollate
    >>> fastcollate._ext.built_for().startswith(("torch ", "unknown"))
    True
    """
    return _buildinfo.describe(BUILD) if BUILD is not None else "unknown (no build record beside the module)"


def cuda_kernels_built() -> bool:
    """Whether the extension was compiled with its CUDA kernels."""
    return bool(_C is not None and getattr(_C, "with_cuda", False))
