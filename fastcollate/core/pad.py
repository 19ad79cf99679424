"""Padding collate for variable-length leaves: the spec, and its pure-Python reference (built
from torch.nn.utils.rnn.pad_sequence and explicit masks) -- the test oracle and the fallback.

Rules (the compiled engine follows them exactly):
  * only top-level keys of mapping samples can be padded; every other leaf collates exactly as
    fastcollate.collate;
  * a padded leaf is a tensor / numpy array of >= 1 dims, or a flat list/tuple of numbers;
    lengths are the first dimension, trailing dimensions must agree;
  * lists take torch.as_tensor's dtype, inferred over the whole column (bool, else int64, else
    float32); a column of only empty lists is int64; tensors must share one dtype (and match
    the lists' dtype when both appear); an empty sequence carries no values, so its dtype
    (``torch.tensor([])`` is float32) and, when 1-D, its trailing dimensions do not count;
  * each sequence is truncated to max_length (its first max_length elements), then all are
    padded to the longest, rounded up to pad_to_multiple_of, on padding_side;
  * the mask (1 real, 0 padding; ``attention_mask``, int64 by default, like Hugging Face's) and
    the optional per-sample lengths follow the FIRST key of ``pad``; they are appended to the
    batch dict;
  * tokenizer rows: keys in ``optional`` (by default ``attention_mask`` 0, ``token_type_ids`` 0,
    ``special_tokens_mask`` 1 -- what a Hugging Face tokenizer pads them with) are padded too
    when sample 0 carries them as sequences; a mask the samples already carry is padded, not
    made again (as ``tokenizer.pad`` does).
"""
from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Mapping, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from . import reference
from .tree import rebuild_mapping
from .reference import rewrap, type_name

_LIST_DTYPES = {0: torch.bool, 1: torch.int64, 2: torch.float32}
# what a Hugging Face tokenizer pads the sequences it returns beside input_ids with
TOKENIZER_KEYS = (("attention_mask", 0), ("token_type_ids", 0), ("special_tokens_mask", 1))


def _is_sequence(x: Any) -> bool:
    if isinstance(x, (list, tuple)):
        return True
    return (isinstance(x, torch.Tensor) or type(x).__module__ == "numpy") and getattr(x, "ndim", 0) >= 1


@dataclasses.dataclass(frozen=True)
class PadSpec:
    values: tuple[tuple[Any, Any], ...]  # (key, pad value) in the user's order
    multiple: int | None = None
    max_length: int | None = None
    side: str = "right"
    mask_key: Any = "attention_mask"
    mask_dtype: torch.dtype = torch.int64
    lengths_key: Any = None
    optional: tuple[tuple[Any, Any], ...] = ()  # padded when sample 0 carries them as sequences

    @staticmethod
    def make(pad: Mapping[Any, Any], pad_to_multiple_of: int | None, max_length: int | None, padding_side: str,
             return_mask: bool, mask_key: Any, mask_dtype: torch.dtype, lengths_key: Any,
             optional: Mapping[Any, Any] | None = None) -> "PadSpec":
        if not isinstance(pad, collections.abc.Mapping) or not pad:
            raise ValueError(f"fastcollate: pad must be a non-empty mapping key -> pad value, got {pad!r}")
        optional = dict(TOKENIZER_KEYS) if optional is None else dict(optional)
        for k, v in list(pad.items()) + list(optional.items()):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"fastcollate: pad value for {k!r} must be an int or float, got {v!r}")
        if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
            raise ValueError(f"fastcollate: pad_to_multiple_of must be a positive int, got {pad_to_multiple_of!r}")
        if max_length is not None and (not isinstance(max_length, int) or max_length < 0):
            raise ValueError(f"fastcollate: max_length must be an int >= 0, got {max_length!r}")
        if pad_to_multiple_of and max_length is not None and max_length % pad_to_multiple_of:
            raise ValueError(f"fastcollate: max_length ({max_length}) must be a multiple of pad_to_multiple_of "
                             f"({pad_to_multiple_of})")
        if padding_side not in ("right", "left"):
            raise ValueError(f"fastcollate: padding_side must be 'right' or 'left', got {padding_side!r}")
        if mask_dtype not in (torch.int64, torch.int32, torch.bool, torch.uint8):
            raise ValueError(f"fastcollate: mask_dtype must be int64, int32, uint8 or bool, got {mask_dtype}")
        names = [k for k in (mask_key if return_mask else None, lengths_key) if k is not None]
        clash = [k for k in names if k in pad]
        if clash or len(set(names)) != len(names):
            raise ValueError(f"fastcollate: mask_key/lengths_key {names} must differ from each other and from the padded keys")
        if lengths_key is not None and lengths_key in optional:
            raise ValueError(f"fastcollate: lengths_key {lengths_key!r} is also a key padded when present")
        return PadSpec(tuple(pad.items()), pad_to_multiple_of, max_length, padding_side,
                       mask_key if return_mask else None, mask_dtype, lengths_key,
                       tuple((k, v) for k, v in optional.items() if k not in pad))

    def resolve(self, elem: Any) -> "PadSpec":
        """The spec for a batch whose sample 0 is ``elem``: the optional keys it carries as
        sequences join the padded keys, and a mask it carries is padded rather than made."""
        return self._for(self._present(elem))[0]

    def engine_for(self, elem: Any) -> dict[str, Any]:
        """What the compiled engine reads for that batch (see ``engine``)."""
        return self._for(self._present(elem))[1]

    def _present(self, elem: Any) -> tuple[Any, ...]:
        if not self.optional or not isinstance(elem, collections.abc.Mapping):
            return ()
        return tuple(k for k, _ in self.optional if k in elem and _is_sequence(elem[k]))

    def _for(self, present: tuple[Any, ...]) -> tuple["PadSpec", dict[str, Any]]:
        # per batch: one dict lookup by the keys present (the spec itself is not hashed); the
        # cache sits in the instance dict, outside the frozen fields (and outside pickles)
        cache = self.__dict__.setdefault("_cache", {})
        hit = cache.get(present)
        if hit is None:
            spec = self
            if present:
                extra = tuple((k, v) for k, v in self.optional if k in present)
                carried_mask = self.mask_key is not None and self.mask_key in present
                spec = dataclasses.replace(self, values=self.values + extra, optional=(),
                                           mask_key=None if carried_mask else self.mask_key)
            hit = cache[present] = (spec, spec.engine())
        return hit

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_cache"}

    def target(self, longest: int) -> int:
        if self.multiple:
            return -(-longest // self.multiple) * self.multiple
        return longest

    def engine(self) -> dict[str, Any]:
        """What the compiled engine reads (for a resolved spec: see ``engine_for``)."""
        return {"values": list(self.values), "multiple": self.multiple or 0,
                "max_length": -1 if self.max_length is None else self.max_length, "left": self.side == "left",
                "mask_key": self.mask_key, "mask_dtype": self.mask_dtype, "lengths_key": self.lengths_key,
                "defer_column": self.column, "defer_batch": self.collate}

    # ------------------------------------------------------------ the reference

    def _where(self, key: Any) -> str:
        return f"fastcollate: {reference.format_path((key,))}"

    def _list_dtype(self, samples: Sequence[Any]) -> torch.dtype | None:
        rank, seen = -1, False
        for s in samples:
            if isinstance(s, (list, tuple)):
                for x in s:
                    seen = True
                    rank = max(rank, 0 if isinstance(x, bool) else 1 if isinstance(x, int) else 2)
        if not seen:
            return torch.int64 if any(isinstance(s, (list, tuple)) for s in samples) else None
        return _LIST_DTYPES[rank]

    def column(self, samples: Sequence[Any], key: Any) -> tuple[torch.Tensor, list[int]]:
        """The padded [B, L, ...] tensor of one key, and the per-sample (truncated) lengths."""
        where = self._where(key)
        list_dtype = self._list_dtype(samples)
        seqs = []
        for i, s in enumerate(samples):
            if isinstance(s, torch.Tensor):
                t = s
            elif type(s).__module__ == "numpy" and hasattr(s, "dtype") and hasattr(s, "ndim"):
                try:
                    t = torch.as_tensor(s)
                except Exception as exc:
                    raise rewrap(exc, f"{where}: sample {i} (numpy array of dtype {s.dtype}) cannot become a tensor: {exc}") from exc
            elif isinstance(s, (list, tuple)):
                bad = next((x for x in s if isinstance(x, (list, tuple)) or not isinstance(x, (bool, int, float))), None)
                if bad is not None:
                    raise TypeError(f"{where}: sample {i} holds {type_name(bad)}; a padded list must be a flat "
                                    "list of numbers")
                # the column's dtype is inferred over whole lists; only what truncation keeps is
                # converted (a value past max_length is never read, as in the engine)
                t = torch.tensor(list(s if self.max_length is None else s[: self.max_length]), dtype=list_dtype)
            else:
                raise TypeError(f"{where}: sample {i} is {type_name(s)}; a padded leaf must be a tensor, a "
                                "numpy array or a list of numbers")
            if t.dim() == 0:
                raise TypeError(f"{where}: sample {i} is a 0-d tensor; a padded leaf needs a length (first dimension)")
            seqs.append(t)
        # an empty sequence carries no values: its dtype (torch.tensor([]) is float32) and, when it
        # is 1-D, its missing trailing dimensions do not count; the first non-empty one decides
        ref = next((j for j, t in enumerate(seqs) if t.shape[0] > 0), 0)
        dtype, trailing = seqs[ref].dtype, seqs[ref].shape[1:]
        for i, t in enumerate(seqs):
            if t.shape[0] == 0 and (t.dim() == 1 or t.shape[1:] == trailing):
                seqs[i] = t.new_empty((0, *trailing), dtype=dtype)
                continue
            if t.dtype != dtype:
                raise TypeError(f"{where}: sample {i} has dtype {t.dtype}, sample {ref} has {dtype}")
            if t.shape[1:] != trailing:
                raise RuntimeError(f"{where}: sample {i} has trailing dimensions {list(t.shape[1:])}, sample {ref} has "
                                   f"{list(trailing)}; only the first dimension may differ")
        if self.max_length is not None:
            seqs = [t[: self.max_length] for t in seqs]
        lengths = [int(t.shape[0]) for t in seqs]
        length = self.target(max(lengths))
        value = dict(self.values)[key]
        check_fits(value, dtype, where)
        padded = pad_sequence(seqs, batch_first=True, padding_value=value, padding_side=self.side)
        if padded.shape[1] < length:  # rounding up to the multiple
            extra = torch.full((len(seqs), length - padded.shape[1], *padded.shape[2:]), value, dtype=dtype)
            padded = torch.cat([padded, extra] if self.side == "right" else [extra, padded], dim=1)
        return padded.contiguous(), lengths

    def mask(self, lengths: Sequence[int], length: int) -> torch.Tensor:
        lens = torch.tensor(list(lengths), dtype=torch.int64).view(-1, 1)
        pos = torch.arange(length).view(1, -1)
        real = pos < lens if self.side == "right" else pos >= (length - lens)
        return real.to(self.mask_dtype)

    def collate(self, batch: Sequence[Any]) -> Any:
        """The whole padded batch, in pure Python."""
        try:
            spec = self.resolve(batch[0])
        except (IndexError, TypeError, KeyError):
            spec = self
        return spec._collate_resolved(batch)

    def _collate_resolved(self, batch: Sequence[Any]) -> Any:
        try:
            elem = batch[0]
        except (IndexError, TypeError) as exc:
            raise rewrap(exc, "fastcollate: batch: cannot collate an empty batch" if hasattr(batch, "__len__")
                          and len(batch) == 0 else f"fastcollate: batch: cannot collate a {type_name(batch)}") from exc
        if not isinstance(elem, collections.abc.Mapping):
            raise TypeError(f"fastcollate: batch: pad= needs mapping samples (dicts), sample 0 is {type_name(elem)}")
        pad_keys = [k for k, _ in self.values]
        for i, s in enumerate(batch):
            if not isinstance(s, collections.abc.Mapping):
                raise TypeError(f"fastcollate: batch: sample {i} is {type_name(s)}, sample 0 is a mapping")
            for k in pad_keys:
                if k not in s:
                    raise KeyError(f"{self._where(k)}: sample {i} has no padded key {k!r} (it has {list(s)})")
        for k in (self.mask_key, self.lengths_key):
            if k is not None and k in elem:
                raise ValueError(f"fastcollate: batch: the samples already have a {k!r} leaf; pass another "
                                 "mask_key/lengths_key or return_mask=False")
        values: dict[Any, Any] = {}
        first = None
        for k in elem:  # key by key, as default_collate goes: the first key in error is the one reported
            if k in pad_keys:
                padded, lengths = self.column([s[k] for s in batch], k)
                values[k] = padded
                if k == pad_keys[0]:
                    first = (lengths, padded.shape[1])
            else:
                values[k] = reference.collate_subtree(reference.mapping_column(batch, k), (k,))
        assert first is not None
        if self.mask_key is not None:
            values[self.mask_key] = self.mask(*first)
        if self.lengths_key is not None:
            values[self.lengths_key] = torch.tensor(first[0], dtype=torch.int64)
        return rebuild_mapping(elem, values)


def check_fits(value: Any, dtype: torch.dtype, where: str) -> None:
    if dtype == torch.bool:
        ok = value in (0, 1)
    elif dtype.is_floating_point or dtype.is_complex:
        ok = True
    else:
        info = torch.iinfo(dtype)
        ok = float(value).is_integer() and info.min <= value <= info.max
    if not ok:
        raise ValueError(f"{where}: pad value {value!r} does not fit the leaf's dtype {dtype}")
