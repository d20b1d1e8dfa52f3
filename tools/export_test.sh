#!/bin/bash
# //tools:export and --init-from through the real binaries: a checkpoint written in Hugging
# Face GPT-2's layout (names, config.json), read back with --init-from bit for bit (the
# exported files of the checkpoint and of the imported weights are the same bytes), a run
# from an exported step 0 with the losses of the run that wrote it, a 2-stage pipeline whose
# ranks each fill their stage from the file by name, and bad input refused in one line.
# Usage: export_test.sh EXPORT TRAIN LAUNCHER
set -u
. "$(dirname "$0")/junit.sh"  # check, fail, skip; the checks as JUnit XML
abs() { echo "$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"; }
export_bin="$(abs "$1")"
train="$(abs "$2")"
launcher="$(abs "$3")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export TMPDIR="$tmp"  # Open MPI's session files stay inside the test's directory
small=(--model=gpt --n-layer=2 --d-model=32 --n-head=4 --seq-len=16 --batch=4)

# The loss of every step of a run, from its metrics (the shortest decimal of each float).
losses() {
  sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1/metrics/rank-0.jsonl"
}

check "export a one-worker checkpoint: GPT-2's names, config.json beside it"
"$train" "${small[@]}" --steps=3 --lr=1e-2 --checkpoint-every=1 --run-dir="$tmp/a" >"$tmp/a.txt" 2>&1 ||
  { cat "$tmp/a.txt"; fail "training run a failed"; }
"$export_bin" --checkpoint="$tmp/a/checkpoints/step-3" --out="$tmp/a3/model.safetensors" ||
  fail "export of step 3 failed"
config="$tmp/a3/config.json"
for want in '"model_type": "gpt2"' '"n_layer": 2' '"n_embd": 32' '"n_head": 4' \
  '"n_positions": 16' '"vocab_size": 256' '"activation_function": "gelu_new"' \
  '"layer_norm_epsilon": 1e-05' '"tie_word_embeddings": false'; do
  grep -qF -- "$want" "$config" || fail "config.json lacks $want: $(cat "$config")"
done
for name in transformer.wte.weight transformer.h.1.attn.c_attn.weight transformer.ln_f.bias \
  lm_head.weight; do
  head -c 4096 "$tmp/a3/model.safetensors" | grep -qaF "\"$name\"" || fail "no tensor $name"
done
# The run directory (examples/train's lone step files) names its newest checkpoint: step 3.
"$export_bin" --checkpoint="$tmp/a" --out="$tmp/a-dir/model.safetensors" ||
  fail "export of the run directory failed"
cmp -s "$tmp/a3/model.safetensors" "$tmp/a-dir/model.safetensors" ||
  fail "the run directory did not name step 3"

check "round trip: --init-from starts from the exported weights, bit for bit"
"$train" "${small[@]}" --steps=1 --checkpoint-every=1 --init-from="$tmp/a3/model.safetensors" \
  --run-dir="$tmp/b" >"$tmp/b.txt" 2>&1 || { cat "$tmp/b.txt"; fail "training from the file failed"; }
# Step 0 of run b holds the weights it started from; exported, they are a3's bytes.
"$export_bin" --checkpoint="$tmp/b/checkpoints/step-0" --out="$tmp/b0/model.safetensors" ||
  fail "export of run b's step 0 failed"
cmp "$tmp/a3/model.safetensors" "$tmp/b0/model.safetensors" ||
  fail "the weights --init-from loaded differ from the exported ones"

check "a run from its exported step 0 has the losses of the run that wrote it"
"$export_bin" --checkpoint="$tmp/a/checkpoints/step-000000.ckpt" --out="$tmp/a0/model.safetensors" ||
  fail "export of step 0 failed"
"$train" "${small[@]}" --steps=3 --lr=1e-2 --init-from="$tmp/a0/model.safetensors" \
  --run-dir="$tmp/c" >"$tmp/c.txt" 2>&1 || { cat "$tmp/c.txt"; fail "training from step 0's file failed"; }
[ "$(losses "$tmp/a" | wc -l)" -eq 3 ] || fail "run a has no 3 losses"
[ "$(losses "$tmp/a")" = "$(losses "$tmp/c")" ] ||
  fail "losses differ: $(losses "$tmp/a" | tr '\n' ' ') vs $(losses "$tmp/c" | tr '\n' ' ')"
echo "losses of both runs: $(losses "$tmp/c" | tr '\n' ' ')"

check "a 2-stage pipeline: each rank fills its stage from the file by name"
timeout 120 "$launcher" --strategy=pipeline --gpus=2 --device=cpu "${small[@]}" --steps=1 \
  --checkpoint-every=1 --init-from="$tmp/a3/model.safetensors" --run-dir="$tmp/p" \
  >"$tmp/p.txt" 2>&1 || { tail -20 "$tmp/p.txt"; fail "the pipeline run failed"; }
"$export_bin" --checkpoint="$tmp/p/checkpoints/step-0" --out="$tmp/p0/model.safetensors" ||
  fail "export of the pipeline's step 0 failed"
cmp "$tmp/a3/model.safetensors" "$tmp/p0/model.safetensors" ||
  fail "the pipeline's stages did not start from the file's weights"

check "bad input refused in one line, before anything starts"
refused() {  # WORDS COMMAND...
  local words="$1" out="$tmp/refused.txt"
  shift
  "$@" >"$out" 2>&1 && fail "accepted: $*"
  grep -qF -- "$words" "$out" || fail "no '$words' in: $(cat "$out")"
  echo "refused: $(grep -F -- "$words" "$out" | head -1)"
}
refused "--init-from=$tmp/none.safetensors does not exist" \
  "$launcher" --check --device=cpu "${small[@]}" --init-from="$tmp/none.safetensors"
refused "a resumed run has its weights" "$launcher" --check --device=cpu "${small[@]}" \
  --steps=5 --init-from="$tmp/a3/model.safetensors" --resume="$tmp/a/checkpoints/step-1"
refused "tensor transformer.wte.weight is [256, 32]; the model's embed.wte needs [at most 256, 48]" \
  "$launcher" --check --device=cpu "${small[@]}" --d-model=48 --init-from="$tmp/a3/model.safetensors"
refused "holds transformer.h.1." \
  "$launcher" --check --device=cpu "${small[@]}" --n-layer=1 --init-from="$tmp/a3/model.safetensors"
refused "which has no Hugging Face GPT-2 counterpart" \
  "$launcher" --check --device=cpu --model=mlp --init-from="$tmp/a3/model.safetensors"
"$train" --model=mlp --n-layer=1 --steps=1 --batch=2 --checkpoint-every=1 --run-dir="$tmp/m" \
  >/dev/null 2>&1 || fail "the MLP run failed"
refused "holds an MLP model" "$export_bin" --checkpoint="$tmp/m/checkpoints/step-1" --out="$tmp/m.safetensors"
refused "name <run_dir>/checkpoints/step-N" "$export_bin" --checkpoint="$tmp/a3/config.json" --out="$tmp/x.safetensors"
head -c 100 "$tmp/a3/model.safetensors" >"$tmp/cut.safetensors"
refused "is not a valid safetensors file" "$train" "${small[@]}" --steps=1 --init-from="$tmp/cut.safetensors"
