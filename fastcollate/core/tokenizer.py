"""Collator.for_tokenizer: the padding collate for rows a Hugging Face tokenizer produced,
equal tensor for tensor to transformers' DataCollatorWithPadding, DataCollatorForSeq2Seq and
DataCollatorForLanguageModeling(mlm=False) on the same rows. transformers is never imported:
only the tokenizer's attributes are read."""
from __future__ import annotations

from typing import Any

import torch

from .collator import Collator


class RenameLabel:
    """``label`` / ``label_ids`` -> ``labels``, as DataCollatorWithPadding does."""

    def __call__(self, batch: Any) -> Any:
        for old in ("label", "label_ids"):
            if old in batch:
                batch["labels"] = batch.pop(old)
        return batch


class CausalLMLabels:
    """labels = input_ids with the pad id replaced by -100, special_tokens_mask dropped: what
    DataCollatorForLanguageModeling(mlm=False) returns (a real token equal to the pad id is
    masked too, as there)."""

    def __init__(self, key: Any, pad_id: int | None, ignore: int = -100) -> None:
        self.key, self.pad_id, self.ignore = key, pad_id, ignore

    def __call__(self, batch: Any) -> Any:
        batch.pop("special_tokens_mask", None)
        labels = batch[self.key].clone()
        if self.pad_id is not None:
            labels[labels == self.pad_id] = self.ignore
        batch["labels"] = labels
        return batch


def for_tokenizer(tokenizer: Any, *, label_pad: int = -100, causal_lm: bool = False,
                  pad_to_multiple_of: int | None = None, max_length: int | None = None, **kwargs: Any) -> Collator:
    """A Collator for tokenizer rows: the first of ``tokenizer.model_input_names`` padded with
    ``pad_token_id``, on ``tokenizer.padding_side``; ``attention_mask`` (padded with 0, or made
    when the rows lack it and the tokenizer returns one), ``token_type_ids``
    (``pad_token_type_id``) and ``special_tokens_mask`` (1) padded when the rows carry them;
    sequence ``labels`` padded with ``label_pad`` to their own longest (Seq2Seq), scalar labels
    collated (and ``label`` renamed ``labels``). ``causal_lm=True``: labels made from the input
    ids, as the language-modeling collator with ``mlm=False`` does. ``max_length`` truncates
    (Hugging Face's collators do not); other keyword arguments go to ``Collator``.

    >>> class Tok:  # any object with a tokenizer's attributes
    ...     model_input_names, pad_token_id, pad_token_type_id, padding_side = ["input_ids", "attention_mask"], 0, 0, "right"
    >>> c = for_tokenizer(Tok())
    >>> c([{"input_ids": [5, 6, 7], "label": 1}, {"input_ids": [8], "label": 0}])["input_ids"].tolist()
    [[5, 6, 7], [8, 0, 0]]
    """
    names = list(getattr(tokenizer, "model_input_names", None) or ["input_ids", "attention_mask"])
    key = names[0]
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        raise ValueError("fastcollate: the tokenizer has no pad_token_id; set one first "
                         "(e.g. tokenizer.pad_token = tokenizer.eos_token), as Hugging Face's collators require")
    optional = {"attention_mask": 0, "token_type_ids": int(getattr(tokenizer, "pad_token_type_id", 0) or 0),
                "special_tokens_mask": 1}
    if not causal_lm:
        optional["labels"] = label_pad
    c = Collator(pad={key: pad_id}, pad_if_present=optional, pad_to_multiple_of=pad_to_multiple_of,
                 max_length=max_length, padding_side=getattr(tokenizer, "padding_side", "right") or "right",
                 return_mask="attention_mask" in names, **kwargs)
    c.postprocess = CausalLMLabels(key, pad_id, label_pad) if causal_lm else RenameLabel()
    return c


__all__ = ["for_tokenizer"]
