#!/bin/bash
# examples/generate's command line, with the real binaries: --help lists its flags; bad input
# is refused in one line before the weights are read; from a run directory examples/train
# wrote it prints the prompt and --tokens more bytes, the same for the same seed; a
# checkpoint named by step or file loads the same weights. Usage: generate_test.sh GENERATE TRAIN
set -u
generate="$1"
train="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

"$generate" --help >"$tmp/help.txt" 2>&1 || fail "--help exited $?"
for flag in checkpoint prompt tokens temperature top-k seed device tokenizer "[no-]benchmark"; do
  grep -qF -- "  --$flag  (default: " "$tmp/help.txt" || fail "--help lacks --$flag"
done

# Each problem is one line, and nothing is loaded.
check_refused() {  # expected line, then the flags
  local want="$1"
  shift
  "$generate" "$@" >"$tmp/bad.txt" 2>&1
  local rc=$?
  [ "$rc" -ne 0 ] || fail "$* was not refused"
  [ "$(cat "$tmp/bad.txt")" = "$want" ] || { cat "$tmp/bad.txt"; fail "$*: not the one line '$want'"; }
}
check_refused "generate: --checkpoint is required: a run directory or one of its checkpoints"
check_refused "generate: --checkpoint=$tmp/nowhere: name <run_dir>/checkpoints/step-N (or one of its files), or a run directory" \
  --checkpoint="$tmp/nowhere"
check_refused "generate: --top-k must be >= 0 (0: every token)" --checkpoint="$tmp" --top-k=-1

run="$tmp/run"
"$train" --model=gpt --n-layer=2 --d-model=32 --n-head=2 --seq-len=16 --batch=4 --steps=4 \
  --checkpoint-every=2 --run-dir="$run" >"$tmp/train.txt" 2>&1 || { cat "$tmp/train.txt"; fail "training failed"; }

sample() {  # output file, then flags
  local out="$1"
  shift
  "$generate" --checkpoint="$run" --device=cpu --prompt="The " --tokens=40 "$@" >"$out" 2>"$out.err" ||
    { cat "$out.err"; fail "generate $* failed"; }
}
sample "$tmp/a.txt" --seed=3
sample "$tmp/b.txt" --seed=3
cmp -s "$tmp/a.txt" "$tmp/b.txt" || fail "the same seed gave different text"
# The prompt, 40 bytes, a newline.
[ "$(head -c 4 "$tmp/a.txt")" = "The " ] || fail "the output does not start with the prompt"
[ "$(wc -c <"$tmp/a.txt")" -eq 45 ] || fail "not 40 bytes after the prompt: $(wc -c <"$tmp/a.txt") in all"
grep -qF "step 4 of $run/checkpoints/step-000004" "$tmp/a.txt.err" || fail "the newest checkpoint was not the one read"
# The same checkpoint named by step, or by its file, gives the same text; greedy is the same twice.
sample "$tmp/c.txt" --seed=3 --checkpoint="$run/checkpoints/step-000004"
cmp -s "$tmp/a.txt" "$tmp/c.txt" || fail "checkpoints/step-000004 gave other text"
sample "$tmp/d.txt" --seed=3 --checkpoint="$run/checkpoints/step-000004.ckpt"
cmp -s "$tmp/a.txt" "$tmp/d.txt" || fail "checkpoints/step-000004.ckpt gave other text"
sample "$tmp/g1.txt" --temperature=0
sample "$tmp/g2.txt" --temperature=0 --seed=9
cmp -s "$tmp/g1.txt" "$tmp/g2.txt" || fail "greedy depends on the seed"
echo PASSED
