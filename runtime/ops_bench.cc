// Micro-benchmarks of the CPU ops on one thread: ops::Matmul against a raw cblas_sgemm on the
// same shapes (what the checks and dispatch cost), and the memory-bound ops' bandwidth
// against a memcpy moving as many bytes and against their own base (SSE2) variant, where the CPU
// runs a wider one (ops.h, "CPU instruction sets"). These ops run on an immediate CPU stream,
// on the benchmark's own thread as the raw calls beside them do, so the thread's clock is the
// op's time. Then what a CPU stream costs per op (stream/): an asynchronous stream's issue
// cost on the host, and the time per op, issue and run, of an immediate and an asynchronous
// stream on a one-element op, where the cost is all overhead. A table of the ratios closes
// the run.
//   bazel run //runtime:ops_bench -- --benchmark_min_time=0.05
#include <cblas.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "runtime/ops.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace tandem {
namespace {

// The ops' stream: immediate, so that an op has run when its call returns.
Stream& Cpu() {
  static Stream* s = Stream::CreateCpu(CpuStreamMode::kImmediate).release();
  return *s;
}

// Values in [lo, hi) from a fixed linear congruential sequence: cheap for 100 MB of inputs.
Tensor Filled(const Shape& shape, float lo = -1.0f, float hi = 1.0f) {
  AllocationUse host_writes;
  host_writes.host_writes = true;
  Tensor t =
      Tensor::Empty(shape, DType::kF32, Device::Cpu(), HostMemoryKind::kPageable, host_writes)
          .value();
  uint32_t x = 12345;
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = lo + (hi - lo) * static_cast<float>(x >> 8) / 16777216.0f;
  }
  return t;
}

void Check(benchmark::State& state, const absl::Status& st) {
  if (!st.ok()) state.SkipWithError(std::string(st.message()).c_str());
}

// ---- matmul: ops::Matmul and cblas_sgemm on the same operands --------------------------------

struct MatmulShape {
  int64_t m, n, k;
  bool transpose_b;  // GPT's linear layers: out (N, OC) = inp (N, C) @ weight (OC, C)^T
};

struct MatmulOperands {
  explicit MatmulOperands(const MatmulShape& s)
      : a(Filled({s.m, s.k})),
        b(Filled(s.transpose_b ? Shape{s.n, s.k} : Shape{s.k, s.n})),
        out(Filled({s.m, s.n})) {}
  Tensor a, b, out;
};

// One set of operands per shape, shared by both sides of a pair and every repetition.
MatmulOperands& OperandsFor(const MatmulShape& s) {
  static auto* cache = new std::map<std::tuple<int64_t, int64_t, int64_t, bool>, MatmulOperands>();
  const auto key = std::make_tuple(s.m, s.n, s.k, s.transpose_b);
  auto it = cache->find(key);
  if (it == cache->end()) it = cache->emplace(key, MatmulOperands(s)).first;
  return it->second;
}

void SetFlops(benchmark::State& state, const MatmulShape& s) {
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * s.m * s.n * s.k, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void BM_MatmulOps(benchmark::State& state, MatmulShape s) {
  MatmulOperands& x = OperandsFor(s);
  for (auto _ : state) {
    Check(state, ops::Matmul(Cpu(), x.out, x.a, x.b, false, s.transpose_b));
    benchmark::DoNotOptimize(x.out.raw());
  }
  SetFlops(state, s);
}

void BM_MatmulRawSgemm(benchmark::State& state, MatmulShape s) {
  MatmulOperands& x = OperandsFor(s);
  const int m = s.m, n = s.n, k = s.k;
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, s.transpose_b ? CblasTrans : CblasNoTrans, m, n, k,
                1.0f, x.a.data<float>(), k, x.b.data<float>(), s.transpose_b ? k : n, 0.0f,
                x.out.data<float>(), n);
    benchmark::DoNotOptimize(x.out.raw());
  }
  SetFlops(state, s);
}

// ---- memory-bound ops against memcpy ---------------------------------------------------------

// Activations of a GPT step: N = B * T rows of C channels, 64 MB per tensor, so that every
// op's working set is larger than the last-level cache (32 MB here) and the comparison is
// with main memory.
constexpr int64_t kRows = 8192, kChannels = 2048;

void SetBytes(benchmark::State& state, int64_t bytes_per_call) {
  state.SetBytesProcessed(state.iterations() * bytes_per_call);
}

struct Activations {
  Tensor a = Filled({kRows, kChannels});
  Tensor b = Filled({kRows, kChannels});
  Tensor out = Filled({kRows, kChannels});
  Tensor out2 = Filled({kRows, kChannels});
  Tensor weight = Filled({kChannels}, 0.5f, 1.5f);
  Tensor bias = Filled({kChannels});
  Tensor mean = Filled({kRows});
  Tensor rstd = Filled({kRows});
};

constexpr int64_t kTensorBytes = kRows * kChannels * 4;

// Made once and shared by every benchmark and repetition: 256 MB take a while to fill.
Activations& Shared() {
  static auto* x = new Activations();
  return *x;
}

// Copies bytes / 2, so that it reads and writes `bytes` in all, as the op it stands beside.
// Two buffers of the largest size asked for (AdamW's: 7 tensors' worth in all) serve every size.
void BM_Memcpy(benchmark::State& state, int64_t bytes) {
  const int64_t half = bytes / 2;
  static auto* src = new Tensor(Filled({7 * kRows * kChannels / 2}));
  static auto* dst = new Tensor(Filled({7 * kRows * kChannels / 2}));
  for (auto _ : state) {
    std::memcpy(dst->raw(), src->raw(), half);
    benchmark::DoNotOptimize(dst->raw());
  }
  SetBytes(state, 2 * half);
}

void BM_GeluForward(benchmark::State& state) {
  Activations& x = Shared();
  for (auto _ : state) Check(state, ops::GeluForward(Cpu(), x.out, x.a));
  SetBytes(state, 2 * kTensorBytes);
}

void BM_GeluBackward(benchmark::State& state) {
  Activations& x = Shared();
  for (auto _ : state) Check(state, ops::GeluBackward(Cpu(), x.out, x.a, x.b));
  SetBytes(state, 3 * kTensorBytes);
}

void BM_BiasAdd(benchmark::State& state) {
  Activations& x = Shared();
  for (auto _ : state) Check(state, ops::BiasAdd(Cpu(), x.a, x.bias));
  SetBytes(state, 2 * kTensorBytes);
}

void BM_Add(benchmark::State& state) {
  Activations& x = Shared();
  for (auto _ : state) Check(state, ops::Add(Cpu(), x.out, x.a, x.b));
  SetBytes(state, 3 * kTensorBytes);
}

void BM_LayerNormForward(benchmark::State& state) {
  Activations& x = Shared();
  for (auto _ : state) {
    Check(state, ops::LayerNormForward(Cpu(), x.out, x.mean, x.rstd, x.a, x.weight, x.bias));
  }
  SetBytes(state, 2 * kTensorBytes);
}

void BM_SoftmaxForward(benchmark::State& state) {
  Activations& x = Shared();
  for (auto _ : state) Check(state, ops::SoftmaxForward(Cpu(), x.out, x.a));
  SetBytes(state, 2 * kTensorBytes);
}

void BM_ResidualLayerNormForward(benchmark::State& state) {
  Activations& x = Shared();
  for (auto _ : state) {
    Check(state, ops::ResidualLayerNormForward(Cpu(), x.out2, x.out, x.mean, x.rstd, x.a, x.b,
                                               x.weight, x.bias));
  }
  SetBytes(state, 4 * kTensorBytes);  // reads a and b, writes residual and out
}

// One AdamW step over 16M parameters: reads params, grads, m, v; writes params, m, v.
constexpr int64_t kParams = kRows * kChannels;

void BM_AdamWUpdate(benchmark::State& state) {
  // The activation tensors stand in for the flat buffers; m and v start as AdamW's would.
  Activations& x = Shared();
  Tensor p = x.a.Reshape({kParams}).value(), g = x.b.Reshape({kParams}).value();
  Tensor m = x.out.Reshape({kParams}).value(), v = x.out2.Reshape({kParams}).value();
  Check(state, ops::Fill(Cpu(), m, 0.0f));
  Check(state, ops::Fill(Cpu(), v, 0.0f));
  ops::AdamWConfig c;
  c.weight_decay = 0.1f;
  for (auto _ : state) Check(state, ops::AdamWUpdate(Cpu(), p, g, m, v, c));
  SetBytes(state, 7 * kParams * 4);
}

// ---- what a CPU stream costs per op ------------------------------------------------------------

// A one-element Scale: the op's own work is a few nanoseconds, the rest is the stream's.
constexpr int kLaunches = 256;

// Issued and run: kLaunches ops, then a synchronization, per iteration.
void BM_StreamOp(benchmark::State& state, CpuStreamMode mode) {
  auto s = Stream::CreateCpu(mode);
  Tensor x = Filled({1});
  for (auto _ : state) {
    for (int i = 0; i < kLaunches; ++i) Check(state, ops::Scale(*s, x, 1.0f));
    Check(state, s->Synchronize());
  }
  state.SetItemsProcessed(state.iterations() * kLaunches);
}

// The host's side of an asynchronous stream: the time to queue an op (the synchronization
// after each batch is not timed).
void BM_StreamIssue(benchmark::State& state) {
  auto s = Stream::CreateCpu(CpuStreamMode::kAsync);
  Tensor x = Filled({1});
  for (auto _ : state) {
    for (int i = 0; i < kLaunches; ++i) Check(state, ops::Scale(*s, x, 1.0f));
    state.PauseTiming();
    Check(state, s->Synchronize());
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kLaunches);
}

// Runs `fn` with the CPU ops in `isa`, then goes back to the widest variant.
void InVariant(benchmark::State& state, ops::CpuIsa isa, void (*fn)(benchmark::State&)) {
  Check(state, ops::UseCpuIsa(isa));
  fn(state);
  Check(state, ops::UseCpuIsa(ops::BestCpuIsa()));
}

// ---- the closing table: each pair's ratio ---------------------------------------------------

// Prints as the console reporter does, and remembers each run's rate for the ratio table.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  // (numerator, denominator, counter): how the first compares with the second.
  void AddPair(std::string num, std::string den, std::string counter) {
    pairs_.push_back({std::move(num), std::move(den), std::move(counter)});
  }

  // Keeps the median of repeated runs (a run alone when not repeated): the machine may be
  // shared, and a median shrugs off a neighbour's burst.
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      const bool single = r.run_type == Run::RT_Iteration && r.repetitions <= 1;
      const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.error_occurred || !(single || median)) continue;
      for (const auto& [name, counter] : r.counters)
        rates_[r.run_name.function_name][name] = counter;
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-28s %-42s %15s %15s %7s\n", "benchmark", "against", "rate", "against",
                "ratio");
    for (const Pair& p : pairs_) {
      const double num = Rate(p.num, p.counter), den = Rate(p.den, p.counter);
      if (num <= 0 || den <= 0) continue;
      const double scale = p.counter == "FLOP/s" ? 1e9 : 1024.0 * 1024 * 1024;
      const char* unit = p.counter == "FLOP/s" ? "GFLOP/s" : "GiB/s";
      std::printf("%-28s %-42s %7.2f %s %7.2f %s %6.1f%%\n", p.num.c_str(), p.den.c_str(),
                  num / scale, unit, den / scale, unit, 100.0 * num / den);
    }
  }

 private:
  struct Pair {
    std::string num, den, counter;
  };
  double Rate(const std::string& name, const std::string& counter) const {
    auto it = rates_.find(name);
    if (it == rates_.end()) return 0.0;
    auto c = it->second.find(counter);
    return c == it->second.end() ? 0.0 : static_cast<double>(c->second);
  }
  std::vector<Pair> pairs_;
  std::map<std::string, std::map<std::string, double>> rates_;
};

// Three repetitions, reported as their mean, median and spread; the ratios use the medians.
void Repeated(benchmark::internal::Benchmark* b) {
  b->Repetitions(5)->ReportAggregatesOnly(true)->Unit(benchmark::kMicrosecond);
}

void RegisterAll(RatioReporter& reporter) {
  const std::vector<MatmulShape> shapes = {
      {16, 16, 16, false},     {128, 128, 128, false},    {256, 256, 256, false},
      {512, 512, 512, false},  {1024, 1024, 1024, false}, {4096, 1536, 512, true},
      {4096, 2048, 512, true},
  };
  for (const MatmulShape& s : shapes) {
    const std::string dims =
        absl::StrFormat("%dx%dx%d%s", s.m, s.n, s.k, s.transpose_b ? "_bT" : "");
    const std::string raw = "matmul/raw_sgemm/" + dims, ops = "matmul/ops/" + dims;
    Repeated(benchmark::RegisterBenchmark(raw.c_str(), BM_MatmulRawSgemm, s));
    Repeated(benchmark::RegisterBenchmark(ops.c_str(), BM_MatmulOps, s));
    reporter.AddPair(ops, raw, "FLOP/s");
  }
  const std::vector<std::pair<std::string, std::pair<void (*)(benchmark::State&), int64_t>>>
      memory_ops = {
          {"GeluForward", {BM_GeluForward, 2 * kTensorBytes}},
          {"GeluBackward", {BM_GeluBackward, 3 * kTensorBytes}},
          {"BiasAdd", {BM_BiasAdd, 2 * kTensorBytes}},
          {"Add", {BM_Add, 3 * kTensorBytes}},
          {"LayerNormForward", {BM_LayerNormForward, 2 * kTensorBytes}},
          {"SoftmaxForward", {BM_SoftmaxForward, 2 * kTensorBytes}},
          {"ResidualLayerNormForward", {BM_ResidualLayerNormForward, 4 * kTensorBytes}},
          {"AdamWUpdate", {BM_AdamWUpdate, 7 * kParams * 4}},
      };
  // Each op in the variant this CPU runs (op/) and in the base one (op_base/): the gain of the
  // wider instruction set, measured in the same run.
  for (const auto& [name, fn_bytes] : memory_ops) {
    const std::string copy = absl::StrFormat("memcpy/%dMB", fn_bytes.second >> 20);
    const std::string op = "op/" + name, op_base = "op_base/" + name;
    Repeated(
        benchmark::RegisterBenchmark((copy + "/for_" + name).c_str(), BM_Memcpy, fn_bytes.second));
    Repeated(benchmark::RegisterBenchmark(op.c_str(), fn_bytes.first));
    reporter.AddPair(op, copy + "/for_" + name, "bytes_per_second");
    if (ops::BestCpuIsa() == ops::CpuIsa::kBase) continue;
    Repeated(benchmark::RegisterBenchmark(op_base.c_str(), InVariant, ops::CpuIsa::kBase,
                                          fn_bytes.first));
    reporter.AddPair(op, op_base, "bytes_per_second");
  }
  Repeated(benchmark::RegisterBenchmark("stream/op/immediate", BM_StreamOp,
                                        CpuStreamMode::kImmediate));
  Repeated(benchmark::RegisterBenchmark("stream/op/async", BM_StreamOp, CpuStreamMode::kAsync));
  Repeated(benchmark::RegisterBenchmark("stream/issue/async", BM_StreamIssue));
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  // One BLAS thread, as each worker runs: the comparison is per core.
  openblas_set_num_threads(1);
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("cpu_ops_variant",
                              tandem::ops::CpuIsaName(tandem::ops::BestCpuIsa()));
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  tandem::RatioReporter reporter;
  tandem::RegisterAll(reporter);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
