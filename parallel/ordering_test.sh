#!/bin/sh
# The orderings the GPU depends on, proved on 3 CPU workers (parallel/ordering_test.cc): the
# same cases run with CPU streams that run work as it is issued (no ordering can be missing),
# then with asynchronous streams, then asynchronous with every item of work delayed by a
# random 0..200 us (TANDEM_CPU_STREAM_JITTER_US). All three must give the same losses, bit
# for bit; each run also holds every case to one worker and to one host synchronization per
# read of the loss.
# Usage: ordering_test.sh MPIRUN_TEST_SH ORDERING_TEST_BIN
set -eu
mpirun_test="$1"
bin="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}"
run() {
  mode="$1"; jitter="$2"; name="$3"
  echo "== TANDEM_CPU_STREAMS=$mode TANDEM_CPU_STREAM_JITTER_US=$jitter"
  mkdir -p "$out/$name"
  TANDEM_CPU_STREAMS="$mode" TANDEM_CPU_STREAM_JITTER_US="$jitter" \
    "$mpirun_test" 3 shm "$bin" --losses_out="$out/$name.txt" --scratch_dir="$out/$name"
}
run immediate 0 immediate
run async 0 async
run async 200 jitter
for name in async jitter; do
  if ! cmp -s "$out/immediate.txt" "$out/$name.txt"; then
    echo "FAILED: the $name run's losses differ from the immediate run's:" >&2
    diff "$out/immediate.txt" "$out/$name.txt" >&2 || true
    exit 1
  fi
done
cases=$(wc -l < "$out/immediate.txt")
if [ "$cases" -lt 6 ]; then
  echo "FAILED: only $cases cases recorded" >&2
  exit 1
fi
echo "PASSED: $cases cases give the same loss bits immediate, asynchronous and jittered"
