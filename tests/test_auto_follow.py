"""num_workers="auto" survives a loader re-created from its attributes (fastcollate.loader.follow):
a torch DataLoader(**attributes) copy, Lightning's sampler swap, accelerate's prepare(). The copy
goes on tuning, logs on the object iterated, and gives the batches a fixed loader gives."""
from __future__ import annotations

import pickle

import pytest
import torch
import torch.utils.data as tud

import fastcollate
from fastcollate.loader import follow
from fastcollate.tuning import decide as plan
from helpers import assert_same
from test_auto import Squares, epochs, scripted

ATTRS = ("batch_size", "num_workers", "collate_fn", "prefetch_factor", "drop_last", "pin_memory",
         "persistent_workers", "worker_init_fn", "timeout", "generator")


def copy_of(loader, cls=tud.DataLoader, **kw):
    """What a framework does: a new loader from the old one's attributes."""
    return cls(loader.dataset, **{**{k: getattr(loader, k) for k in ATTRS}, **kw})


def same_epochs(a, b):
    assert [len(e) for e in a] == [len(e) for e in b]
    for ea, eb in zip(a, b):
        for x, y in zip(ea, eb):
            assert_same(x, y)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_torch_loader_made_from_the_attributes_goes_on_tuning(persistent):
    torch.manual_seed(0)
    fixed = epochs(fastcollate.DataLoader(Squares(), batch_size=8, shuffle=True, num_workers=2,
                                          persistent_workers=persistent), 4)
    torch.manual_seed(0)
    auto = fastcollate.DataLoader(Squares(), batch_size=8, shuffle=True, num_workers="auto",
                                  persistent_workers=persistent)
    assert type(auto.num_workers) is follow.AutoWorkers and auto.num_workers == 2
    auto._auto.decide = scripted(plan.Choice(0), plan.Choice(3, 4), plan.Choice(1, 2))
    copy = copy_of(auto, shuffle=True)
    got = epochs(copy, 4)
    same_epochs(fixed, got)
    assert isinstance(copy, tud.DataLoader) and type(copy).__name__ == "DataLoader"
    assert [r.after.workers for r in copy.auto_log if r.action == "change"] == [0, 3, 1]
    assert copy.auto_log is auto.auto_log  # one tuner, one log: on the copy and on the original
    assert copy.num_workers == 1 and copy.prefetch_factor == 2
    if fastcollate.backend() == "cpp":
        assert copy.collate_fn.ring.slots == 1 * 2 + 5  # the shared ring resized for the new setting
    if not persistent:  # a live pool does not pickle, in torch's loader either
        copy._auto.decide = plan.decide  # the scripted one is a local function: it does not pickle
        again = pickle.loads(pickle.dumps(copy))  # an adopted loader pickles as its own class, adopted again
        assert type(again).__mro__[1] is tud.DataLoader
        assert [str(r) for r in again.auto_log] == [str(r) for r in copy.auto_log]
        assert [len(e) for e in epochs(again, 1)] == [12]


def test_a_copy_of_the_copy_and_the_original_share_one_tuner_that_measures_the_loader_that_iterates(caplog):
    auto = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")
    auto._auto.decide = scripted(plan.Choice(1, 2))
    epochs(auto, 1)
    copy = copy_of(copy_of(auto))  # accelerate inside Lightning, say
    with caplog.at_level("INFO", logger="fastcollate"):
        epochs(copy, 3)
    assert sum("now measuring DataLoader" in r.getMessage() for r in caplog.records) == 1
    # the original's epoch was in flight when the copy took over: not judged; the copy's first is
    # (a change), its second settles
    assert [r.action for r in auto.auto_log] == ["start", "change", "keep"]
    assert auto.auto_log[1].measured.batches == 12 and auto.auto_log[1].measured.choice == plan.Choice(2, 2)
    assert copy.num_workers == 1
    assert auto.num_workers == 2  # the original keeps its own setting (a framework left it behind)


def test_lightning_sampler_swap_goes_on_tuning():
    pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.utilities.data import _update_dataloader

    auto = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")
    auto._auto.decide = scripted(plan.Choice(0), plan.Choice(3, 2))
    swapped = _update_dataloader(auto, tud.SequentialSampler(auto.dataset))
    assert type(swapped) is fastcollate.DataLoader and swapped._auto is auto._auto  # taken in __init__
    got = epochs(swapped, 3)
    want = epochs(fastcollate.DataLoader(Squares(), batch_size=8, num_workers=2), 3)
    same_epochs(want, got)
    assert [r.after.workers for r in swapped.auto_log if r.action == "change"] == [0, 3]
    assert swapped.num_workers == 3


def test_accelerate_prepare_goes_on_tuning_and_settles_with_no_workers():
    accelerate = pytest.importorskip("accelerate")
    auto = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")
    prepared = accelerate.Accelerator(cpu=True).prepare(auto)
    got = epochs(prepared, 4)
    want = epochs(fastcollate.DataLoader(Squares(), batch_size=8, num_workers=0), 4)
    same_epochs(want, got)
    # 96 cheap in-memory samples: the workers cost more than they bring; the real decision says so
    assert prepared.num_workers == 0, [str(r) for r in prepared.auto_log]
    assert prepared.auto_log[0].action == "start" and any(r.action == "change" for r in prepared.auto_log)


def test_the_carried_int_is_a_plain_int_elsewhere():
    auto = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")
    n = auto.num_workers
    assert n == 2 and n + 1 == 3 and f"{n}" == "2" and repr(n) == "2" and hash(n) == hash(2)
    back = pickle.loads(pickle.dumps(n))
    assert type(back) is int and back == 2
    ctx = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto", multiprocessing_context="spawn")
    assert [len(e) for e in epochs(ctx, 1)] == [12]  # spawned workers get the number, not the tuner


def test_loaders_of_fixed_settings_are_untouched():
    fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")  # the wrapper installed
    plain = tud.DataLoader(Squares(), batch_size=8, num_workers=0)
    assert len(epochs(plain, 1)[0]) == 12
    assert type(plain) is tud.DataLoader and "_auto" not in plain.__dict__
    ours = fastcollate.DataLoader(Squares(), batch_size=8, num_workers=2)
    assert len(epochs(copy_of(ours), 1)[0]) == 12 and ours.auto_log == []


@pytest.mark.parametrize("framework", ["accelerate-2", "lightning-ddp"])
def test_two_processes_settle_with_no_workers_on_an_in_memory_dataset(framework):
    """accelerate launch and Lightning's DDP on 2 CPU processes, through the benchmark's own runner."""
    pytest.importorskip("accelerate" if framework.startswith("accelerate") else "pytorch_lightning")
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "auto_frameworks.py")
    spec = importlib.util.spec_from_file_location("auto_frameworks", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    got = bench.launch(framework, "memory", "auto", 3)
    assert got["workers"] == 0 and got["decisions"] >= 2 and len(got["rates"]) == 3, got


class Counting(tud.DataLoader):
    """A framework's loader whose own __iter__ calls torch's (LitData's, older accelerate's)."""

    passes = 0

    def __iter__(self):
        Counting.passes += 1
        return super().__iter__()


def test_a_subclass_with_its_own_iter_runs_it_once_a_pass_and_its_copies_made_by_type_are_tuned_too():
    auto = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto")
    auto._auto.decide = scripted(plan.Choice(0), plan.Choice(1, 2))
    copy = copy_of(auto, cls=Counting)
    want = epochs(fastcollate.DataLoader(Squares(), batch_size=8, num_workers=0), 3)
    same_epochs(want, epochs(copy, 3))
    assert Counting.passes == 3 and copy.num_workers == 1 and isinstance(copy, Counting)
    # Lightning's _update_dataloader calls type(loader)(...): an instance of the adopted class
    again = copy_of(copy, cls=type(copy))
    assert type(again) is type(copy)
    same_epochs(want[:2], epochs(again, 2))
    assert again.auto_log is auto.auto_log and Counting.passes == 5


def test_persistent_workers_read_false_while_the_tuner_runs_none_so_a_framework_can_re_create_it():
    auto = fastcollate.DataLoader(Squares(), batch_size=8, num_workers="auto", persistent_workers=True)
    auto._auto.decide = scripted(plan.Choice(0), plan.Choice(2, 2))
    epochs(auto, 2)
    assert auto.num_workers == 0 and auto.persistent_workers is False
    copy = copy_of(auto)  # torch would refuse persistent_workers=True with num_workers=0
    epochs(copy, 2)  # the copy's first epoch takes over (not judged), its second applies (2, 2)
    assert copy.num_workers == 2 and copy.persistent_workers is True
