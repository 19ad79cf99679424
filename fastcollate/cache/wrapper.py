"""A dataset wrapper that is transparent to attributes: what the wrapper does not own is the
wrapped dataset's, read and written.

Code written for the dataset keeps working on the wrapper: ``loader.dataset.classes``,
``loader.dataset.set_epoch(e)``, a ``worker_init_fn`` doing ``get_worker_info().dataset.rng =
...`` -- the read reaches the wrapped dataset, and so does the write, where the dataset's own
``__getitem__`` reads it. The wrapper's own names (``_own_attributes``, anything its class
defines, dunders) stay the wrapper's.
"""
from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["DatasetWrapper"]


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class DatasetWrapper:
    """Forwards attribute reads it cannot answer, and attribute writes and deletes of names it
    does not own, to ``self.dataset``. A subclass lists its instance attributes in
    ``_own_attributes`` (``dataset`` always is one); names its class defines (methods,
    properties) and dunders are its own too, so protocols (pickle, copy, torch's
    ``__getitems__`` probe) never see the wrapped dataset's."""

    _own_attributes: ClassVar[frozenset[str]] = frozenset({"dataset"})

    def _owns(self, name: str) -> bool:
        return (name in self._own_attributes or _dunder(name) or hasattr(type(self), name)
                or "dataset" not in self.__dict__)  # still being made (or unpickled): nothing to forward to

    def __getattr__(self, name: str) -> Any:
        # only called when the wrapper itself has no such attribute
        if _dunder(name) or name in self._own_attributes or "dataset" not in self.__dict__:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        return getattr(self.__dict__["dataset"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if self._owns(name):
            object.__setattr__(self, name, value)
            return
        dataset = self.__dict__["dataset"]
        try:
            setattr(dataset, name, value)
        except AttributeError as exc:
            raise AttributeError(f"{type(self).__name__} sets the attributes it does not own on its dataset, and "
                                 f"the {type(dataset).__name__} refused {name!r}: {exc}") from exc

    def __delattr__(self, name: str) -> None:
        if self._owns(name):
            object.__delattr__(self, name)
        else:
            delattr(self.__dict__["dataset"], name)

    def __dir__(self) -> list[str]:
        names = set(super().__dir__())
        if "dataset" in self.__dict__:
            names.update(dir(self.__dict__["dataset"]))
        return sorted(names)
