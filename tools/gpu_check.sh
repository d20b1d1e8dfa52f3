#!/usr/bin/env bash
# Checks Tandem's CUDA backend on a GPU machine that has no Bazel and no network.
#   tools/gpu_check.sh build   builds the CUDA test binaries and examples/train here and packs
#                              them into dist/gpu_check/ (see pack); fails, naming the largest
#                              files, when the pack and the project's files (tracked, and
#                              untracked but not ignored) come to more than 56 MiB
#                              (GPU_CHECK_LIMIT_MIB), so that they travel together under 64 MiB.
#   tools/gpu_check.sh pack FROM OUT
#                              packs the binaries found under FROM (a bazel-bin folder or a
#                              runfiles tree) into OUT, without Bazel: bin/ (the test
#                              binaries), lib/ (the shared libraries they load that a GPU
#                              machine with CUDA 13 in /usr/local/cuda lacks: Debian's absl,
#                              OpenBLAS, ...; Bazel's solib .so files; every one over 1 MiB
#                              xz-compressed), train/ (examples/train, the PyTorch peer script,
#                              and gpt2-small's first loss on this CPU) and run.sh.
#   tools/gpu_check.sh run [--out DIR]
#                              runs dist/gpu_check/run.sh (here the GPU tests skip).
#   bash dist/gpu_check/run.sh --out DIR
#                              on the GPU machine (see the head of run.sh): a short summary
#                              printed, the whole log and every test's log written into DIR.
# The CUDA toolkit's and the driver's libraries (cudart, cuBLAS, NCCL, cuDNN, libcuda) are
# never packed: run.sh finds them in /usr/local/cuda/lib64 and in PyTorch's nvidia/*/lib.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dist="$root/dist/gpu_check"
# The binaries that need a GPU: the CPU-only tests (ops_test, cpu_isa_test) run in CI, not in
# the GPU machine's few minutes.
targets=(//runtime:cuda_ops_test //runtime:cuda_runtime_test //model:cuda_train_test
         //comm:nccl_communicator_test //parallel:cuda_distributed_test)
# Libraries above this size are stored xz-compressed and unpacked by run.sh.
compress_above_bytes=$((1 << 20))
limit_mib="${GPU_CHECK_LIMIT_MIB:-56}"

usage() {
  sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
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
  local name="$1" path="$2" out="$3"
  if [ -e "$out/lib/$name" ] || [ -e "$out/lib/$name.xz" ]; then
    return 0
  fi
  cp -L "$path" "$out/lib/$name"
  chmod u+w "$out/lib/$name"
  # Bazel's own libraries carry debug info (-g1); the GPU run does not need it.
  case "$path" in */_solib_*) strip --strip-debug "$out/lib/$name" ;; esac
  if [ "$(stat -c %s "$out/lib/$name")" -gt "$compress_above_bytes" ]; then
    xz -6 -T0 "$out/lib/$name"  # leaves $name.xz
  fi
}

# Packs the shared libraries `ldd` lists for the binary $1 into $2/lib, but for those
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
    pack_library "$lib" "$path" "$2"
  done < <(ldd "$1")
}

pack_binary() {  # SOURCE DEST
  cp -L "$1" "$2"
  chmod u+w "$2"
  strip --strip-debug "$2"
}

# pack FROM OUT: the binaries under FROM (FROM/runtime/cuda_ops_test, ..., FROM/examples/train)
# and what they load into OUT, with run.sh.
pack() {
  local from="$1" out="$2"
  if [ ! -e "$from/runtime/cuda_ops_test" ]; then
    echo "gpu_check: no runtime/cuda_ops_test under $from" >&2
    exit 1
  fi
  if ! ldd "$from/runtime/cuda_ops_test" | grep -q 'libcudart\.so'; then
    echo "gpu_check: the test binaries were built without CUDA (is CUDA_PATH set to a" \
         "toolkit without nvcc?); nothing to check on a GPU" >&2
    exit 1
  fi
  rm -rf "$out"
  mkdir -p "$out/bin" "$out/lib" "$out/train"
  local target name pkg missing=""
  for target in "${targets[@]}"; do
    name="${target##*:}"
    pkg="${target#//}"
    pkg="${pkg%%:*}"
    pack_binary "$from/$pkg/$name" "$out/bin/$name"
    pack_libraries_of "$from/$pkg/$name" "$out"
  done
  # The training check: the example trainer and the PyTorch peer script.
  pack_binary "$from/examples/train" "$out/train/train"
  pack_libraries_of "$from/examples/train" "$out"
  if [ -n "$missing" ]; then
    echo "gpu_check: libraries the binaries need are missing here:$missing" >&2
    exit 1
  fi
  cp "$root/tools/bench_pytorch.py" "$out/train/"
  reference_loss "$from/examples/train" >"$out/train/reference_loss.txt"
  write_run_script >"$out/run.sh"
  chmod +x "$out/run.sh"
  echo "gpu_check: packed $(ls "$out/bin" | wc -l) test binaries, examples/train and" \
       "$(ls "$out/lib" | wc -l) libraries ($(ls "$out/lib" | grep -c '\.xz$') xz-compressed)" \
       "into $out ($(find "$out" -type f -printf '%s\n' | awk '{s += $1} END {printf "%.1f", s / 1048576}') MiB)"
}

# gpt2-small's step-1 loss on random tokens, computed here on the CPU in f32 with the GPU
# runs' seed and data (one sample of their batch of 8: the mean over 1024 tokens moves by
# about 0.02 between samples). On random tokens the loss starts near ln(50304) = 10.83, but
# not at it: the output layer's logits start with a spread (0.02 x sqrt(768) = 0.55), which
# puts the first loss about 0.1 higher (10.94 measured), so run.sh holds the GPU's step 1
# against this figure, not against ln(vocabulary) alone.
reference_loss() {
  local log loss
  log="$(OMP_NUM_THREADS=2 "$1" --model=gpt2-small --device=cpu --dtype=f32 --batch=1 \
    --steps=1 --warmup=5 --synthetic 2>&1)" || {
    echo "gpu_check: examples/train failed on the CPU:" >&2
    tail -n 5 <<<"$log" >&2
    exit 1
  }
  loss="$(awk '$1 == "step" && $2 ~ /^1\// && $3 == "loss" {print $4; exit}' <<<"$log")"
  if [ -z "$loss" ]; then
    echo "gpu_check: examples/train printed no step-1 loss" >&2
    exit 1
  fi
  echo "$loss"
}

# Fails, naming the 10 largest files, when the pack and the project's files (what travels with
# it) exceed $limit_mib.
check_size() {
  local out="$1" listing
  listing="$(find "$out" -type f -printf '%s %p\n' | sed "s# $root/# #")"
  if git -C "$root" rev-parse --show-toplevel >/dev/null 2>&1 &&
     [ "$(git -C "$root" rev-parse --show-toplevel)" = "$root" ]; then
    listing="$listing
$(cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 -r stat -L -c '%s %n' 2>/dev/null)"
  fi
  local total
  total="$(awk '{s += $1} END {printf "%d", s}' <<<"$listing")"
  echo "gpu_check: the pack and the project's files come to $((total >> 20)) MiB" \
       "(limit ${limit_mib} MiB)"
  if [ "$total" -gt $((limit_mib << 20)) ]; then
    echo "gpu_check: over ${limit_mib} MiB; the largest files:" >&2
    sort -rn <<<"$listing" | head -n 10 | awk '{printf "  %6.1f MiB  %s\n", $1 / 1048576, $2}' >&2
    exit 1
  fi
}

build() {
  cd "$root"
  bazel build "${targets[@]}" //examples:train
  local bin_dir
  bin_dir="$(bazel info bazel-bin 2>/dev/null)"
  pack "$bin_dir" "$dist"
  check_size "$dist"
}

write_run_script() {
  cat <<'RUN'
#!/usr/bin/env bash
# Runs Tandem's CUDA test binaries and gpt2-small training (packed by tools/gpu_check.sh) on a
# GPU machine with CUDA 13 in /usr/local/cuda; no Bazel, no network.
#   bash run.sh [--out DIR]
# Prints a short summary (under 4,000 characters): the GPU, one line per binary with its
# passed, failed and skipped tests, the first lines of the first failures, the training
# figures, and "N passed, N failed, N skipped". Writes into DIR (default: results/ beside
# run.sh) at most three files: gpu_check.log (the whole log, what tools/gpu_report.py reads),
# summary.txt (what was printed) and logs.tar.xz (logs.tar.gz without xz: every binary's,
# memcheck's and training run's own output). Exit status 1 when a test failed, a binary
# crashed, timed out or could not start, a training check failed, or a step was not run.
# Environment (times in seconds; the shares' defaults scale with the budget):
#   GPU_CHECK_BUDGET_S    the whole run, default 330: each step's limit shrinks to what is left,
#                         keeping the later phases' shares, and a step with no time left is
#                         reported "NOT RUN", so the closing line is always printed
#   GPU_CHECK_TIMEOUT_S   per test binary, default 30% of the budget
#   GPU_CHECK_TRAIN_S     kept for training (ceilings, Tandem's runs, PyTorch), default 35%
#   GPU_CHECK_MEMCHECK_S  for compute-sanitizer memcheck reruns of failing tests, default 10%
#                         (0: none)
#   GPU_CHECK_FILTER      a --gtest_filter for every binary
#   GPU_CHECK_TRAIN=0     no training; GPU_CHECK_TRAIN_STEPS steps per run (default 30)
# Tandem's binaries run with the packed libraries on LD_LIBRARY_PATH (set for them alone),
# NCCL_SOCKET_IFNAME=lo (one GPU, loopback) and no proxy variables (the gRPC coordinator is
# on loopback); python3 and PyTorch run with the environment run.sh was given.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
start_time=$(date +%s)
out_dir="$here/results"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out_dir="${2:?--out needs a folder}"; shift 2 ;;
    --out=*) out_dir="${1#--out=}"; shift ;;
    -h | --help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (usage: run.sh [--out DIR])" >&2; exit 2 ;;
  esac
done
mkdir -p "$out_dir" || exit 2
out_dir="$(cd "$out_dir" && pwd)"
full_log="$out_dir/gpu_check.log"
summary="$out_dir/summary.txt"
rm -f "$out_dir/logs.tar.xz" "$out_dir/logs.tar.gz"
archive="$out_dir/logs.tar.gz"
command -v xz >/dev/null 2>&1 && archive="$out_dir/logs.tar.xz"
: >"$full_log"
: >"$summary"

# log LINE...: the whole log only. say LINE...: the whole log and the summary, which stops
# (but for the closing lines) at summary_cap characters.
summary_cap=3400
summary_chars=0
summary_cut=0
log() { printf '%s\n' "$@" >>"$full_log"; }
brief() {
  local line
  for line in "$@"; do
    line="${line:0:200}"
    if [ $((summary_chars + ${#line} + 1)) -gt "$summary_cap" ]; then
      [ "$summary_cut" = 0 ] && printf '%s\n' "... (summary cut; all of it in gpu_check.log)" |
        tee -a "$summary"
      summary_cut=1
      return
    fi
    summary_chars=$((summary_chars + ${#line} + 1))
    printf '%s\n' "$line" | tee -a "$summary"
  done
}
say() { log "$@"; brief "$@"; }

work="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
mkdir -p "$work/lib" "$work/tmp" "$work/bin" "$work/logs"
# At exit: every log in one archive under $out_dir (each cut to its first and last MiB where
# longer than 2 MiB, tighter if the archive would still pass 9 MB), then the work folder goes.
archive_logs() {
  local keep_kib=1024 f
  while :; do
    rm -rf "$work/archive" && mkdir -p "$work/archive/logs"
    for f in "$work"/logs/*; do
      [ -f "$f" ] || continue
      if [ "$(stat -c %s "$f")" -gt $((2 * keep_kib * 1024)) ]; then
        { head -c $((keep_kib * 1024)) "$f"
          printf '\n[... cut by run.sh: %s bytes in all ...]\n' "$(stat -c %s "$f")"
          tail -c $((keep_kib * 1024)) "$f"; } >"$work/archive/logs/$(basename "$f")"
      else
        cp "$f" "$work/archive/logs/"
      fi
    done
    case "$archive" in
      *.xz) tar -C "$work/archive" -cJf "$archive" logs ;;
      *) tar -C "$work/archive" -czf "$archive" logs ;;
    esac
    [ "$(stat -c %s "$archive")" -le 9000000 ] || [ "$keep_kib" -le 16 ] && break
    keep_kib=$((keep_kib / 8))
  done
  rm -rf "$work"
}
trap archive_logs EXIT

budget="${GPU_CHECK_BUDGET_S:-330}"
deadline=$((start_time + budget))
timeout_s="${GPU_CHECK_TIMEOUT_S:-$((budget * 30 / 100))}"
train_s="${GPU_CHECK_TRAIN_S:-$((budget * 35 / 100))}"
memcheck_left="${GPU_CHECK_MEMCHECK_S:-$((budget * 10 / 100))}"
left() { local l=$((deadline - $(date +%s))); echo $((l < 0 ? 0 : l)); }
# allow MOST KEEP: the seconds a step may take, at most MOST, leaving KEEP seconds of the
# budget for the steps after it (0: no time left).
allow() {
  local l=$(($(left) - $2))
  [ "$l" -lt 0 ] && l=0
  echo $((l < $1 ? l : $1))
}
passed=0
failed=0
skipped=0
not_run=0
failures_told=0  # failures whose first lines the summary quotes (the first 5)

# The large libraries travel compressed.
for xz_file in "$here"/lib/*.xz; do
  [ -e "$xz_file" ] || continue
  dest="$work/lib/$(basename "${xz_file%.xz}")"
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$xz_file" >"$dest"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$xz_file" "$dest"
  fi || say "FAIL unpacking $(basename "$xz_file")"
done

# A transfer may drop file modes: each binary made executable, copied where the pack is
# read-only.
runnable() {  # PATH -> the path of an executable copy ("" when it is missing)
  [ -f "$1" ] || return 0
  if [ -x "$1" ] || chmod u+x "$1" 2>/dev/null; then
    echo "$1"
  else
    cp "$1" "$work/bin/" && chmod u+x "$work/bin/$(basename "$1")" && echo "$work/bin/$(basename "$1")"
  fi
}

# Ours first, then CUDA's, then the CUDA libraries of an installed PyTorch (NCCL lives there).
lib_path="$here/lib:$work/lib"
[ -d /usr/local/cuda/lib64 ] && lib_path="$lib_path:/usr/local/cuda/lib64"
torch_libs="$(timeout 60 python3 -c '
import glob, os
try:
    import nvidia
except Exception:
    raise SystemExit(0)
print(":".join(d for base in getattr(nvidia, "__path__", [])
               for d in sorted(glob.glob(os.path.join(base, "*", "lib")))))
' 2>/dev/null || true)"
[ -n "$torch_libs" ] && lib_path="$lib_path:$torch_libs"
# How Tandem's binaries run (and they alone): the packed libraries, one GPU's NCCL on
# loopback, and no proxy between the workers and the loopback coordinator.
tandem_env=(env -u http_proxy -u https_proxy -u HTTP_PROXY -u HTTPS_PROXY -u all_proxy
            -u ALL_PROXY -u no_proxy -u NO_PROXY -u grpc_proxy -u GRPC_PROXY
            "LD_LIBRARY_PATH=$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            "NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}" "NCCL_DEBUG=${NCCL_DEBUG:-WARN}"
            "TEST_TMPDIR=$work/tmp")

if command -v nvidia-smi >/dev/null 2>&1; then
  say "$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader \
    2>/dev/null | sed 's/^/gpu: /')"
else
  say "gpu: nvidia-smi not found"
fi
# Where a GPU is visible, a test skipping for want of one is a failure (CUDA did not start
# in the process: a missing libcuda, a driver mismatch), not a pass.
gpu_visible=0
nvidia-smi -L >/dev/null 2>&1 && gpu_visible=1
for bin in "$here"/bin/*; do
  nccl="$("${tandem_env[@]}" ldd "$bin" 2>/dev/null | awk '$1 ~ /^libnccl\.so/ {print $3; exit}')"
  if [ -n "$nccl" ]; then
    say "nccl: $nccl"
    break
  fi
done
say "# budget ${budget}s: per binary ${timeout_s}s, training ${train_s}s, memcheck ${memcheck_left}s"

sanitizer="$(command -v compute-sanitizer || true)"
if [ -z "$sanitizer" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  sanitizer=/usr/local/cuda/bin/compute-sanitizer
fi
# What the tests keep of the budget for the training runs.
train_keep=0
[ "$gpu_visible" = 1 ] && [ "${GPU_CHECK_TRAIN:-1}" = 1 ] && train_keep="$train_s"
# memcheck BINARY FILTER: the tests FILTER names under memcheck, within what is left of its
# share and of the budget; what it found, quoted.
memcheck() {
  local bin="$1" filter="$2" limit begin rc
  limit="$(allow "$memcheck_left" "$train_keep")"
  [ -n "$sanitizer" ] && [ "$gpu_visible" = 1 ] && [ "$limit" -ge 10 ] || return 0
  local mlog="$work/logs/$(basename "$bin").memcheck.log"
  begin=$(date +%s)
  (cd "$work" && timeout --kill-after=5 "$limit" "${tandem_env[@]}" "$sanitizer" --tool memcheck \
    --print-limit 10 "$bin" --gtest_filter="$filter") >"$mlog" 2>&1
  rc=$?
  memcheck_left=$((memcheck_left - ($(date +%s) - begin)))
  say "MEMCHECK $(basename "$bin") $filter: $(grep -m1 -oE 'ERROR SUMMARY: .*' "$mlog" ||
    echo "no summary (exit status $rc, ${limit}s allowed)")"
  mapfile -t found < <(grep -E '^========= +(Invalid|Program hit|Address|at |by thread|Saved host|Host Frame|Misaligned|Out of bounds)' \
    "$mlog" | head -n 30 | sed 's/^/    | /')
  [ "${#found[@]}" -gt 0 ] && log "${found[@]}" && brief "${found[@]:0:3}"
}

# fail_lines WHAT LINE...: a failure's lines, all in the log; the first 3 in the summary for
# the first 5 failures of the tests and of the training runs.
fail_lines() {
  local what="$1"
  shift
  log "$what" "$@"
  if [ "$failures_told" -lt 5 ]; then
    brief "$what" "${@:1:3}"
  fi
  failures_told=$((failures_told + 1))
}

for packed in "$here"/bin/*; do
  name="$(basename "$packed")"
  blog="$work/logs/$name.log"
  bin="$(runnable "$packed")"
  if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    say "FAIL $name (cannot be made executable)"
    failed=$((failed + 1))
    continue
  fi
  missing="$("${tandem_env[@]}" ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')"
  if [ -n "$missing" ]; then
    say "FAIL $name (shared libraries not found: $missing)"
    failed=$((failed + 1))
    continue
  fi
  filter=()
  [ -n "${GPU_CHECK_FILTER:-}" ] && filter=("--gtest_filter=$GPU_CHECK_FILTER")
  limit="$(allow "$timeout_s" $((train_keep + memcheck_left)))"
  if [ "$limit" -lt 10 ]; then
    say "NOT RUN $name (GPU_CHECK_BUDGET_S spent)"
    not_run=$((not_run + 1))
    continue
  fi
  begin=$(date +%s)
  (cd "$work" && timeout --kill-after=10 "$limit" "${tandem_env[@]}" "$bin" \
    ${filter[@]+"${filter[@]}"}) >"$blog" 2>&1
  rc=$?
  # "[       OK ] Suite.Test (12 ms)", "[  FAILED  ] Suite.Test/bf16, where GetParam() = ... (3 ms)"
  # and "[  SKIPPED ] Suite.Test (0 ms)"; the summary's repeats carry no time and are left out.
  results="$(awk '
    /^\[ *(OK|FAILED|SKIPPED) *\] .* \([0-9]+ ms\)$/ {
      status = $0; sub(/^\[ */, "", status); sub(/ *\].*$/, "", status)
      test = $0; sub(/^\[[^]]*\] /, "", test); sub(/[ ,].*$/, "", test)
      print (status == "OK" ? "PASS" : status == "FAILED" ? "FAIL" : "SKIP"), test
    }' "$blog")"
  if [ "$gpu_visible" = 1 ] && grep -qE 'no CUDA device|no GPU visible' "$blog"; then
    say "# $name: tests skipped on a machine with a GPU: $(grep -m1 -oE '(no CUDA device|no GPU visible).*' "$blog")"
    results="$(sed 's/^SKIP /FAIL /' <<<"$results")"
  fi
  n_pass=0 n_fail=0 n_skip=0
  if [ -n "$results" ]; then
    # Passes and skips here; each failure below, with what it printed.
    grep -v '^FAIL ' <<<"$results" >>"$full_log"
    n_pass=$(grep -c '^PASS ' <<<"$results")
    n_skip=$(grep -c '^SKIP ' <<<"$results")
    n_fail=$(grep -c '^FAIL ' <<<"$results")
  fi
  # What each failed test printed (its first 40 lines), for the record.
  for test in $(grep '^FAIL ' <<<"$results" | awk '{print $2}'); do
    mapfile -t lines < <(awk -v t="$test" '
      $0 ~ /^\[ RUN      \] / { on = ($4 == t); n = 0; next }
      /^\[ *(OK|FAILED|SKIPPED) *\] / && on { on = 0 }
      on && n < 40 && NF > 0 { print "    | " $0; n++ }' "$blog")
    fail_lines "FAIL $test" ${lines[@]+"${lines[@]}"}
  done
  # A test that started but never reported: the binary crashed or timed out inside it.
  last_run="$(awk '/^\[ RUN      \] / {t = $4}
                   /^\[ *(OK|FAILED|SKIPPED) *\] .* \([0-9]+ ms\)$/ {t = ""}
                   END {print t}' "$blog")"
  if [ "$rc" -ne 0 ] && { [ -n "$last_run" ] || [ "$n_fail" -eq 0 ]; }; then
    why="exit status $rc"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      why="timed out after ${limit}s"
    fi
    n_fail=$((n_fail + 1))
    mapfile -t lines < <(tail -n 30 "$blog" | sed 's/^/    | /')
    fail_lines "FAIL ${last_run:-$name} ($name: $why)" ${lines[@]+"${lines[@]}"}
  fi
  passed=$((passed + n_pass))
  failed=$((failed + n_fail))
  skipped=$((skipped + n_skip))
  say "$name: $n_pass passed, $n_fail failed, $n_skip skipped ($(( $(date +%s) - begin ))s)"
  # The failing tests (the first 5), and the one a crash or time-out stopped in, under memcheck.
  culprits="$( (grep '^FAIL ' <<<"$results" | awk '{print $2}'
                [ "$rc" -ne 0 ] && [ -n "$last_run" ] && echo "$last_run") | sort -u | head -n 5 |
              paste -sd: -)"
  [ -n "$culprits" ] && memcheck "$bin" "$culprits"
done

# Training on the GPU: gpt2-small (124M GPT-2 configuration), Tandem in bf16 with standard and
# with flash attention and in f16 (loss scaling), then PyTorch eager on the same model, batch
# and precision; tokens/s, MFU, the op table of the last steps (with each op's achieved
# rates), the memory the run was checked to need against the allocator's statistics, and the
# first losses, checked: step 1 against this CPU's (train/reference_loss.txt, packed by
# tools/gpu_check.sh) within 0.1, and flash against standard attention within 0.02.
train_bin=""
declare -A first_loss
# near A B TOL: true when A and B are numbers (not nan or inf) within TOL of each other.
near() {
  [[ "$1" =~ ^-?[0-9]+(\.[0-9]+)?$ && "$2" =~ ^-?[0-9]+(\.[0-9]+)?$ ]] &&
    awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN {d = a - b; exit !(d <= t && d >= -t)}'
}
# train LABEL KEEP_PCT FLAGS...: a Tandem run, keeping KEEP_PCT of the training time for the
# runs after it.
train() {
  local label="$1" limit
  limit="$(allow 100000 $((train_left * $2 / 100)))"
  shift 2
  local tlog="$work/logs/train-$label.log"
  if [ "$limit" -lt 20 ]; then
    say "NOT RUN training $label (GPU_CHECK_BUDGET_S spent)"
    not_run=$((not_run + 1))
    return
  fi
  timeout --kill-after=10 "$limit" "${tandem_env[@]}" "$train_bin" --model=gpt2-small \
      --device=cuda --batch=8 --steps="$steps" --warmup=5 --synthetic --profile_steps=3 "$@" \
      >"$tlog" 2>&1
  local rc=$?
  # Figures (the memory estimate, to hold against the allocator's peak; the host syncs per
  # step), then the op table of the last 3 steps (each op timed by events: where the step goes).
  mapfile -t lines < <(grep -E '^(median|host syncs|MFU)' "$tlog" | sed "s/^/$label /")
  [ "${#lines[@]}" -gt 0 ] && say "${lines[@]}"
  mapfile -t lines < <(grep -E '^(model|memory|allocator)' "$tlog"
                       sed -n '/^op table/,/^allocator/p' "$tlog" | grep -v '^allocator')
  [ "${#lines[@]}" -gt 0 ] && log "${lines[@]/#/$label }"
  local vocab losses loss1 ln_v
  vocab="$(sed -n 's/^model .* vocab \([0-9]*\).*/\1/p' "$tlog" | head -n 1)"
  losses="$(awk '$1 == "step" && $3 == "loss" && n < 5 {printf "%s%s", (n ? " " : ""), $4; n++}' "$tlog")"
  loss1="${losses%% *}"
  if [ -n "$losses" ]; then
    ln_v="$(awk -v v="${vocab:-0}" 'BEGIN {if (v > 0) printf "%.4f", log(v); else print "?"}')"
    say "$label losses $losses (steps 1-5; CPU step 1 ${reference:-?}, ln($vocab) $ln_v)"
    first_loss[$label]="$loss1"
  fi
  case " $* " in
    *" --dtype=f16 "*)
      [ -n "$losses" ] &&
        say "$label loss scaler skipped $(grep -c '^step .*(skipped)$' "$tlog") of $(grep -c '^step ' "$tlog") steps" ;;
  esac
  if [ "$rc" -ne 0 ]; then
    local why="exit status $rc"
    { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && why="timed out after ${limit}s"
    mapfile -t lines < <(tail -n 20 "$tlog" | sed 's/^/    | /')
    fail_lines "FAIL training $label ($why)" ${lines[@]+"${lines[@]}"}
    failed=$((failed + 1))
  elif [ -z "$loss1" ]; then
    fail_lines "FAIL training $label (no step-1 loss printed)"
    failed=$((failed + 1))
  elif ! near "$loss1" "$reference" 0.1; then
    fail_lines "FAIL training $label (step 1's loss $loss1 is not within 0.1 of the CPU's $reference on the same random tokens; ln($vocab) = $ln_v)"
    failed=$((failed + 1))
  fi
}
# The device's ceilings, measured in this run through PyTorch, to read the op tables' GFLOP/s
# and GB/s against: a 2 GiB device-to-device copy (bytes read plus written) and an 8192^3 bf16
# matrix product on random data; each the mean of 10 runs after 3 warm-ups.
ceilings() {
  timeout "$1" python3 - >"$work/logs/ceilings.log" 2>&1 <<'PY'
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
  say "$(tail -n 1 "$work/logs/ceilings.log" | sed 's/^/CEILINGS /')"
}
if [ "${GPU_CHECK_TRAIN:-1}" = 1 ]; then
  # The trainer is checked to start (present, executable, its libraries found) on every
  # machine; it trains where a GPU is visible.
  train_bin="$(runnable "$here/train/train")"
  reference="$(head -n 1 "$here/train/reference_loss.txt" 2>/dev/null)"
  train_missing=""
  [ -n "$train_bin" ] && [ -x "$train_bin" ] &&
    train_missing="$("${tandem_env[@]}" ldd "$train_bin" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')"
  if [ -z "$train_bin" ] || [ ! -x "$train_bin" ]; then
    say "FAIL training (train/train is missing or cannot be made executable)"
    failed=$((failed + 1))
  elif [ -n "$train_missing" ]; then
    say "FAIL training (train/train: shared libraries not found: $train_missing)"
    failed=$((failed + 1))
  elif [ -z "$reference" ]; then
    say "FAIL training (train/reference_loss.txt, the CPU's step-1 loss, is missing)"
    failed=$((failed + 1))
  elif [ "$gpu_visible" != 1 ]; then
    say "# training skipped: no GPU visible (nvidia-smi -L failed)"
  else
    steps="${GPU_CHECK_TRAIN_STEPS:-30}"
    failures_told=0  # the training runs' first failures quoted too, after the tests' 5
    train_left="$(left)"
    have_torch=0
    timeout 60 python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null &&
      have_torch=1
    [ "$have_torch" = 1 ] && ceilings "$(allow $((train_left * 15 / 100)) $((train_left * 80 / 100)))"
    train_left="$(left)"
    say "# training gpt2-small, batch 8 x 1024 tokens, $steps steps; $(left)s left"
    train TANDEM 70 --dtype=bf16 --attention=standard
    train TANDEM_FLASH 45 --dtype=bf16 --attention=flash
    if [ -n "${first_loss[TANDEM]:-}" ] && [ -n "${first_loss[TANDEM_FLASH]:-}" ]; then
      if ! near "${first_loss[TANDEM]}" "${first_loss[TANDEM_FLASH]}" 0.02; then
        fail_lines "FAIL training TANDEM_FLASH (step 1's loss ${first_loss[TANDEM_FLASH]} differs from standard attention's ${first_loss[TANDEM]} by more than 0.02: same seed, same data)"
        failed=$((failed + 1))
      else
        say "# flash and standard attention agree at step 1 within 0.02 (${first_loss[TANDEM_FLASH]}, ${first_loss[TANDEM]})"
      fi
    fi
    train TANDEM_F16 25 --dtype=f16 --attention=standard
    if [ "$have_torch" = 1 ] && [ "$(allow 600 0)" -lt 20 ]; then
      say "NOT RUN PYTORCH (GPU_CHECK_BUDGET_S spent)"
      not_run=$((not_run + 1))
    elif [ "$have_torch" = 1 ]; then
      # MFU against the peak Tandem's run found for this GPU (none: unknown, no MFU).
      peak="$(sed -n 's/^MFU .* over \([0-9.]*\) TFLOP\/s.*/\1/p' "$work/logs/train-TANDEM.log" 2>/dev/null | head -1)"
      timeout --kill-after=10 "$(allow 600 0)" python3 "$here/train/bench_pytorch.py" --device cuda \
          --dtype bf16 --n-layer 12 --d-model 768 --n-head 12 --seq-len 1024 --vocab 50304 \
          --tie-embeddings --batch 8 --steps "$steps" --peak-tflops "${peak:-0}" \
          >"$work/logs/train-PYTORCH.log" 2>&1
      say "$(tail -n 1 "$work/logs/train-PYTORCH.log" | sed 's/^/PYTORCH /')"
    else
      say "PYTORCH skipped: no PyTorch with CUDA here"
    fi
  fi
fi

log "# run.sh took $(( $(date +%s) - start_time ))s of its ${budget}s"
closing="$passed passed, $failed failed, $skipped skipped$([ "$not_run" -gt 0 ] && echo ", $not_run not run")"
log "$closing"
summary_cap=4000
brief "# the whole log: $full_log; each binary's and run's own: $archive" "$closing"
[ "$failed" -eq 0 ] && [ "$not_run" -eq 0 ]
RUN
}

case "${1:-}" in
  build) build ;;
  pack)
    [ $# -eq 3 ] || usage
    pack "$(cd "$2" && pwd)" "$3" ;;
  run) shift; exec bash "$dist/run.sh" "$@" ;;
  *) usage ;;
esac
