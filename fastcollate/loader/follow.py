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
epoch of another copy restarts its measuring (logged once per copy). Another process gets a
plain int (pickling drops the tuner).
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import torch.utils.data as tud

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
    loader.num_workers = AutoWorkers(choice.workers, loader.__dict__["_auto"])
    loader.prefetch_factor = choice.prefetch_factor


def _iter(self: Any) -> Any:
    begin_pass(self)
    return super(type(self), self).__iter__()


def _get_iterator(self: Any) -> Any:
    return self.__dict__["_auto"].make_iterator(self, super(type(self), self)._get_iterator)


def _auto_apply(self: Any, choice: Any) -> None:
    apply_choice(self, choice)
    from .dataloader import remake_ring  # the ring is dataloader.py's

    remake_ring(self.collate_fn, choice.workers, choice.prefetch_factor)


def _auto_log(self: Any) -> list[Any]:
    """Every decision of the auto mode this loader inherited (see fastcollate.DataLoader)."""
    return self.__dict__["_auto"].log


def _reduce_ex(self: Any, protocol: int) -> tuple:
    # pickled (or deep-copied) as the class it was made as, adopted again when rebuilt: the made
    # class cannot be found by name
    return (_rebuild, (type(self).__bases__[0], dict(self.__dict__)))


def _rebuild(cls: type, state: dict) -> Any:
    loader = cls.__new__(cls)
    loader.__dict__.update(state)
    if state.get("_auto") is not None:
        loader.__class__ = _followed_class(cls)
    return loader


_FOLLOWED: dict[type, type] = {}


def _followed_class(cls: type) -> type:
    """``cls`` with the auto mode's hooks: a direct subclass with no base of its own, so that an
    instance of ``cls`` can take it as its class (a mixin base would change the layout)."""
    made = _FOLLOWED.get(cls)
    if made is None:
        namespace = {"__iter__": _iter, "_get_iterator": _get_iterator, "_auto_apply": _auto_apply,
                     "auto_log": property(_auto_log), "__reduce_ex__": _reduce_ex, "__module__": cls.__module__, "__doc__": cls.__doc__}
        made = type(cls.__name__, (cls,), namespace)
        made.__qualname__ = cls.__qualname__
        _FOLLOWED[cls] = made
    return made


def adopt(loader: Any) -> Any:
    """A loader of another class whose ``num_workers`` carries a tuner: from now on tuned."""
    tuner = tuner_of(loader.__dict__.get("num_workers"))
    loader.__class__ = _followed_class(type(loader))
    loader.__dict__["_auto"] = tuner
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
            return adopt(self).__iter__()
        return original(self)

    tud.DataLoader.__iter__ = __iter__


__all__ = ["AutoWorkers", "adopt", "apply_choice", "begin_pass", "install", "tuner_of"]
