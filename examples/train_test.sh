#!/bin/bash
# examples/train's command line, with the real binary: --help lists its flags (hyphenated) and
# exits 0; bad flags are refused one line each before anything runs; checkpoints go to a
# folder it makes; a resume with nothing left to train is refused; a short run trains and
# resumes (from step 0 too); with --run-dir it writes run.json and metrics/rank-0.jsonl as the
# launcher does. Usage: train_test.sh TRAIN
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
# --run-dir: run.json and metrics/rank-0.jsonl as a launcher run writes them, the checkpoints
# (step 0 too) under it.
run="$tmp/run"
"$train" "${small[@]}" --steps=4 --checkpoint-every=2 --run-dir="$run" >"$tmp/rundir.txt" 2>&1 ||
  { cat "$tmp/rundir.txt"; fail "the run with --run-dir failed"; }
[ -f "$run/run.json" ] || fail "no run.json"
[ "$(grep -c . "$run/metrics/rank-0.jsonl")" -eq 4 ] || fail "metrics/rank-0.jsonl lacks steps"
for s in 0 2 4; do
  [ -f "$run/checkpoints/step-00000$s.ckpt" ] || fail "no checkpoint of step $s in the run dir"
done
# The losses in full: the metrics' (read as e2e_test.sh reads them) are run.json's, and printed
# to 4 decimals they are what the run printed.
metrics_losses="$(sed -n 's/^{"step": [0-9]*, "loss": \([^,]*\),.*/\1/p' "$run/metrics/rank-0.jsonl" |
  tr '\n' ' ')"
json_losses="$(sed -n 's/^ *"losses": \[\(.*\)\],$/\1/p' "$run/run.json" | tr -d ',') "
[ "$metrics_losses" = "$json_losses" ] ||
  fail "run.json's losses ($json_losses) are not the metrics' ($metrics_losses)"
[ "$(for l in $metrics_losses; do printf '%.4f\n' "$l"; done)" = \
  "$(grep '^step    [1-4]/4' "$tmp/rundir.txt" | awk '{print $4}')" ] ||
  fail "the metrics' losses are not the printed ones"
grep -q "^      \"host_syncs_per_step\": 1$" "$run/run.json" ||
  fail "run.json's host_syncs_per_step is not 1"
for key in '"strategy": "data"' '"workers": 1' '"exit": "ok"' '"steps_completed": 4'; do
  grep -qF "$key" "$run/run.json" || fail "run.json lacks $key"
done
grep -q '"host_syncs": 1, "peak_in_flight": 1, .*"lr": .*"grad_norm": .*"peak_bytes": [1-9]' \
  "$run/metrics/rank-0.jsonl" || fail "the metrics lines lack the step's figures"
# Another fresh run into it is refused; resumed into it from step 2, steps 3 and 4 are written
# again, bit for bit, and run.json still has every step.
"$train" "${small[@]}" --steps=4 --run-dir="$run" >"$tmp/again.txt" 2>&1
[ $? -eq 2 ] || fail "a second run into a run dir was not refused"
grep -qF "exists and is not empty; choose another directory (or --resume)" "$tmp/again.txt" ||
  fail "no line for a second run into a run dir"
cp "$run/metrics/rank-0.jsonl" "$tmp/straight.jsonl"
"$train" "${small[@]}" --steps=4 --checkpoint-every=2 --run-dir="$run" \
  --resume="$run/checkpoints/step-000002.ckpt" >"$tmp/resumed-dir.txt" 2>&1 ||
  { cat "$tmp/resumed-dir.txt"; fail "the run resumed into its run dir failed"; }
[ "$(sed 's/"seconds": [^,]*,//; s/"allocated_bytes".*//' "$run/metrics/rank-0.jsonl")" = \
  "$(sed 's/"seconds": [^,]*,//; s/"allocated_bytes".*//' "$tmp/straight.jsonl")" ] ||
  fail "the resumed run's metrics differ from the uninterrupted run's"
[ "$(sed -n 's/^ *"losses": \[\(.*\)\],$/\1/p' "$run/run.json" | tr -d ',') " = "$json_losses" ] ||
  fail "the resumed run's run.json lacks the earlier steps"
grep -q '"figures_from_step": 2' "$run/run.json" || fail "the resumed run's figures are not its own"
echo "PASSED: examples/train's command line"
