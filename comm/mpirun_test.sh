#!/bin/sh
# Runs a gtest binary on N ranks of this host through mpirun, over shared memory ("shm",
# Open MPI's vader) or TCP on loopback ("tcp", the transport used across hosts), with a time
# limit so that a hang fails the test instead of stalling it. Every rank writes its own
# GoogleTest XML: rank 0 to $XML_OUTPUT_FILE, the one Bazel reads as the test's test.xml (rank
# 0 prints gtest's output, comm/mpi_test_main.h); rank R to rank<R>.test.xml in
# $TEST_UNDECLARED_OUTPUTS_DIR (Bazel keeps it in the test's outputs.zip), else beside
# $XML_OUTPUT_FILE. A rank's failures fail the test through its exit code.
# Usage: mpirun_test.sh N shm|tcp BINARY [ARGS...]
set -eu
if [ "${1:-}" = "--rank" ]; then  # one rank, started by mpirun below
  shift
  rank="${OMPI_COMM_WORLD_RANK:?not started by mpirun}"
  if [ "$rank" != 0 ] && [ -n "${XML_OUTPUT_FILE:-}" ]; then
    if [ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ]; then
      XML_OUTPUT_FILE="$TEST_UNDECLARED_OUTPUTS_DIR/rank$rank.test.xml"
    else
      XML_OUTPUT_FILE="${XML_OUTPUT_FILE%.xml}.rank$rank.xml"
    fi
    export XML_OUTPUT_FILE
  fi
  exec "$@"
fi
n="$1"
transport="$2"
bin="$3"
shift 3
case "$transport" in
  shm) btl="--mca btl self,vader" ;;
  tcp) btl="--mca btl self,tcp --mca btl_tcp_if_include lo" ;;
  *) echo "mpirun_test.sh: transport must be shm or tcp, not '$transport'" >&2; exit 2 ;;
esac
# Open MPI refuses to run as root without these (CI runs as root).
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Keep Open MPI's temporary files inside the test's temporary directory.
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
# Every rank would race to remove gtest's premature-exit marker; the exit code suffices.
unset TEST_PREMATURE_EXIT_FILE
limit="${TANDEM_MPIRUN_TIMEOUT_S:-120}"
echo "mpirun -np $n over $transport: $bin $* (limit ${limit}s)"
status=0
# shellcheck disable=SC2086  # $btl is a list of words
timeout --signal=TERM --kill-after=10 "$limit" \
  mpirun --oversubscribe -np "$n" $btl --bind-to none sh "$0" --rank "$bin" "$@" || status=$?
if [ "$status" -eq 124 ]; then
  echo "FAILED: mpirun -np $n did not finish within ${limit}s (a rank hung)" >&2
fi
exit "$status"
