"""Loads the compiled engine, fastcollate._C; without it the pure-Python reference serves, with
one warning, so a broken build degrades instead of failing the training job."""
from __future__ import annotations

import logging
import warnings
from types import ModuleType

import torch  # noqa: F401  (loads libc10/libtorch, which _C links against)

logger = logging.getLogger("fastcollate")
logger.addHandler(logging.NullHandler())  # a library logs; the application decides what is shown

_C: ModuleType | None
try:
    from fastcollate import _C  # type: ignore[attr-defined]

    LOAD_ERROR: BaseException | None = None
except ImportError as exc:  # pragma: no cover - exercised by the fallback test in a subprocess
    _C = None
    LOAD_ERROR = exc
    _msg = (
        f"fastcollate: the compiled engine could not be loaded ({exc}); using the pure-Python "
        "fallback, which is exact but no faster than default_collate. Rebuild with "
        "`pip install --no-build-isolation -e .`"
    )
    warnings.warn(_msg, RuntimeWarning, stacklevel=2)
    logger.warning(_msg)


def backend() -> str:
    """``"cpp"`` when the compiled engine is in use, ``"python"`` for the fallback.

    >>> import fastcollate
    >>> fastcollate.backend() in ("cpp", "python")
    True
    """
    return "cpp" if _C is not None else "python"


def cuda_kernels_built() -> bool:
    """Whether the extension was compiled with its CUDA kernels."""
    return bool(_C is not None and getattr(_C, "with_cuda", False))
