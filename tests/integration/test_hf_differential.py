"""Collator.for_tokenizer against transformers' own collators over seeded random tokenizer rows:
DataCollatorWithPadding, DataCollatorForSeq2Seq and DataCollatorForLanguageModeling(mlm=False)
return the same keys, and every tensor has the same dtype, shape and bytes, whatever form the
labels take (Python int / float / bool scalars and mixes of them, numpy scalars and arrays,
tensors, lists and tuples), with or without attention_mask / token_type_ids /
special_tokens_mask, input ids as lists, tensors or numpy arrays, padding on either side,
pad_to_multiple_of or not. Also through an ArrayDataset (gathered batches) and a DataLoader
with workers. A word-level tokenizer is built in memory: nothing is downloaded."""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import fastcollate  # noqa: E402
from helpers import assert_same  # noqa: E402
from test_hf import WORDS, tokenizer  # noqa: E402

INPUT_FORMS = {"list": list, "tensor": torch.tensor, "np64": np.array,
               "np32": lambda x: np.array(x, dtype=np.int32)}


def scalar_forms(rng):
    # each: sample i -> a label value; "mixed" forms change type from one sample to the next
    def pick(*fns):
        return lambda i: fns[int(rng.integers(len(fns)))](i)

    rint = lambda i: int(rng.integers(0, 5))  # noqa: E731
    rfloat = lambda i: float(rng.standard_normal() * 10.0 ** rng.integers(-3, 4))  # noqa: E731
    rbool = lambda i: bool(rng.random() < 0.5)  # noqa: E731
    return {
        "int": rint, "float": rfloat, "bool": rbool,
        "int|float": pick(rint, rfloat), "float|int|bool": pick(rfloat, rint, rbool), "bool|int": pick(rbool, rint),
        "np.int32": lambda i: np.int32(rint(i)), "np.int64": lambda i: np.int64(rint(i)),
        "np.float16": lambda i: np.float16(rfloat(i)), "np.float32": lambda i: np.float32(rfloat(i)),
        "np.float64": lambda i: np.float64(rfloat(i)), "np.bool_": lambda i: np.bool_(rbool(i)),
        "np|float": pick(lambda i: np.float32(rfloat(i)), rfloat, lambda i: np.float64(rfloat(i))),
        "0d-array": lambda i: np.array(rfloat(i), dtype=np.float32),
        "0d-array-mixed": pick(lambda i: np.array(rint(i), dtype=np.int32), lambda i: np.array(rfloat(i))),
        "0d-tensor-f64": lambda i: torch.tensor(rfloat(i), dtype=torch.float64),
        "0d-tensor-i32": lambda i: torch.tensor(rint(i), dtype=torch.int32),
        "0d-tensor-mixed": pick(lambda i: torch.tensor(rfloat(i)), lambda i: torch.tensor(rint(i))),
    }


def multilabel_forms(rng, width):
    # equal-length sequence labels (multi-label targets): DataCollatorWithPadding stacks them
    return {
        "floats": lambda i: [float(rng.random() < 0.5) for _ in range(width)],
        "ints": lambda i: [int(rng.integers(0, 2)) for _ in range(width)],
        "bools": lambda i: [bool(rng.random() < 0.5) for _ in range(width)],
        "np.float32": lambda i: (rng.random(width) < 0.5).astype(np.float32),
        "np.float64": lambda i: rng.standard_normal(width),
        "tensor-f32": lambda i: torch.tensor(rng.standard_normal(width), dtype=torch.float32),
    }


def sequence_forms(rng):
    # ragged sequence labels, one form for the whole batch (DataCollatorForSeq2Seq)
    n = lambda: int(rng.integers(0, 9))  # noqa: E731
    return {
        "ints": lambda i: rng.integers(4, 20, n()).tolist(),
        "tuple": lambda i: tuple(rng.integers(4, 20, n()).tolist()),
        "np.int32": lambda i: rng.integers(4, 20, n()).astype(np.int32),
        "np.int64": lambda i: rng.integers(4, 20, n()),
        "tensor-i64": lambda i: torch.tensor(rng.integers(4, 20, n())),
        "tensor-i32": lambda i: torch.tensor(rng.integers(4, 20, n()), dtype=torch.int32),
        "floats": lambda i: (rng.standard_normal(n()) * 7).tolist(),
        "np.float32": lambda i: (rng.standard_normal(n()) * 7).astype(np.float32),
        "tensor-f32": lambda i: torch.tensor(rng.standard_normal(n()) * 7, dtype=torch.float32),
    }


INTEGER_SEQUENCES = ("ints", "tuple", "np.int32", "np.int64", "tensor-i64", "tensor-i32")


def token_rows(rng, tok, size):
    """``size`` tokenizer rows with one random set of optional keys and one input form."""
    kw = dict(return_attention_mask=bool(rng.random() < 0.7), return_token_type_ids=bool(rng.random() < 0.5),
              return_special_tokens_mask=bool(rng.random() < 0.4))
    form = str(rng.choice(list(INPUT_FORMS)))
    rows = []
    for _ in range(size):
        text = " ".join(rng.choice(WORDS, int(rng.integers(0, 12))))
        enc = tok(text, **kw)
        rows.append({k: INPUT_FORMS[form](v) for k, v in enc.items()})
    return rows, f"input={form} {sorted(rows[0])}"


def same(got, want, where):
    assert sorted(got) == sorted(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
    for k in want:
        if want[k] is None:
            assert got[k] is None, f"{where}[{k!r}]: {got[k]!r} is not None"
        else:
            assert_same(got[k], want[k], f"{where}[{k!r}]")


def theirs(collator, rows):
    """The Hugging Face batch, or None where it refuses the rows (a list of tensors of several
    elements as labels): for_tokenizer promises equality on the batches transformers makes."""
    try:
        return dict(collator([dict(r) for r in rows]))
    except ValueError as exc:
        assert "Unable to create tensor" in str(exc)
        return None


def setup(seed):
    rng = np.random.default_rng(seed)
    side = str(rng.choice(["right", "left"]))
    multiple = [None, None, 4, 8][int(rng.integers(4))]
    return rng, tokenizer(side), multiple, f"seed={seed} side={side} multiple={multiple}"


PADDING_SEEDS = 240
SEEN = {"compared": 0, "refused by transformers": 0}


@pytest.mark.parametrize("seed", range(PADDING_SEEDS))
def test_data_collator_with_padding(seed):
    rng, tok, multiple, where = setup(seed)
    rows, desc = token_rows(rng, tok, int(rng.integers(1, 9)))
    multi = multilabel_forms(rng, int(rng.integers(1, 5)))
    forms = {**scalar_forms(rng), **{f"multi-{k}": v for k, v in multi.items()}}
    form = str(rng.choice(list(forms)))
    label_key = str(rng.choice(["label", "labels", "label_ids"]))
    for i, r in enumerate(rows):
        r[label_key] = forms[form](i)
        if seed % 3 == 0:  # extra keys tokenizer.pad leaves alone
            r["idx"], r["score"], r["weight"] = i, float(rng.random()), np.float32(rng.random())
    where = f"{where} {desc} {label_key}={form}"
    want = theirs(transformers.DataCollatorWithPadding(tok, pad_to_multiple_of=multiple), rows)
    if want is None:
        SEEN["refused by transformers"] += 1
        return
    SEEN["compared"] += 1
    ours = fastcollate.Collator.for_tokenizer(tok, pad_to_multiple_of=multiple, seq2seq=False)
    same(ours([dict(r) for r in rows]), want, where + " seq2seq=False")
    if not (form == "multi-ints" and label_key != "label_ids") and form != "multi-bools":
        # the default: integer sequence labels are Seq2Seq's (padded), bool ones cannot take label_pad
        auto = fastcollate.Collator.for_tokenizer(tok, pad_to_multiple_of=multiple)
        same(auto([dict(r) for r in rows]), want, where + " seq2seq=None")


def test_most_padding_seeds_were_compared():
    # a seed whose rows transformers refuses compares nothing: the fuzz must still compare most
    if sum(SEEN.values()) < PADDING_SEEDS:
        pytest.skip("counts only when every padding seed ran in this process")
    assert SEEN["compared"] >= 0.75 * PADDING_SEEDS, SEEN


@pytest.mark.parametrize("seed", range(160))
def test_data_collator_for_seq2seq(seed):
    rng, tok, multiple, where = setup(seed)
    rows, desc = token_rows(rng, tok, int(rng.integers(1, 9)))
    forms = sequence_forms(rng)
    form = str(rng.choice(list(forms)))
    label_key = str(rng.choice(["label", "labels", "none"]))
    pad = int(rng.choice([-100, -1, 0]))
    for i, r in enumerate(rows):
        if label_key != "none":
            r[label_key] = forms[form](i)
    where = f"{where} {desc} {label_key}={form} label_pad={pad}"
    theirs = transformers.DataCollatorForSeq2Seq(tok, label_pad_token_id=pad, pad_to_multiple_of=multiple)
    want = dict(theirs([dict(r) for r in rows]))
    ours = fastcollate.Collator.for_tokenizer(tok, seq2seq=True, label_pad=pad, pad_to_multiple_of=multiple)
    same(ours([dict(r) for r in rows]), want, where + " seq2seq=True")
    if form in INTEGER_SEQUENCES and label_key != "none":
        auto = fastcollate.Collator.for_tokenizer(tok, label_pad=pad, pad_to_multiple_of=multiple)
        same(auto([dict(r) for r in rows]), want, where + " seq2seq=None")


@pytest.mark.parametrize("seed", range(120))
def test_language_modeling_without_mlm(seed):
    rng, tok, multiple, where = setup(seed)
    rows, desc = token_rows(rng, tok, int(rng.integers(1, 9)))
    forms = scalar_forms(rng)
    form = str(rng.choice(list(forms)))
    for i, r in enumerate(rows):
        if seed % 2:  # the language-modeling collator keeps other keys, unrenamed
            r["label"] = forms[form](i)
    where = f"{where} {desc} label={form if seed % 2 else None}"
    theirs = transformers.DataCollatorForLanguageModeling(tok, mlm=False, pad_to_multiple_of=multiple)
    want = dict(theirs([dict(r) for r in rows]))
    ours = fastcollate.Collator.for_tokenizer(tok, causal_lm=True, pad_to_multiple_of=multiple)
    same(ours([dict(r) for r in rows]), want, where)


def test_float_labels_are_float32_as_transformers_gives_them():
    # the defect: default_collate's float64 where DataCollatorWithPadding gives float32
    tok = tokenizer()
    rows = [{**dict(tok(t)), "label": y} for t, y in [("the cat", 0.5), ("a dog sat", 1.25), ("red", 3.0)]]
    out = fastcollate.Collator.for_tokenizer(tok)(rows)
    assert out["labels"].dtype == torch.float32
    same(out, dict(transformers.DataCollatorWithPadding(tok)(rows)), "float labels")


@pytest.mark.parametrize("form", ["list", "tensor"])
def test_bool_masks_take_int_padding_as_tokenizer_pad_does(form):
    # tokenizer.pad appends the int pad values to a list of bools: int64 once anything is padded
    tok = tokenizer()
    conv = torch.tensor if form == "tensor" else list
    rows = [{"input_ids": conv([2, 5, 6, 3]), "special_tokens_mask": conv([True, False, False, True])},
            {"input_ids": conv([2, 7, 3]), "special_tokens_mask": conv([True, False, True])}]
    for multiple, dtype in ((None, torch.bool), (4, torch.bool), (8, torch.int64)):
        want = dict(transformers.DataCollatorWithPadding(tok, pad_to_multiple_of=multiple)([rows[0]] * 2))
        got = fastcollate.Collator.for_tokenizer(tok, pad_to_multiple_of=multiple)([rows[0]] * 2)
        assert want["special_tokens_mask"].dtype == dtype
        same(got, want, f"equal lengths, multiple={multiple}")
    same(fastcollate.Collator.for_tokenizer(tok)(rows), dict(transformers.DataCollatorWithPadding(tok)(rows)), "ragged")


def test_seq2seq_scalar_labels_refused_and_no_labels_is_none():
    tok = tokenizer()
    rows = [dict(tok("the cat")), dict(tok("a dog"))]
    strict = fastcollate.Collator.for_tokenizer(tok, seq2seq=True)
    assert strict(rows)["labels"] is None
    with pytest.raises(TypeError, match="seq2seq=True"):
        strict([{**r, "labels": 1} for r in rows])
    with pytest.raises(ValueError, match="causal_lm"):
        fastcollate.Collator.for_tokenizer(tok, causal_lm=True, seq2seq=True)


def test_gathered_rows_of_an_array_dataset():
    datasets = pytest.importorskip("datasets")
    tok = tokenizer()
    rng = np.random.default_rng(0)
    rows = [{**dict(tok(" ".join(rng.choice(WORDS, int(rng.integers(1, 12)))))), "label": float(rng.standard_normal()),
             "idx": i, "weight": float(rng.random())} for i in range(20)]
    hf = datasets.Dataset.from_list(rows)
    ds = fastcollate.ArrayDataset.from_hf(hf)
    ours = fastcollate.Collator.for_tokenizer(tok, pad_to_multiple_of=8)
    theirs = transformers.DataCollatorWithPadding(tok, pad_to_multiple_of=8)
    for idx in ([0, 5, 3], [19], list(range(8, 16))):
        before = fastcollate.stats().get("gathered_batches", 0)
        got = ours(ds.__getitems__(idx))
        assert fastcollate.stats().get("gathered_batches", 0) == before + 1
        same(got, dict(theirs([hf[j] for j in idx])), f"rows {idx}")


def test_through_a_loader_with_workers():
    tok = tokenizer()
    rng = np.random.default_rng(1)
    rows = [{**dict(tok(" ".join(rng.choice(WORDS, int(rng.integers(1, 12)))))), "label": float(rng.standard_normal())}
            for _ in range(24)]
    theirs = transformers.DataCollatorWithPadding(tok)
    loader = fastcollate.DataLoader(rows, batch_size=5, num_workers=2,
                                    collate_fn=fastcollate.Collator.for_tokenizer(tok))
    got = list(loader)
    assert len(got) == 5
    for i, batch in enumerate(got):
        same(batch, dict(theirs([dict(r) for r in rows[5 * i:5 * i + 5]])), f"batch {i}")
