"""The columnar collate (fastcollate.data.columnar, arrow_table): pyarrow Tables and numpy dicts
-> tensors, without Ray. Unpadded columns against ``torch.as_tensor`` of the column as numpy
(Ray's default collate's rule, compared with Ray itself in tests/integration/test_ray.py); padded
columns against the padding reference on the rows as numpy arrays; bad input refused with the
column named. Where each column goes: unpinned, the columns whose rows lie in one buffer as they
are are zero-copy views of it (valid after the next batch and after the table is dropped), the
rest one arena; ``zero_copy=False``, all of it one arena."""
from __future__ import annotations

import gc
import pickle
import subprocess
import warnings
import sys

import numpy as np
import pytest
import torch

import fastcollate
from fastcollate.data.arrow_table import COMBINE_BYTES
from fastcollate.data.columnar import ColumnarCollator
from fastcollate.data.hf import ArrowDataError
from fastcollate.device.transport import find_arena
from helpers import assert_same

pa = pytest.importorskip("pyarrow")
pc = pytest.importorskip("pyarrow.compute")

NUMERIC = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64, np.float16,
           np.float32, np.float64]


def _values(rng, dtype, n):
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    if np.issubdtype(dtype, np.floating):
        return (rng.standard_normal(n) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), n, endpoint=True).astype(dtype)


def _column_numpy(col):
    """A pyarrow column as numpy rows, what Ray's numpy format and the references read."""
    typ = col.type
    if isinstance(typ, pa.BaseExtensionType):
        shape = tuple(typ.shape)  # the storage's rows, in the tensor's shape (to_numpy_ndarray has no bools)
        return np.concatenate([_fixed_numpy(c.storage).reshape(len(c), *shape) for c in col.chunks])
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        dtype = np.dtype(typ.value_type.to_pandas_dtype()) if not pa.types.is_fixed_size_list(typ.value_type) else None
        rows = []
        for chunk in col.chunks:
            offs = chunk.offsets.to_numpy()
            flat = _fixed_numpy(chunk.values) if dtype is None else chunk.values.to_numpy(zero_copy_only=False)
            rows += [np.array(flat[offs[i]:offs[i + 1]], dtype=dtype or flat.dtype) for i in range(len(chunk))]
        out = np.empty(len(rows), dtype=object)
        out[:] = rows
        return out
    if pa.types.is_fixed_size_list(typ):
        return np.concatenate([_fixed_numpy(c) for c in col.chunks])
    return np.array(col.to_numpy())  # writable


def _fixed_numpy(arr):
    if not pa.types.is_fixed_size_list(arr.type):
        return arr.to_numpy(zero_copy_only=False)
    flat = _fixed_numpy(arr.flatten())
    return flat.reshape(len(arr), arr.type.list_size, *flat.shape[1:])


def _as_tensor(np_col):
    if np_col.dtype == object:
        np_col = np.array([np.asarray(v) for v in np_col])  # Ray's unwrap of equal-shape rows
    return torch.as_tensor(np.array(np_col))  # a writable copy: the same values


def _chunked(table, rng):
    """The same rows as several chunks, some of them sliced."""
    n = table.num_rows
    cuts = sorted(set(rng.integers(0, n + 1, 3).tolist()) | {0, n})
    parts = []
    for lo, hi in zip(cuts, cuts[1:]):
        pad_lo = int(rng.integers(0, 3))
        block = pa.concat_tables([table.slice(0, pad_lo), table.slice(lo, hi - lo), table.slice(0, 2)])
        parts.append(block.combine_chunks().slice(pad_lo, hi - lo))  # a slice of its chunk
    return pa.concat_tables(parts)


def _table(rng, rows, ragged):
    cols = {}
    for j in range(int(rng.integers(1, 5))):
        dtype = NUMERIC[int(rng.integers(len(NUMERIC)))]
        kind = int(rng.integers(4 if ragged else 3))
        if kind == 0:
            cols[f"s{j}"] = pa.array(_values(rng, dtype, rows))
        elif kind == 1:
            d = int(rng.integers(1, 5))
            cols[f"f{j}"] = pa.FixedSizeListArray.from_arrays(pa.array(_values(rng, dtype, rows * d)), d)
        elif kind == 2:
            shape = (2, int(rng.integers(1, 4)))
            vals = pa.array(_values(rng, dtype, rows * shape[0] * shape[1]))
            cols[f"t{j}"] = pa.FixedShapeTensorArray.from_storage(pa.fixed_shape_tensor(vals.type, shape),
                                                                  pa.FixedSizeListArray.from_arrays(vals, shape[0] * shape[1]))
        else:
            lens = rng.integers(0, 6, rows)
            offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            cols[f"l{j}"] = pa.ListArray.from_arrays(pa.array(offs), pa.array(_values(rng, dtype, int(offs[-1]))))
    return pa.table(cols)


def _placement(table, name, padded=(), converted=()):
    """Where the rule, written independently, puts a column: "table" (a view of the table's own
    buffer: one non-empty chunk of rows of one shape as stored -- numbers, fixed-size lists,
    tensor columns -- no bools, not padded, not converted), "combined" (such a column in several
    chunks small enough for Arrow to combine them: a view of Arrow's combined buffer), else
    "arena"."""
    col = table.column(name)
    typ = col.type
    leaf = typ.storage_type if isinstance(typ, pa.BaseExtensionType) else typ
    fixed = True
    if pa.types.is_list(leaf) or pa.types.is_large_list(leaf):
        fixed = isinstance(typ, pa.BaseExtensionType)  # a plain list column: stacked or padded, copied
        leaf = leaf.value_type
    while pa.types.is_fixed_size_list(leaf):
        leaf = leaf.value_type
    if not fixed or pa.types.is_boolean(leaf) or name in padded or name in converted:
        return "arena"
    if col.num_chunks > 1:  # several chunks, rows of one shape, a view wanted: Arrow combines them
        return "combined"
    return "table" if len(col) else "arena"


def _shares(t, col):
    """Whether tensor ``t`` starts inside one of the column's Arrow buffers."""
    p = t.data_ptr()
    for chunk in col.chunks:
        arr = chunk.storage if isinstance(chunk.type, pa.BaseExtensionType) else chunk
        if any(b is not None and b.address <= p < b.address + b.size for b in arr.buffers()):
            return True
    return False


def _check_placement(got, table, **kw):
    """Views exactly where the rule says, of the column's own buffer or of Arrow's combination of
    its chunks; everything else one arena."""
    where = {name: _placement(table, name, **kw) for name in table.column_names if name in got}
    for name, place in where.items():
        assert _shares(got[name], table.column(name)) == (place == "table"), (name, place)
    rest = {k: v for k, v in got.items() if where.get(k, "arena") == "arena"}
    assert not rest or find_arena(rest) is not None
    arena = find_arena(rest)[0].data_ptr() if rest else None
    assert all(got[k].untyped_storage().data_ptr() != arena for k, p in where.items() if p == "combined")


@pytest.mark.parametrize("seed", range(40))
def test_unpadded_columns_equal_as_tensor_of_numpy(seed):
    rng = np.random.default_rng(seed)
    table = _chunked(_table(rng, int(rng.integers(1, 40)), ragged=False), rng)
    if rng.random() < 0.5:  # one chunk, sliced or not: what the views are for
        table = table.combine_chunks().slice(int(rng.integers(0, 2)))
    want = {name: _as_tensor(_column_numpy(table.column(name))) for name in table.column_names}
    got = ColumnarCollator().arrow(table)
    assert_same(got, want)
    _check_placement(got, table)
    copied = ColumnarCollator(zero_copy=False).arrow(table)
    assert_same(copied, want)
    assert find_arena(copied) is not None


def _reference(table, **kw):
    """Row columns through the padding reference (rows as numpy arrays), number columns as
    torch.as_tensor of the column (default_collate refuses numpy uint64 scalars), in the table's
    order, the mask and lengths after."""
    cols = {name: _column_numpy(table.column(name)) for name in table.column_names}
    rows = [k for k, v in cols.items() if v.dtype == object or v.ndim > 1]
    ref = fastcollate.Collator(backend="python", **kw)([{k: cols[k][i] for k in rows} for i in range(table.num_rows)])
    out = {k: ref[k] if k in rows else torch.as_tensor(np.array(v)) for k, v in cols.items()}
    out.update((k, v) for k, v in ref.items() if k not in out)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_padded_columns_equal_the_padding_reference(seed):
    rng = np.random.default_rng(100 + seed)
    table = _chunked(_table(rng, int(rng.integers(1, 30)), ragged=True), rng)
    lists = [n for n in table.column_names if n.startswith(("l", "f"))]
    if not lists:
        table = table.append_column("ids", pa.array([list(range(int(k))) for k in rng.integers(0, 9, table.num_rows)]))
        lists = ["ids"]
    ragged = [n for n in table.column_names if n.startswith("l") and len(set(pc.list_value_length(
        table.column(n)).to_pylist())) > 1]  # padded always; the others sometimes (stacked otherwise)
    kw = dict(pad={n: int(rng.integers(0, 2)) for n in lists if n in ragged or rng.random() < 0.5} or {lists[0]: 1},
              pad_to_multiple_of=[None, 4][int(rng.integers(2))], padding_side=["right", "left"][int(rng.integers(2))],
              lengths_key=["n", None][int(rng.integers(2))], mask_dtype=[torch.int64, torch.bool][int(rng.integers(2))])
    if rng.random() < 0.3:
        kw["max_length"] = 4
    if rng.random() < 0.5:
        table = table.combine_chunks()
    got = ColumnarCollator(**kw).arrow(table)
    assert_same(got, _reference(table, **kw))
    _check_placement(got, table, padded=kw["pad"])
    assert find_arena(ColumnarCollator(zero_copy=False, **kw).arrow(table)) is not None


def test_number_columns_share_one_job_and_stay_aligned():
    rng = np.random.default_rng(7)
    for rows in (1, 13, 64, 1000):
        cols = {f"f{i}": pa.array(_values(rng, np.float32, rows)) for i in range(5)}
        cols.update({"b0": pa.array(_values(rng, np.bool_, rows)), "y": pa.array(_values(rng, np.int64, rows)),
                     "b1": pa.array(_values(rng, np.bool_, rows)),
                     "v": pa.FixedSizeListArray.from_arrays(pa.array(_values(rng, np.uint8, rows * 3)), 3),
                     "w": pa.FixedSizeListArray.from_arrays(pa.array(_values(rng, np.uint8, rows * 3)), 3)})
        table = pa.table(cols)
        for dtypes in (None, {"f1": torch.float64, "b1": torch.float32}):
            want = {n: torch.as_tensor(_column_numpy(table.column(n))) for n in table.column_names}
            for k, d in (dtypes or {}).items():
                want[k] = want[k].to(d)
            got = ColumnarCollator(dtypes=dtypes, zero_copy=False).arrow(table)
            assert_same(got, want)
            assert all(t.data_ptr() % 64 == 0 for t in got.values())  # every leaf 64-byte aligned, as the arena's
            assert find_arena(got) is not None
            got = ColumnarCollator(dtypes=dtypes).arrow(table)  # the number columns views, bools and f1 copied
            assert_same(got, want)
            _check_placement(got, table, converted=list(dtypes or {}))


def test_tokenizer_columns_padded_when_present_and_dtypes_after_padding():
    table = pa.table({"input_ids": pa.array([[5, 6, 7], [8]], pa.list_(pa.int32())),
                      "attention_mask": pa.array([[1, 1, 1], [1]], pa.list_(pa.int8())),
                      "label": pa.array([0.5, 1.5], pa.float32())})
    kw = dict(pad={"input_ids": 3}, pad_to_multiple_of=4)
    got = ColumnarCollator(**kw).arrow(table)
    assert_same(got, _reference(table, **kw))
    assert list(got) == ["input_ids", "attention_mask", "label"]  # the carried mask padded, not made again
    conv = ColumnarCollator(dtypes={"input_ids": torch.int64, "label": torch.bfloat16}, **kw).arrow(table)
    ref = _reference(table, **kw)
    assert_same(conv["input_ids"], ref["input_ids"].to(torch.int64))
    assert_same(conv["label"], ref["label"].to(torch.bfloat16))


def test_dtypes_convert_as_torch_as_tensor():
    rng = np.random.default_rng(3)
    table = _chunked(pa.table({"a": pa.array(_values(rng, np.int16, 20)), "b": pa.array(_values(rng, np.float16, 20)),
                               "c": pa.FixedSizeListArray.from_arrays(pa.array(_values(rng, np.uint8, 60)), 3)}), rng)
    for dtype in (torch.float32, torch.int32, torch.bfloat16, torch.float64):
        want = {n: torch.as_tensor(_column_numpy(table.column(n)), dtype=dtype) for n in table.column_names}
        assert_same(ColumnarCollator(dtypes=dtype).arrow(table), want)
    with pytest.raises(ValueError, match="no conversion into torch.bool"):
        ColumnarCollator(dtypes={"a": torch.bool})
    with pytest.raises(KeyError, match="'nope'"):
        ColumnarCollator(dtypes={"nope": torch.float32}).arrow(table)


def test_ray_tensor_storage_and_nested_fixed_lists():
    # Ray's tensor extension stores rows as a (large) list with offsets: a slice starts mid-buffer
    vals = np.arange(4 * 2 * 3, dtype=np.float32)
    storage = pa.LargeListArray.from_arrays(pa.array(np.arange(0, 25, 6), pa.int64()), pa.array(vals))
    table = pa.table({"x": storage}).slice(1, 3)
    got = ColumnarCollator(columns=["x"]).arrow(table)
    assert_same(got["x"], torch.from_numpy(vals.reshape(4, 6)[1:]).clone())
    nested = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(pa.array(vals), 3), 2)
    got = ColumnarCollator().arrow(pa.table({"n": nested}).slice(1, 2))
    assert_same(got["n"], torch.from_numpy(vals.reshape(4, 2, 3)[1:3]).clone())


def _tampered(offsets, patched, first=None):
    """A list column whose offsets buffer is patched after the table was built (and validated)."""
    raw = np.array(offsets, dtype=np.int32)
    arr = pa.Array.from_buffers(pa.list_(pa.int64()), len(raw) - 1, [None, pa.py_buffer(raw)],
                                children=[pa.array(np.arange(raw[-1], dtype=np.int64))])
    table = pa.table({"ids": arr if first is None else pa.chunked_array([first, arr])})
    raw[:] = patched
    return table


def test_bad_arrow_input_is_refused_with_the_column_named():
    c = ColumnarCollator(pad={"ids": 0})
    with pytest.raises(ArrowDataError, match=r"column 'ids', chunk 1: list offsets run past the values"):
        c.arrow(_tampered([0, 2, 6], [0, 2, 4000], first=pa.array([[1], [2, 3]])))
    with pytest.raises(ArrowDataError, match=r"column 'ids', chunk 0: list offsets decrease at row 1"):
        c.arrow(_tampered([0, 2, 6], [0, 4, 2]))
    plain = ColumnarCollator()
    cases = [
        (pa.table({"a": [1, None]}), ValueError, r"column 'a', chunk 0: 1 null row\(s\), the first is row 1 of the batch"),
        (pa.table({"l": [[1, None], [2, 3]]}), ValueError, r"column 'l', chunk 0: its lists hold null values"),
        (pa.table({"f": pa.array([[1, 2], None], pa.list_(pa.int64(), 2))}), ValueError, r"column 'f'.*null"),
        (pa.table({"s": ["a", "b"]}), TypeError, r"column 's' is string"),
        (pa.table({"d": pa.array(["a", "b"]).dictionary_encode()}), TypeError, r"column 'd' is dictionary"),
        (pa.table({"l": [[[1]], [[2]]]}), TypeError, r"column 'l' .*lists inside lists"),
        (pa.table({"l": [[1, 2], [3]]}), RuntimeError, r"column 'l': rows have different lengths"),
        (pa.table({"a": [1, 2], "m": [[1], [2]]}), KeyError, r"no column 'x'"),
    ]
    for table, exc, match in cases:
        with pytest.raises(exc, match=match):
            (ColumnarCollator(columns=["x"]) if exc is KeyError else plain).arrow(table)
    with pytest.raises(TypeError, match=r"padded column 'y' holds one number per row"):
        ColumnarCollator(pad={"y": 0}).arrow(pa.table({"y": [1, 2]}))
    with pytest.raises(KeyError, match=r"padded column 'ids' is not in the batch"):
        c.arrow(pa.table({"y": [1, 2]}))
    with pytest.raises(ValueError, match=r"already has a 'attention_mask' column"):
        ColumnarCollator(pad={"ids": 0}, pad_if_present={}).arrow(pa.table({"ids": [[1], [2]], "attention_mask": [1, 1]}))
    with pytest.raises(ValueError, match=r"column 'ids'.*pad value -1 does not fit"):
        ColumnarCollator(pad={"ids": -1}).arrow(pa.table({"ids": pa.array([[1], [2, 3]], pa.list_(pa.uint8()))}))
    with pytest.raises(TypeError, match="pyarrow.Table"):
        plain.arrow({"a": np.arange(3)})


def test_numpy_batches():
    rng = np.random.default_rng(0)
    batch = {"x": _values(rng, np.float32, 24).reshape(8, 3)[:, ::-1],  # rows not contiguous: copied first
             "img": _values(rng, np.uint8, 8 * 12).reshape(8, 3, 2, 2), "y": _values(rng, np.int64, 8),
             "b": _values(rng, np.bool_, 8), "be": _values(rng, np.int32, 8).astype(">i4")}
    got = ColumnarCollator(zero_copy=False).numpy({k: v for k, v in batch.items() if k != "be"})
    assert_same(got, {k: torch.as_tensor(v.copy()) for k, v in batch.items() if k != "be"})
    assert find_arena(got) is not None
    got = ColumnarCollator().numpy({k: v for k, v in batch.items() if k != "be"})  # contiguous columns: shared
    assert_same(got, {k: torch.as_tensor(v.copy()) for k, v in batch.items() if k != "be"})
    assert [k for k in got if np.shares_memory(got[k].numpy(), batch[k])] == ["img", "y", "b"]
    assert ColumnarCollator().numpy({"be": batch["be"]})["be"].tolist() == batch["be"].tolist()
    ragged = np.empty(8, dtype=object)
    ragged[:] = [_values(rng, np.int32, int(k)) for k in rng.integers(0, 6, 8)]
    samples = [{"ids": ragged[i], "y": batch["y"][i]} for i in range(8)]
    for kw in (dict(pad={"ids": 0}), dict(pad={"ids": -7}, padding_side="left", pad_to_multiple_of=8, lengths_key="n")):
        assert_same(ColumnarCollator(**kw).numpy({"ids": ragged, "y": batch["y"]}),
                    fastcollate.Collator(backend="python", **kw)(samples))
    equal = np.empty(3, dtype=object)
    equal[:] = [np.arange(4, dtype=np.int16) + i for i in range(3)]
    assert_same(ColumnarCollator().numpy({"e": equal}), {"e": torch.as_tensor(np.stack(list(equal)))})
    with pytest.raises(RuntimeError, match=r"column 'ids': rows have different lengths"):
        ColumnarCollator().numpy({"ids": ragged})
    with pytest.raises(TypeError, match=r"column 's' is a numpy array of <U1"):
        ColumnarCollator().numpy({"s": np.array(["a", "b"])})
    with pytest.raises(TypeError, match=r"column 'c' is a numpy array of complex64"):
        ColumnarCollator().numpy({"c": np.zeros(2, np.complex64)})
    mixed = np.empty(2, dtype=object)
    mixed[:] = [np.arange(2, dtype=np.int32), np.arange(3, dtype=np.int64)]
    with pytest.raises(TypeError, match=r"column 'm': row 1 has dtype int64, row 0 has torch.int32"):
        ColumnarCollator(pad={"m": 0}).numpy({"m": mixed})
    with pytest.raises(ValueError, match="different numbers of rows"):
        ColumnarCollator().numpy({"a": np.arange(2), "b": np.arange(3)})


def test_pickles_and_pins_as_collator_does():
    c = pickle.loads(pickle.dumps(ColumnarCollator(pad={"ids": 0}, dtypes={"ids": torch.int32}, lengths_key="n")))
    out = c.arrow(pa.table({"ids": [[1, 2], [3]]}))
    assert out["ids"].dtype == torch.int32 and out["n"].tolist() == [2, 1]
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available"):
            assert ColumnarCollator(pin_memory=True).pin_memory is False


def test_only_the_adapter_imports_ray_at_module_level():
    import ast
    import os

    pkg = os.path.dirname(fastcollate.__file__)
    top, anywhere = set(), set()
    for dirpath, _, files in os.walk(pkg):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            tree = ast.parse(open(path).read())
            rel = os.path.relpath(path, pkg)
            for node in ast.walk(tree):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
                if any(m == "ray" or m.startswith("ray.") for m in mods if m):
                    anywhere.add(rel)
                    if node in tree.body:
                        top.add(rel)
    assert top == {"ray.py"}  # everything else imports ray inside a function: the benchmarks that run Ray
    assert anywhere <= {"ray.py", os.path.join("_bench", "engines.py"), os.path.join("_bench", "ray_peer.py")}


def test_import_fastcollate_never_imports_ray():
    code = "import sys, fastcollate, fastcollate.data.columnar, fastcollate.data.arrow_table; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    # fastcollate.ray is an attribute made on first use (where ray is installed)
    code = "import fastcollate; print(fastcollate.ray.ArrowCollate.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    try:
        import ray.data  # noqa: F401
    except ImportError:
        assert "No module named 'ray'" in out.stderr
    else:
        assert out.stdout.strip() == "fastcollate.ray", out.stderr[-2000:]


def _fresh_table(seed, rows=64):
    """A table whose every buffer is its own, read-only (pa.py_buffer of bytes): as Ray's object
    store hands them out."""
    rng = np.random.default_rng(seed)

    def numbers(dtype, n):
        return pa.Array.from_buffers(pa.from_numpy_dtype(dtype), n, [None, pa.py_buffer(_values(rng, dtype, n).tobytes())])

    img = pa.FixedShapeTensorArray.from_storage(pa.fixed_shape_tensor(pa.uint8(), (3, 4, 4)),
                                                pa.FixedSizeListArray.from_arrays(numbers(np.uint8, rows * 48), 48))
    return pa.table({"img": img, "x": pa.FixedSizeListArray.from_arrays(numbers(np.float32, rows * 5), 5),
                     "y": numbers(np.int64, rows), "w": numbers(np.float16, rows)})


def test_views_outlive_the_next_batch_and_the_table_and_raise_no_warning():
    c = ColumnarCollator()
    table = _fresh_table(0)
    assert not table.column("y").chunks[0].buffers()[1].is_mutable
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not writable" warning for read-only Arrow memory
        first = c.arrow(table.slice(3, 40))
    want = {k: v.clone() for k, v in first.items()}
    _check_placement(first, table.slice(3, 40))
    held = pa.total_allocated_bytes()
    second = c.arrow(_fresh_table(1))  # a later batch: new buffers, nothing written into the first's
    assert_same(first, want)
    del table, second
    gc.collect()
    assert_same(first, want)  # the views hold their buffers: still the values, after the table is gone
    assert pa.total_allocated_bytes() <= held
    del first
    gc.collect()


def test_views_hold_the_arrow_memory_until_dropped():
    gc.collect()
    base = pa.total_allocated_bytes()
    table = pa.table({"x": pc.add(pa.array(np.arange(1 << 18, dtype=np.int64)), 0)})  # 2 MiB from Arrow's pool
    out = ColumnarCollator().arrow(table)
    assert _shares(out["x"], table.column("x"))
    del table
    gc.collect()
    assert pa.total_allocated_bytes() - base >= 8 << 18  # kept by the view
    assert out["x"][-1].item() == (1 << 18) - 1
    del out
    gc.collect()
    assert pa.total_allocated_bytes() - base < 8 << 18  # and released with it


def test_what_is_never_a_view():
    rng = np.random.default_rng(5)
    vals = pa.array(_values(rng, np.int32, 20))
    big = pa.array(_values(rng, np.int32, 600_000))  # 2.4 MB: chunks of 1.2 MB are gathered as they are
    cases = {
        # going to the arena (pinned, or zero_copy=False), large chunks are gathered into it as they are
        "two big chunks, arena": (pa.table({"a": pa.chunked_array([big.slice(0, 300_000), big.slice(300_000)])}),
                                  dict(zero_copy=False)),
        "bools": (pa.table({"a": pa.array(_values(rng, np.bool_, 20))}), {}),
        "converted": (pa.table({"a": vals}), dict(dtypes=torch.int64)),
        "padded": (pa.table({"a": pa.FixedSizeListArray.from_arrays(pa.array(_values(rng, np.int32, 40)), 2)}),
                   dict(pad={"a": 0})),
        "lists of one length": (pa.table({"a": pa.array([[1, 2]] * 5)}), {}),
    }
    for what, (table, kw) in cases.items():
        got = ColumnarCollator(**kw).arrow(table)
        assert not _shares(got["a"], table.column("a")), what
        assert find_arena(got) is not None, what
        if "pad" not in kw:
            assert_same(got["a"], _as_tensor(_column_numpy(table.column("a"))).to(kw.get("dtypes", got["a"].dtype)), what)
    # several chunks, small or large, unpinned: combined by Arrow (the copy Ray's default makes),
    # then that combination handed out (not the table's memory, not an arena)
    for chunks in ([vals.slice(0, 10), vals.slice(10)], [big.slice(0, 300_000), big.slice(300_000)]):
        table = pa.table({"a": pa.chunked_array(chunks)})
        got = ColumnarCollator().arrow(table)
        assert _placement(table, "a") == "combined" and not _shares(got["a"], table.column("a"))
        assert_same(got["a"], _as_tensor(_column_numpy(table.column("a"))))
    # a column named in pad that holds numbers is still refused, view or not
    with pytest.raises(TypeError, match=r"padded column 'a' holds one number per row"):
        ColumnarCollator(pad={"a": 0}).arrow(pa.table({"a": vals}))


class _RayLikeTensor(pa.ExtensionType):
    """Ray's tensor extension as it is stored (a large list of the flat rows, named as Ray names
    it), without importing Ray."""

    def __init__(self, shape, value_type):
        self.shape = shape
        super().__init__(pa.large_list(value_type), "ray.data.arrow_tensor_v2")

    def __arrow_ext_serialize__(self):
        return ",".join(map(str, self.shape)).encode()

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        return cls(tuple(int(d) for d in serialized.decode().split(",")), storage_type.value_type)


def test_views_of_ray_tensor_storage_are_checked_first():
    raw = np.arange(0, 25, 6, dtype=np.int64)
    vals = np.arange(24, dtype=np.float32)
    storage = pa.Array.from_buffers(pa.large_list(pa.float32()), 4, [None, pa.py_buffer(raw)],
                                    children=[pa.array(vals)])
    table = pa.table({"x": pa.ExtensionArray.from_storage(_RayLikeTensor((2, 3), pa.float32()), storage)})
    got = ColumnarCollator().arrow(table.slice(1, 2))  # a slice: its rows start mid-buffer
    assert_same(got["x"], torch.from_numpy(vals.reshape(4, 2, 3)[1:3]).clone())
    assert _shares(got["x"], table.column("x"))
    raw[2] = 13  # patched after the table was built: row 1 now holds 7 values, row 2 holds 5
    with pytest.raises(ArrowDataError, match=r"column 'x', chunk 0: tensor row 1 holds 7 values"):
        ColumnarCollator().arrow(table)
    with pytest.raises(ValueError, match=r"column 'a', chunk 0: 1 null"):
        ColumnarCollator().arrow(pa.table({"a": pa.array([1, None, 3])}))


def test_numpy_views_of_read_only_arrays_raise_no_warning():
    arr = np.arange(12, dtype=np.float32).reshape(4, 3)
    arr.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = ColumnarCollator().numpy({"x": arr})
    assert np.shares_memory(out["x"].numpy(), arr) and out["x"].tolist() == arr.tolist()
    del arr
    gc.collect()
    assert out["x"][3, 2].item() == 11.0  # torch.from_numpy keeps the array


@pytest.mark.cuda
def test_pinned_is_one_pinned_arena_whatever_the_layout():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    table = _fresh_table(2)
    got = ColumnarCollator(pin_memory=True).arrow(table)
    assert find_arena(got) is not None and all(t.is_pinned() for t in got.values())
    assert not any(_shares(got[k], table.column(k)) for k in got)
