#!/bin/bash
# runtime/safetensors_format_test.py: Tandem's safetensors reader and writer against a writer
# and a reader written from the format's description with Python's standard library.
# Usage: safetensors_format_test.sh SAFETENSORS_COPY SCRIPT
set -u
. "$(dirname "$0")/../tools/junit.sh"  # check, fail, skip; the checks as JUnit XML
command -v python3 >/dev/null 2>&1 || skip "python3 is not installed; the format check not run"
check "safetensors both ways against a stdlib-only writer and reader"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
python3 "$2" "$1" "$tmp" || fail "safetensors_format_test.py failed"
