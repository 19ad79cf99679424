"""
Padding token rows
==================

``Collator(pad=...)`` pads variable-length leaves straight into the batch's arena and adds an
attention mask; ``LengthGroupedSampler`` puts rows of similar length together so that there is
less padding to write.
"""

# %%
import torch
from torch.utils.data import DataLoader

import fastcollate

g = torch.Generator().manual_seed(0)
lengths = torch.randint(16, 512, (2048,), generator=g).tolist()
rows = [{"input_ids": list(range(1, n + 1)), "labels": list(range(n)), "n": n} for n in lengths]

collate = fastcollate.Collator(pad={"input_ids": 0, "labels": -100}, pad_to_multiple_of=8, lengths_key="lengths")
batch = collate(rows[:4])
print({k: (tuple(v.shape), v.dtype) for k, v in batch.items()})
print(batch["attention_mask"].sum(1).tolist(), batch["lengths"].tolist())

# %%
# Sequential batches against length-grouped ones: the share of padded positions.
sequential = [list(range(i, min(i + 64, len(rows)))) for i in range(0, len(rows), 64)]
grouped = list(fastcollate.LengthGroupedSampler(lengths, batch_size=64, seed=0))
print(f"padding, sequential batches: {fastcollate.padding_fraction(lengths, sequential):.0%}")
print(f"padding, length-grouped:     {fastcollate.padding_fraction(lengths, grouped):.0%}")

# %%
# The sampler is a batch sampler: give it to any DataLoader.
loader = DataLoader(rows, batch_sampler=fastcollate.LengthGroupedSampler(lengths, 64, seed=0), collate_fn=collate)
first = next(iter(loader))
print(first["input_ids"].shape, first["input_ids"].dtype)
