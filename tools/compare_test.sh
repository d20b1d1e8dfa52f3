#!/bin/bash
# compare with the real launcher and workers: flags no run can start with are refused in one
# line each before anything runs or is written; a strategy that alone cannot start is
# reported as such while the others run; a SIGTERM stops the run under way cleanly; on 4
# workers every strategy runs, ZeRO-1 and the 2 x 2 hybrid layouts too, each with one
# worker's losses.
# Usage: compare_test.sh COMPARE
set -u
. "$(dirname "$0")/junit.sh"  # check, fail; the checks as JUnit XML
compare="$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export TMPDIR="$tmp"  # Open MPI's session files stay inside the test's directory
small=(--model=gpt --n-layer=2 --d-model=32 --n-head=2 --seq-len=16 --batch=8 --steps=3)

# A flag every run shares is wrong: its problem once, exit 2, no output folder.
check "a flag every run shares is wrong: refused once, nothing written"
timeout 60 "$compare" --gpus=2 "${small[@]}" --lr=abc --out="$tmp/bad" >"$tmp/bad.txt" 2>&1
rc=$?
cat "$tmp/bad.txt"
[ "$rc" -eq 2 ] || fail "--lr=abc: exit $rc, not 2"
[ "$(cat "$tmp/bad.txt")" = "compare: --lr=abc: not a valid value; expected a number" ] ||
  fail "--lr=abc: not the launcher's one line"
[ ! -e "$tmp/bad" ] || fail "--lr=abc: $tmp/bad was created"

# No run fits in memory, each for its own figures: a line per run, exit 2, nothing written.
check "no run fits in memory: a line per run, nothing written"
timeout 60 "$compare" --gpus=2 --model=gpt --n-layer=2 --d-model=32 --n-head=2 \
  --seq-len=200000 --batch=8 --steps=3 --out="$tmp/big" >"$tmp/big.txt" 2>&1
rc=$?
cat "$tmp/big.txt"
[ "$rc" -eq 2 ] || fail "--seq-len=200000: exit $rc, not 2"
grep -qF "compare: none of the 2-worker runs would start; nothing was written" "$tmp/big.txt" ||
  fail "--seq-len=200000: no summary line"
for label in "one worker" "data parallel" "data parallel, ZeRO-1" "model parallel" \
  "pipeline GPipe" "pipeline 1F1B" "pipeline ZB-H1"; do
  grep -qF "compare: $label: not enough memory" "$tmp/big.txt" || fail "no line for $label"
done
[ ! -e "$tmp/big" ] || fail "--seq-len=200000: $tmp/big was created"

# Flags that would make the launcher only check or prepare: refused, nothing written.
check "--check refused, nothing written"
timeout 60 "$compare" --gpus=2 "${small[@]}" --check --out="$tmp/check" >"$tmp/check.txt" 2>&1
rc=$?
cat "$tmp/check.txt"
[ "$rc" -eq 2 ] || fail "--check: exit $rc, not 2"
grep -qF "compare: --check: compare runs the strategies" "$tmp/check.txt" || fail "--check: no line"
[ ! -e "$tmp/check" ] || fail "--check: $tmp/check was created"

# The layout flags compare sets itself: refused, nothing written.
check "--data-parallel and --zero refused, nothing written"
timeout 60 "$compare" --gpus=4 "${small[@]}" --data-parallel 2 --zero=1 --out="$tmp/layout" \
  >"$tmp/layout.txt" 2>&1
rc=$?
cat "$tmp/layout.txt"
[ "$rc" -eq 2 ] || fail "--data-parallel, --zero: exit $rc, not 2"
for flag in data-parallel zero; do
  grep -qF "compare: --$flag: compare sets it for each of its runs" "$tmp/layout.txt" ||
    fail "--$flag: no line"
done
[ "$(wc -l <"$tmp/layout.txt")" -eq 2 ] || fail "--data-parallel, --zero: not one line each"
[ ! -e "$tmp/layout" ] || fail "--data-parallel, --zero: $tmp/layout was created"

# The one-worker baseline would start but none of the 5-worker runs (5 stages for 4 blocks;
# a batch of 8 over 5 replicas): refused, nothing written.
check "only the baseline would start: refused, nothing written"
timeout 60 "$compare" --gpus=5 "${small[@]}" --out="$tmp/five" >"$tmp/five.txt" 2>&1
rc=$?
cat "$tmp/five.txt"
[ "$rc" -eq 2 ] || fail "--gpus=5: exit $rc, not 2"
grep -qF "compare: none of the 5-worker runs would start; nothing was written" "$tmp/five.txt" ||
  fail "--gpus=5: no summary line"
grep -qF "one worker" "$tmp/five.txt" && fail "--gpus=5: the baseline reported as refused"
[ ! -e "$tmp/five" ] || fail "--gpus=5: $tmp/five was created"

# SIGTERM to compare alone: passed on to the running launcher, whose worker checkpoints and
# stops; compare says so and exits 143 with no report, and nothing is left running.
check "SIGTERM stops the run under way: exit 143, no report, nothing left running"
TANDEM_TEST_STEP_SLEEP_MS=100 "$compare" --gpus=2 "${small[@]/--steps=3/--steps=300}" \
  --out="$tmp/term" >"$tmp/term.txt" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  [ "$(cat "$tmp/term/runs/baseline/metrics/rank-0.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && break
  sleep 0.2
done
kill -TERM $pid
wait $pid
rc=$?
cat "$tmp/term.txt"
[ "$rc" -eq 143 ] || fail "SIGTERM: exit $rc, not 143"
grep -qF "compare: terminated (SIGTERM); no report" "$tmp/term.txt" || fail "SIGTERM: no line"
grep -qF "result      preempted at step" "$tmp/term/logs/baseline.log" ||
  fail "SIGTERM: the launcher did not checkpoint and stop"
[ ! -e "$tmp/term/report.md" ] || fail "SIGTERM: a report was written"
sleep 1
pgrep -f "$tmp/term" >/dev/null && fail "SIGTERM: processes of the run are still running"

# 3 workers: a batch of 8 does not split over 3 data-parallel replicas, but 3 stages run; 3
# is prime, so there is no hybrid layout, which the report says.
check "a strategy that alone cannot start is reported while the others run"
timeout 300 "$compare" --gpus=3 "${small[@]}" --out="$tmp/mixed" >"$tmp/mixed.txt" 2>&1
rc=$?
cat "$tmp/mixed.txt"
[ "$rc" -eq 0 ] || fail "--gpus=3: exit $rc, not 0"
for label in "data parallel" "data parallel, ZeRO-1"; do
  grep -qE "\] $label +would not start: --batch=8 is not divisible by 3 workers" \
    "$tmp/mixed.txt" || fail "--gpus=3: $label not reported as refused"
done
[ ! -e "$tmp/mixed/logs/data.log" ] || fail "--gpus=3: data parallel was started"
[ "$(grep -c '"ran": true' "$tmp/mixed/report.json")" -eq 5 ] || fail "not 5 runs in report.json"
grep -qF '"error": "--batch=8 is not divisible by 3 workers' "$tmp/mixed/report.json" ||
  fail "report.json lacks data parallel's reason"
[ "$(grep -c "No hybrid layout: 3 workers" "$tmp/mixed/report.md")" -eq 1 ] ||
  fail "report.md does not say once that 3 workers have no hybrid layout"

# 4 workers: every strategy, ZeRO-1 and each schedule of 2 replicas x 2 stages run (but
# interleaved on 4 stages of a 4-block model), and the
# report's loss deviation column puts each within 1e-4 (relative) of one worker's losses.
check "4 workers: ZeRO-1 and the 2 x 2 layouts run with one worker's losses"
timeout 500 "$compare" --gpus=4 "${small[@]}" --out="$tmp/four" >"$tmp/four.txt" 2>&1
rc=$?
cat "$tmp/four.txt"
[ "$rc" -eq 0 ] || fail "--gpus=4: exit $rc, not 0"
# 13 runs: interleaved on 4 stages needs 8 blocks and is refused in its one line; 2 x 2
# interleaved runs (4 chunks of one block); tensor parallelism over 4 ranks needs 4 heads (the
# model has 2) and is refused, over 2 it runs beside 2 replicas and beside 2 stages.
[ "$(grep -c '"ran": true' "$tmp/four/report.json")" -eq 13 ] || fail "not 13 runs in report.json"
grep -qE "\] tensor parallel T=4 +would not start: --tensor-parallel=4 does not divide the attention heads" \
  "$tmp/four.txt" || fail "--gpus=4: tensor parallel T=4 not reported as refused for the heads"
grep -qE "\] pipeline interleaved v=2 +would not start: 4 stages x 2 virtual stages need 8 model chunks" \
  "$tmp/four.txt" || fail "--gpus=4: 4-stage interleaved not reported as refused"
# The results table's rows by their first cell; the columns found by the header's names.
awk -F' *[|] *' '
  /^[|] strategy [|] workers [|] layout/ {
    for (i = 2; i < NF; ++i) col[$i] = i
    header = 1
    next
  }
  header && /^[|] / && $2 != "---" { row[$2] = $0; loss[$2] = $col["final loss"]
    dev[$2] = $col["max loss deviation"]; layout[$2] = $col["layout (D x K)"] }
  header && !/^[|]/ { header = 0 }
  END {
    base = loss["one worker"]
    if (base == "") { print "no one-worker row"; exit 1 }
    tol = 1e-4 * (base < 0 ? -base : base)
    want["data parallel, ZeRO-1"] = "4 x 1, ZeRO-1"
    want["2 replicas x 2-stage GPipe"] = "2 x 2"
    want["2 replicas x 2-stage 1F1B"] = "2 x 2"
    want["2 replicas x 2-stage ZB-H1"] = "2 x 2"
    want["2 replicas x 2-stage interleaved v=2"] = "2 x 2"
    want["tensor parallel T=2 x 2 replicas"] = "T=2, 2 x 1"
    want["tensor parallel T=2 x 2-stage 1F1B"] = "T=2, 1 x 2"
    bad = 0
    for (label in want) {
      if (!(label in row)) { print "no row for " label; bad = 1; continue }
      if (layout[label] != want[label]) { print label ": layout " layout[label]; bad = 1 }
      if (dev[label] !~ /^[0-9.e+-]+$/ || dev[label] + 0 > tol) {
        print label ": loss deviation " dev[label] ", more than " tol; bad = 1
      } else {
        print label ": " layout[label] ", loss deviation " dev[label] " (at most " tol ")"
      }
    }
    exit bad
  }' "$tmp/four/report.md" || fail "report.md: the ZeRO-1 and 2 x 2 rows are not as they should be"
grep -qF "No hybrid layout" "$tmp/four/report.md" && fail "report.md says 4 workers have no hybrid layout"
for f in timeline-data-zero1.svg timeline-d2k2-gpipe.svg timeline-d2k2-1f1b.svg \
  timeline-d2k2-zb-h1.svg timeline-zb-h1.svg; do
  [ -s "$tmp/four/$f" ] || fail "no $f"
done
grep -qF ">rank 3 (1, 1)<" "$tmp/four/timeline-d2k2-1f1b.svg" ||
  fail "the 2 x 2 timeline has no row for rank 3 (replica 1, stage 1)"
echo "PASSED: compare's flag checks and its runs on 3 and 4 workers"
