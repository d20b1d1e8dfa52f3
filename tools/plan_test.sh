#!/bin/bash
# compare --plan: bad flags refused in one line with nothing written; 64 H200s planned from the
# example block times without a GPU, every layout within the memory given, ranked by predicted
# step; a memory no layout fits refused in one line; on 2 CPU workers, the plan checked
# against real runs of its top layouts through the launcher (the link timed here); and the
# block times it wrote (every micro-batch row count) planned from again.
# Usage: plan_test.sh COMPARE BLOCK_TIMES
set -u
. "$(dirname "$0")/junit.sh"  # check, fail; the checks as JUnit XML
compare="$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"
block_times="$(cd "$(dirname "$2")" && pwd -P)/$(basename "$2")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export TMPDIR="$tmp"
h200=(--plan --gpus=64 --model=gpt2-small --batch=512 --dtype=bf16 --device=cuda
  --link=50,5 --block-times="$block_times" --no-run)

check "bad flags: one line each, exit 2, nothing written"
for bad in --link=fast --link=1,1,-5 --device-memory=lots --gpus=0 --derive-block-times=989,2,4.8 \
  --bucket-mb=x --block-times="$tmp/none.json" --repeats=0 --waiting-share=2; do
  timeout 60 "$compare" --plan --gpus=2 --model=gpt-tiny --link=1,1 --no-run "$bad" \
    --out="$tmp/bad" >"$tmp/bad.txt" 2>&1
  rc=$?
  cat "$tmp/bad.txt"
  [ "$rc" -eq 2 ] || fail "$bad: exit $rc, not 2"
  [ "$(wc -l <"$tmp/bad.txt")" -eq 1 ] || fail "$bad: not one line"
  grep -q "^compare --plan: " "$tmp/bad.txt" || fail "$bad: not compare's line"
  [ ! -e "$tmp/bad" ] || fail "$bad: $tmp/bad was created"
done

check "64 H200s from the example block times, without a GPU"
timeout 120 "$compare" "${h200[@]}" --device-memory=141GB --out="$tmp/h200" >"$tmp/h200.txt" 2>&1
rc=$?
cat "$tmp/h200.txt"
[ "$rc" -eq 0 ] || fail "exit $rc"
grep -q "^## Ranked layouts" "$tmp/h200/plan.md" || fail "plan.md has no ranked table"
grep -q "derived from FLOPs at 40% MFU" "$tmp/h200/plan.md" || fail "plan.md hides the source"
python3 - "$tmp/h200/plan.json" <<'PY' || fail "plan.json"
import json, sys
p = json.load(open(sys.argv[1]))
ranked = p["ranked"]
assert len(ranked) == 10, len(ranked)
steps = [r["step_seconds"] for r in ranked]
assert all(a <= b * (1 + 1e-9) for a, b in zip(steps, steps[1:])), steps
assert all(r["memory_bytes"] <= 141 * 2**30 for r in ranked)
for r in ranked:  # the parts add up to the step
  parts = sum(r[k] for k in ("compute_seconds", "bubble_seconds", "exposed_comm_seconds",
                             "tensor_comm_seconds", "optimizer_seconds", "sharing_seconds",
                             "spread_seconds"))
  assert abs(parts - r["step_seconds"]) <= 1e-9 * r["step_seconds"], r
# K = 16, 32, 64 of T = 1; 16, 32 of T = 2 and 16 of T = 4, each with sequence parallelism off
# and on (T = 8 does not divide gpt2-small's 12 heads).
assert p["dropped"]["more stages than the model's 14 blocks"] == 3 + 2 * 2 + 2 * 1, p["dropped"]
PY

check "a memory no layout fits: one line, exit 2"
timeout 120 "$compare" "${h200[@]}" --device-memory=100MB --out="$tmp/small" >"$tmp/small.txt" 2>&1
rc=$?
cat "$tmp/small.txt"
[ "$rc" -eq 2 ] || fail "exit $rc, not 2"
grep -q "^compare --plan: no layout of 64 ranks fits gpt2-small" "$tmp/small.txt" ||
  fail "no one-line refusal"
[ ! -e "$tmp/small" ] || fail "$tmp/small was created"

check "2 CPU workers: the top layouts run and are set against their predictions"
small=(--plan --gpus=2 --model=gpt --n-layer=2 --d-model=32 --n-head=2 --seq-len=16 --batch=8)
timeout 900 "$compare" "${small[@]}" --steps=4 --repeats=2 --write-block-times="$tmp/small.json" \
  --out="$tmp/run" >"$tmp/run.txt" 2>&1
rc=$?
cat "$tmp/run.txt"
[ "$rc" -eq 0 ] || fail "exit $rc"
grep -q "timing the link between 2 workers" "$tmp/run.txt" || fail "the link was not timed"
grep -Eq "handover between 2 workers: [0-9.]+ ms \([1-9][0-9]* receives\)" "$tmp/run.txt" ||
  fail "no handover measured"
python3 - "$tmp/run/plan.json" <<'PY' || fail "plan.json's checks"
import json, sys
plan = json.load(open(sys.argv[1]))
# The link timed here: its alpha-beta fit, the reduce-scatter's and all-gather's own, and the
# handover a pipeline's steps measured.
link = plan["link"]
assert link["bytes_per_second"] > 0 and link["handover_seconds"] >= 0, link
for own in ("reduce_scatter", "all_gather"):
  assert link[own]["bytes_per_second"] > 0 and link[own]["latency_seconds"] >= 0, link
checks = plan["checks"]
assert 3 <= len(checks) <= 4, len(checks)
for c in checks:
  assert c["ran"], c
  assert c["measured_step_seconds"] > 0 and c["measured_peak_bytes"] > 0, c
  assert abs(c["step_error"] - (c["step_seconds"] / c["measured_step_seconds"] - 1)) < 1e-6, c
  runs = c["measured_step_runs_seconds"]  # --repeats=2, the step the fastest's
  assert len(runs) == 2 and min(runs) > 0, c
  assert abs(c["measured_step_seconds"] - min(runs)) < 1e-12, c
  # Beside the fastest: the median run (of two, their mean) and the runs' spread about it.
  median = sum(runs) / 2
  assert abs(c["measured_median_step_seconds"] - median) < 1e-9, c
  assert abs(c["median_step_error"] - (c["step_seconds"] / median - 1)) < 1e-6, c
  assert abs(c["measured_step_spread"] - (max(runs) - min(runs)) / median) < 1e-6, c
# Nothing held out where no waiting share was fitted; each one held out names its reason.
fit = plan.get("waiting_share", {}).get("fitted_on")
assert bool(plan["held_out"]) == bool(fit), (plan["held_out"], fit)
for h in plan["held_out"]:
  assert "waiting share was fitted on" in h, h
  assert not any(c["layout"].split(" ")[0] == fit.split(" ")[0] for c in checks), checks
PY
grep -q "^## Predicted against measured" "$tmp/run/plan.md" || fail "plan.md has no check"

check "the block times written: every micro-batch row count the layouts run, read back alike"
python3 - "$tmp/small.json" <<'PY' || fail "small.json"
import json, sys
p = json.load(open(sys.argv[1]))
# batch 8 on 2 workers: replicas of 4 rows (data) or 8 (one pipeline), in micro-batches.
assert p["rows"] == 4, p["rows"]
assert sorted(m["rows"] for m in p["more_rows"]) == [1, 2, 8], p["more_rows"]
assert all(len(m["blocks"]) == len(p["blocks"]) == 4 for m in p["more_rows"])
assert p.get("step_overhead_seconds", 0) >= 0
# 2 workers: the finish spread of 2 threads, which the re-read below takes in.
assert p["finish_spread_threads"] == 2 and p.get("finish_spread", 0) >= 0, p
PY
timeout 120 "$compare" "${small[@]}" --link=1,100,250 --block-times="$tmp/small.json" --no-run \
  --waiting-share=0.25 --out="$tmp/again" >"$tmp/again.txt" 2>&1
rc=$?
cat "$tmp/again.txt"
[ "$rc" -eq 0 ] || fail "exit $rc"
grep -q "4, 8, 2, 1 rows a micro-batch" "$tmp/again/plan.md" || fail "the row counts were not read"
# --link's third figure: the handover, in us.
grep -q "handover 250 us" "$tmp/again/plan.md" || fail "plan.md has not the handover given"
# A --link is one pair for every collective: no reduce-scatter or all-gather of their own.
python3 -c 'import json, sys; l = json.load(open(sys.argv[1]))["link"]
assert abs(l["handover_seconds"] - 250e-6) < 1e-12 and "reduce_scatter" not in l, l' \
  "$tmp/again/plan.json" || fail "plan.json's link"
# A waiting share given is taken as given; 2 workers on 2 cores or more fitted none.
python3 -c 'import json, sys; w = json.load(open(sys.argv[1]))["waiting_share"]
assert w["share"] == 0.25 and w["source"] == "given by --waiting-share", w
assert "waiting_share" not in json.load(open(sys.argv[2])) or int(sys.argv[3]) < 2' \
  "$tmp/again/plan.json" "$tmp/run/plan.json" "$(nproc)" || fail "plan.json's waiting share"
