#include "runtime/profiler.h"

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_format.h"
#include "runtime/files.h"
#include "runtime/host_sync.h"
#include "runtime/json.h"

#if TANDEM_CUDA
// NVTX ranges let Nsight Systems show the same spans on its CUDA timeline; without a tool
// attached a push or pop costs a few nanoseconds.
#include <nvtx3/nvToolsExt.h>
#endif

namespace tandem {
namespace {

struct PendingOp {
  const char* name;
  OpCost cost;
  std::unique_ptr<Event> start, end;
};

struct State {
  std::mutex mu;
  std::map<std::string, OpStat> ops;
  std::vector<TraceEvent> events;
  std::deque<PendingOp> pending;  // in issue order
};

State& S() {
  static State* s = new State();
  return *s;
}

}  // namespace

std::atomic<bool> Profiler::enabled_{false};

void Profiler::Enable(bool on) { enabled_.store(on); }

void Profiler::Reset() {
  std::lock_guard<std::mutex> lock(S().mu);
  S().ops.clear();
  S().events.clear();
  S().pending.clear();
}

TraceClock Profiler::Clock() {
  TraceClock c;
  c.domain = BootId();
  if (!c.domain.empty()) {
    c.origin_us = TimeOriginMicros();
  }
  return c;
}

double Profiler::NowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                   TimeOrigin())
      .count();
}

namespace {

void AddOpLocked(const char* name, double seconds, OpCost cost) {
  OpStat& st = S().ops[name];
  st.name = name;
  st.count++;
  st.total_seconds += seconds;
  st.flops += cost.flops;
  st.bytes += cost.bytes;
}

// Moves the pending ops whose end event has completed into the table, in issue order (the
// first one still running stops the pass); returns that one's end event, or null.
Event* CollectLocked() {
  while (!S().pending.empty()) {
    PendingOp& op = S().pending.front();
    absl::StatusOr<bool> done = op.end->Query();
    if (done.ok() && !*done) return op.end.get();
    absl::StatusOr<float> ms = op.end->ElapsedMsSince(*op.start);
    if (ms.ok()) AddOpLocked(op.name, *ms * 1e-3, op.cost);
    S().pending.pop_front();
  }
  return nullptr;
}

}  // namespace

void Profiler::RecordOp(const char* name, double seconds, OpCost cost) {
  std::lock_guard<std::mutex> lock(S().mu);
  AddOpLocked(name, seconds, cost);
}

void Profiler::RecordOpEvents(const char* name, OpCost cost, std::unique_ptr<Event> start,
                              std::unique_ptr<Event> end) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().pending.push_back(PendingOp{name, cost, std::move(start), std::move(end)});
  CollectLocked();
}

void Profiler::Collect() {
  std::lock_guard<std::mutex> lock(S().mu);
  CollectLocked();
}

void Profiler::RecordEvent(TraceEvent e) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().events.push_back(std::move(e));
}

std::vector<OpStat> Profiler::OpTable() {
  // The ops still running are waited for with no lock held (the threads doing the work may
  // record spans meanwhile), and by polling: an error of their stream is its user's to hear.
  bool waited = false;
  for (;;) {
    Event* running;
    {
      std::lock_guard<std::mutex> lock(S().mu);
      running = CollectLocked();
    }
    if (running == nullptr) break;
    if (!waited) HostSync::Record("Profiler::OpTable");
    waited = true;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::vector<OpStat> out;
  {
    std::lock_guard<std::mutex> lock(S().mu);
    for (const auto& [name, st] : S().ops) out.push_back(st);
  }
  std::sort(out.begin(), out.end(),
            [](const OpStat& a, const OpStat& b) { return a.total_seconds > b.total_seconds; });
  return out;
}

std::vector<TraceEvent> Profiler::Events() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().events;
}

std::string Profiler::FormatOpTable(const std::vector<OpStat>& table) {
  double total = 0;
  for (const OpStat& o : table) total += o.total_seconds;
  std::string out = absl::StrFormat("%-26s %8s %11s %10s %6s %10s %8s\n", "op", "count", "total ms",
                                    "mean us", "share", "GFLOP/s", "GB/s");
  const auto rate = [](double per_second) {
    return per_second > 0 ? absl::StrFormat("%.1f", per_second * 1e-9) : std::string("-");
  };
  for (const OpStat& o : table) {
    out += absl::StrFormat("%-26s %8d %11.2f %10.1f %5.1f%% %10s %8s\n", o.name, o.count,
                           o.total_seconds * 1e3, o.mean_seconds() * 1e6,
                           total > 0 ? 100 * o.total_seconds / total : 0.0,
                           rate(o.flops_per_second()), rate(o.bytes_per_second()));
  }
  return out;
}

std::string Profiler::ChromeTrace(const std::vector<TraceEvent>& events, int pid,
                                  const std::string& process_name) {
  return ChromeTrace({TraceProcess{pid, process_name, &events, Clock()}});
}

std::string Profiler::ChromeTrace(const std::vector<TraceProcess>& processes) {
  Json events = Json::array();
  auto metadata = [&](const char* name, int pid, int tid, Json args) {
    Json e = {{"ph", "M"}, {"name", name}, {"pid", pid}};
    if (tid >= 0) e["tid"] = tid;
    e["args"] = std::move(args);
    events.push_back(std::move(e));
  };
  for (const TraceProcess& p : processes) {
    metadata("process_name", p.pid, -1, {{"name", p.name}});
    metadata("process_sort_index", p.pid, -1, {{"sort_index", p.pid}});
    metadata("thread_name", p.pid, 0, {{"name", "compute"}});
    metadata("thread_name", p.pid, 1, {{"name", "communication"}});
    if (!p.clock.domain.empty()) {
      metadata("clock", p.pid, -1,
               {{"domain", p.clock.domain}, {"origin_us", JsonRounded(p.clock.origin_us, 3)}});
    }
  }
  for (const TraceProcess& p : processes) {
    for (const TraceEvent& e : *p.events) {
      events.push_back({{"ph", "X"},
                        {"name", e.name},
                        {"cat", e.category},
                        {"pid", p.pid},
                        {"tid", e.thread},
                        {"ts", JsonRounded(e.start_us, 3)},  // to the nanosecond
                        {"dur", JsonRounded(e.duration_us, 3)},
                        {"args", {{"micro_batch", e.micro_batch}, {"sequence", e.sequence}}}});
    }
  }
  return JsonText(Json{{"traceEvents", std::move(events)}}, JsonLayout::kRows) + "\n";
}

void OpScope::Begin() {
  // The op's time on its stream: from an event before it to one after it, so work queued
  // before it (copies, fills) is not counted, and the host does not wait.
  absl::StatusOr<std::unique_ptr<Event>> start = Event::Create(stream_->device(), true);
  if (start.ok() && (*start)->Record(*stream_).ok()) start_ = std::move(*start);
#if TANDEM_CUDA
  nvtxRangePushA(name_);
#endif
}

void OpScope::End() {
#if TANDEM_CUDA
  nvtxRangePop();
#endif
  if (start_ == nullptr) return;
  absl::StatusOr<std::unique_ptr<Event>> end = Event::Create(stream_->device(), true);
  if (!end.ok() || !(*end)->Record(*stream_).ok()) return;
  Profiler::RecordOpEvents(name_, cost_, std::move(start_), std::move(*end));
}

SpanScope::SpanScope(std::string name, const char* category, int micro_batch,
                     int64_t sequence, int thread)
    : on_(Profiler::enabled()) {
  if (!on_) return;
  e_.name = std::move(name);
  e_.category = category;
  e_.micro_batch = micro_batch;
  e_.sequence = sequence;
  e_.thread = thread;
  e_.start_us = Profiler::NowUs();
#if TANDEM_CUDA
  if (thread == 0) nvtxRangePushA(e_.name.c_str());  // the compute lane's spans nest
#endif
}

SpanScope::~SpanScope() {
  if (!on_) return;
#if TANDEM_CUDA
  if (e_.thread == 0) nvtxRangePop();
#endif
  e_.duration_us = Profiler::NowUs() - e_.start_us;
  Profiler::RecordEvent(std::move(e_));
}

}  // namespace tandem
