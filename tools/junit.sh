# shellcheck shell=bash
# What a shell test checked, as JUnit XML in $XML_OUTPUT_FILE (Bazel sets it for every test
# and keeps the file as the test's test.xml; without it Bazel writes one passing case): one
# testcase per check, passed, failed or skipped. Sourced by the sh_tests (bash) that depend on
# //tools:junit; nothing is written where XML_OUTPUT_FILE is not set.
#
#   check NAME     starts a check; the one before it passed
#   fail WHY       the check under way failed: says so on stderr and exits 1
#   skip WHY       the check under way (or, before any, the whole test) is skipped: says so and
#                  exits 0
#   skip_check WHY the check under way is skipped; the test goes on
#   on_exit CMD    runs CMD when the test exits (instead of trap ... EXIT, which the XML needs)
#
# At exit the check under way passed if the test exits 0, and failed otherwise.

junit_cases=""        # the testcase elements so far
junit_counts=(0 0 0)  # tests, failures, skipped
junit_name=""         # the check under way, "" if none
junit_start=$SECONDS
junit_exit_cmds=()

junit_escape() {
  local s="$1"
  # Quoted: bash 5.2 puts the match where an unquoted & stands in a replacement.
  s="${s//&/"&amp;"}"
  s="${s//</"&lt;"}"
  s="${s//>/"&gt;"}"
  s="${s//\"/"&quot;"}"
  s="${s//[[:cntrl:]]/ }"  # XML has no place for most; a newline in an attribute is a space
  printf '%s' "$s"
}

# junit_close KIND WHY: the check under way ended (passed, failed or skipped).
junit_close() {
  local kind="$1" why="${2:-}" name="$junit_name" body=""
  if [ -z "$name" ]; then
    [ "$kind" = passed ] && return 0
    name="${TEST_TARGET:-$(basename "$0")}"  # nothing checked yet: the whole test
  fi
  case "$kind" in
    failed) body="<failure message=\"$(junit_escape "$why")\"/>"; junit_counts[1]=$((junit_counts[1] + 1)) ;;
    skipped) body="<skipped message=\"$(junit_escape "$why")\"/>"; junit_counts[2]=$((junit_counts[2] + 1)) ;;
  esac
  junit_counts[0]=$((junit_counts[0] + 1))
  junit_cases+="    <testcase name=\"$(junit_escape "$name")\" time=\"$((SECONDS - junit_start))\">$body</testcase>
"
  junit_name=""
}

junit_write() {
  [ -n "${XML_OUTPUT_FILE:-}" ] || return 0
  local suite
  suite="$(junit_escape "${TEST_TARGET:-$(basename "$0")}")"
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuites tests=\"${junit_counts[0]}\" failures=\"${junit_counts[1]}\" skipped=\"${junit_counts[2]}\">"
    echo "  <testsuite name=\"$suite\" tests=\"${junit_counts[0]}\" failures=\"${junit_counts[1]}\" skipped=\"${junit_counts[2]}\">"
    printf '%s' "$junit_cases"
    echo '  </testsuite>'
    echo '</testsuites>'
  } >"$XML_OUTPUT_FILE"
}

junit_on_exit() {
  local rc=$? cmd
  for cmd in ${junit_exit_cmds[@]+"${junit_exit_cmds[@]}"}; do eval "$cmd"; done
  if [ "$rc" -eq 0 ]; then
    junit_close passed
  elif [ -n "$junit_name" ] || [ "${junit_counts[1]}" -eq 0 ]; then
    junit_close failed "exited $rc"  # not through fail
  fi
  junit_write
  exit "$rc"
}
trap junit_on_exit EXIT

check() {
  junit_close passed
  junit_name="$1"
  junit_start=$SECONDS
}

fail() {
  echo "FAILED: $*" >&2
  junit_close failed "$*"
  exit 1
}

skip() {
  echo "SKIPPED: $*"
  junit_close skipped "$*"
  exit 0
}

skip_check() {
  echo "SKIPPED: $*"
  junit_close skipped "$*"
}

on_exit() {
  junit_exit_cmds+=("$1")
}
