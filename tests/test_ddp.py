"""Two gloo ranks on the CPU through torchrun: examples/ddp_train.py with fastcollate, the
prefetcher and train_one_epoch. Disjoint samples that cover the dataset, identical models after
every optimizer step, the slowed rank named by the gathered stall report; bounded in time, no
process left behind."""
import json
import os
import subprocess
import sys
import uuid

from procs import processes_with

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_two_ranks_gloo(tmp_path):
    token = f"ddp-test-{uuid.uuid4().hex[:8]}"
    out = tmp_path / token
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               PYTHONFAULTHANDLER="1")  # an abort prints every thread's Python stack
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "examples", "ddp_train.py"), "--slow-rank", "1", "--epochs", "2", "--samples", "200",
           "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    if r.returncode != 0 and _teardown_abort(r, out):
        # seen once in CI (none in 76 runs here beside 3 busy processes): a rank aborted in its
        # teardown after every rank had written its results, most likely a gloo worker thread
        # dropping the last reference to a tensor while the interpreter finalizes (the race
        # pytorch/pytorch#179291 describes). The run is repeated once, whole; if it aborts again
        # the message keeps both runs' output, with faulthandler's stacks of every thread.
        first = r.stderr[-3000:]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
        assert r.returncode == 0, "aborted in teardown twice:\n" + first + "\n---\n" + r.stdout[-3000:] + r.stderr[-3000:]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]
    a, b = ranks
    per_epoch = 100  # DistributedSampler: 200 samples over 2 ranks
    for epoch in range(2):
        sa = a["seen"][epoch * per_epoch:(epoch + 1) * per_epoch]
        sb = b["seen"][epoch * per_epoch:(epoch + 1) * per_epoch]
        assert not set(sa) & set(sb), "the ranks saw overlapping samples"
        assert set(sa) | set(sb) == set(range(200)), "the ranks did not cover the dataset"
    assert a["seen"][:per_epoch] != a["seen"][per_epoch:], "set_epoch did not reshuffle"
    assert len(a["checksums"]) == len(b["checksums"]) > 0
    assert a["checksums"] == b["checksums"], "models diverged across ranks"
    assert a["losses"] == b["losses"], "the loss is averaged across ranks"
    # the slowed rank sleeps 2 ms a sample (0.4 s over both epochs), the other waits for its
    # prefetcher's first batches only: 0.41 s against 0.003-0.01 s beside 4 busy processes on 2
    # cores -- 40x; which rank a set of waits names is tested on injected waits in test_monitor_tune.py
    assert a["rank_wait_s"] == b["rank_wait_s"] and len(a["rank_wait_s"]) == 2  # one collective, one answer
    assert a["slowest_rank"] == b["slowest_rank"] == 1, a["rank_wait_s"]
    assert b["bottleneck"] == "dataset", b  # the slowed rank's own trace names its stage (32 ms of sleep a batch)
    assert "slowest rank 1" in r.stdout
    assert not processes_with(token), "processes left behind"


def _teardown_abort(r, out) -> bool:
    """Whether a rank died of std::terminate after both ranks had written their results."""
    written = all((out / f"rank{i}.json").exists() for i in range(2))
    return written and "terminate called without an active exception" in r.stderr and "SIGABRT" in r.stderr
