#!/usr/bin/env bash
# The Python of the Hugging Face check (//tools:hf_logits_test) and the bench's PyTorch peer
# (tools/bench.sh): torch, transformers, safetensors and numpy from pip's default registry in
# a virtual environment outside the tree, $TANDEM_VENV (default ~/.cache/tandem/venv), kept
# between runs. When its python already imports them this takes a second or two; otherwise
# it makes the environment (Debian's python3-venv, tools/setup.sh) and installs them.
# Prints the environment's python on stdout and exits 0; where it cannot (no python3 -m venv,
# pip cannot reach its registry) it says why on stderr and exits 1.
# Usage: .ci/venv.sh
set -uo pipefail
venv="${TANDEM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/venv}"
py="$venv/bin/python"
imports="import torch, transformers, safetensors, numpy"

if [ -x "$py" ] && "$py" -c "$imports" >/dev/null 2>&1; then
  echo "venv: $venv has torch and transformers" >&2
  echo "$py"
  exit 0
fi
# Debian's python3 (tools/setup.sh installs python3-venv for it), not another one on PATH.
base=/usr/bin/python3
[ -x "$base" ] || base="$(command -v python3 || true)"
[ -n "$base" ] || { echo "venv: no python3" >&2; exit 1; }
if [ ! -x "$py" ]; then
  mkdir -p "$(dirname "$venv")" && "$base" -m venv "$venv" >&2 ||
    { echo "venv: $base -m venv $venv failed (is python3-venv installed?)" >&2; exit 1; }
fi
start=$(date +%s)
log="$(mktemp)"
echo "venv: installing torch transformers safetensors numpy into $venv" >&2
# Few retries and a short timeout: where the registry cannot be reached this fails in about a
# minute instead of several.
if ! "$py" -m pip install --disable-pip-version-check --no-input --retries 1 --timeout 30 \
  torch transformers safetensors numpy >"$log" 2>&1; then
  tail -n 3 "$log" >&2
  rm -f "$log"
  echo "venv: pip could not install torch and transformers (is its registry reachable?)" >&2
  exit 1
fi
rm -f "$log"
"$py" -c "$imports" >/dev/null 2>&1 ||
  { echo "venv: $py installed them but cannot import them" >&2; exit 1; }
echo "venv: installed in $(($(date +%s) - start)) s" >&2
echo "$py"
