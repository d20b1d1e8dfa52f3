// Bandwidth of a collective through Tandem's MPI communicator against the raw MPI call in the
// same run, from 4 KB to 64 MB of f32 in place (--collective, nccl-tests' table of functions per
// collective):
//   all_reduce      AllReduce (sum)             against MPI_Allreduce;
//   all_gather      AllGatherParts              against MPI_Allgatherv;
//   reduce_scatter  ReduceScatterParts (sum)    against MPI_Reduce_scatter;
// the parts collectives are ZeRO-1's, each rank owning an even part of the buffer. Run under
// mpirun (allreduce_bench.sh does it for `bazel run //comm:allreduce_bench`). Bandwidths follow
// nccl-tests, `bytes` being the whole buffer: algbw = bytes / time, busbw = algbw * 2(n-1)/n
// for all-reduce and algbw * (n-1)/n for all-gather and reduce-scatter. Each time is the median
// of --reps timed repetitions; the three ways are interleaved within every repetition, and each
// ratio is the median over repetitions of the ratio within one, so that machine noise hits both
// sides alike:
//   raw     the MPI call back to back on the calling thread;
//   queued  Tandem's operation issued --iters times, then the last one waited (nccl-tests'
//           method: operations queue on the communication thread);
//   waited  Tandem's operation then Wait, each time (the latency of one handoff included).
// --json prints one line per size with the three ways' seconds per operation instead of the
// table: compare --plan fits its link model to them.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/mpi_communicator.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace tandem {
namespace {

enum class Kind { kAllReduce, kAllGather, kReduceScatter };

struct Flags {
  Kind kind = Kind::kAllReduce;
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 64 << 20;
  int reps = 9;
  double target_ms = 50;  // length of one timed repetition of one way
  bool json = false;      // one JSON line per size instead of the table
};

constexpr absl::Duration kTimeout = absl::Seconds(120);

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Seconds per operation for `iters` runs of `body`, the slowest rank's figure.
template <typename F>
absl::StatusOr<double> Time(int iters, F body) {
  MPI_Barrier(MPI_COMM_WORLD);
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(body());
  double s = absl::ToDoubleSeconds(absl::Now() - start) / iters;
  double slowest = s;
  MPI_Allreduce(&s, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

// One collective on one buffer, the two sides timed: the raw MPI call, and Tandem's operation.
struct Ways {
  std::function<absl::Status()> raw;
  std::function<absl::StatusOr<std::unique_ptr<Work>>()> issue;
};

// What the benchmark says of each collective.
struct CollectiveInfo {
  const char* name;
  const char* what;      // the header's description
  const char* mpi_call;  // the raw side
  // nccl-tests' busbw = algbw * bus_multiple * (n-1)/n: what each rank moves over its link
  // per byte of the buffer (an all-reduce is a reduce-scatter, then an all-gather).
  int bus_multiple;
};

CollectiveInfo InfoOf(Kind kind) {
  switch (kind) {
    case Kind::kAllGather:
      return {"all_gather", "f32 in place, every rank's even part to every rank (AllGatherParts)",
              "MPI_Allgatherv", 1};
    case Kind::kReduceScatter:
      return {"reduce_scatter",
              "f32 sum in place, each rank keeping its even part "
              "(ReduceScatterParts)",
              "MPI_Reduce_scatter", 1};
    case Kind::kAllReduce:
      break;
  }
  return {"all_reduce", "f32 sum in place (AllReduce)", "MPI_Allreduce", 2};
}

// Returns the error status of a failed MPI call.
#define RETURN_IF_MPI_ERROR(name, call)                                       \
  do {                                                                        \
    const int e = (call);                                                     \
    if (e != MPI_SUCCESS) return MpiErrorStatus(e, name, __FILE__, __LINE__); \
  } while (0)

// The two sides of `kind` on `t`; the parts collectives split `t` evenly over the ranks, as
// ZeRO-1's shards. `comm` must outlive the result.
Ways WaysOf(Kind kind, Communicator* comm, const Tensor& t) {
  float* data = t.data<float>();
  const int count = static_cast<int>(t.numel());
  const int n = comm->world_size();
  std::vector<int64_t> offsets;
  std::vector<int> counts, displacements;
  for (int r = 0; r <= n; ++r) offsets.push_back(int64_t{count} * r / n);
  for (int r = 0; r < n; ++r) {
    counts.push_back(static_cast<int>(offsets[r + 1] - offsets[r]));
    displacements.push_back(static_cast<int>(offsets[r]));
  }
  switch (kind) {
    case Kind::kAllGather:
      return {[=]() -> absl::Status {
                RETURN_IF_MPI_ERROR(
                    "MPI_Allgatherv",
                    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(),
                                   displacements.data(), MPI_FLOAT, MPI_COMM_WORLD));
                return absl::OkStatus();
              },
              [=] { return comm->AllGatherParts(t, offsets); }};
    case Kind::kReduceScatter:
      return {[=]() -> absl::Status {
                RETURN_IF_MPI_ERROR("MPI_Reduce_scatter",
                                    MPI_Reduce_scatter(MPI_IN_PLACE, data, counts.data(), MPI_FLOAT,
                                                       MPI_SUM, MPI_COMM_WORLD));
                return absl::OkStatus();
              },
              [=] { return comm->ReduceScatterParts(t, offsets); }};
    case Kind::kAllReduce:
      break;
  }
  return {[=]() -> absl::Status {
            RETURN_IF_MPI_ERROR("MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT,
                                                               MPI_SUM, MPI_COMM_WORLD));
            return absl::OkStatus();
          },
          [=] { return comm->AllReduce(t); }};
}

absl::Status Run(const Flags& flags) {
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, CreateMpiCommunicator());
  const int rank = comm->rank();
  const int n = comm->world_size();
  const CollectiveInfo info = InfoOf(flags.kind);
  const double bus_factor = n > 1 ? info.bus_multiple * (n - 1.0) / n : 1.0;
  if (rank == 0 && !flags.json) {
    std::printf(
        "%s %s against raw %s, %d ranks, median of %d reps "
        "(algbw, busbw in GB/s; busbw = algbw * %s(n-1)/n)\n",
        info.name, info.what, info.mpi_call, n, flags.reps, info.bus_multiple == 1 ? "" : "2");
    std::printf("%10s %6s | %9s %7s %7s | %9s %7s %7s %6s | %9s %7s %6s\n", "bytes", "iters",
                "raw us", "algbw", "busbw", "queued us", "algbw", "busbw", "ratio", "waited us",
                "busbw", "ratio");
  }
  {
    // The first collectives of a job run slowly for a while (connection setup, page
    // faults); keep that out of the first rows.
    ASSIGN_OR_RETURN(Tensor warm, Tensor::Empty(Shape{1 << 18}, DType::kF32, Device::Cpu()));
    std::memset(warm.raw(), 0, warm.bytes());
    const absl::Time until = absl::Now() + absl::Milliseconds(500);
    int more = 1;
    while (more) {
      ASSIGN_OR_RETURN(std::unique_ptr<Work> w, comm->AllReduce(warm));
      RETURN_IF_ERROR(w->Wait(kTimeout));
      MPI_Allreduce(MPI_IN_PLACE, warm.raw(), 1024, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      more = absl::Now() < until;
      MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
  }
  std::vector<std::pair<int64_t, double>> ratios;  // bytes, queued ratio
  for (int64_t bytes = flags.min_bytes; bytes <= flags.max_bytes; bytes *= 2) {
    const int64_t count = bytes / 4;
    ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(Shape{count}, DType::kF32, Device::Cpu()));
    std::memset(t.raw(), 0, t.bytes());  // zeros stay zeros: no denormals, no overflow
    const Ways ways = WaysOf(flags.kind, comm.get(), t);
    auto raw = [&](int iters) -> absl::Status {
      for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(ways.raw());
      return absl::OkStatus();
    };
    std::vector<std::unique_ptr<Work>> works;
    auto queued = [&](int iters) -> absl::Status {
      works.clear();
      for (int i = 0; i < iters; ++i) {
        ASSIGN_OR_RETURN(std::unique_ptr<Work> w, ways.issue());
        works.push_back(std::move(w));
      }
      return works.back()->Wait(kTimeout);  // in order: the last done means all done
    };
    auto waited = [&](int iters) -> absl::Status {
      for (int i = 0; i < iters; ++i) {
        ASSIGN_OR_RETURN(std::unique_ptr<Work> w, ways.issue());
        RETURN_IF_ERROR(w->Wait(kTimeout));
      }
      return absl::OkStatus();
    };
    // Warm up both paths, then size the repetitions from rank 0's estimate.
    RETURN_IF_ERROR(raw(2));
    RETURN_IF_ERROR(waited(2));
    // The fastest of a few single operations: one slow sample must not shrink the reps.
    double one = 1e9;
    for (int k = 0; k < 3; ++k) {
      ASSIGN_OR_RETURN(double s, Time(1, [&] { return raw(1); }));
      one = std::min(one, s);
    }
    int iters = static_cast<int>(std::clamp(flags.target_ms * 1e-3 / one, 5.0, 2000.0));
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);

    std::vector<double> raw_s, queued_s, waited_s;
    for (int rep = 0; rep < flags.reps; ++rep) {
      // Rotate the order of the three ways between repetitions.
      for (int k = 0; k < 3; ++k) {
        switch ((rep + k) % 3) {
          case 0: {
            ASSIGN_OR_RETURN(double s, Time(iters, [&] { return raw(iters); }));
            raw_s.push_back(s);
            break;
          }
          case 1: {
            ASSIGN_OR_RETURN(double s, Time(iters, [&] { return queued(iters); }));
            queued_s.push_back(s);
            break;
          }
          case 2: {
            ASSIGN_OR_RETURN(double s, Time(iters, [&] { return waited(iters); }));
            waited_s.push_back(s);
            break;
          }
        }
      }
    }
    const double r = Median(raw_s), q = Median(queued_s), w = Median(waited_s);
    // Ratios pair the ways measured side by side in the same repetition, so a burst of
    // machine noise that slows one repetition cancels out; the median is over those pairs.
    std::vector<double> q_ratio, w_ratio;
    for (int k = 0; k < flags.reps; ++k) {
      q_ratio.push_back(raw_s[k] / queued_s[k]);
      w_ratio.push_back(raw_s[k] / waited_s[k]);
    }
    const double qr = Median(q_ratio), wr = Median(w_ratio);
    auto algbw = [&](double s) { return bytes / s / 1e9; };
    ratios.emplace_back(bytes, qr);
    if (rank == 0 && flags.json) {
      // Seconds per operation, for fitting a link model (compare --plan).
      std::printf("{\"bytes\": %lld, \"ranks\": %d, \"raw_s\": %.9g, \"queued_s\": %.9g, "
                  "\"waited_s\": %.9g}\n",
                  static_cast<long long>(bytes), n, r, q, w);
      std::fflush(stdout);
    } else if (rank == 0) {
      std::printf("%10lld %6d | %9.1f %7.3f %7.3f | %9.1f %7.3f %7.3f %6.3f | %9.1f %7.3f %6.3f\n",
                  static_cast<long long>(bytes), iters, r * 1e6, algbw(r),
                  algbw(r) * bus_factor, q * 1e6, algbw(q), algbw(q) * bus_factor, qr,
                  w * 1e6, algbw(w) * bus_factor, wr);
      std::fflush(stdout);
    }
  }
  if (rank == 0 && !flags.json) {
    std::printf("ratio = Tandem busbw / raw MPI busbw, the median over repetitions of the "
                "pair measured together (1.000 = no overhead)\n");
    double worst = 0;
    int64_t worst_bytes = 0;
    for (const auto& [b, ratio] : ratios) {
      if (b >= (1 << 20) && (worst_bytes == 0 || ratio < worst)) {
        worst = ratio;
        worst_bytes = b;
      }
    }
    if (worst_bytes > 0) {
      std::printf("from 1 MB up, the lowest queued ratio is %.3f (at %lld bytes): %s\n", worst,
                  static_cast<long long>(worst_bytes),
                  worst >= 0.95 ? "within the 5% overhead target"
                                : "over the 5% overhead target (rerun on a quiet machine to "
                                  "tell noise from overhead)");
    }
  }
  return absl::OkStatus();
}

bool ParseFlag(const char* arg, const char* name, std::string* value) {
  const size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
  *value = arg + len + 1;
  return true;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::Status s = tandem::InitMpi(&argc, &argv);
  if (!s.ok()) {
    std::fprintf(stderr, "allreduce_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  tandem::Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string v;
    bool ok = true;
    if (tandem::ParseFlag(argv[i], "--collective", &v)) {
      if (v == "all_reduce") {
        flags.kind = tandem::Kind::kAllReduce;
      } else if (v == "all_gather") {
        flags.kind = tandem::Kind::kAllGather;
      } else if (v == "reduce_scatter") {
        flags.kind = tandem::Kind::kReduceScatter;
      } else {
        ok = false;
      }
    } else if (tandem::ParseFlag(argv[i], "--min_bytes", &v)) {
      ok = absl::SimpleAtoi(v, &flags.min_bytes) && flags.min_bytes >= 4;
    } else if (tandem::ParseFlag(argv[i], "--max_bytes", &v)) {
      ok = absl::SimpleAtoi(v, &flags.max_bytes);
    } else if (tandem::ParseFlag(argv[i], "--reps", &v)) {
      ok = absl::SimpleAtoi(v, &flags.reps) && flags.reps >= 1;
    } else if (tandem::ParseFlag(argv[i], "--target_ms", &v)) {
      ok = absl::SimpleAtod(v, &flags.target_ms) && flags.target_ms > 0;
    } else if (std::strcmp(argv[i], "--json") == 0) {
      flags.json = true;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "allreduce_bench: bad flag '%s' (flags: "
                   "--collective=all_reduce|all_gather|reduce_scatter --min_bytes=N "
                   "--max_bytes=N --reps=N --target_ms=X --json)\n",
                   argv[i]);
      tandem::FinalizeMpi().IgnoreError();
      return 2;
    }
  }
  s = tandem::Run(flags);
  if (!s.ok()) {
    std::fprintf(stderr, "allreduce_bench: %s\n", std::string(s.message()).c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);  // the other ranks may be waiting in a collective
  }
  tandem::FinalizeMpi().IgnoreError();
  return 0;
}
