// The block profile: each block's measured forward, input-gradient and weight-gradient
// times, the optimizer's seconds per parameter, the step overhead and the finish spread; how
// the block times scale with a micro-batch's rows (BlocksAt, MicroBatchRows); measured here,
// derived from FLOPs for hardware not here, or read from and written to a file.
#include "planner/planner.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <time.h>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "model/block.h"
#include "model/optimizer.h"
#include "model/trainer.h"
#include "runtime/files.h"
#include "runtime/json.h"
#include "runtime/status.h"
#include "runtime/stream.h"
#include "runtime/timeline.h"

namespace tandem {

std::vector<BlockTime> BlockProfile::BlocksAt(double r) const {
  std::map<int, const std::vector<BlockTime>*> at = {{rows, &blocks}};
  for (const auto& [n, times] : more_rows) at.emplace(n, &times);
  if (auto it = at.find(static_cast<int>(r)); it != at.end() && it->first == r) {
    return *it->second;
  }
  std::vector<BlockTime> out = blocks;
  if (at.size() == 1) {
    for (BlockTime& t : out) {
      t.forward *= r / rows;
      t.backward *= r / rows;
      t.weight *= r / rows;
    }
    return out;
  }
  // The two measured row counts around r, or the nearest two beyond the measured ones.
  auto hi = at.upper_bound(static_cast<int>(std::floor(r)));
  if (hi == at.begin()) ++hi;
  if (hi == at.end()) --hi;
  const auto lo = std::prev(hi);
  const double f = (r - lo->first) / (hi->first - lo->first);
  auto line = [&](double a, double b) { return std::max(0.0, a + (b - a) * f); };
  for (size_t b = 0; b < out.size(); ++b) {
    const BlockTime &x = lo->second->at(b), &y = hi->second->at(b);
    out[b].forward = line(x.forward, y.forward);
    out[b].backward = line(x.backward, y.backward);
    out[b].weight = line(x.weight, y.weight);
  }
  return out;
}

std::vector<int> MicroBatchRows(int batch, int gpus) {
  const int first = std::max(1, batch / gpus);
  std::vector<int> out = {first};
  for (int K = 1; K <= gpus; ++K) {
    if (gpus % K != 0 || batch % (gpus / K) != 0) continue;
    const int replica_batch = batch / (gpus / K);
    for (int m = 1; m <= replica_batch; ++m) {
      // As MakePlan enumerates M: a pipeline's from 2 to 8K, the model-parallel split's 1.
      if (K > 1 && m > 8 * K) break;
      const int rows = replica_batch / m;
      if (replica_batch % m == 0 && std::find(out.begin(), out.end(), rows) == out.end()) {
        out.push_back(rows);
      }
    }
  }
  std::sort(out.begin() + 1, out.end(), std::greater<int>());
  return out;
}

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `peers` threads computing the blocks of `model` at `rows` rows over and over (BlockPasses,
// each thread on an immediate CPU stream of its own, so it computes on its own thread as a
// worker does) until the object goes, beside a timing: the timed blocks then share the caches
// and memory bandwidth with as many computing neighbours as a run's. Made once every thread
// has run its first pass, so the timing sees them computing from its start.
class BlockLoad {
 public:
  static absl::StatusOr<std::unique_ptr<BlockLoad>> Start(const ModelConfig& model,
                                                          Device device, DType compute,
                                                          int rows, uint64_t seed, int peers) {
    auto load = std::make_unique<BlockLoad>();
    BlockLoad* l = load.get();
    for (int i = 0; i < peers; ++i) {
      l->threads_.emplace_back([l, model, device, compute, rows, seed, i] {
        std::unique_ptr<Stream> s = Stream::CreateCpu(CpuStreamMode::kImmediate);
        absl::StatusOr<std::unique_ptr<BlockPasses>> passes =
            BlockPasses::Create(model, device, compute, rows, seed + 1 + i);
        absl::Status status = passes.status();
        for (bool first = true; status.ok() && (first || !l->stop_); first = false) {
          status = (*passes)->Run(*s, nullptr);
          if (first) {
            absl::MutexLock lock(&l->mu_);  // Start waits on started_ and status_ under mu_
            ++l->started_;
            l->status_.Update(status);  // keeps the first error
          }
        }
        absl::MutexLock lock(&l->mu_);
        l->status_.Update(status);  // keeps the first error
      });
    }
    absl::MutexLock lock(&l->mu_);
    auto ready = [l, peers] { return !l->status_.ok() || l->started_ == peers; };
    l->mu_.Await(absl::Condition(&ready));
    if (!l->status_.ok()) return l->status_;
    return load;
  }
  // Stops the threads; an error any of them met, so that a timing is never reported as
  // beside threads that did not compute.
  absl::Status Stop() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    absl::MutexLock lock(&mu_);
    return status_;
  }
  ~BlockLoad() { Stop().IgnoreError(); }

 private:
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// Each part's median over `rounds` (each a timing of every block).
std::vector<BlockTime> MedianTimes(const std::vector<std::vector<BlockTime>>& rounds) {
  std::vector<BlockTime> m = rounds.at(0);
  for (size_t i = 0; i < m.size(); ++i) {
    std::vector<double> f, b, w;
    for (const std::vector<BlockTime>& r : rounds) {
      f.push_back(r[i].forward);
      b.push_back(r[i].backward);
      w.push_back(r[i].weight);
    }
    m[i].forward = Median(f);
    m[i].backward = Median(b);
    m[i].weight = Median(w);
  }
  return m;
}

}  // namespace

double FinishBehindSharing(const std::vector<double>& wall, const std::vector<double>& cpu,
                           int cores) {
  if (wall.empty() || wall.size() != cpu.size() || cores < 1) return 0;
  const double shared = std::max(std::accumulate(cpu.begin(), cpu.end(), 0.0) / cores,
                                 *std::max_element(cpu.begin(), cpu.end()));
  const double last = *std::max_element(wall.begin(), wall.end());
  return shared > 0 ? std::max(0.0, last / shared - 1) : 0;
}

namespace {

// `threads` threads computing one pass of the blocks each (BlockPasses at `rows`, each on an
// immediate CPU stream of its own, as BlockLoad's), all started at once: each Round() how far
// the slowest pass ends behind the end of perfect sharing, as a share of it (the caller
// discards the rounds that warm up). Perfect sharing ends when the threads' CPU time, spread
// evenly over the host's cores, has run (and no sooner than the longest thread's own): what a
// step with a core each and the cores shared evenly (SharedCoresStep) takes.
// Workers that compute alike on shared cores finish apart, and a step waits for the last of
// them at its collectives. Each thread's time runs from its own start (its pass's
// timeline): timed from the round's common start instead, which adds how late the scheduler
// starts each thread, four runs gave 10.4%, 15.2%, 5.5% and 5.1% on 4 threads over 2 cores.
// Measured against the threads' mean end instead, a round in which one thread happened to
// keep a core to itself (ending at about half the others' time) counted the rest as
// lagging: ends at 42, 62, 82 and 88 ms were 29% after their mean, 5% after perfect sharing
// (84 ms for 167 ms of CPU on 2 cores), so the median swung from 8% to 23% from run to run
// on 4 threads over 2 cores; against perfect sharing those rounds count what they cost. The
// threads run one BLAS thread each (as CPU workers do): a BLAS helper thread's CPU time
// would not be counted.
class FinishSpread {
 public:
  static absl::StatusOr<std::unique_ptr<FinishSpread>> Create(const ModelConfig& model,
                                                              Device device, DType compute,
                                                              int rows, uint64_t seed,
                                                              int threads) {
    std::unique_ptr<FinishSpread> f(new FinishSpread);
    f->cores_ = std::max(1, std::min(threads, HostCpus()));
    for (int i = 0; i < threads; ++i) {
      ASSIGN_OR_RETURN(std::unique_ptr<BlockPasses> p,
                       BlockPasses::Create(model, device, compute, rows, seed + 1 + i));
      f->passes_.push_back(std::move(p));
      f->streams_.push_back(Stream::CreateCpu(CpuStreamMode::kImmediate));
    }
    return f;
  }

  absl::StatusOr<double> Round() {
    const int threads = static_cast<int>(passes_.size());
    std::vector<double> seconds(threads, 0), cpu(threads, 0);
    std::vector<absl::Status> status(threads);
    absl::Notification go;
    std::vector<std::thread> workers;
    for (int i = 0; i < threads; ++i) {
      workers.emplace_back([&, i] {
        go.WaitForNotification();
        const double cpu_start = CpuNow();
        absl::StatusOr<StreamTimeline> timeline = StreamTimeline::Start(*streams_[i]);
        status[i] = timeline.status();
        if (!status[i].ok()) return;
        status[i] = passes_[i]->Run(*streams_[i], &*timeline);
        cpu[i] = CpuNow() - cpu_start;  // the pass ran on this thread (an immediate stream)
        if (!status[i].ok()) return;
        absl::StatusOr<float> ms = timeline->end().ElapsedMsSince(timeline->start());
        status[i] = ms.status();
        if (ms.ok()) seconds[i] = 1e-3 * *ms;
      });
    }
    go.Notify();
    for (std::thread& w : workers) w.join();
    for (const absl::Status& st : status) RETURN_IF_ERROR(st);
    return FinishBehindSharing(seconds, cpu, cores_);
  }

 private:
  FinishSpread() = default;
  // This thread's CPU time, in seconds.
  static double CpuNow() {
    timespec t{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return 0.0;
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  int cores_ = 1;
  std::vector<std::unique_ptr<BlockPasses>> passes_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

// One optimizer step over `n` parameters on stream `s`, timed as the blocks are (the median
// of three after a warm-up; its state freed before it returns), per parameter.
absl::StatusOr<double> OptimizerSecondsPerParam(int64_t n, absl::string_view optimizer,
                                                Device device, Stream& s) {
  OptimizerConfig oc;
  oc.kind = std::string(optimizer);
  ASSIGN_OR_RETURN(Optimizer opt, Optimizer::Create(oc, n, device));
  ASSIGN_OR_RETURN(Tensor params, Tensor::FromVector(std::vector<float>(n, 0.5f), {n}, device));
  ASSIGN_OR_RETURN(Tensor grads, Tensor::FromVector(std::vector<float>(n, 1e-3f), {n}, device));
  std::vector<double> runs;
  for (int r = 0; r < 4; ++r) {  // the first is a warm-up
    ASSIGN_OR_RETURN(StreamTimeline timeline, StreamTimeline::Start(s));
    RETURN_IF_ERROR(opt.Step(s, params, grads, r, 1.0f));
    RETURN_IF_ERROR(timeline.Mark(0, "optimizer"));
    RETURN_IF_ERROR(s.Synchronize());
    ASSIGN_OR_RETURN(std::vector<StreamTimeline::Phase> phases, timeline.Phases());
    if (r > 0) runs.push_back(phases.at(0).seconds);
  }
  return Median(runs) / n;
}

}  // namespace

absl::StatusOr<BlockProfile> MeasureBlockProfile(const ModelConfig& model, Device device,
                                                 DType compute, const std::vector<int>& rows,
                                                 absl::string_view optimizer, uint64_t seed,
                                                 int peers, int crowd) {
  if (rows.empty()) return absl::InvalidArgumentError("timing blocks needs a row count");
  if (peers < 0 || (peers > 0 && !device.is_cpu())) {
    return absl::InvalidArgumentError("blocks are timed beside 0 or more CPU threads");
  }
  if (crowd == 1 || crowd < 0 || (crowd > 0 && !device.is_cpu())) {
    return absl::InvalidArgumentError("the finish spread is timed over 2 or more CPU threads");
  }
  BlockProfile p;
  p.model = model.ToString();
  p.device = device.ToString();
  std::string name;
  int major = 0, minor = 0;
  if (device.is_cuda() && CudaDeviceIdentity(device.index(), &name, &major, &minor)) {
    p.device = name;
  }
  p.dtype = DTypeName(compute);
  p.rows = rows[0];
  p.peers = peers;
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(device));
  // Beside peers every thread computes on a stream of its own (the compute stream's memory
  // would be handed from one thread to another with work still queued on it).
  std::unique_ptr<Stream> own;
  if (peers > 0) {
    RETURN_IF_ERROR(s->Synchronize());
    own = Stream::CreateCpu(CpuStreamMode::kImmediate);
  }
  Stream& timed_on = peers > 0 ? *own : *s;
  const int64_t n = model.num_params();
  ASSIGN_OR_RETURN(p.optimizer_per_param, OptimizerSecondsPerParam(n, optimizer, device, *s));
  // The step overhead: a one-worker step (Trainer, one micro-batch of rows[0]) against its
  // blocks and optimizer, two steps in each round right after the blocks at rows[0] are timed
  // alone, the median of the rounds' differences: a difference of two timings, so each round
  // pairs them in time (nine steps timed after all the rounds took 25 ms over the blocks in
  // one of three profiles of gpt-tiny on 2 workers here, 0 in the others).
  TrainConfig tc;
  tc.model = model;
  tc.optimizer.kind = std::string(optimizer);
  tc.dtype = compute;
  tc.device = device;
  tc.batch = rows[0];
  tc.seed = seed;
  tc.synthetic_data = true;
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(tc));
  for (int i = 0; i < 2; ++i) RETURN_IF_ERROR(trainer->Step().status());  // warm-up
  // Rounds over the row counts, each part's median kept. Not the fastest: a run's step is
  // its mean, and this host's speed varies by tens of percent from second to second, so the
  // fastest timings are from its fast moments, which a run's mean is not (the fastest
  // predicted every layout's step 15-35% short). Rounds spread each row count's timings
  // over the measurement, so a slow spell weighs on every row count alike.
  // Beside peers, the blocks at rows[0] are timed alone too: the step overhead is a step's
  // time outside them, and that step runs alone.
  // With a crowd, four rounds of its finish spread end each round, the first warming up
  // again, the median of the rest kept: spread over the profile as the blocks' timings are
  // (seven rounds at once, under a second, gave 0.2% to 6.7% for 2 threads in nine profiles
  // here, 1.3% to 9.4% for 4 in four; without the warm-up after the round's other work, four
  // profiles gave 0.2% to 4.4%, and four with it 0.3% to 2.6%).
  constexpr int kRounds = 5;
  std::map<int, std::vector<std::vector<BlockTime>>> at;
  std::vector<double> overheads, spreads;
  std::unique_ptr<FinishSpread> spread;
  if (crowd > 0) {
    ASSIGN_OR_RETURN(spread, FinishSpread::Create(model, device, compute, rows[0], seed, crowd));
  }
  for (int round = 0; round < kRounds; ++round) {
    for (int r : rows) {
      absl::StatusOr<std::vector<BlockTime>> times;
      {
        ASSIGN_OR_RETURN(std::unique_ptr<BlockLoad> load,
                         BlockLoad::Start(model, device, compute, r, seed, peers));
        times = MeasureBlockTimes(model, device, compute, r, seed, timed_on);
        RETURN_IF_ERROR(load->Stop());
      }
      RETURN_IF_ERROR(times.status());
      at[r].push_back(*std::move(times));
    }
    std::vector<BlockTime> alone;
    if (peers > 0) {
      ASSIGN_OR_RETURN(alone, MeasureBlockTimes(model, device, compute, rows[0], seed, *own));
    }
    double step = 0;
    for (int i = 0; i < 2; ++i) {
      ASSIGN_OR_RETURN(StepReport report, trainer->Step());
      step += report.seconds / 2;
    }
    double parts = p.optimizer_per_param * n;
    for (const BlockTime& t : peers > 0 ? alone : at[rows[0]].back()) parts += t.total();
    overheads.push_back(step - parts);
    for (int i = 0; spread && i < 4; ++i) {  // the first warms up (again)
      ASSIGN_OR_RETURN(double behind, spread->Round());
      if (i > 0) spreads.push_back(behind);
    }
  }
  if (spread) {
    p.finish_spread = Median(spreads);
    p.spread_threads = crowd;
  }
  p.blocks = MedianTimes(at[rows[0]]);
  for (int r : rows) {
    if (r != rows[0]) p.more_rows[r] = MedianTimes(at[r]);
  }
  p.step_overhead = std::max(0.0, Median(overheads));
  p.source = absl::StrFormat("measured on %s at %s rows a micro-batch", p.device,
                             absl::StrJoin(rows, ", "));
  if (peers > 0) absl::StrAppend(&p.source, ", beside ", peers, " threads computing the same");
  return p;
}

absl::StatusOr<BlockProfile> DeriveBlockProfile(const ModelConfig& model, DType compute, int rows,
                                                double tflops, double mfu, double tbps) {
  if (model.kind != ModelKind::kGpt || !(tflops > 0) || !(mfu > 0 && mfu <= 1) || !(tbps > 0)) {
    return absl::InvalidArgumentError(
        "block times from FLOPs need a GPT, a peak > 0, an MFU in (0, 1] and a bandwidth > 0");
  }
  BlockProfile p;
  p.model = model.ToString();
  p.device = absl::StrFormat("%g TFLOP/s, %g TB/s", tflops, tbps);
  p.dtype = DTypeName(compute);
  p.rows = rows;
  const double tokens = double(rows) * model.seq_len, C = model.d_model, T = model.seq_len,
               V = model.vocab, flops = tflops * 1e12 * mfu, bytes = tbps * 1e12;
  const double act = DTypeSize(compute);
  // Embedding: read a row of each table and write the sum; its W reads the gradient and adds
  // into the f32 table gradient.
  p.blocks.push_back({"embed", tokens * 3 * C * act / bytes, 0, tokens * C * (act + 8) / bytes});
  for (int l = 0; l < model.n_layer; ++l) {
    p.blocks.push_back({absl::StrCat("h", l), tokens * (24 * C * C + 4 * T * C) / flops,
                        tokens * (24 * C * C + 8 * T * C) / flops, tokens * 24 * C * C / flops});
  }
  // The head's B computes its dW too (model/blocks.cc): its W is empty.
  const double head = tokens * 2 * C * V / flops;
  p.blocks.push_back({"head", head, 2 * head, 0});
  // AdamW: reads the parameter, gradient and two moments (f32), writes the parameter and the
  // moments: 28 bytes.
  p.optimizer_per_param = 28 / bytes;
  p.source = absl::StrFormat(
      "derived from FLOPs at %.0f%% MFU of %g TFLOP/s and memory traffic at %g TB/s, not "
      "measured",
      100 * mfu, tflops, tbps);
  return p;
}

absl::StatusOr<BlockProfile> ReadBlockProfile(const std::string& path) {
  ASSIGN_OR_RETURN(Json j, ReadJsonFile(path));
  BlockProfile p;
  p.model = StringOr(j, "model", "");
  p.device = StringOr(j, "device", "");
  p.dtype = StringOr(j, "dtype", "f32");
  p.rows = static_cast<int>(NumberOr(j, "rows", 0));
  p.optimizer_per_param = NumberOr(j, "optimizer_seconds_per_param", -1);
  p.source = StringOr(j, "source", "");
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--block-times=%s: %s (write one with bazel run //tools:compare -- --plan "
        "--write-block-times=FILE on the target hardware)",
        path, why));
  };
  if (p.model.empty() || p.rows <= 0 || p.optimizer_per_param < 0) {
    return bad("needs \"model\", \"rows\" > 0 and \"optimizer_seconds_per_param\"");
  }
  const Json blocks = j.contains("blocks") ? j["blocks"] : Json();
  if (!blocks.is_array() || blocks.empty()) return bad("needs a non-empty \"blocks\" array");
  auto ReadBlock = [&](const Json& b) -> absl::StatusOr<BlockTime> {
    BlockTime t{StringOr(b, "name", ""), NumberOr(b, "forward", -1), NumberOr(b, "backward", -1),
                NumberOr(b, "weight", -1)};
    if (t.forward < 0 || t.backward < 0 || t.weight < 0) {
      return bad("each block needs \"forward\", \"backward\" and \"weight\" seconds, >= 0");
    }
    return t;
  };
  for (const Json& b : blocks) {
    ASSIGN_OR_RETURN(BlockTime t, ReadBlock(b));
    p.blocks.push_back(t);
  }
  p.step_overhead = NumberOr(j, "step_overhead_seconds", 0);
  if (!(p.step_overhead >= 0)) return bad("\"step_overhead_seconds\" must be >= 0");
  const double peers = NumberOr(j, "timed_beside_threads", 0);
  if (!(peers >= 0 && peers <= 4096 && peers == std::floor(peers))) {
    return bad("\"timed_beside_threads\" must be a whole number from 0 to 4096");
  }
  p.peers = static_cast<int>(peers);
  p.finish_spread = NumberOr(j, "finish_spread", 0);
  const double spread_threads = NumberOr(j, "finish_spread_threads", 0);
  if (!(p.finish_spread >= 0 && spread_threads >= 0 && spread_threads <= 4096 &&
        spread_threads == std::floor(spread_threads)) ||
      spread_threads == 1 || (p.finish_spread > 0 && spread_threads < 2)) {
    return bad(
        "\"finish_spread\" must be >= 0, given with \"finish_spread_threads\", a whole "
        "number from 2 to 4096");
  }
  p.spread_threads = static_cast<int>(spread_threads);
  const Json more = j.contains("more_rows") ? j["more_rows"] : Json::array();
  if (!more.is_array()) return bad("\"more_rows\" must be an array");
  for (const Json& m : more) {
    const int rows = static_cast<int>(NumberOr(m, "rows", 0));
    const Json times = m.contains("blocks") ? m["blocks"] : Json();
    if (rows <= 0 || rows == p.rows || p.more_rows.count(rows) || !times.is_array() ||
        times.size() != p.blocks.size()) {
      return bad(
          "each of \"more_rows\" needs its own \"rows\" > 0 and \"blocks\" as many as the "
          "profile's");
    }
    for (const Json& b : times) {
      ASSIGN_OR_RETURN(BlockTime t, ReadBlock(b));
      p.more_rows[rows].push_back(t);
    }
  }
  return p;
}

absl::Status WriteBlockProfile(const BlockProfile& p, const std::string& path) {
  Json j;
  j["model"] = p.model;
  j["device"] = p.device;
  j["dtype"] = p.dtype;
  j["rows"] = p.rows;
  j["source"] = p.source;
  j["optimizer_seconds_per_param"] = JsonNumber(p.optimizer_per_param);
  auto times = [](const std::vector<BlockTime>& blocks) {
    Json a = Json::array();
    for (const BlockTime& t : blocks) {
      a.push_back({{"name", t.name},
                   {"forward", JsonNumber(t.forward)},
                   {"backward", JsonNumber(t.backward)},
                   {"weight", JsonNumber(t.weight)}});
    }
    return a;
  };
  j["blocks"] = times(p.blocks);
  if (p.step_overhead > 0) j["step_overhead_seconds"] = JsonNumber(p.step_overhead);
  if (p.peers > 0) j["timed_beside_threads"] = p.peers;
  if (p.spread_threads >= 2) {
    j["finish_spread"] = JsonNumber(p.finish_spread);
    j["finish_spread_threads"] = p.spread_threads;
  }
  if (!p.more_rows.empty()) {
    j["more_rows"] = Json::array();
    for (const auto& [rows, blocks] : p.more_rows) {
      j["more_rows"].push_back({{"rows", rows}, {"blocks", times(blocks)}});
    }
  }
  return WriteFileAtomically(path, JsonText(j, JsonLayout::kObjects) + "\n");
}

}  // namespace tandem
