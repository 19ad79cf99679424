"""fastcollate.DataLoader: torch's DataLoader (same arguments, same iteration), collate_fn
defaulting to fastcollate's, and -- with num_workers > 0 on Linux -- workers that collate
straight into a recycled ring of shared slots (see fastcollate.loader.ring)."""
from __future__ import annotations

import inspect
import logging
import os
import sys
from typing import Any, TypeVar

import torch  # noqa: F401  (the doctests read it)
import torch.utils.data as tud
from torch.utils.data._utils.collate import default_convert

from .. import _ext
from ..core.collator import Collator, collate as _collate_fn
from . import follow
from . import autotune as _auto
from .ring import ForeignRing, Ring, RingCollator, make_ring as _make_ring

logger = logging.getLogger("fastcollate")
_SIGNATURE = inspect.signature(tud.DataLoader.__init__)
T_co = TypeVar("T_co", covariant=True)


def _ours(fn: Any) -> bool:
    return fn is _collate_fn or isinstance(fn, Collator)


_PENDING = object()  # a RingCollator's inner before torch's arguments say which default applies
_said: set[str] = set()  # the reasons for no ring already logged in this process


class _RingLoader:
    """The ring, for any DataLoader class. What decides it is what reaches torch's
    ``DataLoader.__init__`` (read by _AtTorch, which sits right before it in the class's MRO):
    the collate_fn, batch_size / batch_sampler, num_workers, prefetch_factor and pin_memory the
    class passes on, its own defaults and renamed arguments included."""

    _ring: "Ring | ForeignRing | None" = None
    _ring_collator: RingCollator | None = None
    _ring_off = "not set up"

    def __init__(self, *args: Any, ring: bool = True, ring_slot_bytes: int | None = None,
                 ring_max_bytes: int = 2 << 30, **kwargs: Any) -> None:
        self._ring_options = (ring, ring_slot_bytes, ring_max_bytes)
        self._ring_resolved = False
        self._ring_collator = None
        if type(self)._ring_base is not tud.DataLoader:
            args, kwargs = self._offer_collate(args, kwargs)
        super().__init__(*args, **kwargs)
        if not self._ring_resolved:  # the class called torch's __init__ directly, not through super()
            self._resolve_from_attributes()

    _ring_base: type = tud.DataLoader  # the loader class the ring was added to

    def _offer_collate(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A subclass of torch's DataLoader may wrap the collate_fn it is given (LitData's does):
        where the user gives it fastcollate's collate -- or none, and the class's own default is
        None -- it is given a RingCollator, whose ring is decided once torch's arguments are known."""
        base = type(self)._ring_base
        try:
            signature = inspect.signature(base.__init__)
            params = list(signature.parameters.values())[1:]
            if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
                signature = _SIGNATURE  # (self, *args, **kwargs): torch's arguments, passed through
            bound = signature.bind(self, *args, **kwargs)
        except (TypeError, ValueError):
            return args, kwargs  # the class reports its own error
        named = signature.parameters.get("collate_fn")
        if named is not None and named.kind in (named.POSITIONAL_OR_KEYWORD, named.KEYWORD_ONLY):
            given = bound.arguments.get("collate_fn", named.default)  # the class's own default counts
            if given is inspect.Parameter.empty:
                return args, kwargs
        else:  # not one of its arguments: passed on to torch in **kwargs, if at all
            var_kw = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)
            if var_kw is None:
                return args, kwargs
            given = bound.arguments.get(var_kw, {}).get("collate_fn")
        if isinstance(given, RingCollator):  # re-created from a loader's attributes
            given = given.inner
        if given is None:
            offer = RingCollator(_PENDING, None)
        elif _ours(given):
            offer = RingCollator(given, None)
        else:
            return args, kwargs  # the class's own collate (its default, or the user's): torch's path
        self._ring_collator = offer
        if named is not None and named.kind in (named.POSITIONAL_OR_KEYWORD, named.KEYWORD_ONLY):
            bound.arguments["collate_fn"] = offer
        else:
            bound.arguments[var_kw] = {**bound.arguments.get(var_kw, {}), "collate_fn": offer}
        return bound.args[1:], bound.kwargs

    def _at_torch(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """torch's DataLoader arguments as the class passes them: the collate_fn settled and the
        ring made where it serves."""
        self._ring_resolved = True
        try:
            bound = _SIGNATURE.bind(self, *args, **kwargs)
        except TypeError:
            return args, kwargs  # torch reports its own error
        bound.apply_defaults()
        a = bound.arguments
        if _auto.AUTO in (a["num_workers"], a["prefetch_factor"]):
            raise ValueError(f"{type(self).__name__}: num_workers=\"auto\" and prefetch_factor=\"auto\" are "
                             "fastcollate.DataLoader's (the class made by with_ring() takes ints)")
        auto = a["batch_size"] is not None or a["batch_sampler"] is not None
        collate = a["collate_fn"]
        offered = self._ring_collator
        if offered is not None and offered.inner is _PENDING:
            offered.inner = _collate_fn if auto else default_convert
        if isinstance(collate, RingCollator) and collate is not offered:
            collate = collate.inner  # a RingCollator of another loader (re-created from its attributes)
        if collate is None and auto:
            collate = _collate_fn
        if _ours(collate) and (offered is not None or (self._ring_options[0] and auto and a["num_workers"])):
            # wrapped where a ring may serve it; a loader without workers keeps what it was given
            offered = self._ring_collator = RingCollator(collate, None)
            collate = offered
        elif _ours(collate):
            self._ring_collator = None
        a["collate_fn"] = collate
        self._settle_ring(auto, a["num_workers"], a["prefetch_factor"], bool(a["pin_memory"]), _ours(collate))
        return bound.args[1:], bound.kwargs

    def _resolve_from_attributes(self) -> None:
        """For a class that skipped _AtTorch: torch's __init__ has run; settle from its attributes."""
        self._ring_resolved = True
        offered = self._ring_collator
        auto = self.batch_size is not None or self.batch_sampler is not None  # type: ignore[attr-defined]
        if offered is not None and offered.inner is _PENDING:
            offered.inner = _collate_fn if auto else default_convert
        self._settle_ring(auto, self.num_workers, self.prefetch_factor, bool(self.pin_memory))  # type: ignore[attr-defined]

    def _settle_ring(self, auto: bool, num_workers: int, prefetch_factor: int | None, pin: bool,
                     ours: bool = False) -> None:
        ring, slot_bytes, max_bytes = self._ring_options
        self._ring_params = (num_workers, prefetch_factor, slot_bytes, max_bytes, pin)
        self._ring = None
        if self._ring_collator is None and not ours:
            why = "the collate_fn is not fastcollate's"
        elif self._ring_collator is None:
            why = "ring=False" if not ring else ("num_workers=0" if auto else "automatic batching is off (batch_size=None)")
        elif not ring:
            why = "ring=False"
        elif not auto:
            why = "automatic batching is off (batch_size=None)"
        elif not num_workers:
            why = "num_workers=0"
        elif not sys.platform.startswith("linux"):
            why = "not Linux"
        elif _ext._C is None:
            why = "the compiled engine is not loaded"
        else:
            self._ring = _make_ring(*self._ring_params)
            why = "ring_max_bytes holds fewer than 2 slots" if self._ring is None else ""
        if self._ring_collator is not None:
            self._ring_collator.ring = self._ring
            # a loader re-created from this one's attributes shares the collator: its auto mode
            # resizes the ring with these (remake_ring)
            self._ring_collator.ring_options = (slot_bytes, max_bytes, pin) if self._ring is not None else None
        self._ring_off = why
        if why and num_workers and why not in _said:
            _said.add(why)
            logger.info("fastcollate: %s workers collate without the ring: %s", type(self).__name__, why)

    def _get_iterator(self) -> Any:
        ring = self._ring
        if ring is not None and (not isinstance(ring, Ring) or ring.owner != os.getpid()):
            # a loader made in another process (a forked child, a spawned Process it was passed
            # to): the ring there is not this process's to lease, so this process makes its own
            ring = self._ring = _make_ring(*self._ring_params)
            if self._ring_collator is not None:
                self._ring_collator.ring = ring
        if isinstance(ring, Ring):
            ring.reclaim_dead()  # slots of workers that died holding them (a killed epoch)
            ring.poll()
        return super()._get_iterator()  # type: ignore[misc]

    def ring_stats(self) -> dict[str, Any]:
        """The worker ring's counters: ring_hits, ring_fallbacks (ring_full + ring_oversize),
        ring_bytes, slot counts, ring_pinned (False, True, or why page-locking is off) and
        ring_pinned_bytes; ``{"ring": False, "ring_off": why}`` without a ring."""
        if not isinstance(self._ring, Ring):
            return {"ring": False, "ring_off": self._ring_off or "the ring is made when the loader is iterated here"}
        return {"ring": True, **self._ring.stats()}


class _AtTorch(tud.DataLoader):
    """Sits right before torch's DataLoader in a ring loader's MRO: sees the arguments the class
    passes to torch's __init__."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if isinstance(self, _RingLoader):
            args, kwargs = self._at_torch(args, kwargs)
        super().__init__(*args, **kwargs)


class DataLoader(_RingLoader, _AtTorch, tud.DataLoader[T_co]):
    """A drop-in for ``torch.utils.data.DataLoader``; ``collate_fn`` defaults to fastcollate's
    (and, with ``batch_size=None``, to torch's ``default_convert``, as torch does).

    With ``num_workers > 0`` on Linux (and fastcollate's collate), workers write each batch into
    one of K slots of one shared segment and send it by reference; the main process's batch is
    views over the slot, which returns to the ring when the last view has died. Nothing is read
    from the dataset in the main process. The segment is sparse: a slot's pages are allocated by
    its first batch, so a new loader's first batches cost what torch's do and every later one
    saves the allocation and the page faults. K is ``num_workers * prefetch_factor`` plus what a
    consumer and a prefetcher hold; each slot may hold up to ``ring_slot_bytes`` (default
    ``ring_max_bytes / K``, address space only). With CUDA and ``pin_memory=True`` each slot is
    page-locked the first time it holds a batch, so the pin thread has nothing to copy, and a
    slot is reused only after the copies that may read it have completed. A batch that finds no
    free slot, or does not fit one, goes in a shared arena of its own (``stats()`` counts both),
    which the main process takes without keeping its file descriptor.

    ``loader.collate_fn`` is a :class:`fastcollate.RingCollator` around what you passed
    (``.inner``): a complete collate_fn in any loader, so frameworks that re-create the loader
    from its attributes keep the ring. They keep the auto mode too: its ``num_workers`` is an
    int that carries the tuner (fastcollate.loader.follow), and the copy's ``auto_log`` is the
    original's. Like torch's loader it keeps no iteration state (no
    ``state_dict``: calling it raises an AttributeError that names the alternative);
    :class:`fastcollate.StatefulDataLoader` resumes mid-epoch.

    ``num_workers="auto"`` (and ``prefetch_factor="auto"``, which it implies unless you give an
    int) tunes both while it trains: the first epoch runs ``min(2, cores)`` workers (this rank's
    share of the node: ``fastcollate.tuning.node.share()``); each epoch measures, cheaply and
    always, the loop's wait for each batch against its own step and each batch's fetch, collate
    and CPU in the workers; at each epoch boundary -- never inside one -- the doctor's model
    predicts the other settings and the best is tried if it is predicted to gain 10%, reverted if
    it then measures a loss, and the loader settles when nothing is predicted to gain: a loop
    that is fine is left alone after its first epoch. Workers stay within the rank's share of
    the cores (more only where fetches mostly wait on I/O) and half its memory share; persistent
    workers are restarted to resize. Every decision is one INFO line on the ``fastcollate`` logger
    and a record in ``loader.auto_log``. A map-style dataset's batches are the same as with any
    fixed setting (torch delivers in the sampler's order). Randomness drawn in workers is not:
    torch seeds worker k with ``base_seed + k``, so with another number of workers a sample may be
    augmented from another worker's stream -- still random, still seeded from torch's generator,
    but not the same run to run when the choices differ. With no workers a dataset draws from the
    main process's generator, which also seeds the next epoch's shuffle. An IterableDataset refuses
    ``num_workers="auto"`` (the workers split the stream); ``prefetch_factor="auto"`` is allowed.

    >>> import torch, fastcollate
    >>> loader = fastcollate.DataLoader([torch.ones(2)] * 8, batch_size=4, num_workers=0)
    >>> [b.shape for b in loader]
    [torch.Size([4, 2]), torch.Size([4, 2])]
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        auto = None
        if any(isinstance(v, str) for v in (*args[5:6], kwargs.get("num_workers"), kwargs.get("prefetch_factor"))):
            ring_kw = {k: kwargs.pop(k) for k in ("ring", "ring_slot_bytes", "ring_max_bytes") if k in kwargs}
            try:
                bound = _SIGNATURE.bind(self, *args, **kwargs)
            except TypeError:
                bound = None  # torch reports its own error
            if bound is not None:
                auto = _auto.resolve(bound.arguments)
                args, kwargs = bound.args[1:], bound.kwargs
            kwargs.update(ring_kw)
        else:  # re-created from an auto loader's attributes (Lightning): its tuner goes on
            auto = follow.tuner_of(args[5] if len(args) > 5 else kwargs.get("num_workers"))
        self._auto = auto
        super().__init__(*args, **kwargs)

    @property
    def auto_log(self) -> list[Any]:
        """With ``num_workers="auto"``: every decision so far (``str(record)`` is its log line;
        ``record.to_dict()`` its figures); empty otherwise."""
        auto = self.__dict__.get("_auto")
        return auto.log if auto is not None else []

    def __iter__(self) -> Any:
        # a dataset whose randomness is drawn per epoch (fastcollate.images.ImageFolder) is told
        # of each pass, whichever loader makes it; the auto mode judges the last epoch and
        # applies the next one's setting
        follow.begin_pass(self)
        return super().__iter__()

    def _get_iterator(self) -> Any:
        auto = self.__dict__.get("_auto")
        if auto is None:
            return super()._get_iterator()
        return auto.make_iterator(self, super()._get_iterator)

    def _auto_apply(self, choice: Any) -> None:
        """The auto mode's next setting, at an epoch boundary: persistent workers shut down (the
        next epoch starts a pool of the new size), the ring remade for its slots."""
        follow.apply_choice(self, choice)
        collate = self.collate_fn
        self._settle_ring(self._auto_collation, choice.workers, choice.prefetch_factor, bool(self.pin_memory),
                          _ours(getattr(collate, "inner", collate)))

    def stats(self) -> dict[str, Any]:
        """The worker ring's counters (see :meth:`ring_stats`)."""
        return self.ring_stats()

    def __getattr__(self, name: str) -> Any:
        # only for names not found: torch's loader has no state_dict either, and frameworks test
        # for one with hasattr, so it stays missing -- with the advice a user calling it needs
        if name in ("state_dict", "load_state_dict"):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}': like torch's DataLoader, "
                                 "fastcollate.DataLoader keeps no iteration state; to resume mid-epoch use "
                                 "fastcollate.StatefulDataLoader (torchdata's StatefulDataLoader with fastcollate's "
                                 "collate and ring: pip install torchdata)", name=name, obj=self)
        return object.__getattribute__(self, name)  # any other name: the lookup's own error, unchanged


def with_ring(loader_class: type) -> type:
    """``loader_class`` -- a subclass of torch's DataLoader -- with fastcollate's collate and worker
    ring, as :class:`fastcollate.DataLoader` is for torch's own: the same arguments plus ``ring``,
    ``ring_slot_bytes``, ``ring_max_bytes``, and ``ring_stats()`` (also as ``stats()`` unless the
    class has its own). The class's own signature and defaults are kept (positional-only
    arguments too): where it is given no collate_fn and its own default is None, or is given
    fastcollate's, it is given a :class:`fastcollate.RingCollator` -- which it may wrap or
    post-process, as LitData's StreamingDataLoader does -- and what the class passes to torch's
    ``DataLoader.__init__`` decides the rest (batch_size, num_workers, prefetch_factor,
    pin_memory). A class whose own default collate is not fastcollate's keeps it (and torch's
    path). One class per base, made once.

    >>> import fastcollate, torch.utils.data as tud
    >>> class MyLoader(tud.DataLoader): pass
    >>> Loader = fastcollate.with_ring(MyLoader)
    >>> Loader is fastcollate.with_ring(MyLoader), issubclass(Loader, MyLoader)
    (True, True)
    """
    if not (isinstance(loader_class, type) and issubclass(loader_class, tud.DataLoader)):
        raise TypeError(f"fastcollate.with_ring: expected a subclass of torch.utils.data.DataLoader, got "
                        f"{loader_class!r} (a loader that only wraps one cannot carry the ring: give it a "
                        "fastcollate.DataLoader instead)")
    if issubclass(loader_class, _RingLoader):
        return loader_class
    if loader_class is tud.DataLoader:
        return DataLoader
    made = _WITH_RING.get(loader_class)
    if made is None:
        namespace: dict[str, Any] = {"_ring_base": loader_class, "__module__": __name__, "__doc__": loader_class.__doc__}
        if not hasattr(loader_class, "stats"):  # the class's own stats() stays its own: ring_stats() has the ring's
            namespace["stats"] = DataLoader.stats
        # _AtTorch after the class: right before torch's DataLoader in the MRO
        made = type(loader_class.__name__, (_RingLoader, loader_class, _AtTorch), namespace)
        made.__qualname__ = f"with_ring({loader_class.__qualname__})"
        _WITH_RING[loader_class] = made
    return made


_WITH_RING: dict[type, type] = {}


def stateful_loader_class() -> type:
    """fastcollate.StatefulDataLoader: torchdata's StatefulDataLoader with fastcollate's collate
    and ring; state_dict()/load_state_dict() resume mid-epoch exactly, workers included."""
    global _STATEFUL
    if _STATEFUL is None:
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader as _Base
        except ImportError as exc:
            raise ImportError("fastcollate.StatefulDataLoader needs torchdata: pip install torchdata") from exc

        StatefulDataLoader = with_ring(_Base)
        StatefulDataLoader.__doc__ = stateful_loader_class.__doc__
        StatefulDataLoader.__qualname__ = "StatefulDataLoader"  # found again by name (pickle, repr)
        _STATEFUL = StatefulDataLoader
    return _STATEFUL


_STATEFUL: type | None = None


def __getattr__(name: str) -> Any:
    if name == "StatefulDataLoader":
        return stateful_loader_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
