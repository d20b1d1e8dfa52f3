// A process-wide op profiler: when enabled, every op (runtime/ops.h) adds its count and time
// to a table, and named spans (forward of micro-batch 3, all-reduce #12, ...) are kept as
// trace events. An op's time is the device's: two timing events recorded around it on its
// stream, read once the stream has passed them (no synchronization while profiling, so the
// host still runs ahead of the device as it does unprofiled). Spans come from events too
// (runtime/timeline.h), or, for work a host thread does itself (MPI's communication thread),
// from that thread's clock. Disabled, each op pays one atomic load. In CUDA builds the spans
// and ops are also NVTX ranges, for Nsight Systems.
#ifndef TANDEM_RUNTIME_PROFILER_H_
#define TANDEM_RUNTIME_PROFILER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/stream.h"
#include <memory>

namespace tandem {

// What one op call must do at the least: its floating-point operations (matmuls and
// attention; 0 for memory-bound ops) and the bytes it must move through memory, each input
// read once and each output written once (a read-modify-write counted twice). Over the op's
// time these give its achieved rates, to hold against the machine's peak FLOP/s and memory
// bandwidth.
struct OpCost {
  double flops = 0;
  double bytes = 0;
};

struct OpStat {
  std::string name;
  int64_t count = 0;
  double total_seconds = 0;
  double flops = 0;  // summed over the calls
  double bytes = 0;
  double mean_seconds() const { return count ? total_seconds / count : 0; }
  double flops_per_second() const { return total_seconds > 0 ? flops / total_seconds : 0; }
  double bytes_per_second() const { return total_seconds > 0 ? bytes / total_seconds : 0; }
};

// One complete event of a Chrome trace ("ph": "X").
struct TraceEvent {
  std::string name;
  std::string category;  // "compute", "comm", "idle", "optimizer"
  double start_us = 0;   // since the profiler's epoch (process start)
  double duration_us = 0;
  int micro_batch = -1;
  int64_t sequence = -1;  // collective sequence number, if any
  int thread = 0;         // lane within a rank: 0 compute, 1 communication
};

// The clock a process's events are on: its TimeOrigin() on the host's monotonic clock
// (steady_clock), which every process of one boot of one host shares. Traces of one domain
// line up exactly; across hosts only an event all ranks leave together aligns them.
struct TraceClock {
  std::string domain;      // the host's boot id; "" if unknown
  double origin_us = -1;   // TimeOrigin() in microseconds of steady_clock's epoch
};

// One process of a Chrome trace: its pid, name, events (not owned) and clock (written as a
// "clock" metadata event where its domain is known).
struct TraceProcess {
  int pid = 0;
  std::string name;
  const std::vector<TraceEvent>* events = nullptr;
  TraceClock clock;
};

class Profiler {
 public:
  static void Enable(bool on);
  static bool enabled() { return enabled_.load(std::memory_order_relaxed); }
  static void Reset();
  // Microseconds since TimeOrigin(), the epoch every event is measured from.
  static double NowUs();
  // This process's clock (TraceClock).
  static TraceClock Clock();
  static void RecordOp(const char* name, double seconds, OpCost cost = {});
  // An op whose time is from `start` to `end`, timing events recorded around it: added to
  // the table once `end` has completed (Collect).
  static void RecordOpEvents(const char* name, OpCost cost, std::unique_ptr<Event> start,
                             std::unique_ptr<Event> end);
  static void RecordEvent(TraceEvent e);
  // Adds the ops whose events have completed to the table; never blocks.
  static void Collect();
  // Ops sorted by total time, largest first; waits for the ops still running first.
  static std::vector<OpStat> OpTable();
  static std::vector<TraceEvent> Events();
  // "op  count  total ms  mean us  share  GFLOP/s  GB/s" lines (the rates blank where the op
  // recorded no cost).
  static std::string FormatOpTable(const std::vector<OpStat>& table);
  // A complete Chrome trace-event file ({"traceEvents": [...]}, one event a line; loads in
  // Perfetto and chrome://tracing) of `events`, as process `pid` named `process_name`, with
  // lanes "compute" (thread 0) and "communication" (thread 1), on this process's Clock().
  static std::string ChromeTrace(const std::vector<TraceEvent>& events, int pid,
                                 const std::string& process_name);
  // The same for several processes, sorted by pid: each one's name and lanes first, then the
  // events of each in turn.
  static std::string ChromeTrace(const std::vector<TraceProcess>& processes);

 private:
  static std::atomic<bool> enabled_;
};

// Times one op, with its cost, into the table when profiling is on.
class OpScope {
 public:
  OpScope(const char* name, Stream& s, OpCost cost = {})
      : name_(name), stream_(&s), on_(Profiler::enabled()), cost_(cost) {
    if (on_) Begin();  // out of line: the disabled path stays one load
  }
  ~OpScope() {
    if (on_) End();
  }

 private:
  void Begin();
  void End();
  const char* name_;
  Stream* stream_;
  bool on_;
  OpCost cost_;
  std::unique_ptr<Event> start_;
};

// Records a span of the calling thread's own work, timed by its clock, as a trace event when
// profiling is on: for host threads that do the work themselves (MPI's communication thread).
class SpanScope {
 public:
  SpanScope(std::string name, const char* category, int micro_batch = -1,
            int64_t sequence = -1, int thread = 0);
  ~SpanScope();

 private:
  TraceEvent e_;
  bool on_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_PROFILER_H_
