#!/usr/bin/env python3
"""Writes tests/data/bpe_tokenizer.json and tests/data/bpe_samples.json: a byte-level BPE
(GPT-2's kind) trained by Hugging Face's `tokenizers` on the licence texts, and texts with the
ids that library encodes them to: the outside oracle model/generate_test.cc checks
model/tokenizer.h's encoding and decoding against, so the test needs no Python.

The samples are pieces of the licence texts (whitespace runs, punctuation, numbers,
contractions) and a few written here (accents, other scripts, an emoji).
Needs `pip install tokenizers`; CI does not run it.
Usage: tools/make_tokenizer_fixture.py [--out tests/data]
"""
import argparse
import glob
import json
import os
import random

from tokenizers import ByteLevelBPETokenizer, Tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data")
    a = ap.parse_args()
    files = sorted(f for f in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(f))
    trainer = ByteLevelBPETokenizer()
    trainer.train(files, vocab_size=600, min_frequency=2, special_tokens=["<|endoftext|>"],
                  show_progress=False)
    path = os.path.join(a.out, "bpe_tokenizer.json")
    trainer.save(path)
    tok = Tokenizer.from_file(path)
    text = "".join(open(f, encoding="utf-8", errors="replace").read() for f in files)
    rng = random.Random(1)
    texts = []
    for _ in range(60):
        start = rng.randrange(len(text) - 200)
        texts.append(text[start:start + rng.randrange(1, 200)])
    texts += ["Hello world!\n", "  x", "a  b", "\n\n  Hello", "tab\t\tend  ", "don't we'll it's",
              "caf\u00e9 na\u00efve \u2014 dash", "\u65e5\u672c\u8a9e text", "emoji \U0001F600!"]
    samples = [{"text": t, "ids": tok.encode(t).ids} for t in texts]
    with open(os.path.join(a.out, "bpe_samples.json"), "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(s) for s in samples) + "\n]\n")  # one a line


if __name__ == "__main__":
    main()
