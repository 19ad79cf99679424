"""The doctor: it runs your loader, finds what limits it and proposes the settings that make it
fastest, measured against yours. ``fastcollate.doctor(dataset, batch_size=..., **loader_kwargs)``
runs it (this package is callable: the call is :func:`fastcollate.doctor.diagnose.doctor`).

Its parts, in the order a run goes through them: ``look`` (your settings, traced), ``proof``
(may the cache be used: the dataset proven deterministic), ``plan`` (the candidates the model
predicts, within what may change), ``diagnose`` (the run itself: probes, measuring rounds, the
Diagnosis), ``words`` and ``text`` (the report); ``diagnosis`` turns a trace into the stage the loop
waits for (the StallMonitor's report); ``tune`` measures a grid of settings (``tune_loader``)."""
import importlib as _importlib
import sys as _sys
import types as _types
from typing import Any as _Any

# what the package exports, and the module that has it: imported when first asked for, so that
# the StallMonitor (fastcollate.training.monitor), which reads .diagnosis, does not load the
# doctor, which runs the monitor
_EXPORTS = {"doctor": "diagnose", "Diagnosis": "diagnose", "LoaderArgumentsError": "diagnose",
            "tune_loader": "tune", "TuneResult": "tune"}


def __getattr__(name: str) -> _Any:
    if name in _EXPORTS:
        value = globals()[name] = getattr(_importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        return value
    if name == "__wrapped__":  # inspect.signature(fastcollate.doctor) is the function's
        return __getattr__("doctor")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _CallableModule(_types.ModuleType):
    """``fastcollate.doctor`` is both this package and the function: ``fastcollate.doctor(ds, ...)``
    calls it, ``fastcollate.doctor.plan`` is a module, ``import fastcollate.doctor.plan`` works."""

    def __call__(self, *args: _Any, **kwargs: _Any) -> _Any:
        return __getattr__("doctor")(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule

# the reference documents Diagnosis, tune_loader and TuneResult as fastcollate.X: listed once
__all__ = ["doctor", "LoaderArgumentsError"]
