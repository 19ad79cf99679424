"""fastcollate.Cached is a transparent wrapper (issue #33): attributes it does not own are read from
and set on the wrapped dataset -- in the main process and, where torch sends the dataset, in the
workers (a worker_init_fn's ``get_worker_info().dataset.rng = ...``, ``set_epoch`` between epochs
of non-persistent workers); ``copy.copy`` is a new wrapper over the same dataset and cache,
``copy.deepcopy`` a new, empty cache over a copied dataset."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

import fastcollate
from fastcollate import _ext

C = _ext._C


class Folder(Dataset):
    """Like torchvision's ImageFolder: classes, an epoch setter, an rng read by __getitem__."""

    def __init__(self, n=8):
        self.n = n
        self.classes = ["cat", "dog"]
        self.epoch = 0
        self.rng = None
        self.counts = torch.zeros(n, dtype=torch.int32).share_memory_()

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.counts[i] += 1
        return {"x": torch.full((2,), float(i)), "rng": -1 if self.rng is None else self.rng}


def test_reads_and_calls_reach_the_dataset():
    base = Folder()
    ds = fastcollate.Cached(base, max_bytes=1 << 20)
    assert ds.classes is base.classes
    ds.set_epoch(3)
    assert base.epoch == 3 and ds.epoch == 3
    assert "classes" in dir(ds) and "stats" in dir(ds)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ds.nope
    assert not hasattr(ds, "__getitems__")  # a dunder of the dataset's is never forwarded


def test_sets_of_names_cached_does_not_own_go_to_the_dataset():
    base = Folder()
    ds = fastcollate.Cached(base, max_bytes=1 << 20)
    ds.rng = 7
    assert base.rng == 7 and "rng" not in vars(ds)
    assert ds[0]["rng"] == 7  # where the dataset's own __getitem__ reads it
    ds.new_name = "x"
    assert base.new_name == "x"
    del ds.new_name
    assert not hasattr(base, "new_name")
    # Cached's own attributes stay its own
    ds.transform = lambda s: s["x"]
    assert torch.equal(ds[0], torch.zeros(2)) and not hasattr(base, "transform")
    ds.transform = None
    assert ds.max_bytes == 1 << 20 and ds.dataset is base
    with pytest.raises(AttributeError, match="Cached sets the attributes it does not own on its dataset, and the "
                                             "list refused 'rng'"):
        fastcollate.Cached([1, 2], max_bytes=1 << 10).rng = 1


def plus_one(sample):
    return sample["x"] + 1


def test_a_shallow_copy_is_a_new_wrapper_over_the_same_dataset_and_cache():
    base = Folder()
    train = fastcollate.Cached(base, transform=plus_one, max_bytes=1 << 20)
    train[0]
    val = copy.copy(train)
    assert val is not train and val.dataset is base and val.ctrl is train.ctrl
    val.transform = None
    assert train.transform is not None  # the training transform stays on
    assert torch.equal(train[0], torch.ones(2)) and torch.equal(val[0]["x"], torch.zeros(2))
    assert train.stats()["hits"] == 2 and base.counts.tolist()[0] == 1  # one cache
    assert pickle.loads(pickle.dumps(val)) is val and pickle.loads(pickle.dumps(train)) is train


class Keep:
    def __call__(self, sample):
        return sample


def test_a_deep_copy_copies_the_dataset_and_has_a_cache_of_its_own():
    base = Folder()
    train = fastcollate.Cached(base, transform=Keep(), max_bytes=1 << 20)
    train[0]
    val = copy.deepcopy(train)
    assert val is not train and val.dataset is not base and val.transform is not train.transform
    assert val.max_bytes == train.max_bytes and val.ctrl is not train.ctrl and val.id != train.id
    val.transform = None
    val.rng = 5  # a diverging dataset: never served the original's samples
    assert train.transform is not None and base.rng is None
    assert val[0]["rng"] == 5 and train[0]["rng"] == -1
    assert (val.stats()["inserts"], val.stats()["hits"]) == (1, 0)
    assert (train.stats()["inserts"], train.stats()["hits"]) == (1, 1)


def seed_worker(worker_id):
    get_worker_info().dataset.rng = 100 + worker_id


def tag_epoch(sample):
    return dict(sample, epoch=get_worker_info().dataset.epoch)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_init_fn_and_set_epoch_reach_the_dataset_in_workers(context):
    base = Folder(8)
    ds = fastcollate.Cached(base, transform=tag_epoch, max_bytes=1 << 20)
    loader = DataLoader(ds, batch_size=2, num_workers=2, worker_init_fn=seed_worker, multiprocessing_context=context,
                        timeout=120)
    for epoch in range(2):
        loader.dataset.set_epoch(epoch)  # non-persistent workers start after it: they see it, as torch sends it
        batches = list(loader)
        assert [int(e) for b in batches for e in b["epoch"]] == [epoch] * 8
        # the samples were fetched in epoch 0 by a worker whose rng its worker_init_fn set
        assert sorted(set(int(r) for b in batches for r in b["rng"])) == [100, 101]
    assert base.rng is None and ds.stats()["hits"] == 8  # the main process's dataset untouched
