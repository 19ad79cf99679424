"""The contracts between Python and the compiled engine are named, never positional: gather jobs
and fixed-gather columns are bound structs built by keyword, the job kinds an exported enum, the
ring's control-block words and the arena alignment constants read from _C."""
import numpy as np
import pytest
import torch

import fastcollate
from fastcollate import _ext

C = _ext._C
pytestmark = pytest.mark.skipif(C is None, reason="needs the compiled engine")


def test_gather_job_is_built_by_keyword_and_reads_back_by_name():
    ptrs = torch.zeros(2, dtype=torch.int64)
    job = C.GatherJob(kind=C.JobKind.Rows, offset=64, ptrs=ptrs, rows=2, L=3, inner=1, src=torch.uint8,
                      dst=torch.float32, pad=-1, left=True, shape=(2, 3))
    assert (job.kind, job.offset, job.rows, job.L, job.inner) == (C.JobKind.Rows, 64, 2, 3, 1)
    assert (job.src, job.dst, job.pad, job.left, job.transposed) == (torch.uint8, torch.float32, -1, True, False)
    assert job.ptrs is ptrs or torch.equal(job.ptrs, ptrs)
    assert job.lens is None and list(job.shape) == [2, 3]
    with pytest.raises(TypeError):
        C.GatherJob(C.JobKind.Rows, 0, ptrs, None, 2, 3, 1, torch.uint8, torch.uint8, 0, False, False, (2, 3))


def test_gather_jobs_run_by_name():
    rows = np.arange(12, dtype=np.uint8).reshape(4, 3)
    ptrs = torch.tensor([rows[i].ctypes.data for i in (2, 0)], dtype=torch.int64)
    arena = C.pool_allocate(2 * C.align)
    spans = torch.tensor([[rows.ctypes.data, rows.ctypes.data + rows.nbytes]])
    job = C.GatherJob(kind=C.JobKind.Rows, offset=0, ptrs=ptrs, rows=2, L=3, src=torch.uint8, dst=torch.int64,
                      shape=(2, 3), spans=spans)
    lengths = C.GatherJob(kind=C.JobKind.Lengths, offset=C.align, lens=torch.tensor([3, 1]), rows=2, L=2,
                          src=torch.int64, dst=torch.int64, shape=(2,))
    out, n = C.gather(arena, [job, lengths], 1)
    assert out.tolist() == [rows[2].tolist(), rows[0].tolist()] and n.tolist() == [2, 1]


def _rows_job(ptrs, lens, L, spans, pad=0):
    return C.GatherJob(kind=C.JobKind.Rows, offset=0, ptrs=torch.tensor(ptrs, dtype=torch.int64),
                       lens=None if lens is None else torch.tensor(lens, dtype=torch.int64), rows=len(ptrs), L=L,
                       src=torch.uint8, dst=torch.uint8, shape=(len(ptrs), L), spans=torch.tensor(spans), pad=pad)


def test_a_row_outside_its_source_raises_and_writes_nothing():
    # defence in depth: whatever a damaged input or a planning mistake says, the engine checks
    # every row's span against the memory its job may read, and the arena is left untouched
    src = np.arange(16, dtype=np.uint8)
    lo, hi = src.ctypes.data, src.ctypes.data + src.nbytes
    arena = C.pool_allocate(4 * C.align).fill_(0xAB)
    bad = [
        ([lo, lo + 12], [4, 5], 8, "row 1 would read 5 bytes"),       # runs 1 byte past the end
        ([lo, lo - 1], [4, 1], 4, "row 1 would read 1 bytes"),        # starts before the source
        ([lo, hi], [4, 1], 4, "row 1 would read 1 bytes"),            # starts at its end
        ([lo, lo + (1 << 40)], [1, 1], 2, "row 1 would read"),        # far away
        ([lo, lo], [2, -3], 4, "row 1: length -3 is negative"),       # a negative length: never a write before the row
    ]
    for ptrs, lens, L, msg in bad:
        with pytest.raises(ValueError, match=msg):
            C.gather(arena, [_rows_job(ptrs, lens, L, [[lo, hi]])], 1)
        assert bool((arena == 0xAB).all()), (ptrs, lens)
    with pytest.raises(ValueError, match="row 0 would read"):  # fixed-length rows (no lens) too
        C.gather(arena, [_rows_job([hi - 2], None, 4, [[lo, hi]])], 1)
    with pytest.raises(RuntimeError, match="needs spans"):
        C.gather(arena, [C.GatherJob(kind=C.JobKind.Rows, offset=0, ptrs=torch.tensor([lo]), rows=1, L=1,
                                     src=torch.uint8, dst=torch.uint8)], 1)
    # within the span (and across two touching spans, merged) is fine; truncation reads only L
    out = C.gather(arena, [_rows_job([lo + 14, lo], [2, 100], 4, [[lo, lo + 8], [lo + 8, hi]])], 1)[0]
    assert out.tolist() == [[14, 15, 0, 0], [0, 1, 2, 3]]


def test_job_kinds_are_the_enum():
    assert set(C.JobKind.__members__) == {"Rows", "Mask", "Lengths"}
    assert len({int(k) for k in C.JobKind.__members__.values()}) == 3


def test_fixed_column_is_built_by_keyword():
    col = C.FixedColumn(base=0, row_stride=8, shift=0, L=1, inner=1, src=torch.int64, dst=torch.int64,
                        trailing=[], scalar=True, lo=0, hi=80)
    assert (col.row_stride, col.scalar, col.dst, list(col.trailing)) == (8, True, torch.int64, [])
    assert (col.lo, col.hi) == (0, 80)
    with pytest.raises(TypeError):
        C.FixedColumn(0, 8, 0, 1, 1, torch.int64, torch.int64, [], True, 0, 80)


def test_ring_control_block_words_are_named():
    from fastcollate.loader.ring import Ring

    words = C.ring_words
    assert {"hits", "full", "oversize", "bytes", "counters", "slots", "claim_hint", "header"} <= set(words)
    ring = Ring(3, 1 << 16)
    assert ring.ctrl.numel() == words["header"] + 3 and int(ring.ctrl[words["slots"]]) == 3
    for name, value in (("hits", 2), ("full", 1), ("oversize", 3), ("bytes", 100)):
        ring.count(name, value)
        assert int(ring.ctrl[words[name]]) == value
    s = ring.stats()
    assert (s["ring_hits"], s["ring_full"], s["ring_oversize"], s["ring_bytes"], s["ring_fallbacks"]) == (2, 1, 3, 100, 4)
    slot, view = ring.claim_view(10)
    assert int(ring.ctrl[words["header"] + slot]) == ring.states()[slot] > 0
    lease = ring.lease(slot, ring.states()[slot], 10)
    assert ring.states()[slot] == C.ring_held_by_main
    del lease, view
    assert ring.states()[slot] == 0


@pytest.mark.parametrize("compiled", [True, False])
def test_gathered_leaves_sit_at_the_exported_alignment(compiled, monkeypatch):
    from fastcollate.data import gather as gather_mod

    monkeypatch.setattr(gather_mod, "_COMPILED", compiled)
    ds = fastcollate.ArrayDataset({"a": np.arange(10, dtype=np.int8), "b": np.ones((10, 3), dtype=np.float32),
                                   "c": np.arange(10, dtype=np.int16)})
    out = fastcollate.collate(ds.__getitems__([0, 1, 2]))
    base = out["a"].untyped_storage().data_ptr()
    assert [(v.data_ptr() - base) % C.align for v in out.values()] == [0, 0, 0]
    assert out["a"].untyped_storage().data_ptr() == out["c"].untyped_storage().data_ptr()  # one arena
