#!/bin/bash
# examples/slurm/train.sbatch on a real Slurm cluster (one node is enough;
# tools/start_slurm.sh runs one on a build machine): srun starts 2 workers, rank 0 hosts the
# coordinator, the job trains; then a job sent SIGTERM mid-run (scancel --signal=TERM, as
# preemption does) checkpoints, exits 75, requeues itself and finishes from its checkpoint
# with the losses of an uninterrupted run, bit for bit.
# Usage: slurm_test.sh LAUNCHER WORKER SBATCH_SCRIPT. Skips, saying why, without a cluster.
set -u
. "$(dirname "$0")/../tools/junit.sh"  # check, fail, skip; the checks as JUnit XML
abs() { echo "$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"; }
launcher="$(abs "$1")"
worker="$(abs "$2")"
script="$(abs "$3")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export TMPDIR="$tmp"
small="--device=cpu --model=gpt --n-layer=2 --d-model=32 --n-head=2 --seq-len=16 --batch=8"

for c in sbatch squeue scancel scontrol sinfo srun; do
  command -v $c >/dev/null 2>&1 || skip "no Slurm here ($c not found)"
done
states="$(timeout 10 sinfo -h -o %T 2>&1)" || skip "Slurm does not answer: $states"
echo "$states" | grep -Eq '^(idle|mixed)' || skip "no idle Slurm node (sinfo: $states)"

jobs=()
cleanup() {
  for j in "${jobs[@]}"; do scancel "$j" 2>/dev/null; done
}
on_exit cleanup

# submit RUN_DIR TRAIN_FLAGS: the example script on one node, 2 CPU tasks; prints the job id.
submit() {
  LAUNCHER="$launcher" WORKER="$worker" RUN_DIR="$1" TRAIN_FLAGS="$2" \
    sbatch --parsable --nodes=1 --ntasks=2 --ntasks-per-node=2 --gpus-per-node=0 \
    --time=10:00 --output="$tmp/slurm-%j.out" "$script"
}

# Waits until job $1 left the queue (up to $2 seconds).
wait_gone() {
  for _ in $(seq 1 "$2"); do
    [ -z "$(squeue -h -j "$1" -o %T 2>/dev/null)" ] && return 0
    sleep 1
  done
  return 1
}

# "step loss" of rank 0, the last record of each step.
step_losses() {
  sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1/metrics/rank-0.jsonl" |
    awk '{ v[$1] = $2 } END { for (s in v) print s, v[s] }' | sort -n
}

# 1. A job trains.
check "srun starts 2 workers, rank 0 hosts the coordinator, the job trains"
run="$tmp/run-train"
job=$(submit "$run" "--strategy=data $small --steps=6") || fail "sbatch refused the job"
jobs+=("$job")
wait_gone "$job" 180 || fail "job $job still queued or running after 180 s"
out="$tmp/slurm-$job.out"
cat "$out"
grep -q "tandem: workers exited 0" "$out" || fail "job $job: the workers did not succeed"
for r in 0 1; do
  [ "$(grep -c . "$run/metrics/rank-$r.jsonl")" -eq 6 ] || fail "rank $r did not train 6 steps"
  grep -q "^rank $r registered from " "$run/logs/coordinator.log" ||
    fail "rank $r did not register with rank 0's coordinator"
done
echo "PASSED: srun, 2 tasks, rank 0 hosting the coordinator: 6 steps trained"

# 2. Preempted: SIGTERM to the tasks mid-run; checkpoint, exit 75, requeue, continue.
check "SIGTERM: every worker checkpoints, the job requeues itself and resumes bit for bit"
flags="--strategy=pipeline $small --steps=24"
ref="$tmp/run-reference"
timeout 120 "$launcher" --gpus=2 $flags --run-dir="$ref" >"$tmp/out-reference.txt" 2>&1 ||
  { cat "$tmp/out-reference.txt"; fail "the uninterrupted run failed"; }
run="$tmp/run-preempted"
job=$(TANDEM_TEST_STEP_SLEEP_MS=150 submit "$run" "$flags") || fail "sbatch refused the job"
jobs+=("$job")
for _ in $(seq 1 300); do
  [ "$(cat "$run/metrics/rank-0.jsonl" 2>/dev/null | grep -c .)" -ge 3 ] && break
  sleep 0.2
done
scancel --signal=TERM "$job" || fail "scancel --signal=TERM $job failed"
# The script requeues the job; Slurm holds a requeued job for a while before it may start
# again: release it at once.
held=""
for _ in $(seq 1 120); do
  if [ "$(squeue -h -j "$job" -o "%T %r" 2>/dev/null)" = "PENDING BeginTime" ]; then
    held=1
    break
  fi
  sleep 0.5
done
[ -n "$held" ] || fail "job $job was not requeued"
# Only once the first run's step has cleaned up (its PMIx socket has the same step id).
for _ in $(seq 1 60); do
  pgrep -f "slurmstepd: \[$job\." >/dev/null || break
  sleep 0.5
done
sleep 1
scontrol update JobId="$job" StartTime=now || fail "cannot release the requeued job $job"
wait_gone "$job" 240 || fail "the requeued job $job did not finish within 240 s"
out="$tmp/slurm-$job.out"
cat "$out"
grep -q "tandem: preempted: every worker checkpointed; requeueing job $job" "$out" ||
  fail "the job did not requeue itself after SIGTERM"
grep -q "(restart 1)" "$out" || fail "the job did not run again"
grep -q "resuming from $run/checkpoints/step-" "$out" || fail "the second run did not resume"
grep -q "tandem: workers exited 0" "$out" || fail "the second run did not finish"
diff <(step_losses "$ref") <(step_losses "$run") >"$tmp/diff.txt" ||
  { cat "$tmp/diff.txt"; fail "the preempted and requeued run's losses differ"; }
[ "$(step_losses "$run" | grep -c .)" -eq 24 ] || fail "the requeued run did not reach step 24"
echo "PASSED: SIGTERM under Slurm: checkpoint, exit 75, requeue, resumed bit for bit"
