"""train_one_epoch: the usual mixed-precision loop, done right and without per-step host syncs.

Order on every optimizer step: backward -> unscale_ -> clip_grad_norm_ -> step -> update.
Non-finite loss or gradient norm: the step is skipped (parameters and optimizer state
untouched) and counted. How the skip is decided, by optimizer:
  * fused optimizers (``fused=True`` Adam, AdamW, SGD, Adagrad -- anything with
    ``_step_supports_amp_scaling``): ``found_inf`` stays on the device and the fused kernel skips
    the update itself; no host sync at all;
  * float16 with a GradScaler and a non-fused optimizer: GradScaler.step's own check (it reads
    found_inf on the host once per optimizer step -- torch's behaviour);
  * any other optimizer: one host read of the finite flag per optimizer step (not per
    micro-step), the cheapest exact check there is.
Losses accumulate on the device and are read once at the end (or every ``log_every``
optimizer steps when asked).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator

import torch

from ..core import trace as _trace
from ..core.tree import iter_tensors, map_tensors

logger = logging.getLogger("fastcollate")


@dataclasses.dataclass
class EpochStats:
    loss: float               # mean loss over the micro-steps whose optimizer step counted
    steps: int                # micro-steps (batches)
    optimizer_steps: int      # optimizer steps taken
    skipped_steps: int        # optimizer steps skipped for a non-finite loss or gradient norm
    samples_per_s: float
    data_wait_s: float        # host time blocked waiting for the next batch
    compute_s: float          # step time: CUDA events on the GPU (read at the end), host time on CPU
    wall_s: float = 0.0


def _batch_size(batch: Any) -> int:
    for t in iter_tensors(batch):
        return int(t.shape[0]) if t.dim() else 1
    return len(batch) if hasattr(batch, "__len__") else 0


def _shapes(batch: Any) -> str:
    if isinstance(batch, Mapping):
        return ", ".join(f"{k}:{list(v.shape)}" for k, v in batch.items() if isinstance(v, torch.Tensor))
    return ", ".join(str(list(t.shape)) for t in iter_tensors(batch))


def compute_loss(model: torch.nn.Module, batch: Any, forward: Callable | None, loss_fn: Callable | None) -> torch.Tensor:
    """forward(model, batch) when given; a dict batch -> model(**batch) and its ``.loss`` (HF
    style) or the returned tensor; an (x, y) batch -> loss_fn(model(x), y)."""
    if forward is not None:
        return forward(model, batch)
    if isinstance(batch, Mapping):
        out = model(**batch)
        if isinstance(out, torch.Tensor):
            return out
        loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
        if loss is None:
            raise TypeError(f"train_one_epoch: model(**batch) returned {type(out).__name__} without a .loss; "
                            "pass forward=")
        return loss
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        if loss_fn is None:
            raise TypeError("train_one_epoch: an (x, y) batch needs loss_fn= (or forward=)")
        x, y = batch
        return loss_fn(model(x), y)
    raise TypeError(f"train_one_epoch: cannot turn a {type(batch).__name__} batch into a loss; pass forward=")


def _lookahead(it: Iterator) -> Iterator[tuple[Any, bool, float, Any]]:
    """(item, is_last, seconds waited, its trace id) -- works for loaders without len()."""
    t0 = time.perf_counter()
    try:
        cur = next(it)
    except StopIteration:
        return
    waited, cur_id = time.perf_counter() - t0, _trace.last_id()
    while True:
        t0 = time.perf_counter()
        try:
            nxt = next(it)
        except StopIteration:
            yield cur, True, waited, cur_id
            return
        fetched = time.perf_counter() - t0  # measured before the yield: the step's compute is not a wait
        nxt_id = _trace.last_id()  # read now: the next batch has already been fetched
        yield cur, False, waited, cur_id
        cur, waited, cur_id = nxt, fetched, nxt_id


def _grad_norm(params: list[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    if max_norm is not None:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, error_if_nonfinite=False)
    if not grads:
        return torch.zeros(())
    if hasattr(torch.nn.utils, "get_total_norm"):
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def resolve_amp_dtype(amp_dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype | None:
    """The autocast dtype ``train_one_epoch`` uses: None for no autocast."""
    if isinstance(amp_dtype, str):
        if amp_dtype != "auto":
            raise ValueError(f"train_one_epoch: amp_dtype must be a dtype, None or 'auto', got {amp_dtype!r}")
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return None if amp_dtype in (None, torch.float32) else amp_dtype


def train_one_epoch(
    model: torch.nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    *,
    device: str | torch.device | None = None,
    amp_dtype: torch.dtype | str | None = "auto",
    scaler: Any = "auto",
    max_grad_norm: float | None = 1.0,
    accumulation_steps: int = 1,
    scheduler: Any = None,
    monitor: Any = None,
    loss_fn: Callable | None = None,
    forward: Callable | None = None,
    log_every: int = 0,
) -> EpochStats:
    """One epoch of mixed-precision training with a NaN guard and no per-step host sync.

    Args:
        device: where the model runs (default: its parameters' device); CPU batches are moved
            there with ``non_blocking=True`` (a CudaPrefetcher already delivers them there).
        amp_dtype: autocast dtype (bfloat16, float16), None/float32 for no autocast, or ``"auto"``
            (default): bfloat16 on a GPU that supports it, float16 (with a GradScaler) on one that
            does not, no autocast on the CPU (bf16 autocast there is slower without native bf16
            and changes the numbers).
        scaler: ``"auto"`` makes a GradScaler for float16 only; or a GradScaler, or None.
        accumulation_steps: micro-steps per optimizer step; the loss is divided by it; DDP's
            ``no_sync()`` on the micro-steps in between.
        scheduler: stepped after every optimizer step (skipped ones included).
        monitor: a StallMonitor, fed data-wait and compute times.
        log_every: read the device counters every N optimizer steps and log them (INFO); 0 never.

    >>> import torch, fastcollate
    >>> model = torch.nn.Linear(4, 1)
    >>> data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)]
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> stats = fastcollate.train_one_epoch(model, data, opt, loss_fn=torch.nn.functional.mse_loss)
    >>> stats.steps, stats.optimizer_steps
    (3, 3)
    """
    if accumulation_steps < 1:
        raise ValueError(f"train_one_epoch: accumulation_steps must be >= 1, got {accumulation_steps}")
    params = [p for p in model.parameters() if p.requires_grad]
    dev = torch.device(device) if device is not None else (params[0].device if params else torch.device("cpu"))
    dtype = resolve_amp_dtype(amp_dtype, dev)
    if scaler == "auto":
        scaler = torch.amp.GradScaler(dev.type) if dtype == torch.float16 else None
    if scaler is not None and any(p.dtype == torch.float16 for p in params):
        raise ValueError("train_one_epoch: the model has float16 parameters; GradScaler cannot unscale float16 "
                         "gradients. Keep parameters in float32 and use amp_dtype=torch.float16 (autocast), or "
                         "pass scaler=None with bfloat16.")
    fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    on_cuda = dev.type == "cuda"

    zero = torch.zeros((), device=dev)
    loss_sum, counted, skipped = zero.clone(), zero.clone(), zero.clone()
    window_loss, window_n = zero.clone(), zero.clone()
    events: list[tuple[Any, Any]] = []
    steps = opt_steps = samples = 0
    data_wait = host_compute = 0.0
    micro = 0
    model.train()
    t_start = time.perf_counter()
    if monitor is not None:
        monitor.start()
    try:
        for batch, last, waited, batch_id in _lookahead(iter(loader)):
            data_wait += waited
            if monitor is not None:
                monitor.record_wait(waited, batch_id=batch_id)
            t0 = time.perf_counter()
            if on_cuda:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
            batch = map_tensors(batch, lambda t: t if t.device == dev else t.to(dev, non_blocking=True))
            micro += 1
            boundary = micro == accumulation_steps or last
            sync_ctx = model.no_sync() if (ddp and not boundary) else contextlib.nullcontext()
            with sync_ctx:
                with torch.amp.autocast(dev.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                    loss = compute_loss(model, batch, forward, loss_fn)
                if loss.dim() != 0:
                    raise ValueError(f"train_one_epoch: the loss must be a scalar, got shape {list(loss.shape)}")
                scaled = loss.float() / accumulation_steps
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            window_loss += loss.detach().float()
            window_n += 1
            steps += 1
            n = _batch_size(batch)
            samples += n
            if boundary:
                if scaler is not None:
                    scaler.unscale_(optimizer)
                norm = _grad_norm(params, max_grad_norm).to(dev)
                found_inf = (~(torch.isfinite(norm) & torch.isfinite(window_loss))).float()
                if scaler is not None:
                    scaler.step(optimizer)  # skips on its own found_inf (non-finite grads)
                    scaler.update()
                elif fused:
                    optimizer.grad_scale, optimizer.found_inf = None, found_inf  # the fused kernel skips on the device
                    try:
                        optimizer.step()
                    finally:
                        del optimizer.grad_scale, optimizer.found_inf
                elif not bool(found_inf.item()):  # the one host read per optimizer step (non-fused)
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if scheduler is not None:
                    scheduler.step()
                bad = found_inf.bool()  # where(), not a product: NaN * 0 is NaN
                loss_sum += torch.where(bad, zero, window_loss)
                counted += torch.where(bad, zero, window_n)
                skipped += found_inf
                window_loss.zero_()
                window_n.zero_()
                micro = 0
                opt_steps += 1
                if log_every and opt_steps % log_every == 0:
                    logger.info("step %d: mean loss %.6g, skipped %d", opt_steps,
                                (loss_sum / counted.clamp_min(1)).item(), int(skipped.item()))
            if on_cuda:
                ev[1].record()
                events.append(ev)
            dt = time.perf_counter() - t0
            host_compute += dt
            if monitor is not None:
                monitor.record_compute(dt, ev if on_cuda else None, batch_id=batch_id)
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("step %d: batch %d [%s] %.2f ms (wait %.2f ms) %s", steps, n, _shapes(batch), dt * 1e3,
                             waited * 1e3, "optimizer step" if boundary else "accumulate")
    except Exception as exc:  # logged with where it happened, re-raised unchanged
        logger.error("train_one_epoch: step %d failed: %s: %s", steps + 1, type(exc).__name__, exc)
        raise

    if ddp and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        # the epoch's one collective: the loss averaged over every rank's counted micro-steps
        # (skips agree across ranks: DDP all-reduces the gradients the guard looks at)
        world = torch.distributed.get_world_size()
        totals = torch.stack([loss_sum, counted, skipped])
        torch.distributed.all_reduce(totals)
        loss_sum, counted, skipped = totals[0], totals[1], totals[2] / world
    # the one synchronization of the epoch
    total, count, nskip = loss_sum.item(), counted.item(), int(round(skipped.item()))
    if on_cuda:
        torch.cuda.current_stream(dev).synchronize()
        compute = sum(a.elapsed_time(b) for a, b in events) / 1e3
    else:
        compute = host_compute
    wall = time.perf_counter() - t_start
    if monitor is not None:
        monitor.stop()
    if nskip:
        logger.warning("train_one_epoch: skipped %d of %d optimizer steps (non-finite loss or gradient norm)",
                       nskip, opt_steps)
    return EpochStats(
        loss=total / count if count else math.nan,
        steps=steps,
        optimizer_steps=opt_steps - nskip,
        skipped_steps=nskip,
        samples_per_s=samples / wall if wall > 0 else 0.0,
        data_wait_s=data_wait,
        compute_s=compute,
        wall_s=wall,
    )
