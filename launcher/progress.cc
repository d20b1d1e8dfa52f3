// The progress line's formatting and display (rewritten on a terminal, periodic elsewhere).
#include "launcher/progress.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace launcher {

std::string FormatProgress(const ProgressState& s) {
  return absl::StrFormat(
      "step %d/%d  loss %s%s  %s tok/s  peak %s%s  ETA %s", s.step, s.total,
      s.has_loss ? absl::StrFormat("%.4f", s.loss) : std::string("-"),
      s.has_val_loss ? absl::StrFormat("  val %.4f", s.val_loss) : std::string(),
      s.tokens_per_second > 0 ? FormatThousands(s.tokens_per_second) : std::string("-"),
      FormatBytes(s.peak_bytes), s.peak_where.empty() ? "" : " on " + s.peak_where,
      FormatDuration(s.eta_seconds));
}

void ProgressTracker::Add(int rank, const StepRecord& r) {
  if (rank == 0 && (!has_rank0_ || r.step >= last_rank0_.step)) {
    last_rank0_ = r;
    has_rank0_ = true;
  }
  if (rank == 0 && r.val_loss && r.step >= val_step_) val_step_ = r.step, val_loss_ = *r.val_loss;
  if (r.peak_bytes > peak_bytes_) peak_bytes_ = r.peak_bytes, peak_rank_ = rank;
  if (rank < 0 || rank >= ranks_) return;
  auto& p = pending_[r.step];
  if (p.second.empty()) p.second.assign(ranks_, 0.0);
  p.first += 1;
  p.second[rank] = r.seconds;
  if (p.first < ranks_) return;
  // Every rank reported this step.
  ++completed_;
  for (int k = 0; k < ranks_; ++k) completed_seconds_[k] += p.second[k];
  first_.push_back({r.step, std::move(p.second)});
  std::sort(first_.begin(), first_.end());
  if (first_.size() > static_cast<size_t>(kWarmupSteps)) first_.pop_back();
  pending_.erase(r.step);
}

double ProgressTracker::MeanStepSeconds() const {
  if (completed_ == 0) return 0;
  const bool warmup = completed_ > kWarmupSteps;  // left out when later steps exist
  double slowest = 0;
  for (int k = 0; k < ranks_; ++k) {
    double counted = completed_seconds_[k];
    if (warmup) {
      for (const auto& f : first_) counted -= f.second[k];  // the warm-up steps
    }
    slowest = std::max(slowest, counted);
  }
  return slowest / (warmup ? completed_ - kWarmupSteps : completed_);
}

ProgressState ProgressTracker::State() const {
  ProgressState s;
  s.total = total_;
  if (has_rank0_) {
    s.step = last_rank0_.step + 1;
    s.loss = last_rank0_.loss;
    s.has_loss = true;
  }
  s.has_val_loss = val_step_ >= 0;
  s.val_loss = val_loss_;
  s.peak_bytes = peak_bytes_;
  if (grid_.hybrid() && peak_rank_ >= 0 && peak_rank_ < grid_.ranks()) {
    s.peak_where = absl::StrFormat("rank %d %s", peak_rank_, grid_.Place(peak_rank_));
  }
  const double step_seconds = MeanStepSeconds();
  if (step_seconds > 0) {
    s.tokens_per_second = static_cast<double>(tokens_per_step_) / step_seconds;
    s.eta_seconds = std::max(0, total_ - s.step) * step_seconds;
  }
  return s;
}

ProgressState ComputeProgress(const std::vector<std::vector<StepRecord>>& ranks, int total,
                              int64_t tokens_per_step, ProcessGrid grid) {
  ProgressTracker t(static_cast<int>(ranks.size()), total, tokens_per_step, grid);
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const StepRecord& x : ranks[r]) t.Add(static_cast<int>(r), x);
  }
  return t.State();
}

void ProgressDisplay::ClearLocked() {
  if (terminal_ && !shown_.empty()) {
    std::fputs("\r\033[K", out_);
    shown_.clear();
  }
}

void ProgressDisplay::Update(const std::string& line, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (terminal_) {
    if (line == shown_) return;
    std::fputs("\r\033[K", out_);
    std::fputs(line.c_str(), out_);
    shown_ = line;
    std::fflush(out_);
    return;
  }
  if (now - last_print_ < interval_) return;
  last_print_ = now;
  if (line == last_printed_) return;
  last_printed_ = line;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void ProgressDisplay::Finish(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (terminal_) {
    std::fputs("\r\033[K", out_);
    std::fprintf(out_, "%s\n", line.c_str());
    shown_.clear();
  } else if (line != last_printed_) {
    std::fprintf(out_, "%s\n", line.c_str());
    last_printed_ = line;
  }
  std::fflush(out_);
}

void ProgressDisplay::Print(FILE* stream, const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string shown = shown_;
  ClearLocked();
  std::fflush(out_);
  std::fputs(text.c_str(), stream);
  if (text.empty() || text.back() != '\n') std::fputc('\n', stream);
  std::fflush(stream);
  if (terminal_ && !shown.empty()) {
    std::fputs(shown.c_str(), out_);
    shown_ = shown;
    std::fflush(out_);
  }
}

}  // namespace launcher
}  // namespace tandem
