// Test helper: trace events built in one call, for the tests of merging and reading traces
// (launcher/trace_merge_test.cc, tools/comparison_test.cc).
#ifndef TANDEM_LAUNCHER_TEST_TRACE_H_
#define TANDEM_LAUNCHER_TEST_TRACE_H_

#include <cstdint>
#include <string>

#include "runtime/profiler.h"

namespace tandem {
namespace launcher {

// A complete event `name` of category `cat`, starting at `start` us and lasting `dur` us.
inline TraceEvent Event(const std::string& name, const char* cat, double start, double dur,
                        int mb = -1, int thread = 0, int64_t seq = -1) {
  TraceEvent e;
  e.name = name;
  e.category = cat;
  e.start_us = start;
  e.duration_us = dur;
  e.micro_batch = mb;
  e.thread = thread;
  e.sequence = seq;
  return e;
}

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_TEST_TRACE_H_
