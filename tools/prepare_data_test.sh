#!/bin/bash
# tools/prepare_data.py with the byte tokenizer, end to end: a text becomes a train and a val
# shard in llm.c's format (header, then the text's bytes as uint16); examples/train trains on
# the train shards through a glob, with finite losses that fall; a truncated shard and one with
# a wrong magic are refused with one line each before training starts; --train-bpe's tokens
# decode back to the text with the merges it wrote; and a tokenizer.json through Hugging
# Face's tokenizers, where $TANDEM_PYTHON (else python3) imports it (.ci/run's environment,
# .ci/venv.sh, has it with transformers), else that case is skipped, saying so.
# Usage: prepare_data_test.sh PREPARE TRAIN
set -u
. "$(dirname "$0")/junit.sh"  # check, fail, skip_check; the checks as JUnit XML
prepare="$1"
train="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

check "a text as byte-token shards"
# 40000 bytes of English: the GPL texts every Debian system has (as the default corpus).
text="$tmp/corpus.txt"
cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GPL-2 | head -c 40000 >"$text"
[ "$(wc -c <"$text")" -eq 40000 ] || fail "no 40000-byte text to prepare"
python3 "$prepare" "$text" --out "$tmp/shards" >"$tmp/prepare.txt" 2>&1 ||
  { cat "$tmp/prepare.txt"; fail "prepare_data.py failed"; }
shards="$tmp/shards"
[ -f "$shards/corpus_train_000000.bin" ] && [ -f "$shards/corpus_val_000000.bin" ] ||
  fail "no train and val shards: $(ls "$shards")"
# The last tenth (4000 bytes) is val, the rest train: each a 1024-byte header (magic, version,
# token count, vocabulary) and two bytes a token.
python3 - "$text" "$shards" <<'EOF' || fail "the shards do not hold the text's bytes"
import struct, sys
text = open(sys.argv[1], "rb").read()
for name, want in (("train", text[:36000]), ("val", text[36000:])):
    data = open(f"{sys.argv[2]}/corpus_{name}_000000.bin", "rb").read()
    header = struct.unpack("<256i", data[:1024])
    assert header[:4] == (20240520, 1, len(want), 256), (name, header[:4])
    assert all(h == 0 for h in header[4:]), name
    assert len(data) == 1024 + 2 * len(want), (name, len(data))
    assert list(struct.unpack(f"<{len(want)}H", data[1024:])) == list(want), name
EOF

check "training on the shards, through a glob"
small=(--model=gpt --n-layer=1 --d-model=32 --n-head=2 --seq-len=16 --batch=8 --lr=1e-2
  --warmup=0)
"$train" "${small[@]}" --steps=40 --data="$shards/corpus_train_*.bin" >"$tmp/run.txt" 2>&1 ||
  { cat "$tmp/run.txt"; fail "training on the shards failed"; }
grep -q "vocab 256" "$tmp/run.txt" || fail "the model's vocabulary is not the shards' 256"
grep -qF "(36000 tokens, 2249 samples)" "$tmp/run.txt" ||
  fail "not the train shard's 36000 tokens in (36000 - 1) / 16 samples"
grep '^step' "$tmp/run.txt" | awk '{print $4}' >"$tmp/losses.txt"
python3 - "$tmp/losses.txt" <<'EOF' || { cat "$tmp/run.txt"; fail "the losses do not fall"; }
import math, sys
losses = [float(x) for x in open(sys.argv[1])]
assert len(losses) == 40, len(losses)
assert all(math.isfinite(x) for x in losses), losses
last = sum(losses[-5:]) / 5
# From about ln(256) = 5.5 for random weights; bytes of English are far more predictable.
assert losses[0] > 5.0 and last < losses[0] - 1.5, (losses[0], last)
EOF

check "a truncated shard and a wrong magic refused"
# Bad shards: one line each, before any step.
refused() {  # refused NAME WANT: training on $tmp/NAME is refused with WANT in one line
  "$train" "${small[@]}" --steps=1 --data="$tmp/$1" >"$tmp/$1.out" 2>"$tmp/$1.err"
  local rc=$?
  [ "$rc" -eq 2 ] || { cat "$tmp/$1.out" "$tmp/$1.err"; fail "$1: exit $rc, not 2"; }
  [ "$(wc -l <"$tmp/$1.err")" -eq 1 ] || { cat "$tmp/$1.err"; fail "$1: not one line"; }
  grep -qF -- "$2" "$tmp/$1.err" || { cat "$tmp/$1.err"; fail "$1: no '$2'"; }
  grep -q '^step' "$tmp/$1.out" && fail "$1: training started"
  return 0
}
head -c -6 "$shards/corpus_train_000000.bin" >"$tmp/cut.bin"
refused cut.bin "cut.bin is truncated: its header gives 36000 tokens (73024 bytes with the \
header) but it has 73018 bytes"
python3 - "$shards/corpus_val_000000.bin" "$tmp/magic.bin" <<'EOF'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
data[0:4] = struct.pack("<i", 20240521)
open(sys.argv[2], "wb").write(data)
EOF
refused magic.bin "magic.bin is not an llm.c token shard: wrong magic 20240521 (want 20240520)"

check "--train-bpe: its tokens decode to the text"
# --train-bpe: a vocabulary of 300 learned from the text; its tokens decode to the text.
python3 "$prepare" "$text" --out "$tmp/bpe" --train-bpe=300 >"$tmp/bpe.txt" 2>&1 ||
  { cat "$tmp/bpe.txt"; fail "prepare_data.py --train-bpe failed"; }
python3 - "$text" "$tmp/bpe" <<'EOF' || fail "the BPE shards do not decode to the text"
import struct, sys
text = open(sys.argv[1], "rb").read()
pieces = {i: bytes([i]) for i in range(256)}
for line in open(f"{sys.argv[2]}/corpus_bpe_merges.txt"):
    a, b, new = map(int, line.split())
    pieces[new] = pieces[a] + pieces[b]
assert len(pieces) == 300, len(pieces)
decoded, count = b"", 0
for name in ("train", "val"):
    data = open(f"{sys.argv[2]}/corpus_{name}_000000.bin", "rb").read()
    header = struct.unpack("<256i", data[:1024])
    assert header[:2] == (20240520, 1) and header[3] == 300, header[:4]
    tokens = struct.unpack(f"<{header[2]}H", data[1024:])
    assert max(tokens) < 300
    decoded += b"".join(pieces[t] for t in tokens)
    count += len(tokens)
assert decoded == text, "round trip"
assert count < len(text), count  # merges make fewer tokens than bytes
EOF
# The vocabulary comes from the shards' header: 300, padded to 320 for the model.
"$train" "${small[@]}" --steps=2 --data="$tmp/bpe/corpus_train_*.bin" >"$tmp/bpe_run.txt" 2>&1 ||
  { cat "$tmp/bpe_run.txt"; fail "training on the BPE shards failed"; }
grep -q "vocab 320" "$tmp/bpe_run.txt" || { cat "$tmp/bpe_run.txt"; fail "not vocab 320"; }
check "a tokenizer.json through Hugging Face's tokenizers"
# One trained on the text, whose ids decode back to it.
python="${TANDEM_PYTHON:-python3}"
if "$python" -c "import tokenizers" 2>/dev/null; then
  "$python" - "$text" "$tmp/tokenizer.json" <<'EOF' || fail "no tokenizer.json made"
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train([sys.argv[1]], trainers.BpeTrainer(
    vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(sys.argv[2])
EOF
  "$python" "$prepare" "$text" --out "$tmp/hf" --tokenizer="$tmp/tokenizer.json" >"$tmp/hf.txt" 2>&1 ||
    { cat "$tmp/hf.txt"; fail "prepare_data.py --tokenizer failed"; }
  "$python" - "$text" "$tmp/hf" "$tmp/tokenizer.json" <<'EOF' || fail "the tokenizer.json shards"
import struct, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[3])
ids = []
for name in ("train", "val"):
    data = open(f"{sys.argv[2]}/corpus_{name}_000000.bin", "rb").read()
    header = struct.unpack("<256i", data[:1024])
    assert header[3] == tok.get_vocab_size(), header[:4]
    ids += struct.unpack(f"<{header[2]}H", data[1024:])
assert tok.decode(ids) == open(sys.argv[1]).read()
EOF
else
  skip_check "$python cannot import Hugging Face's tokenizers (.ci/venv.sh installs it)"
fi
echo "PASSED"
