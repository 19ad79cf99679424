"""numpy leaves read from their buffers (no tensor per array): every way a column can leave the
common case -- another dtype, byte order, shape, layout, a subclass, a non-array -- still gives
default_collate's result or its error."""
import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import fastcollate
from helpers import assert_same


def same_or_same_error(batch):
    try:
        want = default_collate(batch)
    except Exception as exc:  # noqa: BLE001 - the error type is what must match
        with pytest.raises(type(exc)):
            fastcollate.collate(batch)
        return
    assert_same(fastcollate.collate(batch), want)


def base(n=6, dtype=np.float32, shape=(3, 4)):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(shape) * 10).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int16, np.uint8, np.bool_, np.float16,
                                   np.complex64, np.uint16])
def test_uniform_columns(dtype):
    same_or_same_error(base(dtype=dtype))
    same_or_same_error([{"x": a, "y": i} for i, a in enumerate(base(dtype=dtype))])


@pytest.mark.parametrize("odd", ["float64", "byteswapped", "shape", "strided", "fortran", "memmap_rows", "tensor",
                                 "list", "zero_d", "empty", "same_dtype_other_object", "subclass", "int32_same_size"])
def test_a_later_sample_leaves_the_common_case(odd, tmp_path):
    arrs = base()
    a = arrs[3]
    arrs[3] = {
        "float64": a.astype(np.float64),
        "byteswapped": a.astype(">f4"),
        "shape": a[:2],
        "strided": np.ascontiguousarray(np.repeat(a, 2, axis=1))[:, ::2],
        "fortran": np.asfortranarray(a),
        "memmap_rows": None,
        "tensor": torch.from_numpy(a),
        "list": a.tolist(),
        "zero_d": np.float32(1.0),
        "empty": np.zeros((0, 4), np.float32),
        # equal to sample 0's dtype, but another descriptor object: the struct check defers to the buffer's
        "same_dtype_other_object": a.astype(np.dtype("f4", metadata={"unit": "m"})),
        "subclass": a.view(Tagged),
        "int32_same_size": a.view(np.int32),  # same itemsize and shape, another dtype
    }[odd]
    if odd == "memmap_rows":
        path = tmp_path / "m.bin"
        np.stack(base()).tofile(path)
        mm = np.memmap(path, dtype=np.float32, mode="r", shape=(6, 3, 4))
        arrs = [mm[i] for i in range(6)]
    same_or_same_error(arrs)


class Tagged(np.ndarray):
    pass


@pytest.mark.parametrize("kind", ["bool_", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
                                  "complex64", "complex128"])
def test_scalar_columns_of_every_numeric_type(kind):
    t = getattr(np, kind)
    values = [t(v) for v in (0, 1, 3, 7, 1, 0)] if kind != "bool_" else [np.bool_(v) for v in (0, 1, 1, 0)]
    same_or_same_error(values)
    same_or_same_error([(np.zeros(2, np.float32), v) for v in values])
    if kind == "float32":
        same_or_same_error([np.float32(1.5), np.float64(2.5)])  # mixed: torch.as_tensor promotes


def test_the_compiled_engine_reads_numpy_structs_in_ci():
    from fastcollate import _ext
    import os

    if not os.environ.get("CI") or _ext._C is None:
        pytest.skip("CI's build has numpy at build time; a local build may not")
    assert _ext._C.numpy_structs(), "built without numpy's headers: numpy leaves go through the buffer protocol"


def test_views_and_read_only_arrays():
    block = np.arange(6 * 12, dtype=np.int32).reshape(6, 3, 4)
    block.setflags(write=False)
    same_or_same_error([block[i] for i in range(6)])
    same_or_same_error([block[i, :, ::-1] for i in range(6)])  # negative strides: torch refuses, as default_collate
    same_or_same_error([block[i].T for i in range(6)])
