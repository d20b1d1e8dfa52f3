#!/bin/sh
# Plans gpt2-small (GPT-2 124M) on 64 H200s (8 nodes of 8) without a GPU: every layout's step
# time and memory predicted from the example block times (derived from FLOPs at 40% MFU, not
# measured: replace them with a file written on an H200 by
#   bazel run //tools:compare -- --plan --gpus=8 --model=gpt2-small --dtype=bf16 \
#     --device=cuda --write-block-times=gpt2-small-h200.json --no-run
# ) and the links across nodes (400 Gb/s InfiniBand per GPU: 50 GB/s, 5 us). Under a minute
# on 2 cores; writes reports/<time>/plan.md and plan.json.
set -eu
cd "$(dirname "$0")/.."
exec bazel run //tools:compare -- --plan --gpus=64 --model=gpt2-small --batch=512 \
  --dtype=bf16 --device=cuda --device-memory=141GB --link=50,5 \
  --block-times=examples/block_times/gpt2-small-h200.json --no-run "$@"
