#!/bin/bash
# tools/count_tests.sh on a fake bazel-testlogs tree and summary, per target and per case:
# targets whose cases all passed, one case of several skipped (passed, its skip among the
# cases), every case skipped (skipped), Bazel's default
# XML with a failed case's XML in its log (passed), a shell test's own XML from tools/junit.sh
# (skipped as a whole; one check of several skipped), shards, the root package, Bazel's
# failure states; and a build that failed before any test ran.
# Usage: count_tests_test.sh COUNT_TESTS
set -u
. "$(dirname "$0")/junit.sh"
count="$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"
junit="$(cd "$(dirname "$0")" && pwd -P)/junit.sh"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
logs="$tmp/testlogs"

# gtest_xml TARGET_DIR CASE_RESULT...: GoogleTest 1.12's XML, one case per result (completed,
# skipped or failed).
gtest_xml() {
  local dir="$logs/$1" r n=0
  shift
  mkdir -p "$dir"
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuites tests=\"$#\" failures=\"0\" disabled=\"0\" errors=\"0\" time=\"0.01\" name=\"AllTests\">"
    echo "  <testsuite name=\"Suite\" tests=\"$#\" failures=\"0\" disabled=\"0\" skipped=\"0\" errors=\"0\" time=\"0.01\">"
    for r in "$@"; do
      n=$((n + 1))
      case "$r" in
        completed) echo "    <testcase name=\"Case$n\" file=\"a.cc\" line=\"$n\" status=\"run\" result=\"completed\" time=\"0.\" classname=\"Suite\" />" ;;
        skipped)
          echo "    <testcase name=\"Case$n\" file=\"a.cc\" line=\"$n\" status=\"run\" result=\"skipped\" time=\"0.\" classname=\"Suite\">"
          echo "      <skipped message=\"a.cc:$n&#x0A;no GPU\"><![CDATA[a.cc:$n"
          echo "no GPU]]></skipped>"
          echo "    </testcase>" ;;
        failed)
          echo "    <testcase name=\"Case$n\" file=\"a.cc\" line=\"$n\" status=\"run\" result=\"completed\" time=\"0.\" classname=\"Suite\">"
          echo "      <failure message=\"a.cc:$n&#x0A;Expected equality\" type=\"\"><![CDATA[a.cc:$n"
          echo "Expected equality]]></failure>"
          echo "    </testcase>" ;;
      esac
    done
    echo "  </testsuite>"
    echo "</testsuites>"
  } >"$dir/test.xml"
}

# Bazel's own XML for a test that wrote none: one case, the log in CDATA.
bazel_xml() {
  mkdir -p "$logs/$1"
  cat >"$logs/$1/test.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<testsuites>
  <testsuite name="$1" tests="1" failures="0" errors="0">
    <testcase name="$1" status="run" duration="1" time="1"></testcase>
    <system-out>Generated test.log (if the file is not UTF-8, then this may be unreadable):
      <![CDATA[a line with <testcase name="x"><failure message="y"/></testcase> in it]]>
    </system-out>
  </testsuite>
</testsuites>
EOF
}

# shell_xml TARGET_DIR SCRIPT_BODY: the XML a shell test using tools/junit.sh writes.
shell_xml() {
  mkdir -p "$logs/$1"
  printf '#!/bin/bash\nset -u\n. "%s"\n%s\n' "$junit" "$2" >"$tmp/script.sh"
  XML_OUTPUT_FILE="$logs/$1/test.xml" TEST_TARGET="//$1" bash "$tmp/script.sh" >/dev/null 2>&1
}

check "the fake tree"
gtest_xml runtime/all_passed completed completed
gtest_xml runtime/one_skipped completed skipped completed
gtest_xml runtime/all_skipped skipped skipped
gtest_xml runtime/failed completed failed
gtest_xml runtime/timeout completed
gtest_xml runtime/passed_with_failed_case completed failed
bazel_xml tools/default_xml
shell_xml tests/shell_skipped 'skip "no Slurm here (sbatch not found)"' ||
  fail "a skipping shell test exited $?"
shell_xml tests/shell_check_skipped 'check one; check two; skip_check "no python3"; check three' ||
  fail "a shell test with a skipped check exited $?"
grep -q '<skipped message="no Slurm here (sbatch not found)"/>' "$logs/tests/shell_skipped/test.xml" ||
  fail "junit.sh wrote no skipped case"
[ "$(grep -c '<testcase' "$logs/tests/shell_check_skipped/test.xml")" -eq 3 ] ||
  fail "junit.sh did not write one case per check"
shell_xml tests/shell_failed 'check one; fail "broke"' && fail "a failing shell test exited 0"
grep -q '<failure message="broke"/>' "$logs/tests/shell_failed/test.xml" ||
  fail "junit.sh wrote no failed case"
gtest_xml top skipped
mkdir -p "$logs/runtime/no_xml"
cat >"$tmp/summary.txt" <<'EOF'
INFO: Build completed successfully, 42 total actions
//runtime:all_passed                                                     PASSED in 0.3s
//runtime:one_skipped                                           (cached) PASSED in 0.2s
//runtime:all_skipped                                                    PASSED in 0.1s
//runtime:failed                                                         FAILED in 0.4s
  /root/.cache/bazel/execroot/tandem/bazel-out/k8-opt/testlogs/runtime/failed/test.log
//runtime:timeout                                                       TIMEOUT in 60.0s
//runtime:passed_with_failed_case                                        PASSED in 0.1s
//runtime:no_xml                                                         PASSED in 0.1s
//runtime:no_status                                                   NO STATUS
//runtime:not_built                                               FAILED TO BUILD
//runtime:flaky                                   FLAKY, failed in 1 out of 2 in 3.1s
//runtime:incompatible                                                     SKIPPED
//tools:default_xml                                                      PASSED in 1.0s
//tests:shell_skipped                                                    PASSED in 0.1s
//tests:shell_check_skipped                                              PASSED in 0.1s
//:top                                                                   PASSED in 0.1s

Executed 9 out of 13 tests: 6 tests pass, 4 fail locally and 3 were skipped.
EOF

# expect WHAT SUMMARY TESTLOGS BAZEL_EXIT LINE STATUS: the closing line and the exit status.
expect() {
  local what="$1" line rc
  check "$what"
  line="$("$count" "$2" "$3" "$4")"
  rc=$?
  echo "$what: $line (exit $rc)"
  [ "$line" = "$5" ] || fail "$what: '$line', not '$5'"
  [ "$rc" -eq "$6" ] || fail "$what: exit $rc, not $6"
}

# Passed: all_passed, one_skipped, no_xml, default_xml, shell_check_skipped. Failed: failed,
# timeout, passed_with_failed_case, no_status, not_built, flaky. Skipped: all_skipped,
# incompatible, shell_skipped, top. Cases passed: 2 + 2 (one_skipped) + 1 (failed) + 1
# (timeout) + 1 (passed_with_failed_case) + 1 (no_xml: the target) + 1 (default_xml) + 2
# (shell_check_skipped); failed: failed, timeout (its XML named no failure), passed_with_failed_case,
# flaky (no XML); skipped: 1 (one_skipped) + 2 (all_skipped) + 1 + 1 (the shell tests) + 1 (top).
expect "every kind of target" "$tmp/summary.txt" "$logs" 3 $'cases: 11 passed, 4 failed, 6 skipped\n5 passed, 6 failed, 4 skipped' 1

grep -E 'all_passed|one_skipped|all_skipped|shell_skipped|//:top' "$tmp/summary.txt" >"$tmp/good.txt"
expect "nothing failed" "$tmp/good.txt" "$logs" 0 $'cases: 4 passed, 0 failed, 5 skipped\n2 passed, 0 failed, 3 skipped' 0

cat >"$tmp/sharded.txt" <<'EOF'
//sharded:sharded                                                        PASSED in 0.3s
EOF
gtest_xml sharded/sharded/shard_1_of_2 skipped
gtest_xml sharded/sharded/shard_2_of_2 completed
expect "one shard skipped, one passed" "$tmp/sharded.txt" "$logs" 0 $'cases: 1 passed, 0 failed, 1 skipped\n1 passed, 0 failed, 0 skipped' 0
gtest_xml sharded/sharded/shard_2_of_2 skipped
expect "every shard skipped" "$tmp/sharded.txt" "$logs" 0 $'cases: 0 passed, 0 failed, 2 skipped\n0 passed, 0 failed, 1 skipped' 0

printf 'ERROR: /src/tandem/runtime/BUILD.bazel:3:8: Compiling runtime/a.cc failed\n' >"$tmp/broken.txt"
expect "the build failed before any test" "$tmp/broken.txt" "$logs" 1 $'cases: 0 passed, 0 failed, 0 skipped\n0 passed, 1 failed, 0 skipped' 1
echo "PASSED: count_tests.sh"
