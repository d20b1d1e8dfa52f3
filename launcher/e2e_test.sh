#!/bin/bash
# End-to-end tests of the launcher: the real binary starting real workers through mpirun on
# this host (CPU workers where no GPU is visible). Usage: e2e_test.sh CASE LAUNCHER, CASE one
# of data, pipeline, model (a small job trains), crash (a worker killed mid-run), interrupt
# (SIGINT to the launcher), bad_flags (nothing starts, nothing is created).
set -u
case_name="$1"
launcher="$(cd "$(dirname "$2")" && pwd -P)/$(basename "$2")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
# Open MPI's session files stay inside the test's directory.
export TMPDIR="$tmp"
# The launcher finds the worker in the runfiles tree it starts in (as under bazel run).
worker="$(pwd -P)/parallel/worker"
small=(--model=gpt --n-layer=2 --d-model=32 --n-head=2 --seq-len=16 --batch=8)

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# The number after "key": in run.json.
json_number() {
  sed -n "s/^ *\"$1\": \([-0-9.e+]*\),\{0,1\}$/\1/p" "$2" | head -1
}

no_worker_left() {
  local left
  left="$(pgrep -f "$worker" || true)"
  if [ -n "$left" ]; then
    ps -o pid,stat,cmd -p $left >&2 || true
    fail "worker processes left behind: $left"
  fi
}

check_run() {  # strategy
  local dir="$tmp/run-$1"
  local out="$tmp/out-$1.txt"
  local start end
  start=$(date +%s)
  timeout 60 "$launcher" --strategy="$1" --gpus=2 "${small[@]}" --steps=5 --run-dir="$dir" \
    >"$out" 2>&1
  local rc=$?
  end=$(date +%s)
  cat "$out"
  [ "$rc" -eq 0 ] || fail "--strategy=$1 exited $rc"
  [ -f "$dir/run.json" ] || fail "no run.json"
  local losses
  losses="$(sed -n 's/^ *"losses": \[\(.*\)\],$/\1/p' "$dir/run.json" | tr ',' '\n' | grep -c .)"
  [ "$losses" -eq 5 ] || fail "run.json has $losses losses, not 5"
  local tps
  tps="$(json_number tokens_per_second "$dir/run.json")"
  awk -v t="$tps" 'BEGIN { exit !(t > 0) }' || fail "tokens_per_second is '$tps'"
  local ranks
  ranks="$(grep -c '"rank": ' "$dir/run.json")"
  [ "$ranks" -eq 2 ] || fail "run.json has $ranks ranks, not 2"
  grep -q '"exit": "ok"' "$dir/run.json" || fail "run.json's exit is not ok"
  grep -q "\"strategy\": \"$1\"" "$dir/run.json" || fail "run.json's strategy is not $1"
  for r in 0 1; do
    [ -s "$dir/logs/rank-$r.log" ] || fail "no log for rank $r"
    [ "$(grep -c . "$dir/metrics/rank-$r.jsonl")" -eq 5 ] || fail "rank $r metrics incomplete"
  done
  grep -q "step 5/5" "$out" || fail "no final progress line"
  grep -q "final loss" "$out" || fail "no summary"
  no_worker_left
  echo "PASSED: --strategy=$1 in $((end - start)) s"
}

case "$case_name" in
  data | pipeline | model)
    check_run "$case_name"
    ;;

  crash)
    dir="$tmp/run-crash"
    out="$tmp/out-crash.txt"
    # Rank 1 kills itself (SIGKILL) on reaching step 3 of a run far too long to finish.
    TANDEM_TEST_CRASH_RANK=1 TANDEM_TEST_CRASH_STEP=3 timeout 60 "$launcher" --strategy=data \
      --gpus=2 "${small[@]}" --steps=10000000 --run-dir="$dir" >"$out" 2>&1
    rc=$?
    end=$(date +%s)
    cat "$out"
    [ "$rc" -ne 124 ] || fail "the launcher did not stop the job (timed out)"
    [ "$rc" -ne 0 ] || fail "the launcher exited 0 after a worker crashed"
    grep -q "rank 1" "$out" || fail "the output does not name rank 1"
    grep -q "signal 9" "$out" || fail "the output does not say signal 9"
    grep -q "last 20 lines of .*rank-1.log" "$out" || fail "no log tail of rank 1"
    # Rank 1 wrote its last metrics line just before it died.
    crashed=$(stat -c %Y "$dir/metrics/rank-1.jsonl")
    [ $((end - crashed)) -le 10 ] || fail "the launcher took $((end - crashed)) s after the crash"
    [ "$(grep -c . "$dir/metrics/rank-1.jsonl")" -eq 3 ] || fail "rank 1 did not die at step 3"
    grep -q '"failed_rank": 1' "$dir/run.json" || fail "run.json does not name rank 1"
    no_worker_left
    pgrep -f "mpirun.*$worker" >/dev/null && fail "mpirun left behind"
    echo "PASSED: crash detected, launcher exited $rc within $((end - crashed)) s"
    ;;

  interrupt)
    dir="$tmp/run-interrupt"
    out="$tmp/out-interrupt.txt"
    "$launcher" --strategy=pipeline --gpus=2 "${small[@]}" --steps=10000000 --run-dir="$dir" \
      >"$out" 2>&1 &
    pid=$!
    for _ in $(seq 1 150); do
      [ "$(grep -c . "$dir/metrics/rank-0.jsonl" 2>/dev/null || echo 0)" -ge 3 ] && break
      sleep 0.2
    done
    [ "$(grep -c . "$dir/metrics/rank-0.jsonl" 2>/dev/null || echo 0)" -ge 3 ] ||
      { kill -KILL $pid; cat "$out"; fail "the job did not start"; }
    start=$(date +%s)
    kill -INT $pid
    for _ in $(seq 1 100); do
      kill -0 $pid 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 $pid 2>/dev/null; then
      kill -KILL $pid
      fail "the launcher is still running 20 s after SIGINT"
    fi
    wait $pid
    rc=$?
    end=$(date +%s)
    cat "$out"
    [ "$rc" -eq 130 ] || fail "the launcher exited $rc after SIGINT, not 130"
    grep -q '"exit": "interrupted"' "$dir/run.json" || fail "run.json does not say interrupted"
    no_worker_left
    echo "PASSED: interrupted, stopped in $((end - start)) s"
    ;;

  bad_flags)
    user="$tmp/user"
    mkdir -p "$user"
    # expect_refused EXPECTED_LINE FLAGS...: exit 2, the line, nothing made on disk.
    expect_refused() {
      local expected="$1"
      shift
      local out="$tmp/bad.txt"
      BUILD_WORKING_DIRECTORY="$user" timeout 30 "$launcher" "$@" >"$out" 2>&1
      local rc=$?
      cat "$out"
      [ "$rc" -eq 2 ] || fail "$* exited $rc, not 2"
      grep -qF -- "$expected" "$out" || fail "$* did not print: $expected"
      [ -z "$(ls -A "$user")" ] || fail "$* created $(ls -A "$user")"
      no_worker_left
    }
    expect_refused "launcher: --strategy=banana: use data, model or pipeline" --strategy=banana
    expect_refused "launcher: unknown flag --bogus-flag (see --help)" --bogus-flag=1
    expect_refused "launcher: --gpus=abc: not a valid value; expected an integer" --gpus=abc
    expect_refused "launcher: --gpus=0: need between 1 and 4096 workers" --gpus=0
    expect_refused "launcher: --batch=7 is not divisible by 2 workers" --gpus=2 --batch=7 \
      --synthetic
    expect_refused "5 stages but the model has only 4 blocks" --strategy=pipeline --gpus=5 \
      --model=gpt --n-layer=2 --synthetic
    expect_refused "launcher: --device=tpu: use auto, cuda or cpu" --device=tpu
    expect_refused "does not exist" --data=missing.txt
    expect_refused "launcher: --run-dir=$tmp exists and is not empty" --run-dir="$tmp" \
      --synthetic
    # Several problems: one line each.
    expect_refused "launcher: --lr=-1: must be a positive number" --lr=-1 --steps=0 --dtype=f8
    grep -qF "launcher: --steps=0: need at least 1" "$tmp/bad.txt" || fail "no --steps line"
    grep -qF "launcher: --dtype=f8: use f32, bf16 or f16" "$tmp/bad.txt" || fail "no --dtype line"
    [ "$(grep -c '^launcher: ' "$tmp/bad.txt")" -eq 3 ] || fail "not one line per problem"
    # --help lists the flags and exits 0.
    "$launcher" --help >"$tmp/help.txt" 2>&1 || fail "--help did not exit 0"
    grep -q -- "--micro-batches" "$tmp/help.txt" || fail "--help lacks --micro-batches"
    echo "PASSED: bad flags refused"
    ;;

  *)
    fail "unknown case '$case_name'"
    ;;
esac
