"""train_one_epoch on the CPU (no autocast by default there; bfloat16 autocast where asked)."""
import math

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate

import fastcollate
from fastcollate._bench import train_run as e2e


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x @ torch.randn(8, 1, generator=g)).squeeze(1)
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def fwd(model, batch):
    return torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])


def test_loss_decreases_over_epochs():
    model, data = _mlp(), _data(128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(data, batch_size=16, shuffle=True, collate_fn=fastcollate.collate,
                        generator=torch.Generator().manual_seed(0))
    losses = [fastcollate.train_one_epoch(model, loader, opt, forward=fwd).loss for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("fused", [False, True])
def test_same_seed_bitwise_identical_with_default_and_fastcollate(fused):
    def trajectory(collate_fn):
        model = e2e.small_convnet()
        torch.manual_seed(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=fused or None)
        ds = e2e.SyntheticImages(192)
        losses = []
        for epoch in range(3):
            loader = DataLoader(ds, batch_size=32, shuffle=True, collate_fn=collate_fn,
                                generator=torch.Generator().manual_seed(epoch))
            losses.append(fastcollate.train_one_epoch(model, loader, opt, forward=e2e._forward).loss)
        return losses, [p.detach().clone() for p in model.parameters()]

    torch.manual_seed(0)
    a, pa = trajectory(default_collate)
    torch.manual_seed(0)
    b, pb = trajectory(fastcollate.collate)
    assert a == b  # exact: speed must not change results
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))


@pytest.mark.parametrize("opt_name", ["sgd", "sgd-fused", "adamw", "adamw-fused"])
def test_nan_batch_is_skipped_and_counted_once(opt_name):
    model = _mlp()
    params = list(model.parameters())
    kind, _, fused = opt_name.partition("-")
    make = {"sgd": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=bool(fused) or None),
            "adamw": lambda: torch.optim.AdamW(params, lr=0.1, fused=bool(fused) or None)}[kind]
    opt = make()
    data = _data(48)
    batches = [default_collate(data[i:i + 16]) for i in range(0, 48, 16)]
    fastcollate.train_one_epoch(model, batches[:1], opt, forward=fwd)  # optimizer state exists now
    before = [p.detach().clone() for p in params]
    state_before = {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in s.items()} for k, s in opt.state.items()}
    bad = dict(batches[1])
    bad["x"] = bad["x"].clone()
    bad["x"][3, 2] = float("nan")
    stats = fastcollate.train_one_epoch(model, [bad], opt, forward=fwd)
    assert stats.skipped_steps == 1 and stats.optimizer_steps == 0 and math.isnan(stats.loss)
    assert all(torch.equal(a, p) for a, p in zip(before, params)), "parameters changed on a skipped step"
    for k, s in opt.state.items():
        for n, v in s.items():
            if torch.is_tensor(v):
                assert torch.equal(v, state_before[k][n]), f"optimizer state {n} changed"
    stats = fastcollate.train_one_epoch(model, [batches[2], bad, batches[0]], opt, forward=fwd)
    assert stats.skipped_steps == 1 and stats.optimizer_steps == 2 and math.isfinite(stats.loss)


def test_accumulation_equals_one_big_batch():
    data = _data(32)
    one = _mlp()
    acc = _mlp()
    opt1 = torch.optim.SGD(one.parameters(), lr=0.1)
    opt2 = torch.optim.SGD(acc.parameters(), lr=0.1)
    s1 = fastcollate.train_one_epoch(one, [default_collate(data)], opt1, forward=fwd, amp_dtype=None, max_grad_norm=None)
    s2 = fastcollate.train_one_epoch(acc, DataLoader(data, batch_size=8), opt2, forward=fwd, amp_dtype=None,
                                     max_grad_norm=None, accumulation_steps=4)
    assert s2.steps == 4 and s2.optimizer_steps == 1 and s1.optimizer_steps == 1
    for a, b in zip(one.parameters(), acc.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert abs(s1.loss - s2.loss) < 1e-5


def test_leftover_micro_steps_still_step():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = fastcollate.train_one_epoch(model, DataLoader(_data(40), batch_size=8), opt, forward=fwd,
                                        accumulation_steps=4)
    assert stats.steps == 5 and stats.optimizer_steps == 2


def test_loader_without_len():
    class Stream(IterableDataset):
        def __iter__(self):
            yield from _data(40)

    model = _mlp()
    stats = fastcollate.train_one_epoch(model, DataLoader(Stream(), batch_size=8, collate_fn=fastcollate.collate),
                                        torch.optim.SGD(model.parameters(), lr=0.1), forward=fwd)
    assert stats.steps == 5 and stats.samples_per_s > 0


def test_hf_style_loss_attribute_and_dict_output():
    class Out:
        def __init__(self, loss):
            self.loss = loss

    class HF(torch.nn.Module):
        def __init__(self, wrap):
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)
            self.wrap = wrap

        def forward(self, x, y):
            loss = torch.nn.functional.mse_loss(self.lin(x).squeeze(1), y)
            return self.wrap(loss)

    for wrap in (Out, lambda l: {"loss": l}, lambda l: l):
        m = HF(wrap)
        stats = fastcollate.train_one_epoch(m, DataLoader(_data(16), batch_size=8), torch.optim.SGD(m.parameters(), lr=0.1))
        assert stats.optimizer_steps == 2


def test_loss_fn_path_and_errors():
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(3)]
    m = torch.nn.Linear(3, 2)
    stats = fastcollate.train_one_epoch(m, data, torch.optim.SGD(m.parameters(), lr=0.1),
                                        loss_fn=torch.nn.functional.cross_entropy)
    assert stats.optimizer_steps == 3
    with pytest.raises(TypeError, match="loss_fn"):
        fastcollate.train_one_epoch(m, data, torch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="accumulation_steps"):
        fastcollate.train_one_epoch(m, data, torch.optim.SGD(m.parameters(), lr=0.1), accumulation_steps=0)


def test_fp16_parameters_with_a_scaler_are_refused():
    m = torch.nn.Linear(3, 1).half()
    with pytest.raises(ValueError, match="float16 parameters"):
        fastcollate.train_one_epoch(m, [], torch.optim.SGD(m.parameters(), lr=0.1),
                                    scaler=torch.amp.GradScaler("cpu"), loss_fn=torch.nn.functional.mse_loss)


def test_float16_autocast_uses_a_scaler_and_trains():
    model, data = _mlp(), _data(64)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    stats = fastcollate.train_one_epoch(model, DataLoader(data, batch_size=16), opt, forward=fwd,
                                        amp_dtype=torch.float16)
    assert stats.steps == 4 and stats.skipped_steps + stats.optimizer_steps == 4


def test_scheduler_and_stats_fields():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    stats = fastcollate.train_one_epoch(model, DataLoader(_data(32), batch_size=8), opt, forward=fwd, scheduler=sched)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 4)
    assert stats.data_wait_s >= 0 and stats.compute_s > 0 and stats.wall_s >= stats.compute_s


def test_no_host_sync_with_a_fused_optimizer(monkeypatch):
    """The only .item() calls are the final reads (three), whatever the number of steps."""
    calls = []
    real = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda self: calls.append(1) or real(self))
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    data = _data(160)
    batches = [fastcollate.collate(data[i:i + 8]) for i in range(0, 160, 8)]  # (a DataLoader .item()s its seed)
    fastcollate.train_one_epoch(model, batches, opt, forward=fwd)
    assert len(calls) == 3, len(calls)


def test_debug_logging(caplog):
    model = _mlp()
    with caplog.at_level("DEBUG", logger="fastcollate"):
        fastcollate.train_one_epoch(model, DataLoader(_data(16), batch_size=8), torch.optim.SGD(model.parameters(), lr=0.1),
                                    forward=fwd)
    msgs = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    assert len(msgs) == 2 and "x:[8, 8]" in msgs[0] and "optimizer step" in msgs[0]


def test_a_failing_step_is_logged_with_its_type_and_reraised(caplog):
    model = _mlp()

    def bad_forward(m, b):
        raise ZeroDivisionError("no")

    with caplog.at_level("ERROR", logger="fastcollate"), pytest.raises(ZeroDivisionError):
        fastcollate.train_one_epoch(model, DataLoader(_data(16), batch_size=8), torch.optim.SGD(model.parameters(), lr=0.1),
                                    forward=bad_forward)
    assert any("step 1 failed: ZeroDivisionError" in r.getMessage() for r in caplog.records)


def test_amp_dtype_auto_is_off_on_the_cpu_and_bf16_or_fp16_on_gpus(monkeypatch):
    from fastcollate.training.loop import resolve_amp_dtype

    assert resolve_amp_dtype("auto", torch.device("cpu")) is None
    assert resolve_amp_dtype(torch.bfloat16, torch.device("cpu")) is torch.bfloat16  # explicit: unchanged
    assert resolve_amp_dtype(torch.float32, torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_amp_dtype("auto", torch.device("cuda")) is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert resolve_amp_dtype("auto", torch.device("cuda")) is torch.float16
    with pytest.raises(ValueError, match="amp_dtype"):
        resolve_amp_dtype("bf16", torch.device("cpu"))


def test_default_on_the_cpu_equals_a_float32_run_bitwise():
    def run(**kw):
        model, data = _mlp(), _data(64)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        loader = DataLoader(data, batch_size=16, collate_fn=fastcollate.collate)
        stats = fastcollate.train_one_epoch(model, loader, opt, forward=fwd, **kw)
        return stats.loss, [p.detach().clone() for p in model.parameters()]

    (a, pa), (b, pb) = run(), run(amp_dtype=None)
    assert a == b and all(torch.equal(x, y) for x, y in zip(pa, pb))
    c, _ = run(amp_dtype=torch.bfloat16)
    assert c != a  # bf16 autocast changes the numbers: which is why it is not the CPU default
