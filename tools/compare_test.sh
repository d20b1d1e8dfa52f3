#!/bin/bash
# compare's flag checks, with the real launcher and workers: flags no run can start with are
# refused in one line each before anything runs or is written; a strategy that alone cannot
# start is reported as such while the others run. Usage: compare_test.sh COMPARE
set -u
compare="$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export TMPDIR="$tmp"  # Open MPI's session files stay inside the test's directory
small=(--model=gpt --n-layer=2 --d-model=32 --n-head=2 --seq-len=16 --batch=8 --steps=3)

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# A flag every run shares is wrong: its problem once, exit 2, no output folder.
timeout 60 "$compare" --gpus=2 "${small[@]}" --lr=abc --out="$tmp/bad" >"$tmp/bad.txt" 2>&1
rc=$?
cat "$tmp/bad.txt"
[ "$rc" -eq 2 ] || fail "--lr=abc: exit $rc, not 2"
[ "$(cat "$tmp/bad.txt")" = "compare: --lr=abc: not a valid value; expected a number" ] ||
  fail "--lr=abc: not the launcher's one line"
[ ! -e "$tmp/bad" ] || fail "--lr=abc: $tmp/bad was created"

# No run fits in memory, each for its own figures: a line per run, exit 2, nothing written.
timeout 60 "$compare" --gpus=2 --model=gpt --n-layer=2 --d-model=32 --n-head=2 \
  --seq-len=200000 --batch=8 --steps=3 --out="$tmp/big" >"$tmp/big.txt" 2>&1
rc=$?
cat "$tmp/big.txt"
[ "$rc" -eq 2 ] || fail "--seq-len=200000: exit $rc, not 2"
grep -qF "compare: none of the runs would start; nothing was written" "$tmp/big.txt" ||
  fail "--seq-len=200000: no summary line"
for label in "one worker" "data parallel" "model parallel" "pipeline GPipe" "pipeline 1F1B"; do
  grep -qF "compare: $label: not enough memory" "$tmp/big.txt" || fail "no line for $label"
done
[ ! -e "$tmp/big" ] || fail "--seq-len=200000: $tmp/big was created"

# 3 workers: a batch of 8 does not split over 3 data-parallel replicas, but 3 stages run.
timeout 300 "$compare" --gpus=3 "${small[@]}" --out="$tmp/mixed" >"$tmp/mixed.txt" 2>&1
rc=$?
cat "$tmp/mixed.txt"
[ "$rc" -eq 0 ] || fail "--gpus=3: exit $rc, not 0"
grep -qF "data parallel   would not start: --batch=8 is not divisible by 3 workers" \
  "$tmp/mixed.txt" || fail "--gpus=3: data parallel not reported as refused"
[ ! -e "$tmp/mixed/logs/data.log" ] || fail "--gpus=3: data parallel was started"
[ "$(grep -c '"ran": true' "$tmp/mixed/report.json")" -eq 4 ] || fail "not 4 runs in report.json"
grep -qF '"error": "--batch=8 is not divisible by 3 workers' "$tmp/mixed/report.json" ||
  fail "report.json lacks data parallel's reason"
echo "PASSED: compare's flag checks"
