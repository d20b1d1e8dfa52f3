#!/bin/bash
# Tandem's GPT against Hugging Face transformers on the same weights, both ways: a model
# Tandem trained, exported (//tools:export) and loaded by GPT2LMHeadModel.from_pretrained;
# and a GPT2LMHeadModel transformers made and saved, loaded by Tandem. On a fixed batch the
# logits agree within 1e-4 relative (tools/hf_logits_check.py). Python is $TANDEM_PYTHON
# (.ci/run passes the virtual environment of .ci/venv.sh through --test_env), else python3;
# skips, saying so, where it cannot import torch and transformers. And the
# transformers-made file through --init-from (its 250-token vocabulary padded to 256, its tied
# head taken from wte) and exported again: every tensor transformers wrote, bit for bit.
# Usage: hf_logits_test.sh EXPORT TRAIN CHECK_SCRIPT
set -u
. "$(dirname "$0")/junit.sh"  # check, fail, skip; the checks as JUnit XML
export_bin="$1"
train="$2"
script="$3"
python="${TANDEM_PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || skip "$python is not installed"
"$python" -c "import torch, transformers" >/dev/null 2>&1 ||
  skip "$python cannot import torch and transformers (.ci/venv.sh installs them)"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # nothing is downloaded

# A fixed batch: 2 rows of 16 byte tokens.
for r in 0 1; do
  for t in $(seq 0 15); do printf '%d ' $(((r * 131 + t * 37 + 5) % 250)); done
  echo
done >"$tmp/tokens.txt"

check "a model Tandem trained, in transformers: the same logits"
"$train" --model=gpt --n-layer=2 --d-model=32 --n-head=4 --seq-len=16 --batch=4 --steps=3 \
  --lr=1e-2 --checkpoint-every=3 --run-dir="$tmp/run" >"$tmp/train.txt" 2>&1 ||
  { cat "$tmp/train.txt"; fail "training failed"; }
"$export_bin" --checkpoint="$tmp/run/checkpoints/step-3" --out="$tmp/ours/model.safetensors" ||
  fail "export failed"
"$export_bin" --logits-of="$tmp/ours/model.safetensors" --tokens="$tmp/tokens.txt" \
  --out="$tmp/ours.logits.safetensors" || fail "Tandem's logits failed"
"$python" "$script" compare "$tmp/ours" "$tmp/tokens.txt" "$tmp/ours.logits.safetensors" ||
  fail "the logits differ"

check "a model transformers made, in Tandem: the same logits"
"$python" "$script" make "$tmp/theirs" || fail "transformers could not make its model"
"$export_bin" --logits-of="$tmp/theirs/model.safetensors" --tokens="$tmp/tokens.txt" \
  --out="$tmp/theirs.logits.safetensors" || fail "Tandem's logits failed"
"$python" "$script" compare "$tmp/theirs" "$tmp/tokens.txt" "$tmp/theirs.logits.safetensors" ||
  fail "the logits differ"

check "a model transformers made, through --init-from and export: its tensors bit for bit"
"$train" --model=gpt --n-layer=2 --d-model=32 --n-head=4 --seq-len=16 --vocab=250 --synthetic \
  --batch=4 --steps=1 --checkpoint-every=1 --init-from="$tmp/theirs/model.safetensors" \
  --run-dir="$tmp/from-theirs" >"$tmp/train2.txt" 2>&1 || { cat "$tmp/train2.txt"; fail "training from it failed"; }
"$export_bin" --checkpoint="$tmp/from-theirs/checkpoints/step-0" --out="$tmp/again/model.safetensors" ||
  fail "export failed"
grep -qF '"vocab_size": 250' "$tmp/again/config.json" || fail "config.json's vocab_size is not 250"
"$python" "$script" same "$tmp/theirs/model.safetensors" "$tmp/again/model.safetensors" ||
  fail "the tensors differ"
