#!/bin/sh
# The orderings the GPU depends on, proved on CPU workers (parallel/ordering_test.cc): the
# same cases run with CPU streams that run work as it is issued (no ordering can be missing),
# then with asynchronous streams, then asynchronous with every item of work delayed by a
# random 0..200 us (TANDEM_CPU_STREAM_JITTER_US). All three must give the same losses, bit
# for bit; each run also holds every case to one worker and to one host synchronization per
# read of the loss. Each layout runs on the ranks it takes: data parallelism, GPipe, 1F1B,
# ZB-H1 (K=3, M=6) and evaluation between steps on 3; interleaved (K=2, v=2, M=4) and tied
# embeddings over 2 stages on 2; D=2 x K=2 under ZeRO-1 on 4.
# Usage: ordering_test.sh MPIRUN_TEST_SH ORDERING_TEST_BIN
set -eu
mpirun_test="$1"
bin="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}"
# Ranks, the suite they run, and the fewest cases it records.
layouts="3:OrderingTest.*:11 2:OrderingOnTwoRanksTest.*:4 4:OrderingOnFourRanksTest.*:3"
run() {
  mode="$1"; jitter="$2"; name="$3"; ranks="$4"; suite="$5"
  echo "== $ranks ranks, TANDEM_CPU_STREAMS=$mode TANDEM_CPU_STREAM_JITTER_US=$jitter"
  mkdir -p "$out/$name"
  TANDEM_CPU_STREAMS="$mode" TANDEM_CPU_STREAM_JITTER_US="$jitter" \
    "$mpirun_test" "$ranks" shm "$bin" --gtest_filter="$suite" \
    --losses_out="$out/$name.txt" --scratch_dir="$out/$name"
}
total=0
for layout in $layouts; do
  ranks="${layout%%:*}"; rest="${layout#*:}"; suite="${rest%%:*}"; fewest="${rest#*:}"
  run immediate 0 "immediate-np$ranks" "$ranks" "$suite"
  run async 0 "async-np$ranks" "$ranks" "$suite"
  run async 200 "jitter-np$ranks" "$ranks" "$suite"
  for name in async jitter; do
    if ! cmp -s "$out/immediate-np$ranks.txt" "$out/$name-np$ranks.txt"; then
      echo "FAILED: on $ranks ranks the $name run's losses differ from the immediate run's:" >&2
      diff "$out/immediate-np$ranks.txt" "$out/$name-np$ranks.txt" >&2 || true
      exit 1
    fi
  done
  cases=$(wc -l < "$out/immediate-np$ranks.txt")
  if [ "$cases" -lt "$fewest" ]; then
    echo "FAILED: only $cases cases recorded on $ranks ranks (want $fewest)" >&2
    exit 1
  fi
  total=$((total + cases))
done
echo "PASSED: $total cases give the same loss bits immediate, asynchronous and jittered"
