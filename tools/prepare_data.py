#!/usr/bin/env python3
"""Tokenizes a text file into train and val shards in llm.c's format, for --data.

A shard is a header of 256 int32 (magic 20240520, version 1, token count, and in the fourth
the vocabulary size, which llm.c leaves 0 and Tandem reads as the data's vocabulary), then the
tokens as uint16. The last --val-fraction of the tokens go to the val shard, the rest to train
shards of at most --shard-tokens each:
    DIR/<name>_val_000000.bin, DIR/<name>_train_000000.bin, ...
Tokenizers: bytes (the default, vocabulary 256, no dependencies); a tokenizer.json through
Hugging Face's tokenizers package (installed by hand: pip install tokenizers); or
--train-bpe=VOCAB, a byte-level BPE trained on the text itself (plain Python, offline), whose
merges are written to DIR/<name>_bpe_merges.txt.

Usage: tools/prepare_data.py TEXT --out DIR [--tokenizer=bytes|PATH/tokenizer.json]
       [--train-bpe=VOCAB] [--val-fraction=0.1] [--shard-tokens=100000000] [--name=NAME]
Then: bazel run //examples:train -- --data='DIR/NAME_train_*.bin'
"""
import argparse
import collections
import os
import re
import struct
import sys

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
MAX_UINT16_VOCAB = 1 << 16
# GPT-2's pre-tokenizer split, in the re module's terms (letters, digits, other runs with an
# optional leading space, whitespace): BPE merges never cross these pieces.
PIECES = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+")


def fail(message):
    print(f"prepare_data: {message}", file=sys.stderr)
    sys.exit(2)


def train_bpe(text, vocab):
    """Byte-level BPE: merges of the most frequent adjacent pair, counted over the text's
    pieces weighted by how often each occurs, until the vocabulary has `vocab` tokens.
    Returns the merges in order, as ((a, b), new_id)."""
    words = collections.Counter(PIECES.findall(text))
    seqs = [(list(w.encode("utf-8")), n) for w, n in words.items()]
    merges = []
    for new_id in range(256, vocab):
        pairs = collections.Counter()
        for seq, n in seqs:
            for pair in zip(seq, seq[1:]):
                pairs[pair] += n
        if not pairs:
            break
        # Ties go to the smallest pair, so the merges do not depend on dict order.
        best = max(pairs.items(), key=lambda kv: (kv[1], (-kv[0][0], -kv[0][1])))[0]
        merges.append((best, new_id))
        seqs = [(merge(seq, best, new_id), n) for seq, n in seqs]
    return merges


def merge(seq, pair, new_id):
    out, i = [], 0
    while i < len(seq):
        if i + 1 < len(seq) and (seq[i], seq[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return out


def encode_bpe(text, merges):
    rank = {pair: new_id for pair, new_id in merges}
    cache, tokens = {}, []
    for piece in PIECES.findall(text):
        if piece not in cache:
            seq = list(piece.encode("utf-8"))
            while len(seq) > 1:
                # The earliest-learned merge among the piece's pairs applies first.
                pair = min(zip(seq, seq[1:]), key=lambda p: rank.get(p, 1 << 30))
                if pair not in rank:
                    break
                seq = merge(seq, pair, rank[pair])
            cache[piece] = seq
        tokens.extend(cache[piece])
    return tokens


def encode_with_tokenizer_json(text, path):
    try:
        from tokenizers import Tokenizer  # optional: pip install tokenizers
    except ImportError:
        fail(f"--tokenizer={path} needs Hugging Face's tokenizers package: pip install tokenizers")
    tok = Tokenizer.from_file(path)
    return tok.encode(text).ids, tok.get_vocab_size()


def write_shard(path, tokens, vocab):
    header = [0] * HEADER_INTS
    header[0], header[1], header[2], header[3] = MAGIC, VERSION, len(tokens), vocab
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("text", help="a UTF-8 (or any byte) text file")
    ap.add_argument("--out", required=True, help="directory the shards go to (made if missing)")
    ap.add_argument("--tokenizer", default="bytes", help="bytes or PATH to a tokenizer.json")
    ap.add_argument("--train-bpe", type=int, default=0, metavar="VOCAB",
                    help="train a byte-level BPE of VOCAB tokens (257 to 65536) on the text")
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    ap.add_argument("--name", default="", help="shard name prefix (default: the text's name)")
    a = ap.parse_args()

    if not os.path.isfile(a.text):
        fail(f"{a.text} is not a file")
    if not 0 < a.val_fraction < 1:
        fail(f"--val-fraction={a.val_fraction}: must be between 0 and 1")
    if a.shard_tokens < 1 or a.shard_tokens >= 1 << 31:
        fail(f"--shard-tokens={a.shard_tokens}: must be between 1 and 2^31 - 1")
    if a.tokenizer != "bytes" and not os.path.isfile(a.tokenizer):
        fail(f"--tokenizer={a.tokenizer}: use bytes or the path of a tokenizer.json")
    if a.train_bpe and a.tokenizer != "bytes":
        fail("--train-bpe and --tokenizer both pick the tokenizer: pass one")
    if a.train_bpe and not 256 < a.train_bpe <= MAX_UINT16_VOCAB:
        fail(f"--train-bpe={a.train_bpe}: the vocabulary must be between 257 and 65536 "
             "(uint16 tokens)")
    with open(a.text, "rb") as f:
        data = f.read()
    name = a.name or os.path.splitext(os.path.basename(a.text))[0]
    os.makedirs(a.out, exist_ok=True)

    if a.train_bpe:
        text = data.decode("utf-8", errors="replace")
        merges = train_bpe(text, a.train_bpe)
        vocab = 256 + len(merges)
        tokens = encode_bpe(text, merges)
        with open(os.path.join(a.out, f"{name}_bpe_merges.txt"), "w") as f:
            for (x, y), new_id in merges:
                f.write(f"{x} {y} {new_id}\n")
    elif a.tokenizer == "bytes":
        tokens, vocab = list(data), 256
    else:
        tokens, vocab = encode_with_tokenizer_json(data.decode("utf-8"), a.tokenizer)
        if vocab > MAX_UINT16_VOCAB:
            fail(f"{a.tokenizer} has {vocab} tokens: llm.c's version 1 shards hold uint16 "
                 "tokens (at most 65536)")

    n_val = max(1, int(len(tokens) * a.val_fraction))
    train, val = tokens[:-n_val], tokens[-n_val:]
    if not train:
        fail(f"{a.text} gives {len(tokens)} tokens: too few for a train and a val shard")
    paths = [os.path.join(a.out, f"{name}_val_000000.bin")]
    write_shard(paths[0], val, vocab)
    # Shards of --shard-tokens; a tail shorter than half of one joins the shard before it, so
    # that no shard is too short to hold a sample (a reader refuses such a file).
    starts = list(range(0, len(train), a.shard_tokens))
    if len(starts) > 1 and len(train) - starts[-1] < a.shard_tokens // 2:
        starts.pop()
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(train)
        paths.append(os.path.join(a.out, f"{name}_train_{k:06d}.bin"))
        write_shard(paths[-1], train[start:end], vocab)
    print(f"{len(tokens)} tokens (vocabulary {vocab}): {len(val)} val, {len(train)} train in "
          f"{len(paths) - 1} shard(s) under {a.out}")


if __name__ == "__main__":
    main()
