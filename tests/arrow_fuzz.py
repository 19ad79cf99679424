"""The Arrow corruption fuzz (test_arrow_corrupt_fuzz.py): healthy Arrow data written as a user's
pipeline writes it -- a `datasets` cache file, an Arrow IPC stream of a Ray-style table -- then
damaged at random (bytes flipped, the file cut short, list offsets patched, one-row chunks
included), and read by fastcollate in a child process each: the child must end with a Python
exception or with exactly what pyarrow reads, never a signal.

Each case is one forkserver child (the server has torch, pyarrow, datasets and fastcollate
imported once), so a process killed by a signal inside fastcollate fails the case, not the run.
"""
from __future__ import annotations

import dataclasses
import os
import random
import traceback
from typing import Any

import numpy as np

WRITER_BATCH = 7  # rows per record batch (chunk) of the files written here


@dataclasses.dataclass
class Case:
    kind: str          # "hf" (a datasets cache file) or "ipc" (an Arrow IPC stream, ArrowCollate's input)
    path: str
    damage: str        # what was done to the file
    seed: int


# -- healthy data ----------------------------------------------------------------------------------

def _rows(rng: random.Random, n: int) -> dict[str, list]:
    return {
        "ids": [[rng.randrange(0, 1000) for _ in range(rng.randrange(0, 6))] for _ in range(n)],
        "vals": [[rng.random() for _ in range(rng.randrange(1, 4))] for _ in range(n)],
        "y": [rng.randrange(-50, 50) for _ in range(n)],
        "w": [rng.random() for _ in range(n)],
    }


def write_hf(path: str, rng: random.Random) -> None:
    """A datasets cache file whose last chunk has one row (its length is 1 modulo the chunk size)."""
    import datasets

    datasets.disable_progress_bars()
    n = WRITER_BATCH * rng.randrange(1, 4) + 1
    base = datasets.Dataset.from_dict(_rows(rng, n))
    base.map(lambda b: b, batched=True, cache_file_name=path, writer_batch_size=WRITER_BATCH)


def write_ipc(path: str, rng: random.Random) -> None:
    """An Arrow IPC stream: record batches of 1..WRITER_BATCH rows (a Ray batch spanning blocks)."""
    import pyarrow as pa

    batches = []
    for _ in range(rng.randrange(1, 5)):
        rows = _rows(rng, rng.choice([1, 1, 2, WRITER_BATCH]))
        batches.append(pa.record_batch({
            "ids": pa.array(rows["ids"], type=pa.list_(pa.int64())),
            "vals": pa.array(rows["vals"], type=pa.list_(pa.float32())),
            "y": pa.array(rows["y"], type=pa.int32()),
            "w": pa.array(rows["w"], type=pa.float64()),
        }))
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for b in batches:
            writer.write_batch(b)


# -- damage ----------------------------------------------------------------------------------------

def _offset_buffers(path: str, kind: str) -> list[tuple[int, int, int]]:
    """(file position, entries, width) of every list column chunk's offsets buffer in the file."""
    import pyarrow as pa

    out = []
    with pa.memory_map(path) as source:
        whole = source.read_buffer()
        table = pa.ipc.open_stream(whole).read_all()
        for column in table.columns:
            for chunk in column.chunks:
                if pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
                    width = 8 if pa.types.is_large_list(chunk.type) else 4
                    buf = chunk.buffers()[1]
                    out.append((buf.address - whole.address + chunk.offset * width, len(chunk) + 1, width))
    return out


def damage(path: str, kind: str, rng: random.Random) -> str:
    data = bytearray(open(path, "rb").read())
    what = rng.choice(["offsets", "offsets", "offsets", "flip", "truncate"])
    if what == "offsets":
        buffers = _offset_buffers(path, kind)
        pos, entries, width = rng.choice(buffers)
        # one-row chunks (2 offsets) are where the check once failed: damage them as often as others
        k = rng.randrange(entries)
        value = rng.choice([-1, -5, -(1 << 31) + 1, 1 << 30, 5, 13, 2, 0, rng.randrange(-100, 100),
                            rng.randrange(0, 1 << 20)])
        fmt = np.int64 if width == 8 else np.int32
        data[pos + k * width: pos + (k + 1) * width] = np.asarray(value, dtype=fmt).tobytes()
        desc = f"offset {k} of a {entries - 1}-row chunk at byte {pos} := {value}"
    elif what == "flip":
        flips = rng.randrange(1, 9)
        for _ in range(flips):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        desc = f"{flips} bits flipped"
    else:
        size, cut = len(data), rng.randrange(len(data))
        del data[cut:]
        desc = f"cut at byte {cut} of {size}"
    with open(path, "wb") as f:
        f.write(bytes(data))
    return f"{what}: {desc}"


def make_cases(directory: str, count: int, seed: int) -> list[Case]:
    cases = []
    for i in range(count):
        rng = random.Random(seed * 1_000_003 + i)
        kind = "hf" if i % 2 == 0 else "ipc"
        path = os.path.join(directory, f"case-{seed}-{i}.arrow")
        (write_hf if kind == "hf" else write_ipc)(path, rng)
        cases.append(Case(kind, path, damage(path, kind, rng), seed * 1_000_003 + i))
    return cases


# -- the child's read ------------------------------------------------------------------------------

def _table(case: Case) -> Any:
    import pyarrow as pa

    with pa.memory_map(case.path) as source:
        return pa.ipc.open_stream(source.read_buffer()).read_all()


def _valid(table: Any) -> bool:
    try:
        table.validate(full=True)
        return True
    except Exception:
        return False


def read_case(case: Case) -> str:
    """In the child: what happened ("pyarrow refused", "refused: ...", "equal"); raises
    AssertionError when fastcollate returned something other than pyarrow's data."""
    import torch
    from torch.utils.data import default_collate

    import fastcollate
    from fastcollate.data.columnar import ColumnarCollator
    from helpers import assert_same

    try:
        table = _table(case)
    except Exception as exc:
        return f"pyarrow refused: {type(exc).__name__}"
    valid = _valid(table)
    try:
        if case.kind == "hf":
            import datasets

            ds = datasets.Dataset.from_file(case.path)
            fc = fastcollate.ArrayDataset.from_hf(ds)
            idx = list(range(len(fc)))
            plain = fastcollate.collate(fc.__getitems__([i for i in idx if len(table.column("ids")[i]) == 0][:1] or [0]))
            padded = fastcollate.Collator(pad={"ids": 0, "vals": 0.0})(fc.__getitems__(idx))
            got = (plain, padded)
        else:
            got = ColumnarCollator(pad={"ids": 0, "vals": 0.0}).arrow(table)
    except Exception as exc:
        return f"refused: {type(exc).__name__}: {str(exc)[:200]}"
    assert valid, f"fastcollate returned a batch from data pyarrow finds invalid ({case.damage})"
    # the same rows through pyarrow's own reading, then the reference semantics
    rows = table.to_pylist()
    if case.kind == "hf":
        from fastcollate.core.pad import PadSpec

        keys = [k for k in rows[0]]
        first = [i for i in range(len(rows)) if len(rows[i]["ids"]) == 0][:1] or [0]
        assert_same(got[0], default_collate([{k: rows[i][k] for k in keys} for i in first]))
        spec = fastcollate.Collator(pad={"ids": 0, "vals": 0.0}).pad
        assert_same(got[1], spec.collate(rows))
    else:
        import pyarrow as pa

        numpy_batch = {}
        for name in table.column_names:
            col = table.column(name)
            if pa.types.is_list(col.type):
                typ = np.int64 if name == "ids" else np.float32
                numpy_batch[name] = np.array([np.asarray(v, dtype=typ) for v in col.to_pylist()] + [None],
                                             dtype=object)[:-1]
            else:
                numpy_batch[name] = col.to_numpy()
        want = ColumnarCollator(pad={"ids": 0, "vals": 0.0}).numpy(numpy_batch)
        assert_same(got, want)
    return "equal"


def child(case: Case, conn: Any) -> None:
    try:
        conn.send(("ok", read_case(case)))
    except BaseException:
        conn.send(("mismatch", traceback.format_exc()[-3000:]))
    finally:
        conn.close()


def run_cases(cases: list[Case], timeout: float = 60.0) -> dict[str, Any]:
    """Each case in a forkserver child. Returns the outcomes; failures are (case, why)."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "pyarrow", "datasets", "fastcollate", "helpers", "arrow_fuzz"])
    outcomes: dict[str, int] = {}
    failures = []
    for case in cases:
        parent, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=child, args=(case, child_end))
        p.start()
        child_end.close()
        try:
            got = parent.recv() if parent.poll(timeout) else None
        except EOFError:  # the child died before it answered
            got = None
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
            failures.append((case, "hung"))
        elif p.exitcode != 0 or got is None:
            failures.append((case, f"killed (exit code {p.exitcode})"))
        elif got[0] != "ok":
            failures.append((case, got[1]))
        else:
            key = got[1].split(":")[0]
            outcomes[key] = outcomes.get(key, 0) + 1
    return {"outcomes": outcomes, "failures": failures}
