#!/bin/bash
# tools/gpu_report.py on a gpu_check log written by hand (tests/data/gpu_check_sample.log):
# the figures and ratios worked out from its numbers, the GPU section of a BENCHMARKS.md
# replaced in place with the rest untouched, a measured section kept by bench_report.py, and a
# log with no results refused. Usage: gpu_report_test.sh GPU_REPORT SAMPLE_LOG
set -u
. "$(dirname "$0")/junit.sh"  # check, fail, skip; the checks as JUnit XML
command -v python3 >/dev/null 2>&1 || skip "python3 is not installed; gpu_report.py not run"
report="$1"
sample="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

expect() {  # FILE TEXT
  grep -qF -- "$2" "$1" || fail "$1 lacks: $2"
}

check "the GPU section's figures and ratios from the sample log"
python3 "$report" "$sample" --commit abc1234 --date 2026-12-01 >"$tmp/section.md" ||
  fail "gpu_report.py failed on the sample"
cat "$tmp/section.md"
s="$tmp/section.md"
expect "$s" "Measured 2026-12-01 on one NVIDIA H200 (driver 580.159.04, 143771 MiB), commit abc1234"
expect "$s" "Tests: 1 passed, 1 failed, 0 skipped, 1 not run."
expect "$s" "- failed: Floats/CudaOpsDTypeTest.LayerNorm/bf16"
expect "$s" "- not run: ops_test (GPU_CHECK_BUDGET_S spent)"
expect "$s" "copy 4300 GB/s (read + written), bf16 matmul 8192^3 788 TFLOP/s"
# 204800 / 240000 = 0.853; 256000 / 240000 = 1.067; PyTorch's step 0.034133 s = 34.13 ms.
expect "$s" "| Tandem, standard attention | 40.00 | 204,800 | 15.4% | 1 | 0.85 |"
expect "$s" "| Tandem, flash attention | 32.00 | 256,000 | 19.2% | 1 | 1.07 |"
expect "$s" "| PyTorch eager (pytorch 2.11.0+cu130, SDPA attention) | 34.13 | 240,000 | 18.0% | - | 1.00 |"
# 5300000000 B = 4.94 GiB; 3100000000 B = 2.89 GiB.
expect "$s" "checked to need at least 5.1 GB (model state 2.0 GB, activations 2.9 GB, temporaries 202 MB); the allocator's peak was 4.9 GB."
expect "$s" "the allocator's peak was 2.9 GB."
expect "$s" "LinearBackward                  147       60.00"
expect "$s" "tokens/s over the GPU's peak (989 TFLOP/s, the dense bf16 peak of the H200 SXM)"
expect "$s" "with the faster Tandem run (Tandem, flash attention): MFU 19.2% (not met), 1.07x PyTorch (met)."
# Each binary's counts; the first losses; f16's row (215579 / 240000 = 0.898) and its skipped
# steps, and f16 not taken as the faster run though it is faster than standard attention.
expect "$s" "- cuda_ops_test: 1 passed, 1 failed, 0 skipped (41s)"
expect "$s" "- Tandem, standard attention: first losses 10.9402, 10.8215, 10.5133, 10.1120, 9.7015 (steps 1-5; CPU step 1 10.9266, ln(50304) 10.8258)."
expect "$s" "- Tandem, flash attention: first losses 10.9398, 10.8211"
expect "$s" "| Tandem, f16 with loss scaling, standard attention | 38.00 | 215,579 | - | - | 0.90 |"
expect "$s" "- Tandem, f16 with loss scaling, standard attention: the loss scaler skipped 2 of 30 steps."
[ "$(grep -c '^- failed: ' "$s")" -eq 1 ] || fail "not one failure in the section"

# In place: the GPU section between two others replaced, the rest byte for byte.
check "--into replaces the GPU section in place, the rest byte for byte"
doc="$tmp/BENCHMARKS.md"
printf '# Benchmarks\n\n## CPU\n\nfigures\n\n## GPU\n\nNot measured.\n\n## Later\n\nmore\n' >"$doc"
python3 "$report" "$sample" --commit abc1234 --into "$doc" || fail "--into failed"
python3 "$report" "$sample" --commit abc1234 --into "$doc" || fail "--into failed a second time"
[ "$(grep -c '^## GPU$' "$doc")" -eq 1 ] || fail "not one GPU section after two --into"
expect "$doc" "| Tandem, flash attention | 32.00 | 256,000 | 19.2% | 1 | 1.07 |"
[ "$(head -n 6 "$doc")" = "$(printf '# Benchmarks\n\n## CPU\n\nfigures\n')" ] ||
  fail "--into changed what comes before the GPU section"
[ "$(tail -n 3 "$doc")" = "$(printf '## Later\n\nmore')" ] ||
  fail "--into changed what comes after the GPU section"
grep -q "Not measured" "$doc" && fail "--into left the old GPU section"

# bench_report.py keeps a measured GPU section, and not a placeholder.
check "bench_report.py keeps a measured GPU section, not a placeholder"
dir="$(dirname "$report")"
kept="$(cd "$dir" && python3 -c 'import sys, gpu_report; print(gpu_report.measured_section(open(sys.argv[1]).read()) is not None)' "$doc")"
[ "$kept" = "True" ] || fail "a measured GPU section is not kept by bench_report.py"
kept="$(cd "$dir" && python3 -c 'import sys, gpu_report; print(gpu_report.measured_section("## GPU\n\nNot measured.\n") is not None)')"
[ "$kept" = "False" ] || fail "a placeholder GPU section would be kept"

# A log without results: refused, naming it, and the file left as it was.
check "a log without results is refused, the file left as it was"
echo "gpu: nvidia-smi not found" >"$tmp/empty.log"
cp "$doc" "$tmp/before.md"
python3 "$report" "$tmp/empty.log" --into "$doc" 2>"$tmp/err.txt" && fail "an empty log was taken"
expect "$tmp/err.txt" "holds no gpu_check results"
cmp -s "$doc" "$tmp/before.md" || fail "a refused log changed $doc"
echo "PASSED: gpu_report.py"
