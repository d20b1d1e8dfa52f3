// The link model: how long a point-to-point transfer and a ring collective take on a link
// (LinkModel's alpha-beta pairs), read from --link or fitted to timed messages.
#include "planner/planner.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

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

}  // namespace tandem
