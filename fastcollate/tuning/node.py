"""This rank's share of the node: the cores and memory one rank of a launcher's job may plan with.

torchrun (and most launchers) start one process per GPU on a node and tell each its place in
``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``; each process sees the whole node's cores (its CPU affinity)
and memory. A rank that planned with all of them -- N ranks each starting ``cores`` workers, each
caching half the memory -- would overcommit the node N times. So the doctor, tune and the auto mode
plan with an equal share: the cores of the affinity mask divided by the ranks on the node that
share that mask (a launcher that pins each rank to its own cores gives each rank its own mask,
which is then its share as it is), and the available memory divided by the ranks on the node.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..core.launcher import local_ranks


def affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class NodeShare:
    """One rank's share of its node. ``ranks``: processes of the job on this node (1 outside a
    launcher); ``cores``: the cores this rank may plan with; ``memory_bytes``: likewise, of the
    memory available now; ``pinned``: the rank's affinity mask is smaller than the machine (a
    launcher pinned it), so its mask is its share."""

    ranks: int
    local_rank: int
    rank: int | None
    cores: int
    node_cores: int
    memory_bytes: int
    node_memory_bytes: int
    pinned: bool

    def describe(self) -> str:
        """One line for findings and reports."""
        if self.ranks <= 1:
            return f"{self.cores} cores"
        how = ("its own affinity mask (pinned by the launcher)" if self.pinned else
               f"{self.node_cores} cores / {self.ranks} ranks")
        return (f"rank {self.rank if self.rank is not None else self.local_rank} (local {self.local_rank} of "
                f"{self.ranks} on this node): {self.cores} core{'s' if self.cores != 1 else ''} ({how}) and "
                f"{self.memory_bytes / 2**30:.1f} of {self.node_memory_bytes / 2**30:.1f} GiB")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def share(available_bytes: int | None = None, ranks: int | None = None) -> NodeShare:
    """This rank's share of the node now (``ranks`` overrides what the environment says)."""
    n, local, rank = local_ranks()
    if ranks is not None:
        n = max(1, int(ranks))
    mine = affinity_cores()
    online = os.cpu_count() or mine
    pinned = n > 1 and mine < online and mine * n <= online
    cores = mine if pinned else max(1, mine // n)
    if available_bytes is None:
        from ..cache.room import memory_available

        available_bytes = memory_available()
    return NodeShare(ranks=n, local_rank=local, rank=rank, cores=cores, node_cores=mine if not pinned else online,
                     memory_bytes=int(available_bytes // n), node_memory_bytes=int(available_bytes), pinned=pinned)


def rank_label() -> str | None:
    """Which rank this process is, in words, under a launcher ("rank 3 (local 1 of 2 on
    this node)"); None outside one: what a trace or a report names as the rank it measured."""
    n, local, rank = local_ranks()
    if n <= 1 and rank is None:
        return None
    return f"rank {rank if rank is not None else local} (local {local} of {n} on this node)"


__all__ = ["NodeShare", "share", "local_ranks", "affinity_cores", "rank_label"]
