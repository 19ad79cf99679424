"""Misconfigured pipelines for the doctor's tests (test_doctor.py), importable by spawned
DataLoader workers: each has one lever that fixes it. Costs are CPU work, not sleeps (a sleep
parallelizes past the cores), except where the point is waiting."""
import os
import time

import numpy as np
import torch
from torch.utils.data import Dataset


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SlowGetitem(Dataset):
    """A per-sample Python __getitem__ that costs ``per_sample`` seconds of CPU (run with
    num_workers=0: workers fix it)."""

    def __init__(self, n=512, per_sample=400e-6):
        self.n, self.per_sample = n, per_sample

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        spin(self.per_sample)
        return {"x": torch.full((16,), float(i)), "y": i}


class Expensive(Dataset):
    """Deterministic and expensive: the same index always gives the same sample (the cache)."""

    def __init__(self, n=256, per_sample=1e-3):
        self.n, self.per_sample = n, per_sample

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        spin(self.per_sample)
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(64, generator=g), "y": i}


class Cheap(Dataset):
    """Almost free samples (spawned non-persistent workers, tiny batches: the loader's own costs)."""

    def __init__(self, n=512, width=8):
        self.n, self.width = n, width

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((self.width,), float(i)), "y": i}


class RareSlow(Dataset):
    """Most samples cheap, one in ``every`` slow (waiting, as a remote read would)."""

    def __init__(self, n=512, every=37, slow=0.03):
        self.n, self.every, self.slow = n, every, slow

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i % self.every == 0:
            time.sleep(self.slow)
        else:
            spin(50e-6)
        return {"x": torch.full((8,), float(i)), "y": i}


class ManyFields(Dataset):
    """Samples of many small fields, made once: default_collate's per-leaf cost dominates."""

    def __init__(self, n=1024, fields=40):
        self.samples = [{f"f{k}": torch.full((4,), float(i + k)) for k in range(fields)} for i in range(n)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


class PythonObjects(Dataset):
    """Millions of Python objects held by the dataset and touched by every worker: copy-on-write
    copies their pages into each worker."""

    def __init__(self, n=256, objects=2_000_000):
        self.n = n
        self.table = [{"id": k, "name": str(k)} for k in range(objects // 2)]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        # reads (and so reference-counts) a spread of the objects, as lookups over an epoch do
        stride = max(1, len(self.table) // 4096)
        total = 0
        for k in range(i % stride, len(self.table), stride):
            total += self.table[k]["id"]
        return {"x": torch.full((8,), float(total % 997)), "y": i}


def compute_step(seconds=0.02):
    def step(batch):
        spin(seconds)
    return step


def light_step(batch):
    return None


# ---- adversarial datasets: randomness a weak determinism check misses (none may get the cache) ----

class Flip(Dataset):
    """A random flip with probability ``p`` (torch's global generator): an augmentation."""

    def __init__(self, n=256, p=0.1):
        self.n, self.p = n, p

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.arange(8.0) + i
        return {"x": x.flip(0) if torch.rand(()) < self.p else x, "y": i}


class EpochDependent(Dataset):
    """Deterministic given the epoch, which ``set_epoch`` changes (a curriculum, a resampling)."""

    def __init__(self, n=128):
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((4,), float(i + 1000 * self.epoch)), "y": i}


class WorkerSeeded(Dataset):
    """Draws from its own generator, which ``seed_worker`` reseeds in each worker (from the
    worker's torch seed, as torch's docs recommend)."""

    def __init__(self, n=128):
        self.n, self.rng = n, np.random.default_rng(0)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.tensor([float(i), float(self.rng.integers(0, 2))]), "y": i}


def seed_worker(worker_id):
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed % 2**32)


class Minority(Dataset):
    """Deterministic but for a minority class (1 sample in ``every``), which is augmented."""

    def __init__(self, n=512, every=97):
        self.n, self.every = n, every

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.arange(4.0) + i
        if i % self.every == 13:
            x = x + float(torch.rand(()))
        return {"x": x, "y": i}


class ReadsFile(Dataset):
    """Deterministic as long as the file it reads on every fetch does not change."""

    def __init__(self, path, n=64, record=1024):
        self.path, self.n, self.record = path, n, record

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with open(self.path, "rb") as f:
            f.seek(i * self.record)
            data = f.read(self.record)
        return {"x": torch.frombuffer(bytearray(data), dtype=torch.uint8), "y": i}


class OpensInWorker(Dataset):
    """Reads a file that ``open_in_worker`` (its worker_init_fn) opens: fetching it in the main
    process fails, as in the user's own main process."""

    def __init__(self, path, n=128, record=16):
        self.path, self.n, self.record, self.f = path, n, record, None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.f.seek(i * self.record)
        return {"x": torch.frombuffer(bytearray(self.f.read(self.record)), dtype=torch.uint8), "y": i}


def open_in_worker(worker_id):
    from torch.utils.data import get_worker_info

    ds = get_worker_info().dataset
    ds.f = open(ds.path, "rb")


class Stream(torch.utils.data.IterableDataset):
    """An IterableDataset with a __len__, split over the workers by worker id."""

    def __init__(self, n=192):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        for i in range(wid, self.n, nw):
            yield {"x": torch.full((4,), float(i)), "y": i}


class StringKeys(Dataset):
    """Samples under string keys, with a custom sampler that yields them."""

    def __init__(self, n=96):
        self.samples = {f"k{i}": {"x": torch.full((4,), float(i)), "y": i} for i in range(n)}

    def keys(self):
        return list(self.samples)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, key):
        return self.samples[key]


class Sleepy(Dataset):
    """Each sample waits ``wait`` seconds (a read from slow storage) and costs little CPU."""

    def __init__(self, n=256, wait=3e-3):
        self.n, self.wait = n, wait

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.wait)
        return {"x": torch.full((8,), float(i)), "y": i}


class SmallImages(Dataset):
    """Made once, fetched for ``per_sample`` seconds of CPU (a lookup, a light augmentation):
    small float images in large batches, so that moving a batch from a worker to the main process
    (shared memory, a pickled handle, the main's rebuild) is much of what a worker-fed loop costs."""

    def __init__(self, n=8192, shape=(3, 32, 32), per_sample=0.0):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand((n, *shape), generator=g)
        self.per_sample = per_sample

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.per_sample:
            spin(self.per_sample)
        return {"x": self.x[i].clone(), "y": i}


class Parsed(Dataset):
    """Each sample parsed in Python for ``per_sample`` seconds of CPU, then a small image: workers
    help (run with a spawn context, not persistent, the loader re-spawns them each epoch)."""

    def __init__(self, n=1024, per_sample=250e-6, shape=(3, 16, 16)):
        self.n, self.per_sample, self.shape = n, per_sample, shape

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        spin(self.per_sample)
        return {"x": torch.full(self.shape, float(i % 251)), "y": i}


def log_start(_worker_id):
    """A worker_init_fn that appends the worker's start time (a clock all processes share) to the
    file named by FASTCOLLATE_TEST_STARTS."""
    import time
    with open(os.environ["FASTCOLLATE_TEST_STARTS"], "a") as f:
        f.write(f"{time.monotonic()}\n")


__all__ = ["SlowGetitem", "Expensive", "Cheap", "RareSlow", "ManyFields", "PythonObjects", "compute_step", "light_step",
           "Flip", "EpochDependent", "WorkerSeeded", "seed_worker", "Minority", "ReadsFile", "OpensInWorker",
           "open_in_worker", "Stream", "StringKeys", "Sleepy", "SmallImages", "Parsed", "log_start", "np"]
