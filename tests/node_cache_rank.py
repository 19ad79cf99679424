"""One "rank" of tests/test_node_cache.py: a process the test drives line by line (a JSON request
on stdin, a JSON answer on stdout), so that what each rank does, and when it is killed, is the
test's choice and never a race. The launcher's environment (LOCAL_WORLD_SIZE, LOCAL_RANK,
TORCHELASTIC_RUN_ID, FASTCOLLATE_NODE_DIR) comes from the test.

Requests: open (wrap a dataset in Cached), fetch (ds[i], each checked against the sample the
dataset makes), load (the same through a DataLoader with workers), claim (take entry i as a
writer would and stop there: a rank killed mid-insert), stats, drop (let the cache go)."""
from __future__ import annotations

import gc
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import fastcollate  # noqa: E402
from fastcollate import _ext  # noqa: E402
from fastcollate.core.shm import process_start, segment_fd  # noqa: E402
from fastcollate.cache import cached as cache_mod
from helpers import assert_identical  # noqa: E402


def sample(kind: str, i: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(1000 * len(kind) + i + 7919 * seed)
    return {"x": torch.randint(0, 256, (64 + i,), dtype=torch.uint8, generator=g), "i": i, "kind": kind}


class Numbers(Dataset):
    """Deterministic samples; fetched[i] counts the fetches of i in this process and its workers."""

    kind = "numbers"

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = n
        self.fetched = torch.zeros(n, dtype=torch.int64).share_memory_()
        if seed:  # other content of the same type and length (a per-rank shard, another split)
            self.seed = seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        self.fetched[i] += 1
        return sample(self.kind, i, self.content())

    def content(self) -> int:
        return getattr(self, "seed", 0)


class Letters(Numbers):
    kind = "letters"


class Opaque(Numbers):
    """Its content comes from outside the object (the environment), and it holds a handle the
    fingerprint cannot see into: the fingerprint samples, so a joining rank spot-checks."""

    def __init__(self, n: int, seed: int = 0) -> None:
        super().__init__(n)
        self.handle = object()  # no __dict__, no slots: nothing the fingerprint can read

    def content(self) -> int:
        return int(os.environ.get("NODE_CACHE_CONTENT", "0"))


DEFAULT_CALLS = []


def fake_default(value: int):
    def default() -> int:
        DEFAULT_CALLS.append(value)
        if value < 0:
            raise AssertionError("this rank computed the default max_bytes: it should have adopted the node's")
        return value
    return default


def first(batch):
    return batch


def describe(ds) -> dict:
    node = ds._node
    out = {"pid": os.getpid(), "start": process_start(os.getpid()), "max_bytes": ds.max_bytes,
           "node": node is not None, "made": node is not None and node.made, "key": node and node.key,
           "registry": node and node.path, "default_calls": len(DEFAULT_CALLS)}
    if node is not None:
        with open(node.path) as f:
            out["keeper"] = json.load(f).get("keeper")
    if ds.ctrl is not None:
        fds = [segment_fd(ds.ctrl)[0], segment_fd(ds.data)[0]]
        out["fds"] = fds
        out["inodes"] = [os.fstat(fd).st_ino for fd in fds]
    return out


def main() -> None:
    datasets: dict[str, cache_mod.Cached] = {}
    for line in sys.stdin:
        req = json.loads(line)
        op, ref = req["op"], req.get("ref", "ds")
        try:
            if op == "open":
                if "default" in req:
                    cache_mod.default_max_bytes = fake_default(req["default"])
                if "content" in req:
                    os.environ["NODE_CACHE_CONTENT"] = str(req["content"])
                kind = {"letters": Letters, "opaque": Opaque}.get(req.get("kind"), Numbers)
                base = kind(req["n"], req.get("seed", 0))
                kw = {k: req[k] for k in ("name", "max_bytes", "node", "group", "key") if k in req}
                datasets[ref] = cache_mod.Cached(base, **kw)
                answer = describe(datasets[ref])
            elif op == "fetch":
                ds = datasets[ref]
                for i in req["idx"]:
                    assert_identical(ds[i], sample(ds.dataset.kind, i, ds.dataset.content()))
                answer = {"stats": ds.stats(), "fetched": ds.dataset.fetched.tolist()}
            elif op == "load":
                ds = datasets[ref]
                loader = DataLoader(ds, batch_size=None, sampler=req["idx"], num_workers=req["workers"],
                                    multiprocessing_context=req.get("context"), collate_fn=first, timeout=120)
                for i, got in zip(req["idx"], loader):
                    assert_identical(got, sample(ds.dataset.kind, i, ds.dataset.content()))
                answer = {"stats": ds.stats(), "fetched": ds.dataset.fetched.tolist()}
            elif op == "claim":  # what a writer does first; then it is killed before it publishes
                ds = datasets[ref]
                C = _ext._C
                claim = C.cache_claim(ds.ctrl, req["i"], os.getpid())
                answer = {"claimed": claim.outcome == C.cache_claims["claimed"]}
            elif op == "stats":
                answer = {"stats": datasets[ref].stats()}
            elif op == "drop":
                del datasets[ref]
                gc.collect()
                answer = {}
            else:
                raise ValueError(f"no op {op!r}")
        except Exception as exc:  # the test reads the error as an answer
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
