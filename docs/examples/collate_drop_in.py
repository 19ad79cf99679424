"""
The drop-in collate
===================

``fastcollate.collate`` returns what ``torch.utils.data.default_collate`` returns -- the same
containers, dtypes, shapes and bytes -- with every tensor leaf a view of one arena.
"""

# %%
# A batch of samples as a dataset returns them: nested dicts, tensors, numbers, strings.
import torch
from torch.utils.data import default_collate

import fastcollate

g = torch.Generator().manual_seed(0)
samples = [
    {"image": torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=g),
     "meta": {"score": float(i) / 3, "id": f"row-{i}"},
     "label": i}
    for i in range(4)
]

ours = fastcollate.collate(samples)
theirs = default_collate(samples)
print({k: type(v).__name__ for k, v in ours.items()})
print(ours["image"].shape, ours["image"].dtype, ours["meta"]["score"].dtype, ours["meta"]["id"])

# %%
# Equal, byte for byte, and the tensor leaves share one storage: the whole batch is one
# allocation, which the CudaPrefetcher moves to the GPU in one copy.
assert torch.equal(ours["image"], theirs["image"]) and torch.equal(ours["label"], theirs["label"])
assert torch.equal(ours["meta"]["score"], theirs["meta"]["score"])
storages = {t.untyped_storage().data_ptr() for t in (ours["image"], ours["label"], ours["meta"]["score"])}
print("storages behind the batch's tensors:", len(storages))

# %%
# Errors keep default_collate's exception class and say where the batch differs.
bad = samples[:2] + [{**samples[2], "image": torch.zeros(3, 8, 7, dtype=torch.uint8)}]
try:
    fastcollate.collate(bad)
except RuntimeError as exc:
    print(type(exc).__name__, "-", str(exc).splitlines()[0])

# %%
# The engine counts what it did in this process.
s = fastcollate.stats()
print(fastcollate.backend(), {k: s[k] for k in ("batches", "tensor_leaves", "errors")})
