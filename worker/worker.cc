// The worker: one process per device, started by the launcher through mpirun, or by Slurm's
// srun (then rank 0 hosts the coordinator). It registers with the coordinator, receives the
// job configuration, builds its part of the model for the job's strategy, trains in lockstep
// with the other ranks, and writes one JSON line of measurements per step to
// <run_dir>/metrics/rank-<r>.jsonl. Its output goes to <run_dir>/logs/rank-<r>.log. On the
// coordinator's abort it stops communication and exits with the reason; on its own error it
// aborts the job first. On SIGTERM (or the launcher's stop request) every rank finishes the
// same step, checkpoints and exits with kPreemptedExitCode (75).
#include <mpi.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "comm/coordinator_client.h"
#include "comm/coordinator_server.h"
#include "comm/job_token.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/net_address.h"
#include "model/sharded_checkpoint.h"
#include "model/trainer.h"
#include "parallel/distributed.h"
#include "parallel/job.h"
#include "parallel/metrics.h"
#include "runtime/device.h"
#include "runtime/files.h"
#include "runtime/host_sync.h"
#include "runtime/profiler.h"
#include "runtime/status.h"

extern "C" void openblas_set_num_threads(int);

namespace tandem {
namespace {

// Set by SIGTERM (what Slurm and the launcher send before stopping a job): finish the
// current step, checkpoint, exit with kPreemptedExitCode.
std::atomic<bool> g_terminate{false};

void OnTerminate(int) { g_terminate.store(true); }

void InstallTerminationHandler() {
  struct sigaction sa = {};
  sa.sa_handler = OnTerminate;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::string EnvString(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// What the heartbeat thread reports; written by the training loop.
struct Progress {
  std::mutex mu;
  WorkerReport report;
};

// Workers started by srun with no TANDEM_COORDINATOR: rank 0 starts the coordinator
// in-process and publishes its address in the run directory, which every node shares; the
// other ranks wait for that file. The file is tagged with the Slurm job, step and restart
// count, so a requeued job never reads the address of an earlier run.
class SlurmRendezvous {
 public:
  // True when this process was started by srun and nobody gave it a coordinator.
  static bool Applies() {
    return !EnvString("SLURM_PROCID").empty() && EnvString(kCoordinatorAddressEnv).empty();
  }

  // Reads the job configuration (--job-config), starts the coordinator (rank 0) or finds
  // it (the others), and sets TANDEM_COORDINATOR for this process.
  absl::Status SetUp(int rank, int world, const std::string& job_config_path) {
    const int procid = EnvInt("SLURM_PROCID", -1), ntasks = EnvInt("SLURM_NTASKS", -1);
    if (procid != rank || (ntasks > 0 && ntasks != world)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "SLURM_PROCID=%d, SLURM_NTASKS=%d but MPI says rank %d of %d: start the workers "
          "with `srun --mpi=pmix` (or pmi2) so that MPI takes its ranks from Slurm",
          procid, ntasks, rank, world));
    }
    if (job_config_path.empty()) {
      return absl::InvalidArgumentError(
          "started by srun without TANDEM_COORDINATOR: pass --job-config=<run_dir>/job.conf "
          "(written by `launcher --prepare`), see examples/slurm/train.sbatch");
    }
    ASSIGN_OR_RETURN(std::string text, ReadWholeFile(job_config_path));
    ASSIGN_OR_RETURN(JobConfig job, JobConfig::FromText(text));
    if (job.workers != world) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is for %d workers but srun started %d tasks: make --gpus equal to srun's "
          "--ntasks",
          job_config_path, job.workers, world));
    }
    const std::string token = EnvString(kJobTokenEnv);
    if (token.size() < kMinTokenLength) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s must hold the job's secret (at least %d characters; e.g. `openssl rand -hex "
          "32`), the same for every task",
          kJobTokenEnv, kMinTokenLength));
    }
    const std::string file = job.run_dir + "/coordinator.address";
    const std::string tag =
        absl::StrCat(EnvString("SLURM_JOB_ID"), ".", EnvString("SLURM_STEP_ID"), ".",
                     EnvInt("SLURM_RESTART_COUNT", 0));
    std::string address;
    if (rank == 0) {
      std::string host = EnvString("TANDEM_COORDINATOR_HOST");
      if (host.empty()) host = ThisHostIpv4();
      if (host.empty()) {
        char name[256] = {0};
        gethostname(name, sizeof(name) - 1);
        host = name;
      }
      CoordinatorServerOptions co;
      co.address = absl::StrCat("0.0.0.0:", EnvInt("TANDEM_COORDINATOR_PORT", 0));
      co.allow_remote = true;
      co.world_size = world;
      co.token = token;
      co.job_config = text;
      co.heartbeat_timeout = absl::Seconds(job.heartbeat_timeout_s);
      co.events = RunEventsLog(job.run_dir);
      co.owner = "the coordinator in rank 0";  // its watchdog's aborts
      ASSIGN_OR_RETURN(server_, CoordinatorServer::Start(co));
      address = absl::StrCat(host, ":", server_->port());
      RETURN_IF_ERROR(WriteFileAtomically(file, absl::StrCat(tag, " ", address, "\n")));
    } else {
      const absl::Time deadline = absl::Now() + absl::Minutes(5);
      for (;;) {
        absl::StatusOr<std::string> got = ReadWholeFile(file);
        if (got.ok()) {
          std::vector<std::string> f =
              absl::StrSplit(absl::StripAsciiWhitespace(*got), ' ', absl::SkipEmpty());
          if (f.size() == 2 && f[0] == tag) {
            address = f[1];
            break;
          }
        }
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrFormat(
              "rank %d: no coordinator address for Slurm job %s in %s after 5 minutes; rank 0 "
              "writes it there (the run directory must be on a filesystem every node shares)",
              rank, tag, file));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    setenv(kCoordinatorAddressEnv, address.c_str(), 1);
    return absl::OkStatus();
  }

  // Rank 0 keeps the coordinator up until every rank said it finished (bounded).
  void WaitForEveryone() {
    if (!server_) return;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      const rpc::GetStatusResponse st = server_->Status();
      bool all = true;
      for (const rpc::RankStatus& r : st.ranks()) all = all && r.finished();
      if (all) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  std::unique_ptr<CoordinatorServer> server_;
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

// Sets what the heartbeats report as this rank's phase.
void SetPhase(Progress* progress, const char* phase) {
  std::lock_guard<std::mutex> lock(progress->mu);
  progress->report.phase = phase;
}

// The job as the coordinator handed it to this rank, and the device it runs on.
struct Joined {
  JobConfig job;
  Device device = Device::Cpu();
};

// Registers with the coordinator, receives the job, picks this rank's device and sends the
// rank's output to <run_dir>/logs/rank-<r>.log from here on.
absl::StatusOr<Joined> JoinJob(CoordinatorClient* client, const std::string& address, int rank,
                               int world) {
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
  Joined j;
  ASSIGN_OR_RETURN(j.job, JobConfig::FromText(info.job_config));
  ASSIGN_OR_RETURN(j.device, j.job.WorkerDevice(
                                 local_rank, j.job.device == "cuda" ? CudaDeviceCount() : 0, host));
  if (j.device.is_cpu()) openblas_set_num_threads(1);  // one BLAS thread per worker slot
  RETURN_IF_ERROR(SetCurrentDevice(j.device));
  const std::string log = absl::StrFormat("%s/logs/rank-%d.log", j.job.run_dir, rank);
  if (!std::freopen(log.c_str(), "a", stdout) || !std::freopen(log.c_str(), "a", stderr)) {
    return absl::InternalError(absl::StrFormat("cannot write %s", log));
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const ProcessGrid grid = j.job.Grid();
  std::printf("rank %d%s of %d on %s, %s, pid %d, coordinator %s\n", rank,
              grid.hybrid() ? (" " + grid.Place(rank)).c_str() : "", world, host,
              j.device.ToString().c_str(), static_cast<int>(getpid()), address.c_str());
  return j;
}

// The job's communicator: NCCL's on a GPU (its unique id through the coordinator), MPI's on
// the CPU.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(Device device, int rank,
                                                                int world,
                                                                CoordinatorClient* client) {
  if (!device.is_cuda()) return CreateMpiCommunicator();
  NcclCommunicatorOptions o;
  o.rank = rank;
  o.world_size = world;
  o.device = device;
  o.store = client;
  return CreateNcclCommunicator(o);
}

// Fault-injection hooks, for tests only (launcher/e2e_test.sh):
//   TANDEM_TEST_CRASH_RANK=r, TANDEM_TEST_CRASH_STEP=s: rank r kills itself with SIGKILL
//     on reaching step s, as a crashed worker would; with TANDEM_TEST_CRASH_ONCE_FILE=f
//     only when f does not exist yet (the worker creates it as it crashes), so a restarted
//     job does not crash again;
//   TANDEM_TEST_STEP_SLEEP_MS=n: every step takes n ms longer (so signals land mid-run).
struct TestFaults {
  int crash_rank = EnvInt("TANDEM_TEST_CRASH_RANK", -1);
  int crash_step = EnvInt("TANDEM_TEST_CRASH_STEP", -1);
  std::string crash_once = EnvString("TANDEM_TEST_CRASH_ONCE_FILE");
  int step_sleep_ms = EnvInt("TANDEM_TEST_STEP_SLEEP_MS", 0);

  void BeforeStep(int rank, int step) const {
    if (rank == crash_rank && step == crash_step) {
      struct stat st;
      if (crash_once.empty() || ::stat(crash_once.c_str(), &st) != 0) {
        if (!crash_once.empty()) std::ofstream(crash_once) << "crashed\n";
        std::raise(SIGKILL);
      }
    }
    if (step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_sleep_ms));
  }
};

// One metrics line per step read: its report, where its time went, and memory (the
// allocator's now, and the model state `state` holds; the rest of the peak is activations
// and workspace).
absl::Status AppendMetrics(const std::vector<CompletedStep>& done, const AllocatorStats& mem,
                           const MemoryNeed& state, MetricsWriter* metrics) {
  for (const CompletedStep& c : done) {
    const StepTiming& t = c.timing;
    StepRecord m = StepRecordOf(c.report);
    m.compute = t.compute_seconds;
    m.comm = t.comm_seconds;
    m.exposed_comm = t.exposed_comm_seconds;
    m.tensor_comm = t.tensor_comm_seconds;
    m.bubble = t.bubble_seconds;
    m.optimizer = t.optimizer_seconds;
    m.input = t.input_seconds;
    m.host_syncs = t.host_syncs;
    m.peak_in_flight = t.peak_in_flight;
    m.comm_bytes = t.comm_bytes;
    m.sequence = static_cast<int64_t>(t.last_sequence);
    m.allocated_bytes = mem.allocated_bytes;
    m.peak_bytes = mem.peak_allocated_bytes;
    m.param_bytes = state.params;
    m.grad_bytes = state.grads;
    m.optimizer_bytes = state.optimizer;
    RETURN_IF_ERROR(metrics->Append(m));
  }
  return absl::OkStatus();
}

// What the next heartbeats say: the last step read, and the communicator's progress.
void ReportProgress(const StepReport& last, const Communicator& comm, const AllocatorStats& mem,
                    Progress* progress) {
  std::lock_guard<std::mutex> lock(progress->mu);
  progress->report.step = last.step + 1;
  progress->report.loss = last.loss;
  progress->report.step_time_ms = last.seconds * 1e3;
  // Completed first: an operation is issued before it completes, so the pair read in this
  // order never has more completed than issued, whichever thread issues (the coordinator
  // refuses a report that has).
  progress->report.collective_completed = comm.last_completed_sequence();
  progress->report.collective_issued = comm.last_issued_sequence();
  progress->report.memory_allocated_bytes = mem.allocated_bytes;
  progress->report.memory_peak_bytes = mem.peak_allocated_bytes;
}

// The training loop, from the trainer's step to the job's last, or until every rank agreed
// to stop early (`*preempted`: every rank wrote a checkpoint of the step reached).
absl::Status TrainSteps(const JobConfig& job, const ParallelConfig& pc, int rank,
                        DistributedTrainer* trainer, const Communicator& comm,
                        CoordinatorClient* client, Progress* progress, bool* preempted) {
  const std::string ckpt_dir = job.run_dir + "/checkpoints";
  MetricsWriter metrics(MetricsPath(job.run_dir, rank));
  Allocator* allocator = *GetAllocator(pc.train.device);
  const TestFaults faults;
  // From here on, the steady state: with --debug-syncs every host synchronization but the
  // loss reads and checkpoints says where it came from.
  HostSync::SetDebug(job.debug_syncs);
  while (trainer->step() < job.steps) {
    faults.BeforeStep(rank, trainer->step());
    if (client->aborted()) return absl::AbortedError(client->abort_reason());
    SetPhase(progress, "train");
    // A SIGTERM or the launcher's request during this step stops every rank after the next
    // read of the loss (every rank reads at the same steps).
    RETURN_IF_ERROR(
        trainer->Issue([client] { return g_terminate.load() || client->stop_requested(); }));
    // The host reads the losses every --log-every steps, at checkpoints and at the end; in
    // between it only issues work.
    const int issued = trainer->step();
    const bool checkpoint_due =
        job.checkpoint_every > 0 && (issued % job.checkpoint_every == 0 || issued == job.steps);
    // A validation reads the steps before it, so that its loss goes with its step's record.
    const bool eval_due = pc.train.EvalDue(issued);
    if (issued % job.log_every != 0 && !checkpoint_due && !eval_due && issued != job.steps) {
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<CompletedStep> done, trainer->Read());
    if (done.empty()) continue;
    if (eval_due) {
      ASSIGN_OR_RETURN(const float val_loss, trainer->Evaluate());
      done.back().report.val_loss = val_loss;
      if (rank == 0) std::printf("step %d: validation loss %.4f\n", issued, val_loss);
    }
    const bool terminated = g_terminate.load();
    const AllocatorStats mem = allocator->stats();
    RETURN_IF_ERROR(AppendMetrics(done, mem, trainer->memory().need, &metrics));
    ReportProgress(done.back().report, comm, mem, progress);
    // Before another checkpoint of the weights that gave it (CheckNotDiverged names the
    // last checkpoint from before them).
    for (const CompletedStep& c : done) RETURN_IF_ERROR(CheckNotDiverged(c.report, pc.train.dtype));
    if (checkpoint_due) RETURN_IF_ERROR(trainer->SaveCheckpoint(ckpt_dir));
    if (trainer->stop_agreed() && trainer->step() < job.steps) {
      // Every rank learned it from the same read of the same steps' reductions: all stop
      // here.
      SetPhase(progress, "checkpoint");
      if (!checkpoint_due) RETURN_IF_ERROR(trainer->SaveCheckpoint(ckpt_dir));
      std::printf("stopping after step %d (%s): checkpoint %s written; exit code %d\n",
                  trainer->step(),
                  terminated                  ? "SIGTERM received"
                  : client->stop_requested() ? "the launcher asked every worker to stop"
                                             : "another rank was asked to stop",
                  CheckpointPrefixFor(ckpt_dir, trainer->step()).c_str(), kPreemptedExitCode);
      *preempted = true;
      break;
    }
  }
  return absl::OkStatus();
}

// Joins the job, sets up the communicator and trainer (resuming where asked), and trains
// to the end, or until every rank agreed to stop early (`*preempted`).
absl::Status Train(int rank, int world, Progress* progress, bool* preempted) {
  ASSIGN_OR_RETURN(CoordinatorClientOptions options,
                   CoordinatorClientOptions::FromEnvironment(rank));
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                   CoordinatorClient::Connect(options));
  ASSIGN_OR_RETURN(Joined joined, JoinJob(client.get(), options.address, rank, world));
  const JobConfig& job = joined.job;
  const Device device = joined.device;

  // Heartbeats from here on, while CUDA and NCCL start (which can take a while on a cold
  // machine): a rank setting up is alive, not hung. An abort that comes before the
  // communicator exists is seen once it does.
  std::atomic<Communicator*> live{nullptr};
  std::unique_ptr<Communicator> comm;
  {
    std::lock_guard<std::mutex> lock(progress->mu);
    progress->report.phase = "init";
    progress->report.device = device.ToString();
  }
  RETURN_IF_ERROR(client->StartHeartbeats(
      [progress] {
        std::lock_guard<std::mutex> lock(progress->mu);
        return progress->report;
      },
      [&live](const std::string& reason) {
        if (Communicator* c = live.load()) c->Abort(reason);
      }));
  // On every return the heartbeat thread stops before `comm`, which it may abort, is destroyed.
  absl::Cleanup stop_heartbeats = [&client] { (void)client->StopHeartbeats(/*finished=*/false); };
  // For tests only (launcher/e2e_test.sh): TANDEM_TEST_INIT_SLEEP_MS=n: setting up takes n ms
  // longer, as a slow CUDA and NCCL start would.
  if (const int ms = EnvInt("TANDEM_TEST_INIT_SLEEP_MS", 0); ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  ASSIGN_OR_RETURN(comm, CreateCommunicator(device, rank, world, client.get()));
  live.store(comm.get());
  if (client->aborted()) return absl::AbortedError(client->abort_reason());

  ASSIGN_OR_RETURN(ParallelConfig pc, job.ToParallelConfig(device));
  pc.timeout = absl::Seconds(std::max(30.0, job.heartbeat_timeout_s * 2));
  ASSIGN_OR_RETURN(auto trainer, DistributedTrainer::Create(pc, comm.get()));
  std::printf("memory: %s\n", DescribeMemory(trainer->memory()).c_str());
  if (!job.resume.empty()) {
    // --resume names a checkpoint prefix, <dir>/step-NNNNNN, written by any strategy and
    // world size: this rank loads its parameters by name from the shards holding them.
    RETURN_IF_ERROR(trainer->LoadCheckpoint(job.resume));
    std::printf("resumed from %s at step %d\n", job.resume.c_str(), trainer->step());
  }
  // A run from its start keeps the initial weights too, as step 0 (before the first step):
  // the run can be reproduced, or compared, from its beginning (--resume=<dir>/step-000000).
  if (job.checkpoint_every > 0 && trainer->step() == 0 && job.resume.empty()) {
    RETURN_IF_ERROR(trainer->SaveCheckpoint(job.run_dir + "/checkpoints"));
  }
  Profiler::Enable(job.profile);
  // A run that fails (an error, another rank's abort) keeps what it recorded: its trace
  // shows where it stopped.
  absl::Cleanup profile_on_failure = [&] {
    if (!job.profile) return;
    Profiler::Enable(false);
    if (absl::Status s = WriteProfile(job.run_dir, rank); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    }
  };
  RETURN_IF_ERROR(
      TrainSteps(job, pc, rank, trainer.get(), *comm, client.get(), progress, preempted));
  std::move(profile_on_failure).Cancel();
  if (job.profile) {
    Profiler::Enable(false);
    RETURN_IF_ERROR(WriteProfile(job.run_dir, rank));
  }
  SetPhase(progress, *preempted ? "preempted" : "done");
  RETURN_IF_ERROR(client->Barrier("done", absl::Minutes(5)));
  std::move(stop_heartbeats).Cancel();
  return client->StopHeartbeats(/*finished=*/true);
}

// `worker --time-blocks --job-config=FILE`, for the launcher's --balance=time: each block of
// the job's model timed forward and backward on one micro-batch, on the device a worker of the
// job would use first (the first visible GPU, or the CPU with one BLAS thread), printed as
// "block B SECONDS" lines. A process of its own, so that the launcher holds no device memory
// (and no CUDA context) while the job runs.
absl::Status TimeBlocksForLauncher(const std::string& job_config_path) {
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(job_config_path));
  ASSIGN_OR_RETURN(JobConfig job, JobConfig::FromText(text));
  const Device device = job.device == "cuda" ? Device::Cuda(0) : Device::Cpu();
  if (device.is_cpu()) openblas_set_num_threads(1);
  RETURN_IF_ERROR(SetCurrentDevice(device));
  ASSIGN_OR_RETURN(ParallelConfig pc, job.ToParallelConfig(device));
  ASSIGN_OR_RETURN(std::vector<double> seconds, TimeBlocks(pc));
  for (size_t b = 0; b < seconds.size(); ++b) std::printf("block %zu %.9g\n", b, seconds[b]);
  return absl::OkStatus();
}

bool HasFlag(int argc, char** argv, absl::string_view flag) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i] == flag) return true;
  }
  return false;
}

// The worker's own flags (mpirun starts it with none): --job-config=FILE under srun.
std::string JobConfigFlag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (absl::ConsumePrefix(&a, "--job-config=") || absl::ConsumePrefix(&a, "--job_config=")) {
      return std::string(a);
    }
    if ((a == "--job-config" || a == "--job_config") && i + 1 < argc) return argv[i + 1];
  }
  return "";
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  if (tandem::HasFlag(argc, argv, "--help") || tandem::HasFlag(argc, argv, "-h")) {
    std::fputs(
        "Usage: the launcher starts workers (bazel run //launcher -- --help); so does srun:\n"
        "  launcher --prepare --run-dir=DIR ... (writes DIR/job.conf), then\n"
        "  TANDEM_JOB_TOKEN=<a secret> srun --mpi=pmix worker --job-config=DIR/job.conf\n"
        "as examples/slurm/train.sbatch does.\n\n"
        "Flags:\n"
        "  --job-config=FILE  the job a launcher --prepare wrote, for workers srun starts\n"
        "  --time-blocks      with --job-config: time each block's forward and backward and\n"
        "                     print them (what the launcher's --balance=time runs)\n",
        stdout);
    return 0;
  }
  if (!tandem::JobConfigFlag(argc, argv).empty() && std::getenv("SLURM_PROCID") == nullptr &&
      !tandem::HasFlag(argc, argv, "--time-blocks")) {
    std::fprintf(stderr,
                 "worker: --job-config is for workers srun starts (no Slurm job here); start a "
                 "job with bazel run //launcher -- ... (see --help)\n");
    return 2;
  }
  if (tandem::HasFlag(argc, argv, "--time-blocks")) {
    // No MPI, no coordinator: one process timing blocks for the launcher.
    const absl::Status s = tandem::ExplainOutOfMemory(
        tandem::TimeBlocksForLauncher(tandem::JobConfigFlag(argc, argv)), '-');
    if (s.ok()) return 0;
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  absl::Status s = tandem::InitMpi(&argc, &argv);
  if (!s.ok()) {
    std::fprintf(stderr, "worker: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  tandem::InstallTerminationHandler();
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  tandem::SlurmRendezvous slurm;
  if (tandem::SlurmRendezvous::Applies()) {
    s = slurm.SetUp(rank, world, tandem::JobConfigFlag(argc, argv));
    if (!s.ok()) {
      std::fprintf(stderr, "worker rank %d: %s\n", rank, std::string(s.message()).c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }
  }
  tandem::Progress progress;
  bool preempted = false;
  s = tandem::ExplainOutOfMemory(Train(rank, world, &progress, &preempted), '-');
  if (!s.ok()) {
    // Said once: many errors from below name the rank already.
    const std::string said = absl::StrFormat("rank %d: ", rank);
    std::fprintf(stderr, "%s%s\n", absl::StartsWith(s.message(), said) ? "" : said.c_str(),
                 std::string(s.message()).c_str());
    std::fflush(stderr);
    // Tell every other rank, unless the job was aborted already (then this is the echo). The
    // coordinator says who: "rank R aborted the job: <the error>".
    if (s.code() != absl::StatusCode::kAborted) {
      auto options = tandem::CoordinatorClientOptions::FromEnvironment(rank);
      if (options.ok()) {
        options->rpc_timeout = absl::Seconds(3);
        auto client = tandem::CoordinatorClient::Connect(*options);
        if (client.ok()) {
          (void)(*client)->Abort(absl::StripPrefix(s.message(), said));
        }
      }
    }
    // Exit without MPI_Finalize: peers may be gone, and finalizing could wait for them.
    std::_Exit(s.code() == absl::StatusCode::kAborted ? 3 : 1);
  }
  slurm.WaitForEveryone();
  (void)tandem::FinalizeMpi();
  return preempted ? tandem::kPreemptedExitCode : 0;
}
