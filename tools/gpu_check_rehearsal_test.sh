#!/bin/bash
# The GPU check rehearsed on this machine: the full pack (every CUDA test binary and
# examples/train, as `tools/gpu_check.sh build` packs them, from the test's data instead of a
# Bazel build; the 56 MiB check on the pack plus the project's files is build's and is not
# run here, for the sandbox holds no checkout), copied without file modes as a transfer might,
# then run.sh --out where no GPU is visible: the GPU tests skip and it exits 0, it writes at
# most 3 files (each under 10 MB) and prints under 4,000 characters, and gpu_report.py reads
# its log. Then the failure paths, with an nvidia-smi that claims a GPU the CUDA runtime
# cannot start (every test a failure, the training runs failing) and with the trainer missing:
# exit 1, the summary still under 4,000 characters and closed by its counts.
# Usage: gpu_check_rehearsal_test.sh GPU_CHECK_SH GPU_REPORT_PY
set -u
. "$(dirname "$0")/junit.sh"  # check, fail, skip; the checks as JUnit XML
gpu_check="$1"
report="$2"
runfiles="${TEST_SRCDIR:?}/${TEST_WORKSPACE:?}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
command -v python3 >/dev/null 2>&1 || skip "python3 is not installed; gpu_report.py not run"
ldd "$runfiles/runtime/cuda_ops_test" | grep -q 'libcudart\.so' ||
  skip "the binaries were built without CUDA: there is no GPU check to pack"

check "the pack is made from the built binaries"
bash "$gpu_check" pack "$runfiles" "$tmp/pack" >"$tmp/pack.txt" 2>&1 || {
  cat "$tmp/pack.txt"
  fail "gpu_check.sh pack failed"
}
cat "$tmp/pack.txt"
for f in run.sh bin/cuda_ops_test bin/cuda_runtime_test bin/cuda_train_test \
  bin/nccl_communicator_test bin/cuda_distributed_test train/train train/bench_pytorch.py \
  train/reference_loss.txt; do
  [ -f "$tmp/pack/$f" ] || fail "the pack lacks $f"
done
for f in ops_test cpu_isa_test; do
  [ -e "$tmp/pack/bin/$f" ] && fail "the CPU-only $f is in the GPU pack"
done
big="$(find "$tmp/pack/lib" -type f ! -name '*.xz' -size +1024k)"
[ -z "$big" ] && [ -n "$(find "$tmp/pack/lib" -name '*.xz')" ] ||
  fail "libraries over 1 MiB are not all compressed: $big"
# gpt2-small's step 1 on random tokens, on this CPU: near ln(50304) = 10.83 (see reference_loss
# in gpu_check.sh for why not at it).
awk '{exit !($1 > 10.8 && $1 < 11.1)}' "$tmp/pack/train/reference_loss.txt" ||
  fail "the CPU's step-1 loss $(cat "$tmp/pack/train/reference_loss.txt") is not near ln(50304)"

check "copied without file modes"
cp -r --no-preserve=mode "$tmp/pack" "$tmp/copy" || fail "cp failed"
[ -z "$(find "$tmp/copy" -type f -perm /111)" ] || fail "the copy kept some run bits"

# run_pack NAME [ENV...]: bash copy/run.sh --out $tmp/NAME, printing to $tmp/NAME.txt; its
# exit status in $rc.
run_pack() {
  local name="$1"
  shift
  env "$@" bash "$tmp/copy/run.sh" --out "$tmp/$name" >"$tmp/$name.txt" 2>&1
  rc=$?
  cat "$tmp/$name.txt"
}
# checks_out NAME: at most 3 files under $tmp/NAME, each under 10 MB; under 4,000 characters
# printed, ending in the counts.
checks_out() {
  local name="$1" n chars
  n="$(find "$tmp/$name" -mindepth 1 | wc -l)"
  [ "$n" -le 3 ] || fail "$n entries under --out (at most 3): $(ls "$tmp/$name")"
  [ -z "$(find "$tmp/$name" -type f -size +9765k)" ] || fail "a file under --out is 10 MB or more"
  chars="$(wc -c <"$tmp/$name.txt")"
  [ "$chars" -lt 4000 ] || fail "run.sh printed $chars characters (under 4,000 wanted)"
  tail -n 1 "$tmp/$name.txt" | grep -qE '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' ||
    fail "what run.sh printed does not end in its counts"
  cmp -s "$tmp/$name.txt" "$tmp/$name/summary.txt" || fail "summary.txt is not what was printed"
  echo "# $name: $n files, $chars characters printed"
}

check "run.sh --out where no GPU is visible: the GPU tests skip, exit 0"
run_pack out PATH="/usr/bin:/bin"  # no nvidia-smi: as a machine without a GPU
[ "$rc" -eq 0 ] || fail "run.sh exited $rc (0 wanted)"
checks_out out
grep -qE '^[0-9]+ passed, 0 failed, [1-9][0-9]* skipped$' "$tmp/out.txt" ||
  fail "no skipped tests, or failures, in the counts"
for b in cuda_ops_test cuda_runtime_test cuda_train_test nccl_communicator_test \
  cuda_distributed_test; do
  grep -qE "^$b: [0-9]+ passed, 0 failed, [0-9]+ skipped \([0-9]+s\)$" "$tmp/out.txt" ||
    fail "no line of counts for $b"
  tar -tJf "$tmp/out/logs.tar.xz" | grep -qx "logs/$b.log" || fail "the archive lacks $b.log"
done
grep -q '^# training skipped: no GPU visible' "$tmp/out.txt" || fail "training not said skipped"

check "gpu_report.py reads run.sh's log"
python3 "$report" "$tmp/out/gpu_check.log" --commit abc1234 --date 2026-12-04 \
  >"$tmp/section.md" || fail "gpu_report.py failed on the log"
grep -qE '^Tests: [0-9]+ passed, 0 failed, [0-9]+ skipped\.$' "$tmp/section.md" ||
  fail "the section lacks the tests' counts: $(head -n 6 "$tmp/section.md")"
grep -qE '^- cuda_ops_test: 0 passed, 0 failed, [0-9]+ skipped' "$tmp/section.md" ||
  fail "the section lacks cuda_ops_test's counts"

check "a GPU the CUDA runtime cannot start: every test and run fails, the summary stays short"
mkdir -p "$tmp/fakebin"
cat >"$tmp/fakebin/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in
  *query-gpu*) echo "0, NVIDIA H200, 580.159.04, 143771 MiB" ;;
  *) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000)" ;;
esac
EOF
chmod +x "$tmp/fakebin/nvidia-smi"
# No memcheck reruns (GPU_CHECK_MEMCHECK_S=0): without a driver they would only fail slowly.
run_pack fake PATH="$tmp/fakebin:/usr/bin:/bin" GPU_CHECK_MEMCHECK_S=0
[ "$rc" -eq 1 ] || fail "run.sh exited $rc (1 wanted)"
checks_out fake
grep -qE '^[0-9]+ passed, [1-9][0-9]* failed, 0 skipped$' "$tmp/fake.txt" ||
  fail "the skips on a machine with a GPU are not failures"
grep -q '^FAIL training TANDEM ' "$tmp/fake.txt" || fail "the failed training run not quoted"
grep -q '^FAIL training TANDEM_F16 ' "$tmp/fake/gpu_check.log" || fail "the f16 run not in the log"
n="$(grep -c '^FAIL ' "$tmp/fake/gpu_check.log")"
[ "$n" -gt 100 ] || fail "$n failures in the whole log (every test's wanted)"
python3 "$report" "$tmp/fake/gpu_check.log" --commit abc1234 >/dev/null ||
  fail "gpu_report.py failed on the log of failures"

check "the trainer missing: FAIL with the reason"
rm "$tmp/copy/train/train"
run_pack notrain PATH="/usr/bin:/bin" GPU_CHECK_FILTER=CudaRuntimeTest.*
[ "$rc" -eq 1 ] || fail "run.sh exited $rc without its trainer (1 wanted)"
checks_out notrain
grep -q '^FAIL training (train/train is missing' "$tmp/notrain.txt" ||
  fail "the missing trainer is not a failure"
echo "PASSED: gpu_check rehearsal"
