// The coordinator's server: the gRPC service of coordinator.proto, run in the launcher (or
// rank 0 under Slurm). It checks the job token and every field of every request, serves the
// key-value store and barriers with bounded waits, keeps each rank's last report, and runs
// a watchdog that declares a rank silent past the heartbeat timeout hung, prints what every
// rank last reported and aborts the job. Bad requests are refused; they never stop it.
// An abort reason names who aborted: "rank R aborted the job: why" (a worker's Abort call),
// or "<owner> aborted the job: why" (Abort below, and the watchdog: "... watchdog: rank 2
// hung: ...").
#ifndef TANDEM_COMM_COORDINATOR_SERVER_H_
#define TANDEM_COMM_COORDINATOR_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/clock.h"
#include "comm/coordinator.pb.h"

namespace tandem {

// Limits on what a request may carry.
inline constexpr size_t kMaxKeyBytes = 256;
inline constexpr size_t kMaxValueBytes = 1 << 20;
inline constexpr size_t kMaxTextBytes = 256;     // host, device, phase
inline constexpr size_t kMaxReasonBytes = 4096;  // abort reasons
inline constexpr size_t kMaxKeys = 10000;
inline constexpr size_t kMaxStoreBytes = size_t{64} << 20;
inline constexpr size_t kMaxBarrierNames = 1000;

struct CoordinatorServerOptions {
  // host:port to listen on; port 0 picks a free port (see CoordinatorServer::port()).
  std::string address = "127.0.0.1:0";
  // Must be set to listen on anything but a loopback address.
  bool allow_remote = false;
  int world_size = 1;
  // The job's secret (GenerateJobToken()); required, at least kMinTokenLength characters.
  std::string token;
  // Handed to every worker at registration; opaque here.
  std::string job_config;
  // A registered rank silent for longer is declared hung and the job aborted.
  absl::Duration heartbeat_timeout = absl::Seconds(30);
  // Who aborts the job through Abort() and the watchdog, as abort reasons name it: the program
  // the coordinator runs in.
  std::string owner = "the launcher";
  // Ranks still unregistered this long after Start abort the job; zero disables.
  absl::Duration registration_timeout = absl::Minutes(5);
  // How often the watchdog looks (real time).
  absl::Duration watchdog_interval = absl::Seconds(1);
  // Longest KeyWait / Barrier timeout honoured; longer requests are cut to this.
  absl::Duration max_wait = absl::Minutes(10);
  // Heartbeat ages are measured on this clock; null means the real one.
  Clock* clock = nullptr;
  // Where the abort report (reason and every rank's last report) goes; null: stderr.
  std::function<void(const std::string&)> log;
  // Where each registration is recorded ("rank 1 registered from ipv4:10.0.0.2:5123 (host
  // n2, pid 42)"); null: nowhere.
  std::function<void(const std::string&)> events;
};

class CoordinatorServer {
 public:
  // Validates the options, binds and starts serving; the watchdog starts with it.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      CoordinatorServerOptions options);
  // Shuts down: waiting calls return UNAVAILABLE, then the server stops.
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // The bound port, and "host:port" for workers to connect to.
  int port() const;
  std::string address() const;

  // The owner aborts the job: "<owner> aborted the job: <why>" (no effect once aborted).
  void Abort(absl::string_view why);
  // Asks every worker, through its next heartbeat, to stop after its current step and
  // checkpoint (preemption). The job is not aborted.
  void RequestStop();
  bool stop_requested() const;
  bool aborted() const;
  // Empty until aborted.
  std::string abort_reason() const;

  // Every rank's last report, as GetStatus answers it.
  rpc::GetStatusResponse Status() const;
  // One watchdog pass now (tests with a ManualClock call it instead of waiting).
  void CheckHeartbeats();

  class Impl;

 private:
  explicit CoordinatorServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// CoordinatorServerOptions::events for a run: each line appended to
// <run_dir>/logs/coordinator.log.
std::function<void(const std::string&)> RunEventsLog(const std::string& run_dir);

}  // namespace tandem

#endif  // TANDEM_COMM_COORDINATOR_SERVER_H_
