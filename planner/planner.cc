// The planning: each layout's prediction (Predict: compute, the pipeline, the gradients'
// communication, the step's end, memory, core sharing) and the plan (MakePlan: every layout
// of N ranks enumerated, predicted and ranked).
#include "planner/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/block.h"
#include "parallel/grid.h"
#include "parallel/partition.h"
#include "parallel/schedule.h"
#include "planner/shared_cores.h"
#include "runtime/format.h"
#include "runtime/status.h"

namespace tandem {

std::string Layout::Name() const {
  std::string s = tensor_parallel > 1 ? absl::StrFormat("t%d ", tensor_parallel) : "";
  if (strategy == StrategyKind::kData) {
    absl::StrAppendFormat(&s, "data D=%d", data_parallel);
  } else {
    absl::StrAppendFormat(&s, "d%dk%d %s", data_parallel, stages,
                        strategy == StrategyKind::kModel ? "model" : schedule);
    if (virtual_stages > 1) absl::StrAppend(&s, " v=", virtual_stages);
  }
  if (micro_batches > 1 || strategy == StrategyKind::kPipeline) {
    absl::StrAppend(&s, " M=", micro_batches);
  }
  if (zero) absl::StrAppend(&s, " zero1");
  if (recompute) absl::StrAppend(&s, " recompute");
  if (data_parallel > 1) absl::StrAppend(&s, " bucket ", FormatBytes(bucket_bytes));
  if (sequence_parallel) absl::StrAppend(&s, " sp");
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
  if (tensor_parallel > 1) f.push_back(absl::StrCat("--tensor-parallel=", tensor_parallel));
  if (sequence_parallel) f.push_back("--sequence-parallel");
  return f;
}

std::string Prediction::Reason() const {
  const std::pair<double, const char*> parts[] = {
      {bubble_s, "pipeline bubble"},
      {exposed_comm_s, layout.zero ? "exposed reduce-scatter" : "exposed all-reduce"},
      {optimizer_s, layout.zero ? "optimizer and all-gather" : "optimizer"},
      {sharing_s, "workers waiting for a core"},
      {tensor_comm_s, "tensor-parallel collectives"},
      {spread_s, "waiting for the slowest worker"},
  };
  const auto* top = std::max_element(std::begin(parts), std::end(parts));
  if (step_s <= 0 || top->first / step_s < 0.05) return "compute bound";
  return absl::StrFormat("%s %.0f%% of the step", top->second, 100 * top->first / step_s);
}

namespace {

// Parameters each stage of `bounds` holds, each once (a tied table too, and a last stage's
// copy of it), as its flat buffer does (StageParams).
// One block's tensor-parallel collectives for a micro-batch, in its forward and in its B.
struct TensorComm {
  double forward = 0, backward = 0;
};

// Each block's (TensorComm) under c's tensor parallelism, for micro-batches of `rows` samples,
// by the tensor-parallel link's ring model over T ranks; zeros without it.
std::vector<TensorComm> TensorCollectives(const PlanRequest& r, const ParallelConfig& c,
                                          double rows) {
  const ModelConfig& model = c.train.model;
  std::vector<TensorComm> out(model.num_blocks());
  const int T = c.tensor_parallel;
  if (T < 2) return out;
  const LinkModel& link = r.tp_link.bytes_per_s > 0 ? r.tp_link : r.link;
  // The activations of a micro-batch, (rows x seq, C) in the compute dtype.
  const double bytes =
      rows * model.seq_len * model.d_model * static_cast<double>(DTypeSize(c.train.dtype));
  // CPU workers: each collective the stream waits for on the critical path also takes the
  // link's handover (the threads woken on the way, as a pipeline's transfer does).
  const double h = link.handover_s;
  const double ar = link.AllReduce(bytes, T) + h;
  const double ag = link.AllGather(bytes, T) + h, rs = link.ReduceScatter(bytes, T) + h;
  const bool sp = c.sequence_parallel;
  for (int b = 0; b < model.num_blocks(); ++b) {
    TensorComm& t = out[b];
    if (b == 0) {  // the embedding: the looked-up rows' sum; its B gathers dy (sp)
      t.forward = sp ? rs : ar;
      t.backward = sp ? ag : 0;
    } else if (b == model.num_blocks() - 1) {  // the head: its input's gradient
      // its logits' row maxima (4 bytes a row), then their sums of exp and target logits (8)
      t.forward = (sp ? ag : 0) + link.AllReduce(rows * model.seq_len * 4.0, T) +
                  link.AllReduce(rows * model.seq_len * 8.0, T) + 2 * h;
      t.backward = sp ? rs : ar;
    } else {  // a layer: two regions
      t.forward = sp ? 2 * (ag + rs) : 2 * ar;
      // (with sequence parallelism the LayerNorms' sum of 4C values too)
      t.backward = sp ? 4 * ag + 2 * rs + link.AllReduce(16.0 * model.d_model, T) + h : 2 * ar;
    }
  }
  return out;
}

// Each stage's parameters, on one of its T tensor-parallel ranks: its parts (the blocks
// BuildBlocks makes for T).
std::vector<int64_t> StageParamCounts(const ModelConfig& model, const StageBounds& bounds,
                                      int tensor_parallel = 1) {
  TensorParallel tp;
  tp.size = tensor_parallel;
  const std::vector<std::unique_ptr<Block>> blocks = BuildBlocks(model, tp);
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
  c.tensor_parallel = layout.tensor_parallel;
  c.sequence_parallel = layout.sequence_parallel;
  LayoutInputs in;
  in.schedule = schedule;
  ASSIGN_OR_RETURN(const JobLayout resolved, ResolveLayout(c, r.gpus, in));
  const StageBounds& bounds = resolved.bounds;
  const ProcessGrid& grid = resolved.grid;
  Prediction p;
  p.layout = layout;
  for (const MemoryNeed& n : resolved.memory) p.memory_bytes = std::max(p.memory_bytes, n.total());

  const int K = grid.stages, D = grid.replicas, M = layout.micro_batches, T = grid.tensors;
  const double rows = double(c.train.batch) / D / M;
  std::vector<BlockTime> blocks = r.profile.BlocksAt(rows);
  // Tensor parallelism: each block's work split over T ranks, its collectives on top.
  const std::vector<TensorComm> tensor_comm = TensorCollectives(r, c, rows);
  for (size_t b = 0; b < blocks.size(); ++b) {
    blocks[b].forward = blocks[b].forward / T + tensor_comm[b].forward;
    blocks[b].backward = blocks[b].backward / T + tensor_comm[b].backward;
    blocks[b].weight /= T;
  }
  // bounds has K x v global stages; global stage g runs on stage g mod K as its chunk g div K.
  const int V = layout.virtual_stages;
  const std::vector<int64_t> chunk_params = StageParamCounts(model, bounds, T);
  std::vector<int64_t> stage_params(K, 0);
  std::vector<std::vector<ComputeSeconds>> chunk(K, std::vector<ComputeSeconds>(V));
  std::vector<ComputeSeconds> stage(K);  // over the stage's chunks
  std::vector<double> stage_tensor(K, 0);  // a micro-batch's collectives' seconds
  for (int g = 0; g < K * V; ++g) {
    const int s = g % K;
    ComputeSeconds& t = chunk[s][g / K];
    for (int b = bounds[g]; b < bounds[g + 1]; ++b) {
      t.forward += blocks[b].forward;
      t.backward += blocks[b].backward;
      t.weight += blocks[b].weight;
      stage_tensor[s] += tensor_comm[b].forward * (layout.recompute ? 2 : 1) +
                         tensor_comm[b].backward;
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
  p.tensor_comm_s = M * stage_tensor[slowest];
  p.compute_s = sim.busy[slowest] - p.tensor_comm_s;
  p.bubble_s = sim.makespan - sim.busy[slowest];
  p.step_s = sim.makespan + tail;
  // CPU workers on fewer cores than workers: the D replicas' stages that compute at each
  // moment share the cores (each replica's like stage computes at the same moments, and each
  // stage's T tensor-parallel ranks together), in the step's compute and in its end, which
  // starts for all once the compute is done.
  if (r.SharesCores()) {
    const double cores = double(r.host_cores) / (D * T);
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
  if (l.tensor_parallel > 1) return l.data_parallel == 1 && l.stages == 1 ? "tensor parallel"
                                                                           : nullptr;
  if (l.strategy == StrategyKind::kData) return "data parallel";
  if (l.data_parallel != 1) return nullptr;
  return l.strategy == StrategyKind::kModel ? "model parallel" : "pipeline";
}

}  // namespace

namespace {

// The order of the ranking: the shorter step; at equal steps (to rounding; workers sharing
// cores are bound by their total work) the one faster with a core each, then fewer
// micro-batches (each has a cost the linear times leave out), then less memory.
bool RanksBefore(const Prediction& a, const Prediction& b) {
  auto differ = [](double x, double y) {
    return std::abs(x - y) > 1e-9 * std::max(std::abs(x), std::abs(y));
  };
  if (differ(a.step_s, b.step_s)) return a.step_s < b.step_s;
  // (the spread is a share of the compute with the sharing)
  auto alone = [](const Prediction& p) {
    const double with = p.compute_s + p.sharing_s;
    return p.step_s - p.sharing_s - (with > 0 ? p.spread_s * p.sharing_s / with : 0);
  };
  const double ua = alone(a), ub = alone(b);
  if (differ(ua, ub)) return ua < ub;
  return std::make_pair(a.layout.micro_batches, a.memory_bytes) <
         std::make_pair(b.layout.micro_batches, b.memory_bytes);
}

// The micro-batch counts a replica's batch of `replica_batch` is planned in: its divisors;
// one for model parallelism; for a pipeline of K stages, 2 to 8 K.
std::vector<int> MicroBatchChoices(StrategyKind strategy, int replica_batch, int K) {
  std::vector<int> ms;
  for (int m = 1; m <= replica_batch; ++m) {
    if (replica_batch % m != 0) continue;
    if (strategy == StrategyKind::kModel && m != 1) continue;
    if (strategy == StrategyKind::kPipeline && (m < 2 || m > 8 * K)) continue;
    ms.push_back(m);
  }
  return ms;
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
  // Tensor parallelism within a node: T a power of two dividing the heads, with sequence
  // parallelism off and on.
  std::vector<std::pair<int, bool>> tensor_layouts = {{1, false}};
  for (int t = 2; t <= std::min(r.gpus, r.gpus_per_node); t *= 2) {
    if (r.gpus % t != 0 || !CheckTensorParallel(model, t).ok()) continue;
    tensor_layouts.push_back({t, false});
    tensor_layouts.push_back({t, true});
  }
  for (const auto& [T, sp] : tensor_layouts)
  for (int K = 1; K <= r.gpus / T; ++K) {
    if (r.gpus / T % K != 0) continue;
    const int D = r.gpus / T / K;
    if (batch % D != 0) {
      ++plan.dropped[absl::StrFormat("the batch of %d does not split over %d replicas", batch,
                                     D)];
      continue;
    }
    Layout base;
    base.data_parallel = D;
    base.stages = K;
    base.tensor_parallel = T;
    base.sequence_parallel = sp;
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
      const std::vector<int> ms = MicroBatchChoices(strategy, batch / D, K);
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
  std::stable_sort(plan.ranked.begin(), plan.ranked.end(), RanksBefore);
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

}  // namespace tandem
