// The coordinator's client, used by workers (the launcher calls its coordinator in its own
// process). Every call carries the job token and has a timeout; errors name the rank, the
// call and what it waited for. An optional heartbeat thread reports the worker's progress
// every interval and delivers the job's abort (or the loss of the coordinator) within one
// interval.
#ifndef TANDEM_COMM_COORDINATOR_CLIENT_H_
#define TANDEM_COMM_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/coordinator.pb.h"
#include "comm/key_value_store.h"

namespace tandem {

struct CoordinatorClientOptions {
  std::string address;  // "127.0.0.1:PORT"
  std::string token;    // the job token; never logged
  int rank = -1;        // the worker's; every call but GetStatus refuses one outside 0..N-1
  // Deadline of calls that do not wait for other ranks.
  absl::Duration rpc_timeout = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Heartbeats failing for this long count as an abort ("lost the coordinator", or "was
  // refused by the coordinator" when it answered each with a refusal).
  absl::Duration coordinator_timeout = absl::Seconds(60);

  // Address and token from TANDEM_COORDINATOR and TANDEM_JOB_TOKEN; InvalidArgument naming
  // the variable that is missing.
  static absl::StatusOr<CoordinatorClientOptions> FromEnvironment(int rank);
};

// What a worker tells the coordinator about itself when it registers.
struct WorkerIdentity {
  int world_size = 1;
  std::string host;
  int64_t pid = 0;
  std::string device;  // "cpu", "cuda:0"
};

// What registration answers.
struct JobInfo {
  int world_size = 1;
  std::string job_config;
};

// A worker's progress, sent with each heartbeat.
struct WorkerReport {
  int64_t step = 0;
  std::string phase;
  uint64_t collective_issued = 0;
  uint64_t collective_completed = 0;
  double loss = 0;
  double step_time_ms = 0;
  int64_t memory_allocated_bytes = 0;
  int64_t memory_peak_bytes = 0;
  bool finished = false;
  std::string device;  // known after registration, from the job's configuration
};

// The job's abort state as a heartbeat answers it, and whether workers are asked to stop
// after their current step (preemption).
struct AbortState {
  bool aborted = false;
  std::string reason;
  bool stop_requested = false;
};

class CoordinatorClient : public KeyValueStore {
 public:
  // Makes the channel; connects lazily (Register waits for the server to come up).
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Connect(
      CoordinatorClientOptions options);
  // Stops the heartbeat thread if running.
  ~CoordinatorClient() override;

  // Registers this rank, waiting up to `timeout` for the coordinator to be reachable.
  absl::StatusOr<JobInfo> Register(const WorkerIdentity& identity, absl::Duration timeout);

  // KeyValueStore.
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) override;
  absl::StatusOr<std::string> Wait(absl::string_view key, absl::Duration timeout) override;

  // Returns once every rank reached barrier `name`; DeadlineExceeded names the missing.
  absl::Status Barrier(absl::string_view name, absl::Duration timeout);
  // One heartbeat; answers whether the job was aborted.
  absl::StatusOr<AbortState> Heartbeat(const WorkerReport& report);
  // Aborts the whole job.
  absl::Status Abort(absl::string_view reason);
  // Every rank's last report.
  absl::StatusOr<rpc::GetStatusResponse> GetStatus();

  // Starts a thread sending report() every heartbeat_interval. When the job is aborted, or
  // no heartbeat succeeded for coordinator_timeout, on_abort(reason) is called once from
  // that thread and the heartbeats stop. Fails if heartbeats already run.
  absl::Status StartHeartbeats(std::function<WorkerReport()> report,
                               std::function<void(const std::string&)> on_abort);
  // Stops the thread; with `finished`, first sends a last heartbeat marking this rank
  // finished so the watchdog stops watching it.
  absl::Status StopHeartbeats(bool finished);

  // True once an abort was delivered (by a heartbeat or a call answering ABORTED).
  bool aborted() const;
  // True once a heartbeat said the launcher asks every worker to stop after its current
  // step and checkpoint.
  bool stop_requested() const;
  std::string abort_reason() const;

  class Impl;

 private:
  explicit CoordinatorClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem

#endif  // TANDEM_COMM_COORDINATOR_CLIENT_H_
