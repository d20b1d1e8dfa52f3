#!/bin/bash
# tools/bench_report.py on two runs made up here that differ in every measured row and machine
# fact (cores, tracing, commit, the planner's checks): the prose follows each run's figures,
# none of the old fixed ones appear, and a dirty tree is refused unless stamped so.
# Usage: bench_report_test.sh BENCH_REPORT
set -u
. "$(dirname "$0")/junit.sh"  # check, fail; the checks as JUnit XML
report="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

# run DIR CORES TRACED COMMIT DIRTY SCALE: a bench's raw outputs, its figures scaled by SCALE
# where the prose quotes them.
make_run() {
  python3 - "$@" <<'PY'
import json, os, sys
d, cores, traced, commit, dirty, scale = sys.argv[1:7]
cores, traced, dirty, scale = int(cores), traced == "1", dirty == "1", float(scale)
os.makedirs(d, exist_ok=True)
def write(name, rows):
  with open(os.path.join(d, name), "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
json.dump({"commit": commit, "dirty": dirty, "cores": cores}, open(os.path.join(d, "run.json"), "w"))
json.dump({"context": {}, "benchmarks": []}, open(os.path.join(d, "ops.json"), "w"))
open(os.path.join(d, "train.txt"), "w").write("gpt-tiny (batch 16) 1000 tokens/s\n")
write("pytorch.jsonl", [{"skipped": "PyTorch is not installed"}])
data = [{"bench": "data", "workers": w, "case": "overlap", "bucket_mb": 25,
         "tokens_per_second": 1000.0 * w * scale, "step_seconds": 0.1, "comm_seconds": 0,
         "exposed_comm_seconds": 0} for w in (1, 2)]
data += [{"bench": "data", "workers": 2, "case": f"13 buckets, {c}", "bucket_mb": 0.5,
          "tokens_per_second": 1800.0 * scale, "step_seconds": 0.1, "comm_seconds": 0.02,
          "exposed_comm_seconds": e} for c, e in (("overlap", 0.01), ("no-overlap", 0.02))]
def pipe(schedule, k, m, with_rounds, textbook, measured, ratio_textbook):
  row = {"bench": "pipeline", "schedule": schedule, "stages": k, "virtual_stages": 1,
         "micro_batches": m, "bubble_measured": measured, "bubble_expected": 0.2,
         "bubble_expected_medians": 0.18, "bubble_ratio_by_step": 1.3 * scale,
         "handover_ms": 0.2 * scale, "handovers": 40, "handover_source": "the same steps",
         "bubble_expected_with_handovers": 0.25, "bubble_ratio_with_handovers": with_rounds[1],
         "bubble_ratio_with_handovers_rounds": with_rounds, "bubble_textbook": textbook,
         "bubble_gpipe": textbook, "tokens_per_second": 900.0 * scale,
         "stage0_peak_activation_bytes": 2**20, "peak_activation_bytes": [2**20] * k,
         "rounds": len(with_rounds), "traced": traced}
  if ratio_textbook is not None:
    row["bubble_ratio_textbook"] = ratio_textbook
  return row
rounds16 = [round(1.10 * scale, 2), round(1.12 * scale, 2), round(1.15 * scale, 2)]
strat = data + [pipe("gpipe", 2, 16, rounds16, 0.0588, 0.30, None),
                pipe("1f1b", 4, 8, [0.9, 0.95, 0.97], 0.2727, 0.40, 1.4668)]
write("strategy.jsonl", strat)
write("hybrid.jsonl", [{"case": c, "schedule": "", "micro_batches": 1, "zero": 0, "round": 1,
                        "tokens_per_second": t * scale, "bubble_measured": 0.0}
                       for c, t in (("data parallel", 2000.0), ("4 stages", 1500.0))])
params = int(1700000 * scale)
write("zero.jsonl", [{"workers": 1, "zero": 0, "params": params,
                      "optimizer_state_bytes": [8 * params]}])
def plan(name, model, batch, gpus, runs, predicted, fitted):
  os.makedirs(os.path.join(d, name), exist_ok=True)
  fastest, median = min(runs), sorted(runs)[1]
  checks = [{"layout": "data D=%d bucket 25 MB" % gpus, "step_seconds": predicted, "ran": True,
             "measured_step_seconds": fastest, "measured_step_runs_seconds": runs,
             "measured_median_step_seconds": median,
             "measured_step_spread": (max(runs) - min(runs)) / median,
             "step_error": predicted / fastest - 1, "median_step_error": predicted / median - 1,
             "memory_bytes": 10 * 2**20, "measured_peak_bytes": 10 * 2**20,
             "memory_error": 0.0}]
  p = {"command": f"bazel run //tools:compare -- --plan --gpus={gpus} --batch={batch}",
       "model": model, "gpus": gpus, "checks": checks,
       "held_out": [f"{fitted} (ranked 1): the waiting share was fitted on it"] if fitted else []}
  if fitted:
    p["waiting_share"] = {"share": 0.4, "source": f"fitted to {fitted}", "fitted_on": fitted}
  json.dump(p, open(os.path.join(d, name, "plan.json"), "w"))
plan("plan2", "gpt-tiny", 16, 2, [0.11, 0.125, 0.12], 0.1 * scale, None)
plan("plan4", "gpt-tiny", 16, 4, [0.2, 0.22, 0.21], 0.2, "d1k4 1f1b M=8")
plan("heldout-gpt4", "gpt: 6 layers", 24, 4, [0.3, 0.33, 0.32], 0.3 * scale, "d1k4 1f1b M=8")
plan("heldout-mlp2", "mlp: 4 layers", 32, 2, [0.07, 0.08, 0.075], 0.069, None)
PY
}

make_run "$tmp/a" 2 0 aaaaaaa1111111111111111111111111111111111 0 1.0
make_run "$tmp/b" 8 1 bbbbbbb2222222222222222222222222222222222 1 1.5

check "run A: 2 cores, not traced, a clean tree at aaaaaaa"
python3 "$report" "$tmp/a" >"$tmp/a.md" 2>"$tmp/a.err" || { cat "$tmp/a.err"; fail "exit $?"; }
for want in "on 2 cores, " "commit aaaaaaa (read as the bench started)" \
  "The 4 workers share 2 cores here, so the absolute figures say little" \
  "With 4 stages on 2 cores the workers share cores" \
  "the rows of at most 2 stages are the clean ones" \
  "GPipe at M = 16 on 2 stages measured 1.10, 1.12, 1.15 with handovers in its 3 rounds here" \
  "pipeline steps were not traced" "Below 1 (here 1f1b K=4 M=8)" \
  "gpt-tiny's 6.5 MB of gradients" \
  "| gpipe | 2 | 16 | 0.300 | 0.200 | 0.180 | 0.20 (40) | 0.250 | 1.12 (1.10, 1.12, 1.15) | 1.30 | 5.10 | 0.059 |" \
  "| 1f1b | 4 | 8 | 0.400 | 0.200 | 0.180 | 0.20 (40) | 0.250 | 0.95 (0.90, 0.95, 0.97) | 1.30 | 1.47 | 0.273 |" \
  "measured / with handovers (handover from the same steps) | measured / without handovers | measured / textbook" \
  "| held out | gpt: 6 layers; batch 24, 4 workers | data D=4 bucket 25 MB | 300.0 | 300.0 | 320.0 | 9.4% |" \
  "largest step error 9.1% against the fastest run (within 15%), 16.7% against the median (over 15%)" \
  "held out: gpt: 6 layers; batch 24, 4 workers: held out of the check: d1k4 1f1b M=8 (ranked 1)"; do
  grep -qF -- "$want" "$tmp/a.md" || fail "A lacks: $want"
done
for old in "0.1-0.27" "1.17-1.26" "1.08-1.12" "6.6 MB" "commit unknown" "dirty"; do
  ! grep -qF -- "$old" "$tmp/a.md" || fail "A says: $old"
done

check "run B, a dirty tree: refused in one line, stamped dirty with TANDEM_BENCH_DIRTY=1"
python3 "$report" "$tmp/b" >"$tmp/b.md" 2>"$tmp/b.err"
rc=$?
cat "$tmp/b.err"
[ "$rc" -ne 0 ] || fail "a dirty tree was stamped"
[ "$(wc -l <"$tmp/b.err")" -eq 1 ] || fail "not one line"
grep -q "^bench_report: the tree at bbbbbbb had uncommitted changes" "$tmp/b.err" ||
  fail "the refusal does not say why"
TANDEM_BENCH_DIRTY=1 python3 "$report" "$tmp/b" >"$tmp/b.md" 2>"$tmp/b.err" ||
  { cat "$tmp/b.err"; fail "exit $?"; }
grep -qF "commit bbbbbbb with uncommitted changes (dirty" "$tmp/b.md" || fail "B not stamped dirty"

check "run B: 8 cores, traced, other figures: the prose follows"
for want in "on 8 cores, " "Each of the 4 workers has a core of its own here (8 cores)" \
  "Every stage has a core of its own here (8 cores)" "pipeline steps were traced" \
  "GPipe at M = 16 on 2 stages measured 1.65, 1.68, 1.72 with handovers in its 3 rounds here" \
  "Below 1 (here 1f1b K=4 M=8)" "gpt-tiny's 9.7 MB of gradients" \
  "| held out | gpt: 6 layers; batch 24, 4 workers | data D=4 bucket 25 MB | 450.0 | 300.0 | 320.0 | 9.4% |" \
  "largest step error 50.0% against the fastest run (over 15%), 40.6% against the median (over 15%)"; do
  grep -qF -- "$want" "$tmp/b.md" || fail "B lacks: $want"
done
for old in "2 cores" "not traced" "the workers share cores" "1.10, 1.12, 1.15" "aaaaaaa"; do
  ! grep -qF -- "$old" "$tmp/b.md" || fail "B says: $old"
done
