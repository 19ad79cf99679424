"""What Collator.for_tokenizer adds: the padding collate for rows a Hugging Face tokenizer produced,
equal tensor for tensor (dtype, shape, values) to what transformers' DataCollatorWithPadding,
DataCollatorForSeq2Seq and DataCollatorForLanguageModeling(mlm=False) return for the same rows.
transformers is never imported: only the tokenizer's attributes are read.

What those collators do, and so what the post-step here reproduces (read from transformers
5.25's ``tokenizer.pad`` and ``BatchEncoding.convert_to_tensors``; tests/integration/
test_hf_differential.py checks it against the installed version):

* the sequences ``tokenizer.pad`` pads (the first model input, ``attention_mask``,
  ``token_type_ids``, ``special_tokens_mask``) become ``torch.tensor`` of Python lists: int64,
  bool, or the default float dtype; fastcollate's padding engine gives the same (a bool
  sequence that got int pad values appended comes back int64 there, and so here);
* every other key becomes ``torch.tensor(column)`` -- ``torch.from_numpy(np.array(column))`` when
  the first value is a numpy array, int64 for a column of empty lists. Where this differs from
  default_collate (Python floats: float32, not float64; numpy promotion for arrays of mixed
  dtypes; nested lists as one tensor), the column is rebuilt that way;
* when the rows' input ids are tensors or numpy arrays, every column first goes through
  transformers' ``to_py_obj`` (tensors and arrays to Python lists, a column of numeric scalars
  kept as it is): an int32 tensor comes back int64, a float64 one float32;
* DataCollatorForSeq2Seq pads ``label`` (else ``labels``) to their own longest, rounded up to
  ``pad_to_multiple_of``, with ``label_pad_token_id`` on the tokenizer's side, always int64 (float
  values truncated toward zero), and returns ``labels=None`` when the rows have none;
* DataCollatorForLanguageModeling(mlm=False) drops ``special_tokens_mask`` and
  ``offset_mapping`` and makes ``labels`` from the input ids (pad id -> -100).

Where transformers refuses a batch (strings, ragged unpadded keys, nested tensors) fastcollate's
own result is kept.
"""
from __future__ import annotations

from collections import UserDict
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch

_MODES = {None: "auto", True: "seq2seq", False: "padding"}


def to_py(obj: Any) -> Any:
    """transformers' ``to_py_obj``: tensors, arrays and numpy numbers to Python objects; a list
    of numeric scalars (numpy ones included) is kept as it is."""
    if isinstance(obj, (int, float)):
        return obj
    if isinstance(obj, (dict, UserDict)):
        return {k: to_py(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if all(isinstance(x, (int, float, np.number)) for x in obj):
            return list(obj)
        return [to_py(x) for x in obj]
    if isinstance(obj, (torch.Tensor, np.ndarray, np.number)):
        return obj.tolist()
    return obj


def _all_empty(value: Any) -> bool:
    if len(value) == 0:
        return True
    return isinstance(value[0], (list, tuple)) and all(_all_empty(v) for v in value)


def hf_tensor(column: list[Any], to_python: bool) -> torch.Tensor:
    """The tensor ``tokenizer.pad(..., return_tensors="pt")`` makes of a key it does not pad."""
    value = to_py(column) if to_python else column
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return torch.from_numpy(np.array(value))
    if _all_empty(value):
        return torch.tensor(value, dtype=torch.int64)
    return torch.tensor(value)


def python_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ``torch.tensor`` gives the Python numbers a tensor of ``dtype`` holds."""
    if dtype == torch.bool:
        return dtype
    if dtype.is_floating_point:
        return torch.get_default_dtype()
    if dtype.is_complex:
        return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    return torch.int64


def seq2seq_labels(labels: list[Any], pad: int, multiple: int | None, side: str) -> torch.Tensor:
    """DataCollatorForSeq2Seq's labels: padded to their own longest (rounded up to the
    multiple) with ``pad`` on ``side``, then int64 (floats truncated toward zero)."""
    longest = max(len(x) for x in labels)
    if multiple:
        longest = -(-longest // multiple) * multiple
    if isinstance(labels[0], list):
        rows = [x + [pad] * (longest - len(x)) if side == "right" else [pad] * (longest - len(x)) + x
                for x in labels]
        return torch.tensor(rows, dtype=torch.int64)
    fill = [np.full(longest - len(x), pad, dtype=np.int64) for x in labels]
    arrays = [np.concatenate([x, f] if side == "right" else [f, x]) for x, f in zip(labels, fill)]
    return torch.from_numpy(np.stack(arrays)).to(torch.int64)


def _is_int(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not (t.dtype.is_floating_point or t.dtype.is_complex
                                                or t.dtype == torch.bool)


class HFBatch:
    """The post-step of ``for_tokenizer``'s Collator: turns fastcollate's batch (default_collate's
    rules, sequences padded by the engine) into what the chosen Hugging Face collator returns for
    the same rows; see the module docstring. ``mode``: ``"padding"``, ``"seq2seq"``, ``"auto"``
    (integer sequence labels as Seq2Seq, every other label as DataCollatorWithPadding) or ``"lm"``.
    Called with the collated batch and the rows it came from (an ArrayDataset batch's rows are
    only made when a column needs them)."""

    def __init__(self, key: Any, pad_id: int, mode: str, label_pad: int, spec: Any) -> None:
        self.key, self.pad_id, self.mode, self.label_pad, self.spec = key, pad_id, mode, label_pad, spec

    def __call__(self, out: Any, batch: Any) -> Any:
        if not isinstance(out, Mapping) or len(batch) == 0:
            return out
        first = batch[0]
        rows: list[Any] = []

        def column(k: Any) -> list[Any]:
            if not rows:
                rows.extend(batch)
            return [r[k] for r in rows]

        gathered = getattr(batch, "__fastcollate_gather__", None) is not None
        to_python = self._to_python(first, column)
        resolved = self.spec.resolve(first)
        padded = [k for k, _ in resolved.values] + [k for k in (resolved.mask_key,) if k is not None]
        labels = ("label", "labels") if self.mode in ("auto", "seq2seq") else ()
        for k in padded:
            if k in labels or not isinstance(out.get(k), torch.Tensor):
                continue
            t = out[k].to(python_dtype(out[k].dtype)) if to_python else out[k]
            if t.dtype == torch.bool and t.ndim >= 2 and min(len(x) for x in column(self.key)) < t.shape[1]:
                t = t.to(torch.int64)  # tokenizer.pad appends int pad values to lists of bools
            out[k] = t
        for k in [k for k in out if k not in padded and k in first]:
            if not (self.mode == "seq2seq" and k in labels):
                self._plain(out, k, first[k], column, gathered, to_python)
        for k in labels:
            if k in out and k in padded:
                self._padded_label(out, k, column, to_python)
        if self.mode == "seq2seq":
            name = "label" if "label" in first else "labels"
            if name in out and name not in padded:
                raise TypeError(f"fastcollate: seq2seq=True pads sequence labels, but sample 0's {name!r} is "
                                f"{type(first[name]).__name__} (DataCollatorForSeq2Seq refuses it too)")
            out["labels"] = out.pop(name) if name in out else None
        elif self.mode == "lm":
            out.pop("special_tokens_mask", None)
            out.pop("offset_mapping", None)
            ids = out[self.key].clone()
            ids[ids == self.pad_id] = self.label_pad
            out["labels"] = ids
        else:
            for old in ("label", "label_ids"):
                if old in out:
                    out["labels"] = out.pop(old)
        return out

    def _to_python(self, first: Any, column: Callable[[Any], list[Any]]) -> bool:
        # tokenizer.pad: input ids given as tensors / arrays send every column through to_py_obj
        v = first[self.key]
        if isinstance(v, (list, tuple)):
            if len(v) == 0:
                v = next((x for x in column(self.key) if len(x)), [])
            if isinstance(v, (list, tuple)) and len(v):
                v = v[0]
        return isinstance(v, (torch.Tensor, np.ndarray))

    def _plain(self, out: Any, k: Any, v: Any, column: Callable[[Any], list[Any]], gathered: bool,
               to_python: bool) -> None:
        """A key tokenizer.pad does not pad; ``v``: its value in sample 0."""
        if v is None or isinstance(v, (str, bytes, Mapping)):
            return  # transformers makes no tensor of these: fastcollate's result stays
        if not to_python and (type(v) in (int, bool) or isinstance(v, np.generic)):
            return  # default_collate's torch.tensor / torch.as_tensor of the column: the same tensor
        got = out[k]
        if gathered and isinstance(got, torch.Tensor):
            # one type per column: the dtype one row takes is the column's, and a cast of the
            # exact values fastcollate gathered rounds as torch.tensor does
            try:
                one = hf_tensor([v], to_python)
            except (TypeError, ValueError, RuntimeError, OverflowError):
                return
            if got.shape[1:] == one.shape[1:]:
                out[k] = got.to(one.dtype)
                return
        try:
            out[k] = hf_tensor(column(k), to_python)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            pass  # transformers refuses this column: fastcollate's result stays

    def _padded_label(self, out: Any, k: Any, column: Callable[[Any], list[Any]], to_python: bool) -> None:
        """A sequence label fastcollate padded (auto and seq2seq modes)."""
        t = out[k]
        if _is_int(t):
            out[k] = t.to(torch.int64)  # exact values: Seq2Seq's int64
        elif self.mode == "seq2seq":
            # floats: rebuilt as Seq2Seq truncates them (not from the engine's float32 rounding);
            # max_length (fastcollate's, not Hugging Face's) cuts them as the engine cut the rest
            labels = column(k) if self.spec.max_length is None else [x[:self.spec.max_length] for x in column(k)]
            out[k] = seq2seq_labels(labels, self.label_pad, self.spec.multiple, self.spec.side)
        else:
            # auto: float / bool sequences keep their values, as DataCollatorWithPadding gives
            # them (unpadded); ragged ones, which it refuses, stay padded with label_pad
            try:
                out[k] = hf_tensor(column(k), to_python)
            except (TypeError, ValueError, RuntimeError, OverflowError):
                pass


def settings(tokenizer: Any, *, label_pad: int = -100, causal_lm: bool = False, seq2seq: bool | None = None,
             pad_to_multiple_of: int | None = None, max_length: int | None = None
             ) -> tuple[dict[str, Any], Callable[[Any], HFBatch]]:
    """What ``Collator.for_tokenizer`` makes of a tokenizer's attributes (the options are its):
    the Collator's keyword arguments, and the post-step, made from the Collator's PadSpec. The
    Collator is the caller's to build, so that this module needs nothing of collator.py."""
    if causal_lm and seq2seq:
        raise ValueError("fastcollate: causal_lm=True and seq2seq=True name two different collators; pick one")
    if seq2seq not in _MODES:
        raise ValueError(f"fastcollate: seq2seq must be None, True or False, got {seq2seq!r}")
    names = list(getattr(tokenizer, "model_input_names", None) or ["input_ids", "attention_mask"])
    key = names[0]
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        raise ValueError("fastcollate: the tokenizer has no pad_token_id; set one first "
                         "(e.g. tokenizer.pad_token = tokenizer.eos_token), as Hugging Face's collators require")
    mode = "lm" if causal_lm else _MODES[seq2seq]
    optional = {"attention_mask": 0, "token_type_ids": int(getattr(tokenizer, "pad_token_type_id", 0) or 0),
                "special_tokens_mask": 1}
    if mode in ("auto", "seq2seq"):
        optional.update(labels=label_pad, label=label_pad)
    side = getattr(tokenizer, "padding_side", "right") or "right"
    kw = dict(pad={key: pad_id}, pad_if_present=optional, pad_to_multiple_of=pad_to_multiple_of,
              max_length=max_length, padding_side=side, return_mask="attention_mask" in names)
    return kw, lambda pad: HFBatch(key, pad_id, mode, label_pad, pad)


__all__ = ["settings", "HFBatch", "to_py"]
