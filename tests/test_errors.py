"""Every input default_collate rejects: the same exception class, and a message that names the
key path, the sample and what differed."""
import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import fastcollate
from fastcollate import reference

IMPLS = {"cpp": fastcollate.Collator(backend="cpp"), "python": fastcollate.Collator(backend="python")}

CASES = {
    "empty": ([], IndexError, ["empty batch"]),
    "shape": ([{"image": torch.zeros(3, 224, 224)}] * 17 + [{"image": torch.zeros(3, 200, 224)}], RuntimeError,
              ["batch['image']", "sample 17", "[3, 200, 224]", "[3, 224, 224]"]),
    "shape-nested": ([[torch.zeros(2), (torch.zeros(1),)], [torch.zeros(2), (torch.zeros(3),)]], RuntimeError,
                     ["batch[1][0]", "sample 1", "[3]", "[1]"]),
    "not-a-tensor": ([{"x": torch.zeros(2)}, {"x": 3}], TypeError, ["batch['x']", "sample 1", "int", "Tensor"]),
    "unsupported": ([{"o": object()}, {"o": object()}], TypeError, ["batch['o']", "object"]),
    "unsupported-top": ([None, None], TypeError, ["batch", "NoneType"]),
    "str-numpy": ([{"a": np.array(["x"])}, {"a": np.array(["y"])}], TypeError, ["batch['a']", "<U1"]),
    "object-numpy": ([np.array([object()])] * 2, TypeError, ["batch", "object"]),
    "object-numpy-later": ([np.zeros(2), np.array([None, None])], TypeError, ["sample 1"]),
    "negative-strides": ([np.arange(3)[::-1].copy(), np.arange(3)[::-1]], ValueError, ["sample 1"]),
    "missing-key": ([{"a": 1, "b": 2}, {"a": 1}], KeyError, ["sample 1", "'b'", "['a', 'b']"]),
    "not-a-mapping": ([{"a": 1}, [1]], TypeError, ["sample 1", "list"]),
    "lengths": ([{"s": [1, 2]}, {"s": [1, 2]}, {"s": [1, 2, 3]}], RuntimeError,
                ["batch['s']", "sample 2", "length 3", "length 2"]),
    "not-sized": ([[1, 2], 5], TypeError, ["sample 1", "int"]),
    "int-overflow": ([{"n": 1}, {"n": 2**64}], type(None), ["batch['n']", "sample 1", "int64"]),
    "float-then-str": ([1.0, "a"], TypeError, ["sample 1", "str"]),
    "nested-tensor": ([torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])] * 2, RuntimeError,
                      ["nested"]),
    "sparse-tensor": ([torch.zeros(3).to_sparse()] * 2, RuntimeError, ["sparse"]),
    "generator": ((x for x in [torch.zeros(1)]), TypeError, ["generator"]),
}


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_rejected_like_default_collate(name, impl):
    batch, _, needles = CASES[name]
    with pytest.raises(Exception) as theirs:
        default_collate(batch() if callable(batch) else batch)
    if name == "generator":
        batch = (x for x in [torch.zeros(1)])
    with pytest.raises(theirs.type) as ours:
        IMPLS[impl](batch)
    assert type(ours.value) is theirs.type
    msg = str(ours.value)
    if name in ("nested-tensor", "sparse-tensor"):  # torch's own words first: code matches on them
        assert msg.startswith(str(theirs.value)) and "fastcollate: batch: sample 0" in msg, msg
    else:
        assert msg.startswith("fastcollate: ") or msg.startswith("\"fastcollate: "), msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


def test_errors_are_counted_and_logged(caplog):
    fastcollate.reset_stats()
    with caplog.at_level("ERROR", logger="fastcollate"):
        with pytest.raises(RuntimeError):
            fastcollate.collate([{"image": torch.zeros(3, 4)}, {"image": torch.zeros(3, 5)}])
    assert fastcollate.stats()["errors"] == {"RuntimeError": 1}
    record = caplog.records[-1]
    assert "batch['image']" in record.getMessage()
    assert "2 samples" in record.getMessage() and "[3, 4]" in record.getMessage()


def test_original_error_is_kept_as_cause():
    with pytest.raises(ValueError) as info:
        fastcollate.collate([1, 2**64])
    assert info.value.__cause__ is not None


def test_nothing_is_allocated_for_a_rejected_batch():
    s0 = fastcollate.stats()
    with pytest.raises(RuntimeError):
        fastcollate.collate([{"a": torch.zeros(1000), "b": torch.zeros(2)}, {"a": torch.zeros(1000), "b": torch.zeros(3)}])
    s1 = fastcollate.stats()
    assert s1["arenas_allocated"] + s1["arenas_reused"] + s1["arenas_unpooled"] == \
        s0["arenas_allocated"] + s0["arenas_reused"] + s0["arenas_unpooled"]
    assert s1["arenas_in_use"] == s0["arenas_in_use"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_threads"):
        fastcollate.Collator(num_threads=0)
    with pytest.raises(ValueError, match="pin_memory"):
        fastcollate.Collator(pin_memory="yes")
    with pytest.raises(ValueError, match="backend"):
        fastcollate.Collator(backend="gpu")


def test_reference_path_formatting():
    assert reference.format_path(()) == "batch"
    assert reference.format_path(("image", 1, 0)) == "batch['image'][1][0]"


def test_worker_errors_carry_the_summary_and_print_nothing_unasked():
    """A failing collate in workers: nothing on stderr from fastcollate when the application set
    up no logging (the exception says it all), the shape summary rides on the exception."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch, fastcollate
        from torch.utils.data import DataLoader
        data = [{"image": torch.zeros(3, 4)}] * 5 + [{"image": torch.zeros(3, 5)}] * 3
        try:
            list(DataLoader(data, batch_size=8, num_workers=2, collate_fn=fastcollate.collate))
        except RuntimeError as exc:
            print("RAISED", "sample 5" in str(exc), "fastcollate: the batch: 8 samples" in str(exc))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "RAISED True True" in r.stdout, (r.stdout, r.stderr)
    assert "collate failed" not in r.stderr, r.stderr


@pytest.mark.parametrize("backend", ["cpp", "python"])
def test_unsupported_types_say_what_default_collate_says(backend):
    # default_collate's own words, the placeholder of another message never left unfilled
    import numpy as np

    c = fastcollate.Collator(backend=backend)
    with pytest.raises(TypeError) as info:
        c([object(), object()])
    msg = str(info.value)
    assert "batch must contain tensors, numpy arrays, numbers, dicts or lists; found <class 'object'>" in msg
    assert "{kind}" not in msg and "batch: cannot collate sample 0 of type object" in msg
    with pytest.raises(TypeError) as info:
        c([np.array(["a"]), np.array(["b"])])
    msg = str(info.value)
    assert "batch must contain tensors, numpy arrays, numbers, dicts or lists; found <U1" in msg
    assert "{kind}" not in msg
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(RuntimeError, match="Batches of nested tensors are not currently supported"):
        c([nested, nested])
