// CoordinatorClient over a gRPC channel. Waiting calls send their timeout to the server and
// give gRPC a deadline a little later, so the server's message (which names what was
// missing) arrives before the transport's bare "deadline exceeded".
#include "comm/coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "comm/coordinator.grpc.pb.h"
#include "comm/job_token.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// How much later than a waiting call's own timeout gRPC gives up on it.
constexpr absl::Duration kWaitMargin = absl::Seconds(5);

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

}  // namespace

absl::StatusOr<CoordinatorClientOptions> CoordinatorClientOptions::FromEnvironment(int rank) {
  CoordinatorClientOptions o;
  const char* address = std::getenv(kCoordinatorAddressEnv);
  const char* token = std::getenv(kJobTokenEnv);
  if (address == nullptr || *address == '\0') {
    return absl::InvalidArgumentError(
        absl::StrCat(kCoordinatorAddressEnv, " is not set: where is the coordinator?"));
  }
  if (token == nullptr || *token == '\0') {
    return absl::InvalidArgumentError(
        absl::StrCat(kJobTokenEnv, " is not set: the coordinator needs the job token"));
  }
  o.address = address;
  o.token = token;
  o.rank = rank;
  return o;
}

class CoordinatorClient::Impl {
 public:
  explicit Impl(CoordinatorClientOptions options)
      : options_(std::move(options)),
        stub_(rpc::Coordinator::NewStub(
            grpc::CreateChannel(options_.address, grpc::InsecureChannelCredentials()))) {}

  ~Impl() { StopThread(); }

  absl::StatusOr<JobInfo> Register(const WorkerIdentity& id, absl::Duration timeout) {
    rpc::RegisterRequest req;
    req.set_rank(options_.rank);
    req.set_world_size(id.world_size);
    req.set_host(id.host);
    req.set_pid(id.pid);
    req.set_device(id.device);
    rpc::RegisterResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout);
    ctx.set_wait_for_ready(true);  // the coordinator may still be starting
    RETURN_IF_ERROR(Check(stub_->Register(&ctx, req, &resp), "Register",
                           absl::StrCat("the coordinator to accept registration within ",
                                        absl::FormatDuration(timeout))));
    return JobInfo{resp.world_size(), resp.job_config()};
  }

  absl::Status Set(absl::string_view key, absl::string_view value) {
    rpc::KeySetRequest req;
    req.set_rank(options_.rank);
    req.set_key(std::string(key));
    req.set_value(std::string(value));
    rpc::KeySetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, options_.rpc_timeout);
    return Check(stub_->KeySet(&ctx, req, &resp), absl::StrCat("KeySet('", key, "')"),
                 "the coordinator to answer");
  }

  absl::StatusOr<std::string> Get(absl::string_view key) {
    rpc::KeyGetRequest req;
    req.set_rank(options_.rank);
    req.set_key(std::string(key));
    rpc::KeyGetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, options_.rpc_timeout);
    RETURN_IF_ERROR(Check(stub_->KeyGet(&ctx, req, &resp),
                           absl::StrCat("KeyGet('", key, "')"), "the coordinator to answer"));
    return std::move(*resp.mutable_value());
  }

  absl::StatusOr<std::string> Wait(absl::string_view key, absl::Duration timeout) {
    rpc::KeyWaitRequest req;
    req.set_rank(options_.rank);
    req.set_key(std::string(key));
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    rpc::KeyWaitResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout + kWaitMargin);
    RETURN_IF_ERROR(Check(stub_->KeyWait(&ctx, req, &resp), absl::StrCat("KeyWait('", key, "')"),
                           absl::StrCat("key '", key, "' to be set, up to ",
                                        absl::FormatDuration(timeout))));
    return std::move(*resp.mutable_value());
  }

  absl::Status Barrier(absl::string_view name, absl::Duration timeout) {
    rpc::BarrierRequest req;
    req.set_rank(options_.rank);
    req.set_name(std::string(name));
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    rpc::BarrierResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout + kWaitMargin);
    return Check(stub_->Barrier(&ctx, req, &resp), absl::StrCat("Barrier('", name, "')"),
                 absl::StrCat("every rank to reach barrier '", name, "', up to ",
                              absl::FormatDuration(timeout)));
  }

  absl::StatusOr<AbortState> Heartbeat(const WorkerReport& r) {
    rpc::HeartbeatRequest req;
    req.set_rank(options_.rank);
    req.set_step(r.step);
    req.set_phase(r.phase);
    req.set_collective_issued(r.collective_issued);
    req.set_collective_completed(r.collective_completed);
    req.set_finished(r.finished);
    req.set_device(r.device);
    rpc::Metrics* m = req.mutable_metrics();
    m->set_loss(r.loss);
    m->set_step_time_ms(r.step_time_ms);
    m->set_memory_allocated_bytes(r.memory_allocated_bytes);
    m->set_memory_peak_bytes(r.memory_peak_bytes);
    rpc::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, std::min(options_.rpc_timeout, options_.coordinator_timeout));
    RETURN_IF_ERROR(Check(stub_->Heartbeat(&ctx, req, &resp), "Heartbeat",
                           "the coordinator to answer"));
    if (resp.aborted()) NoteAbort(resp.abort_reason());
    if (resp.stop_requested()) stop_requested_.store(true);
    return AbortState{resp.aborted(), resp.abort_reason(), resp.stop_requested()};
  }

  absl::Status Abort(absl::string_view reason) {
    rpc::AbortRequest req;
    req.set_rank(options_.rank);
    req.set_reason(std::string(reason));
    rpc::AbortResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, options_.rpc_timeout);
    return Check(stub_->Abort(&ctx, req, &resp), "Abort", "the coordinator to answer");
  }

  absl::StatusOr<rpc::GetStatusResponse> GetStatus() {
    rpc::GetStatusRequest req;
    rpc::GetStatusResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, options_.rpc_timeout);
    RETURN_IF_ERROR(Check(stub_->GetStatus(&ctx, req, &resp), "GetStatus",
                           "the coordinator to answer"));
    return resp;
  }

  absl::Status StartHeartbeats(std::function<WorkerReport()> report,
                               std::function<void(const std::string&)> on_abort) {
    absl::MutexLock lock(&mu_);
    if (thread_.joinable()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", options_.rank, ": heartbeats already running"));
    }
    stop_ = false;
    report_ = std::move(report);
    on_abort_ = std::move(on_abort);
    thread_ = std::thread([this] { HeartbeatLoop(); });
    return absl::OkStatus();
  }

  absl::Status StopHeartbeats(bool finished) {
    std::function<WorkerReport()> report;
    {
      absl::MutexLock lock(&mu_);
      report = report_;
    }
    StopThread();
    if (!finished) return absl::OkStatus();
    WorkerReport last = report ? report() : WorkerReport{};
    last.finished = true;
    return Heartbeat(last).status();
  }

  bool aborted() const {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }
  bool stop_requested() const { return stop_requested_.load(); }
  std::string abort_reason() const {
    absl::MutexLock lock(&mu_);
    return abort_reason_;
  }

 private:
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
    ctx->set_deadline(Deadline(timeout));
    ctx->AddMetadata(kTokenMetadataKey, options_.token);
  }

  // A gRPC status as absl::Status: "rank 2: KeyWait('x') at 127.0.0.1:5000 failed:
  // <server's message> (waited for <what>)".
  absl::Status Check(const grpc::Status& s, absl::string_view call, absl::string_view waited) {
    if (s.ok()) return absl::OkStatus();
    const auto code = static_cast<absl::StatusCode>(s.error_code());
    if (code == absl::StatusCode::kAborted) NoteAbort(s.error_message());
    return absl::Status(code, absl::StrFormat("rank %d: %s at coordinator %s failed: %s "
                                              "(waited for %s)",
                                              options_.rank, call, options_.address,
                                              s.error_message(), waited));
  }

  void NoteAbort(const std::string& reason) {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
  }

  void StopThread() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  void HeartbeatLoop() {
    absl::Time last_ok = absl::Now();
    for (;;) {
      std::function<WorkerReport()> report;
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
        report = report_;
      }
      absl::StatusOr<AbortState> state = Heartbeat(report ? report() : WorkerReport{});
      std::string reason;
      if (state.ok()) {
        last_ok = absl::Now();
        if (state->aborted) reason = state->reason;
      } else if (absl::Now() - last_ok > options_.coordinator_timeout) {
        // A refusal is an answer: then the coordinator is there, and this rank's reports wrong.
        const absl::StatusCode code = state.status().code();
        const bool refused = code != absl::StatusCode::kUnavailable &&
                             code != absl::StatusCode::kDeadlineExceeded &&
                             code != absl::StatusCode::kCancelled;
        reason = absl::StrFormat("rank %d %s the coordinator at %s: no heartbeat %s for %s; last "
                                 "error: %s",
                                 options_.rank, refused ? "was refused by" : "lost",
                                 options_.address, refused ? "accepted" : "answered",
                                 absl::FormatDuration(options_.coordinator_timeout),
                                 state.status().message());
        NoteAbort(reason);
      }
      if (!reason.empty()) {
        std::function<void(const std::string&)> on_abort;
        {
          absl::MutexLock lock(&mu_);
          on_abort = on_abort_;
        }
        if (on_abort) on_abort(reason);
        return;
      }
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.heartbeat_interval);
    }
  }

  const CoordinatorClientOptions options_;
  std::unique_ptr<rpc::Coordinator::Stub> stub_;
  std::thread thread_;  // started and joined by the owner's thread

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::function<WorkerReport()> report_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_abort_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_requested_{false};
};

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Connect(
    CoordinatorClientOptions options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("coordinator client: no coordinator address");
  }
  if (options.token.empty()) {
    return absl::InvalidArgumentError("coordinator client: no job token");
  }
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "coordinator client: heartbeat_interval and rpc_timeout must be positive");
  }
  return std::unique_ptr<CoordinatorClient>(
      new CoordinatorClient(std::make_unique<Impl>(std::move(options))));
}

CoordinatorClient::CoordinatorClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CoordinatorClient::~CoordinatorClient() = default;
absl::StatusOr<JobInfo> CoordinatorClient::Register(const WorkerIdentity& identity,
                                                    absl::Duration timeout) {
  return impl_->Register(identity, timeout);
}
absl::Status CoordinatorClient::Set(absl::string_view key, absl::string_view value) {
  return impl_->Set(key, value);
}
absl::StatusOr<std::string> CoordinatorClient::Get(absl::string_view key) {
  return impl_->Get(key);
}
absl::StatusOr<std::string> CoordinatorClient::Wait(absl::string_view key,
                                                    absl::Duration timeout) {
  return impl_->Wait(key, timeout);
}
absl::Status CoordinatorClient::Barrier(absl::string_view name, absl::Duration timeout) {
  return impl_->Barrier(name, timeout);
}
absl::StatusOr<AbortState> CoordinatorClient::Heartbeat(const WorkerReport& report) {
  return impl_->Heartbeat(report);
}
absl::Status CoordinatorClient::Abort(absl::string_view reason) { return impl_->Abort(reason); }
absl::StatusOr<rpc::GetStatusResponse> CoordinatorClient::GetStatus() {
  return impl_->GetStatus();
}
absl::Status CoordinatorClient::StartHeartbeats(std::function<WorkerReport()> report,
                                                std::function<void(const std::string&)> on_abort) {
  return impl_->StartHeartbeats(std::move(report), std::move(on_abort));
}
absl::Status CoordinatorClient::StopHeartbeats(bool finished) {
  return impl_->StopHeartbeats(finished);
}
bool CoordinatorClient::aborted() const { return impl_->aborted(); }
bool CoordinatorClient::stop_requested() const { return impl_->stop_requested(); }
std::string CoordinatorClient::abort_reason() const { return impl_->abort_reason(); }

}  // namespace tandem
