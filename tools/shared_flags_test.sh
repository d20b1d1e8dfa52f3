#!/bin/bash
# The job's model and training flags (launcher/job_flags.cc) are one set of flags for the
# launcher, examples/train and compare --plan: each program's --help lists the ones it takes
# with the one help text, the launcher's, and its own default (examples/train's --steps 300,
# compare --plan's 20); a program whose binary defined one again would not start.
# Usage: shared_flags_test.sh LAUNCHER TRAIN COMPARE
set -u
. "$(dirname "$0")/junit.sh"  # check, fail, skip; the checks as JUnit XML
launcher="$1"
train="$2"
compare="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

shared=(model n-layer d-model n-head seq-len attention tie-embeddings dtype steps batch lr warmup
  optimizer weight-decay decay-all clip-norm seed data data-format vocab synthetic val-data
  val-fraction eval-every eval-batches checkpoint-every)
planned=(model n-layer d-model n-head seq-len batch dtype optimizer seed steps)

# The two lines --help shows for flag $2 in file $1: its name and default, then its help.
entry() {
  awk -v a="  --$2  (default:" -v b="  --[no-]$2  (default:" \
    'index($0, a) == 1 || index($0, b) == 1 { print; getline; print; exit }' "$1"
}
# Its help line alone.
help_of() { entry "$1" "$2" | sed -n 2p; }
# Its default alone.
default_of() { entry "$1" "$2" | sed -n '1s/.*(default: \(.*\))$/\1/p'; }

check "each program starts and lists its flags"
"$launcher" --help >"$tmp/launcher.txt" 2>&1 || fail "launcher --help exited $?"
"$train" --help >"$tmp/train.txt" 2>&1 || fail "train --help exited $?"
"$compare" --plan --help >"$tmp/plan.txt" 2>&1 || fail "compare --plan --help exited $?"

check "the launcher and examples/train take every shared flag, with the one help text"
for name in "${shared[@]}"; do
  want="$(help_of "$tmp/launcher.txt" "$name")"
  [ -n "$want" ] || fail "the launcher's --help lacks --$name"
  [ "$(help_of "$tmp/train.txt" "$name")" = "$want" ] ||
    fail "train's --$name is not the launcher's: $(entry "$tmp/train.txt" "$name")"
done

check "compare --plan takes the model, batch, dtype, optimizer, seed and steps, the same flags"
for name in "${planned[@]}"; do
  [ "$(help_of "$tmp/plan.txt" "$name")" = "$(help_of "$tmp/launcher.txt" "$name")" ] ||
    fail "compare --plan's --$name is not the launcher's: $(entry "$tmp/plan.txt" "$name")"
done
for name in lr data attention checkpoint-every; do
  [ -z "$(entry "$tmp/plan.txt" "$name")" ] || fail "compare --plan lists --$name"
done

check "each program keeps its own defaults"
[ "$(default_of "$tmp/launcher.txt" steps)" = 100 ] || fail "launcher --steps' default"
[ "$(default_of "$tmp/train.txt" steps)" = 300 ] || fail "train --steps' default"
[ "$(default_of "$tmp/plan.txt" steps)" = 20 ] || fail "compare --plan --steps' default"
for name in "${shared[@]}"; do
  [ "$name" = steps ] && continue
  [ "$(default_of "$tmp/train.txt" "$name")" = "$(default_of "$tmp/launcher.txt" "$name")" ] ||
    fail "train --$name's default is not the launcher's"
done
