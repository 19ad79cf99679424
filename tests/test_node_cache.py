"""The node-wide fastcollate.Cached (fastcollate.cache.per_node): ranks of one job on one node
share one cache -- the same memfds, what one inserts every other hits, exactly; the default
max_bytes computed once, by the rank that makes the cache; a key holding another dataset refused
with one message; a rank killed mid-insert takes nothing from the others and its restart rejoins;
a registry's pid that now names another process holding another file is never trusted; how the
environment picks private or shared. The ranks are processes of tests/node_cache_rank.py, driven
request by request (no timing). Under torchrun itself: tests/node_cache_train.py, 2 and 4 ranks."""
from __future__ import annotations

import copy
import gc
import json
import os
import select
import signal
import subprocess
import sys
import uuid

import pytest
import torch
from torch.utils.data import DataLoader

import fastcollate
from fastcollate.core.shm import segment_fd
from fastcollate.cache import per_node as cache_node
from procs import processes_with

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANK = os.path.join(ROOT, "tests", "node_cache_rank.py")
TRAIN = os.path.join(ROOT, "tests", "node_cache_train.py")
SHARDS = os.path.join(ROOT, "tests", "node_cache_shards.py")
LAUNCH_ENV = ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID",
              "SLURM_STEP_ID", "SLURM_NTASKS_PER_NODE", cache_node.ENV_GROUP, cache_node.ENV_DIR)


# a stand-in for torchrun's agent: the rank's parent, alive until the test kills it
AGENT = "import signal, subprocess, sys; subprocess.Popen(sys.argv[1:]).wait(); signal.pause()"


class Rank:
    """A rank process the test drives; answers are JSON, errors come back as {"error": ...}.
    ``agent``: started under a stand-in agent (``proc`` is then the agent)."""

    def __init__(self, env: dict, local_rank: int, log, agent: bool = False) -> None:
        env = dict(env, LOCAL_RANK=str(local_rank))
        cmd = [sys.executable, RANK] if not agent else [sys.executable, "-c", AGENT, sys.executable, RANK]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     env=env, cwd=ROOT)
        self.log, self.agent = log, agent

    def ask(self, op: str, **kw) -> dict:
        self.proc.stdin.write(json.dumps(dict(kw, op=op)) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], 300)  # a hang guard, not a time bound
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.log.flush()
            with open(self.log.name) as f:
                raise AssertionError(f"the rank process did not answer {op}: {f.read()[-3000:]}")
        return json.loads(line)

    def ok(self, op: str, **kw) -> dict:
        got = self.ask(op, **kw)
        assert "error" not in got, got["error"]
        return got

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the rank's end of its requests: it exits
            if self.agent:  # a stand-in agent waits to be killed
                self.kill()
                return
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def node(tmp_path):
    """Starts ranks of one job (a run id of its own, a registry directory of its own)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               LOCAL_WORLD_SIZE="2", TORCHELASTIC_RUN_ID=f"test-{uuid.uuid4().hex}",
               FASTCOLLATE_NODE_DIR=str(tmp_path / "registry"))
    ranks: list[Rank] = []
    log = open(tmp_path / "ranks.log", "w")

    def start(local_rank: int, agent: bool = False, **more: str) -> Rank:
        ranks.append(Rank(dict(env, **more), local_rank, log, agent))
        return ranks[-1]

    start.env = env
    yield start
    for r in ranks:
        r.close()
    log.close()


def _gone(pid: int) -> bool:
    """Waits for process pid to end (a hang guard, not a time bound); whether it did."""
    from fastcollate.core.shm import pid_alive
    from helpers import wait_until

    return wait_until(lambda: not pid_alive(pid), timeout=120, poll=0.1)


def test_two_ranks_share_one_cache(node):
    a, b = node(0), node(1)
    ra, rb = a.ok("open", n=32), b.ok("open", n=32)
    assert ra["node"] and rb["node"] and ra["key"] == rb["key"] == "__main__.Numbers#0"
    assert ra["inodes"] == rb["inodes"], "two caches, not one"
    assert (ra["made"], rb["made"]) == (True, False) and ra["max_bytes"] == rb["max_bytes"]
    got = a.ok("fetch", idx=list(range(16)))  # rank 0 inserts half
    assert got["stats"]["rank"]["misses"] == 16 and got["stats"]["holders"] == 2
    got = b.ok("fetch", idx=list(range(32)))  # rank 1 hits that half (checked exact in the rank), inserts the rest
    assert got["fetched"] == [0] * 16 + [1] * 16
    assert (got["stats"]["rank"]["hits"], got["stats"]["rank"]["misses"], got["stats"]["rank"]["inserts"]) == \
        (16, 16, 16)
    got = a.ok("fetch", idx=list(range(32)))
    assert got["fetched"] == [1] * 16 + [0] * 16  # what rank 1 inserted, rank 0 never fetched
    s = got["stats"]
    assert (s["hits"], s["misses"], s["inserts"]) == (48, 32, 32)  # the node's sums
    assert (s["rank"]["hits"], s["rank"]["misses"], s["rank"]["inserts"]) == (32, 16, 16)  # rank 0's own
    assert s["node"] and s["node_key"] == "__main__.Numbers#0"


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_of_every_rank_read_and_fill_the_one_cache(node, context):
    a, b = node(0), node(1)
    a.ok("open", n=24)
    b.ok("open", n=24)
    a.ok("load", idx=list(range(0, 24, 2)), workers=1, context=context)  # a worker of rank 0 inserts the evens
    got = b.ok("load", idx=list(range(24)), workers=2, context=context)
    assert got["fetched"] == [0, 1] * 12
    rank = got["stats"]["rank"]  # rank 1's own numbers, its workers' included
    assert (rank["hits"], rank["misses"], rank["inserts"]) == (12, 12, 12)
    assert got["stats"]["inserts"] == 24 and got["stats"]["holders"] == 2


def test_a_key_holding_another_dataset_is_refused_naming_both(node):
    a, b = node(0), node(1)
    a.ok("open", n=32)
    said = b.ask("open", n=16)["error"]  # the same type and place, another length: another dataset
    assert said.startswith("ValueError: fastcollate.Cached: this dataset (__main__.Numbers of 16 samples")
    assert "__main__.Numbers of 32 samples" in said and "they differ in length" in said
    assert "Cached(train, name='train'), Cached(val, name='val')" in said and "node=False" in said
    named = a.ok("open", n=8, name="train", ref="named")
    said = b.ask("open", n=8, name="train", kind="letters", ref="named")["error"]
    assert "__main__.Letters of 8 samples" in said and "__main__.Numbers of 8 samples" in said
    assert "Both were made with name='train'" in said and "they differ in type" in said
    said = b.ask("open", n=8, name="train", max_bytes=1 << 20, ref="named")["error"]
    assert "max_bytes=1048576" in said and "they differ in max_bytes" in said
    assert b.ok("open", n=8, name="train", ref="named")["inodes"] == named["inodes"]  # told apart, it joins


def test_the_default_max_bytes_is_computed_once_by_the_rank_that_makes_the_cache(node):
    a, b = node(0), node(1)
    ra = a.ok("open", n=8, default=7 << 20)
    rb = b.ok("open", n=8, default=-1)  # computing it here would raise
    assert (ra["default_calls"], rb["default_calls"]) == (1, 0)
    assert ra["max_bytes"] == rb["max_bytes"] == 7 << 20
    assert b.ok("stats")["stats"]["capacity"] == 7 << 20
    # an explicit max_bytes equal to the node's is no mismatch
    assert node(1).ok("open", n=8, max_bytes=7 << 20, default=-1)["inodes"] == ra["inodes"]


def test_a_rank_killed_mid_insert_takes_nothing_and_its_restart_rejoins(node):
    a, b = node(0), node(1)
    ra = a.ok("open", n=32)  # rank 0 makes the cache
    b.ok("open", n=32)
    a.ok("fetch", idx=list(range(16)))
    assert a.ok("claim", i=20)["claimed"]  # mid-insert of sample 20
    a.kill()  # SIGKILL: no exit handler, its registry line stays
    got = b.ok("fetch", idx=list(range(32)))
    assert got["fetched"] == [0] * 16 + [1] * 16  # rank 0's inserts intact
    s = got["stats"]
    assert s["reclaimed"] == 1 and s["inserts"] == 32 and s["holders"] == 1
    again = node(0)  # the restarted rank
    r = again.ok("open", n=32)
    assert r["inodes"] == ra["inodes"] and not r["made"]
    got = again.ok("fetch", idx=list(range(32)))
    assert got["fetched"] == [0] * 32 and got["stats"]["rank"]["hits"] == 32
    assert got["stats"]["holders"] == 2


def test_a_torchelastic_restart_of_every_rank_finds_the_cache_kept(node):
    # torchrun's agent restarts the whole worker group when a rank fails: no rank holds the cache
    # in between, so the rank that makes it leaves a keeper, which ends with the agent
    first = node(0, agent=True, TORCHELASTIC_MAX_RESTARTS="1")
    ra = first.ok("open", n=16)
    keeper = ra["keeper"]
    assert ra["made"] and keeper is not None and keeper[2:] == ra["fds"]
    first.ok("fetch", idx=list(range(16)))
    os.kill(ra["pid"], signal.SIGKILL)  # the group is stopped: the only rank is gone
    assert _gone(ra["pid"])
    again = node(0, TORCHELASTIC_MAX_RESTARTS="1")  # ... and started again
    r = again.ok("open", n=16)
    assert not r["made"] and r["inodes"] == ra["inodes"] and r["keeper"] == keeper
    got = again.ok("fetch", idx=list(range(16)))
    assert got["fetched"] == [0] * 16 and got["stats"]["rank"]["hits"] == 16
    assert got["stats"]["holders"] == 1  # the ranks: the keeper is not one
    first.kill()  # the agent ends (the job is over): so does its keeper
    assert _gone(keeper[0])
    assert again.ok("fetch", idx=[3])["stats"]["rank"]["hits"] == 17  # the ranks still hold it


def test_without_restarts_to_survive_there_is_no_keeper(node):
    assert node(0, agent=True).ok("open", n=4)["keeper"] is None  # TORCHELASTIC_MAX_RESTARTS unset: 0
    assert node(1, agent=True, TORCHELASTIC_MAX_RESTARTS="0").ok("open", n=4)["keeper"] is None


def test_another_dataset_of_the_same_type_and_length_is_refused_never_served(node):
    a, b = node(0), node(1)
    ra = a.ok("open", n=16, seed=1)  # rank 0's shard
    a.ok("fetch", idx=list(range(16)))
    got = b.ask("open", n=16, seed=2)  # rank 1's: same type, same length, other samples
    assert "error" in got and "ValueError" in got["error"], got
    for words in ("not the same content", "attribute seed", "key=f'shard-{rank}'", "node=False",
                  f"pid {ra['pid']}, local rank 0"):
        assert words in got["error"], got["error"]
    # refused means nothing was taken: it holds no line in the registry, and rank 0 still serves
    with open(ra["registry"]) as f:
        assert [h[0] for h in json.load(f)["holders"]] == [ra["pid"]]
    assert a.ok("fetch", idx=[3])["stats"]["holders"] == 1


def test_a_key_per_rank_makes_separate_caches_and_one_key_shares(node):
    a, b = node(0), node(1)
    ra, rb = a.ok("open", n=8, seed=1, key="shard-0"), b.ok("open", n=8, seed=2, key="shard-1")
    assert ra["made"] and rb["made"] and ra["inodes"] != rb["inodes"] and ra["registry"] != rb["registry"]
    a.ok("fetch", idx=list(range(8)))
    got = b.ok("fetch", idx=list(range(8)))  # its own samples (checked in the rank), fetched, not rank 0's
    assert got["fetched"] == [1] * 8 and got["stats"]["hits"] == 0
    # the same key on both: the user says it is the same data, whatever the state says
    c, d = node(0), node(1)
    rc, rd = c.ok("open", n=8, name="same", key="v1"), d.ok("open", n=8, name="same", key="v1")
    assert rc["inodes"] == rd["inodes"] and not rd["made"]


def test_where_the_fingerprint_can_only_sample_cached_samples_are_compared(node):
    a, b, c = node(0), node(1), node(1)
    a.ok("open", n=12, kind="opaque", content=1)
    a.ok("fetch", idx=list(range(12)))
    got = b.ask("open", n=12, kind="opaque", content=2)  # what it holds differs only outside the object
    assert "error" in got and "differs from the cached sample" in got["error"], got
    assert "nothing to read inside it" in got["error"]
    rc = c.ok("open", n=12, kind="opaque", content=1)  # the same content: shared, after the check
    assert not rc["made"]
    got = c.ok("fetch", idx=list(range(12)))
    assert got["stats"]["rank"]["hits"] == 12 and sum(got["fetched"]) == 4  # the 4 samples it compared


def test_a_registry_pid_that_names_another_process_is_not_trusted(node):
    a, c = node(0), node(1)
    ra = a.ok("open", n=8, name="x")
    rc = c.ok("open", n=8, name="y")  # another cache (its fds: most likely the same numbers in its process)
    assert ra["inodes"] != rc["inodes"]
    a.ok("fetch", idx=list(range(8)))
    a.kill()
    # rank 0's pid given to c: alive, the same start time as c, c's fds at the recorded numbers
    with open(ra["registry"]) as f:
        rec = json.load(f)
    rec["holders"] = [[rc["pid"], rc["start"], *rc["fds"]]]
    with open(ra["registry"], "w") as f:
        json.dump(rec, f)
    b = node(0)
    rb = b.ok("open", n=8, name="x")
    assert rb["made"] and rb["inodes"] not in (ra["inodes"], rc["inodes"])  # a new cache: c's file never mapped
    assert b.ok("stats")["stats"]["inserts"] == 0 and c.ok("stats")["stats"]["inserts"] == 0
    with open(ra["registry"]) as f:
        assert [h[0] for h in json.load(f)["holders"]] == [rb["pid"]]


def test_the_last_rank_out_removes_the_registry(node):
    a, b = node(0), node(1)
    ra = a.ok("open", n=8)
    b.ok("open", n=8)
    assert os.path.exists(ra["registry"])
    a.ok("drop")
    with open(ra["registry"]) as f:
        assert len(json.load(f)["holders"]) == 1
    b.ok("drop")
    assert not os.path.exists(ra["registry"])


# ---- in this process: the rules ----------------------------------------------------------------

@pytest.fixture
def launch(monkeypatch, tmp_path):
    for k in LAUNCH_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(cache_node.ENV_DIR, str(tmp_path / "registry"))
    return monkeypatch


def test_who_shares_by_the_environment_and_the_arguments(launch, caplog):
    assert cache_node.group_for(None, None) is None  # outside a launcher nothing changes
    assert cache_node.group_for(None, "mine") == "group:mine" and cache_node.group_for(True, "mine") == "group:mine"
    with pytest.raises(ValueError, match="node=True, but nothing in the environment names the job"):
        cache_node.group_for(True, None)
    with pytest.raises(ValueError, match="node=False keeps this cache private"):
        cache_node.group_for(False, "mine")
    launch.setenv("LOCAL_WORLD_SIZE", "1")
    launch.setenv("TORCHELASTIC_RUN_ID", "r1")
    assert cache_node.group_for(None, None) is None and cache_node.group_for(True, None) == "torchelastic:r1"
    launch.setenv("LOCAL_WORLD_SIZE", "4")
    assert cache_node.group_for(None, None) == "torchelastic:r1" and cache_node.group_for(False, None) is None
    launch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default id: the master's address names the job
    launch.setenv("MASTER_ADDR", "10.0.0.1")
    launch.setenv("MASTER_PORT", "29500")
    assert cache_node.group_for(None, None) == "master:10.0.0.1:29500"
    launch.setenv(cache_node.ENV_GROUP, "g")
    assert cache_node.group_for(None, None) == "group:g"
    launch.delenv(cache_node.ENV_GROUP)
    for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"):
        launch.delenv(k)
    launch.setattr(cache_node, "_warned", set())
    with caplog.at_level("WARNING", logger="fastcollate"):
        assert cache_node.group_for(None, None) is None
    assert "4 ranks share this node, but nothing in the environment names the job" in caplog.text
    assert "each rank keeps a private cache" in caplog.text


def test_bad_arguments_are_refused_clearly(launch):
    for kw, what in [({"name": ""}, "name must be a non-empty str"), ({"group": 3}, "group must be a non-empty str"),
                     ({"node": "yes"}, "node must be None")]:
        with pytest.raises(TypeError, match=what):
            fastcollate.Cached([1], max_bytes=64, **kw)


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.full((3,), i * i)


def test_in_one_process_names_keys_copies_and_workers(launch):
    train = fastcollate.Cached(Squares(), group="g1")
    val = fastcollate.Cached(Squares(), group="g1")
    assert train.stats()["node_key"] == f"{__name__}.Squares#0" and val.stats()["node_key"] == f"{__name__}.Squares#1"
    assert train.max_bytes == val.max_bytes  # each computed once, by its maker (here)
    same = fastcollate.Cached(Squares(), group="g1", name="sq")
    again = fastcollate.Cached(Squares(), group="g1", name="sq")  # the same key: the same cache
    assert segment_fd(same.data)[1] == segment_fd(again.data)[1]
    assert os.fstat(segment_fd(same.data)[0]).st_ino == os.fstat(segment_fd(again.data)[0]).st_ino
    same[2]
    assert torch.equal(again[2], torch.full((3,), 4)) and again.stats()["hits"] == 1
    shallow, deep = copy.copy(train), copy.deepcopy(train)
    assert shallow.ctrl is train.ctrl and shallow.stats()["node"]
    assert not deep.stats()["node"] and deep.max_bytes == train.max_bytes  # private: the copy may diverge
    assert fastcollate.Cached(Squares(), group="g1").stats()["node_key"].endswith("#2")  # the copy took no place
    for context in ("fork", "spawn"):
        loader = DataLoader(train, batch_size=3, num_workers=1, multiprocessing_context=context, timeout=120)
        assert torch.equal(torch.cat(list(loader)), torch.stack([train.dataset[i] for i in range(6)]))
    s = train.stats()
    assert (s["inserts"], s["hits"], s["rank"]["hits"], s["holders"]) == (6, 6, 6, 1)
    private = fastcollate.Cached(Squares(), max_bytes=1 << 20)
    assert not private.stats()["node"] and "node_key" not in private.stats()
    path = train._node.path
    del train, shallow, loader
    gc.collect()
    assert not os.path.exists(path)  # its last holder let it go


def test_a_dead_job_s_registry_is_tidied_by_the_next_cache_made(launch, tmp_path):
    directory = tmp_path / "registry"
    directory.mkdir(mode=0o700)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = directory / "cache-0123.json"
    stale.write_text(json.dumps({"version": cache_node.VERSION, "holders": [[int(dead.stdout), 1, 3, 4]]}))
    ds = fastcollate.Cached(Squares(), group="g2")
    assert not stale.exists() and os.path.exists(ds._node.path)


def test_the_default_registry_directory_is_private(launch, tmp_path):
    launch.delenv(cache_node.ENV_DIR)
    launch.setattr("tempfile.tempdir", str(tmp_path))
    (tmp_path / f"fastcollate-{os.getuid()}").mkdir(mode=0o755)
    path = cache_node.registry_dir()
    assert path == str(tmp_path / f"fastcollate-{os.getuid()}") and os.stat(path).st_mode & 0o777 == 0o700


# ---- under torchrun ---------------------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo() -> str | None:
    import torch.distributed as dist

    if not dist.is_available():
        return "torch.distributed is not available in this build"
    if not dist.is_gloo_available():
        return "torch.distributed has no gloo backend in this build"
    return None


def torchrun(tmp_path, ranks: int, *args: str, script: str = TRAIN, more: tuple[str, ...] = ()
             ) -> tuple[list[dict], str]:
    """``script`` (tests/node_cache_train.py) under torchrun (``args``: torchrun's options;
    --standalone by default; ``more``: the script's): each rank's report, and the output."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               FASTCOLLATE_NODE_DIR=str(tmp_path / "registry"))
    cmd = [sys.executable, "-m", "torch.distributed.run", *(args or ["--standalone"]), f"--nproc_per_node={ranks}",
           script, "--out", str(tmp_path), *more] + (["--fail-once"] if "--max-restarts=1" in args else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)  # a hang guard, not a time bound
    finally:
        if proc.poll() is None:  # only the session this test started
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in processes_with(str(tmp_path)):  # its ranks, in sessions of their own
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)], out


@pytest.mark.skipif(_gloo() is not None, reason=str(_gloo()))
@pytest.mark.parametrize("ranks", [2, 4])
def test_torchrun_ranks_share_one_cache_with_default_arguments(tmp_path, ranks):
    reports, out = torchrun(tmp_path, ranks)
    dataset_bytes = reports[0]["dataset_bytes"]
    assert len({r["inode"] for r in reports}) == 1, "the ranks hold different caches"
    assert sum(r["made"] for r in reports) == 1 and len({r["max_bytes"] for r in reports}) == 1  # one budget
    assert all(r["node"] and r["holders"] == ranks for r in reports)
    for r in reports:
        for e, epoch in enumerate(r["epochs"]):
            assert epoch["batches_equal"], (r["rank"], e)  # bitwise the uncached run's
            assert (epoch["cache_hits"], epoch["cache_misses"]) == (epoch["hits"], epoch["fetches"])
            if e >= 1:  # from the 2nd epoch on, everything any rank fetched is in
                assert epoch["hits"] >= 0.99 * epoch["samples"], (r["rank"], r["epochs"])
    first = sum(r["epochs"][0]["fetches"] for r in reports)
    assert first == reports[0]["dataset_samples"] == reports[0]["node_inserts"]  # each sample fetched once, node-wide
    assert all(r["fetched_twice"] == 0 for r in reports)
    assert reports[0]["shared_bytes"] <= 1.3 * dataset_bytes, (reports[0]["shared_bytes"], dataset_bytes)
    assert not [p for p in os.listdir(tmp_path / "registry")], "the last rank out leaves no registry behind"
    print("\n".join(line for line in out.splitlines() if line.startswith("rank ")))


@pytest.mark.skipif(_gloo() is not None, reason=str(_gloo()))
def test_torchrun_restarting_every_rank_keeps_the_cache(tmp_path):
    # rank 1 crashes after the first epoch; torchrun stops rank 0 and starts both again. A static
    # rendezvous: its run id is "none", so the master's port names the job (the ranks sync by
    # files, not gloo: see FileBarrier in the script)
    for attempt in range(3):  # a port found free can be taken before the agent binds it: try another
        try:
            reports, out = torchrun(tmp_path, 2, "--nnodes=1", f"--master_port={free_port()}", "--max-restarts=1")
            break
        except AssertionError as exc:
            if "address already in use" not in str(exc).lower() or attempt == 2:
                raise
    assert all(r["attempt"] == 1 for r in reports)
    keeper = reports[0]["keeper"]
    assert keeper is not None and all(r["keeper"] == keeper for r in reports)
    for r in reports:
        assert not r["made"]  # the cache the first attempt made
        for e, epoch in enumerate(r["epochs"]):  # every epoch of the second attempt hits, the first included
            assert epoch["batches_equal"] and epoch["hits"] >= 0.99 * epoch["samples"], (r["rank"], e, r["epochs"])
    assert _gone(keeper[0]), "the keeper outlived the job"
    assert not os.listdir(tmp_path / "registry"), "the keeper, the last holder, leaves no registry behind"


@pytest.mark.skipif(_gloo() is not None, reason=str(_gloo()))
@pytest.mark.parametrize("keyed", [False, True], ids=["default", "key-per-rank"])
def test_torchrun_ranks_with_different_datasets_never_share(tmp_path, keyed):
    # each rank its own shard, same type and length; rank 1 joins after rank 0 filled the cache
    reports, out = torchrun(tmp_path, 2, script=SHARDS, more=("--key",) if keyed else ())
    first, second = reports
    assert first["equal"] and first["made"] and "refused" not in first
    if keyed:  # separate caches, each rank its own samples
        assert "refused" not in second, second
        assert second["equal"] and second["made"] and second["inode"] != first["inode"] and second["hits"] == 0
    else:  # refused, with what differs and what to do
        assert "equal" not in second, "rank 1 was served a cache"
        assert "not the same content" in second["refused"] and "attribute shard" in second["refused"]
        assert "key=" in second["refused"]
    assert not os.listdir(tmp_path / "registry"), "the job left a registry behind"
