// The NCCL communicator as rank 0 of 1 on CUDA device 0, its unique id passed through a
// real coordinator. NCCL refuses two ranks on one GPU, so multi-rank paths need a multi-GPU
// machine. Where no GPU is visible (or the build has no CUDA) the GPU tests skip and say why.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "comm/nccl_communicator.h"
#include "comm/nccl_testing.h"
#include "gtest/gtest.h"
#include "runtime/device.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace tandem {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr int64_t kBig = (int64_t{16} << 20) / 4 + 3;  // just over 16 MB of f32

bool HaveGpu(std::string* why) {
  if (CudaDeviceCount(why) > 0) return true;
  std::printf("NCCL communicator tests skip: no GPU visible (%s)\n", why->c_str());
  return false;
}

std::vector<float> Values(int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = 1.0f + 0.5f * (i % 9);  // exact in bf16 and f16
  return v;
}

TEST(NcclCommunicatorOptionsTest, RefusedWithoutAGpuOrWithBadOptions) {
  NcclCommunicatorOptions o;
  o.world_size = 2;  // and no store
  auto no_store = CreateNcclCommunicator(o);
  EXPECT_FALSE(no_store.ok());
  o.world_size = 1;
  o.device = Device::Cpu();
  auto cpu = CreateNcclCommunicator(o);
  EXPECT_FALSE(cpu.ok());
  o.device = Device::Cuda(0);
  o.accept_timeout = absl::ZeroDuration();
  auto no_accept_time = CreateNcclCommunicator(o);
  EXPECT_FALSE(no_accept_time.ok());
  o.accept_timeout = absl::Minutes(30);
  std::string why;
  if (CudaDeviceCount(&why) > 0) return;  // the no-GPU case is what is left to check
  o.device = Device::Cuda(0);
  auto none = CreateNcclCommunicator(o);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable) << none.status();
  std::printf("without a GPU, creation fails cleanly: %s\n",
              std::string(none.status().message()).c_str());
}

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no GPU visible: " << why;
    absl::StatusOr<OneRankNccl> nccl = OneRankNccl::StartUnlessFailedBefore();
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    nccl_ = std::move(*nccl);
  }

  Tensor OnGpu(const std::vector<float>& v, DType dtype = DType::kF32) {
    auto t = Tensor::FromVector(v, Shape{static_cast<int64_t>(v.size())}, Device::Cuda(0), dtype);
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  }

  void ExpectValues(const Tensor& t, const std::vector<float>& want, const std::string& what) {
    auto got = t.ToFloatVector();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ((*got)[i], want[i]) << what << " element " << i;
    }
  }

  OneRankNccl nccl_;
};

TEST_F(NcclCommunicatorTest, UniqueIdWentThroughTheCoordinator) {
  auto id = nccl_.client->Get("tandem/nccl/unique_id");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 128u);
  EXPECT_EQ(nccl_.comm->rank(), 0);
  EXPECT_EQ(nccl_.comm->world_size(), 1);
  EXPECT_EQ(nccl_.comm->device(), Device::Cuda(0));
}

TEST_F(NcclCommunicatorTest, AllReduceEveryDtypeAndCount) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, kBig}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        const std::vector<float> v = Values(n);
        Tensor t = OnGpu(v, dtype);
        auto w = nccl_.comm->AllReduce(t, {op});
        ASSERT_TRUE(w.ok()) << w.status();
        ASSERT_TRUE((*w)->Wait(kTimeout).ok());
        // One rank: the sum and the average are the input.
        ExpectValues(t, v, absl::StrCat((*w)->description()));
      }
    }
  }
}

TEST_F(NcclCommunicatorTest, BroadcastAllGatherReduceScatterBarrier) {
  const std::vector<float> v = Values(1001);
  Tensor a = OnGpu(v);
  ASSERT_TRUE(nccl_.comm->Broadcast(a, {0}).value()->Wait(kTimeout).ok());
  ExpectValues(a, v, "broadcast");
  Tensor out = OnGpu(std::vector<float>(1001, 0.0f));
  ASSERT_TRUE(nccl_.comm->AllGather(out, a).value()->Wait(kTimeout).ok());
  ExpectValues(out, v, "all_gather");
  Tensor rs = OnGpu(std::vector<float>(1001, 0.0f), DType::kBF16);
  ASSERT_TRUE(nccl_.comm->ReduceScatter(rs, OnGpu(v, DType::kBF16)).value()->Wait(kTimeout).ok());
  ExpectValues(rs, v, "reduce_scatter");
  ASSERT_TRUE(nccl_.comm->Barrier().value()->Wait(kTimeout).ok());
}

TEST_F(NcclCommunicatorTest, OperationsInFlightCompleteInIssueOrder) {
  std::vector<Tensor> tensors;
  std::vector<std::unique_ptr<Work>> works;
  for (int k = 0; k < 6; ++k) {
    tensors.push_back(OnGpu(Values(k % 2 ? kBig : 333)));
    works.push_back(nccl_.comm->AllReduce(tensors.back()).value());
    EXPECT_EQ(works.back()->sequence(), static_cast<uint64_t>(k + 1));
  }
  EXPECT_EQ(nccl_.comm->last_issued_sequence(), 6u);
  ASSERT_TRUE(works.back()->Wait(kTimeout).ok());
  for (auto& w : works) EXPECT_TRUE(w->IsCompleted().value()) << w->description();
  EXPECT_EQ(nccl_.comm->last_completed_sequence(), 6u);
}

// Queues a long host-to-device copy on the compute stream (about 10 ms for 256 MB from
// pinned memory) so that a following operation has to wait for it.
void BusyComputeStream(Tensor* keep_src, Tensor* keep_dst) {
  const Shape shape{int64_t{64} << 20};
  *keep_src = Tensor::Empty(shape, DType::kF32, Device::Cpu(), HostMemoryKind::kPinned).value();
  *keep_dst = Tensor::Empty(shape, DType::kF32, Device::Cuda(0)).value();
  Stream* compute = Stream::Compute(Device::Cuda(0)).value();
  ASSERT_TRUE(Copy(*keep_dst, *keep_src, *compute).ok());
}

TEST_F(NcclCommunicatorTest, OperationsWaitForTheComputeStream) {
  const std::vector<float> v = Values(100003);
  Tensor t = OnGpu(std::vector<float>(v.size(), 0.0f));
  auto src = Tensor::Empty(Shape{static_cast<int64_t>(v.size())}, DType::kF32, Device::Cpu(),
                           HostMemoryKind::kPinned);
  ASSERT_TRUE(src.ok());
  std::copy(v.begin(), v.end(), src->data<float>());
  Tensor busy_src, busy_dst;
  BusyComputeStream(&busy_src, &busy_dst);
  Stream* compute = Stream::Compute(Device::Cuda(0)).value();
  ASSERT_TRUE(Copy(t, *src, *compute).ok());  // queued behind the long copy
  auto w = nccl_.comm->AllReduce(t, {ReduceOp::kAvg});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Wait(kTimeout).ok());
  ExpectValues(t, v, "all_reduce after an asynchronous copy on the compute stream");
}

// An all-reduce of `t` queued behind BusyComputeStream's copy, so unfinished when the caller
// next acts on the communicator.
std::unique_ptr<Work> UnfinishedAllReduce(Communicator& comm, const Tensor& t, Tensor* busy_src,
                                          Tensor* busy_dst) {
  BusyComputeStream(busy_src, busy_dst);
  auto w = comm.AllReduce(t);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? std::move(*w) : nullptr;
}

TEST_F(NcclCommunicatorTest, AbortFailsWorkAndRefusesMore) {
  Tensor t = OnGpu(Values(kBig)), busy_src, busy_dst;
  std::unique_ptr<Work> w = UnfinishedAllReduce(*nccl_.comm, t, &busy_src, &busy_dst);
  ASSERT_NE(w, nullptr);
  nccl_.comm->Abort("the coordinator aborted the job");
  absl::Status s = w->Wait(kTimeout);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("the coordinator aborted the job"), std::string::npos) << s;
  EXPECT_EQ(nccl_.comm->AllReduce(t).status().code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(Stream::Compute(Device::Cuda(0)).value()->Synchronize().ok());
}

// A rank leaving on an error destroys its communicator with work unfinished: it aborts at once
// instead of finalizing (which waits for peers that may be gone).
TEST_F(NcclCommunicatorTest, DestroyedWithWorkInFlightAbortsAtOnce) {
  Tensor t = OnGpu(Values(kBig)), busy_src, busy_dst;
  std::unique_ptr<Work> w = UnfinishedAllReduce(*nccl_.comm, t, &busy_src, &busy_dst);
  ASSERT_NE(w, nullptr);
  const absl::Time start = absl::Now();
  nccl_.comm.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_TRUE(Stream::Compute(Device::Cuda(0)).value()->Synchronize().ok());
}

// Work::WaitOn: the compute stream waits for the operation, the host does not; a copy queued
// on the compute stream after it reads the reduced values.
TEST_F(NcclCommunicatorTest, TheComputeStreamWaitsOnTheOperation) {
  const std::vector<float> v = Values(100003);
  Tensor t = OnGpu(v), busy_src, busy_dst;
  std::unique_ptr<Work> w = UnfinishedAllReduce(*nccl_.comm, t, &busy_src, &busy_dst);
  ASSERT_NE(w, nullptr);
  Stream* compute = Stream::Compute(Device::Cuda(0)).value();
  ASSERT_TRUE(w->WaitOn(*compute, kTimeout).ok());
  Tensor host = Tensor::Empty(t.shape(), DType::kF32, Device::Cpu(), HostMemoryKind::kPinned)
                    .value();
  ASSERT_TRUE(Copy(host, t, *compute).ok());
  ASSERT_TRUE(compute->Synchronize().ok());
  ExpectValues(host, v, "a copy after the compute stream waited on the all-reduce");
}

// A group split from the job's communicator (one rank here: ncclCommSplit with one color).
TEST_F(NcclCommunicatorTest, SplitMakesAGroup) {
  auto g = nccl_.comm->Split(0, 0, "the data-parallel group of stage 0", {0});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->world_size(), 1);
  EXPECT_EQ((*g)->name(), "the data-parallel group of stage 0");
  const std::vector<float> v = Values(1001);
  Tensor t = OnGpu(v);
  ASSERT_TRUE((*g)->AllReduce(t).value()->Wait(kTimeout).ok());
  ExpectValues(t, v, "all_reduce in a group of one");
  EXPECT_EQ((*g)->last_issued_sequence(), 1u);
}

TEST_F(NcclCommunicatorTest, BadArgumentsAreRefused) {
  auto cpu = Tensor::FromVector({1, 2}, Shape{2});
  ASSERT_TRUE(cpu.ok());
  auto s = nccl_.comm->AllReduce(*cpu);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("works on cuda:0"), std::string::npos) << s.status();
  EXPECT_EQ(nccl_.comm->Broadcast(OnGpu({1}), {1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
