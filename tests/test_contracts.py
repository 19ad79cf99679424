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
    job = C.GatherJob(kind=C.JobKind.Rows, offset=0, ptrs=ptrs, rows=2, L=3, src=torch.uint8, dst=torch.int64,
                      shape=(2, 3))
    lengths = C.GatherJob(kind=C.JobKind.Lengths, offset=C.align, lens=torch.tensor([3, 1]), rows=2, L=2,
                          src=torch.int64, dst=torch.int64, shape=(2,))
    out, n = C.gather(arena, [job, lengths], 1)
    assert out.tolist() == [rows[2].tolist(), rows[0].tolist()] and n.tolist() == [2, 1]


def test_job_kinds_are_the_enum():
    assert set(C.JobKind.__members__) == {"Rows", "Mask", "Lengths"}
    assert len({int(k) for k in C.JobKind.__members__.values()}) == 3


def test_fixed_column_is_built_by_keyword():
    col = C.FixedColumn(base=0, row_stride=8, shift=0, L=1, inner=1, src=torch.int64, dst=torch.int64,
                        trailing=[], scalar=True)
    assert (col.row_stride, col.scalar, col.dst, list(col.trailing)) == (8, True, torch.int64, [])
    with pytest.raises(TypeError):
        C.FixedColumn(0, 8, 0, 1, 1, torch.int64, torch.int64, [], True)


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
