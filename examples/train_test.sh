#!/bin/bash
# examples/train's command line, with the real binary: --help lists its flags (hyphenated) and
# exits 0; bad flags are refused one line each before anything runs; checkpoints go to a
# folder it makes; a resume with nothing left to train is refused; a short run trains and
# resumes. Usage: train_test.sh TRAIN
set -u
train="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
small=(--model=gpt --n-layer=1 --d-model=32 --n-head=2 --seq-len=16 --batch=4 --synthetic)

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

"$train" --help >"$tmp/help.txt" 2>&1 || fail "--help exited $?"
grep -qF -- "--checkpoint-dir  (default: \"\")" "$tmp/help.txt" || fail "--help lacks --checkpoint-dir"
grep -q -- "--v\b\|flagfile" "$tmp/help.txt" && fail "--help lists other libraries' flags"

"$train" "${small[@]}" --steps --micro-batches=0 stray >"$tmp/bad.txt" 2>&1
rc=$?
cat "$tmp/bad.txt"
[ "$rc" -eq 2 ] || fail "bad flags: exit $rc, not 2"
[ "$(cat "$tmp/bad.txt")" = "train: --steps needs a value (an integer): --steps=VALUE
train: unexpected argument 'stray': flags are written --name=value (see --help)" ] ||
  fail "bad flags: not one line each"

"$train" "${small[@]}" --steps=2 --checkpoint-every=1 >"$tmp/nodir.txt" 2>&1
[ $? -eq 2 ] || fail "--checkpoint-every without --checkpoint-dir was not refused"
grep -qF "train: --checkpoint-every=1 needs --checkpoint-dir=DIR" "$tmp/nodir.txt" ||
  fail "no line for --checkpoint-every without --checkpoint-dir"

ck="$tmp/not/yet/there"
"$train" "${small[@]}" --steps=4 --checkpoint-every=2 --checkpoint-dir="$ck" >"$tmp/run.txt" 2>&1 ||
  { cat "$tmp/run.txt"; fail "the run with checkpoints failed"; }
[ -f "$ck/step-000000.ckpt" ] && [ -f "$ck/step-000002.ckpt" ] && [ -f "$ck/step-000004.ckpt" ] ||
  fail "checkpoints missing"
grep -q "^step    4/4  loss" "$tmp/run.txt" || fail "no step 4 line"

"$train" "${small[@]}" --steps=4 --resume="$ck/step-000004.ckpt" >"$tmp/done.txt" 2>&1
[ $? -eq 2 ] || fail "a resume with nothing left was not refused"
grep -qF "the checkpoint is at step 4 and --steps=4: nothing left to train; raise --steps" \
  "$tmp/done.txt" || fail "no line for a resume with nothing left"

# Resumed at step 2, steps 3 and 4 have the uninterrupted run's losses.
"$train" "${small[@]}" --steps=4 --resume="$ck/step-000002.ckpt" >"$tmp/resumed.txt" 2>&1 ||
  { cat "$tmp/resumed.txt"; fail "the resumed run failed"; }
[ "$(grep '^step    [34]/4' "$tmp/resumed.txt" | awk '{print $4}')" = \
  "$(grep '^step    [34]/4' "$tmp/run.txt" | awk '{print $4}')" ] ||
  fail "the resumed losses differ from the uninterrupted run's"
# Resumed from the initial weights (step 0), every step has the uninterrupted run's loss.
"$train" "${small[@]}" --steps=4 --resume="$ck/step-000000.ckpt" >"$tmp/from0.txt" 2>&1 ||
  { cat "$tmp/from0.txt"; fail "the run from step 0 failed"; }
[ "$(grep '^step    [1-4]/4' "$tmp/from0.txt" | awk '{print $4}')" = \
  "$(grep '^step    [1-4]/4' "$tmp/run.txt" | awk '{print $4}')" ] ||
  fail "the losses from step 0 differ from the uninterrupted run's"
echo "PASSED: examples/train's command line"
