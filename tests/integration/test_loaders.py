"""Frameworks that re-create a fastcollate.DataLoader from its attributes -- accelerate's
prepare(), Lightning's fit -> predict and sampler swap -- and torchdata's resumable loader:
batches identical to the framework's default, and the ring kept (ring hits > 0)."""
import pytest
import torch
import torch.utils.data as tud

import fastcollate
from helpers import assert_resumes_as_torchdata, assert_same


class Imgs(tud.Dataset):
    def __init__(self, n=48):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(8, generator=g), "y": torch.tensor(float(i % 2)), "i": i}


def _ring_hits(loader):
    return loader.collate_fn.stats()["ring_hits"]


def _same_batches(got, want):
    for a, b in zip(got, want, strict=True):  # one at a time, as a training loop holds them
        assert_same(a, b)


@pytest.mark.parametrize("first_iter", [False, True])
def test_accelerate_prepare_keeps_the_ring(first_iter):
    accelerate = pytest.importorskip("accelerate")
    loader = fastcollate.DataLoader(Imgs(), batch_size=4, num_workers=2)
    if first_iter:
        next(iter(loader))  # a sanity check before prepare(): the case that once yielded RingHandles
    prepared = accelerate.Accelerator(cpu=True).prepare(loader)
    before = _ring_hits(prepared)
    _same_batches(prepared, tud.DataLoader(Imgs(), batch_size=4))
    assert _ring_hits(prepared) - before == 12


def _lightning():
    return pytest.importorskip("pytorch_lightning")


def _module(pl):
    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)
            self.seen = []

        def training_step(self, batch, _):
            self.seen.append(batch["i"].tolist())
            return torch.nn.functional.mse_loss(self.lin(batch["x"]).squeeze(1), batch["y"])

        def predict_step(self, batch, _):
            return self.lin(batch["x"]).detach()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net()


def _trainer(pl):
    return pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)


def test_lightning_fit_then_predict_on_the_same_loader():
    pl = _lightning()

    def run(make):
        torch.manual_seed(0)
        net = _module(pl)
        loader = make()
        _trainer(pl).fit(net, train_dataloaders=loader)
        preds = _trainer(pl).predict(net, dataloaders=loader)
        return net, loader, preds

    ours_net, ours, ours_preds = run(lambda: fastcollate.DataLoader(Imgs(), batch_size=4, num_workers=2))
    theirs_net, _, theirs_preds = run(lambda: tud.DataLoader(Imgs(), batch_size=4, num_workers=2))
    assert ours_net.seen == theirs_net.seen and len(ours_net.seen) == 24
    assert all(torch.equal(a, b) for a, b in zip(ours_preds, theirs_preds)) and len(ours_preds) == 12
    assert all(torch.equal(a, b) for a, b in zip(ours_net.parameters(), theirs_net.parameters()))
    assert ours.stats()["ring_hits"] > 0


def test_lightning_sampler_swap_recreates_a_working_loader():
    pl = _lightning()
    from pytorch_lightning.utilities.data import _update_dataloader

    loader = fastcollate.DataLoader(Imgs(), batch_size=4, num_workers=2)
    next(iter(loader))
    sampler = tud.distributed.DistributedSampler(Imgs(), num_replicas=2, rank=1, shuffle=False)
    swapped = _update_dataloader(loader, sampler)
    assert isinstance(swapped, fastcollate.DataLoader)
    want = tud.DataLoader(Imgs(), batch_size=4, sampler=sampler)
    _same_batches(swapped, want)
    assert swapped.stats()["ring_hits"] == 6


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_loader_resumes_exactly(workers):
    pytest.importorskip("torchdata")
    assert_resumes_as_torchdata(Imgs, workers, head=5, batches=12, ring_hits=7)


def test_plain_loader_is_not_stateful_as_torchs_is_not():
    # an attribute torch's loader lacks would make hasattr-based protocols take it for stateful
    loader = fastcollate.DataLoader(Imgs(), batch_size=4)
    assert not hasattr(loader, "state_dict") and not hasattr(loader, "load_state_dict")
    pytest.importorskip("torchdata")
    assert hasattr(fastcollate.StatefulDataLoader(Imgs(), batch_size=4), "state_dict")


@pytest.mark.parametrize("workers", [0, 2])
def test_lightning_default_fit_with_checkpointing(tmp_path, workers):
    # a plain Trainer(...).fit on fastcollate.DataLoader: Lightning checkpoints at the end of each
    # epoch and asks stateful loaders for their state (this once raised TypeError there)
    pl = _lightning()

    def run(make, root):
        torch.manual_seed(0)
        net = _module(pl)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, default_root_dir=str(root), logger=False,
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(net, train_dataloaders=make())
        return net, trainer

    ours, trainer = run(lambda: fastcollate.DataLoader(Imgs(), batch_size=4, num_workers=workers), tmp_path / "ours")
    theirs, _ = run(lambda: tud.DataLoader(Imgs(), batch_size=4, num_workers=workers), tmp_path / "theirs")
    assert ours.seen == theirs.seen and len(ours.seen) == 24
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
    ckpt = trainer.checkpoint_callback.best_model_path or trainer.checkpoint_callback.last_model_path
    assert ckpt and __import__("os").path.exists(ckpt)
