#!/usr/bin/env bash
# `bazel run //tools:bench`: every Tandem benchmark in one go on this machine, then
# BENCHMARKS.md (in the directory `bazel run` was started from) rewritten from the results:
# communicator vs raw MPI (all-reduce, all-gather, reduce-scatter), runtime matmul vs raw
# sgemm, memory-bound ops vs memcpy, one-worker training, data-parallel scaling, overlap and
# bucket sizes, the pipeline bubble, hybrid layouts on 4 workers, tensor parallelism on 2 and 4,
# ZeRO-1's optimizer state per
# rank, CPU streams (asynchronous against immediate), MPI doorbells (on against off), the
# planner's predictions against runs (the development configuration and two held out from
# it), and PyTorch on the same model where it is installed. Takes about 25 minutes on 2 cores.
# It refuses to start on a tree with uncommitted changes (the report names the commit the
# binaries were built from) unless TANDEM_BENCH_DIRTY=1, which stamps the report dirty.
set -euo pipefail

runfiles="${RUNFILES_DIR:-$0.runfiles}/tandem"
[ -d "$runfiles" ] || runfiles="$(pwd)"
out_dir="$(mktemp -d "${TMPDIR:-/tmp}/tandem-bench.XXXXXX")"
dest="${BUILD_WORKING_DIRECTORY:-$(pwd)}/BENCHMARKS.md"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mpi=(mpirun --oversubscribe --bind-to none --mca btl self,vader)

step() { echo "bench: $*" >&2; }

# The commit the binaries were built from, read now (not after the run, when the tree may
# have moved on), and the machine's cores: run.json, which the report takes its facts from.
tree="${BUILD_WORKSPACE_DIRECTORY:-$(pwd)}"
commit="$(git -C "$tree" rev-parse HEAD 2>/dev/null || true)"
if [ -z "$commit" ]; then
  echo "bench: $tree is not a git checkout: the report could not name its commit" >&2
  exit 1
fi
dirty=false
if [ -n "$(git -C "$tree" status --porcelain 2>/dev/null)" ]; then
  dirty=true
  if [ "${TANDEM_BENCH_DIRTY:-}" != 1 ]; then
    echo "bench: the tree at ${commit:0:7} has uncommitted changes; commit them, or set" \
      "TANDEM_BENCH_DIRTY=1 to stamp the report dirty" >&2
    exit 1
  fi
fi
echo "{\"commit\": \"$commit\", \"dirty\": $dirty, \"cores\": $(nproc)}" >"$out_dir/run.json"

step "all-reduce, all-gather, reduce-scatter: Tandem's MPI communicator against raw MPI (2 ranks)"
for collective in all_reduce all_gather reduce_scatter; do
  "${mpi[@]}" -np 2 "$runfiles/comm/allreduce_bench_bin" --collective=$collective \
    >"$out_dir/${collective//_/}.txt"
done
step "ops: runtime matmul against raw sgemm, memory-bound ops against memcpy"
"$runfiles/runtime/ops_bench" --benchmark_out="$out_dir/ops.json" \
  --benchmark_out_format=json --benchmark_color=false >"$out_dir/ops.txt" 2>&1
step "one-worker training of gpt-tiny and a d_model 512 GPT"
"$runfiles/model/train_bench" >"$out_dir/train.txt"
step "data parallel on 1 and 2 workers"
# As the launcher starts CPU data-parallel workers: Open MPI yields the core while the
# communication thread waits (launcher/job_runner.cc).
for np in 1 2; do
  OMPI_MCA_mpi_yield_when_idle=1 "${mpi[@]}" -np "$np" "$runfiles/parallel/strategy_bench" data \
    >>"$out_dir/strategy.jsonl"
done
step "data parallel on 2 workers, busy-polling (Open MPI's default) against yielding, 7 pairs"
for pair in 1 2 3 4 5 6 7; do
  for yield in 0 1; do
    OMPI_MCA_mpi_yield_when_idle=$yield "${mpi[@]}" -np 2 "$runfiles/parallel/strategy_bench" \
      data | sed "s/^{/{\"yield_when_idle\": $yield, /" >>"$out_dir/yield.jsonl"
  done
done
step "pipeline bubble, 2 and 4 stages"
for np in 2 4; do
  "${mpi[@]}" -np "$np" "$runfiles/parallel/strategy_bench" pipeline >>"$out_dir/strategy.jsonl"
done
step "hybrid: 2 replicas x 2 stages against data parallel and 4 stages, 4 workers, 3 rounds"
"${mpi[@]}" -np 4 "$runfiles/parallel/strategy_bench" hybrid >"$out_dir/hybrid.jsonl"
step "tensor parallelism: T=2 and T=4 (sequence parallel too) against data parallel, 3 rounds"
for np in 2 4; do
  "${mpi[@]}" -np "$np" "$runfiles/parallel/strategy_bench" tensor >>"$out_dir/tensor.jsonl"
done
step "ZeRO-1: optimizer state bytes per rank on 1, 2 and 4 workers"
for np in 1 2 4; do
  "${mpi[@]}" -np "$np" "$runfiles/parallel/strategy_bench" zero >>"$out_dir/zero.jsonl"
done
step "CPU streams: tokens/s, asynchronous against immediate, 3 alternating pairs"
for pair in 1 2 3; do
  for streams in immediate async; do
    for np in 1 2; do
      TANDEM_CPU_STREAMS=$streams OMPI_MCA_mpi_yield_when_idle=1 "${mpi[@]}" -np "$np" \
        "$runfiles/parallel/strategy_bench" streams >>"$out_dir/streams.jsonl"
    done
  done
done
step "MPI doorbells: off against on, 2 alternating pairs (2 workers: data and 1F1B; 4: hybrid)"
for pair in 1 2; do
  for doorbells in off on; do
    TANDEM_MPI_DOORBELLS=$doorbells OMPI_MCA_mpi_yield_when_idle=1 "${mpi[@]}" -np 2 \
      "$runfiles/parallel/strategy_bench" streams |
      sed "s/^{/{\"doorbells\": \"$doorbells\", /" >>"$out_dir/doorbells.jsonl"
    TANDEM_MPI_DOORBELLS=$doorbells "${mpi[@]}" -np 4 "$runfiles/parallel/strategy_bench" hybrid |
      sed "s/^{/{\"doorbells\": \"$doorbells\", /" >>"$out_dir/doorbells.jsonl"
  done
done
step "planner: compare --plan on 2 and 4 workers, predicted against measured; 64 H200s planned"
for np in 2 4; do
  "$runfiles/tools/compare" --plan --gpus=$np --model=gpt-tiny --batch=16 --steps=20 \
    --out="$out_dir/plan$np" >"$out_dir/plan$np.txt" 2>&1 || true
done
step "planner held out: a GPT of 6 layers, d_model 192 on 4 workers and an MLP on 2, never tuned on"
"$runfiles/tools/compare" --plan --gpus=4 --model=gpt --n-layer=6 --d-model=192 --n-head=6 \
  --seq-len=128 --batch=24 --steps=10 --repeats=3 --out="$out_dir/heldout-gpt4" \
  >"$out_dir/heldout-gpt4.txt" 2>&1 || true
"$runfiles/tools/compare" --plan --gpus=2 --model=mlp --batch=32 --steps=10 --repeats=3 \
  --out="$out_dir/heldout-mlp2" >"$out_dir/heldout-mlp2.txt" 2>&1 || true
start=$(date +%s%N)
"$runfiles/tools/compare" --plan --gpus=64 --model=gpt2-small --batch=512 --dtype=bf16 \
  --device=cuda --device-memory=141GB --link=50,5 \
  --block-times="$runfiles/examples/block_times/gpt2-small-h200.json" --no-run \
  --out="$out_dir/plan64" >"$out_dir/plan64.txt" 2>&1 || true
echo "{\"milliseconds\": $((($(date +%s%N) - start) / 1000000))}" >"$out_dir/plan64.json"
step "PyTorch on the same model (1 process, 2-process DDP over Gloo)"
# PyTorch's python: $TANDEM_PYTHON, else the virtual environment CI installs (.ci/venv.sh),
# else python3.
torch_python="${TANDEM_PYTHON:-${TANDEM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/venv}/bin/python}"
[ -x "$torch_python" ] || torch_python=python3
for procs in 1 2; do
  "$torch_python" "$runfiles/tools/bench_pytorch.py" --procs "$procs" --steps 12 \
    >>"$out_dir/pytorch.jsonl" 2>/dev/null || echo '{"skipped": "bench_pytorch.py failed"}' \
    >>"$out_dir/pytorch.jsonl"
done
python3 "$runfiles/tools/bench_report.py" "$out_dir" "$dest" >"$dest.tmp"
mv "$dest.tmp" "$dest"
step "wrote $dest (raw outputs in $out_dir)"
