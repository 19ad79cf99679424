"""NodeAffineSampler: each node keeps a fixed share of the dataset, reshuffled inside every epoch,
so that a node-wide cache holds 1/M of the dataset and serves every fetch from the second epoch."""
from __future__ import annotations

import math
import os
from typing import Iterator, Sized

import torch
from torch.utils.data import Sampler

# the partition's generator is seeded apart from the epochs' (``seed + epoch``): without the salt,
# epoch 0's order and the partition would be the same draw
PARTITION_SALT = 0x6E6F64655F616666  # b"node_aff"
_U64 = (1 << 64) - 1


class NodeAffineSampler(Sampler[int]):
    """``DistributedSampler``'s arguments and epochs, with each node's ranks confined to a fixed
    share of the dataset: a node-wide cache then holds 1/M of the dataset and, once filled in the
    first epoch, serves every later fetch.

    The dataset's ``n`` indices are split once, by a random permutation seeded with ``seed`` alone,
    into ``nodes`` (M) parts whose sizes differ by at most one; the partition is the same in every
    epoch. Each epoch, ``set_epoch(e)`` draws the permutation DistributedSampler draws
    (``torch.randperm(n)`` seeded with ``seed + e``; ``range(n)`` with ``shuffle=False``), and node k
    takes its own part in that permutation's order: a uniform random order of its part, independent
    of the other nodes'. That list is padded or trimmed exactly as DistributedSampler pads or trims
    its own -- to ``local_world_size * num_samples``, where ``num_samples`` is DistributedSampler's
    -- and local rank l takes every ``local_world_size``-th index from position l:

    * every rank yields ``len(sampler)`` indices, the same count as DistributedSampler's on every
      rank (a rank with fewer steps would hang DDP's all-reduce);
    * without ``drop_last`` the ranks together yield every index of the dataset once per epoch,
      plus ``total_size - n`` repeats, each node repeating its own part from its start; a node
      whose part is empty (fewer samples than nodes) repeats the epoch's global order;
    * with ``drop_last`` no index is yielded twice, and ``n - total_size`` are left out, each node
      leaving out the tail of its epoch order (so a different few every epoch).

    With one node (``nodes == 1``) it is DistributedSampler: the same indices on every rank, in the
    same order, every epoch, ``shuffle`` and ``drop_last`` either way. With M > 1 each epoch is still
    one permutation of the dataset over all ranks, and each step's global batch is drawn from every
    part equally (stratified) instead of from the whole dataset; a node never sees the other
    parts. docs/node.md says what that changes statistically and by how much.

    Where the layout comes from, each argument on its own (explicit arguments win):

    * ``num_replicas``: the argument, else ``torch.distributed``'s world size when initialized, else
      the environment's ``WORLD_SIZE``, else 1; ``rank``: likewise with ``dist.get_rank()`` and
      ``RANK``, else 0;
    * the node size: ``local_world_size``, else ``num_replicas // nodes``, else the environment's
      ``LOCAL_WORLD_SIZE`` (torchrun sets it to ``--nproc-per-node``), else one node when
      ``num_replicas`` is 1; anything else is an error, since guessing would silently give a
      multi-node job one node's sampler;
    * the node of a rank is ``rank // local_world_size`` and its local rank ``rank %
      local_world_size``: torchrun numbers the ranks of a node contiguously (the global rank is
      ``GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``). Unless ``rank`` and the node size are both
      explicit, the environment's ``GROUP_RANK`` (torchrun; else ``NODE_RANK``, which Lightning
      and other launchers set) and ``LOCAL_RANK`` must agree with that, or the sampler refuses:
      its nodes would not be the machines.

    >>> parts = [NodeAffineSampler(range(10), num_replicas=4, rank=r, local_world_size=2) for r in range(4)]
    >>> [len(p) for p in parts]
    [3, 3, 3, 3]
    >>> sorted(i for p in parts for i in p)   # every index once, plus DistributedSampler's 2 repeats
    [0, 1, 2, 3, 4, 4, 5, 5, 6, 7, 8, 9]
    >>> set(parts[0]) | set(parts[1]) == set(parts[0].partition())   # node 0's ranks: node 0's part
    True
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, *,
                 local_world_size: int | None = None, nodes: int | None = None) -> None:
        if not hasattr(dataset, "__len__"):
            raise TypeError(f"NodeAffineSampler: the dataset must have a length (a map-style dataset), "
                            f"got {type(dataset).__name__}")
        explicit = rank is not None and (local_world_size is not None or nodes is not None)
        num_replicas, rank = _world(num_replicas, rank)
        local_world_size = _node_size(num_replicas, local_world_size, nodes)
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.local_world_size = local_world_size
        self.nodes = num_replicas // local_world_size
        self.node_rank, self.local_rank = divmod(rank, local_world_size)
        if not explicit:
            _check_environment(self.node_rank, self.local_rank)
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._owner: torch.Tensor | None = None  # node of each index, made when first needed

    # DistributedSampler's counts, from the dataset's length now
    @property
    def num_samples(self) -> int:
        n, r = len(self.dataset), self.num_replicas
        if self.drop_last and n % r != 0:
            return math.ceil((n - r) / r)
        return math.ceil(n / r)

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """The epoch's order is drawn with ``seed + epoch``; the partition never changes."""
        self.epoch = epoch

    def owners(self) -> torch.Tensor:
        """The node of every index (int32, ``[n]``): the fixed partition."""
        n = len(self.dataset)
        if self._owner is None or len(self._owner) != n:
            if self.nodes == 1:
                self._owner = torch.zeros(n, dtype=torch.int32)
            else:
                g = torch.Generator().manual_seed((self.seed ^ PARTITION_SALT) & _U64)
                sizes = torch.tensor([n // self.nodes + (k < n % self.nodes) for k in range(self.nodes)])
                labels = torch.repeat_interleave(torch.arange(self.nodes, dtype=torch.int32), sizes)
                self._owner = torch.empty(n, dtype=torch.int32)
                self._owner[torch.randperm(n, generator=g)] = labels
        return self._owner

    def partition(self, node: int | None = None) -> list[int]:
        """The indices of ``node``'s part (this rank's node by default), ascending."""
        node = self.node_rank if node is None else node
        if not 0 <= node < self.nodes:
            raise ValueError(f"NodeAffineSampler: node {node} is not in [0, {self.nodes})")
        return torch.nonzero(self.owners() == node).flatten().tolist()

    def node_order(self) -> list[int]:
        """This node's indices for the epoch, padded or trimmed: its ranks' indices, interleaved."""
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        mine = order if self.nodes == 1 else order[self.owners()[order] == self.node_rank]
        want = self.local_world_size * self.num_samples
        if self.drop_last:
            return mine[:want].tolist()
        source = mine if len(mine) else order  # an empty part (n < nodes) repeats the global order
        return mine.tolist() + _repeat(source.tolist(), want - len(mine))

    def __iter__(self) -> Iterator[int]:
        return iter(self.node_order()[self.local_rank::self.local_world_size])

    def __len__(self) -> int:
        return self.num_samples

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_owner"] = None  # recomputed where it is needed
        return state


def _repeat(indices: list[int], count: int) -> list[int]:
    """The first ``count`` indices of ``indices`` repeated (DistributedSampler's padding)."""
    if count <= 0 or not indices:
        return []
    return (indices * math.ceil(count / len(indices)))[:count]


def _env_int(name: str) -> int | None:
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"NodeAffineSampler: the environment's {name}={text!r} is not an integer") from None


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    import torch.distributed as dist

    ddp = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if ddp else (_env_int("WORLD_SIZE") or 1)
    if rank is None:
        rank = dist.get_rank() if ddp else (_env_int("RANK") or 0)
    if num_replicas < 1:
        raise ValueError(f"NodeAffineSampler: num_replicas must be >= 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"NodeAffineSampler: rank {rank} is not in [0, {num_replicas})")
    return num_replicas, rank


def _node_size(num_replicas: int, local_world_size: int | None, nodes: int | None) -> int:
    if nodes is not None:
        if nodes < 1 or num_replicas % nodes:
            raise ValueError(f"NodeAffineSampler: nodes={nodes} does not divide num_replicas={num_replicas}: "
                             f"every node must run the same number of ranks")
        if local_world_size is not None and local_world_size * nodes != num_replicas:
            raise ValueError(f"NodeAffineSampler: local_world_size={local_world_size} x nodes={nodes} is not "
                             f"num_replicas={num_replicas}")
        local_world_size = num_replicas // nodes
    where = "local_world_size"
    if local_world_size is None:
        local_world_size, where = _env_int("LOCAL_WORLD_SIZE"), "the environment's LOCAL_WORLD_SIZE"
    if local_world_size is None:
        if num_replicas == 1:
            return 1
        raise ValueError(f"NodeAffineSampler: {num_replicas} ranks, but how many per node? Pass "
                         f"local_world_size= (or nodes=); torchrun sets LOCAL_WORLD_SIZE")
    if local_world_size < 1 or num_replicas % local_world_size:
        raise ValueError(f"NodeAffineSampler: {where}={local_world_size} does not divide num_replicas="
                         f"{num_replicas}: every node must run the same number of ranks")
    return local_world_size


def _check_environment(node_rank: int, local_rank: int) -> None:
    """The launcher's own node and local rank, where it says them, agree with the sampler's."""
    name = "GROUP_RANK" if "GROUP_RANK" in os.environ else "NODE_RANK"
    for var, ours, what in ((name, node_rank, "node"), ("LOCAL_RANK", local_rank, "local rank")):
        theirs = _env_int(var)
        if theirs is not None and theirs != ours:
            raise ValueError(f"NodeAffineSampler: rank // local_world_size puts this rank on {what} {ours}, but "
                             f"the environment's {var} is {theirs}: the launcher does not number a node's ranks "
                             f"contiguously. Pass rank= and local_world_size= (or nodes=) explicitly")
