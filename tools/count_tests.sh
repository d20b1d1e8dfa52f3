#!/usr/bin/env bash
# The closing lines of continuous integration, "cases: N passed, N failed, N skipped" and then,
# last and alone, "N passed, N failed, N skipped", counted per test case and per test target
# from Bazel's summary (bazel test --test_summary=short: one line per target,
# "//pkg:name  (cached) PASSED in 1.2s", or FAILED, TIMEOUT, FLAKY, NO STATUS, FAILED TO
# BUILD, ...) and each target's test.xml under bazel-testlogs: GoogleTest's (a skipped case has
# result="skipped") or a shell test's own (tools/junit.sh: <skipped message="..."/>).
#   - a target Bazel did not report PASSED failed (Bazel's SKIPPED, an incompatible target,
#     is skipped);
#   - a PASSED target whose every test case was skipped (or not run) is skipped; one with a
#     failed case failed; otherwise (a case ran, or no XML says anything) it passed;
#   - a nonzero BAZEL_EXIT with no target failed is one failure: the build failed before any
#     test ran;
#   - the cases are those of every target that ran (not SKIPPED, NO STATUS or FAILED TO
#     BUILD), so that a target that passed with some cases skipped shows them; a target with no
#     XML counts as one case, passed or failed as the target.
# Needs bash, sed and awk only. Exits 1 if anything failed.
# Usage: count_tests.sh SUMMARY_LOG TESTLOGS_DIR [BAZEL_EXIT]
set -uo pipefail
summary="$1"
testlogs="$2"
bazel_exit="${3:-0}"

# The cases of test.xml files: "run skipped failed" (a run case is neither skipped nor
# failed). Text in CDATA (a test's log, a failure's message) is not looked at.
count_cases() {
  awk '
    FNR == 1 && NR > 1 { count(); s = "" }
    { s = s $0 "\n" }
    END { count(); print run + 0, skipped + 0, failed + 0 }
    function count(    i, j, n, part, body, end) {
      while ((i = index(s, "<![CDATA[")) > 0) {
        j = index(substr(s, i), "]]>")
        s = substr(s, 1, i - 1) (j > 0 ? substr(s, i + j + 2) : "")
      }
      n = split(s, part, "<testcase")
      for (i = 2; i <= n; i++) {
        body = part[i]
        end = index(body, ">")
        if (substr(body, end - 1, 1) == "/") {
          body = substr(body, 1, end)  # <testcase .../>
        } else if ((end = index(body, "</testcase>")) > 0) {
          body = substr(body, 1, end)
        }
        if (body ~ /<failure|<error/) failed++
        else if (body ~ /<skipped|result="(skipped|suppressed)"|status="notrun"/) skipped++
        else run++
      }
    }' "$@"
}

passed=0
failed=0
skipped=0
cases=(0 0 0)  # passed, failed, skipped
shopt -s nullglob
while IFS='|' read -r target status; do
  case "$status" in
    PASSED | FAILED | TIMEOUT | FLAKY) ;;  # ran: its cases count
    SKIPPED) skipped=$((skipped + 1)); continue ;;
    *) failed=$((failed + 1)); continue ;;
  esac
  path="${target#//}"
  path="${path%%:*}/${target#*:}"
  path="${path#/}"  # the root package
  dir="$testlogs/$path"
  xmls=()
  for f in "$dir"/test.xml "$dir"/shard_*_of_*/test.xml "$dir"/run_*_of_*/test.xml \
    "$dir"/run_*_of_*/shard_*_of_*/test.xml; do
    [ -f "$f" ] && xmls+=("$f")
  done
  read -r run skip fail < <(if [ ${#xmls[@]} -gt 0 ]; then count_cases "${xmls[@]}"; else echo 0 0 0; fi)
  if [ $((run + skip + fail)) -eq 0 ]; then
    if [ "$status" = PASSED ]; then run=1; else fail=1; fi
  elif [ "$status" != PASSED ] && [ "$fail" -eq 0 ]; then
    fail=1  # a timeout or a crash after the cases its XML names
  fi
  cases[0]=$((cases[0] + run))
  cases[1]=$((cases[1] + fail))
  cases[2]=$((cases[2] + skip))
  if [ "$status" != PASSED ]; then
    failed=$((failed + 1))
  elif [ "$fail" -gt 0 ]; then
    failed=$((failed + 1))
  elif [ "$run" -eq 0 ] && [ "$skip" -gt 0 ]; then
    skipped=$((skipped + 1))
  else
    passed=$((passed + 1))
  fi
done < <(sed -nE 's/^(\/\/[^ ]+) +(\(cached\) +)?([A-Z]+( TO BUILD| STATUS)?).*/\1|\3/p' "$summary" |
  sort -u)

if [ "$bazel_exit" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build itself failed before any test ran
fi
echo "cases: ${cases[0]} passed, ${cases[1]} failed, ${cases[2]} skipped"
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[ "$failed" -eq 0 ]
