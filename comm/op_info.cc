// Descriptions and argument checks shared by the MPI and NCCL communicators.
#include "comm/op_info.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace tandem {
namespace {

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

absl::Status Bad(const CommIdentity& c, OpKind kind, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(c.Who(), ": ", OpKindName(kind), ": ", what));
}

absl::Status CheckTensor(const CommIdentity& c, OpKind kind, absl::string_view arg,
                         const Tensor& t) {
  if (!t.defined()) return Bad(c, kind, absl::StrCat(arg, " is undefined"));
  if (t.device() != c.device) {
    return Bad(c, kind,
               absl::StrCat(arg, " is ", t.ToString(), " but this communicator works on ",
                            c.device.ToString()));
  }
  return absl::OkStatus();
}

absl::Status CheckReducible(const CommIdentity& c, OpKind kind, const Tensor& t, ReduceOp op) {
  if (IsFloat(t.dtype())) return absl::OkStatus();
  if (t.dtype() == DType::kI32 && op == ReduceOp::kSum) return absl::OkStatus();
  return Bad(c, kind,
             absl::StrCat("cannot ", ReduceOpName(op), "-reduce ", DTypeName(t.dtype()),
                          " (f32, bf16 and f16 reduce; i32 only sums)"));
}

absl::Status CheckPeer(const CommIdentity& c, OpKind kind, absl::string_view role, int peer) {
  if (peer < 0 || peer >= c.world_size) {
    return Bad(c, kind,
               absl::StrCat(role, " ", peer, " is outside ranks 0..", c.world_size - 1));
  }
  return absl::OkStatus();
}

absl::Status CheckNotSelf(const CommIdentity& c, OpKind kind, int peer) {
  if (peer == c.rank) {
    return Bad(c, kind, absl::StrCat("peer ", peer, " is this rank; copy the tensor instead"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CommIdentity::Who() const {
  const int in_job = JobRank();
  if (group.empty()) return absl::StrCat("rank ", in_job);
  return absl::StrCat("rank ", in_job, " (", rank, " of ", group, ")");
}

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kSendRecv:
      return "send_recv";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kSplit:
      return "split";
    case OpKind::kReduceScatterParts:
      return "reduce_scatter_parts";
    case OpKind::kAllGatherParts:
      return "all_gather_parts";
  }
  return "?";
}

namespace {

std::vector<int64_t> PartSizes(const std::vector<int64_t>& offsets) {
  std::vector<int64_t> sizes;
  for (size_t r = 0; r + 1 < offsets.size(); ++r) sizes.push_back(offsets[r + 1] - offsets[r]);
  return sizes;
}

}  // namespace

std::string OpInfo::Describe() const {
  std::string head = absl::StrCat(OpKindName(kind), " #", sequence);
  const std::string data = absl::StrCat(DTypeName(dtype), " x ", count);
  switch (kind) {
    case OpKind::kAllReduce:
      return absl::StrCat(head, " (", data, ", ", ReduceOpName(op), ")");
    case OpKind::kBroadcast:
      return absl::StrCat(head, " (", data, ", root ", peer, ")");
    case OpKind::kAllGather:
      return absl::StrCat(head, " (", data, " per rank)");
    case OpKind::kReduceScatter:
      return absl::StrCat(head, " (", data, " per rank, ", ReduceOpName(op), ")");
    case OpKind::kSend:
      return absl::StrCat(head, " (", data, " to rank ", peer, ")");
    case OpKind::kRecv:
      return absl::StrCat(head, " (", data, " from rank ", peer, ")");
    case OpKind::kSendRecv:
      return absl::StrCat(head, " (to ranks [", absl::StrJoin(sends, ", "),
                          "], from ranks [", absl::StrJoin(recvs, ", "), "])");
    case OpKind::kReduceScatterParts:
    case OpKind::kAllGatherParts:
      return absl::StrCat(head, " (", data, " in parts of ", absl::StrJoin(PartSizes(offsets), "/"),
                          ")");
    case OpKind::kBarrier:
    case OpKind::kSplit:
      return head;
  }
  return head;
}

std::string OpInfo::WaitingFor(int world_size) const {
  switch (kind) {
    case OpKind::kSend:
      return absl::StrCat("rank ", peer, " to receive it");
    case OpKind::kRecv:
      return absl::StrCat("rank ", peer, " to send its ", DTypeName(dtype), " x ", count);
    case OpKind::kSendRecv:
      return absl::StrCat("ranks [", absl::StrJoin(sends, ", "), "] to receive and ranks [",
                          absl::StrJoin(recvs, ", "), "] to send");
    case OpKind::kBroadcast:
      return absl::StrCat("all ", world_size, " ranks to join it (root ", peer, ")");
    default:
      return absl::StrCat("all ", world_size, " ranks to join it");
  }
}

absl::StatusOr<OpInfo> CheckAllReduce(const CommIdentity& c, const Tensor& t, ReduceOp op) {
  OpInfo info;
  info.kind = OpKind::kAllReduce;
  absl::Status s = CheckTensor(c, info.kind, "tensor", t);
  if (s.ok()) s = CheckReducible(c, info.kind, t, op);
  if (!s.ok()) return s;
  info.dtype = t.dtype();
  info.count = t.numel();
  info.op = op;
  return info;
}

absl::StatusOr<OpInfo> CheckBroadcast(const CommIdentity& c, const Tensor& t, int root) {
  OpInfo info;
  info.kind = OpKind::kBroadcast;
  absl::Status s = CheckTensor(c, info.kind, "tensor", t);
  if (s.ok()) s = CheckPeer(c, info.kind, "root", root);
  if (!s.ok()) return s;
  info.dtype = t.dtype();
  info.count = t.numel();
  info.peer = c.JobRankOf(root);
  return info;
}

absl::StatusOr<OpInfo> CheckAllGather(const CommIdentity& c, const Tensor& out,
                                      const Tensor& in) {
  OpInfo info;
  info.kind = OpKind::kAllGather;
  absl::Status s = CheckTensor(c, info.kind, "out", out);
  if (s.ok()) s = CheckTensor(c, info.kind, "in", in);
  if (!s.ok()) return s;
  if (out.dtype() != in.dtype()) {
    return Bad(c, info.kind, absl::StrCat("out is ", DTypeName(out.dtype()), " but in is ",
                                          DTypeName(in.dtype())));
  }
  if (out.numel() != in.numel() * c.world_size) {
    return Bad(c, info.kind,
               absl::StrFormat("out has %d elements, expected world size %d x %d (in)",
                               out.numel(), c.world_size, in.numel()));
  }
  info.dtype = in.dtype();
  info.count = in.numel();
  return info;
}

absl::StatusOr<OpInfo> CheckReduceScatter(const CommIdentity& c, const Tensor& out,
                                          const Tensor& in, ReduceOp op) {
  OpInfo info;
  info.kind = OpKind::kReduceScatter;
  absl::Status s = CheckTensor(c, info.kind, "out", out);
  if (s.ok()) s = CheckTensor(c, info.kind, "in", in);
  if (s.ok()) s = CheckReducible(c, info.kind, in, op);
  if (s.ok() && op == ReduceOp::kMax) s = Bad(c, info.kind, "max reduces in all-reduce only");
  if (!s.ok()) return s;
  if (out.dtype() != in.dtype()) {
    return Bad(c, info.kind, absl::StrCat("out is ", DTypeName(out.dtype()), " but in is ",
                                          DTypeName(in.dtype())));
  }
  if (in.numel() != out.numel() * c.world_size) {
    return Bad(c, info.kind,
               absl::StrFormat("in has %d elements, expected world size %d x %d (out)",
                               in.numel(), c.world_size, out.numel()));
  }
  info.dtype = in.dtype();
  info.count = out.numel();
  info.op = op;
  return info;
}

namespace {

// Send and Recv take the same arguments and the same checks.
absl::StatusOr<OpInfo> CheckPointToPoint(const CommIdentity& c, OpKind kind, const Tensor& t,
                                         int peer) {
  OpInfo info;
  info.kind = kind;
  absl::Status s = CheckTensor(c, info.kind, "tensor", t);
  if (s.ok()) s = CheckPeer(c, info.kind, "peer", peer);
  if (s.ok()) s = CheckNotSelf(c, info.kind, peer);
  if (!s.ok()) return s;
  info.dtype = t.dtype();
  info.count = t.numel();
  info.peer = c.JobRankOf(peer);
  return info;
}

}  // namespace

absl::StatusOr<OpInfo> CheckSend(const CommIdentity& c, const Tensor& t, int peer) {
  return CheckPointToPoint(c, OpKind::kSend, t, peer);
}

absl::StatusOr<OpInfo> CheckRecv(const CommIdentity& c, const Tensor& t, int peer) {
  return CheckPointToPoint(c, OpKind::kRecv, t, peer);
}

absl::StatusOr<OpInfo> CheckSendRecv(const CommIdentity& c,
                                     const std::vector<PeerTransfer>& transfers) {
  OpInfo info;
  info.kind = OpKind::kSendRecv;
  if (transfers.empty()) return Bad(c, info.kind, "no transfers given");
  for (size_t i = 0; i < transfers.size(); ++i) {
    const PeerTransfer& x = transfers[i];
    const std::string arg = absl::StrCat("transfer ", i);
    absl::Status s = CheckTensor(c, info.kind, arg, x.tensor);
    if (s.ok()) s = CheckPeer(c, info.kind, absl::StrCat(arg, " peer"), x.peer);
    if (s.ok()) s = CheckNotSelf(c, info.kind, x.peer);
    if (!s.ok()) return s;
    (x.kind == PeerTransfer::Kind::kSend ? info.sends : info.recvs).push_back(c.JobRankOf(x.peer));
    info.count += x.tensor.numel();
  }
  info.dtype = transfers[0].tensor.dtype();
  return info;
}

absl::StatusOr<OpInfo> CheckParts(const CommIdentity& c, OpKind kind, const Tensor& t,
                                  const std::vector<int64_t>& offsets, const Tensor& out) {
  OpInfo info;
  info.kind = kind;
  RETURN_IF_ERROR(CheckTensor(c, kind, "t", t));
  if (t.dtype() != DType::kF32) {
    return Bad(c, kind, absl::StrCat("t is ", t.ToString(), "; the parts collectives move f32"));
  }
  if (static_cast<int>(offsets.size()) != c.world_size + 1 || offsets.front() != 0 ||
      offsets.back() != t.numel() ||
      !std::is_sorted(offsets.begin(), offsets.end())) {
    return Bad(c, kind,
               absl::StrFormat("offsets [%s] do not split %d elements into %d parts in order",
                               absl::StrJoin(offsets, ", "), t.numel(), c.world_size));
  }
  if (out.defined()) {
    RETURN_IF_ERROR(CheckTensor(c, kind, "out", out));
    const int64_t mine = offsets[c.rank + 1] - offsets[c.rank];
    if (out.dtype() != DType::kF32 || out.numel() != mine || out.device() != t.device()) {
      return Bad(c, kind,
                 absl::StrFormat("out is %s; this rank's part takes f32 x %d on %s",
                                 out.ToString(), mine, t.device().ToString()));
    }
  }
  info.dtype = t.dtype();
  info.count = t.numel();
  info.offsets = offsets;
  return info;
}

OpInfo BarrierInfo() {
  OpInfo info;
  info.kind = OpKind::kBarrier;
  return info;
}

absl::Status CheckSplitMembers(const CommIdentity& parent, const CommIdentity& group,
                               const std::vector<int>& members, const std::vector<int>* made) {
  const int me = parent.JobRank();
  const bool fits = static_cast<int>(members.size()) == group.world_size &&
                    members[group.rank] == me && (made == nullptr || *made == members);
  if (fits) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: split of %s: the layout says its members are ranks [%s], but the split %s",
      parent.Who(), group.group, absl::StrJoin(members, ", "),
      made != nullptr ? absl::StrCat("made ranks [", absl::StrJoin(*made, ", "), "]")
                      : absl::StrFormat("put rank %d at %d of %d", me, group.rank,
                                        group.world_size)));
}

OpInfo SplitInfo() {
  OpInfo info;
  info.kind = OpKind::kSplit;
  return info;
}

absl::Status WaitTimeoutError(const CommIdentity& c, const OpInfo& op, absl::Duration timeout,
                              absl::string_view progress) {
  return absl::DeadlineExceededError(absl::StrCat(
      c.Who(), ": ", op.Describe(), " not finished after ",
      absl::FormatDuration(timeout), ": waiting for ", op.WaitingFor(c.world_size),
      progress.empty() ? "" : "; ", progress));
}

absl::Status OpFailedError(const CommIdentity& c, absl::string_view description,
                           const absl::Status& cause) {
  return absl::Status(cause.code(), absl::StrCat(c.Who(), ": ", description,
                                                 " failed: ", cause.message()));
}

absl::Status OpAbortedError(const CommIdentity& c, const OpInfo& op, absl::string_view reason) {
  return absl::AbortedError(
      absl::StrCat(c.Who(), ": ", op.Describe(), " aborted: ", reason));
}

absl::Status RefusedAfterAbortError(const CommIdentity& c, OpKind kind,
                                    absl::string_view reason) {
  return absl::AbortedError(absl::StrCat(c.Who(), ": ", OpKindName(kind),
                                         " refused: the communicator was aborted: ", reason));
}

void BusyLedger::Add(uint64_t sequence, int64_t ns) {
  std::lock_guard<std::mutex> lock(mu_);
  total_ += ns;
  last_ = sequence;
  sums_[sequence % kCapacity] = total_;
}

double BusyLedger::SecondsThrough(uint64_t sequence) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (sequence == 0) return 0;
  if (sequence >= last_) return total_ * 1e-9;
  if (last_ - sequence >= kCapacity) sequence = last_ - kCapacity + 1;  // the oldest kept
  return sums_[sequence % kCapacity] * 1e-9;
}

double BusyLedger::Seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_ * 1e-9;
}

}  // namespace tandem
