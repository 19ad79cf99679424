"""pytest-benchmark groups for the peers table (``fastcollate bench --peers``): one epoch of each
workload through every peer installed, a persistent loader warmed first, side by side per
workload. The quick workloads (smaller image folder and token file) keep a run short.

    pytest benchmarks/bench_peers.py --benchmark-only --benchmark-group-by=group
"""
import pytest

from fastcollate._bench import peers as pb

WORKERS = 2


@pytest.fixture(scope="module")
def workloads(tmp_path_factory):
    yield {w.name: w for w in pb.build_workloads(True, str(tmp_path_factory.mktemp("peers")))}
    pb.close_ray()  # Ray Data's peers run in a process of their own: ended with the module


@pytest.mark.parametrize("workload", ["images", "tokens", "padded", "tabular"])
@pytest.mark.parametrize("peer", list(pb.PEERS))
def test_peer_epoch(benchmark, workloads, workload, peer):
    mod = next((m for p, m in pb._MODULES.items() if peer.startswith(p)), None)
    if mod is not None:
        try:
            pb._require(mod)  # Ray: found, not imported here (it runs in its own process)
        except ImportError:
            pytest.skip(f"{peer}: {mod} not installed")
    try:
        loader = pb.PEERS[peer](workloads[workload], WORKERS)
    except pb._Skip as why:
        pytest.skip(f"{peer}: {why}")
    pb._epoch(loader)  # workers up, caches warm
    benchmark.group = f"peers: {workload}"
    benchmark.extra_info["samples"] = pb._epoch(loader)[0]
    benchmark.pedantic(lambda: pb._epoch(loader), rounds=3, iterations=1)
