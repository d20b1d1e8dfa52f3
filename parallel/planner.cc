#include "parallel/planner.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <thread>
#include <time.h>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "model/block.h"
#include "model/optimizer.h"
#include "model/trainer.h"
#include "parallel/grid.h"
#include "parallel/partition.h"
#include "parallel/schedule.h"
#include "runtime/files.h"
#include "runtime/format.h"
#include "runtime/json.h"
#include "runtime/status.h"
#include "runtime/stream.h"
#include "runtime/timeline.h"

namespace tandem {

double LinkModel::SendRecv(double bytes) const { return latency_s + bytes / bytes_per_s; }

double LinkModel::AllReduce(double bytes, int ranks) const {
  return ranks <= 1 ? 0 : 2.0 * (ranks - 1) * SendRecv(bytes / ranks);
}

namespace {

// p-1 ring steps of bytes/p, each a message of `own` where it was timed, else of `link`.
double RingHalf(const LinkModel& link, const AlphaBeta& own, double bytes, int ranks) {
  if (ranks <= 1) return 0;
  const double piece = bytes / ranks;
  return (ranks - 1) * (own.bytes_per_s > 0 ? own.Message(piece) : link.SendRecv(piece));
}

std::string PairString(const AlphaBeta& ab) {
  return absl::StrFormat("%.3g GB/s, %.3g us", ab.bytes_per_s / 1e9, ab.latency_s * 1e6);
}

}  // namespace

double LinkModel::ReduceScatter(double bytes, int ranks) const {
  return RingHalf(*this, reduce_scatter, bytes, ranks);
}

double LinkModel::AllGather(double bytes, int ranks) const {
  return RingHalf(*this, all_gather, bytes, ranks);
}

std::string LinkModel::ToString() const {
  std::string out = PairString({latency_s, bytes_per_s});
  if (handover_s > 0) absl::StrAppendFormat(&out, ", handover %.3g us", handover_s * 1e6);
  if (reduce_scatter.bytes_per_s > 0) {
    absl::StrAppend(&out, "; reduce-scatter ", PairString(reduce_scatter));
  }
  if (all_gather.bytes_per_s > 0) absl::StrAppend(&out, "; all-gather ", PairString(all_gather));
  return out;
}

absl::StatusOr<LinkModel> ParseLink(absl::string_view text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ',');
  double gbps = 0, us = -1, handover_us = 0;
  if ((parts.size() != 2 && parts.size() != 3) || !absl::SimpleAtod(parts[0], &gbps) ||
      !absl::SimpleAtod(parts[1], &us) || !(gbps > 0) || !(us >= 0) ||
      (parts.size() == 3 && (!absl::SimpleAtod(parts[2], &handover_us) || !(handover_us >= 0)))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--link=%s: give bandwidth_GBps,latency_us[,handover_us], the bandwidth positive and "
        "the times not negative, e.g. --link=450,3 (NVLink within a node) or --link=50,5 "
        "(400 Gb/s InfiniBand)",
        text));
  }
  LinkModel l{us * 1e-6, gbps * 1e9};
  l.handover_s = handover_us * 1e-6;
  return l;
}

absl::StatusOr<LinkModel> FitLink(const std::vector<LinkSample>& samples) {
  // Least squares of the relative error (weights 1/seconds^2): sizes from kilobytes to
  // megabytes differ in time a thousandfold, and a plain fit would leave the latency to the
  // noise of the largest.
  double sw = 0, mx = 0, my = 0;
  for (const LinkSample& s : samples) {
    if (!(s.seconds > 0)) return absl::InvalidArgumentError("a link timing must be positive");
    const double w = 1 / (s.seconds * s.seconds);
    sw += w;
    mx += w * s.bytes;
    my += w * s.seconds;
  }
  mx /= sw;
  my /= sw;
  double sxy = 0, sxx = 0;
  for (const LinkSample& s : samples) {
    const double w = 1 / (s.seconds * s.seconds);
    sxy += w * (s.bytes - mx) * (s.seconds - my);
    sxx += w * (s.bytes - mx) * (s.bytes - mx);
  }
  if (samples.size() < 2 || !(sxx > 0)) {
    return absl::InvalidArgumentError("fitting a link needs timings of at least two sizes");
  }
  const double per_byte = sxy / sxx;
  if (!(per_byte > 0)) {
    return absl::InvalidArgumentError(
        "the link's timings do not grow with the message size: no bandwidth fits them");
  }
  // A negative intercept is noise around a latency too small to see: none.
  return LinkModel{std::max(0.0, my - per_byte * mx), 1.0 / per_byte};
}

absl::StatusOr<LinkModel> FitLinkToRing(const std::vector<LinkSample>& samples, int ranks,
                                        int steps) {
  if (ranks < 2 || steps < 1) {
    return absl::InvalidArgumentError("a collective times a link on 2 ranks or more");
  }
  std::vector<LinkSample> messages;
  for (const LinkSample& s : samples) messages.push_back({s.bytes / ranks, s.seconds / steps});
  return FitLink(messages);
}

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
  // One optimizer step over the whole model's parameters, timed as the blocks are (its state
  // freed before the rounds).
  const int64_t n = model.num_params();
  {
    OptimizerConfig oc;
    oc.kind = std::string(optimizer);
    ASSIGN_OR_RETURN(Optimizer opt, Optimizer::Create(oc, n, device));
    ASSIGN_OR_RETURN(Tensor params,
                     Tensor::FromVector(std::vector<float>(n, 0.5f), {n}, device));
    ASSIGN_OR_RETURN(Tensor grads, Tensor::FromVector(std::vector<float>(n, 1e-3f), {n}, device));
    std::vector<double> runs;
    for (int r = 0; r < 4; ++r) {  // the first is a warm-up
      ASSIGN_OR_RETURN(StreamTimeline timeline, StreamTimeline::Start(*s));
      RETURN_IF_ERROR(opt.Step(*s, params, grads, r, 1.0f));
      RETURN_IF_ERROR(timeline.Mark(0, "optimizer"));
      RETURN_IF_ERROR(s->Synchronize());
      ASSIGN_OR_RETURN(std::vector<StreamTimeline::Phase> phases, timeline.Phases());
      if (r > 0) runs.push_back(phases.at(0).seconds);
    }
    p.optimizer_per_param = Median(runs) / n;
  }
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

std::string Layout::Name() const {
  std::string s;
  if (strategy == StrategyKind::kData) {
    s = absl::StrFormat("data D=%d", data_parallel);
  } else {
    s = absl::StrFormat("d%dk%d %s", data_parallel, stages,
                        strategy == StrategyKind::kModel ? "model" : schedule);
    if (virtual_stages > 1) absl::StrAppend(&s, " v=", virtual_stages);
  }
  if (micro_batches > 1 || strategy == StrategyKind::kPipeline) {
    absl::StrAppend(&s, " M=", micro_batches);
  }
  if (zero) absl::StrAppend(&s, " zero1");
  if (recompute) absl::StrAppend(&s, " recompute");
  if (data_parallel > 1) absl::StrAppend(&s, " bucket ", FormatBytes(bucket_bytes));
  return s;
}

std::vector<std::string> Layout::LauncherFlags() const {
  std::vector<std::string> f = {absl::StrCat("--strategy=", StrategyName(strategy)),
                                absl::StrCat("--micro-batches=", micro_batches)};
  if (strategy != StrategyKind::kData) {
    f.push_back(absl::StrCat("--data-parallel=", data_parallel));
    f.push_back(absl::StrCat("--balance=", balance));
  }
  if (strategy == StrategyKind::kPipeline) f.push_back(absl::StrCat("--schedule=", schedule));
  if (virtual_stages > 1) f.push_back(absl::StrCat("--virtual-stages=", virtual_stages));
  if (zero) f.push_back("--zero=1");
  if (recompute) f.push_back("--recompute");
  f.push_back(absl::StrCat("--bucket-mb=", bucket_bytes / double(1 << 20)));
  return f;
}

std::string Prediction::Reason() const {
  const std::pair<double, const char*> parts[] = {
      {bubble_s, "pipeline bubble"},
      {exposed_comm_s, layout.zero ? "exposed reduce-scatter" : "exposed all-reduce"},
      {optimizer_s, layout.zero ? "optimizer and all-gather" : "optimizer"},
      {sharing_s, "workers waiting for a core"},
      {spread_s, "waiting for the slowest worker"},
  };
  const auto* top = std::max_element(std::begin(parts), std::end(parts));
  if (step_s <= 0 || top->first / step_s < 0.05) return "compute bound";
  return absl::StrFormat("%s %.0f%% of the step", top->second, 100 * top->first / step_s);
}

namespace {

// Parameters each stage of `bounds` holds, each once (a tied table too, and a last stage's
// copy of it), as its flat buffer does (StageParams).
std::vector<int64_t> StageParamCounts(const ModelConfig& model, const StageBounds& bounds) {
  const std::vector<std::unique_ptr<Block>> blocks = BuildBlocks(model);
  std::vector<int64_t> out;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    int64_t n = 0;
    for (const ParamSpec& p : StageParams(blocks, bounds[s], bounds[s + 1])) n += p.shape.numel();
    out.push_back(n);
  }
  return out;
}

// When the last of `buckets` (sizes in bytes, in the order backward fills them, evenly over a
// backward of `window` seconds) is reduced, by `cost` one after another, from the window's
// end: the communication the backward does not hide (DDP's overlap).
double ExposedAfter(const std::vector<double>& buckets, double window,
                    const std::function<double(double)>& cost) {
  double t = 0, filled = 0, total = 0;
  for (double b : buckets) total += b;
  for (double b : buckets) {
    filled += b;
    t = std::max(t, window * filled / total) + cost(b);
  }
  return std::max(0.0, t - window);
}

// A gradient buffer of `bytes` cut into buckets of at most `bucket` bytes.
std::vector<double> Buckets(double bytes, double bucket) {
  std::vector<double> out;
  for (double left = bytes; left > 0; left -= bucket) out.push_back(std::min(left, bucket));
  return out;
}

}  // namespace

namespace {

// Processor sharing: `n` ranks computing at once on `cores` cores, beside `waiting` ranks
// that each take `waiting_share` of a computing one's turn, progress at this rate each.
double ShareRate(int n, double cores, int waiting = 0, double waiting_share = 0) {
  const double load = n + waiting * waiting_share;
  return load <= cores ? 1.0 : cores / load;
}

// Processor sharing from `t`: the ranks marked `active` work through what they have `left`
// at ShareRate(how many, cores, waiting, waiting_share) each until the first of them is done
// or `horizon` comes, which is returned (infinity: none active and no horizon); `left` is
// what remains then.
double ShareUntil(std::vector<double>& left, const std::vector<bool>& active, double cores,
                  double t, double horizon, int waiting = 0, double waiting_share = 0) {
  const int n = static_cast<int>(std::count(active.begin(), active.end(), true));
  const double rate = ShareRate(n, cores, waiting, waiting_share);
  double next = horizon;
  for (size_t i = 0; i < left.size(); ++i) {
    if (active[i]) next = std::min(next, t + left[i] / rate);
  }
  if (std::isinf(next)) return next;
  for (size_t i = 0; i < left.size(); ++i) {
    if (active[i]) left[i] -= rate * (next - t);
  }
  return next;
}

}  // namespace

double SharedCoresStep(const PipelineSchedule& s, const ScheduleDurations& d, double cores,
                       double waiting_share) {
  const int S = s.stages, M = s.micro_batches, V = s.chunks;
  constexpr double kNotYet = -1;
  // A transfer by (is gradient, micro-batch, sending global stage): when its send and its
  // receive were posted.
  using Key = std::tuple<bool, int, int>;
  std::map<Key, std::pair<double, double>> posted;
  auto key = [&](int st, const Action& a) -> Key {
    const int g = GlobalStage(st, a.chunk, S);
    switch (a.type) {
      case ActionType::kSendActivation: return {false, a.micro_batch, g};
      case ActionType::kRecvActivation: return {false, a.micro_batch, g - 1};
      case ActionType::kSendGradient: return {true, a.micro_batch, g};
      default: return {true, a.micro_batch, g + 1};  // kRecvGradient
    }
  };
  auto arrived = [&](const Key& k) {
    const auto it = posted.find(k);
    if (it == posted.end() || it->second.first < 0 || it->second.second < 0) return kNotYet;
    return std::max(it->second.first, it->second.second) + d.transfer + d.handover;
  };
  std::vector<std::vector<bool>> split(S);
  for (int st = 0; st < S; ++st) split[st] = DeferredWeights(s, st);
  std::vector<std::vector<double>> fwd_end(S, std::vector<double>(V * M, kNotYet)),
      bwd_end = fwd_end;
  // When compute action x of stage st can start; kNotYet while that is not known.
  auto ready = [&](int st, const Action& x) {
    const int k = x.chunk * M + x.micro_batch, g = GlobalStage(st, x.chunk, S);
    if (x.type == ActionType::kWeightGradient) return bwd_end[st][k];
    if (x.type == ActionType::kForward) return g > 0 ? arrived({false, x.micro_batch, g - 1}) : 0;
    const double grad = g < S * V - 1 ? arrived({true, x.micro_batch, g + 1}) : 0;
    return fwd_end[st][k] < 0 || grad < 0 ? kNotYet : std::max(fwd_end[st][k], grad);
  };
  auto seconds = [&](int st, const Action& x) {
    return d.per_stage[st][x.chunk].Of(x, split[st][x.chunk * M + x.micro_batch]);
  };
  std::vector<size_t> pc(S, 0);
  std::vector<double> left(S, kNotYet);  // the running compute action's work left
  double t = 0, end = 0;
  for (;;) {
    // Every stage goes on at t as far as it can: posts its transfers, starts what is ready.
    for (bool progress = true; progress;) {
      progress = false;
      for (int st = 0; st < S; ++st) {
        while (left[st] < 0 && pc[st] < s.actions[st].size()) {
          const Action& x = s.actions[st][pc[st]];
          if (x.is_communication()) {
            auto& [send, recv] = posted.emplace(key(st, x), std::make_pair(kNotYet, kNotYet))
                                     .first->second;
            (x.type == ActionType::kSendActivation || x.type == ActionType::kSendGradient
                 ? send
                 : recv) = t;
          } else if (x.is_compute()) {
            const double at = ready(st, x);
            if (at < 0 || at > t) break;
            left[st] = seconds(st, x);
          }
          if (left[st] < 0) ++pc[st];  // a started compute action moves on when it ends
          progress = true;
        }
      }
    }
    // The next moment something changes: a compute action ends or a transfer arrives.
    std::vector<bool> computing(S);
    double arrival = std::numeric_limits<double>::infinity();
    int waiting = 0;
    for (int st = 0; st < S; ++st) {
      computing[st] = left[st] >= 0;
      if (!computing[st] && pc[st] < s.actions[st].size()) {
        ++waiting;
        const double at = ready(st, s.actions[st][pc[st]]);
        if (at > t) arrival = std::min(arrival, at);
      }
    }
    const double next = ShareUntil(left, computing, cores, t, arrival, waiting, waiting_share);
    if (std::isinf(next)) break;  // all done (a validated schedule never stalls)
    for (int st = 0; st < S; ++st) {
      if (!computing[st] || left[st] > 1e-12 * next) continue;
      const Action& x = s.actions[st][pc[st]];
      if (x.type == ActionType::kForward) fwd_end[st][x.chunk * M + x.micro_batch] = next;
      if (x.type == ActionType::kBackward) bwd_end[st][x.chunk * M + x.micro_batch] = next;
      left[st] = kNotYet;
      ++pc[st];
      end = next;
    }
    t = next;
  }
  for (const auto& [k, ends] : posted) end = std::max(end, arrived(k));
  return end;
}

namespace {

// Ranks that each start at `release[i]`, compute `work[i]` seconds sharing `cores` cores as
// ShareRate says, then wait `after[i]`: when the last is done.
double SharedCoresEnd(const std::vector<double>& release, const std::vector<double>& work,
                      const std::vector<double>& after, double cores) {
  const size_t n = release.size();
  std::vector<double> left = work;
  std::vector<bool> done(n, false);
  double t = 0, end = 0;
  for (size_t finished = 0; finished < n;) {
    std::vector<bool> computing(n);
    double released = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < n; ++i) {
      computing[i] = !done[i] && release[i] <= t;
      if (!done[i] && release[i] > t) released = std::min(released, release[i]);
    }
    const double next = ShareUntil(left, computing, cores, t, released);
    for (size_t i = 0; i < n; ++i) {
      if (!computing[i] || left[i] > 1e-12 * next) continue;
      done[i] = true;
      ++finished;
      end = std::max(end, next + after[i]);
    }
    t = next;
  }
  return end;
}

// The schedule a pipeline layout runs, made and validated (MakePlan makes each once).
absl::StatusOr<PipelineSchedule> LayoutSchedule(const Layout& l) {
  ASSIGN_OR_RETURN(PipelineSchedule s,
                   MakeSchedule(l.strategy == StrategyKind::kModel ? "gpipe" : l.schedule,
                                l.stages, l.micro_batches, l.virtual_stages));
  RETURN_IF_ERROR(ValidateSchedule(s));
  return s;
}

// Predict with the layout's schedule given (nullptr for data parallel).
absl::StatusOr<Prediction> PredictWith(const PlanRequest& r, const Layout& layout,
                                       const PipelineSchedule* schedule) {
  const ModelConfig& model = r.base.train.model;
  if (static_cast<int>(r.profile.blocks.size()) != model.num_blocks()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the block times are for %d blocks (%s) and %s has %d", r.profile.blocks.size(),
        r.profile.model, model.name, model.num_blocks()));
  }
  ParallelConfig c = r.base;
  c.strategy = layout.strategy;
  c.schedule = layout.schedule.empty() ? "gpipe" : layout.schedule;
  c.virtual_stages = layout.virtual_stages;
  c.data_parallel = layout.strategy == StrategyKind::kData ? 1 : layout.data_parallel;
  c.train.micro_batches = layout.micro_batches;
  c.recompute = layout.recompute;
  c.zero = layout.zero;
  c.bucket_bytes = layout.bucket_bytes;
  c.balance = layout.balance;
  LayoutInputs in;
  in.schedule = schedule;
  ASSIGN_OR_RETURN(const JobLayout resolved, ResolveLayout(c, r.gpus, in));
  const StageBounds& bounds = resolved.bounds;
  const ProcessGrid& grid = resolved.grid;
  Prediction p;
  p.layout = layout;
  for (const MemoryNeed& n : resolved.memory) p.memory_bytes = std::max(p.memory_bytes, n.total());

  const int K = grid.stages, D = grid.replicas, M = layout.micro_batches;
  const double rows = double(c.train.batch) / D / M;
  const std::vector<BlockTime> blocks = r.profile.BlocksAt(rows);
  // bounds has K x v global stages; global stage g runs on stage g mod K as its chunk g div K.
  const int V = layout.virtual_stages;
  const std::vector<int64_t> chunk_params = StageParamCounts(model, bounds);
  std::vector<int64_t> stage_params(K, 0);
  std::vector<std::vector<ComputeSeconds>> chunk(K, std::vector<ComputeSeconds>(V));
  std::vector<ComputeSeconds> stage(K);  // over the stage's chunks
  for (int g = 0; g < K * V; ++g) {
    const int s = g % K;
    ComputeSeconds& t = chunk[s][g / K];
    for (int b = bounds[g]; b < bounds[g + 1]; ++b) {
      t.forward += blocks[b].forward;
      t.backward += blocks[b].backward;
      t.weight += blocks[b].weight;
    }
    if (layout.recompute) t.backward += t.forward;  // the forward again first
    stage_params[s] += chunk_params[g];
    stage[s].forward += t.forward;
    stage[s].backward += t.backward;
    stage[s].weight += t.weight;
  }

  // The compute of a step, and each stage's time in it.
  SimulatedStep sim;
  ScheduleDurations d;
  if (K == 1) {
    const double one = stage[0].forward + stage[0].backward + stage[0].weight;
    sim.busy = {M * one};
    sim.makespan = M * one;
  } else {
    d.per_stage = chunk;
    const double boundary =
        rows * model.seq_len * model.d_model * static_cast<double>(DTypeSize(c.train.dtype));
    d.transfer = r.link.SendRecv(boundary);
    d.handover = r.link.handover_s;
    ASSIGN_OR_RETURN(sim, SimulateSchedule(*schedule, d));
  }

  // Each stage's data-parallel gradient reduction and optimizer step after its compute; the
  // step ends with the slowest stage's. Per stage: the exposed reduction, the step end's
  // compute (optimizer and overhead) and the wait after it (ZeRO-1's all-gather).
  std::vector<double> exposed(K, 0), end_work(K, 0), end_wait(K, 0);
  double tail = -1;
  int slowest = 0;
  for (int s = 0; s < K; ++s) {
    const double grad_bytes = 4.0 * stage_params[s];
    end_work[s] = r.profile.optimizer_per_param * stage_params[s];
    if (D > 1) {
      const std::vector<double> buckets = Buckets(grad_bytes, double(layout.bucket_bytes));
      auto cost = [&](double b) {
        return layout.zero ? r.link.ReduceScatter(b, D) : r.link.AllReduce(b, D);
      };
      // The buckets fill during the step's last backward of this stage.
      const double window = c.overlap ? stage[s].backward + stage[s].weight : 0;
      exposed[s] = ExposedAfter(buckets, window, cost);
      if (layout.zero) {
        end_work[s] /= D;
        end_wait[s] = r.link.AllGather(grad_bytes, D);
      }
    }
    end_work[s] += r.profile.step_overhead * stage_params[s] / model.num_params();
    if (exposed[s] + end_work[s] + end_wait[s] > tail) {
      tail = exposed[s] + end_work[s] + end_wait[s];
      slowest = s;
      p.exposed_comm_s = exposed[s];
      p.optimizer_s = end_work[s] + end_wait[s];
    }
  }
  p.compute_s = sim.busy[slowest];
  p.bubble_s = sim.makespan - sim.busy[slowest];
  p.step_s = sim.makespan + tail;
  // CPU workers on fewer cores than workers: the D replicas' stages that compute at each
  // moment share the cores (each replica's like stage computes at the same moments), in the
  // step's compute and in its end, which starts for all once the compute is done.
  if (r.SharesCores()) {
    const double cores = double(r.host_cores) / D;
    const double computed = K == 1 ? sim.makespan / ShareRate(1, cores)
                                   : SharedCoresStep(*schedule, d, cores, r.waiting_share);
    std::vector<double> release(K);
    for (int s = 0; s < K; ++s) release[s] = computed + exposed[s];
    p.sharing_s = std::max(0.0, SharedCoresEnd(release, end_work, end_wait, cores) - p.step_s);
    p.step_s += p.sharing_s;
  }
  if (r.gpus > 1) {
    p.spread_s = r.profile.finish_spread * (p.compute_s + p.sharing_s);
    p.step_s += p.spread_s;
  }
  return p;
}

}  // namespace

absl::StatusOr<Prediction> Predict(const PlanRequest& r, const Layout& layout) {
  if (layout.stages == 1) return PredictWith(r, layout, nullptr);
  ASSIGN_OR_RETURN(PipelineSchedule s, LayoutSchedule(layout));
  return PredictWith(r, layout, &s);
}

namespace {

// Digits out of a refusal, so that layouts refused for the same reason count together.
std::string ReasonKind(absl::string_view message) {
  std::string out;
  for (char ch : message.substr(0, message.find('\n'))) {
    if (std::isdigit(static_cast<unsigned char>(ch))) {
      if (out.empty() || out.back() != 'N') out += 'N';
    } else {
      out += ch;
    }
  }
  return out;
}

const char* PureKind(const Layout& l) {
  if (l.strategy == StrategyKind::kData) return "data parallel";
  if (l.data_parallel != 1) return nullptr;
  return l.strategy == StrategyKind::kModel ? "model parallel" : "pipeline";
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const PlanRequest& r) {
  const ModelConfig& model = r.base.train.model;
  if (r.profile.model != model.ToString()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the block times are for \"%s\", not \"%s\": measure them for this model "
        "(leave out --block-times) or give its file",
        r.profile.model, model.ToString()));
  }
  std::vector<double> block_seconds;
  for (const BlockTime& t : r.profile.blocks) block_seconds.push_back(t.total());
  const int batch = r.base.train.batch;
  Plan plan;
  // Each pipeline schedule made once: layouts that differ only in ZeRO, recomputation or
  // buckets share it.
  std::map<std::tuple<StrategyKind, std::string, int, int, int>,
           absl::StatusOr<PipelineSchedule>>
      schedules;
  auto consider = [&](const Layout& l) {
    ++plan.considered;
    absl::StatusOr<Prediction> p;
    if (l.stages == 1) {
      p = PredictWith(r, l, nullptr);
    } else {
      const auto key =
          std::make_tuple(l.strategy, l.schedule, l.stages, l.micro_batches, l.virtual_stages);
      auto it = schedules.find(key);
      if (it == schedules.end()) it = schedules.emplace(key, LayoutSchedule(l)).first;
      p = it->second.ok() ? PredictWith(r, l, &*it->second) : it->second.status();
    }
    if (!p.ok()) {
      ++plan.dropped[absl::StrCat("refused: ", ReasonKind(p.status().message()))];
    } else if (r.device_memory >= 0 && p->memory_bytes > r.device_memory) {
      ++plan.dropped[absl::StrCat("needs more than the device's ", FormatBytes(r.device_memory))];
    } else {
      plan.ranked.push_back(*p);
    }
  };
  for (int K = 1; K <= r.gpus; ++K) {
    if (r.gpus % K != 0) continue;
    const int D = r.gpus / K;
    if (batch % D != 0) {
      ++plan.dropped[absl::StrFormat("the batch of %d does not split over %d replicas", batch,
                                     D)];
      continue;
    }
    Layout base;
    base.data_parallel = D;
    base.stages = K;
    if (K > 1) {
      if (K > model.num_blocks()) {
        ++plan.dropped[absl::StrFormat("more stages than the model's %d blocks",
                                       model.num_blocks())];
        continue;
      }
      ASSIGN_OR_RETURN(base.balance, BalancedSizes(block_seconds, K));
    }
    // (strategy, schedule): data parallel alone, or model parallel and each pipeline schedule.
    std::vector<std::pair<StrategyKind, std::string>> kinds = {{StrategyKind::kData, ""}};
    if (K > 1) {
      kinds = {{StrategyKind::kModel, ""},
               {StrategyKind::kPipeline, "gpipe"},
               {StrategyKind::kPipeline, "1f1b"},
               {StrategyKind::kPipeline, "zb-h1"},
               {StrategyKind::kPipeline, "interleaved"}};
    }
    for (const auto& [strategy, schedule] : kinds) {
      std::vector<int> ms;
      const int replica_batch = batch / D;
      for (int m = 1; m <= replica_batch; ++m) {
        if (replica_batch % m != 0) continue;
        if (strategy == StrategyKind::kModel && m != 1) continue;
        if (strategy == StrategyKind::kPipeline && (m < 2 || m > 8 * K)) continue;
        ms.push_back(m);
      }
      // Interleaved: 2 model chunks a stage or more, while each chunk has a block, on
      // micro-batches in multiples of K.
      std::vector<int> vs = {1};
      if (schedule == "interleaved") {
        vs.clear();
        for (int v = 2; v <= std::min(4, model.num_blocks() / K); ++v) vs.push_back(v);
      }
      for (int v : vs)
      for (int m : ms) {
        if (v > 1 && m % K != 0) continue;
        std::string balance = base.balance;
        if (v > 1) {
          ASSIGN_OR_RETURN(balance, BalancedSizes(block_seconds, K * v));
        }
        for (bool recompute : {false, true}) {
          for (int zero : {0, 1}) {
            if (zero && D < 2) continue;
            for (int64_t bucket : r.bucket_bytes) {
              if (D < 2 && bucket != r.bucket_bytes.front()) continue;
              Layout l = base;
              l.strategy = strategy;
              l.schedule = schedule;
              l.virtual_stages = v;
              l.balance = balance;
              l.micro_batches = m;
              l.recompute = recompute;
              l.zero = zero;
              l.bucket_bytes = bucket;
              consider(l);
            }
          }
        }
      }
    }
  }
  std::stable_sort(plan.ranked.begin(), plan.ranked.end(),
                   [](const Prediction& a, const Prediction& b) {
                     // Equal steps (to rounding; workers sharing cores are bound by their
                     // total work): the one faster with a core each, then fewer
                     // micro-batches (each has a cost the linear times leave out), then less
                     // memory.
                     auto differ = [](double x, double y) {
                       return std::abs(x - y) > 1e-9 * std::max(std::abs(x), std::abs(y));
                     };
                     if (differ(a.step_s, b.step_s)) return a.step_s < b.step_s;
                     // (the spread is a share of the compute with the sharing)
                     auto alone = [](const Prediction& p) {
                       const double with = p.compute_s + p.sharing_s;
                       return p.step_s - p.sharing_s -
                              (with > 0 ? p.spread_s * p.sharing_s / with : 0);
                     };
                     const double ua = alone(a), ub = alone(b);
                     if (differ(ua, ub)) return ua < ub;
                     return std::make_pair(a.layout.micro_batches, a.memory_bytes) <
                            std::make_pair(b.layout.micro_batches, b.memory_bytes);
                   });
  for (size_t i = 0; i < plan.ranked.size(); ++i) {
    const char* kind = PureKind(plan.ranked[i].layout);
    if (kind != nullptr) plan.best_pure.emplace(kind, i);  // the first is the fastest
  }
  if (plan.ranked.empty()) {
    std::string why;
    for (const auto& [reason, n] : plan.dropped) {
      absl::StrAppend(&why, why.empty() ? "" : "; ", n, " ", reason);
    }
    return absl::ResourceExhaustedError(absl::StrFormat(
        "no layout of %d ranks fits %s (%d considered: %s)", r.gpus, model.name,
        plan.considered, why));
  }
  return plan;
}

std::optional<Layout> WaitingShareProbe(const Plan& plan) {
  std::optional<Layout> best;
  auto distance = [](const Layout& l) { return std::abs(l.micro_batches - 2 * l.stages); };
  for (const Prediction& p : plan.ranked) {
    const Layout& l = p.layout;
    if (l.strategy != StrategyKind::kPipeline || l.schedule != "1f1b" || l.zero ||
        l.recompute) {
      continue;
    }
    if (!best || l.stages > best->stages ||
        (l.stages == best->stages && distance(l) < distance(*best))) {
      best = l;
    }
  }
  return best;
}

absl::StatusOr<double> FitWaitingShare(PlanRequest r, const Layout& probe, double measured_s) {
  auto step = [&](double w) -> absl::StatusOr<double> {
    r.waiting_share = w;
    ASSIGN_OR_RETURN(Prediction p, Predict(r, probe));
    return p.step_s;
  };
  double lo = 0, hi = 1;
  ASSIGN_OR_RETURN(double at_lo, step(lo));
  if (at_lo >= measured_s) return lo;
  ASSIGN_OR_RETURN(double at_hi, step(hi));
  if (at_hi <= measured_s) return hi;
  while (hi - lo > 1e-4) {
    const double mid = (lo + hi) / 2;
    ASSIGN_OR_RETURN(double at, step(mid));
    (at < measured_s ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

std::string HeldOutReason(const Layout& fitted, const Layout& l) {
  if (l.Name() == fitted.Name()) return "the waiting share was fitted on it";
  if (l.stages < 2 || l.stages != fitted.stages || l.data_parallel != fitted.data_parallel) {
    return "";
  }
  std::vector<std::string> differ;
  if (l.strategy != fitted.strategy || l.schedule != fitted.schedule ||
      l.virtual_stages != fitted.virtual_stages) {
    differ.push_back("schedule");
  }
  if (l.micro_batches != fitted.micro_batches) differ.push_back("micro-batches");
  if (l.recompute != fitted.recompute) differ.push_back("recomputation");
  if (l.zero != fitted.zero) differ.push_back("ZeRO-1");
  if (l.bucket_bytes != fitted.bucket_bytes && l.data_parallel > 1) differ.push_back("buckets");
  if (l.balance != fitted.balance) differ.push_back("balance");
  std::string what = differ.empty() ? "nothing the name shows" : differ.back();
  if (differ.size() >= 2) {
    differ.pop_back();
    what = absl::StrCat(absl::StrJoin(differ, ", "), " and ", what);
  }
  return absl::StrFormat(
      "its shape d%dk%d is the one the waiting share was fitted on (%s); it differs from it "
      "only in %s",
      l.data_parallel, l.stages, fitted.Name(), what);
}

}  // namespace tandem
