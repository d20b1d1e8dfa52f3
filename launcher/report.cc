// Reading the workers' metrics lines, per-rank totals and throughput, run.json through a small
// JSON writer, and the summary table.
#include "launcher/report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/files.h"

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

RankTotals Totals(int rank, const std::vector<StepRecord>& steps) {
  RankTotals t;
  t.rank = rank;
  t.steps = static_cast<int>(steps.size());
  for (const StepRecord& s : steps) {
    t.compute_seconds += s.compute;
    t.comm_seconds += s.comm;
    t.step_seconds += s.seconds;
    t.exposed_comm_seconds += s.exposed_comm;
    t.bubble_seconds += s.bubble;
    t.optimizer_seconds += s.optimizer;
    t.comm_bytes += s.comm_bytes;
    t.peak_memory_bytes = std::max(t.peak_memory_bytes, s.peak_bytes);
    t.peak_activation_bytes =
        std::max(t.peak_activation_bytes,
                 s.peak_bytes - s.param_bytes - s.grad_bytes - s.optimizer_bytes);
    t.peak_in_flight = std::max(t.peak_in_flight, s.peak_in_flight);
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

// ---- JSON ----

std::string JsonWriter::Quote(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out.push_back(static_cast<char>(c));  // UTF-8 passes through
        }
    }
  }
  out += "\"";
  return out;
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ", ";
    first_.back() = false;
  }
}

JsonWriter& JsonWriter::BeginObject() {
  BeforeValue();
  out_ += "{";
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::EndObject() {
  const bool empty = first_.back();
  first_.pop_back();
  if (!empty) out_ += "\n" + std::string(2 * first_.size(), ' ');
  out_ += "}";
  return *this;
}

JsonWriter& JsonWriter::BeginArray() {
  BeforeValue();
  out_ += "[";
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::EndArray() {
  first_.pop_back();
  out_ += "]";
  return *this;
}

JsonWriter& JsonWriter::Key(absl::string_view key) {
  if (!first_.back()) out_ += ",";
  first_.back() = false;
  out_ += "\n" + std::string(2 * first_.size(), ' ') + Quote(key) + ": ";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::String(absl::string_view s) {
  BeforeValue();
  out_ += Quote(s);
  return *this;
}

JsonWriter& JsonWriter::Number(double v) {
  BeforeValue();
  out_ += std::isfinite(v) ? absl::StrFormat("%.9g", v) : "null";
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t v) {
  BeforeValue();
  out_ += absl::StrCat(v);
  return *this;
}

JsonWriter& JsonWriter::Bool(bool b) {
  BeforeValue();
  out_ += b ? "true" : "false";
  return *this;
}

std::string RunJson(const RunRecord& r) {
  const JobConfig& c = r.job;
  JsonWriter w;
  w.BeginObject();
  // The whole configuration, field by field with JSON types (the keys of JobConfig::ToText).
  w.Key("config").BeginObject();
  w.Key("strategy").String(c.strategy);
  w.Key("workers").Int(c.workers);
  w.Key("device").String(c.device);
  w.Key("model").String(c.model);
  w.Key("n_layer").Int(c.n_layer);
  w.Key("d_model").Int(c.d_model);
  w.Key("n_head").Int(c.n_head);
  w.Key("seq_len").Int(c.seq_len);
  w.Key("attention").String(c.attention);
  w.Key("dtype").String(c.dtype);
  w.Key("steps").Int(c.steps);
  w.Key("batch").Int(c.batch);
  w.Key("micro_batches").Int(c.micro_batches);
  w.Key("schedule").String(c.schedule);
  w.Key("balance").String(c.balance);
  w.Key("lr").Number(c.lr);
  w.Key("warmup").Int(c.warmup);
  w.Key("optimizer").String(c.optimizer);
  w.Key("weight_decay").Number(c.weight_decay);
  w.Key("clip_norm").Number(c.clip_norm);
  w.Key("seed").String(absl::StrCat(c.seed));  // a uint64 may not fit a JSON double
  w.Key("data").String(c.data);
  w.Key("synthetic").Bool(c.synthetic);
  w.Key("run_dir").String(c.run_dir);
  w.Key("checkpoint_every").Int(c.checkpoint_every);
  w.Key("resume").String(c.resume);
  w.Key("bucket_mb").Number(c.bucket_mb);
  w.Key("overlap").Bool(c.overlap);
  w.Key("recompute").Bool(c.recompute);
  w.Key("heartbeat_timeout_s").Number(c.heartbeat_timeout_s);
  w.Key("profile").Bool(c.profile);
  w.Key("log_every").Int(c.log_every);
  w.Key("debug_syncs").Bool(c.debug_syncs);
  w.EndObject();

  w.Key("strategy").String(c.strategy);
  w.Key("workers").Int(c.workers);
  w.Key("device").String(c.device);
  w.Key("micro_batches").Int(c.EffectiveMicroBatches());
  w.Key("exit").String(r.exit);
  if (r.failed_rank >= 0) w.Key("failed_rank").Int(r.failed_rank);
  if (!r.failure.empty()) w.Key("failure").String(r.failure);
  if (!r.abort_reason.empty()) w.Key("abort_reason").String(r.abort_reason);
  if (r.restarts > 0) w.Key("restarts").Int(r.restarts);
  const std::vector<StepRecord> empty;
  const std::vector<StepRecord>& rank0 = r.ranks.empty() ? empty : r.ranks[0];
  // Rank 0's loss is the global batch's (every strategy reduces it).
  w.Key("first_step").Int(rank0.empty() ? 0 : rank0.front().step);  // the step of losses[0]
  // This run's figures (step times, throughput, the ranks' totals) are of its own steps: from
  // the step it started (or resumed) at; losses[] also holds the earlier runs' it continues.
  w.Key("figures_from_step").Int(r.first_step);
  w.Key("losses").BeginArray();
  for (const StepRecord& s : rank0) w.Number(s.loss);
  w.EndArray();
  w.Key("steps_completed").Int(static_cast<int64_t>(rank0.size()));
  const int64_t tokens_per_step = int64_t{c.batch} * r.seq_len;
  w.Key("tokens_per_step").Int(tokens_per_step);
  const std::vector<std::vector<StepRecord>> mine = ThisRun(r);
  const double step_seconds = MeanStepSeconds(mine);
  w.Key("tokens_per_second").Number(TokensPerSecondAt(step_seconds, tokens_per_step));
  w.Key("step_seconds_mean").Number(step_seconds);
  w.Key("wall_seconds").Number(r.wall_seconds);
  const std::vector<RankTotals> totals = AllTotals(mine);
  if (c.strategy != "data" && !r.ranks.empty()) {
    const int K = static_cast<int>(r.ranks.size()), M = c.EffectiveMicroBatches();
    w.Key("bubble_fraction_measured").Number(MeanBubbleFraction(totals));
    w.Key("bubble_fraction_gpipe").Number(GpipeBubbleFraction(K, M));
  }
  w.Key("ranks").BeginArray();
  for (const RankTotals& t : totals) {
    w.BeginObject();
    w.Key("rank").Int(t.rank);
    w.Key("steps").Int(t.steps);
    w.Key("peak_memory_bytes").Int(t.peak_memory_bytes);
    w.Key("compute_seconds").Number(t.compute_seconds);
    w.Key("optimizer_seconds").Number(t.optimizer_seconds);
    // communication_seconds: the communicator's busy time (MPI's communication thread; on
    // NCCL the operations' time on the communication stream, by events); exposed: the part
    // the compute stream waited for; the rest ran hidden behind compute. Left out where no
    // busy time was measured.
    if (t.comm_seconds > 0) {
      w.Key("communication_seconds").Number(t.comm_seconds);
      w.Key("hidden_communication_share").Number(t.hidden_comm_share());
    }
    w.Key("exposed_communication_seconds").Number(t.exposed_comm_seconds);
    w.Key("bubble_seconds").Number(t.bubble_seconds);
    w.Key("bubble_fraction").Number(t.bubble_fraction());
    w.Key("busy_seconds").Number(t.compute_seconds + t.optimizer_seconds);
    w.Key("idle_seconds").Number(t.exposed_comm_seconds + t.bubble_seconds);
    w.Key("peak_activation_bytes").Int(t.peak_activation_bytes);
    w.Key("peak_micro_batches_in_flight").Int(t.peak_in_flight);
    w.Key("communication_bytes").Int(t.comm_bytes);
    w.Key("host_syncs_per_step").Number(t.host_syncs_per_step);
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return w.str() + "\n";
}

std::string SummaryTable(const RunRecord& r) {
  std::string out = absl::StrFormat("%-5s %6s %10s %9s %9s %7s %9s %8s %11s %11s %10s\n",
                                    "rank", "steps", "compute s", "comm s", "exposed s",
                                    "hidden", "bubble s", "comm MB", "activations",
                                    "peak memory", "syncs/step");
  const std::vector<std::vector<StepRecord>> mine = ThisRun(r);
  const std::vector<RankTotals> totals = AllTotals(mine);
  for (const RankTotals& t : totals) {
    const double hidden = t.hidden_comm_share();
    absl::StrAppendFormat(&out, "%-5d %6d %10.3f %9s %9.3f %7s %9.3f %8.1f %11s %11s %10g\n",
                          t.rank, t.steps, t.compute_seconds,
                          t.comm_seconds > 0 ? absl::StrFormat("%.3f", t.comm_seconds) : "-",
                          t.exposed_comm_seconds,
                          hidden >= 0 ? absl::StrFormat("%.0f%%", 100 * hidden) : "-",
                          t.bubble_seconds, static_cast<double>(t.comm_bytes) / (1 << 20),
                          FormatBytes(t.peak_activation_bytes),
                          FormatBytes(t.peak_memory_bytes), t.host_syncs_per_step);
  }
  if (r.job.strategy != "data" && !r.ranks.empty()) {
    const int K = static_cast<int>(r.ranks.size()), M = r.job.EffectiveMicroBatches();
    absl::StrAppendFormat(&out, "bubble      %.3f of each step measured; GPipe's (K-1)/(M+K-1) = %.3f\n",
                          MeanBubbleFraction(totals), GpipeBubbleFraction(K, M));
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
  }
  absl::StrAppendFormat(&out, "throughput  %s tok/s\n", tps > 0 ? FormatThousands(tps) : "-");
  absl::StrAppendFormat(&out, "wall time   %s\n", FormatDuration(r.wall_seconds));
  absl::StrAppendFormat(&out, "result      %s\n", r.exit);
  absl::StrAppendFormat(&out, "run dir     %s\n", r.job.run_dir);
  return out;
}

}  // namespace launcher
}  // namespace tandem
