"""
Token windows through the worker ring
=====================================

``TokenWindows`` serves training windows from one long token array -- a ``uint16`` memmap, as
nanoGPT writes it -- and gathers a whole batch in C++ without a Python object per sample.
``fastcollate.DataLoader``'s workers write each batch into a slot of a shared ring that the
main process reads as views.
"""

# %%
import os
import tempfile

import numpy as np
from torch.utils.data import default_collate

import fastcollate

folder = tempfile.mkdtemp()
path = os.path.join(folder, "train.bin")
np.random.default_rng(0).integers(0, 50257, 200_000, dtype=np.uint16).tofile(path)
tokens = np.memmap(path, dtype=np.uint16, mode="r")

ds = fastcollate.TokenWindows(tokens, seq_len=256)
print(len(ds), {k: (v.shape, v.dtype) for k, v in ds[0].items()})

# %%
# A gathered batch equals default_collate of the same samples.
idx = [5, 17, 3]
ours = fastcollate.collate(ds.__getitems__(idx))
theirs = default_collate([ds[i] for i in idx])
assert all((ours[k] == theirs[k]).all() for k in ours)
print(ours["input_ids"].shape, ours["input_ids"].dtype)

# %%
# Two workers, one ring: every batch lands in a recycled slot.
loader = fastcollate.DataLoader(ds, batch_size=32, shuffle=True, num_workers=2)
n = sum(batch["input_ids"].shape[0] for batch in loader)
st = loader.stats()
print(f"{n} windows; ring hits {st['ring_hits']}, fallbacks {st['ring_fallbacks']}, slots {st['ring_slots']}")
