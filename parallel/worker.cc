// The worker: one process per device, started by the launcher through mpirun (or by srun).
// It registers with the coordinator, receives the job configuration, builds its part of
// the model for the job's strategy, trains in lockstep with the other ranks, and writes one
// JSON line of measurements per step to <run_dir>/metrics/rank-<r>.jsonl. Its output goes to
// <run_dir>/logs/rank-<r>.log. On the coordinator's abort it stops communication and exits
// with the reason; on its own error it aborts the job first.
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>

#include "absl/strings/str_format.h"
#include "comm/coordinator_client.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "parallel/distributed.h"
#include "parallel/job.h"
#include "runtime/profiler.h"
#include "runtime/status.h"

extern "C" void openblas_set_num_threads(int);

namespace tandem {
namespace {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// What the heartbeat thread reports; written by the training loop.
struct Progress {
  std::mutex mu;
  WorkerReport report;
};

// <run_dir>/traces/rank-<r>.json (a Chrome trace of every step: compute, communication and
// idle spans with micro-batch ids and collective sequence numbers) and ops-rank-<r>.txt (the
// op table, sorted by total time).
absl::Status WriteProfile(const std::string& run_dir, int rank) {
  const std::string dir = run_dir + "/traces";
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrFormat("cannot create %s", dir));
  }
  std::ofstream(absl::StrFormat("%s/rank-%d.json", dir, rank))
      << Profiler::ChromeTrace(Profiler::Events(), rank, absl::StrFormat("rank %d", rank));
  const std::string table = Profiler::FormatOpTable(Profiler::OpTable());
  std::ofstream(absl::StrFormat("%s/ops-rank-%d.txt", dir, rank)) << table;
  std::printf("op table, rank %d:\n%s", rank, table.c_str());
  return absl::OkStatus();
}

absl::Status Train(int rank, int world, Progress* progress) {
  ASSIGN_OR_RETURN(CoordinatorClientOptions options,
                   CoordinatorClientOptions::FromEnvironment(rank));
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                   CoordinatorClient::Connect(options));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const int local_rank = EnvInt("OMPI_COMM_WORLD_LOCAL_RANK", EnvInt("SLURM_LOCALID", 0));
  WorkerIdentity id;
  id.world_size = world;
  id.host = host;
  id.pid = getpid();
  // The device is known only after the configuration arrives; report the intent.
  id.device = "pending";
  ASSIGN_OR_RETURN(JobInfo info, client->Register(id, absl::Minutes(2)));
  ASSIGN_OR_RETURN(JobConfig job, JobConfig::FromText(info.job_config));
  const Device device = job.device == "cuda" ? Device::Cuda(local_rank) : Device::Cpu();
  if (device.is_cpu()) openblas_set_num_threads(1);  // one BLAS thread per worker slot
  RETURN_IF_ERROR(SetCurrentDevice(device));

  // Output to the rank's log file from here on.
  const std::string log = absl::StrFormat("%s/logs/rank-%d.log", job.run_dir, rank);
  if (!std::freopen(log.c_str(), "a", stdout) || !std::freopen(log.c_str(), "a", stderr)) {
    return absl::InternalError(absl::StrFormat("cannot write %s", log));
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("rank %d of %d on %s, %s, pid %d\n", rank, world, host, device.ToString().c_str(),
              static_cast<int>(getpid()));

  std::unique_ptr<Communicator> comm;
  if (device.is_cuda()) {
    NcclCommunicatorOptions o;
    o.rank = rank;
    o.world_size = world;
    o.device = device;
    o.store = client.get();
    ASSIGN_OR_RETURN(comm, CreateNcclCommunicator(o));
  } else {
    ASSIGN_OR_RETURN(comm, CreateMpiCommunicator());
  }
  Communicator* raw_comm = comm.get();
  RETURN_IF_ERROR(client->StartHeartbeats(
      [progress] {
        std::lock_guard<std::mutex> lock(progress->mu);
        return progress->report;
      },
      [raw_comm](const std::string& reason) { raw_comm->Abort(reason); }));

  ASSIGN_OR_RETURN(ParallelConfig pc, job.ToParallelConfig(device));
  pc.timeout = absl::Seconds(std::max(30.0, job.heartbeat_timeout_s * 2));
  ASSIGN_OR_RETURN(auto trainer, DistributedTrainer::Create(pc, comm.get()));
  const std::string ckpt_dir = job.run_dir + "/checkpoints";
  if (!job.resume.empty()) {
    // --resume names a step's checkpoint prefix: <dir>/step-NNNNNN
    const size_t slash = job.resume.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : job.resume.substr(0, slash);
    const int step = std::atoi(job.resume.substr(job.resume.rfind('-') + 1).c_str());
    RETURN_IF_ERROR(trainer->LoadCheckpoint(dir, step));
    std::printf("resumed from %s at step %d\n", job.resume.c_str(), trainer->step());
  }
  std::ofstream metrics(absl::StrFormat("%s/metrics/rank-%d.jsonl", job.run_dir, rank),
                        std::ios::app);
  Allocator* allocator = *GetAllocator(device);
  // Fault-injection hook, for tests only: with TANDEM_TEST_CRASH_RANK=r and
  // TANDEM_TEST_CRASH_STEP=s in the environment, rank r kills itself with SIGKILL on reaching
  // step s, as a crashed worker would (launcher/e2e_test.sh uses it).
  const int crash_rank = EnvInt("TANDEM_TEST_CRASH_RANK", -1);
  const int crash_step = EnvInt("TANDEM_TEST_CRASH_STEP", -1);
  // Memory the model state holds (the rest of the peak is activations and workspace).
  const int64_t numel = trainer->stage().layout().numel();
  const int64_t param_bytes =
      numel * (4 + (pc.train.dtype == DType::kF32
                        ? 0
                        : static_cast<int64_t>(DTypeSize(pc.train.dtype))));
  const int64_t grad_bytes = numel * 4;
  const int64_t optimizer_bytes = numel * 4 * (pc.train.optimizer.kind == "adamw" ? 2 : 1);
  Profiler::Enable(job.profile);
  while (trainer->step() < job.steps) {
    if (rank == crash_rank && trainer->step() == crash_step) std::raise(SIGKILL);
    if (client->aborted()) return absl::AbortedError(client->abort_reason());
    {
      std::lock_guard<std::mutex> lock(progress->mu);
      progress->report.phase = "train";
    }
    StepTiming t;
    ASSIGN_OR_RETURN(StepReport r, trainer->Step(&t));
    const AllocatorStats mem = allocator->stats();
    metrics << absl::StrFormat(
                   "{\"step\": %d, \"loss\": %.9g, \"seconds\": %.6f, \"compute\": %.6f, "
                   "\"exposed_comm\": %.6f, \"bubble\": %.6f, \"optimizer\": %.6f, "
                   "\"comm_bytes\": %d, \"sequence\": %d, \"lr\": %.6g, \"grad_norm\": %.6g, "
                   "\"skipped\": %s, \"allocated_bytes\": %d, \"peak_bytes\": %d, "
                   "\"param_bytes\": %d, \"grad_bytes\": %d, \"optimizer_bytes\": %d}",
                   r.step, r.loss, r.seconds, t.compute_seconds, t.exposed_comm_seconds,
                   t.bubble_seconds, t.optimizer_seconds, t.comm_bytes, t.last_sequence, r.lr,
                   r.grad_norm, r.skipped ? "true" : "false", mem.allocated_bytes,
                   mem.peak_allocated_bytes, param_bytes, grad_bytes, optimizer_bytes)
            << std::endl;
    {
      std::lock_guard<std::mutex> lock(progress->mu);
      progress->report.step = r.step + 1;
      progress->report.loss = r.loss;
      progress->report.step_time_ms = r.seconds * 1e3;
      progress->report.collective_issued = raw_comm->last_issued_sequence();
      progress->report.collective_completed = raw_comm->last_completed_sequence();
      progress->report.memory_allocated_bytes = mem.allocated_bytes;
      progress->report.memory_peak_bytes = mem.peak_allocated_bytes;
    }
    if (job.checkpoint_every > 0 &&
        (trainer->step() % job.checkpoint_every == 0 || trainer->step() == job.steps)) {
      RETURN_IF_ERROR(trainer->SaveCheckpoint(ckpt_dir));
    }
  }
  if (job.profile) {
    Profiler::Enable(false);
    RETURN_IF_ERROR(WriteProfile(job.run_dir, rank));
  }
  {
    std::lock_guard<std::mutex> lock(progress->mu);
    progress->report.phase = "done";
  }
  RETURN_IF_ERROR(client->Barrier("done", absl::Minutes(5)));
  return client->StopHeartbeats(/*finished=*/true);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::Status s = tandem::InitMpi(&argc, &argv);
  if (!s.ok()) {
    std::fprintf(stderr, "worker: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  tandem::Progress progress;
  s = Train(rank, world, &progress);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(s.message()).c_str());
    std::fflush(stderr);
    // Tell every other rank, unless the job was aborted already (then this is the echo).
    if (s.code() != absl::StatusCode::kAborted) {
      auto options = tandem::CoordinatorClientOptions::FromEnvironment(rank);
      if (options.ok()) {
        options->rpc_timeout = absl::Seconds(3);
        auto client = tandem::CoordinatorClient::Connect(*options);
        if (client.ok()) {
          (void)(*client)->Abort(absl::StrFormat("rank %d failed: %s", rank, s.message()));
        }
      }
    }
    // Exit without MPI_Finalize: peers may be gone, and finalizing could wait for them.
    std::_Exit(s.code() == absl::StatusCode::kAborted ? 3 : 1);
  }
  (void)tandem::FinalizeMpi();
  return 0;
}
