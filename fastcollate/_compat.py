"""The module paths of fastcollate before it was laid out by pipeline stage (0.1: one flat
package), kept working for a release: each old path is a small alias module that forwards
attribute access to where the name lives now, with a DeprecationWarning naming the new path.
Pickles made before the move (ArrayDataset, Collator, PadSpec...) name these paths and load
through them. (``fastcollate.loader`` is the loader stage's package now and still exports what
the old module did: DataLoader, StatefulDataLoader.) The aliases are registered in sys.modules when fastcollate is imported, so that
importing one never rebinds a package attribute (``fastcollate.collate`` stays the function).
"""
from __future__ import annotations

import importlib
import sys
import types
import warnings
from typing import Any

# old module -> (new module, {old name: new name} for names renamed on the way)
MOVED: dict[str, tuple[str, dict[str, str]]] = {
    "collate": ("core.collator", {"_cores": "usable_cores", "_alloc_shared": "alloc_shared",
                                  "_default": "DEFAULT_COLLATOR"}),
    "pad": ("core.pad", {"_check_fits": "check_fits"}),
    "tokenizer": ("core.tokenizer", {}),
    "_tree": ("core.tree", {}),
    "arrays": ("data.arrays", {}),
    "columns": ("data.columns", {"_Array": "HeldArray", "_Held": "ArraySource", "_Dense": "DenseSource",
                                 "_Ragged": "RaggedSource", "_source": "make_source", "_readable": "readable",
                                 "_convert_row": "convert_row", "_torch_dtype": "torch_dtype_of"}),
    "gather": ("data.gather", {"_Plan": "GatherPlan"}),
    "hf": ("data.hf", {}),
    "sampler": ("data.sampler", {}),
    "ring": ("loader.ring", {}),
    "pinning": ("loader.pinning", {}),
    "pipeline": ("device.pipeline", {"Epoch": "Producer"}),
    "transport": ("device.transport", {"Held": "HostHold"}),
    "prefetch": ("device.prefetcher", {}),
    "train": ("training.loop", {}),
    "monitor": ("training.monitor", {}),
    "tune": ("doctor.tune", {}),
    # moved from training/ to tuning/, shared by the doctor, tune and the loader's auto mode
    "training.model": ("tuning.model", {}),
    "training.measure": ("tuning.measure", {}),
    "training.memory": ("tuning.memory", {}),
    # 0.1's second layout: one package per mechanism (the doctor, the cache; the trace in core)
    "training.doctor": ("doctor.diagnose", {}),
    "training.doctor_look": ("doctor.look", {}),
    "training.doctor_plan": ("doctor.plan", {}),
    "training.doctor_proof": ("doctor.proof", {}),
    "training.doctor_text": ("doctor.text", {}),
    "training.doctor_words": ("doctor.words", {}),
    "training.diagnosis": ("doctor.diagnosis", {}),
    "training.tune": ("doctor.tune", {}),
    "data.cache": ("cache.cached", {}),
    "data.cache_node": ("cache.per_node", {}),
    "data.cache_codec": ("cache.codec", {}),
    "data.cache_memory": ("cache.room", {}),
    "data.cache_identity": ("cache.identity", {}),
    "data.wrapper": ("cache.wrapper", {}),
    "_trace": ("core.trace", {}),
    "loader.auto": ("loader.autotune", {}),
    "tuning.auto": ("tuning.decide", {}),
    "images.reference": ("images.pil_reference", {}),
    "bench": ("_bench.collate_bench", {"_time_per_call": "time_per_call"}),
    "workloads": ("_bench.workloads", {}),
    "storage_bench": ("_bench.storage", {}),
    "sweep": ("_bench.sweep", {}),
    "e2e": ("_bench.train_run", {}),
}


class _Moved(types.ModuleType):
    """An old module path: every attribute read warns and comes from the new module."""

    def __init__(self, old: str, new: str, renamed: dict[str, str]) -> None:
        super().__init__(f"fastcollate.{old}", f"Moved to fastcollate.{new}.")
        self._fc_new, self._fc_renamed = f"fastcollate.{new}", renamed

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # module protocol probes (__path__, __file__...) stay quiet
        target = importlib.import_module(self._fc_new)
        new_name = self._fc_renamed.get(name, name)
        where = f"{self._fc_new}.{new_name}"
        warnings.warn(f"{self.__name__}.{name} moved to {where}; the old path goes away in the next release",
                      DeprecationWarning, stacklevel=2)
        return getattr(target, new_name)


def install() -> None:
    for old, (new, renamed) in MOVED.items():
        sys.modules.setdefault(f"fastcollate.{old}", _Moved(old, new, renamed))


def moved_module(name: str) -> Any:
    """``fastcollate.<old>`` as an attribute (the package's __getattr__), or None."""
    return sys.modules.get(f"fastcollate.{name}") if name in MOVED else None
