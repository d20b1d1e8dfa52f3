// Strategy benchmarks, run under mpirun (see tools/bench.sh): prints one JSON line per
// scenario from rank 0. Scenarios (all CPU workers, gpt-tiny unless said otherwise):
//   data:      tokens/s of data parallelism with overlap on and off and buckets of 1, 4, 25
//              and 100 MB (on one rank this is the single-worker baseline);
//   pipeline:  GPipe, 1F1B and ZB-H1 with M = 1, 4, 8, 16 micro-batches: the measured bubble
//              (time a stage waits on another, over the step's time but the optimizer's,
//              averaged over stages) beside the bubble SimulateSchedule expects replaying
//              each measured step with every F (with its input wait), B and W's own time
//              (the median over the steps), again with each exchange group taking the
//              steps' measured handover (MeasuredHandovers), the median over the steps of
//              each step's measured bubble over each replay, the expectation
//              from each stage's median F, B and W instead, and GPipe's
//              (K - 1) / (M + K - 1) and the schedule's textbook bubble with the measured one
//              over it, with each stage's F, B and W and activation peak; the handover is
//              taken from the same steps the replay replays (handover_source), so the ratio
//              with handovers is near 1 partly by construction: the ratios without them and
//              against the textbook stand beside it;
//   streams:   tokens/s of data parallelism and (on 2 ranks or more) 1F1B with 8
//              micro-batches, in this process's CPU stream mode (TANDEM_CPU_STREAMS): run
//              once per mode to compare them;
//   zero:      every rank's optimizer state bytes (DistributedTrainer::optimizer_state_bytes,
//              after one step) under data parallelism, without ZeRO-1 and with it;
//   handover:  1F1B over every rank with M = 2K: the handover its steps measure
//              (MeasuredHandovers), as compare --plan's cost of a transfer on a pipeline's
//              critical path for CPU workers;
//   hybrid:    on 4 ranks, tokens/s of data parallelism, a 4-stage pipeline and 2 replicas
//              of a 2-stage pipeline (GPipe and 1F1B; 1F1B with ZeRO-1 too), global batch 32,
//              in 3 rounds that run every case in turn (after a warm-up run): one line per
//              case and round.
// Every figure is the median over the measured steps (the first two are excluded).
// The pipeline mode runs every case in STRATEGY_BENCH_ROUNDS rounds (3; each case's line is
// its round with the median ratio to the replay with handovers, with every round's ratios),
// a subset when asked: STRATEGY_BENCH_SCHEDULES=1f1b,zb-h1 and
// STRATEGY_BENCH_MICRO_BATCHES=4,8,16 (comma lists; the warm-up run always runs), and with
// STRATEGY_BENCH_TRACE=DIR writes each case's Chrome trace of its last step, per round and
// rank, to DIR/<schedule>_m<M>[_round<n>]_rank<r>.json (the stream's phases and the
// communication thread's operations). It prints its lines once every round has run: after a
// failure, none.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/mpi_communicator.h"
#include "parallel/distributed.h"
#include "runtime/allocator.h"
#include "runtime/json.h"
#include "runtime/profiler.h"

extern "C" void openblas_set_num_threads(int);

namespace tandem {
namespace {

constexpr int kWarmup = 2, kMeasured = 7;

TrainConfig Tiny(int batch, int micro_batches) {
  TrainConfig c;
  c.model = *ModelPreset("gpt-tiny");
  c.batch = batch;
  c.micro_batches = micro_batches;
  c.synthetic_data = true;
  c.steps = kWarmup + kMeasured;
  c.optimizer.total_steps = c.steps;
  return c;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Measured {
  double step_seconds = 0;
  double bubble_fraction = 0;  // averaged over ranks
  double bubble_seconds = 0;   // averaged over ranks
  double comm_seconds = 0;     // rank 0's medians
  double exposed_seconds = 0;
  double peak_activation_bytes = 0;  // rank 0's peak of requested bytes above the model state
  // Per rank: its peak of requested bytes above the model state, and its median forward, B and W
  // seconds (0 where it ran none).
  std::vector<double> peak_bytes, forward, backward, weight;
  // [measured step][rank]: the seconds of each of the rank's compute actions, in its order.
  std::vector<std::vector<std::vector<double>>> action_seconds;
  // [measured step][rank]: when each of those actions ran (StepTiming::action_times), in
  // microseconds from one moment on the host's clock, the same for every rank.
  std::vector<std::vector<std::vector<StepTiming::ActionTimes>>> action_times;
  // [measured step]: its bubble fraction, averaged over ranks.
  std::vector<double> step_bubbles;
  double last_step_start_us = 0;  // with a trace
};

// The median seconds of the actions of `type` in `steps`; 0 if there are none.
double MedianSeconds(const std::vector<StepTiming>& steps, ActionType type) {
  std::vector<double> v;
  for (const StepTiming& t : steps) {
    for (const auto& [a, seconds] : t.action_seconds) {
      if (a.type == type) v.push_back(seconds);
    }
  }
  return v.empty() ? 0 : Median(v);
}

// Each rank's `mine` on every rank, in rank order.
absl::StatusOr<std::vector<std::vector<double>>> Gather(const std::vector<double>& mine,
                                                        Communicator* comm) {
  const int n = comm->world_size(), k = static_cast<int>(mine.size());
  std::vector<float> slots(n * k, 0.0f);
  for (int i = 0; i < k; ++i) slots[comm->rank() * k + i] = static_cast<float>(mine[i]);
  auto v = Tensor::FromVector(slots, {n * k});
  if (!v.ok()) return v.status();
  auto w = comm->AllReduce(*v);
  if (!w.ok()) return w.status();
  if (absl::Status s = (*w)->Wait(absl::Minutes(1)); !s.ok()) return s;
  std::vector<std::vector<double>> out(k, std::vector<double>(n));
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) out[i][r] = v->data<float>()[r * k + i];
  }
  return out;
}

// Rank 0's present moment on this rank's profiler clock (microseconds since its TimeOrigin()):
// the ranks of one host (as mpirun starts this bench) share its monotonic clock, so times
// taken from it line up across them. Exchanged as a whole microsecond count in two i32 parts
// (31 and 30 bits), which a sum of floats would round.
absl::StatusOr<double> Rank0Now(Communicator* comm) {
  const double origin = TimeOriginMicros();
  const int64_t now = std::llround(origin + Profiler::NowUs());
  constexpr int64_t kHalf = int64_t{1} << 30;
  std::vector<int32_t> slots = {0, 0};
  if (comm->rank() == 0) {
    slots = {static_cast<int32_t>(now / kHalf), static_cast<int32_t>(now % kHalf)};
  }
  auto v = Tensor::FromInts(slots, {2});
  if (!v.ok()) return v.status();
  auto w = comm->AllReduce(*v);
  if (!w.ok()) return w.status();
  if (absl::Status st = (*w)->Wait(absl::Minutes(1)); !st.ok()) return st;
  const int32_t* h = v->data<int32_t>();
  return static_cast<double>(h[0] * kHalf + h[1]) - origin;
}

// With `trace`, m.last_step_start_us is the profiler's clock when the last step began.
absl::StatusOr<Measured> Run(const ParallelConfig& pc, Communicator* comm, bool trace = false) {
  auto t = DistributedTrainer::Create(pc, comm);
  if (!t.ok()) return t.status();
  std::vector<double> seconds, bubbles, bubble_s, comm_s, exposed_s, peaks;
  std::vector<StepTiming> timings;
  double last_step_start_us = 0;
  Allocator* cpu = *GetAllocator(Device::Cpu());
  // The moment every rank's action times count from: Gather's floats keep them to a
  // microsecond for runs under 16 s (2^24 us).
  auto since = Rank0Now(comm);
  if (!since.ok()) return since.status();
  for (int i = 0; i < kWarmup + kMeasured; ++i) {
    StepTiming timing;
    if (trace && i == kWarmup + kMeasured - 1) last_step_start_us = Profiler::NowUs();
    absl::StatusOr<StepReport> r = absl::UnknownError("no step");
    // The requests' peak, not the blocks': a cached block up to twice its request would
    // make a case's peak depend on the cases run before it.
    const int64_t peak = PeakRequestedDuring(*cpu, [&] { r = (*t)->Step(&timing); });
    if (!r.ok()) return r.status();
    if (i < kWarmup) continue;
    seconds.push_back(r->seconds);
    // As launcher/run_report counts it: the share of the step but its optimizer's.
    bubbles.push_back(timing.bubble_seconds / (r->seconds - timing.optimizer_seconds));
    bubble_s.push_back(timing.bubble_seconds);
    comm_s.push_back(timing.comm_seconds);
    exposed_s.push_back(timing.exposed_comm_seconds);
    peaks.push_back(static_cast<double>(peak));
    timings.push_back(std::move(timing));
  }
  // Each rank's median bubble fraction and seconds (averaged), peak, and F, B and W times.
  auto all = Gather({Median(bubbles), Median(bubble_s), Median(peaks),
                     MedianSeconds(timings, ActionType::kForward),
                     MedianSeconds(timings, ActionType::kBackward),
                     MedianSeconds(timings, ActionType::kWeightGradient)},
                    comm);
  if (!all.ok()) return all.status();
  Measured m;
  // Every rank's action times of every measured step, padded to the most any rank has.
  size_t most = 0;
  for (const StepTiming& t : timings) most = std::max(most, t.action_seconds.size());
  auto counts = Gather({static_cast<double>(most)}, comm);
  if (!counts.ok()) return counts.status();
  for (double c : (*counts)[0]) most = std::max(most, static_cast<size_t>(c));
  for (size_t k = 0; k < timings.size(); ++k) {
    const StepTiming& t = timings[k];
    // [0]: the count, [1]: the step's bubble fraction, then the seconds, then each action's
    // wait, resumption and end (a wait and resumption of -1: none).
    constexpr size_t kHead = 2;
    std::vector<double> mine(4 * most + kHead, 0.0);
    mine[0] = static_cast<double>(t.action_seconds.size());
    mine[1] = bubbles[k];
    for (size_t i = 0; i < t.action_seconds.size(); ++i) {
      const StepTiming::ActionTimes& at = t.action_times[i];
      mine[kHead + i] = t.action_seconds[i].second;
      const size_t at_i = kHead + most + 3 * i;
      mine[at_i] = at.wait_us < 0 ? -1 : at.wait_us - *since;
      mine[at_i + 1] = at.resumed_us < 0 ? -1 : at.resumed_us - *since;
      mine[at_i + 2] = at.end_us - *since;
    }
    auto step = Gather(mine, comm);
    if (!step.ok()) return step.status();
    std::vector<std::vector<double>> per_rank(comm->world_size());
    std::vector<std::vector<StepTiming::ActionTimes>> times(comm->world_size());
    double bubble = 0;
    for (int r = 0; r < comm->world_size(); ++r) {
      const size_t n = static_cast<size_t>((*step)[0][r]);
      for (size_t i = 0; i < n; ++i) {
        per_rank[r].push_back((*step)[kHead + i][r]);
        const size_t at_i = kHead + most + 3 * i;
        times[r].push_back({(*step)[at_i][r], (*step)[at_i + 1][r], (*step)[at_i + 2][r]});
      }
      bubble += (*step)[1][r] / comm->world_size();
    }
    m.action_seconds.push_back(std::move(per_rank));
    m.action_times.push_back(std::move(times));
    m.step_bubbles.push_back(bubble);
  }
  m.step_seconds = Median(seconds);
  m.last_step_start_us = last_step_start_us;
  for (int r = 0; r < comm->world_size(); ++r) {
    m.bubble_fraction += (*all)[0][r] / comm->world_size();
    m.bubble_seconds += (*all)[1][r] / comm->world_size();
  }
  m.comm_seconds = Median(comm_s);
  m.exposed_seconds = Median(exposed_s);
  m.peak_activation_bytes = Median(peaks);
  m.peak_bytes = (*all)[2];
  m.forward = (*all)[3];
  m.backward = (*all)[4];
  m.weight = (*all)[5];
  return m;
}

// The handovers of the measured steps (StepHandovers of each of m.action_times): every
// receive whose stream reached its wait no later than its sender's action ended; those it reached
// later waited less than a handover, or not at all. A stream's wait for a receive also waits
// for the groups issued before it, so where an earlier group is late (a send not yet taken)
// that shows in the handover too, as in the step: with 4 stages on 2 cores, whose groups
// wait on time-slicing, the handover's median is longer and the replay with it overshoots.
struct Handovers {
  double median_seconds = 0;  // 0 where there were none
  int count = 0;
};

Handovers MeasuredHandovers(const PipelineSchedule& s, const Measured& m) {
  std::vector<double> seconds;
  for (const auto& step : m.action_times) {
    for (double x : StepHandovers(s, step)) seconds.push_back(x);
  }
  Handovers h;
  h.count = static_cast<int>(seconds.size());
  if (!seconds.empty()) h.median_seconds = Median(seconds);
  return h;
}

// The bubble SimulateSchedule expects of the schedule `s` the steps ran with the stages'
// median F, B and W times (each chunk's alike), transfers taking no time.
absl::StatusOr<double> ExpectedBubble(const PipelineSchedule& s, const Measured& m) {
  ScheduleDurations d;
  for (int st = 0; st < s.stages; ++st) {  // each chunk of a stage alike (its medians)
    d.per_stage.push_back(std::vector<ComputeSeconds>(
        s.chunks, ComputeSeconds{m.forward[st], m.backward[st], m.weight[st]}));
  }
  auto r = SimulateSchedule(s, d);
  if (!r.ok()) return r.status();
  return r->bubble_fraction;
}

// The bubble SimulateSchedule expects of the schedule `s` replaying each measured step with every
// compute action's own time (its forward with its input wait, as StepTiming has it), each
// exchange group taking `handover_seconds`: the median over the steps. Unlike one simulation with
// each stage's median times, this keeps what the steps' spread costs a pipeline (a slow
// action on one stage idles the other), a cost of the machine, not of the runtime.
// With `ratio`, also the median over the steps of each step's measured bubble (averaged over
// ranks) over its replay: the runtime's own waiting, step by step.
absl::StatusOr<double> ReplayedBubble(const PipelineSchedule& s, const Measured& m,
                                      double handover_seconds = 0, double* ratio = nullptr) {
  const int K = s.stages;
  std::vector<double> bubbles;
  for (const auto& step : m.action_seconds) {
    ScheduleDurations d;
    d.handover = handover_seconds;
    d.per_action.resize(K);
    for (int st = 0; st < K; ++st) {
      size_t next = 0;  // the stage's compute actions, in order, take the step's times
      for (const Action& a : s.actions[st]) {
        const bool compute = a.is_compute() && next < step[st].size();
        d.per_action[st].push_back(compute ? step[st][next++] : -1.0);
      }
      if (next != step[st].size()) {
        return absl::InternalError(absl::StrCat("stage ", st, " timed ", step[st].size(),
                                                " compute actions; its schedule has ", next));
      }
    }
    auto r = SimulateSchedule(s, d);
    if (!r.ok()) return r.status();
    bubbles.push_back(r->bubble_fraction);
  }
  if (bubbles.empty()) return 0.0;
  if (ratio != nullptr) {
    std::vector<double> ratios;
    for (size_t k = 0; k < bubbles.size() && k < m.step_bubbles.size(); ++k) {
      if (bubbles[k] > 0) ratios.push_back(m.step_bubbles[k] / bubbles[k]);
    }
    *ratio = ratios.empty() ? 0.0 : Median(ratios);
  }
  return Median(bubbles);
}

// Seconds as milliseconds, one number per rank.
Json Milliseconds(const std::vector<double>& seconds) {
  Json out = Json::array();
  for (double s : seconds) out.push_back(JsonRounded(1e3 * s, 3));
  return out;
}

struct StateBytes {
  int64_t params = 0;             // the model's parameters (one stage: the whole model)
  std::vector<int64_t> per_rank;  // each rank's optimizer state bytes
};

// Every rank's optimizer state, read from a trainer for `pc` after one step.
absl::StatusOr<StateBytes> OptimizerStateBytes(const ParallelConfig& pc, Communicator* comm) {
  auto t = DistributedTrainer::Create(pc, comm);
  if (!t.ok()) return t.status();
  if (auto r = (*t)->Step(); !r.ok()) return r.status();
  const int64_t mine = (*t)->optimizer_state_bytes();
  if (mine > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError("optimizer state over 2 GiB: an i32 sum cannot gather it");
  }
  // Rank r's figure at r, summed over ranks.
  std::vector<int32_t> slots(comm->world_size(), 0);
  slots[comm->rank()] = static_cast<int32_t>(mine);
  auto v = Tensor::FromInts(slots, {comm->world_size()});
  if (!v.ok()) return v.status();
  auto w = comm->AllReduce(*v);
  if (!w.ok()) return w.status();
  if (absl::Status s = (*w)->Wait(absl::Minutes(1)); !s.ok()) return s;
  StateBytes out;
  out.params = (*t)->stage().layout().numel();
  for (int r = 0; r < comm->world_size(); ++r) out.per_rank.push_back(v->data<int32_t>()[r]);
  return out;
}

// Environment variable `name` as a number; `otherwise` where it is unset or not a number.
int EnvInt(const char* name, int otherwise) {
  const char* v = std::getenv(name);
  int n = 0;
  return v != nullptr && absl::SimpleAtoi(v, &n) ? n : otherwise;
}

// Whether `item` is in the comma list of environment variable `name` (true when unset).
bool Selected(const char* name, const std::string& item) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return true;
  const std::string list = std::string(",") + v + ",";
  return list.find("," + item + ",") != std::string::npos;
}

// Writes the trace events from `since_us` on to `path`.
void WriteTrace(const std::string& path, double since_us, int rank) {
  std::vector<TraceEvent> events;
  for (TraceEvent& e : Profiler::Events()) {
    if (e.start_us >= since_us) events.push_back(std::move(e));
  }
  std::ofstream(path) << Profiler::ChromeTrace(events, rank, "rank " + std::to_string(rank));
}

// Prints a failed run's error and sets the exit code `rc`; true if it failed.
bool Failed(const absl::Status& s, int* rc) {
  if (s.ok()) return false;
  std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
  *rc = 1;
  return true;
}

int Main(int argc, char** argv) {
  if (absl::Status s = InitMpi(&argc, &argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  openblas_set_num_threads(1);
  const std::string mode = argc > 1 ? argv[1] : "data";
  int rc = 0;
  {
    auto comm = CreateMpiCommunicator();
    if (!comm.ok()) {
      std::fprintf(stderr, "%s\n", std::string(comm.status().message()).c_str());
      return 1;
    }
    const int world = (*comm)->world_size();
    // One JSON line per measurement (tools/bench_report.py reads them).
    auto emit = [&](const Json& j) {
      if ((*comm)->rank() == 0) std::printf("%s\n", JsonText(j, JsonLayout::kLine).c_str());
      std::fflush(stdout);
    };
    if (mode == "data") {
      const int batch = 16;
      struct Case { const char* name; double bucket_mb; bool overlap; };
      // The first case warms the MPI connections, caches and allocator; it is not reported.
      std::vector<Case> cases = {{"warm-up", 25, true}, {"overlap", 25, true},
                                 {"no-overlap", 25, false}};
      if (world > 1) {
        for (double mb : {1.0, 4.0, 100.0}) cases.push_back({"bucket", mb, true});
        // gpt-tiny's 6.6 MB of gradients in 0.5 MB buckets: 13 buckets to overlap.
        cases.push_back({"13 buckets, overlap", 0.5, true});
        cases.push_back({"13 buckets, no-overlap", 0.5, false});
      }
      for (const Case& k : cases) {
        ParallelConfig pc;
        pc.train = Tiny(batch, 1);
        pc.strategy = StrategyKind::kData;
        pc.overlap = k.overlap;
        pc.bucket_bytes = static_cast<int64_t>(k.bucket_mb * (1 << 20));
        auto m = Run(pc, comm->get());
        if (Failed(m.status(), &rc)) break;
        if (std::string(k.name) == "warm-up") continue;
        emit({{"bench", "data"},
              {"case", k.name},
              {"workers", world},
              {"bucket_mb", JsonNumber(k.bucket_mb)},
              {"overlap", k.overlap},
              {"tokens_per_second",
               JsonRounded(batch * pc.train.model.seq_len / m->step_seconds, 1)},
              {"step_seconds", JsonRounded(m->step_seconds, 6)},
              {"comm_seconds", JsonRounded(m->comm_seconds, 6)},
              {"exposed_comm_seconds", JsonRounded(m->exposed_seconds, 6)}});
      }
    } else if (mode == "pipeline") {
      const char* trace_dir = std::getenv("STRATEGY_BENCH_TRACE");
      // Interleaved with 2 chunks a stage where the model's blocks split into 2K chunks, on
      // micro-batches in multiples of K.
      const int blocks = Tiny(32, 1).model.num_blocks();
      struct Case {
        const char* schedule;
        int chunks;
        int micro_batches;
      };
      std::vector<Case> cases;
      std::vector<PipelineSchedule> schedules;  // each case's, as its trainer makes it
      for (const char* schedule : {"gpipe", "1f1b", "zb-h1", "interleaved"}) {
        const bool interleaved = std::string(schedule) == "interleaved";
        const int chunks = interleaved ? 2 : 1;
        if (interleaved && (world < 2 || world * chunks > blocks)) continue;
        for (int mbs : {1, 4, 8, 16}) {
          if (interleaved && mbs % world != 0) continue;
          if (!Selected("STRATEGY_BENCH_SCHEDULES", schedule) ||
              !Selected("STRATEGY_BENCH_MICRO_BATCHES", std::to_string(mbs))) {
            continue;
          }
          auto made = MakeSchedule(schedule, world, mbs, chunks);
          if (Failed(made.status(), &rc)) break;
          cases.push_back({schedule, chunks, mbs});
          schedules.push_back(*std::move(made));
        }
      }
      auto config = [](const Case& c) {
        ParallelConfig pc;
        pc.train = Tiny(32, c.micro_batches);
        pc.strategy = StrategyKind::kPipeline;
        pc.schedule = c.schedule;
        pc.virtual_stages = c.chunks;
        return pc;
      };
      // A warm-up run, not reported. Then every case once a round, the rounds one after
      // another, so that a slow spell of the host falls on one round of a case rather than on
      // all of them: each case's line is its round with the median ratio to the replay with
      // handovers, with every round's ratios beside it.
      const int rounds = std::max(1, EnvInt("STRATEGY_BENCH_ROUNDS", 3));
      if (rc == 0) (void)Failed(Run(config({"gpipe", 1, 1}), comm->get()).status(), &rc);
      std::vector<std::vector<Json>> lines(cases.size());  // each case's, a line a round
      std::vector<std::vector<double>> ratios(cases.size());  // and its ratio with handovers
      for (int round = 0; round < rounds && rc == 0; ++round) {
        for (size_t i = 0; i < cases.size() && rc == 0; ++i) {
          const Case& c = cases[i];
          const PipelineSchedule& s = schedules[i];
          const char* schedule = c.schedule;
          const int chunks = c.chunks, mbs = c.micro_batches;
          const ParallelConfig pc = config(c);
          if (trace_dir != nullptr) {
            Profiler::Reset();
            Profiler::Enable(true);
          }
          auto m = Run(pc, comm->get(), trace_dir != nullptr);
          if (Failed(m.status(), &rc)) break;
          if (trace_dir != nullptr) {
            Profiler::Enable(false);
            WriteTrace(absl::StrCat(trace_dir, "/", schedule, "_m", mbs,
                                    rounds > 1 ? absl::StrCat("_round", round + 1) : "",
                                    "_rank", (*comm)->rank(), ".json"),
                       m->last_step_start_us, (*comm)->rank());
          }
          double ratio = 0;
          auto expected = ReplayedBubble(s, *m, 0, &ratio);
          if (Failed(expected.status(), &rc)) break;
          auto medians = ExpectedBubble(s, *m);
          if (Failed(medians.status(), &rc)) break;
          const Handovers handovers = MeasuredHandovers(s, *m);
          double ratio_with = 0;
          auto with_handovers =
              ReplayedBubble(s, *m, handovers.median_seconds, &ratio_with);
          if (Failed(with_handovers.status(), &rc)) break;
          Json peaks = Json::array();
          for (double b : m->peak_bytes) peaks.push_back(JsonRounded(b, 0));
          ratios[i].push_back(ratio_with);
          const double textbook =
              std::string(schedule) != "zb-h1"
                  ? double(world - 1) / (chunks * mbs + world - 1)
              : mbs >= world ? double(world - 1) / (3 * mbs + world - 1)
                             : 0;  // 0: none (ZB-H1 below M = K)
          lines[i].push_back(Json{
              {"bench", "pipeline"},
              {"schedule", schedule},
              {"stages", world},
              {"virtual_stages", chunks},
              {"micro_batches", mbs},
              {"bubble_measured", JsonRounded(m->bubble_fraction, 4)},
              {"bubble_expected", JsonRounded(*expected, 4)},
              {"bubble_expected_medians", JsonRounded(*medians, 4)},
              {"bubble_ratio_by_step", JsonRounded(ratio, 4)},
              {"handover_ms", JsonRounded(1e3 * handovers.median_seconds, 3)},
              {"handovers", handovers.count},
              {"bubble_expected_with_handovers", JsonRounded(*with_handovers, 4)},
              {"bubble_ratio_with_handovers", JsonRounded(ratio_with, 4)},
              // The handover is the median over the receives of these same steps, the ones
              // the replay replays: a ratio with handovers near 1 is partly so by
              // construction. Beside it, the measured bubble over the replay without them
              // (bubble_ratio_by_step) and over the textbook formula.
              {"handover_source", "the same steps"},
              {"bubble_gpipe", JsonRounded(double(world - 1) / (mbs + world - 1), 4)},
              // The schedule's own textbook bubble with equal F, B and W: (K-1)/(vM+K-1)
              // (v = 1: GPipe's and 1F1B's), ZB-H1's (K-1)/(3M+K-1) (from M = K on).
              {"bubble_textbook", textbook > 0 ? JsonRounded(textbook, 4) : Json()},
              {"bubble_ratio_textbook",
               textbook > 0 ? JsonRounded(m->bubble_fraction / textbook, 4) : Json()},
              {"traced", trace_dir != nullptr},
              {"bubble_ms", JsonRounded(1e3 * m->bubble_seconds, 3)},
              {"forward_ms", Milliseconds(m->forward)},
              {"backward_ms", Milliseconds(m->backward)},
              {"weight_ms", Milliseconds(m->weight)},
              {"step_seconds", JsonRounded(m->step_seconds, 6)},
              {"tokens_per_second",
               JsonRounded(pc.train.batch * pc.train.model.seq_len / m->step_seconds, 1)},
              {"stage0_peak_activation_bytes", JsonRounded(m->peak_activation_bytes, 0)},
              {"peak_activation_bytes", peaks}});
        }
      }
      for (size_t i = 0; i < lines.size() && rc == 0; ++i) {
        const std::vector<Json>& each = lines[i];
        // The round with the median ratio (Median's: the upper of two middles), ties in
        // round order.
        std::vector<size_t> order(each.size());
        for (size_t k = 0; k < order.size(); ++k) order[k] = k;
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return ratios[i][a] < ratios[i][b]; });
        Json line = each[order[order.size() / 2]];
        line["rounds"] = static_cast<int>(each.size());
        for (const char* key : {"bubble_ratio_by_step", "bubble_ratio_with_handovers",
                                "bubble_ratio_textbook"}) {
          Json all = Json::array();
          for (const Json& j : each) all.push_back(j[key]);
          line[absl::StrCat(key, "_rounds")] = all;
        }
        emit(line);
      }
    } else if (mode == "streams") {
      const char* streams = CpuStreamModeName(DefaultCpuStreamMode());
      // The first run warms up and is not reported.
      for (const char* strategy : {"warm-up", "data", "pipeline"}) {
        const bool pipeline = std::string(strategy) == "pipeline";
        if (pipeline && world < 2) continue;
        ParallelConfig pc;
        pc.train = Tiny(pipeline ? 32 : 16, pipeline ? 8 : 1);
        pc.strategy = pipeline ? StrategyKind::kPipeline : StrategyKind::kData;
        pc.schedule = "1f1b";
        auto m = Run(pc, comm->get());
        if (Failed(m.status(), &rc)) break;
        if (std::string(strategy) == "warm-up") continue;
        emit({{"bench", "streams"},
              {"cpu_streams", streams},
              {"strategy", strategy},
              {"workers", world},
              {"tokens_per_second",
               JsonRounded(pc.train.batch * pc.train.model.seq_len / m->step_seconds, 1)},
              {"step_seconds", JsonRounded(m->step_seconds, 6)}});
      }
    } else if (mode == "zero") {
      for (int zero : {0, 1}) {
        ParallelConfig pc;
        pc.train = Tiny(16, 1);
        pc.strategy = StrategyKind::kData;
        pc.zero = zero;
        auto bytes = OptimizerStateBytes(pc, comm->get());
        if (Failed(bytes.status(), &rc)) break;
        Json per_rank = Json::array();
        for (int64_t b : bytes->per_rank) per_rank.push_back(b);
        emit({{"bench", "zero"},
              {"workers", world},
              {"zero", zero},
              {"params", bytes->params},
              {"optimizer_state_bytes", per_rank}});
      }
    } else if (mode == "hybrid") {
      if (world != 4) {
        if ((*comm)->rank() == 0) {
          std::fprintf(stderr, "strategy_bench hybrid runs on 4 ranks, not %d\n", world);
        }
        rc = 2;
      }
      struct Case { const char* name; StrategyKind strategy; int replicas, micro_batches, zero;
                    const char* schedule; };
      // Micro-batches of 4 rows in every pipeline: 32 = 8 x 4, and 2 replicas x 4 x 4.
      const std::vector<Case> cases = {
          {"data parallel", StrategyKind::kData, 4, 1, 0, "gpipe"},
          {"4 stages", StrategyKind::kPipeline, 1, 8, 0, "gpipe"},
          {"4 stages", StrategyKind::kPipeline, 1, 8, 0, "1f1b"},
          {"2 replicas x 2 stages", StrategyKind::kPipeline, 2, 4, 0, "gpipe"},
          {"2 replicas x 2 stages", StrategyKind::kPipeline, 2, 4, 0, "1f1b"},
          {"2 replicas x 2 stages, ZeRO-1", StrategyKind::kPipeline, 2, 4, 1, "1f1b"}};
      // Round 0 runs the first case only, to warm up, and is not reported.
      for (int round = 0; round <= 3 && rc == 0; ++round) {
        for (size_t i = 0; i < (round == 0 ? 1 : cases.size()); ++i) {
          const Case& k = cases[i];
          ParallelConfig pc;
          pc.train = Tiny(32, k.micro_batches);
          pc.strategy = k.strategy;
          pc.schedule = k.schedule;
          pc.data_parallel = k.strategy == StrategyKind::kData ? 1 : k.replicas;
          pc.zero = k.zero;
          auto m = Run(pc, comm->get());
          if (Failed(m.status(), &rc)) break;
          if (round == 0) continue;
          emit({{"bench", "hybrid"},
                {"case", k.name},
                {"round", round},
                {"workers", world},
                {"replicas", k.replicas},
                {"stages", world / k.replicas},
                {"schedule", k.strategy == StrategyKind::kData ? "" : k.schedule},
                {"micro_batches", k.micro_batches},
                {"zero", k.zero},
                {"tokens_per_second",
                 JsonRounded(32 * pc.train.model.seq_len / m->step_seconds, 1)},
                {"step_seconds", JsonRounded(m->step_seconds, 6)},
                {"bubble_measured", JsonRounded(m->bubble_fraction, 4)}});
        }
      }
    } else if (mode == "tensor") {
      // Tensor parallelism over every rank, with sequence parallelism and without, against
      // data parallelism on the same ranks; on 4 also T=2 beside 2 replicas and 2 stages.
      struct Case { std::string name; StrategyKind strategy; int tensors, micro_batches;
                    bool sequence; };
      std::vector<Case> cases = {
          {"data parallel", StrategyKind::kData, 1, 1, false},
          {absl::StrFormat("T=%d", world), StrategyKind::kData, world, 1, false},
          {absl::StrFormat("T=%d, sequence parallel", world), StrategyKind::kData, world, 1,
           true}};
      if (world == 4) {
        cases.push_back({"T=2 x 2 replicas", StrategyKind::kData, 2, 1, false});
        cases.push_back({"T=2 x 2 stages 1F1B", StrategyKind::kPipeline, 2, 4, false});
      }
      for (int round = 0; round <= 3 && rc == 0; ++round) {
        for (size_t i = 0; i < (round == 0 ? 1 : cases.size()); ++i) {
          const Case& k = cases[i];
          ParallelConfig pc;
          pc.train = Tiny(32, k.micro_batches);
          pc.strategy = k.strategy;
          pc.schedule = "1f1b";
          pc.tensor_parallel = k.tensors;
          pc.sequence_parallel = k.sequence;
          auto m = Run(pc, comm->get());
          if (Failed(m.status(), &rc)) break;
          if (round == 0) continue;
          auto layout = ResolveLayout(pc, world);
          if (Failed(layout.status(), &rc)) break;
          const MemoryNeed& need = layout->memory[0];
          emit({{"bench", "tensor"},
                {"case", k.name},
                {"round", round},
                {"workers", world},
                {"tensors", k.tensors},
                {"sequence_parallel", k.sequence},
                {"tokens_per_second",
                 JsonRounded(32 * pc.train.model.seq_len / m->step_seconds, 1)},
                {"step_seconds", JsonRounded(m->step_seconds, 6)},
                {"peak_activation_bytes", m->peak_activation_bytes},
                {"estimated_activation_bytes", need.activations + need.workspace}});
        }
      }
    } else if (mode == "handover") {
      // 1F1B over every rank, M = 2K: the handover its steps measure (compare --plan's
      // per-transfer cost for CPU workers, with the activation's bytes it carried).
      if (world < 2) {
        if ((*comm)->rank() == 0) {
          std::fprintf(stderr, "strategy_bench handover needs 2 ranks or more\n");
        }
        rc = 2;
      } else {
        // A batch of about 32 that the M micro-batches divide.
        const int M = 2 * world;
        ParallelConfig pc;
        pc.train = Tiny(std::max(1, (32 + M / 2) / M) * M, M);
        pc.strategy = StrategyKind::kPipeline;
        pc.schedule = "1f1b";
        auto s = MakeSchedule(pc.schedule, world, M);
        auto m = s.ok() ? Run(pc, comm->get()) : absl::StatusOr<Measured>(s.status());
        if (!Failed(m.status(), &rc)) {
          const Handovers h = MeasuredHandovers(*s, *m);
          const TrainConfig& t = pc.train;
          emit({{"bench", "handover"},
                {"workers", world},
                {"schedule", pc.schedule},
                {"micro_batches", t.micro_batches},
                {"bytes", t.batch / t.micro_batches * t.model.seq_len * t.model.d_model *
                              static_cast<int64_t>(DTypeSize(t.dtype))},
                {"handover_s", JsonRounded(h.median_seconds, 7)},
                {"handovers", h.count}});
        }
      }
    } else {
      std::fprintf(stderr,
                   "usage: strategy_bench data|pipeline|streams|zero|hybrid|tensor|handover "
                   "(under mpirun)\n");
      rc = 2;
    }
  }
  (void)FinalizeMpi();
  return rc;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
