// The peak memory of a training step on a stage, measured with the device's allocator, and how
// far above the estimate it may lie: shared by the memory tests on the CPU and on CUDA.
#ifndef TANDEM_MODEL_MEMORY_TESTING_H_
#define TANDEM_MODEL_MEMORY_TESTING_H_

#include <vector>

#include "gtest/gtest.h"
#include "model/data.h"
#include "model/memory.h"
#include "model/stage.h"
#include "model/trainer.h"
#include "runtime/allocator.h"

namespace tandem {

// What crosses a stage boundary for a micro-batch of B samples: (B, T, C) in `dtype` on
// `device`, as the previous stage sends its output or the next its gradient.
inline Tensor Boundary(const ModelConfig& c, int B, Device device = Device::Cpu(),
                       DType dtype = DType::kF32) {
  return *Tensor::FromVector(std::vector<float>(B * c.seq_len * c.d_model, 0.5f),
                             {B, c.seq_len, c.d_model}, device, dtype);
}

inline MicroBatch Batch(const ModelConfig& c, int B, Device device = Device::Cpu()) {
  auto data = TokenDataset::Synthetic(4096, c.seq_len, c.vocab, 3);
  DataOrder order(data.num_samples(), 3);
  return *MakeMicroBatch(data, order, 0, 0, B, c.seq_len, device, 1.0f / (B * c.seq_len));
}

// One step of M micro-batches of B samples in GPipe's order (every forward, then every
// backward) on blocks [begin, end) as the pipeline runs them: a stage before the head sends
// each output on and keeps none of it, and is given each output's gradient in backward. Returns
// the allocator's peak above what was live before the step. A first micro-batch runs before,
// so that what ops allocate once (cuBLASLt's workspace, algorithm trials) is behind it, and the
// cache is emptied, so that each request gets a block of its own size.
inline int64_t PeakOfAStep(const ModelConfig& c, int begin, int end, int B, int M, Device device,
                           DType dtype) {
  const int n = c.num_blocks();
  auto st = *Stage::Create(c, begin, end, device, 7, dtype);
  Stream& s = **Stream::Compute(device);
  Allocator& alloc = **GetAllocator(device);
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < M; ++m) mbs.push_back(Batch(c, B, device));
  auto input = [&] { return begin == 0 ? Tensor() : Boundary(c, B, device, dtype); };
  auto gradient = [&] { return end == n ? Tensor() : Boundary(c, B, device, dtype); };
  {
    Tensor y, dx;
    EXPECT_TRUE(st->Forward(s, 0, mbs[0], input(), &y).ok());
    EXPECT_TRUE(st->Backward(s, 0, mbs[0], gradient(), &dx).ok());
  }
  const int64_t peak = PeakAllocatedDuring(
      alloc,
      [&] {
        std::vector<Tensor> losses(M);
        for (int m = 0; m < M; ++m) {
          Tensor y;
          EXPECT_TRUE(st->Forward(s, m, mbs[m], input(), &y).ok());
          if (end == n) losses[m] = y;  // else sent on
        }
        for (int m = 0; m < M; ++m) {
          Tensor dx;  // sent to the previous stage
          EXPECT_TRUE(st->Backward(s, m, mbs[m], gradient(), &dx).ok());
        }
      },
      /*fresh=*/true);
  EXPECT_TRUE(s.Synchronize().ok());
  return peak;
}

// How far PeakOfAStep may lie above the estimate's activations and temporaries: the losses of
// the micro-batch in backward, which the estimate counts as freed with the head's activations
// but the caller keeps; one request served by a cached block of up to twice its size (blocks
// are not split), a (B, T, C) gradient in a freed (B, T, vocab) logits block; the rounding of
// every buffer a block keeps or makes (at most 32), and of the ops' scratch.
inline int64_t PeakSlack(const ModelConfig& c, int begin, int end, int B, int M, DType dtype) {
  const int64_t rows = int64_t{B} * c.seq_len;
  return rows * 4 + rows * c.d_model * static_cast<int64_t>(DTypeSize(dtype)) +
         (int64_t{M} * (end - begin) + 1) * 32 * static_cast<int64_t>(CachingAllocator::kRoundBytes);
}

// PeakOfAStep against EstimateStageMemory: at least the estimate (less the matmuls' workspace,
// which the first micro-batch allocated), and above it by no more than PeakSlack.
inline void ExpectPeakOfAStepMatchesTheEstimate(const ModelConfig& c, int begin, int end, int B,
                                                int M, Device device, DType dtype) {
  const int64_t peak = PeakOfAStep(c, begin, end, B, M, device, dtype);
  const MemoryNeed need =
      EstimateStageMemory(c, begin, end, B, M, /*recompute=*/false, dtype, "adamw", device);
  const int64_t estimate = need.activations + need.workspace - ops::MatmulWorkspaceBytes(device);
  EXPECT_GE(peak, estimate);
  EXPECT_LE(peak, estimate + PeakSlack(c, begin, end, B, M, dtype))
      << "peak " << peak << ", estimate " << estimate;
}

}  // namespace tandem

#endif  // TANDEM_MODEL_MEMORY_TESTING_H_
