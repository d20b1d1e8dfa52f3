#!/bin/bash
# End-to-end tests of the launcher: the real binary starting real workers through mpirun on
# this host (CPU workers where no GPU is visible). Usage: e2e_test.sh CASE LAUNCHER, CASE one
# of data, pipeline, model (a small job trains), crash (a worker killed mid-run), interrupt
# (SIGINT to the launcher), bad_flags (nothing starts, nothing is created; nor with --check),
# preempt_launcher and preempt_worker (SIGTERM: every worker checkpoints, exit 75;
# --resume=auto continues bit for bit), restart (--max-restarts after an injected crash),
# reshard (checkpoints moved between strategies and worker counts; a run resumed from the
# initial weights' checkpoint, step 0), bad_checkpoint (missing or corrupt shards refused),
# slow_start (workers slow to set up are not taken for hung), log_every (the host reads the
# loss every --log-every steps and synchronizes nowhere else), hybrid (replicas of a pipeline
# with ZeRO-1: parity, placement, preemption and a crash), validation (--val-fraction: the
# validation loss in the metrics, run.json, the progress line and the summary; the training
# losses unchanged).
set -u
case_name="$1"
launcher="$(cd "$(dirname "$2")" && pwd -P)/$(basename "$2")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
# Open MPI's session files stay inside the test's directory.
export TMPDIR="$tmp"
# The launcher finds the worker in the runfiles tree it starts in (as under bazel run).
worker="$(pwd -P)/worker/worker"
small=(--model=gpt --n-layer=2 --d-model=32 --n-head=2 --seq-len=16 --batch=8)

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# The number after "key": in run.json.
json_number() {
  sed -n "s/^ *\"$1\": \([-0-9.e+]*\),\{0,1\}$/\1/p" "$2" | head -1
}

# "step loss" lines of a run's rank 0 (the global loss), one per step (the last record of a
# step wins, as in run.json).
step_losses() {
  sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1/metrics/rank-0.jsonl" |
    awk '{ v[$1] = $2 } END { for (s in v) print s, v[s] }' | sort -n
}

# Fails unless every step of run $2 has the loss of the same step of run $1 within a relative
# tolerance $3 (0: the same digits, i.e. bit for bit: the metrics carry each loss as the
# shortest decimal that reads back as the same float).
same_losses() {
  local steps
  steps=$(join <(step_losses "$1" | sort -k1,1) <(step_losses "$2" | sort -k1,1) | awk -v tol="$3" '
    { d = $2 - $3; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2;
      if ((tol == 0 && $2 != $3) || d > tol * m) { print "step " $1 ": " $2 " vs " $3 > "/dev/stderr"; bad = 1 }
      n++ }
    END { print n + 0; exit bad }') || fail "losses of $2 differ from $1"
  [ "$steps" -eq "$(step_losses "$2" | grep -c .)" ] || fail "$2 has steps $1 lacks"
  echo "$steps"
}

# Waits (up to 30 s) until rank 0 of run dir $1 reported $2 steps.
wait_for_steps() {
  for _ in $(seq 1 150); do
    [ "$(cat "$1/metrics/rank-0.jsonl" 2>/dev/null | grep -c .)" -ge "$2" ] && return 0
    sleep 0.2
  done
  return 1
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
  # The loss is read every step: one host synchronization a step, on every rank.
  [ "$(grep -c '"host_syncs_per_step": 1,\{0,1\}$' "$dir/run.json")" -eq 2 ] ||
    fail "run.json's host_syncs_per_step is not 1 on both ranks"
  no_worker_left
  echo "PASSED: --strategy=$1 in $((end - start)) s"
}

case "$case_name" in
  data | pipeline | model)
    check_run "$case_name"
    ;;

  validation)
    # --val-fraction with --eval-every=2: a validation loss after steps 2, 4 and the last (5),
    # in rank 0's metrics, run.json's val_losses, the progress line and the summary; the
    # training losses are those of the same run (the same samples held out) never evaluating,
    # bit for bit.
    dir="$tmp/run-val"
    out="$tmp/out-val.txt"
    timeout 60 "$launcher" --strategy=pipeline --gpus=2 "${small[@]}" --steps=5 \
      --val-fraction=0.1 --eval-every=2 --eval-batches=2 --debug-syncs --run-dir="$dir" \
      >"$out" 2>&1
    rc=$?
    cat "$out"
    [ "$rc" -eq 0 ] || fail "--val-fraction exited $rc"
    val_steps="$(sed -n 's/^{"step": \([0-9]*\), "loss": [^,]*, "val_loss": [0-9.e+-]*,.*/\1/p' \
      "$dir/metrics/rank-0.jsonl" | tr '\n' ' ')"
    [ "$val_steps" = "1 3 4 " ] || fail "rank 0's validated steps are '$val_steps', not 1 3 4"
    val_losses="$(sed -n 's/^ *"val_losses": \(.*\),$/\1/p' "$dir/run.json")"
    echo "$val_losses" | grep -Eq '^\[\[2, [0-9.e+-]+\], \[4, [0-9.e+-]+\], \[5, [0-9.e+-]+\]\]$' ||
      fail "run.json's val_losses are '$val_losses'"
    grep -q "loss [0-9.]*  val [0-9.]*  " "$out" || fail "no validation loss on the progress line"
    grep -q "^val loss    [0-9.]* (after step 5)" "$out" || fail "no validation loss in the summary"
    grep -q "host sync #" "$dir"/logs/rank-*.log && fail "a validation synchronized unexpectedly"
    timeout 60 "$launcher" --strategy=pipeline --gpus=2 "${small[@]}" --steps=5 \
      --val-fraction=0.1 --eval-every=0 --run-dir="$tmp/run-noval" >/dev/null 2>&1 ||
      fail "the run without validation failed"
    grep -q val_losses "$tmp/run-noval/run.json" && fail "val_losses without an evaluation"
    [ "$(same_losses "$tmp/run-noval" "$dir" 0)" -eq 5 ] || fail "not 5 steps compared"
    no_worker_left
    echo "PASSED: validation"
    ;;

  log_every)
    # --log-every=3: the host reads the losses every third step and synchronizes nowhere
    # else (--debug-syncs would print any other synchronization to the ranks' logs), yet every
    # step's loss is recorded.
    dir="$tmp/run-log-every"
    out="$tmp/out-log-every.txt"
    timeout 60 "$launcher" --strategy=pipeline --gpus=2 "${small[@]}" --steps=6 --log-every=3 \
      --debug-syncs --checkpoint-every=6 --run-dir="$dir" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ "$rc" -eq 0 ] || fail "--log-every=3 exited $rc"
    losses="$(sed -n 's/^ *"losses": \[\(.*\)\],$/\1/p' "$dir/run.json" | tr ',' '\n' | grep -c .)"
    [ "$losses" -eq 6 ] || fail "run.json has $losses losses, not 6"
    for r in 0 1; do
      syncs="$(sed -n 's/.*"host_syncs": \([0-9]*\),.*/\1/p' "$dir/metrics/rank-$r.jsonl" | tr '\n' ' ')"
      [ "$syncs" = "0 0 1 0 0 1 " ] || fail "rank $r's host syncs per step are '$syncs', not 0 0 1 0 0 1"
      if grep -q "host sync #" "$dir/logs/rank-$r.log"; then
        grep -A8 "host sync #" "$dir/logs/rank-$r.log" >&2
        fail "rank $r synchronized the host outside its loss reads and checkpoint"
      fi
    done
    [ "$(grep -c '"host_syncs_per_step": 0,\{0,1\}$' "$dir/run.json")" -eq 2 ] ||
      fail "run.json's host_syncs_per_step is not 0 on both ranks"
    grep -q '"log_every": 3' "$dir/run.json" || fail "run.json's config lacks log_every"
    no_worker_left
    echo "PASSED: --log-every=3: losses of 6 steps read at 2, and no other host synchronization"
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
    grep -qF "result      rank 1 failed (signal 9 SIGKILL)" "$out" ||
      fail "the summary's result does not say rank 1 failed"
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
    wait_for_steps "$dir" 3 || { kill -KILL $pid; cat "$out"; fail "the job did not start"; }
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
    # The final line says who stopped the job, and why.
    grep -qF '"exit": "the launcher aborted the job: interrupted (SIGINT)"' "$dir/run.json" ||
      fail "run.json does not say the launcher aborted the job, interrupted"
    grep -qF "result      the launcher aborted the job: interrupted (SIGINT)" "$out" ||
      fail "the summary's result does not say the launcher aborted the job, interrupted"
    no_worker_left
    echo "PASSED: interrupted, stopped in $((end - start)) s"
    ;;

  preempt_launcher | preempt_worker)
    # SIGTERM (to the launcher, or to one worker) while training: every worker finishes the
    # same step, checkpoints and exits 75; --resume=auto continues from that checkpoint, and
    # the losses are the uninterrupted run's, bit for bit.
    strategy=pipeline
    [ "$case_name" = preempt_worker ] && strategy=data
    job=(--strategy=$strategy --gpus=2 "${small[@]}" --steps=24)
    straight="$tmp/run-straight"
    timeout 60 "$launcher" "${job[@]}" --run-dir="$straight" >"$tmp/out-straight.txt" 2>&1 ||
      { cat "$tmp/out-straight.txt"; fail "the uninterrupted run failed"; }
    dir="$tmp/run-$case_name"
    out="$tmp/out-$case_name.txt"
    # Slow steps, so the signal lands mid-run.
    TANDEM_TEST_STEP_SLEEP_MS=150 "$launcher" "${job[@]}" --run-dir="$dir" >"$out" 2>&1 &
    pid=$!
    wait_for_steps "$dir" 3 || { kill -KILL $pid; cat "$out"; fail "the job did not start"; }
    if [ "$case_name" = preempt_launcher ]; then
      # Twice in quick succession, as GNU timeout sends it (to the launcher, then to its
      # process group): one request to checkpoint and stop.
      kill -TERM $pid
      sleep 0.2
      kill -TERM $pid
    else
      worker_pid=$(sed -n 's/^rank 1 of 2 on .* pid \([0-9]*\), coordinator.*/\1/p' "$dir/logs/rank-1.log")
      [ -n "$worker_pid" ] || fail "no pid in rank 1's log"
      kill -TERM "$worker_pid"
    fi
    start=$(date +%s)
    for _ in $(seq 1 300); do
      kill -0 $pid 2>/dev/null || break
      sleep 0.2
    done
    kill -0 $pid 2>/dev/null && { kill -KILL $pid; cat "$out"; fail "still running 60 s after SIGTERM"; }
    wait $pid
    rc=$?
    end=$(date +%s)
    cat "$out"
    [ "$rc" -eq 75 ] || fail "exited $rc after SIGTERM, not 75"
    grep -q '"exit": "preempted at step' "$dir/run.json" || fail "run.json does not say preempted"
    stopped=$(sed -n 's/.*"exit": "preempted at step \([0-9]*\)".*/\1/p' "$dir/run.json")
    [ "$stopped" -ge 3 ] && [ "$stopped" -lt 24 ] || fail "stopped at step '$stopped'"
    [ -f "$dir/checkpoints/step-$(printf %06d "$stopped").manifest" ] ||
      fail "no manifest for step $stopped"
    for r in 0 1; do
      grep -q "stopping after step $stopped" "$dir/logs/rank-$r.log" ||
        fail "rank $r did not stop after step $stopped"
    done
    if [ "$case_name" = preempt_worker ]; then
      grep -q "SIGTERM received" "$dir/logs/rank-1.log" || fail "rank 1 did not see its SIGTERM"
    fi
    no_worker_left
    # Continue where it stopped.
    timeout 60 "$launcher" "${job[@]}" --run-dir="$dir" --resume=auto >"$tmp/out-resumed.txt" 2>&1
    rc=$?
    cat "$tmp/out-resumed.txt"
    [ "$rc" -eq 0 ] || fail "--resume=auto exited $rc"
    grep -q "resuming from $dir/checkpoints/step-$(printf %06d "$stopped") (step $stopped)" \
      "$tmp/out-resumed.txt" || fail "--resume=auto did not say where it resumed"
    [ "$(same_losses "$straight" "$dir" 0)" -eq 24 ] || fail "the resumed run lacks steps"
    losses="$(sed -n 's/^ *"losses": \[\(.*\)\],$/\1/p' "$dir/run.json" | tr ',' '\n' | grep -c .)"
    [ "$losses" -eq 24 ] || fail "run.json has $losses losses, not 24"
    no_worker_left
    echo "PASSED: $case_name: stopped at step $stopped within $((end - start)) s, exit 75; resumed bit for bit"
    ;;

  hybrid)
    # Two replicas of a two-stage 1F1B pipeline with ZeRO-1 on 4 workers: the losses of one
    # worker (1e-5 relative); each rank's place and optimizer state in run.json and the
    # summary; SIGTERM: a checkpoint, exit 75 and a bit-for-bit resume; a rank killed with
    # SIGKILL: the launcher stops within 10 s naming the rank, its place and the signal.
    job=(--strategy=pipeline --gpus=4 --data-parallel=2 --zero=1 --schedule=1f1b "${small[@]}"
         --steps=12)
    one="$tmp/run-one"
    timeout 60 "$launcher" --strategy=data --gpus=1 "${small[@]}" --steps=12 --run-dir="$one" \
      >"$tmp/out-one.txt" 2>&1 || { cat "$tmp/out-one.txt"; fail "the one-worker run failed"; }
    straight="$tmp/run-hybrid"
    out="$tmp/out-hybrid.txt"
    timeout 90 "$launcher" "${job[@]}" --run-dir="$straight" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ "$rc" -eq 0 ] || fail "the hybrid run exited $rc"
    grep -qF "2 replicas of a 2-stage pipeline, ZeRO-1" "$out" || fail "no layout in the description"
    grep -qF "rank (replica, stage): 0 (0, 0), 1 (1, 0), 2 (0, 1), 3 (1, 1)" "$out" ||
      fail "the description does not place the ranks"
    grep -qE "^3 +1 +1 +12 " "$out" || fail "the summary does not place rank 3"
    [ "$(same_losses "$one" "$straight" 1e-5)" -eq 12 ] || fail "steps missing"
    [ "$(json_number replicas "$straight/run.json")" = 2 ] || fail "run.json: replicas"
    [ "$(json_number stages "$straight/run.json")" = 2 ] || fail "run.json: stages"
    tr -d ' \n' <"$straight/run.json" | grep -q '"rank":2,"replica":0,"stage":1,' ||
      fail "run.json does not place rank 2"
    # ZeRO-1: the four ranks' shards add up to one worker's whole state, padding aside.
    whole="$(json_number optimizer_state_bytes "$one/run.json")"
    shards="$(sed -n 's/^ *"optimizer_state_bytes": \([0-9]*\),\{0,1\}$/\1/p' \
      "$straight/run.json" | awk '{ s += $1 } END { print s }')"
    awk -v w="$whole" -v s="$shards" 'BEGIN { exit !(w > 0 && s >= w && s - w <= 64) }' ||
      fail "the shards' optimizer state ($shards bytes) is not one worker's ($whole)"
    no_worker_left
    # SIGTERM to the launcher mid-run.
    dir="$tmp/run-hybrid-preempted"
    TANDEM_TEST_STEP_SLEEP_MS=150 "$launcher" "${job[@]}" --run-dir="$dir" \
      >"$tmp/out-preempted.txt" 2>&1 &
    pid=$!
    wait_for_steps "$dir" 3 || { kill -KILL $pid; cat "$tmp/out-preempted.txt"; fail "no start"; }
    kill -TERM $pid
    for _ in $(seq 1 300); do
      kill -0 $pid 2>/dev/null || break
      sleep 0.2
    done
    kill -0 $pid 2>/dev/null && { kill -KILL $pid; fail "still running 60 s after SIGTERM"; }
    wait $pid
    rc=$?
    cat "$tmp/out-preempted.txt"
    [ "$rc" -eq 75 ] || fail "exited $rc after SIGTERM, not 75"
    stopped=$(sed -n 's/.*"exit": "preempted at step \([0-9]*\)".*/\1/p' "$dir/run.json")
    [ -f "$dir/checkpoints/step-$(printf %06d "$stopped").manifest" ] ||
      fail "no manifest for step '$stopped'"
    no_worker_left
    timeout 60 "$launcher" "${job[@]}" --run-dir="$dir" --resume=auto >"$tmp/out-resumed.txt" 2>&1 ||
      { cat "$tmp/out-resumed.txt"; fail "--resume=auto failed"; }
    [ "$(same_losses "$straight" "$dir" 0)" -eq 12 ] || fail "the resumed run lacks steps"
    no_worker_left
    # Rank 3, (replica 1, stage 1), kills itself at step 3 of a run far too long to finish.
    dir="$tmp/run-hybrid-crash"
    out="$tmp/out-hybrid-crash.txt"
    TANDEM_TEST_CRASH_RANK=3 TANDEM_TEST_CRASH_STEP=3 timeout 60 "$launcher" \
      "${job[@]/--steps=12/--steps=10000000}" --run-dir="$dir" >"$out" 2>&1
    rc=$?
    end=$(date +%s)
    cat "$out"
    [ "$rc" -ne 124 ] || fail "the launcher did not stop the job (timed out)"
    [ "$rc" -eq 1 ] || fail "the launcher exited $rc after a worker crashed, not 1"
    grep -qF "result      rank 3 (replica 1, stage 1) failed (signal 9 SIGKILL)" "$out" ||
      fail "the summary's result does not name rank 3, its place and the signal"
    crashed=$(stat -c %Y "$dir/metrics/rank-3.jsonl")
    [ $((end - crashed)) -le 10 ] || fail "the launcher took $((end - crashed)) s after the crash"
    grep -q '"failed_rank": 3' "$dir/run.json" || fail "run.json does not name rank 3"
    no_worker_left
    pgrep -f "mpirun.*$worker" >/dev/null && fail "mpirun left behind"
    echo "PASSED: hybrid D=2 x K=2 with ZeRO-1: one worker's losses; preempted at step" \
      "$stopped, resumed bit for bit; a crash stopped in $((end - crashed)) s"
    ;;

  slow_start)
    # Every worker takes 5 s to set up its communicator (as CUDA and NCCL can on a cold
    # machine) against a 2 s heartbeat timeout: it reports while it sets up, so the watchdog
    # lets it be.
    dir="$tmp/run-slow-start"
    out="$tmp/out-slow-start.txt"
    TANDEM_TEST_INIT_SLEEP_MS=5000 timeout 60 "$launcher" --strategy=data --gpus=2 \
      "${small[@]}" --steps=3 --heartbeat-timeout=2 --run-dir="$dir" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ "$rc" -eq 0 ] || fail "a slow start exited $rc"
    grep -q '"exit": "ok"' "$dir/run.json" || fail "run.json's exit is not ok"
    no_worker_left
    echo "PASSED: workers 5 s in setting up, under a 2 s heartbeat timeout"
    ;;

  restart)
    job=(--strategy=data --gpus=2 "${small[@]}" --steps=12 --checkpoint-every=3)
    straight="$tmp/run-straight"
    timeout 60 "$launcher" "${job[@]}" --run-dir="$straight" >/dev/null 2>&1 ||
      fail "the uninterrupted run failed"
    # Rank 1 crashes once at step 7: restarted from step 6, the run succeeds.
    dir="$tmp/run-restart"
    out="$tmp/out-restart.txt"
    TANDEM_TEST_CRASH_RANK=1 TANDEM_TEST_CRASH_STEP=7 TANDEM_TEST_CRASH_ONCE_FILE="$tmp/crashed" \
      timeout 90 "$launcher" "${job[@]}" --max-restarts=2 --run-dir="$dir" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ "$rc" -eq 0 ] || fail "exited $rc after one crash with --max-restarts=2"
    [ -f "$tmp/crashed" ] || fail "rank 1 did not crash"
    grep -qF "launcher: rank 1 failed (signal 9 SIGKILL); restarting from step 6 (restart 1 of 2)" \
      "$out" || fail "no restart line"
    grep -q '"restarts": 1' "$dir/run.json" || fail "run.json does not count the restart"
    grep -q '"exit": "ok"' "$dir/run.json" || fail "run.json's exit is not ok"
    losses="$(sed -n 's/^ *"losses": \[\(.*\)\],$/\1/p' "$dir/run.json" | tr ',' '\n' | grep -c .)"
    [ "$losses" -eq 12 ] || fail "run.json has $losses losses, not 12 (re-run steps must replace)"
    [ "$(same_losses "$straight" "$dir" 0)" -eq 12 ] || fail "steps missing"
    no_worker_left
    # A crash every time: K restarts, then the failure is reported.
    dir="$tmp/run-always"
    out="$tmp/out-always.txt"
    TANDEM_TEST_CRASH_RANK=1 TANDEM_TEST_CRASH_STEP=7 \
      timeout 90 "$launcher" "${job[@]}" --max-restarts=1 --run-dir="$dir" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ "$rc" -eq 1 ] || fail "exited $rc though the crash repeats, not 1"
    grep -q "restarting from step 6 (restart 1 of 1)" "$out" || fail "no restart line"
    grep -q "giving up after 1 restart" "$out" || fail "no giving-up line"
    grep -q '"failed_rank": 1' "$dir/run.json" || fail "run.json does not name rank 1"
    no_worker_left
    # Training diverges (the loss turns nan): not restarted, since the newest checkpoint holds
    # the weights that diverged.
    dir="$tmp/run-diverged"
    out="$tmp/out-diverged.txt"
    timeout 90 "$launcher" "${job[@]}" --lr=1e10 --warmup=0 --clip-norm=0 --max-restarts=2 \
      --run-dir="$dir" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ "$rc" -eq 1 ] || fail "exited $rc after diverging, not 1"
    grep -q "the loss is nan: training diverged" "$out" || fail "no divergence line"
    grep -qF "launcher: not restarted: training diverged" "$out" || fail "no not-restarted line"
    grep -q "restarting from step" "$out" && fail "a diverged run was restarted"
    no_worker_left
    echo "PASSED: restarted after a crash, losses as uninterrupted; a repeating crash gives up;"\
      "a diverged run is not restarted"
    ;;

  reshard)
    # Checkpoints move between strategies and worker counts: data x2 -> pipeline x4 ->
    # pipeline x2 -> data x2, each continuing with the losses of the run that never changed
    # (within 1e-5 relative: the sums run in another order).
    common=("${small[@]}" --steps=10 --checkpoint-every=2)
    never="$tmp/run-never"
    timeout 60 "$launcher" --strategy=data --gpus=2 "${common[@]}" --run-dir="$never" \
      >/dev/null 2>&1 || fail "the unchanged run failed"
    from="$never/checkpoints/step-000004"
    for hop in pipeline:4:6 pipeline:2:8 data:2:-; do
      IFS=: read -r strategy gpus next <<<"$hop"
      dir="$tmp/run-$strategy-$gpus"
      timeout 60 "$launcher" --strategy="$strategy" --gpus="$gpus" "${common[@]}" \
        --resume="$from" --run-dir="$dir" >"$tmp/out-hop.txt" 2>&1
      rc=$?
      [ "$rc" -eq 0 ] || { cat "$tmp/out-hop.txt"; fail "$strategy x$gpus from $from exited $rc"; }
      n=$(same_losses "$never" "$dir" 1e-5)
      first=$(step_losses "$dir" | head -1 | cut -d' ' -f1)
      echo "$strategy x$gpus from $(basename "$from"): steps $first-9 ($n) match the unchanged run"
      [ "$first" -eq "$(basename "$from" | sed 's/step-0*//')" ] || fail "did not start at $from"
      [ "$next" = - ] || from="$dir/checkpoints/step-$(printf %06d "$next")"
    done
    # The initial weights are checkpoint step 0: a run resumed from it (--resume=auto, where it
    # is the only one) trains the unchanged run's 10 steps, bit for bit.
    [ -f "$never/checkpoints/step-000000.manifest" ] || fail "no checkpoint of step 0"
    dir="$tmp/run-from-0"
    mkdir -p "$dir/checkpoints"
    cp "$never"/checkpoints/step-000000.* "$dir/checkpoints/"
    timeout 60 "$launcher" --strategy=data --gpus=2 "${common[@]}" --resume=auto \
      --run-dir="$dir" >"$tmp/out-from-0.txt" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || { cat "$tmp/out-from-0.txt"; fail "the run from step 0 exited $rc"; }
    grep -q "resuming from $dir/checkpoints/step-000000 (step 0)" "$tmp/out-from-0.txt" ||
      { cat "$tmp/out-from-0.txt"; fail "--resume=auto did not resume from step 0"; }
    [ "$(same_losses "$never" "$dir" 0)" -eq 10 ] || fail "the run from step 0 lacks steps"
    echo "data x2 from step-000000: steps 0-9 as the unchanged run's, bit for bit"
    no_worker_left
    echo "PASSED: data x2 -> pipeline x4 -> pipeline x2 -> data x2 resharded; resumed from step 0"
    ;;

  bad_checkpoint)
    dir="$tmp/run-src"
    timeout 60 "$launcher" --strategy=pipeline --gpus=2 "${small[@]}" --steps=6 \
      --checkpoint-every=2 --run-dir="$dir" >/dev/null 2>&1 || fail "the source run failed"
    ck="$dir/checkpoints"
    # A missing shard.
    mv "$ck/step-000004.stage-1.ckpt" "$tmp/saved.ckpt"
    timeout 30 "$launcher" --strategy=data --gpus=2 "${small[@]}" --steps=6 \
      --resume="$ck/step-000004" --run-dir="$tmp/run-missing" >"$tmp/out.txt" 2>&1
    rc=$?
    cat "$tmp/out.txt"
    [ "$rc" -eq 2 ] || fail "a missing shard: exited $rc, not 2"
    grep -qF "checkpoint shard $ck/step-000004.stage-1.ckpt is missing" "$tmp/out.txt" ||
      fail "the missing shard is not named"
    # A corrupt shard (one byte changed; size and trailer as the manifest lists them).
    cp "$tmp/saved.ckpt" "$ck/step-000004.stage-1.ckpt"
    printf 'X' | dd of="$ck/step-000004.stage-1.ckpt" bs=1 seek=100 conv=notrunc 2>/dev/null
    timeout 30 "$launcher" --strategy=data --gpus=2 "${small[@]}" --steps=6 \
      --resume="$ck/step-000004" --run-dir="$tmp/run-corrupt" >"$tmp/out.txt" 2>&1
    rc=$?
    cat "$tmp/out.txt"
    [ "$rc" -eq 2 ] || fail "a corrupt shard: exited $rc, not 2"
    grep -qF "checkpoint $ck/step-000004.stage-1.ckpt is corrupt" "$tmp/out.txt" ||
      fail "the corrupt shard is not named"
    [ ! -e "$tmp/run-missing" ] && [ ! -e "$tmp/run-corrupt" ] || fail "a refused run made its directory"
    # --resume=auto passes over the broken step-4 checkpoint... (step 6 is whole): and over
    # step 6 too once its shard is gone, landing on step 2.
    rm "$ck/step-000006.stage-0.ckpt"
    timeout 60 "$launcher" --strategy=pipeline --gpus=2 "${small[@]}" --steps=6 \
      --resume=auto --run-dir="$dir" >"$tmp/out.txt" 2>&1
    rc=$?
    cat "$tmp/out.txt"
    [ "$rc" -eq 0 ] || fail "--resume=auto past broken checkpoints exited $rc"
    grep -q "passed over checkpoint shard $ck/step-000006.stage-0.ckpt is missing" "$tmp/out.txt" ||
      fail "step 6 was not passed over by name"
    grep -q "passed over checkpoint $ck/step-000004.stage-1.ckpt is corrupt" "$tmp/out.txt" ||
      fail "step 4 was not passed over by name"
    grep -q "resuming from $ck/step-000002 (step 2)" "$tmp/out.txt" || fail "did not resume from step 2"
    no_worker_left
    echo "PASSED: missing and corrupt shards refused by name"
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
    # --check: the same problems refused, with --check's exit codes; a valid job passes
    # without starting a worker or making a run directory.
    expect_refused "launcher: --strategy=banana: use data, model or pipeline" --check \
      --strategy=banana
    BUILD_WORKING_DIRECTORY="$user" timeout 30 "$launcher" --check --strategy=pipeline --gpus=2 \
      "${small[@]}" >"$tmp/check.txt" 2>&1 || fail "--check of a valid job did not exit 0"
    cat "$tmp/check.txt"
    grep -qF "launcher: check passed, nothing started: 2 " "$tmp/check.txt" ||
      fail "--check did not say what would run"
    [ -z "$(ls -A "$user")" ] || fail "--check created $(ls -A "$user")"
    no_worker_left
    # --balance=time: the blocks are timed in a worker process, and the split is said.
    BUILD_WORKING_DIRECTORY="$user" timeout 30 "$launcher" --check --strategy=pipeline --gpus=2 \
      --balance=time "${small[@]}" >"$tmp/check.txt" 2>&1 || fail "--check --balance=time failed"
    cat "$tmp/check.txt"
    grep -qE "^launcher: --balance=time: stages of [0-9]+,[0-9]+ blocks, from each block's" \
      "$tmp/check.txt" || fail "--balance=time did not say its split"
    no_worker_left
    # --help lists the flags and exits 0.
    "$launcher" --help >"$tmp/help.txt" 2>&1 || fail "--help did not exit 0"
    grep -q -- "--micro-batches" "$tmp/help.txt" || fail "--help lacks --micro-batches"
    echo "PASSED: bad flags refused"
    ;;

  *)
    fail "unknown case '$case_name'"
    ;;
esac
