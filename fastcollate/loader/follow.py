"""The auto mode follows a loader re-created from a ``fastcollate.DataLoader``'s attributes.

accelerate's ``prepare()``, Lightning's sampler swap and a user's ``DataLoader(**vars)`` copy
build a new loader from the old one's attributes. ``num_workers`` of an auto loader is an
:class:`AutoWorkers`: an int (torch and the frameworks read it as one) that carries the tuner.
What it reaches goes on tuning:

- a ``fastcollate.DataLoader`` (Lightning re-creates the loader's own class) takes the tuner in
  its ``__init__``;
- any other loader class (accelerate builds torch's DataLoader) is adopted at its first
  ``iter()``: torch's ``DataLoader.__iter__`` is wrapped once, when the first auto loader is
  made, and acts only on a loader whose ``num_workers`` is an AutoWorkers. The loader's class is
  swapped for a subclass of itself that times its epochs and applies the decisions, as
  ``fastcollate.DataLoader`` does.

One tuner per auto loader, shared by its copies: it measures the loader that iterates, and an
epoch of another copy restarts its measuring (logged once per copy). ``num_workers`` pickled on
its own (a worker's arguments) is a plain int; a loader pickled whole keeps its tuner.
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import torch.utils.data as tud

from .ring import remake_ring

logger = logging.getLogger("fastcollate")


class AutoWorkers(int):
    """``num_workers`` of a loader in the auto mode: the current number, and the tuner."""

    tuner: Any

    def __new__(cls, value: int, tuner: Any) -> "AutoWorkers":
        obj = super().__new__(cls, int(value))
        obj.tuner = tuner
        return obj

    def __reduce__(self) -> tuple:
        return (int, (int(self),))  # a worker, a spawned process: the number only


def tuner_of(value: Any) -> Any:
    """The tuner an argument carries (None for a plain int)."""
    return value.tuner if type(value) is AutoWorkers else None


def begin_pass(loader: Any) -> None:
    """What every auto loader does at ``iter()``: tell a dataset that draws per epoch
    (fastcollate.images.ImageFolder) of the pass, then judge the last epoch and apply the next
    one's setting."""
    advance = getattr(loader.dataset, "_loader_epoch", None)
    if advance is not None:
        advance()
    auto = loader.__dict__.get("_auto")
    if auto is not None:
        auto.begin_epoch(loader)


def apply_choice(loader: Any, choice: Any) -> None:
    """The next setting on any loader, at an epoch boundary: persistent workers shut down (the
    next epoch starts a pool of the new size)."""
    it = loader.__dict__.get("_iterator")
    if it is not None:
        it._shutdown_workers()
        loader._iterator = None
    tuner = loader.__dict__["_auto"]
    loader.num_workers = AutoWorkers(choice.workers, tuner)
    loader.prefetch_factor = choice.prefetch_factor
    # torch refuses persistent_workers=True with no workers when a framework re-creates the loader
    # from its attributes: the user's wish is kept in the tuner, the attribute follows the workers
    # (torch's __setattr__ refuses it after __init__, so it is written in place)
    loader.__dict__["persistent_workers"] = bool(tuner.state.limits.persistent and choice.workers)


def _tuner(loader: Any) -> Any:
    """The loader's tuner, taken from its num_workers the first time (an instance made directly
    from an adopted class, as Lightning's ``type(loader)(...)`` makes one, has none yet)."""
    d = loader.__dict__
    if "_auto" not in d:
        d["_auto"] = tuner_of(d.get("num_workers"))
    return d["_auto"]


def _reduce_ex(self: Any, protocol: int) -> tuple:
    # pickled (or deep-copied) as the class it was made as, adopted again when rebuilt: the made
    # class cannot be found by name
    return (_rebuild, (_BASE[type(self)], self.__getstate__()))


def _rebuild(cls: type, state: Any) -> Any:
    loader = cls.__new__(cls)
    if hasattr(loader, "__setstate__"):
        loader.__setstate__(state)
    else:
        loader.__dict__.update(state)
    if isinstance(state, dict) and state.get("_auto") is not None:
        loader.__class__ = _followed_class(cls)
    return loader


_FOLLOWED: dict[type, type] = {}  # a loader class -> its adopted class
_BASE: dict[type, type] = {}  # and back


def _followed_class(cls: type) -> type:
    """``cls`` with the auto mode's hooks: a direct subclass with no base of its own, so that an
    instance of ``cls`` can take it as its class (a mixin base would change the layout)."""
    cls = _BASE.get(cls, cls)
    made = _FOLLOWED.get(cls)
    if made is not None:
        return made

    def __iter__(self: Any) -> Any:
        if _tuner(self) is not None:
            begin_pass(self)
        return super(made, self).__iter__()

    def _get_iterator(self: Any) -> Any:
        tuner = _tuner(self)
        if tuner is None:
            return super(made, self)._get_iterator()
        return tuner.make_iterator(self, super(made, self)._get_iterator)

    def _auto_apply(self: Any, choice: Any) -> None:
        apply_choice(self, choice)
        remake_ring(self.collate_fn, choice.workers, choice.prefetch_factor)

    def auto_log(self: Any) -> list[Any]:
        """Every decision of the auto mode this loader inherited (see fastcollate.DataLoader)."""
        tuner = _tuner(self)
        return tuner.log if tuner is not None else []

    namespace = {"__iter__": __iter__, "_get_iterator": _get_iterator, "_auto_apply": _auto_apply,
                 "auto_log": property(auto_log), "__reduce_ex__": _reduce_ex, "__module__": cls.__module__,
                 "__doc__": cls.__doc__}
    made = type(cls.__name__, (cls,), namespace)
    made.__qualname__ = cls.__qualname__
    _FOLLOWED[cls], _BASE[made] = made, cls
    return made


def adopt(loader: Any) -> Any:
    """A loader of another class whose ``num_workers`` carries a tuner: from now on tuned."""
    if type(loader) not in _BASE:
        loader.__class__ = _followed_class(type(loader))
    _tuner(loader)
    return loader


_original_iter: Any = None


def install() -> None:
    """Wraps torch's ``DataLoader.__iter__`` (once): a loader of any class whose num_workers is an
    AutoWorkers is adopted at its first ``iter()``; every other loader goes straight through."""
    global _original_iter
    if _original_iter is not None:
        return
    original = _original_iter = tud.DataLoader.__iter__

    @functools.wraps(original)
    def __iter__(self: Any) -> Any:
        d = self.__dict__
        if "_auto" not in d and type(d.get("num_workers")) is AutoWorkers:
            logger.info("fastcollate auto: %s.%s, made from an auto loader's attributes, is tuned from now on "
                        "(its decisions: loader.auto_log)", type(self).__module__, type(self).__qualname__)
            # adopted, then this pass goes on as it came (a subclass's own __iter__ that called
            # super() is not run twice): the next passes take the adopted class's __iter__
            begin_pass(adopt(self))
        return original(self)

    tud.DataLoader.__iter__ = __iter__


__all__ = ["AutoWorkers", "adopt", "apply_choice", "begin_pass", "install", "tuner_of"]
