"""DataLoader subclasses and Collators with their own semantics, importable by spawned workers
(test_with_ring.py, test_loader_processes.py): what fastcollate must keep when it adds its ring."""
import torch
import torch.utils.data as tud

import fastcollate


def data(n=40):
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(3, 4, generator=g), "y": i} for i in range(n)]


def own_collate(items):
    out = tud.default_collate(items)
    out["own"] = torch.tensor(len(items))
    return out


class OwnDefault(tud.DataLoader):
    """Its own default collate_fn: with the ring added, it must stay the one that runs."""

    def __init__(self, dataset, batch_size=8, collate_fn=own_collate, **kwargs):
        super().__init__(dataset, batch_size=batch_size, collate_fn=collate_fn, **kwargs)


class NoBatching(tud.DataLoader):
    """Automatic batching off by default: samples come one by one (torch's default_convert)."""

    def __init__(self, dataset, batch_size=None, **kwargs):
        super().__init__(dataset, batch_size=batch_size, **kwargs)


class TwoWorkers(tud.DataLoader):
    """num_workers defaults to 2 here: the ring must come with it."""

    def __init__(self, dataset, batch_size=8, num_workers=2, **kwargs):
        super().__init__(dataset, batch_size=batch_size, num_workers=num_workers, **kwargs)


class Renamed(tud.DataLoader):
    """Its own names for torch's arguments."""

    def __init__(self, dataset, bs=8, workers=0, **kwargs):
        super().__init__(dataset, batch_size=bs, num_workers=workers, **kwargs)


class PositionalOnly(tud.DataLoader):
    def __init__(self, dataset, /, batch_size=8, **kwargs):
        super().__init__(dataset, batch_size=batch_size, **kwargs)


class PostProcessing(tud.DataLoader):
    """Wraps the collate_fn it is given and looks inside its result (a framework's step)."""

    def __init__(self, dataset, *args, collate_fn=None, **kwargs):
        inner = collate_fn or tud.default_collate
        super().__init__(dataset, *args, collate_fn=Post(inner), **kwargs)


class Post:
    def __init__(self, inner):
        self.inner = inner

    def __call__(self, items):
        batch = self.inner(items)
        if isinstance(batch, dict):  # a step that only runs on real batches: skipped without error if not
            batch["x_sum"] = batch["x"].sum(dim=(1, 2))
            batch["y"] = batch["y"] * 2
        return batch


class WithStats(tud.DataLoader):
    def stats(self):
        return "mine"


class AddingCollator(fastcollate.Collator):
    """A Collator subclass whose __call__ adds a key: it must run in workers too."""

    def __call__(self, batch):
        out = super().__call__(batch)
        out["n"] = len(batch)
        return out


def adding_collate_reference(items):
    out = tud.default_collate(items)
    out["n"] = len(items)
    return out
