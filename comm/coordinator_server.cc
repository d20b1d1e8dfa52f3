// The coordinator service: one mutex guards the job's state (ranks, store, barriers, abort).
// Blocking calls (KeyWait, Barrier) wait on that mutex's conditions in slices of at most
// 100 ms, so they end at their timeout, on abort, on shutdown or when the caller gives up,
// and never hold a gRPC thread for longer than the capped timeout.
#include "comm/coordinator_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "comm/coordinator.grpc.pb.h"
#include "comm/job_token.h"
#include "runtime/status.h"

#define GRPC_RETURN_IF_ERROR_(expr)               \
  do {                                            \
    ::grpc::Status tandem_grpc_status_ = (expr);  \
    if (!tandem_grpc_status_.ok()) return tandem_grpc_status_; \
  } while (0)

namespace tandem {
namespace {

constexpr absl::Duration kWaitSlice = absl::Milliseconds(100);

grpc::Status Invalid(absl::string_view message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(message));
}

// Keys and barrier names: 1..kMaxKeyBytes of [A-Za-z0-9_.:/-].
grpc::Status CheckName(absl::string_view what, absl::string_view name) {
  if (name.empty()) return Invalid(absl::StrCat(what, " is empty"));
  if (name.size() > kMaxKeyBytes) {
    return Invalid(absl::StrFormat("%s is %d bytes, more than the %d allowed", what,
                                   name.size(), kMaxKeyBytes));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' &&
        c != ':' && c != '/' && c != '-') {
      return Invalid(absl::StrFormat(
          "%s '%s' has a character outside [A-Za-z0-9_.:/-]", what,
          absl::CHexEscape(name.substr(0, 64))));
    }
  }
  return grpc::Status::OK;
}

// Free text shown in reports: printable ASCII, at most `max` bytes.
grpc::Status CheckText(absl::string_view what, absl::string_view text, size_t max,
                       bool required) {
  if (required && text.empty()) return Invalid(absl::StrCat(what, " is empty"));
  if (text.size() > max) {
    return Invalid(
        absl::StrFormat("%s is %d bytes, more than the %d allowed", what, text.size(), max));
  }
  for (char c : text) {
    if (!absl::ascii_isprint(static_cast<unsigned char>(c))) {
      return Invalid(absl::StrCat(what, " has a non-printable character"));
    }
  }
  return grpc::Status::OK;
}

grpc::Status CheckTimeout(int64_t timeout_ms) {
  if (timeout_ms < 0) return Invalid(absl::StrCat("timeout_ms is negative (", timeout_ms, ")"));
  return grpc::Status::OK;
}

// A heartbeat's report, of a rank already checked: only what a worker can have measured is
// stored. A refusal names the rank, the field and the value; the rank's next good report is
// taken as usual.
grpc::Status CheckReport(const rpc::HeartbeatRequest& req) {
  const std::string rank = absl::StrCat("Heartbeat: rank ", req.rank(), ": ");
  GRPC_RETURN_IF_ERROR_(CheckText(rank + "phase", req.phase(), kMaxTextBytes, false));
  GRPC_RETURN_IF_ERROR_(CheckText(rank + "device", req.device(), kMaxTextBytes, false));
  if (req.step() < 0) return Invalid(absl::StrCat(rank, "step ", req.step(), " < 0"));
  // Sequence numbers count up from 0 (Communicator::last_issued_sequence): one above the
  // largest int64 is a negative count sent as unsigned.
  constexpr uint64_t kMaxSequence = std::numeric_limits<int64_t>::max();
  for (const auto& [field, value] : {std::make_pair("collective_issued", req.collective_issued()),
                                     std::make_pair("collective_completed",
                                                    req.collective_completed())}) {
    if (value > kMaxSequence) {
      return Invalid(absl::StrFormat("%s%s %d is more than %d (a negative count sent unsigned?)",
                                     rank, field, value, kMaxSequence));
    }
  }
  // A worker reads the completed number before the issued one, and an operation is issued
  // before it completes: never more completed than issued.
  if (req.collective_completed() > req.collective_issued()) {
    return Invalid(absl::StrFormat("%scollective #%d completed but only #%d issued", rank,
                                   req.collective_completed(), req.collective_issued()));
  }
  // The loss is not checked: a skipped f16 step's is inf or nan and training goes on (a worker
  // whose loss diverged aborts the job itself).
  const rpc::Metrics& m = req.metrics();
  if (!std::isfinite(m.step_time_ms()) || m.step_time_ms() < 0) {
    return Invalid(absl::StrFormat("%sstep_time_ms %g is not a finite time >= 0", rank,
                                   m.step_time_ms()));
  }
  for (const auto& [field, value] :
       {std::make_pair("memory_allocated_bytes", m.memory_allocated_bytes()),
        std::make_pair("memory_peak_bytes", m.memory_peak_bytes())}) {
    if (value < 0) return Invalid(absl::StrFormat("%s%s %d < 0", rank, field, value));
  }
  // Both come from one snapshot of the allocator, whose peak is the most it ever held.
  if (m.memory_allocated_bytes() > m.memory_peak_bytes()) {
    return Invalid(absl::StrFormat("%smemory_allocated_bytes %d is more than memory_peak_bytes %d",
                                   rank, m.memory_allocated_bytes(), m.memory_peak_bytes()));
  }
  return grpc::Status::OK;
}

bool IsLoopbackHost(absl::string_view host) {
  return host == "localhost" || host == "[::1]" || absl::StartsWith(host, "127.");
}

// Splits "host:port" / "[v6]:port".
absl::Status SplitAddress(absl::string_view address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator address '", address, "' is not host:port"));
  }
  *host = std::string(address.substr(0, colon));
  if (!absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator address '", address, "' has no valid port"));
  }
  return absl::OkStatus();
}

struct RankRecord {
  bool registered = false;
  std::string host;
  std::string peer;
  int64_t pid = 0;
  std::string device;
  bool reported = false;  // a heartbeat arrived
  int64_t step = 0;
  std::string phase;
  uint64_t issued = 0;
  uint64_t completed = 0;
  rpc::Metrics metrics;
  bool finished = false;
  absl::Time last_heard;  // registration or last heartbeat, on the options' clock
  std::string refused;    // why the last heartbeat was refused ("" if it was taken)
};

struct BarrierState {
  uint64_t generation = 0;  // counts completed rounds; a waiter is released when it moves
  std::set<int> arrived;
};

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

}  // namespace

class CoordinatorServer::Impl final : public rpc::Coordinator::Service {
 public:
  explicit Impl(CoordinatorServerOptions options)
      : options_(std::move(options)),
        clock_(options_.clock ? options_.clock : Clock::Real()),
        ranks_(options_.world_size),
        start_(clock_->Now()) {}

  ~Impl() override { Stop(); }

  // `host`: the host part of options_.address, as Start split it.
  absl::Status Serve(std::string host) {
    host_ = std::move(host);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(options_.address, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    // A value of the largest size plus the message around it; larger requests are refused
    // by gRPC itself before they are parsed.
    builder.SetMaxReceiveMessageSize(static_cast<int>(kMaxValueBytes + (64 << 10)));
    grpc::ResourceQuota quota("tandem-coordinator");
    quota.SetMaxThreads(std::max(64, 4 * options_.world_size + 32));
    builder.SetResourceQuota(quota);
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      server_.reset();
      return absl::UnavailableError(
          absl::StrCat("coordinator: cannot listen on ", options_.address,
                       " (address in use or not local?)"));
    }
    watchdog_ = std::thread([this] { WatchdogLoop(); });
    return absl::OkStatus();
  }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      stopped_ = true;
      shutting_down_ = true;  // wakes waiting calls and the watchdog
    }
    if (watchdog_.joinable()) watchdog_.join();
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      server_->Wait();
    }
  }

  int port() const { return port_; }
  std::string address() const { return absl::StrCat(host_, ":", port_); }

  // ---- the RPCs ----

  grpc::Status Register(grpc::ServerContext* ctx, const rpc::RegisterRequest* req,
                        rpc::RegisterResponse* resp) override {
    GRPC_RETURN_IF_ERROR_(CheckToken(ctx));
    GRPC_RETURN_IF_ERROR_(CheckWorkerRank("Register", req->rank()));
    if (req->world_size() != options_.world_size) {
      return Invalid(absl::StrFormat("Register: rank %d believes the world size is %d; the job "
                                     "has %d ranks",
                                     req->rank(), req->world_size(), options_.world_size));
    }
    GRPC_RETURN_IF_ERROR_(CheckText("Register: host", req->host(), kMaxTextBytes, true));
    GRPC_RETURN_IF_ERROR_(CheckText("Register: device", req->device(), kMaxTextBytes, true));
    if (req->pid() <= 0) {
      return Invalid(absl::StrCat("Register: pid ", req->pid(), " is not a pid"));
    }
    absl::MutexLock lock(&mu_);
    if (aborted_) return AbortedStatus("Register");
    RankRecord& r = ranks_[req->rank()];
    if (r.registered) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrFormat("Register: rank %d is already registered (host %s, "
                                          "pid %d); refused host %s, pid %d",
                                          req->rank(), r.host, r.pid, req->host(), req->pid()));
    }
    r.registered = true;
    r.host = req->host();
    r.peer = ctx->peer();
    r.pid = req->pid();
    r.device = req->device();
    r.last_heard = clock_->Now();
    resp->set_world_size(options_.world_size);
    resp->set_job_config(options_.job_config);
    if (options_.events) {
      options_.events(absl::StrFormat("rank %d registered from %s (host %s, pid %d)\n",
                                      req->rank(), r.peer, r.host, r.pid));
    }
    return grpc::Status::OK;
  }

  grpc::Status KeySet(grpc::ServerContext* ctx, const rpc::KeySetRequest* req,
                      rpc::KeySetResponse*) override {
    GRPC_RETURN_IF_ERROR_(CheckToken(ctx));
    GRPC_RETURN_IF_ERROR_(CheckWorkerRank("KeySet", req->rank()));
    GRPC_RETURN_IF_ERROR_(CheckName("KeySet: key", req->key()));
    if (req->value().size() > kMaxValueBytes) {
      return Invalid(absl::StrFormat("KeySet: value for '%s' is %d bytes, more than the %d "
                                     "allowed",
                                     req->key(), req->value().size(), kMaxValueBytes));
    }
    absl::MutexLock lock(&mu_);
    auto it = store_.find(req->key());
    const size_t old_bytes = it == store_.end() ? 0 : it->first.size() + it->second.size();
    const size_t new_bytes = req->key().size() + req->value().size();
    if (it == store_.end() && store_.size() >= kMaxKeys) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("KeySet: the store already holds ", kMaxKeys, " keys"));
    }
    if (store_bytes_ - old_bytes + new_bytes > kMaxStoreBytes) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("KeySet: the store would exceed ", kMaxStoreBytes,
                                       " bytes"));
    }
    store_bytes_ = store_bytes_ - old_bytes + new_bytes;
    store_[req->key()] = req->value();
    return grpc::Status::OK;
  }

  grpc::Status KeyGet(grpc::ServerContext* ctx, const rpc::KeyGetRequest* req,
                      rpc::KeyGetResponse* resp) override {
    GRPC_RETURN_IF_ERROR_(CheckToken(ctx));
    GRPC_RETURN_IF_ERROR_(CheckWorkerRank("KeyGet", req->rank()));
    GRPC_RETURN_IF_ERROR_(CheckName("KeyGet: key", req->key()));
    absl::MutexLock lock(&mu_);
    auto it = store_.find(req->key());
    if (it == store_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("KeyGet: no key '", req->key(), "'"));
    }
    resp->set_value(it->second);
    return grpc::Status::OK;
  }

  grpc::Status KeyWait(grpc::ServerContext* ctx, const rpc::KeyWaitRequest* req,
                       rpc::KeyWaitResponse* resp) override {
    GRPC_RETURN_IF_ERROR_(CheckToken(ctx));
    GRPC_RETURN_IF_ERROR_(CheckWorkerRank("KeyWait", req->rank()));
    GRPC_RETURN_IF_ERROR_(CheckName("KeyWait: key", req->key()));
    GRPC_RETURN_IF_ERROR_(CheckTimeout(req->timeout_ms()));
    const absl::Duration timeout = CapWait(req->timeout_ms());
    const std::string& key = req->key();
    absl::MutexLock lock(&mu_);
    const WaitEnd end = WaitLocked(ctx, timeout, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return store_.count(key) > 0;
    });
    const std::string what = absl::StrFormat("KeyWait: rank %d waiting for key '%s'",
                                             req->rank(), key);
    if (end != WaitEnd::kReady) return WaitEndStatus(end, what, timeout, "");
    resp->set_value(store_[key]);
    return grpc::Status::OK;
  }

  grpc::Status Barrier(grpc::ServerContext* ctx, const rpc::BarrierRequest* req,
                       rpc::BarrierResponse*) override {
    GRPC_RETURN_IF_ERROR_(CheckToken(ctx));
    GRPC_RETURN_IF_ERROR_(CheckWorkerRank("Barrier", req->rank()));
    GRPC_RETURN_IF_ERROR_(CheckName("Barrier: name", req->name()));
    GRPC_RETURN_IF_ERROR_(CheckTimeout(req->timeout_ms()));
    const absl::Duration timeout = CapWait(req->timeout_ms());
    const int rank = req->rank();
    absl::MutexLock lock(&mu_);
    if (barriers_.count(req->name()) == 0 && barriers_.size() >= kMaxBarrierNames) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("Barrier: more than ", kMaxBarrierNames, " names"));
    }
    BarrierState& b = barriers_[req->name()];
    if (b.arrived.count(rank)) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("Barrier: rank %d is already waiting at barrier '%s'",
                                          rank, req->name()));
    }
    const uint64_t generation = b.generation;
    b.arrived.insert(rank);
    if (static_cast<int>(b.arrived.size()) == options_.world_size) {
      b.arrived.clear();
      ++b.generation;
      return grpc::Status::OK;
    }
    const WaitEnd end = WaitLocked(ctx, timeout, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return b.generation != generation;
    });
    if (end == WaitEnd::kReady) return grpc::Status::OK;
    b.arrived.erase(rank);  // this rank leaves; a retry arrives afresh
    std::vector<int> missing;
    for (int r = 0; r < options_.world_size; ++r) {
      if (r != rank && !b.arrived.count(r)) missing.push_back(r);
    }
    return WaitEndStatus(
        end, absl::StrFormat("Barrier: rank %d at barrier '%s'", rank, req->name()), timeout,
        absl::StrFormat("%d of %d ranks arrived; missing %s", b.arrived.size() + 1,
                        options_.world_size, RankList(missing)));
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const rpc::HeartbeatRequest* req,
                         rpc::HeartbeatResponse* resp) override {
    GRPC_RETURN_IF_ERROR_(CheckToken(ctx));
    GRPC_RETURN_IF_ERROR_(CheckWorkerRank("Heartbeat", req->rank()));
    const grpc::Status valid = CheckReport(*req);
    absl::MutexLock lock(&mu_);
    RankRecord& r = ranks_[req->rank()];
    // Kept for the watchdog: a rank whose every heartbeat is refused is not heard from, and
    // its verdict says why.
    if (r.registered) r.refused = valid.error_message();
    if (!valid.ok()) return valid;
    if (!r.registered) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("Heartbeat: rank %d has not registered", req->rank()));
    }
    r.reported = true;
    r.step = req->step();
    r.phase = req->phase();
    r.issued = req->collective_issued();
    r.completed = req->collective_completed();
    r.metrics = req->metrics();
    r.finished = r.finished || req->finished();
    if (!req->device().empty()) r.device = req->device();
    r.last_heard = clock_->Now();
    resp->set_aborted(aborted_);
    resp->set_abort_reason(abort_reason_);
    resp->set_stop_requested(stop_requested_);
    return grpc::Status::OK;
  }

  grpc::Status Abort(grpc::ServerContext* ctx, const rpc::AbortRequest* req,
                     rpc::AbortResponse*) override {
    GRPC_RETURN_IF_ERROR_(CheckToken(ctx));
    GRPC_RETURN_IF_ERROR_(CheckWorkerRank("Abort", req->rank()));
    GRPC_RETURN_IF_ERROR_(CheckText("Abort: reason", req->reason(), kMaxReasonBytes, true));
    AbortJob(absl::StrCat("rank ", req->rank(), " aborted the job: ", req->reason()));
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext* ctx, const rpc::GetStatusRequest*,
                         rpc::GetStatusResponse* resp) override {
    GRPC_RETURN_IF_ERROR_(CheckToken(ctx));
    *resp = StatusSnapshot();
    return grpc::Status::OK;
  }

  // ---- state for the embedding program ----

  void AbortJob(const std::string& reason) {
    std::string report;
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return;
      aborted_ = true;
      abort_reason_ = reason;
      report = absl::StrCat("coordinator: ", reason, "\n", TableLocked());
    }
    Log(report);
  }

  bool aborted() const {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }
  void RequestStop() {
    absl::MutexLock lock(&mu_);
    stop_requested_ = true;
  }
  bool stop_requested() const {
    absl::MutexLock lock(&mu_);
    return stop_requested_;
  }
  std::string abort_reason() const {
    absl::MutexLock lock(&mu_);
    return abort_reason_;
  }

  rpc::GetStatusResponse StatusSnapshot() const {
    const absl::Time now = clock_->Now();
    absl::MutexLock lock(&mu_);
    rpc::GetStatusResponse resp;
    resp.set_world_size(options_.world_size);
    resp.set_aborted(aborted_);
    resp.set_abort_reason(abort_reason_);
    for (int i = 0; i < options_.world_size; ++i) {
      const RankRecord& r = ranks_[i];
      rpc::RankStatus* s = resp.add_ranks();
      s->set_rank(i);
      s->set_registered(r.registered);
      s->set_host(r.host);
      s->set_peer(r.peer);
      s->set_pid(r.pid);
      s->set_device(r.device);
      s->set_step(r.step);
      s->set_phase(r.phase);
      s->set_collective_issued(r.issued);
      s->set_collective_completed(r.completed);
      *s->mutable_metrics() = r.metrics;
      s->set_seconds_since_heartbeat(r.registered ? absl::ToDoubleSeconds(now - r.last_heard)
                                                  : 0.0);
      s->set_finished(r.finished);
    }
    return resp;
  }

  void CheckHeartbeats() {
    const absl::Time now = clock_->Now();
    std::string reason;
    {
      absl::MutexLock lock(&mu_);
      if (aborted_ || shutting_down_) return;
      std::vector<int> silent, unregistered;
      for (int i = 0; i < options_.world_size; ++i) {
        const RankRecord& r = ranks_[i];
        if (!r.registered) {
          unregistered.push_back(i);
        } else if (!r.finished && now - r.last_heard > options_.heartbeat_timeout) {
          silent.push_back(i);
        }
      }
      if (!silent.empty()) {
        const RankRecord& r = ranks_[silent[0]];
        reason = absl::StrFormat(
            "watchdog: %s hung: no heartbeat for %s (heartbeat timeout %s); rank %d last "
            "reported %s",
            RankList(silent), absl::FormatDuration(absl::Trunc(now - r.last_heard,
                                                               absl::Milliseconds(100))),
            absl::FormatDuration(options_.heartbeat_timeout), silent[0],
            r.reported ? absl::StrFormat("step %d, phase '%s', collective #%d issued, #%d "
                                         "finished",
                                         r.step, r.phase, r.issued, r.completed)
                       : std::string("nothing since registering"));
        if (!r.refused.empty()) {
          absl::StrAppend(&reason, "; its last heartbeat was refused: ", r.refused);
        }
        const std::string lag = LaggingLocked();
        if (!lag.empty()) absl::StrAppend(&reason, "; ", lag);
      } else if (!unregistered.empty() && options_.registration_timeout > absl::ZeroDuration() &&
                 now - start_ > options_.registration_timeout) {
        reason = absl::StrFormat("watchdog: %s never registered within %s",
                                 RankList(unregistered),
                                 absl::FormatDuration(options_.registration_timeout));
      }
    }
    if (!reason.empty()) AbortByOwner(reason);
  }

  // The program the coordinator runs in aborts the job: "the launcher aborted the job: why".
  void AbortByOwner(absl::string_view why) {
    AbortJob(absl::StrCat(options_.owner, " aborted the job: ", why));
  }

 private:
  enum class WaitEnd { kReady, kTimeout, kAborted, kShutdown, kCancelled };

  // Waits (mu_ held) until ready(), the timeout, the job's abort, shutdown or the caller's
  // cancellation, whichever comes first.
  template <typename F>
  WaitEnd WaitLocked(grpc::ServerContext* ctx, absl::Duration timeout, F ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time deadline = absl::Now() + timeout;
    auto wake = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return ready() || aborted_ || shutting_down_;
    };
    for (;;) {
      if (ready()) return WaitEnd::kReady;
      if (aborted_) return WaitEnd::kAborted;
      if (shutting_down_) return WaitEnd::kShutdown;
      if (ctx->IsCancelled()) return WaitEnd::kCancelled;
      const absl::Time now = absl::Now();
      if (now >= deadline) return WaitEnd::kTimeout;
      mu_.AwaitWithDeadline(absl::Condition(&wake), std::min(deadline, now + kWaitSlice));
    }
  }

  grpc::Status WaitEndStatus(WaitEnd end, const std::string& what, absl::Duration timeout,
                             const std::string& detail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string tail = detail.empty() ? "" : absl::StrCat(": ", detail);
    switch (end) {
      case WaitEnd::kReady:
        return grpc::Status::OK;
      case WaitEnd::kTimeout:
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            absl::StrCat(what, ": timed out after ",
                                         absl::FormatDuration(timeout), tail));
      case WaitEnd::kAborted:
        return AbortedStatus(what);
      case WaitEnd::kShutdown:
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat(what, ": the coordinator is shutting down"));
      case WaitEnd::kCancelled:
        return grpc::Status(grpc::StatusCode::CANCELLED,
                            absl::StrCat(what, ": cancelled by the caller", tail));
    }
    return grpc::Status::OK;
  }

  grpc::Status AbortedStatus(absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return grpc::Status(grpc::StatusCode::ABORTED,
                        absl::StrCat(what, ": ", abort_reason_));
  }

  // The token is all that identifies a caller: without it, or with another, the caller is
  // unknown (UNAUTHENTICATED). A holder of the token may make every call.
  grpc::Status CheckToken(grpc::ServerContext* ctx) const {
    const auto& md = ctx->client_metadata();
    auto it = md.find(kTokenMetadataKey);
    if (it == md.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          absl::StrCat("request without the job token (", kTokenMetadataKey,
                                       " metadata)"));
    }
    if (!TokensEqual(absl::string_view(it->second.data(), it->second.size()), options_.token)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong job token");
    }
    return grpc::Status::OK;
  }

  // Every request comes from a worker. The launcher (rank -1 in messages) calls its
  // coordinator in its own process, never over RPC: no request can speak for it.
  grpc::Status CheckWorkerRank(absl::string_view op, int rank) const {
    if (rank < 0 || rank >= options_.world_size) {
      return Invalid(absl::StrFormat(
          "%s: rank %d is outside 0..%d%s", op, rank, options_.world_size - 1,
          rank == -1 ? " (requests come from workers; the launcher is not a caller)" : ""));
    }
    return grpc::Status::OK;
  }

  absl::Duration CapWait(int64_t timeout_ms) const {
    return std::min(absl::Milliseconds(timeout_ms), options_.max_wait);
  }

  // "collective #42: entered by ranks 0, 1, 3; not by rank 2" when ranks disagree.
  std::string LaggingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t newest = 0;
    for (const RankRecord& r : ranks_) {
      if (r.reported) newest = std::max(newest, r.issued);
    }
    std::vector<int> entered, behind;
    for (int i = 0; i < options_.world_size; ++i) {
      const RankRecord& r = ranks_[i];
      if (!r.registered) continue;
      (r.reported && r.issued == newest ? entered : behind).push_back(i);
    }
    if (behind.empty() || newest == 0) return "";
    return absl::StrFormat("collective #%d: entered by %s; never entered by %s", newest,
                           RankList(entered), RankList(behind));
  }

  std::string TableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time now = clock_->Now();
    std::string out = absl::StrFormat("%5s  %-16s %8s %-8s %8s  %-14s %8s %8s  %s\n", "rank",
                                      "host", "pid", "device", "step", "phase", "issued",
                                      "finished", "last heard");
    for (int i = 0; i < options_.world_size; ++i) {
      const RankRecord& r = ranks_[i];
      if (!r.registered) {
        absl::StrAppendFormat(&out, "%5d  %-16s %8s %-8s %8s  %-14s %8s %8s  %s\n", i, "-", "-",
                              "-", "-", "-", "-", "-", "never registered  <-- missing");
        continue;
      }
      const absl::Duration age = now - r.last_heard;
      std::string mark;
      if (r.finished) {
        mark = "  (finished)";
      } else if (age > options_.heartbeat_timeout) {
        mark = "  <-- silent";
      }
      absl::StrAppendFormat(&out, "%5d  %-16s %8d %-8s %8s  %-14s %8s %8s  %.1fs ago%s\n", i,
                            r.host.substr(0, 16), r.pid, r.device.substr(0, 8),
                            r.reported ? absl::StrCat(r.step) : "-",
                            r.reported ? r.phase.substr(0, 14) : "-",
                            r.reported ? absl::StrCat("#", r.issued) : "-",
                            r.reported ? absl::StrCat("#", r.completed) : "-",
                            absl::ToDoubleSeconds(age), mark);
    }
    const std::string lag = LaggingLocked();
    if (!lag.empty()) absl::StrAppend(&out, lag, "\n");
    return out;
  }

  void Log(const std::string& text) {
    if (options_.log) {
      options_.log(text);
    } else {
      std::fputs(text.c_str(), stderr);
      std::fflush(stderr);
    }
  }

  void WatchdogLoop() {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&shutting_down_), options_.watchdog_interval)) {
          return;
        }
      }
      CheckHeartbeats();
    }
  }

  const CoordinatorServerOptions options_;
  Clock* const clock_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string host_;
  std::thread watchdog_;

  mutable absl::Mutex mu_;
  std::vector<RankRecord> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> store_ ABSL_GUARDED_BY(mu_);
  size_t store_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, BarrierState> barriers_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  const absl::Time start_;
};

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    CoordinatorServerOptions options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator: world size ", options.world_size, " < 1"));
  }
  if (options.token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator: the job token must have at least ", kMinTokenLength, " characters"));
  }
  if (options.owner.empty()) {
    return absl::InvalidArgumentError("coordinator: the owner, who aborts the job, is unnamed");
  }
  if (options.heartbeat_timeout <= absl::ZeroDuration() ||
      options.watchdog_interval <= absl::ZeroDuration() ||
      options.max_wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "coordinator: heartbeat_timeout, watchdog_interval and max_wait must be positive");
  }
  std::string host;
  int port;
  absl::Status s = SplitAddress(options.address, &host, &port);
  if (!s.ok()) return s;
  if (!options.allow_remote && !IsLoopbackHost(host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator: refusing to listen on ", options.address,
        ": other hosts could reach it; listen on 127.0.0.1 or allow remote workers"));
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  s = impl->Serve(std::move(host));
  if (!s.ok()) return s;
  return std::unique_ptr<CoordinatorServer>(new CoordinatorServer(std::move(impl)));
}

CoordinatorServer::CoordinatorServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CoordinatorServer::~CoordinatorServer() { impl_->Stop(); }
int CoordinatorServer::port() const { return impl_->port(); }
std::string CoordinatorServer::address() const { return impl_->address(); }
void CoordinatorServer::Abort(absl::string_view why) { impl_->AbortByOwner(why); }
bool CoordinatorServer::aborted() const { return impl_->aborted(); }
void CoordinatorServer::RequestStop() { impl_->RequestStop(); }
bool CoordinatorServer::stop_requested() const { return impl_->stop_requested(); }
std::string CoordinatorServer::abort_reason() const { return impl_->abort_reason(); }
rpc::GetStatusResponse CoordinatorServer::Status() const { return impl_->StatusSnapshot(); }
void CoordinatorServer::CheckHeartbeats() { impl_->CheckHeartbeats(); }

std::function<void(const std::string&)> RunEventsLog(const std::string& run_dir) {
  const std::string path = absl::StrCat(run_dir, "/logs/coordinator.log");
  return [path](const std::string& line) { std::ofstream(path, std::ios::app) << line; };
}

}  // namespace tandem
