"""fastcollate.ray in a local Ray cluster (started once for the module): datasets made with
``from_items``, ``from_numpy`` and ``read_parquet`` (files written in a temporary directory),
read with ``iter_torch_batches(collate_fn=ArrowCollate(...))``, give Ray's default collate's
batches -- keys, dtypes, shapes and bytes -- batch for batch, through multi-chunk and sliced
tables, and hands out zero-copy every column Ray's default hands out zero-copy (on the same
table); padded columns equal the padding reference; ``NumpyCollate`` equals Ray's own numpy
conversion; with ``zero_copy=False`` (or pinned) every batch is one arena, which
``CudaPrefetcher`` wrapping Ray's iterator sees; a 2-worker ``TorchTrainer`` trains from
``get_dataset_shard`` with it (examples/ray_train.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pytest.importorskip("pydantic")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import fastcollate  # noqa: E402
from fastcollate.data.hf import ArrowDataError  # noqa: E402
from fastcollate.device.transport import find_arena  # noqa: E402
from fastcollate.ray import ArrowCollate, NumpyCollate  # noqa: E402
from helpers import assert_same  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module", autouse=True)
def cluster():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    old = ctx.execution_options.preserve_order, ctx.enable_progress_bars
    ctx.execution_options.preserve_order = True  # batch for batch comparisons
    ctx.enable_progress_bars = False
    yield
    ctx.execution_options.preserve_order, ctx.enable_progress_bars = old
    if started:
        ray.shutdown()


def _in_table(t, table):
    """Whether tensor ``t`` starts inside one of the table's Arrow buffers (a zero-copy view)."""
    p = t.data_ptr()
    for col in table.columns:
        for chunk in col.chunks:
            arr = chunk.storage if isinstance(chunk.type, pa.BaseExtensionType) else chunk
            if any(b is not None and b.address <= p < b.address + b.size for b in arr.buffers()):
                return True
    return False


class Recording(ArrowCollate):
    """ArrowCollate that notes the tables Ray hands it (chunks, slices) and, on the same table,
    which columns Ray's default collate (as iter_torch_batches makes it on the CPU) and this one
    hand out zero-copy."""

    def __init__(self, *a, **kw):
        from ray.data.collate_fn import DefaultCollateFn

        super().__init__(*a, **kw)
        self.tables, self.views, self.default = [], [], DefaultCollateFn(combine_chunks=True)

    def __call__(self, batch):
        self.tables.append([(c.num_chunks, [ch.offset for ch in c.chunks]) for c in batch.columns])
        out = super().__call__(batch)
        if self.engine.dtypes is None and self.engine.spec is None:
            theirs = self.default(batch)
            assert_same(out, theirs)
            self.views.append(({k for k, v in theirs.items() if _in_table(v, batch)},
                               {k for k, v in out.items() if _in_table(v, batch)}))
        return out


def _default(ds, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "the given NumPy array is not writable"
        return list(ds.iter_torch_batches(**kw))


def _same_batches(got, want, one_arena=False):
    assert len(got) == len(want) and got
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"batch {i}")
        assert not one_arena or find_arena(g) is not None, f"batch {i} is not one arena"


def _items(n, rng):
    return [{"x": rng.standard_normal(6).astype(np.float32), "y": int(i), "w": float(rng.standard_normal()),
             "img": rng.integers(0, 255, (3, 4, 5), dtype=np.uint8), "pair": [i, -i],
             "ids": rng.integers(0, 1000, int(rng.integers(1, 12))).tolist()} for i in range(n)]


def test_from_items_equals_rays_default_through_multi_chunk_and_sliced_batches():
    ds = ray.data.from_items(_items(61, np.random.default_rng(0)), override_num_blocks=5)
    fixed = ds.select_columns(["x", "y", "w", "img", "pair"])
    collate = Recording()
    for batch_size in (7, 16):
        _same_batches(list(fixed.iter_torch_batches(batch_size=batch_size, collate_fn=collate)),
                      _default(fixed, batch_size=batch_size))
        _same_batches(list(fixed.iter_torch_batches(batch_size=batch_size, collate_fn=ArrowCollate(zero_copy=False))),
                      _default(fixed, batch_size=batch_size), one_arena=True)
    assert any(n > 1 for t in collate.tables for n, _ in t), "no batch spanned two blocks"
    assert any(o > 0 for t in collate.tables for _, offs in t for o in offs), "no batch was a slice of a block"
    # zero-copy wherever Ray's default is (Ray's block buffers, sliced ones included), and some of it
    assert all(theirs <= ours for theirs, ours in collate.views), collate.views
    assert any(theirs & {"x", "img", "y"} for theirs, _ in collate.views)
    # the dtypes Ray's default takes, converted the same way
    _same_batches(list(fixed.iter_torch_batches(batch_size=16, collate_fn=ArrowCollate(dtypes=torch.float32))),
                  _default(fixed, batch_size=16, dtypes=torch.float32))
    _same_batches(list(fixed.iter_torch_batches(batch_size=16, collate_fn=ArrowCollate(
                      dtypes={"x": torch.float64, "y": torch.int32, "w": torch.float32, "img": torch.float16,
                              "pair": torch.int64}))),
                  _default(fixed, batch_size=16, dtypes={"x": torch.float64, "y": torch.int32, "w": torch.float32,
                                                         "img": torch.float16, "pair": torch.int64}))


def test_from_numpy_and_read_parquet_equal_rays_default(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (40, 3, 8, 8), dtype=np.uint8)
    for ds in (ray.data.from_numpy(images), ray.data.from_numpy([images[:17], images[17:]]),
               ray.data.from_numpy(rng.standard_normal(30).astype(np.float16))):
        collate = Recording()
        _same_batches(list(ds.iter_torch_batches(batch_size=8, collate_fn=collate)), _default(ds, batch_size=8))
        assert all(theirs <= ours for theirs, ours in collate.views) and any(ours for _, ours in collate.views)
    for f in range(3):
        n = 50
        table = pa.table({"feats": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 16).astype(
                              np.float32)), 16),
                          "label": pa.array(rng.integers(0, 10, n)), "flag": pa.array(rng.random(n) < 0.5),
                          "u16": pa.array(rng.integers(0, 60000, n).astype(np.uint16)),
                          "ids": pa.array([rng.integers(0, 30000, int(k)).astype(np.int32)
                                           for k in rng.integers(0, 20, n)], pa.list_(pa.int32()))})
        pq.write_table(table, tmp_path / f"part{f}.parquet", row_group_size=13)
    ds = ray.data.read_parquet(str(tmp_path))
    fixed = ds.select_columns(["feats", "label", "flag", "u16"])
    collate = Recording()
    _same_batches(list(fixed.iter_torch_batches(batch_size=32, collate_fn=collate)), _default(fixed, batch_size=32))
    assert any(o > 0 for t in collate.tables for _, offs in t for o in offs)  # (Ray reads the small files as one block)
    assert all(theirs <= ours for theirs, ours in collate.views)
    assert all("flag" not in ours for _, ours in collate.views)  # bools: bits in Arrow, copied (as Ray's default)
    # the token lists, padded: the padding reference on the rows as numpy arrays (dtype int32 kept)
    kw = dict(pad={"ids": -1}, pad_to_multiple_of=8, padding_side="left", lengths_key="lengths")
    got = list(ds.iter_torch_batches(batch_size=32, collate_fn=ArrowCollate(**kw)))
    want = [_pad_reference(b, kw) for b in ds.iter_batches(batch_size=32, batch_format="numpy")]
    _same_batches(got, want)
    assert got[0]["ids"].dtype == torch.int32 and got[0]["attention_mask"].dtype == torch.int64


def _pad_reference(batch, kw):
    rows = [k for k, v in batch.items() if v.dtype == object or v.ndim > 1]
    samples = [{k: np.array(batch[k][i]) for k in rows} for i in range(len(next(iter(batch.values()))))]
    ref = fastcollate.Collator(backend="python", **kw)(samples)
    out = {k: ref[k] if k in rows else torch.as_tensor(np.array(v)) for k, v in batch.items()}
    out.update((k, v) for k, v in ref.items() if k not in out)
    return out


def test_padding_through_ray_equals_the_reference():
    ds = ray.data.from_items(_items(45, np.random.default_rng(2)), override_num_blocks=3)
    for kw in (dict(pad={"ids": 0}), dict(pad={"ids": 7, "pair": -1}, max_length=8, mask_dtype=torch.bool)):
        got = list(ds.iter_torch_batches(batch_size=10, collate_fn=ArrowCollate(**kw)))
        want = [_pad_reference(b, kw) for b in ds.iter_batches(batch_size=10, batch_format="numpy")]
        _same_batches(got, want)


def test_numpy_collate_equals_rays_numpy_conversion():
    from ray.data.util.torch_utils import convert_ndarray_batch_to_torch_tensor_batch

    ds = ray.data.from_items(_items(30, np.random.default_rng(3)), override_num_blocks=3).select_columns(
        ["x", "y", "w", "img", "pair"])
    got = list(ds.iter_torch_batches(batch_size=8, collate_fn=NumpyCollate()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        want = [convert_ndarray_batch_to_torch_tensor_batch(b) for b in ds.iter_batches(batch_size=8,
                                                                                        batch_format="numpy")]
    _same_batches(got, want)
    padded = ray.data.from_items(_items(30, np.random.default_rng(4)), override_num_blocks=2)
    kw = dict(pad={"ids": 0}, lengths_key="n")
    got = list(padded.iter_torch_batches(batch_size=8, collate_fn=NumpyCollate(**kw)))
    _same_batches(got, [_pad_reference(b, kw) for b in padded.iter_batches(batch_size=8, batch_format="numpy")])


def test_writing_in_place_reaches_rays_block_exactly_as_with_rays_default():
    # the documented sharing: views of Ray's block, written through as Ray's default's are;
    # zero_copy=False copies, and the block stays as it was
    for collate, shared in ((None, True), (ArrowCollate(), True), (ArrowCollate(zero_copy=False), False)):
        ds = ray.data.from_numpy(np.arange(64, dtype=np.int64).reshape(16, 4)).materialize()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            first = next(iter(ds.iter_torch_batches(batch_size=8, collate_fn=collate)))
            first["data"][0, 0] = 999
            again = next(iter(ds.iter_torch_batches(batch_size=8, collate_fn=collate)))
        assert (again["data"][0, 0].item() == 999) is shared, collate


def test_bad_columns_are_refused_with_the_column_named():
    rows = [{"a": i, "s": f"row {i}", "n": None if i == 3 else i, "ids": list(range(i % 3 + 1))} for i in range(8)]
    ds = ray.data.from_items(rows)
    # the collate's own exception classes reach the loop through Ray's iterator
    with pytest.raises(TypeError, match=r"column 's' is string"):
        list(ds.iter_torch_batches(batch_size=4, collate_fn=ArrowCollate()))
    with pytest.raises(ValueError, match=r"column 'n', chunk [0-9]+: 1 null row\(s\), the first is row 3 of the batch"):
        list(ds.iter_torch_batches(batch_size=4, collate_fn=ArrowCollate(columns=["a", "n"])))
    with pytest.raises(RuntimeError, match=r"column 'ids': rows have different lengths"):
        list(ds.iter_torch_batches(batch_size=4, collate_fn=ArrowCollate(columns=["a", "ids"])))
    out = list(ds.iter_torch_batches(batch_size=4, collate_fn=ArrowCollate(columns=["ids", "a"], pad={"ids": 0})))
    assert list(out[0]) == ["ids", "a", "attention_mask"] and out[0]["ids"].shape == (4, 3)
    # a tampered offsets buffer (what a damaged file would hold), handed as Ray hands a batch
    raw = np.array([0, 2, 6], dtype=np.int32)
    arr = pa.Array.from_buffers(pa.list_(pa.int64()), 2, [None, pa.py_buffer(raw)],
                                children=[pa.array(np.arange(6, dtype=np.int64))])
    table = pa.table({"ids": arr})
    raw[2] = 1 << 20
    with pytest.raises(ArrowDataError, match=r"column 'ids', chunk 0: list offsets run past the values"):
        ArrowCollate(pad={"ids": 0})(table)


def test_cuda_prefetcher_wrapping_rays_iterator_sees_one_arena():
    ds = ray.data.from_items(_items(40, np.random.default_rng(5)), override_num_blocks=4)
    # pinned (where there is CUDA) or zero_copy=False: one arena, whatever the layout
    collate = ArrowCollate(pad={"ids": 0}, pin_memory="auto", zero_copy=False)
    want = list(ds.iter_torch_batches(batch_size=8, collate_fn=collate, device="cpu"))
    prefetcher = fastcollate.CudaPrefetcher(ds.iter_torch_batches(batch_size=8, collate_fn=collate, device="cpu"),
                                            device="cpu")
    got = []
    with prefetcher:
        for batch in prefetcher:
            assert find_arena(batch) is not None  # the prefetcher's transport would move it in one copy
            got.append(batch)
    _same_batches(got, want, one_arena=True)
    assert prefetcher.stats()["batches"] == len(want)
    # unpinned, zero-copy views and the arena side by side pass through the same (the same values)
    views = ArrowCollate(pad={"ids": 0})
    with fastcollate.CudaPrefetcher(ds.iter_torch_batches(batch_size=8, collate_fn=views, device="cpu"),
                                    device="cpu") as prefetcher:
        _same_batches(list(prefetcher), want)


@pytest.mark.cuda
def test_on_the_gpu_rays_placement_and_the_prefetchers_single_copy():
    ds = ray.data.from_items(_items(40, np.random.default_rng(6)), override_num_blocks=4).select_columns(
        ["x", "y", "img"])
    want = _default(ds, batch_size=8, device="cuda")
    got = list(ds.iter_torch_batches(batch_size=8, collate_fn=ArrowCollate(pin_memory=True), device="cuda"))
    for g, w in zip(got, want):
        assert_same(g, w)
    prefetcher = fastcollate.CudaPrefetcher(ds.iter_torch_batches(batch_size=8, collate_fn=ArrowCollate(
        pin_memory=True), device="cpu"), device="cuda")
    got = list(prefetcher)
    for g, w in zip(got, want):
        assert_same(g, w)
    assert prefetcher.stats()["single_copy_batches"] == len(want)


def test_pickled_collate_objects_work():
    import pickle

    import ray.cloudpickle

    for c in (ArrowCollate(pad={"ids": 0}, dtypes={"x": torch.float64}), NumpyCollate()):
        for dumps, loads in ((pickle.dumps, pickle.loads), (ray.cloudpickle.dumps, ray.cloudpickle.loads)):
            again = loads(dumps(c))
            assert type(again) is type(c) and repr(again) == repr(c)


def test_bench_engines_runs_and_checks_its_outputs_equal(tmp_path):
    # `fastcollate bench --engines --quick`: the tables' code path on four kinds of column (views,
    # padding into the arena, fixed-size lists and bools, many small chunks), outputs compared first;
    # no timing is asserted
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    kinds = ["columns", "lists", "tokens", "chunks"]  # in the tables' order
    out = tmp_path / "engines.json"
    r = subprocess.run([sys.executable, "-m", "fastcollate", "bench", "--engines", "--quick", "--workloads",
                        ",".join(kinds), "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    import json

    result = json.loads(out.read_text())["engines"]
    for table in ("collate", "epochs"):
        rows = result[table]
        assert [row["workload"] for row in rows] == kinds, rows
        assert all(row["equal"] is True and row["speedup"] > 0 for row in rows), rows
    views = {row["workload"]: (row["ray_views"], row["ours_views"]) for row in result["collate"]}
    assert views["columns"] == (17, 17) and views["lists"] == (1, 2)  # zero-copy where Ray is, and the lists too
    assert all(row["batches"] == 3 for row in result["epochs"])
    for kind in kinds:  # each row printed in both tables
        label = next(row["description"] for row in result["collate"] if row["workload"] == kind)
        assert r.stdout.count(f"| {label}") == 2, r.stdout


def test_torch_trainer_two_workers_from_dataset_shards(tmp_path):
    # examples/ray_train.py: a 2-worker TorchTrainer (CPU, gloo), each worker reading
    # get_dataset_shard with ArrowCollate + CudaPrefetcher; it checks its own claims
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own local cluster
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ray_train.py"), "--workers", "2",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=420, env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    assert "every row once per epoch: True; every batch one arena / one copy: True" in r.stdout
