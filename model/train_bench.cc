// One-worker training throughput on the CPU: `bazel run //model:train_bench`.
// For gpt-tiny and a d_model 512 GPT it reports tokens/s, the share of step time in matmuls
// (from the op profiler), and the achieved model FLOP/s (6 x matmul parameters x tokens/s) as a
// fraction of raw OpenBLAS sgemm measured in the same run, one BLAS thread throughout; and the
// speed-up of the CPU ops' widest instruction-set variant over their base (SSE2) one, from
// steps that alternate between the two (they give the same bits, ops.h). Then standard
// against flash attention at sequence length 1024: step time and the memory a step takes
// above the model state, from steps that alternate between the two models.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "model/trainer.h"
#include "runtime/allocator.h"
#include "runtime/ops.h"
#include "runtime/profiler.h"

namespace tandem {
namespace {

double Seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

// Best of five single-thread sgemm runs at n x n x n, in FLOP/s.
double SgemmRate(int n) {
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    auto t = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                n, 0.0f, c.data(), n);
    best = std::max(best, 2.0 * n * n * n / Seconds(t));
  }
  return best;
}

struct Result {
  double tokens_per_second, matmul_share, flops, over_base;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result Bench(TrainConfig c, int steps) {
  c.synthetic_data = true;
  c.steps = 1 << 20;
  c.optimizer.total_steps = c.steps;
  auto t = *Trainer::Create(c);
  for (int i = 0; i < 2; ++i) (void)t->Step();  // warm caches and the allocator
  std::vector<double> best, base;
  for (int i = 0; i < steps; ++i) {
    (void)ops::UseCpuIsa(ops::CpuIsa::kBase);
    base.push_back(t->Step()->seconds);
    (void)ops::UseCpuIsa(ops::BestCpuIsa());
    best.push_back(t->Step()->seconds);
  }
  const double median = Median(best);
  // A separate, profiled pass for the op shares.
  Profiler::Reset();
  Profiler::Enable(true);
  for (int i = 0; i < 2; ++i) (void)t->Step();
  Profiler::Enable(false);
  double total = 0, matmul = 0;
  for (const OpStat& o : Profiler::OpTable()) {
    total += o.total_seconds;
    if (o.name == "Matmul" || o.name.rfind("Linear", 0) == 0) matmul += o.total_seconds;
  }
  const double tokens = double(c.batch) * c.model.seq_len;
  Result r;
  r.tokens_per_second = tokens / median;
  r.matmul_share = total > 0 ? matmul / total : 0;
  r.flops = 6.0 * c.model.num_matmul_params() * r.tokens_per_second;
  r.over_base = Median(base) / median;
  return r;
}

// Standard and flash attention on one long-sequence GPT, steps alternating between them.
void AttentionBench() {
  TrainConfig c;
  c.model = *ModelPreset("gpt");
  c.model.n_layer = 2;
  c.model.seq_len = 1024;
  c.batch = 4;
  c.synthetic_data = true;
  c.steps = 1 << 20;
  c.optimizer.total_steps = c.steps;
  const Attention kinds[2] = {Attention::kStandard, Attention::kFlash};
  std::unique_ptr<Trainer> t[2];
  for (int i = 0; i < 2; ++i) {
    c.model.attention = kinds[i];
    t[i] = *Trainer::Create(c);
    (void)t[i]->Step();  // warm caches and the allocator
  }
  Allocator* cpu = *GetAllocator(Device::Cpu());
  std::vector<double> seconds[2];
  int64_t peak[2] = {0, 0};
  for (int s = 0; s < 5; ++s) {
    for (int i = 0; i < 2; ++i) {
      peak[i] = std::max(
          peak[i], PeakAllocatedDuring(*cpu, [&] { seconds[i].push_back(t[i]->Step()->seconds); }));
    }
  }
  std::printf("\nattention at seq %d (gpt, %d layers, d_model %d, %d heads, batch %d), median of "
              "5 alternating steps;\nstep MB: the allocator's peak during a step above what was "
              "allocated before it;\nspeed and memory: against standard attention\n",
              c.model.seq_len, c.model.n_layer, c.model.d_model, c.model.n_head, c.batch);
  std::printf("%-10s %10s %12s %10s %12s\n", "attention", "step ms", "speed", "step MB",
              "memory");
  for (int i = 0; i < 2; ++i) {
    std::printf("%-10s %10.1f %11.2fx %10.1f %11.2fx\n", AttentionName(kinds[i]),
                1e3 * Median(seconds[i]), Median(seconds[0]) / Median(seconds[i]),
                peak[i] / 1048576.0, double(peak[i]) / peak[0]);
  }
}

int Main() {
  openblas_set_num_threads(1);
  const double sgemm = SgemmRate(1024);
  std::printf("raw OpenBLAS sgemm 1024^3, 1 thread: %.1f GFLOP/s\n", sgemm / 1e9);
  std::printf(
      "CPU ops in the %s variant; vs base: step time in the base (SSE2) variant over it\n\n",
      ops::CpuIsaName(ops::BestCpuIsa()));
  std::printf("%-34s %10s %12s %12s %10s %8s\n", "model", "tokens/s", "matmul share",
              "GFLOP/s (6N)", "of sgemm", "vs base");
  TrainConfig tiny;
  tiny.model = *ModelPreset("gpt-tiny");
  tiny.batch = 16;
  TrainConfig big;
  big.model = *ModelPreset("gpt");
  big.model.name = "gpt-d512";
  big.model.n_layer = 4;
  big.model.d_model = 512;
  big.model.n_head = 8;
  big.model.seq_len = 128;
  big.batch = 8;
  for (const TrainConfig& c : {tiny, big}) {
    Result r = Bench(c, 7);
    std::printf("%-34s %10.0f %11.0f%% %12.1f %9.0f%% %7.2fx\n",
                (c.model.name + " (batch " + std::to_string(c.batch) + ")").c_str(),
                r.tokens_per_second, 100 * r.matmul_share, r.flops / 1e9, 100 * r.flops / sgemm,
                r.over_base);
  }
  AttentionBench();
  return 0;
}

}  // namespace
}  // namespace tandem

int main() { return tandem::Main(); }
