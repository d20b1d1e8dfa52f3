#!/usr/bin/env bash
# Installs every Debian package Tandem needs to build, test and run.
# Idempotent: when everything is present it only checks (a second or two) and exits.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap          # /usr/bin/bazel 4.2.3
  build-essential pkg-config
  libopenmpi-dev openmpi-bin
  libgrpc++-dev protobuf-compiler-grpc
  libprotobuf-dev protobuf-compiler
  libabsl-dev
  libopenblas-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  nlohmann-json3-dev       # JSON: run.json, the metrics lines, Chrome traces (header-only)
  iproute2                 # network namespaces for the multi-host test
  chromium                 # renders the comparison report in its test (tools:render_report_test)
  python3-venv             # .ci/venv.sh: torch and transformers for tools:hf_logits_test
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "setup: error: need root to install ${missing[*]}; run as root or install them with your package manager" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists once if they are missing or older than a day.
lists_age=$(( $(date +%s) - $(stat -c %Y /var/lib/apt/lists 2>/dev/null || echo 0) ))
if [ ! -d /var/lib/apt/lists/partial ] || [ "$lists_age" -gt 86400 ] || \
   ! ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1; then
  "${SUDO[@]}" apt-get update -qq
fi

unavailable=()
for p in "${missing[@]}"; do
  if ! apt-cache show "$p" >/dev/null 2>&1; then unavailable+=("$p"); fi
done
if [ ${#unavailable[@]} -gt 0 ]; then
  echo "setup: error: no package named ${unavailable[*]} in this machine's package sources; Tandem needs Debian 12 (bookworm) or newer" >&2
  exit 1
fi

"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: installed ${#missing[@]} packages"
