"""Arrow read from a file is checked before anything reads through it: a cache file written by
`datasets`, then tampered with in a temporary directory (list offsets that run past the values,
that decrease, an indices mapping past the table), is refused by ArrayDataset.from_hf with the
column and the chunk named -- where it used to crash the process (SIGSEGV in the gather; SIGBUS in
datasets' own row access). The reads that could crash run in a subprocess, so that a regression
fails this test instead of killing pytest. A truncated file needs nothing from us: pyarrow refuses
it when the file is opened."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

from fastcollate.data.hf import ArrowDataError, check_list_chunk  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- the check itself, on healthy arrays: what it returns is what pyarrow's offsets say -------------

@pytest.mark.parametrize("make", [
    lambda: pa.array([[1, 2], [3]]),
    lambda: pa.array([[1, 2], None, [], [3, 4, 5]]).slice(1),
    lambda: pa.array([[1.5], [2.5, 3.5]], type=pa.large_list(pa.float32())),
    lambda: pa.array([[[1], [2, 3]], [[4]]]),
    lambda: pa.array([[True, False], [None]]),
    lambda: pa.array([], type=pa.list_(pa.int64())),
    lambda: pa.array([[1, 2], [3]]).slice(2),
], ids=["list", "sliced-with-null", "large-list", "nested", "bools", "empty", "sliced-to-empty"])
def test_healthy_list_chunks_pass_and_give_their_offsets(make):
    array = make()
    got = check_list_chunk(array, "ids", 0)
    assert got.dtype == np.int64
    assert got.tolist() == (array.offsets.to_pylist() or [0])


@pytest.mark.parametrize("array", [pa.array([1, 2, 3]), pa.array([1.0, None]), pa.array([True, False, True]).slice(1),
                                   pa.array([[1, 2], [3, 4]], type=pa.list_(pa.int8(), 2)).slice(1)])
def test_healthy_flat_and_fixed_size_chunks_pass(array):
    assert check_list_chunk(array, "x", 0) is None


def test_a_type_it_cannot_check_is_named():
    with pytest.raises(TypeError, match=r"column 'text', chunk 2: cannot check a string chunk"):
        check_list_chunk(pa.array(["a"]), "text", 2)


# -- files written by datasets, then damaged ---------------------------------------------------------

datasets_required = pytest.mark.skipif(
    __import__("importlib").util.find_spec("datasets") is None, reason="needs datasets")

ROWS, PER_CHUNK = 120, 40   # three record batches (chunks) in the file


def write_cache_file(tmp_path):
    """A datasets cache file (what `map` writes) with a list column over three chunks."""
    import datasets

    base = datasets.Dataset.from_dict({"ids": [[i] * (i % 5 + 1) for i in range(ROWS)], "y": list(range(ROWS))})
    path = str(tmp_path / "cache-map.arrow")
    base.map(lambda b: b, batched=True, cache_file_name=path, writer_batch_size=PER_CHUNK)
    return path


def offsets_position(path, column, chunk):
    """Where in the file chunk `chunk` of `column` keeps its int32 list offsets."""
    with pa.memory_map(path) as source:
        whole = source.read_buffer()
        table = pa.ipc.open_stream(whole).read_all()
        array = table.column(column).chunks[chunk]
        assert table.column(column).num_chunks == ROWS // PER_CHUNK
        return array.buffers()[1].address - whole.address, len(array), len(array.values)


def patch_int(path, position, value, dtype=np.int32):
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(np.asarray(value, dtype=dtype).tobytes())


# The subprocess: open the file as a user would, make the dataset, gather every batch. It prints
# REFUSED and the message on fastcollate's error; a crash is a negative return code.
READER = textwrap.dedent("""
    import sys
    import datasets, fastcollate
    from fastcollate.data.hf import ArrowDataError
    ds = datasets.Dataset.from_file(sys.argv[1])
    if len(sys.argv) > 2:   # an indices mapping read back from its cache file
        ds = ds.shuffle(seed=0, indices_cache_file_name=sys.argv[2], load_from_cache_file=True)
    try:
        fc = fastcollate.ArrayDataset.from_hf(ds, columns=["ids", "y"])
    except ArrowDataError as e:
        print("REFUSED", e)
        sys.exit(0)
    collate = fastcollate.Collator(pad={"ids": 0})
    for s in range(0, len(fc), 16):
        collate(fc.__getitems__(list(range(s, min(s + 16, len(fc))))))
    print("READ")
""")


def read_in_subprocess(tmp_path, *paths):
    script = tmp_path / "reader.py"
    script.write_text(READER)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(script), *paths], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, f"the reader died (return code {r.returncode}): {r.stderr[-2000:]}"
    return r.stdout


@datasets_required
def test_the_healthy_file_is_read(tmp_path):
    import datasets
    from torch.utils.data import default_collate

    import fastcollate
    from helpers import assert_same

    path = write_cache_file(tmp_path)
    assert "READ" in read_in_subprocess(tmp_path, path)
    hf = datasets.Dataset.from_file(path)
    fc = fastcollate.ArrayDataset.from_hf(hf, columns=["y"])
    idx = [0, 39, 40, 119]
    assert_same(fastcollate.collate(fc.__getitems__(idx)), default_collate([{"y": hf[i]["y"]} for i in idx]))


@datasets_required
@pytest.mark.parametrize("damage", ["last-offset-past-values", "middle-offset-past-values", "offset-decreases"])
def test_tampered_list_offsets_are_refused_with_column_and_chunk(tmp_path, damage):
    path = write_cache_file(tmp_path)
    position, n, n_values = offsets_position(path, "ids", 1)
    if damage == "last-offset-past-values":
        patch_int(path, position + 4 * n, 400_000)          # the chunk's last row reads 3 MB past its values
        expect = f"row {n - 1} ends at offset 400000, the chunk has {n_values} values"
    elif damage == "middle-offset-past-values":
        patch_int(path, position + 4 * 10, 1 << 30)
        expect = f"row 9 ends at offset {1 << 30}"
    else:
        patch_int(path, position + 4 * 10, 0)                # row 9 ends before it starts
        expect = "offsets decrease at row 9"
    out = read_in_subprocess(tmp_path, path)
    assert out.startswith("REFUSED"), out
    assert "column 'ids', chunk 1" in out and expect in out, out


@datasets_required
def test_a_tampered_indices_mapping_is_refused(tmp_path):
    path = write_cache_file(tmp_path)
    indices = str(tmp_path / "indices.arrow")
    read_in_subprocess(tmp_path, path, indices)  # writes the indices cache file (a healthy read)
    with pa.memory_map(indices) as source:
        whole = source.read_buffer()
        column = pa.ipc.open_stream(whole).read_all().column(0)
        position = column.chunks[0].buffers()[1].address - whole.address
        assert column.type == pa.uint64()
    patch_int(indices, position + 8 * 5, 10_000_000, np.uint64)
    out = read_in_subprocess(tmp_path, path, indices)
    assert out.startswith("REFUSED") and "indices mapping of column 'ids'" in out, out
    assert "row 10000000 of a table of 120 rows" in out, out


@datasets_required
def test_a_truncated_file_is_refused_by_pyarrow_at_open(tmp_path):
    import datasets

    path = write_cache_file(tmp_path)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 300)
    with pytest.raises(OSError, match="Expected to be able to read"):
        datasets.Dataset.from_file(path)


def test_error_is_a_value_error():
    assert issubclass(ArrowDataError, ValueError)


# -- one-row chunks: their two offsets are checked like any others' --------------------------------

def _damaged_one_row_table(offsets):
    """A two-chunk list column whose second chunk (one row over 3 values) gets ``offsets`` after
    the table was made (pyarrow validates at construction; a file read back does not)."""
    raw = np.array([0, 3], dtype=np.int32)
    damaged = pa.Array.from_buffers(pa.list_(pa.int64()), 1, [None, pa.py_buffer(raw)],
                                    children=[pa.array([1, 2, 3], type=pa.int64())])
    table = pa.table({"ids": pa.chunked_array([pa.array([[7, 8]], type=pa.list_(pa.int64())), damaged])})
    raw[:] = offsets
    return table, damaged


DAMAGED_ONE_ROW = {(5, 2): "row 0 starts at offset 5", (13, 0): "row 0 starts at offset 13",
                   (1 << 30, 0): f"row 0 starts at offset {1 << 30}", (0, -5): "offsets decrease at row 0",
                   (2, 1): "offsets decrease at row 0", (-1, 2): "the first list offset is -1",
                   (0, 4): "row 0 ends at offset 4"}


@pytest.mark.parametrize("offsets", list(DAMAGED_ONE_ROW), ids=str)
def test_a_damaged_one_row_chunk_is_refused(offsets):
    table, damaged = _damaged_one_row_table(offsets)
    with pytest.raises(ArrowDataError, match=DAMAGED_ONE_ROW[offsets]):
        check_list_chunk(damaged, "ids", 1)
    from fastcollate.data.columnar import ColumnarCollator

    for collator in (ColumnarCollator(pad={"ids": 0}), ColumnarCollator()):
        with pytest.raises(ArrowDataError, match="column 'ids', chunk 1"):
            collator.arrow(table)


@pytest.mark.parametrize("offsets", [(5, 2), (13, 0), (1 << 30, 0), (0, -5), (0, 4)], ids=str)
def test_the_engine_checks_every_row_itself(offsets, monkeypatch):
    # defence in depth: with the Arrow check switched off, the gather's own span check refuses
    # the row before a byte is written (it used to write past the row and the arena)
    from fastcollate.data import arrow_table
    from fastcollate.data.columnar import ColumnarCollator

    monkeypatch.setattr(arrow_table, "check_list_chunk", lambda array, name, k: array.offsets.to_numpy()
                        .astype(np.int64) if hasattr(array, "offsets") else None)
    table, _ = _damaged_one_row_table(offsets)
    with pytest.raises(ValueError, match=r"column 'ids': .*(outside the memory of its source|is negative)"):
        ColumnarCollator(pad={"ids": 0}).arrow(table)
