"""Hugging Face: Collator.for_tokenizer against transformers' own collators on the same tokenizer
rows, and the Trainer with fastcollate as its data_collator (tiny GPT-2 from a config, 0 and 2
workers): identical losses. A word-level tokenizer is built in memory: nothing is downloaded."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import fastcollate  # noqa: E402
from helpers import assert_same  # noqa: E402

WORDS = "the a cat dog sat on mat ran fast slow big small red blue green hat".split()


def tokenizer(padding_side="right"):
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + WORDS)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                                cls_token="[CLS]", sep_token="[SEP]", padding_side=padding_side,
                                                model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def sentences(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (int(torch.randint(1, 12, (1,), generator=g)),),
                                                      generator=g)) for _ in range(n)]


def rows(tok, **kw):
    return [dict(tok(s, **kw)) for s in sentences()]


def same_batch(got, want):
    assert sorted(got) == sorted(want), (list(got), list(want))
    for k in want:
        assert_same(got[k], want[k], f"batch[{k!r}]")


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("multiple", [None, 8])
@pytest.mark.parametrize("extra", [{}, {"return_special_tokens_mask": True}])
def test_equals_data_collator_with_padding(side, multiple, extra):
    tok = tokenizer(side)
    data = [{**r, "label": i % 3} for i, r in enumerate(rows(tok, **extra))]
    theirs = transformers.DataCollatorWithPadding(tok, pad_to_multiple_of=multiple)
    ours = fastcollate.Collator.for_tokenizer(tok, pad_to_multiple_of=multiple)
    for i in range(0, len(data), 8):
        same_batch(ours(data[i:i + 8]), dict(theirs(data[i:i + 8])))


def test_plain_pad_dict_takes_tokenizer_rows_as_they_are():
    # the one-line case of the issue: rows already carry attention_mask and token_type_ids
    tok = tokenizer()
    data = rows(tok)
    ours = fastcollate.Collator(pad={"input_ids": tok.pad_token_id})
    same_batch(ours(data[:8]), dict(transformers.DataCollatorWithPadding(tok)(data[:8])))


@pytest.mark.parametrize("side", ["right", "left"])
def test_equals_data_collator_for_seq2seq(side):
    tok = tokenizer(side)
    src, tgt = rows(tok), rows(tok)[::-1]
    data = [{**s, "labels": t["input_ids"]} for s, t in zip(src, tgt)]
    theirs = transformers.DataCollatorForSeq2Seq(tok, label_pad_token_id=-100, pad_to_multiple_of=4)
    ours = fastcollate.Collator.for_tokenizer(tok, label_pad=-100, pad_to_multiple_of=4)
    for i in range(0, len(data), 6):
        same_batch(ours(data[i:i + 6]), dict(theirs(data[i:i + 6])))


def test_equals_language_modeling_collator_without_mlm():
    tok = tokenizer()
    data = rows(tok, return_special_tokens_mask=True)
    theirs = transformers.DataCollatorForLanguageModeling(tok, mlm=False)
    ours = fastcollate.Collator.for_tokenizer(tok, causal_lm=True)
    for i in range(0, len(data), 8):
        same_batch(ours(data[i:i + 8]), dict(theirs(data[i:i + 8])))


def test_tokenizer_without_pad_token_is_refused_clearly():
    tok = tokenizer()

    class NoPad:
        model_input_names, pad_token_id, padding_side = tok.model_input_names, None, "right"

    with pytest.raises(ValueError, match="pad_token_id"):
        fastcollate.Collator.for_tokenizer(NoPad())


class LMRows(torch.utils.data.Dataset):
    def __init__(self, tok):
        self.rows = rows(tok)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def _train(collator, workers, tmp_path):
    tok = tokenizer()
    transformers.set_seed(0)
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                  pad_token_id=tok.pad_token_id)
    model = transformers.GPT2LMHeadModel(cfg)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=6,
                                          learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no",
                                          use_cpu=True, dataloader_num_workers=workers, seed=0,
                                          remove_unused_columns=False, disable_tqdm=True)
    data_collator = (transformers.DataCollatorForLanguageModeling(tok, mlm=False) if collator == "hf"
                     else fastcollate.Collator.for_tokenizer(tok, causal_lm=True))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=LMRows(tok), data_collator=data_collator)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("workers", [0, 2])
def test_trainer_losses_identical_with_fastcollate(workers, tmp_path):
    theirs = _train("hf", workers, tmp_path / "hf")
    ours = _train("fastcollate", workers, tmp_path / "fc")
    assert len(ours) == 6 and ours == theirs
