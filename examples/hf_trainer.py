"""Hugging Face Trainer with fastcollate as its data_collator: a tiny GPT-2 built from a config
and a word-level tokenizer built in memory (nothing downloaded), trained a few steps on the CPU
with transformers' DataCollatorForLanguageModeling, then with fastcollate's equivalent. The
losses are identical; on a model this small the collator is a sliver of each step, so the time
per step barely moves -- the gain shows where data is the stall (fastcollate.StallMonitor).

    python examples/hf_trainer.py [--workers 2] [--steps 20]
"""
from __future__ import annotations

import argparse
import tempfile
import time

import torch
import tokenizers
import transformers

import fastcollate

WORDS = "the a cat dog sat on mat ran fast slow big small red blue green hat".split()


def make_tokenizer() -> transformers.PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]"] + WORDS)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


class Rows(torch.utils.data.Dataset):
    def __init__(self, tok: transformers.PreTrainedTokenizerFast, n: int = 512) -> None:
        g = torch.Generator().manual_seed(0)
        self.rows = []
        for _ in range(n):
            k = int(torch.randint(4, 30, (1,), generator=g))
            self.rows.append(dict(tok(" ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (k,), generator=g)))))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def train(collator, tok, args) -> tuple[list[float], float]:
    transformers.set_seed(0)
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                  pad_token_id=tok.pad_token_id)
    with tempfile.TemporaryDirectory() as out:
        targs = transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=16, max_steps=args.steps,
                                               learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no",
                                               use_cpu=True, dataloader_num_workers=args.workers, seed=0,
                                               disable_tqdm=True, remove_unused_columns=False)
        trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(cfg), args=targs, train_dataset=Rows(tok),
                                       data_collator=collator)
        t0 = time.perf_counter()
        trainer.train()
        elapsed = time.perf_counter() - t0
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    transformers.logging.set_verbosity_error()
    tok = make_tokenizer()
    hf_losses, hf_s = train(transformers.DataCollatorForLanguageModeling(tok, mlm=False), tok, args)
    fc_losses, fc_s = train(fastcollate.Collator.for_tokenizer(tok, causal_lm=True), tok, args)
    print(f"transformers collator: {args.steps} steps in {hf_s:.2f} s, final loss {hf_losses[-1]:.6f}")
    print(f"fastcollate collator:  {args.steps} steps in {fc_s:.2f} s, final loss {fc_losses[-1]:.6f}")
    print("losses identical:", hf_losses == fc_losses)
    if hf_losses != fc_losses:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
