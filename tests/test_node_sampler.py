"""NodeAffineSampler: every epoch is one permutation of the dataset over all ranks (padded or
trimmed exactly as DistributedSampler), each node keeps one fixed part of the dataset, and with one
node it is DistributedSampler index for index. The layout comes from explicit arguments, then
torch.distributed, then torchrun's environment, and a layout that cannot be right is refused."""
from __future__ import annotations

import collections
import doctest
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import fastcollate
from fastcollate.data import node_sampler
from fastcollate.data.node_sampler import NodeAffineSampler

LAUNCHER_VARS = ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    for var in LAUNCHER_VARS:  # the tests set what they need
        monkeypatch.delenv(var, raising=False)


def ranks(n, nodes, per_node, epoch=0, **kw):
    samplers = [NodeAffineSampler(range(n), num_replicas=nodes * per_node, rank=r, local_world_size=per_node, **kw)
                for r in range(nodes * per_node)]
    for s in samplers:
        s.set_epoch(epoch)
    return samplers, [list(s) for s in samplers]


COMBOS = [(n, m, k) for n in (0, 1, 2, 3, 5, 7, 10, 16, 31, 100, 101) for m in (1, 2, 3, 4, 8) for k in (1, 2, 3, 8)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_index_once_per_epoch_with_distributed_samplers_counts(drop_last, shuffle):
    for n, nodes, per_node in COMBOS:
        for epoch in (0, 3):
            where = f"n={n} nodes={nodes} per_node={per_node} drop_last={drop_last} shuffle={shuffle} epoch={epoch}"
            samplers, seen = ranks(n, nodes, per_node, epoch, drop_last=drop_last, shuffle=shuffle)
            ds = DistributedSampler(range(n), num_replicas=nodes * per_node, rank=0, drop_last=drop_last)
            assert [len(s) for s in samplers] == [len(x) for x in seen] == [len(ds)] * len(samplers), where
            counts = collections.Counter(i for x in seen for i in x)
            assert sum(counts.values()) == ds.total_size and set(counts) <= set(range(n)), where
            if drop_last:
                assert max(counts.values(), default=1) == 1, f"{where}: an index twice with drop_last"
                assert len(counts) == ds.total_size, where
            else:
                assert set(counts) == set(range(n)), f"{where}: missing {sorted(set(range(n)) - set(counts))}"
                assert sum(c - 1 for c in counts.values()) == ds.total_size - n, where


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_node_stays_in_its_part_which_never_changes(drop_last):
    for n, nodes, per_node in COMBOS:
        if n < nodes:
            continue  # a node with an empty part repeats the global order (next test)
        parts = None
        for epoch in range(3):
            samplers, seen = ranks(n, nodes, per_node, epoch, drop_last=drop_last)
            now = [samplers[k * per_node].partition() for k in range(nodes)]
            parts = parts or now
            assert now == parts, "the partition changed between epochs"
            for r, indices in enumerate(seen):
                assert set(indices) <= set(parts[r // per_node]), f"n={n} nodes={nodes}: rank {r} left its node's part"
        assert sorted(i for p in parts for i in p) == list(range(n))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_fewer_samples_than_nodes_an_empty_part_repeats_the_global_order():
    samplers, seen = ranks(3, 4, 2, epoch=1)
    assert [len(x) for x in seen] == [1] * 8
    assert set(i for x in seen for i in x) == {0, 1, 2}
    assert [samplers[k * 2].partition() == [] for k in range(4)].count(True) == 1


@pytest.mark.parametrize("n", [0, 1, 5, 16, 37, 100])
@pytest.mark.parametrize("replicas", [1, 2, 3, 8])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_one_node_is_distributed_sampler_exactly(n, replicas, shuffle, drop_last):
    for rank in range(replicas):
        ours = NodeAffineSampler(range(n), replicas, rank, shuffle, seed=7, drop_last=drop_last, nodes=1)
        theirs = DistributedSampler(range(n), replicas, rank, shuffle, seed=7, drop_last=drop_last)
        for epoch in (0, 1, 5):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)
        assert (ours.num_samples, ours.total_size) == (theirs.num_samples, theirs.total_size)


def test_order_changes_every_epoch_and_is_deterministic_per_seed_and_epoch():
    orders = [ranks(1000, 4, 2, epoch)[1] for epoch in range(4)]
    assert all(orders[e] != orders[e + 1] for e in range(3))
    assert ranks(1000, 4, 2, 2)[1] == orders[2]  # new samplers, same seed and epoch: the same
    other = ranks(1000, 4, 2, 2, seed=1)
    assert other[1] != orders[2]
    assert other[0][0].partition() != ranks(1000, 4, 2)[0][0].partition()  # the seed draws the partition too


def test_nodes_draw_independent_orders():
    # node k walks its part in the epoch permutation's order: not the same relative order on every node
    samplers, _ = ranks(400, 2, 1, epoch=0)
    rel = []
    for s in samplers:
        part = s.partition()
        rel.append([part.index(i) for i in s.node_order()])
    assert rel[0] != rel[1]


def test_shuffle_false_walks_each_part_in_ascending_order():
    samplers, seen = ranks(20, 2, 2, shuffle=False)
    assert samplers[0].node_order() == samplers[0].partition()
    assert seen[0] == samplers[0].partition()[0::2] and seen[1] == samplers[1].partition()[1::2]


def test_nodes_and_local_world_size_agree():
    a = NodeAffineSampler(range(50), num_replicas=8, rank=5, nodes=2)
    b = NodeAffineSampler(range(50), num_replicas=8, rank=5, local_world_size=4)
    c = NodeAffineSampler(range(50), num_replicas=8, rank=5, local_world_size=4, nodes=2)
    assert (a.nodes, a.local_world_size, a.node_rank, a.local_rank) == (2, 4, 1, 1)
    assert list(a) == list(b) == list(c)


def test_with_dataloaders_every_sample_once_and_set_epoch_reaches_it():
    data = torch.arange(60)
    for loader_class in (DataLoader, fastcollate.DataLoader):
        samplers = [NodeAffineSampler(data, num_replicas=6, rank=r, nodes=3) for r in range(6)]
        loaders = [loader_class(data, batch_size=4, sampler=s) for s in samplers]
        epochs = []
        for epoch in range(2):
            for s in samplers:
                s.set_epoch(epoch)
            got = [torch.cat(list(loader)).tolist() for loader in loaders]
            assert sorted(i for x in got for i in x) == list(range(60))
            epochs.append(got)
        assert epochs[0] != epochs[1]


def test_pickles_and_keeps_its_state():
    s = NodeAffineSampler(range(100), num_replicas=4, rank=3, nodes=2, seed=3)
    s.set_epoch(2)
    before = list(s)
    t = pickle.loads(pickle.dumps(s))
    assert t._owner is None and list(t) == before and t.epoch == 2


def test_layout_from_torchrun_environment(monkeypatch):
    # what torchrun sets on node 1 of 2, 4 ranks each, for local rank 2
    env = {"WORLD_SIZE": "8", "RANK": "6", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "2", "GROUP_RANK": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = NodeAffineSampler(range(64))
    assert (s.num_replicas, s.rank, s.nodes, s.local_world_size, s.node_rank, s.local_rank) == (8, 6, 2, 4, 1, 2)
    assert list(s) == list(NodeAffineSampler(range(64), 8, 6, local_world_size=4))
    # explicit arguments win over the environment
    t = NodeAffineSampler(range(64), num_replicas=4, rank=1, local_world_size=2)
    assert (t.nodes, t.node_rank, t.local_rank) == (2, 0, 1)
    with pytest.raises(ValueError, match="on node 3, but the environment's GROUP_RANK is 1"):
        NodeAffineSampler(range(64), nodes=4)  # rank 6 of 4 nodes of 2: not where torchrun put it


def test_layout_from_torch_distributed(monkeypatch, tmp_path):
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "99")  # an initialized process group wins over the environment
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        s = NodeAffineSampler(range(10))
        assert (s.num_replicas, s.rank, s.nodes) == (1, 0, 1)
        assert list(s) == list(DistributedSampler(range(10)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("env, match", [
    ({"GROUP_RANK": "0", "LOCAL_RANK": "2"}, "node 1, but the environment's GROUP_RANK is 0"),
    ({"NODE_RANK": "0"}, "node 1, but the environment's NODE_RANK is 0"),
    ({"GROUP_RANK": "1", "NODE_RANK": "0", "LOCAL_RANK": "3"}, "local rank 2, but the environment's LOCAL_RANK is 3"),
    ({"LOCAL_WORLD_SIZE": "four"}, "LOCAL_WORLD_SIZE='four' is not an integer"),
    ({"LOCAL_WORLD_SIZE": "3"}, "the environment's LOCAL_WORLD_SIZE=3 does not divide num_replicas=8"),
])
def test_an_environment_that_disagrees_is_refused(monkeypatch, env, match):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "6")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=match):
        NodeAffineSampler(range(64))
    if "LOCAL_WORLD_SIZE" not in env:  # explicit rank and node size: the environment is not consulted
        assert NodeAffineSampler(range(64), rank=6, local_world_size=4).node_rank == 1


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_replicas": 4, "rank": 4, "nodes": 2}, ValueError, r"rank 4 is not in \[0, 4\)"),
    ({"num_replicas": 4, "rank": -1, "nodes": 2}, ValueError, r"rank -1 is not in \[0, 4\)"),
    ({"num_replicas": 0, "rank": 0, "nodes": 1}, ValueError, "num_replicas must be >= 1"),
    ({"num_replicas": 6, "rank": 0, "nodes": 4}, ValueError, "nodes=4 does not divide num_replicas=6"),
    ({"num_replicas": 6, "rank": 0, "nodes": 0}, ValueError, "nodes=0 does not divide"),
    ({"num_replicas": 6, "rank": 0, "local_world_size": 4}, ValueError, "local_world_size=4 does not divide"),
    ({"num_replicas": 8, "rank": 0, "local_world_size": 2, "nodes": 2}, ValueError,
     "local_world_size=2 x nodes=2 is not num_replicas=8"),
    ({"num_replicas": 8, "rank": 0}, ValueError, "how many per node"),
])
def test_bad_arguments_say_what_is_wrong(kwargs, error, match):
    with pytest.raises(error, match=match):
        NodeAffineSampler(range(10), **kwargs)


def test_a_dataset_without_length_and_a_missing_node_are_refused():
    with pytest.raises(TypeError, match="must have a length"):
        NodeAffineSampler(iter(range(3)), num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"node 2 is not in \[0, 2\)"):
        NodeAffineSampler(range(10), num_replicas=2, rank=0, nodes=2).partition(2)


def test_single_process_default_is_one_rank_one_node():
    s = NodeAffineSampler(range(5), shuffle=False)
    assert (s.num_replicas, s.rank, s.nodes, list(s)) == (1, 0, 1, [0, 1, 2, 3, 4])


def test_docstring_examples_run():
    assert doctest.testmod(node_sampler).failed == 0
    assert "NodeAffineSampler" in fastcollate.__all__
