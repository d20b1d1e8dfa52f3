#!/usr/bin/env bash
# Checks Tandem's CUDA backend on a GPU machine that has no Bazel and no network.
#   tools/gpu_check.sh build   builds the CUDA test binaries here and packs them, with the
#                              shared libraries they load that a GPU machine with CUDA 13 in
#                              /usr/local/cuda lacks (Debian's absl, OpenBLAS, ...; Bazel's
#                              solib .so files), into dist/gpu_check/ with a run.sh.
#   dist/gpu_check/run.sh      on the GPU machine: runs every test, prints PASS/FAIL/SKIP
#                              per test and "N passed, N failed, N skipped"; exit 1 on failure.
#   tools/gpu_check.sh run     runs dist/gpu_check/run.sh (here the tests skip: no GPU).
# The CUDA toolkit's and the driver's libraries (cudart, cuBLAS, NCCL, cuDNN, libcuda) are
# never packed: run.sh finds them in /usr/local/cuda/lib64 and in PyTorch's nvidia/*/lib.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/dist/gpu_check"
targets=(//runtime:cuda_ops_test //runtime:cuda_runtime_test //runtime:ops_test
         //runtime:cpu_isa_test
         //model:cuda_train_test //comm:nccl_communicator_test //parallel:cuda_distributed_test)
# Libraries above this size are stored gzip-compressed and unpacked by run.sh.
compress_above_bytes=$((8 << 20))

usage() {
  sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# True for libraries every Linux machine has (glibc, the GCC runtime) and for the CUDA
# toolkit's and driver's, which the GPU machine brings itself.
skip_library() {
  local name="$1" path="$2"
  case "$name" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | \
      librt.so.* | libresolv.so.* | libutil.so.* | libgcc_s.so.* | libstdc++.so.*)
      return 0 ;;
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.* | \
      libcudnn*.so.* | libnvrtc*.so.* | libnvJitLink.so.* | libcufft*.so.* | libcurand.so.* | \
      libcusparse*.so.* | libcusolver*.so.* | libcupti.so.* | libnvidia-*.so.*)
      return 0 ;;
  esac
  case "$path" in
    /usr/local/cuda* | /usr/lib/x86_64-linux-gnu/nvidia/*) return 0 ;;
  esac
  return 1
}

pack_library() {
  local name="$1" path="$2"
  if [ -e "$out/lib/$name" ] || [ -e "$out/lib/$name.gz" ]; then
    return 0
  fi
  local size
  size="$(stat -L -c %s "$path")"
  if [ "$size" -gt "$compress_above_bytes" ]; then
    gzip -9 -c "$path" >"$out/lib/$name.gz"
  else
    cp -L "$path" "$out/lib/$name"
    chmod u+w "$out/lib/$name"
    # Bazel's own libraries carry debug info (-g1); the GPU run does not need it.
    case "$path" in */_solib_*) strip --strip-debug "$out/lib/$name" ;; esac
  fi
}

# Packs the shared libraries `ldd` lists for the binary $1 into $out/lib, but for those
# skip_library leaves out; libraries ldd cannot find are appended to the caller's $missing.
pack_libraries_of() {
  local line lib path
  # "libfoo.so.1 => /path/libfoo.so.1 (0x...)"; lines without "=>" are the loader and vdso.
  while IFS= read -r line; do
    case "$line" in *"=>"*) ;; *) continue ;; esac
    lib="$(awk '{print $1}' <<<"$line")"
    path="$(awk '{print $3}' <<<"$line")"
    if [ "$path" = "not" ]; then
      missing="$missing $lib"
      continue
    fi
    skip_library "$lib" "$path" && continue
    pack_library "$lib" "$path"
  done < <(ldd "$1")
}

build() {
  cd "$root"
  bazel build "${targets[@]}" //examples:train
  local bin_dir
  bin_dir="$(bazel info bazel-bin 2>/dev/null)"
  rm -rf "$out"
  mkdir -p "$out/bin" "$out/lib"
  local target name pkg bin missing=""
  for target in "${targets[@]}"; do
    name="${target##*:}"
    pkg="${target#//}"
    pkg="${pkg%%:*}"
    bin="$bin_dir/$pkg/$name"
    cp -L "$bin" "$out/bin/$name"
    chmod u+w "$out/bin/$name"
    strip --strip-debug "$out/bin/$name"
    pack_libraries_of "$bin"
  done
  if [ -n "$missing" ]; then
    echo "gpu_check: libraries the binaries need are missing here:$missing" >&2
    exit 1
  fi
  local deps
  deps="$(ldd "$bin_dir/runtime/cuda_ops_test")"
  if ! grep -q 'libcudart\.so' <<<"$deps"; then
    echo "gpu_check: the test binaries were built without CUDA (is CUDA_PATH set to a" \
         "toolkit without nvcc?); nothing to check on a GPU" >&2
    exit 1
  fi
  # The training check: the example trainer (its libraries are the tests' own) and the
  # PyTorch peer script.
  mkdir -p "$out/train"
  cp -L "$bin_dir/examples/train" "$out/train/train"
  chmod u+w "$out/train/train"
  strip --strip-debug "$out/train/train"
  # (Libraries it lacks are not reported: the check above has already run.)
  pack_libraries_of "$bin_dir/examples/train"
  cp "$root/tools/bench_pytorch.py" "$out/train/"
  write_run_script >"$out/run.sh"
  chmod +x "$out/run.sh"
  local kib
  kib="$(du -sk "$out" | cut -f1)"
  echo "gpu_check: packed $(ls "$out/bin" | wc -l) test binaries and $(ls "$out/lib" | wc -l)" \
       "libraries into ${out#"$root"/} ($((kib / 1024)) MiB)"
  if [ "$kib" -gt $((60 * 1024)) ]; then
    echo "gpu_check: warning: ${out#"$root"/} is over 60 MiB" >&2
  fi
}

write_run_script() {
  cat <<'RUN'
#!/usr/bin/env bash
# Runs Tandem's CUDA test binaries (packed by tools/gpu_check.sh build) on a GPU machine with
# CUDA 13 in /usr/local/cuda; no Bazel, no network. One line per test: PASS, FAIL or SKIP and
# its name; then "N passed, N failed, N skipped". Exit status 1 when any test failed or a
# binary crashed, timed out or could not start. Environment: GPU_CHECK_TIMEOUT_S (per binary,
# default 150), GPU_CHECK_FILTER (a --gtest_filter for every binary), GPU_CHECK_LOGS (a folder
# that keeps each binary's whole output and each training run's log; by default they are
# deleted and only failures are quoted), GPU_CHECK_TRAIN=0 (no training runs),
# GPU_CHECK_TRAIN_STEPS (default 30), GPU_CHECK_BUDGET_S (the whole run's seconds, default 540:
# each step's time limit shrinks to what is left, keeping room for the training runs, and a
# step with no time left is reported "NOT RUN", so the closing line is always printed),
# GPU_CHECK_MEMCHECK_S (seconds in all for the memcheck
# reruns below, default 90; 0: none). Where tests fail or a binary crashes, the failing tests
# run once more under compute-sanitizer's memcheck (out-of-bounds and misaligned accesses,
# CUDA API errors), and its "MEMCHECK" line and first errors are printed under them.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
keep_logs() {
  if [ -n "${GPU_CHECK_LOGS:-}" ]; then
    mkdir -p "$GPU_CHECK_LOGS" && cp "$work"/*.log "$GPU_CHECK_LOGS"/ 2>/dev/null
  fi
  rm -rf "$work"
}
trap keep_logs EXIT
timeout_s="${GPU_CHECK_TIMEOUT_S:-150}"
deadline=$(( $(date +%s) + ${GPU_CHECK_BUDGET_S:-540} ))
# allow MOST KEEP: the seconds a step may take, at most MOST, leaving KEEP seconds of the
# budget for the steps after it (0: no time left).
allow() {
  local left=$(( deadline - $(date +%s) - $2 ))
  [ "$left" -lt 0 ] && left=0
  echo $(( left < $1 ? left : $1 ))
}
not_run=0

# The large libraries travel compressed.
mkdir -p "$work/lib" "$work/tmp"
for gz in "$here"/lib/*.gz; do
  [ -e "$gz" ] || continue
  gzip -dc "$gz" >"$work/lib/$(basename "${gz%.gz}")"
done

# Ours first, then CUDA's, then the CUDA libraries of an installed PyTorch (NCCL lives there).
lib_path="$here/lib:$work/lib"
[ -d /usr/local/cuda/lib64 ] && lib_path="$lib_path:/usr/local/cuda/lib64"
torch_libs="$(python3 -c '
import glob, os
try:
    import nvidia
except Exception:
    raise SystemExit(0)
print(":".join(d for base in getattr(nvidia, "__path__", [])
               for d in sorted(glob.glob(os.path.join(base, "*", "lib")))))
' 2>/dev/null || true)"
[ -n "$torch_libs" ] && lib_path="$lib_path:$torch_libs"
export LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TEST_TMPDIR="$work/tmp"

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader \
    2>/dev/null | sed 's/^/gpu: /'
else
  echo "gpu: nvidia-smi not found"
fi
# Where a GPU is visible, a test skipping for want of one is a failure (CUDA did not start
# in the process: a missing libcuda, a driver mismatch), not a pass.
gpu_visible=0
nvidia-smi -L >/dev/null 2>&1 && gpu_visible=1
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
for bin in "$here"/bin/*; do
  nccl="$(ldd "$bin" 2>/dev/null | awk '$1 ~ /^libnccl\.so/ {print $3; exit}')"
  if [ -n "$nccl" ]; then
    echo "nccl: $nccl"
    break
  fi
done

sanitizer="$(command -v compute-sanitizer || true)"
if [ -z "$sanitizer" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  sanitizer=/usr/local/cuda/bin/compute-sanitizer
fi
memcheck_left="${GPU_CHECK_MEMCHECK_S:-90}"
# memcheck BINARY FILTER: the tests FILTER names under memcheck, within what is left of the
# budget (at most 60 s); what it found, quoted.
memcheck() {
  local bin="$1" filter="$2" limit begin rc
  limit="$(allow $((memcheck_left < 60 ? memcheck_left : 60)) "$train_keep")"
  [ -n "$sanitizer" ] && [ "$gpu_visible" = 1 ] && [ "$limit" -ge 10 ] || return 0
  local log="$work/$(basename "$bin").memcheck.log"
  begin=$(date +%s)
  (cd "$work" && timeout --kill-after=5 "$limit" "$sanitizer" --tool memcheck --print-limit 10 \
    "$bin" --gtest_filter="$filter") >"$log" 2>&1
  rc=$?
  memcheck_left=$((memcheck_left - ($(date +%s) - begin)))
  echo "MEMCHECK $(basename "$bin") $filter: $(grep -m1 -oE 'ERROR SUMMARY: .*' "$log" ||
    echo "no summary (exit status $rc, ${limit}s allowed)")"
  grep -E '^========= +(Invalid|Program hit|Address|at |by thread|Saved host|Host Frame|Misaligned|Out of bounds)' \
    "$log" | head -n 30 | sed 's/^/    | /'
}

passed=0
failed=0
skipped=0
# What the training runs below keep of the budget while the tests run.
train_keep=0
[ "$gpu_visible" = 1 ] && [ "${GPU_CHECK_TRAIN:-1}" = 1 ] && train_keep=240
for bin in "$here"/bin/*; do
  name="$(basename "$bin")"
  log="$work/$name.log"
  missing="$(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')"
  if [ -n "$missing" ]; then
    echo "FAIL $name (shared libraries not found: $missing)"
    failed=$((failed + 1))
    continue
  fi
  filter=()
  [ -n "${GPU_CHECK_FILTER:-}" ] && filter=("--gtest_filter=$GPU_CHECK_FILTER")
  limit="$(allow "$timeout_s" "$train_keep")"
  if [ "$limit" -lt 10 ]; then
    echo "NOT RUN $name (GPU_CHECK_BUDGET_S spent)"
    not_run=$((not_run + 1))
    continue
  fi
  start=$(date +%s)
  (cd "$work" && timeout --kill-after=10 "$limit" "$bin" ${filter[@]+"${filter[@]}"}) \
    >"$log" 2>&1
  rc=$?
  # "[       OK ] Suite.Test (12 ms)", "[  FAILED  ] Suite.Test/bf16, where GetParam() = ... (3 ms)"
  # and "[  SKIPPED ] Suite.Test (0 ms)"; the summary's repeats carry no time and are left out.
  results="$(awk '
    /^\[ *(OK|FAILED|SKIPPED) *\] .* \([0-9]+ ms\)$/ {
      status = $0; sub(/^\[ */, "", status); sub(/ *\].*$/, "", status)
      test = $0; sub(/^\[[^]]*\] /, "", test); sub(/[ ,].*$/, "", test)
      print (status == "OK" ? "PASS" : status == "FAILED" ? "FAIL" : "SKIP"), test
    }' "$log")"
  if [ "$gpu_visible" = 1 ] && grep -qE 'no CUDA device|no GPU visible' "$log"; then
    echo "# $name: tests skipped on a machine with a GPU: $(grep -m1 -oE '(no CUDA device|no GPU visible).*' "$log")"
    results="$(sed 's/^SKIP /FAIL /' <<<"$results")"
  fi
  if [ -n "$results" ]; then
    echo "$results"
    passed=$((passed + $(grep -c '^PASS ' <<<"$results")))
    skipped=$((skipped + $(grep -c '^SKIP ' <<<"$results")))
    failed=$((failed + $(grep -c '^FAIL ' <<<"$results")))
  fi
  # A test that started but never reported: the binary crashed or timed out inside it.
  last_run="$(awk '/^\[ RUN      \] / {t = $4}
                   /^\[ *(OK|FAILED|SKIPPED) *\] .* \([0-9]+ ms\)$/ {t = ""}
                   END {print t}' "$log")"
  if [ "$rc" -ne 0 ] && { [ -n "$last_run" ] || ! grep -q '^FAIL ' <<<"$results"; }; then
    why="exit status $rc"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      why="timed out after ${limit}s"
    fi
    echo "FAIL ${last_run:-$name} ($name: $why)"
    failed=$((failed + 1))
    tail -n 30 "$log" | sed 's/^/    | /'
  fi
  # What each failed test printed, for the record.
  for test in $(grep '^FAIL ' <<<"$results" | awk '{print $2}'); do
    awk -v t="$test" '
      $0 ~ /^\[ RUN      \] / { on = ($4 == t); n = 0 }
      on && n < 40 { print "    | " $0; n++ }
      /^\[  FAILED  \] / && on { on = 0 }' "$log"
  done
  echo "# $name: $(( $(date +%s) - start ))s"
  # The failing tests (the first 5), and the one a crash or time-out stopped in, under memcheck.
  culprits="$( (grep '^FAIL ' <<<"$results" | awk '{print $2}'
                [ "$rc" -ne 0 ] && [ -n "$last_run" ] && echo "$last_run") | sort -u | head -n 5 |
              paste -sd: -)"
  [ -n "$culprits" ] && memcheck "$bin" "$culprits"
done

# Training on the GPU: gpt2-small (124M GPT-2 configuration) in bf16, Tandem with standard
# and with flash attention, then PyTorch eager on the same model, batch and precision;
# tokens/s, MFU, the op table of the last steps (with each op's achieved rates), the memory
# the run was checked to need against the allocator's statistics.
train() {  # label, seconds to keep for what follows, then flags for the trainer
  local label="$1" limit
  limit="$(allow 240 "$2")"
  shift 2
  local log="$work/train-$label.log"
  if [ "$limit" -lt 20 ]; then
    echo "NOT RUN training $label (GPU_CHECK_BUDGET_S spent)"
    not_run=$((not_run + 1))
    return
  fi
  timeout "$limit" env LD_LIBRARY_PATH="$LD_LIBRARY_PATH" "$here/train/train" --model=gpt2-small \
      --device=cuda --dtype=bf16 --batch=8 --steps="$steps" --warmup=5 --synthetic \
      --profile_steps=3 "$@" >"$log" 2>&1
  local rc=$?
  # Figures (the memory estimate, to hold against the allocator's peak; the host syncs per
  # step), then the op table of the last 3 steps (each op timed by events: where the step goes).
  grep -E '^(model|memory|median|host syncs|MFU|allocator)' "$log" | sed "s/^/$label /"
  sed -n '/^op table/,/^allocator/p' "$log" | grep -v '^allocator' | sed "s/^/$label /"
  if [ "$rc" -ne 0 ]; then
    echo "FAIL training $label (exit status $rc)"
    tail -n 20 "$log" | sed 's/^/    | /'
    failed=$((failed + 1))
  fi
}
# The device's ceilings, measured in this run through PyTorch, to read the op tables' GFLOP/s
# and GB/s against: a 2 GiB device-to-device copy (bytes read plus written) and an 8192^3 bf16
# matrix product on random data; each the mean of 10 runs after 3 warm-ups.
ceilings() {
  timeout "$(allow 120 200)" python3 - >"$work/ceilings.log" 2>&1 <<'PY'
import torch

def seconds(fn, reps=10):
    for _ in range(3):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / 1e3 / reps

src = torch.randint(0, 256, (1 << 31,), dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
copy = 2 * src.numel() / seconds(lambda: dst.copy_(src))
del src, dst
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
matmul = 2 * n**3 / seconds(lambda: a @ b)
print(f"copy {copy / 1e9:.0f} GB/s (read + written), bf16 matmul {n}^3 {matmul / 1e12:.0f} TFLOP/s")
PY
  tail -n 1 "$work/ceilings.log" | sed 's/^/CEILINGS /'
}
if [ "$gpu_visible" != 1 ]; then
  echo "# training skipped: no GPU visible (nvidia-smi -L failed)"
elif [ "${GPU_CHECK_TRAIN:-1}" = 1 ] && [ -x "$here/train/train" ]; then
  steps="${GPU_CHECK_TRAIN_STEPS:-30}"
  have_torch=0
  python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null && have_torch=1
  [ "$have_torch" = 1 ] && ceilings
  echo "# training gpt2-small, bf16, batch 8 x 1024 tokens, $steps steps"
  train TANDEM 120 --attention=standard
  train TANDEM_FLASH 60 --attention=flash
  if [ "$have_torch" = 1 ] && [ "$(allow 240 0)" -lt 20 ]; then
    echo "NOT RUN PYTORCH (GPU_CHECK_BUDGET_S spent)"
    not_run=$((not_run + 1))
  elif [ "$have_torch" = 1 ]; then
    # MFU against the peak Tandem's run found for this GPU (none: unknown, no MFU).
    peak="$(sed -n 's/^MFU .* over \([0-9.]*\) TFLOP\/s.*/\1/p' "$work/train-TANDEM.log" | head -1)"
    timeout "$(allow 240 0)" python3 "$here/train/bench_pytorch.py" --device cuda --dtype bf16 \
        --n-layer 12 --d-model 768 --n-head 12 --seq-len 1024 --vocab 50304 --tie-embeddings \
        --batch 8 --steps "$steps" --peak-tflops "${peak:-0}" >"$work/train-PYTORCH.log" 2>&1
    tail -n 1 "$work/train-PYTORCH.log" | sed 's/^/PYTORCH /'
  else
    echo "PYTORCH skipped: no PyTorch with CUDA here"
  fi
fi

echo "$passed passed, $failed failed, $skipped skipped$([ "$not_run" -gt 0 ] && echo ", $not_run not run")"
[ "$failed" -eq 0 ] && [ "$not_run" -eq 0 ]
RUN
}

case "${1:-}" in
  build) build ;;
  run) exec "$out/run.sh" ;;
  *) usage ;;
esac
