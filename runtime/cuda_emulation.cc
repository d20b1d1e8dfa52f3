#include "runtime/cuda_emulation.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

thread_local dim3 threadIdx;
thread_local dim3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace tandem {
namespace cuda_emulation {
namespace {

constexpr int kWarp = 32;

// A reusable barrier whose threads may leave (exit) while others wait.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait(const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t generation = generation_;
    if (++arrived_ >= n_) {
      Release();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != generation; })) {
      std::fprintf(stderr,
                   "CUDA emulation: %s waited 60 s in block (%u, %u, %u): threads diverge "
                   "around it\n",
                   what, blockIdx.x, blockIdx.y, blockIdx.z);
      std::abort();
    }
  }
  void Leave() {
    std::lock_guard<std::mutex> lock(mu_);
    --n_;
    if (n_ > 0 && arrived_ >= n_) Release();
  }
  int participants() {
    std::lock_guard<std::mutex> lock(mu_);
    return n_;
  }

 private:
  void Release() {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

// A block's state.
struct Block {
  std::vector<unsigned char> memory;
  unsigned char* shared = nullptr;  // 128-byte aligned, inside memory
  size_t shared_bytes = 0;
  std::unique_ptr<Barrier> all;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<int> warp_size;  // threads each warp started with
  std::vector<float> shuffle;  // one slot per thread
  // A warp's registers on their way to a warp-wide instruction: kExchange words per thread.
  std::vector<uintptr_t> exchange;
};
constexpr int kExchange = 6;
thread_local Block* g_block = nullptr;  // the block this thread runs

// The calling thread's cp.async copies: committed groups, oldest first, and the open one.
struct Copy {
  void* dst;
  const void* src;
  bool valid;
};
thread_local std::deque<std::vector<Copy>> g_committed;
thread_local std::vector<Copy> g_open;

std::mutex g_error_mu;
std::string g_error;
std::mutex g_atomic_mu;

// The thread's linear id in its block (x fastest).
int LinearId() {
  return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

Barrier& MyWarp() { return *g_block->warps[LinearId() / kWarp]; }

// Whether every lane of the calling thread's warp is there, as a warp-wide instruction
// requires; else records `what` broke the rule.
bool WholeWarp(const char* what) {
  const int warp = LinearId() / kWarp;
  if (MyWarp().participants() == kWarp && g_block->warp_size[warp] == kWarp) return true;
  Fail(std::string(what) + " in a warp with an exited or missing lane");
  return false;
}

// The 16-bit element `half` (0 low, 1 high) of a 32-bit register, as a float.
float HalfOf(uintptr_t word, int half, bool bf16) {
  const uint16_t bits = static_cast<uint16_t>(word >> (16 * half));
  return bf16 ? Bf16ToFloat(bits) : HalfToFloat(bits);
}

}  // namespace

unsigned char* DynamicShared() { return g_block->shared; }
size_t DynamicSharedBytes() { return g_block->shared_bytes; }

void Fail(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_error_mu);
  if (g_error.empty()) g_error = what;
}

std::string TakeError() {
  std::lock_guard<std::mutex> lock(g_error_mu);
  std::string e;
  e.swap(g_error);
  return e;
}

void Launch(dim3 grid, dim3 block_dim, size_t shared, const std::function<void()>& kernel) {
  gridDim = grid;
  blockDim = block_dim;
  const unsigned int block = block_dim.x * block_dim.y * block_dim.z;
  const size_t count = size_t{grid.x} * grid.y * grid.z;
  std::vector<std::unique_ptr<Block>> blocks;
  for (size_t i = 0; i < count; ++i) {
    auto b = std::make_unique<Block>();
    b->memory.assign(shared + 128, 0xff);  // 0xff bytes: NaN in f32, bf16 and f16
    const uintptr_t at = reinterpret_cast<uintptr_t>(b->memory.data());
    b->shared = b->memory.data() + (128 - at % 128) % 128;
    b->shared_bytes = shared;
    b->all = std::make_unique<Barrier>(static_cast<int>(block));
    for (unsigned int w = 0; w < block; w += kWarp) {
      b->warp_size.push_back(static_cast<int>(std::min<unsigned int>(kWarp, block - w)));
      b->warps.push_back(std::make_unique<Barrier>(b->warp_size.back()));
    }
    b->shuffle.resize(block);
    b->exchange.resize(size_t{block} * kExchange);
    blocks.push_back(std::move(b));
  }
  // One thread per CUDA thread runs the blocks in turn; a block starts when every thread has
  // finished the one before (their `__shared__` statics are one copy).
  Barrier between(static_cast<int>(block));
  std::vector<std::thread> threads;
  threads.reserve(block);
  for (unsigned int t = 0; t < block; ++t) {
    threads.emplace_back([&, t] {
      threadIdx =
          dim3(t % block_dim.x, t / block_dim.x % block_dim.y, t / (block_dim.x * block_dim.y));
      for (size_t i = 0; i < count; ++i) {
        blockIdx = dim3(static_cast<unsigned int>(i % grid.x),
                        static_cast<unsigned int>(i / grid.x % grid.y),
                        static_cast<unsigned int>(i / (size_t{grid.x} * grid.y)));
        g_block = blocks[i].get();
        kernel();
        for (const std::vector<Copy>& group : g_committed) {
          if (!group.empty()) Fail("a thread exited with cp.async copies not waited for");
        }
        g_open.clear();
        g_committed.clear();
        MyWarp().Leave();  // an exited thread no longer holds a barrier back
        g_block->all->Leave();
        between.Wait("the end of a block");
      }
      g_block = nullptr;
    });
  }
  for (std::thread& t : threads) t.join();
}

void LdMatrixX4(uint32_t (&r)[4], const void* row, bool trans) {
  if (!WholeWarp("ldmatrix")) return;
  const int id = LinearId(), lane = id % kWarp, first = id - lane;
  uintptr_t* x = g_block->exchange.data();
  x[id * kExchange] = reinterpret_cast<uintptr_t>(row);
  __syncwarp();
  bool ok = true;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(g_block->shared);
  for (int l = 0; l < kWarp; ++l) {
    const uintptr_t at = x[(first + l) * kExchange];
    ok = ok && at % 16 == 0 && at >= lo && at + 16 <= lo + g_block->shared_bytes;
  }
  if (!ok) {
    Fail("ldmatrix row address not 16-byte aligned or outside shared memory");
  } else {
    // Element (i, c) of matrix j: column c of the row lane 8 j + i gave.
    auto at = [&](int j, int i, int c) {
      return reinterpret_cast<const uint16_t*>(x[(first + 8 * j + i) * kExchange])[c];
    };
    const int g = lane / 4, t = lane % 4;
    for (int j = 0; j < 4; ++j) {
      const uint32_t e0 = trans ? at(j, 2 * t, g) : at(j, g, 2 * t);
      const uint32_t e1 = trans ? at(j, 2 * t + 1, g) : at(j, g, 2 * t + 1);
      r[j] = e0 | e1 << 16;
    }
  }
  __syncwarp();
}

void MmaM16N8K16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16) {
  if (!WholeWarp("mma")) return;
  const int id = LinearId(), lane = id % kWarp, first = id - lane;
  uintptr_t* x = g_block->exchange.data();
  for (int i = 0; i < 4; ++i) x[id * kExchange + i] = a[i];
  x[id * kExchange + 4] = b0;
  x[id * kExchange + 5] = b1;
  __syncwarp();
  // a (16 x 16): row r, column k sits in lane (r % 8) * 4 + (k % 8) / 2, register
  // (r >= 8) + 2 (k >= 8), half k % 2. b (16 x 8): row k, column n in lane n * 4 + (k % 8) / 2,
  // register b0 or b1 (k >= 8), half k % 2.
  auto av = [&](int r, int k) {
    const int l = (r % 8) * 4 + (k % 8) / 2;
    return HalfOf(x[(first + l) * kExchange + (r >= 8) + 2 * (k >= 8)], k % 2, bf16);
  };
  auto bv = [&](int k, int n) {
    const int l = n * 4 + (k % 8) / 2;
    return HalfOf(x[(first + l) * kExchange + 4 + (k >= 8)], k % 2, bf16);
  };
  const int g = lane / 4, t = lane % 4;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e / 2), n = 2 * t + e % 2;
    float sum = d[e];
    for (int k = 0; k < 16; ++k) sum += av(r, k) * bv(k, n);
    out[e] = sum;
  }
  __syncwarp();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

void CpAsync16(void* dst, const void* src, bool valid) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(g_block->shared);
  if (at % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0 || at < lo ||
      at + 16 > lo + g_block->shared_bytes) {
    Fail("cp.async: an address not 16-byte aligned, or a destination outside shared memory");
    return;
  }
  g_open.push_back({dst, src, valid});
  // Until the copy is waited for, its bytes are undefined: NaN, so that a thread still reading
  // the old contents (a barrier missing before the copy) or reading early shows.
  std::memset(dst, 0xff, 16);
}

void CpAsyncCommit() {
  g_committed.push_back(std::move(g_open));
  g_open.clear();
}

void CpAsyncWait(int pending) {
  while (static_cast<int>(g_committed.size()) > pending) {
    for (const Copy& c : g_committed.front()) {
      if (c.valid) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    }
    g_committed.pop_front();
  }
}

}  // namespace cuda_emulation
}  // namespace tandem

using tandem::cuda_emulation::Fail;

void __syncthreads() { tandem::cuda_emulation::g_block->all->Wait("__syncthreads"); }

void __syncwarp(unsigned int) { tandem::cuda_emulation::MyWarp().Wait("__syncwarp"); }

float __shfl_xor_sync(unsigned int, float v, int lane_mask) {
  using tandem::cuda_emulation::g_block;
  using tandem::cuda_emulation::kWarp;
  const int id = tandem::cuda_emulation::LinearId();
  const int warp = id / kWarp;
  const int lane = id % kWarp;
  const int partner = lane ^ lane_mask;
  if (tandem::cuda_emulation::MyWarp().participants() != g_block->warp_size[warp] ||
      partner >= g_block->warp_size[warp]) {
    Fail("__shfl_xor_sync in a warp with an exited or missing lane");
    return v;
  }
  g_block->shuffle[id] = v;
  __syncwarp();
  const float r = g_block->shuffle[id - lane + partner];
  __syncwarp();
  return r;
}

float atomicAdd(float* address, float v) {
  std::lock_guard<std::mutex> lock(tandem::cuda_emulation::g_atomic_mu);
  const float old = *address;
  *address = old + v;
  return old;
}
