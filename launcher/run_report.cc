// Reading the workers' metrics lines, per-rank totals and throughput, run.json, and the summary
// table.
#include "launcher/run_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/files.h"
#include "runtime/json.h"

namespace tandem {
namespace launcher {
std::vector<StepRecord> MetricsTail::ReadNew(std::vector<std::string>* errors) {
  std::vector<StepRecord> out;
  std::ifstream in(path_, std::ios::binary);
  if (!in) return out;
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  if (size < offset_) {  // truncated or replaced: start over
    offset_ = 0;
    partial_.clear();
  }
  if (size == offset_) return out;
  in.seekg(offset_);
  std::string chunk(static_cast<size_t>(size - offset_), '\0');
  in.read(&chunk[0], static_cast<std::streamsize>(chunk.size()));
  chunk.resize(static_cast<size_t>(in.gcount()));
  offset_ += static_cast<int64_t>(chunk.size());
  partial_ += chunk;
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    const absl::string_view line = absl::string_view(partial_).substr(start, nl - start);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<StepRecord> r = ParseMetricsLine(line);
    if (r.ok()) {
      out.push_back(*r);
    } else if (errors != nullptr) {
      errors->push_back(absl::StrCat(path_, ": ", r.status().message()));
    }
  }
  partial_ = partial_.substr(start);
  return out;
}

std::vector<StepRecord> ByStep(const std::vector<StepRecord>& records) {
  std::map<int, StepRecord> by_step;
  for (const StepRecord& r : records) by_step[r.step] = r;
  std::vector<StepRecord> out;
  for (const auto& kv : by_step) out.push_back(kv.second);
  return out;
}

std::vector<StepRecord> ReadMetricsFile(const std::string& path,
                                        std::vector<std::string>* errors) {
  MetricsTail tail(path);
  std::vector<StepRecord> all = tail.ReadNew(errors);
  return ByStep(all);
}

absl::Status TruncateMetricsFile(const std::string& path, int from) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::OkStatus();
  std::string kept, line;
  bool dropped = false;
  while (std::getline(in, line)) {
    const absl::StatusOr<StepRecord> r = ParseMetricsLine(line);
    if (r.ok() && r->step < from && !in.eof()) {  // a last line without '\n' was cut short
      absl::StrAppend(&kept, line, "\n");
    } else {
      dropped = true;
    }
  }
  return dropped ? WriteFileAtomically(path, kept) : absl::OkStatus();
}

absl::Status TruncateRunMetrics(const std::string& run_dir, int from) {
  for (int r = 0;; ++r) {
    const std::string path = MetricsPath(run_dir, r);
    if (!PathExists(path)) return absl::OkStatus();
    if (absl::Status s = TruncateMetricsFile(path, from); !s.ok()) return s;
  }
}

std::vector<std::vector<StepRecord>> ReadRunMetrics(const std::string& run_dir, int workers) {
  std::vector<std::vector<StepRecord>> ranks;
  for (int r = 0; r < workers; ++r) ranks.push_back(ReadMetricsFile(MetricsPath(run_dir, r)));
  return ranks;
}

RankTotals Totals(int rank, const std::vector<StepRecord>& steps) {
  RankTotals t;
  t.rank = rank;
  t.steps = static_cast<int>(steps.size());
  for (const StepRecord& s : steps) {
    t.compute_seconds += s.compute;
    t.comm_seconds += s.comm;
    t.step_seconds += s.seconds;
    t.exposed_comm_seconds += s.exposed_comm;
    t.tensor_comm_seconds += s.tensor_comm;
    t.bubble_seconds += s.bubble;
    t.optimizer_seconds += s.optimizer;
    t.comm_bytes += s.comm_bytes;
    t.peak_memory_bytes = std::max(t.peak_memory_bytes, s.peak_bytes);
    t.peak_activation_bytes =
        std::max(t.peak_activation_bytes,
                 s.peak_bytes - s.param_bytes - s.grad_bytes - s.optimizer_bytes);
    t.peak_in_flight = std::max(t.peak_in_flight, s.peak_in_flight);
    t.optimizer_bytes = std::max(t.optimizer_bytes, s.optimizer_bytes);
    t.breakdown = t.breakdown || s.breakdown;
  }
  std::vector<int64_t> syncs;
  for (const StepRecord& s : steps) syncs.push_back(s.host_syncs);
  if (!syncs.empty()) {
    std::sort(syncs.begin(), syncs.end());
    const size_t n = syncs.size();
    t.host_syncs_per_step =
        n % 2 ? syncs[n / 2] : 0.5 * static_cast<double>(syncs[n / 2 - 1] + syncs[n / 2]);
  }
  return t;
}

std::vector<double> CountedStepSeconds(const std::vector<std::vector<StepRecord>>& ranks) {
  std::map<int, std::vector<double>> per_step;  // step -> each rank's seconds, rank order
  for (const auto& rank : ranks) {
    for (const StepRecord& s : rank) per_step[s.step].push_back(s.seconds);
  }
  std::vector<std::vector<double>> by_rank(ranks.size());
  for (const auto& kv : per_step) {
    if (kv.second.size() != ranks.size()) continue;
    for (size_t r = 0; r < ranks.size(); ++r) by_rank[r].push_back(kv.second[r]);
  }
  // The slowest rank: the one with the largest sum, which is the mean's order.
  std::vector<double> slowest;
  double slowest_sum = -1;
  for (std::vector<double>& secs : by_rank) {
    secs.erase(secs.begin(), secs.begin() + WarmupStepsOf(secs.size()));
    double sum = 0;
    for (double s : secs) sum += s;
    if (sum > slowest_sum) slowest_sum = sum, slowest = std::move(secs);
  }
  return slowest;
}

double MeanStepSeconds(const std::vector<std::vector<StepRecord>>& ranks) {
  const std::vector<double> secs = CountedStepSeconds(ranks);
  if (secs.empty()) return 0;
  double sum = 0;
  for (double s : secs) sum += s;
  return sum / static_cast<double>(secs.size());
}

namespace {

// Tokens per second at a mean step time of `step_seconds`; 0 when none was measured.
double TokensPerSecondAt(double step_seconds, int64_t tokens_per_step) {
  return step_seconds > 0 ? static_cast<double>(tokens_per_step) / step_seconds : 0;
}

// Each rank's records of this run's steps: from the step it started at.
std::vector<std::vector<StepRecord>> ThisRun(const RunRecord& r) {
  std::vector<std::vector<StepRecord>> ranks;
  for (const std::vector<StepRecord>& steps : r.ranks) {
    ranks.emplace_back();
    for (const StepRecord& s : steps) {
      if (s.step >= r.first_step) ranks.back().push_back(s);
    }
  }
  return ranks;
}

// Each rank's totals over `ranks`' steps, in rank order.
std::vector<RankTotals> AllTotals(const std::vector<std::vector<StepRecord>>& ranks) {
  std::vector<RankTotals> totals;
  for (size_t i = 0; i < ranks.size(); ++i) {
    totals.push_back(Totals(static_cast<int>(i), ranks[i]));
  }
  return totals;
}

// The mean of the ranks' bubble fractions, summed in rank order.
double MeanBubbleFraction(const std::vector<RankTotals>& totals) {
  const int K = static_cast<int>(totals.size());
  double mean = 0;
  for (const RankTotals& t : totals) mean += t.bubble_fraction() / K;
  return mean;
}

// GPipe's bubble share of a step with K stages and M micro-batches: (K-1)/(M+K-1).
double GpipeBubbleFraction(int K, int M) { return double(K - 1) / (M + K - 1); }

}  // namespace

double TokensPerSecond(const std::vector<std::vector<StepRecord>>& ranks,
                       int64_t tokens_per_step) {
  return TokensPerSecondAt(MeanStepSeconds(ranks), tokens_per_step);
}

std::string FormatThousands(double v) {
  if (!std::isfinite(v)) return "-";
  const bool negative = v < 0;
  std::string digits = absl::StrCat(static_cast<int64_t>(std::llround(std::fabs(v))));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return negative ? "-" + out : out;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// ---- run.json ----

std::string RunJson(const RunRecord& r) {
  const JobConfig& c = r.job;
  Json j;
  // The whole configuration, field by field with JSON types (the keys of JobConfig::ToText).
  j["config"] = {
      {"strategy", c.strategy},
      {"workers", c.workers},
      {"device", c.device},
      {"model", c.model},
      {"n_layer", c.n_layer},
      {"d_model", c.d_model},
      {"n_head", c.n_head},
      {"seq_len", c.seq_len},
      {"attention", c.attention},
      {"tie_embeddings", c.tie_embeddings},
      {"dtype", c.dtype},
      {"steps", c.steps},
      {"batch", c.batch},
      {"micro_batches", c.micro_batches},
      {"schedule", c.schedule},
      {"virtual_stages", c.virtual_stages},
      {"balance", c.balance},
      {"data_parallel", c.data_parallel},
      {"tensor_parallel", c.tensor_parallel},
      {"sequence_parallel", c.sequence_parallel},
      {"zero", c.zero},
      {"lr", JsonNumber(c.lr)},
      {"warmup", c.warmup},
      {"optimizer", c.optimizer},
      {"weight_decay", JsonNumber(c.weight_decay)},
      {"decay_all", c.decay_all},
      {"clip_norm", JsonNumber(c.clip_norm)},
      {"seed", absl::StrCat(c.seed)},  // a uint64 may not fit a JSON reader's double
      {"data", c.data},
      {"data_format", c.data_format},
      {"vocab", c.vocab},
      {"synthetic", c.synthetic},
      {"val_data", c.val_data},
      {"val_fraction", JsonNumber(c.val_fraction)},
      {"eval_every", c.eval_every},
      {"eval_batches", c.eval_batches},
      {"run_dir", c.run_dir},
      {"checkpoint_every", c.checkpoint_every},
      {"resume", c.resume},
      {"init_from", c.init_from},
      {"bucket_mb", JsonNumber(c.bucket_mb)},
      {"overlap", c.overlap},
      {"recompute", c.recompute},
      {"heartbeat_timeout_s", JsonNumber(c.heartbeat_timeout_s)},
      {"profile", c.profile},
      {"log_every", c.log_every},
      {"debug_syncs", c.debug_syncs},
  };
  j["strategy"] = c.strategy;
  j["workers"] = c.workers;
  j["device"] = c.device;
  const ProcessGrid grid = c.Grid();
  j["replicas"] = grid.replicas;
  j["stages"] = grid.stages;
  j["tensors"] = grid.tensors;
  j["micro_batches"] = c.EffectiveMicroBatches();
  j["exit"] = r.exit;
  if (r.failed_rank >= 0) j["failed_rank"] = r.failed_rank;
  if (!r.failure.empty()) j["failure"] = r.failure;
  if (!r.abort_reason.empty()) j["abort_reason"] = r.abort_reason;
  if (r.restarts > 0) j["restarts"] = r.restarts;
  const std::vector<StepRecord> empty;
  const std::vector<StepRecord>& rank0 = r.ranks.empty() ? empty : r.ranks[0];
  // Rank 0's loss is the global batch's (every strategy reduces it).
  j["first_step"] = rank0.empty() ? 0 : rank0.front().step;  // the step of losses[0]
  // This run's figures (step times, throughput, the ranks' totals) are of its own steps: from
  // the step it started (or resumed) at; losses[] also holds the earlier runs' it continues.
  j["figures_from_step"] = r.first_step;
  Json losses = Json::array();  // floats, each written in full (null: not finite)
  for (const StepRecord& s : rank0) losses.push_back(JsonFloat(static_cast<float>(s.loss)));
  j["losses"] = std::move(losses);
  // [steps trained, validation loss] after each evaluation; only with validation data.
  Json val_losses = Json::array();
  for (const StepRecord& s : rank0) {
    if (s.val_loss) {
      val_losses.push_back(Json::array({s.step + 1, JsonFloat(static_cast<float>(*s.val_loss))}));
    }
  }
  if (!val_losses.empty()) j["val_losses"] = std::move(val_losses);
  j["steps_completed"] = rank0.size();
  const int64_t tokens_per_step = int64_t{c.batch} * r.seq_len;
  j["tokens_per_step"] = tokens_per_step;
  const std::vector<std::vector<StepRecord>> mine = ThisRun(r);
  const double step_seconds = MeanStepSeconds(mine);
  j["tokens_per_second"] = JsonNumber(TokensPerSecondAt(step_seconds, tokens_per_step));
  j["step_seconds_mean"] = JsonNumber(step_seconds);
  j["wall_seconds"] = JsonNumber(r.wall_seconds);
  const std::vector<RankTotals> totals = AllTotals(mine);
  if (c.strategy != "data" && !r.ranks.empty()) {
    j["bubble_fraction_measured"] = JsonNumber(MeanBubbleFraction(totals));
    j["bubble_fraction_gpipe"] =
        JsonNumber(GpipeBubbleFraction(grid.stages, c.EffectiveMicroBatches()));
  }
  Json ranks = Json::array();
  for (const RankTotals& t : totals) {
    Json k;
    k["rank"] = t.rank;
    k["replica"] = grid.ReplicaOf(t.rank);
    k["stage"] = grid.StageOf(t.rank);
    k["tensor"] = grid.TensorOf(t.rank);
    k["steps"] = t.steps;
    k["peak_memory_bytes"] = t.peak_memory_bytes;
    k["optimizer_state_bytes"] = t.optimizer_bytes;
    // Where the steps' time went; left out where only whole steps were measured (one device).
    if (t.breakdown) {
      k["compute_seconds"] = JsonNumber(t.compute_seconds);
      k["optimizer_seconds"] = JsonNumber(t.optimizer_seconds);
      // communication_seconds: the communicator's busy time (MPI's communication thread; on
      // NCCL the operations' time on the communication stream, by events); exposed: the part
      // the compute stream waited for; the rest ran hidden behind compute. Left out where no
      // busy time was measured.
      if (t.comm_seconds > 0) {
        k["communication_seconds"] = JsonNumber(t.comm_seconds);
        k["hidden_communication_share"] = JsonNumber(t.hidden_comm_share());
      }
      k["exposed_communication_seconds"] = JsonNumber(t.exposed_comm_seconds);
      k["tensor_parallel_wait_seconds"] = JsonNumber(t.tensor_comm_seconds);
      k["bubble_seconds"] = JsonNumber(t.bubble_seconds);
      k["bubble_fraction"] = JsonNumber(t.bubble_fraction());
      k["busy_seconds"] = JsonNumber(t.compute_seconds + t.optimizer_seconds);
      k["idle_seconds"] =
          JsonNumber(t.exposed_comm_seconds + t.tensor_comm_seconds + t.bubble_seconds);
    }
    k["peak_activation_bytes"] = t.peak_activation_bytes;
    k["peak_micro_batches_in_flight"] = t.peak_in_flight;
    k["communication_bytes"] = t.comm_bytes;
    k["host_syncs_per_step"] = JsonNumber(t.host_syncs_per_step);
    ranks.push_back(std::move(k));
  }
  j["ranks"] = std::move(ranks);
  // Objects one member a line, arrays on one line: `"losses": [...]` is one line to grep.
  return JsonText(j, JsonLayout::kObjects) + "\n";
}

absl::Status WriteRunJson(const RunRecord& r) {
  return WriteFileAtomically(absl::StrCat(r.job.run_dir, "/run.json"), RunJson(r));
}

std::string SummaryTable(const RunRecord& r) {
  const ProcessGrid grid = r.job.Grid();
  std::string out = absl::StrFormat(
      "%-5s %7s %5s %6s %10s %9s %9s %7s %9s %8s %11s %11s %11s %10s\n", "rank", "replica",
      "stage", "steps", "compute s", "comm s", "exposed s", "hidden", "bubble s", "comm MB",
      "activations", "optimizer", "peak memory", "syncs/step");
  const std::vector<std::vector<StepRecord>> mine = ThisRun(r);
  const std::vector<RankTotals> totals = AllTotals(mine);
  for (const RankTotals& t : totals) {
    const double hidden = t.hidden_comm_share();
    absl::StrAppendFormat(&out,
                          "%-5d %7d %5d %6d %10.3f %9s %9.3f %7s %9.3f %8.1f %11s %11s %11s %10g\n",
                          t.rank, grid.ReplicaOf(t.rank), grid.StageOf(t.rank), t.steps,
                          t.compute_seconds,
                          t.comm_seconds > 0 ? absl::StrFormat("%.3f", t.comm_seconds) : "-",
                          t.exposed_comm_seconds,
                          hidden >= 0 ? absl::StrFormat("%.0f%%", 100 * hidden) : "-",
                          t.bubble_seconds, static_cast<double>(t.comm_bytes) / (1 << 20),
                          FormatBytes(t.peak_activation_bytes), FormatBytes(t.optimizer_bytes),
                          FormatBytes(t.peak_memory_bytes), t.host_syncs_per_step);
  }
  // Tensor parallelism: each rank's tensor rank beside its replica and stage.
  if (grid.tensors > 1) absl::StrAppend(&out, "places      ", grid.Places(), "\n");
  if (r.job.strategy != "data" && !r.ranks.empty()) {
    // Interleaving v chunks a stage: (K-1)/(vM+K-1) (Narayanan et al.).
    const int v = r.job.schedule == "interleaved" ? r.job.virtual_stages : 1;
    absl::StrAppendFormat(
        &out, "bubble      %.3f of each step (optimizer aside) measured; %s = %.3f\n",
        MeanBubbleFraction(totals),
        v > 1 ? "interleaved (K-1)/(vM+K-1)" : "GPipe's (K-1)/(M+K-1)",
        GpipeBubbleFraction(grid.stages, v * r.job.EffectiveMicroBatches()));
  }
  if (grid.tensors > 1 && !totals.empty()) {
    // The blocks' all-reduces over each stage's tensor-parallel group, not in compute s.
    double wait = 0, step = 0;
    for (const RankTotals& t : totals) {
      wait += t.tensor_comm_seconds;
      step += t.step_seconds;
    }
    absl::StrAppendFormat(&out, "tp wait     %.3f s a rank, %.3f of its step time (T=%d)\n",
                          wait / totals.size(), step > 0 ? wait / step : 0.0, grid.tensors);
  }
  const std::vector<StepRecord>* rank0 = r.ranks.empty() ? nullptr : &r.ranks[0];
  const int64_t tokens_per_step = int64_t{r.job.batch} * r.seq_len;
  const double tps = TokensPerSecond(mine, tokens_per_step);
  absl::StrAppendFormat(&out, "steps       %d/%d\n", rank0 ? static_cast<int>(rank0->size()) : 0,
                        r.job.steps);
  if (rank0 != nullptr && !rank0->empty()) {
    const double loss = rank0->back().loss;
    absl::StrAppendFormat(&out, "final loss  %s\n",
                          std::isfinite(loss) ? absl::StrFormat("%.4f", loss) : "nan (diverged)");
    for (auto it = rank0->rbegin(); it != rank0->rend(); ++it) {
      if (!it->val_loss) continue;
      absl::StrAppendFormat(&out, "val loss    %.4f (after step %d)\n", *it->val_loss,
                            it->step + 1);
      break;
    }
  }
  absl::StrAppendFormat(&out, "throughput  %s tok/s\n", tps > 0 ? FormatThousands(tps) : "-");
  absl::StrAppendFormat(&out, "wall time   %s\n", FormatDuration(r.wall_seconds));
  absl::StrAppendFormat(&out, "result      %s\n", r.exit);
  absl::StrAppendFormat(&out, "run dir     %s\n", r.job.run_dir);
  return out;
}

}  // namespace launcher
}  // namespace tandem
