#!/bin/sh
# `bazel run //comm:allreduce_bench [-- FLAGS]`: runs the collective benchmark (all-reduce, or
# --collective=all_gather|reduce_scatter) on TANDEM_BENCH_NP ranks (default 2) of this host
# through mpirun.
set -eu
bin="$1"
shift
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
np="${TANDEM_BENCH_NP:-2}"
exec mpirun --oversubscribe -np "$np" --mca btl self,vader --bind-to none "$bin" "$@"
