"""Where a launcher put this process: the environment torchrun, torch.distributed.launch and
SLURM's srun set, read in one place (the node-wide cache and this rank's share of the node both
depend on it, and must agree)."""
from __future__ import annotations

import os


def int_env(name: str) -> int | None:
    """An integer environment variable; None when unset, empty or not an integer."""
    v = os.environ.get(name, "").strip()
    try:
        return int(v) if v else None
    except ValueError:
        return None


def local_ranks() -> tuple[int, int, int | None]:
    """(ranks on this node, this one's local rank, its global rank) from the launcher's
    environment, (1, 0, None) outside one."""
    ranks = int_env("LOCAL_WORLD_SIZE") or int_env("SLURM_NTASKS_PER_NODE") or 1
    local = int_env("LOCAL_RANK")
    if local is None:
        local = int_env("SLURM_LOCALID") or 0
    rank = int_env("RANK")
    if rank is None:
        rank = int_env("SLURM_PROCID")
    return max(1, ranks), max(0, local), rank


__all__ = ["int_env", "local_ranks"]
