"""Ray Data in `fastcollate bench --peers`, in a process of its own.

A Ray cluster started in the process that runs the other peers installs Ray's SIGTERM handler
there, and the run ended with the other loaders' DataLoader workers killed by SIGTERM. So Ray's
part runs in a child started with a clean Python (``python -m fastcollate._bench.ray_peer``)
that calls ``ray.init(num_cpus=2)`` itself; the parent (fastcollate._bench.peers) sends it one
command per line of JSON on its stdin and reads each answer, one line of JSON after
:data:`PREFIX` on its stdout (anything else Ray prints there is skipped). Its epochs are timed in
the child and interleaved with the other peers' rounds by the parent, so every peer is measured
under the same load. Nothing of Ray is imported in the parent.

Where Ray Data takes the same rows: ``tabular`` (the 17-field samples without their string,
which Ray's default collate refuses) and ``padded`` (the token rows); Ray's side as a Ray user
writes it (the default collate; for padding, ``pad_sequence`` and a mask in an
``ArrowBatchCollateFn``) and with ``fastcollate.ray.ArrowCollate``.

Commands: ``{"op": "peers", "workload": w}`` -> ``{"peers": [...]}`` or ``{"skip": why}``;
``{"op": "first", "workload": w, "peer": p, "path": f}`` -> the first batch of a new epoch,
``torch.save``d to ``f``; ``{"op": "epoch", "workload": w, "peer": p}`` -> ``{"n": rows,
"first": s, "t": s}``; ``{"op": "quit"}``. An exception is answered ``{"error": "Type: message"}``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

PREFIX = "@fastcollate-ray-peer "
DEFAULT = "Ray Data iter_torch_batches"
OURS = "Ray Data + fastcollate ArrowCollate"
PEERS = (DEFAULT, OURS)
SKIPS = {"images": "its own decode pipeline (read_images + map_batches): not the same dataset",
         "tokens": "map-style windows over a memmap: no Ray Data dataset of the same rows"}


class RayPeerError(RuntimeError):
    """The Ray child failed to start or answered with an error."""


class RayProcess:
    """The parent's handle on the Ray child: started on first use, one command at a time."""

    def __init__(self, quick: bool, timeout: float = 600.0) -> None:
        self.quick, self.timeout = quick, timeout
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own local cluster
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
        env.pop("FASTCOLLATE_TRACE", None)
        args = [sys.executable, "-m", "fastcollate._bench.ray_peer"] + (["--quick"] if self.quick else [])
        return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, bufsize=1, env=env, start_new_session=True, close_fds=True)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        if self.proc is None:
            self.proc = self._start()
            ready = self._read()  # its "ready" line: the cluster is up and the datasets made
            if "error" in ready:
                self.close()
                raise RayPeerError(ready["error"])
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError as exc:
            raise RayPeerError(f"the Ray peer process exited (code {self.proc.poll()})") from exc
        answer = self._read()
        if "error" in answer:
            raise RayPeerError(answer["error"])
        return answer

    def _read(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        raise RayPeerError(f"the Ray peer process exited (code {self.proc.wait()}) without an answer")

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                proc.stdin.flush()
            proc.wait(timeout=60)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


class RemoteLoader:
    """One Ray peer on one workload, as the peers table iterates it: an epoch is run and timed
    in the child; ``first_batch()`` brings its first batch back to compare with torch's."""

    def __init__(self, process: RayProcess, workload: str, peer: str) -> None:
        self.process, self.workload, self.peer = process, workload, peer

    def epoch(self) -> tuple[int, float, float]:
        a = self.process.ask(op="epoch", workload=self.workload, peer=self.peer)
        return int(a["n"]), float(a["first"]), float(a["t"])

    def first_batch(self) -> Any:
        import tempfile

        import torch

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "batch.pt")
            self.process.ask(op="first", workload=self.workload, peer=self.peer, path=path)
            return torch.load(path)


# ---------------------------------------------------------------------- the child

def _datasets(quick: bool) -> dict[str, tuple[Any, int, dict[str, Any]]]:
    """workload -> (the materialized Ray dataset, batch size, {peer: collate_fn})."""
    import ray
    import torch

    from ..ray import ArrowCollate
    from .engines import ray_side
    from .storage import token_lists
    from .workloads import small_fields

    fields = small_fields(256)
    n = 256 * (8 if quick else 32)  # as many rows as the other peers' CachedSamples serve
    rows = [{k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in fields[i % len(fields)].items()
             if not isinstance(v, str)} for i in range(n)]
    tokens = token_lists(1024 if quick else 4096)
    # lists (Arrow list<int64> columns), as a tokenizer's rows are stored
    token_rows = [{"input_ids": ids, "attention_mask": [1] * len(ids), "label": lab}
                  for ids, lab in zip(tokens["input_ids"], tokens["label"])]
    return {
        "tabular": (ray.data.from_items(rows).materialize(), 256, {DEFAULT: None, OURS: ArrowCollate()}),
        "padded": (ray.data.from_items(token_rows).materialize(), 32,
                   {DEFAULT: ray_side("tokens"), OURS: ArrowCollate(pad={"input_ids": 0})}),
    }


def _answer(obj: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    import warnings

    argv = sys.argv[1:] if argv is None else argv
    quick = "--quick" in argv
    warnings.simplefilter("ignore")  # Ray's deprecation notes, torch's "not writable": not the peers' output
    import ray
    import torch

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = True  # the first batch is torch's first batch
    try:
        data = _datasets(quick)
        _answer({"ready": True})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            try:
                w = cmd["workload"]
                if cmd["op"] == "peers":
                    _answer({"peers": list(PEERS)} if w in data else {"skip": SKIPS.get(w, "not a Ray workload")})
                    continue
                ds, bs, collates = data[w]
                batches = ds.iter_torch_batches(batch_size=bs, collate_fn=collates[cmd["peer"]], device="cpu")
                if cmd["op"] == "first":
                    # each tensor its own copy: torch.save refuses views of one arena in several dtypes
                    torch.save({k: v.clone() for k, v in next(iter(batches)).items()}, cmd["path"])
                    _answer({"ok": True})
                elif cmd["op"] == "epoch":
                    t0, first, n = time.perf_counter(), None, 0
                    for b in batches:
                        if first is None:
                            first = time.perf_counter() - t0
                        n += int(next(iter(b.values())).shape[0])
                    _answer({"n": n, "first": first or 0.0, "t": time.perf_counter() - t0})
                else:
                    _answer({"error": f"ValueError: unknown op {cmd['op']!r}"})
            except Exception as exc:  # one failed command: said, and the next one served
                _answer({"error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    except Exception as exc:
        _answer({"error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        return 1
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
