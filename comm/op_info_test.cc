// Operation descriptions and the argument checks every communicator shares.
#include "comm/op_info.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

Tensor F32(int64_t n) { return Tensor::Empty(Shape{n}, DType::kF32, Device::Cpu()).value(); }

TEST(OpInfoTest, DescriptionsNameKindSequenceAndData) {
  const CommIdentity c{1, 4, Device::Cpu()};
  OpInfo a = CheckAllReduce(c, F32(1024), ReduceOp::kAvg).value();
  a.sequence = 42;
  EXPECT_EQ(a.Describe(), "all_reduce #42 (f32 x 1024, avg)");
  EXPECT_EQ(a.WaitingFor(4), "all 4 ranks to join it");
  OpInfo r = CheckRecv(c, F32(12), 3).value();
  r.sequence = 7;
  EXPECT_EQ(r.Describe(), "recv #7 (f32 x 12 from rank 3)");
  EXPECT_EQ(r.WaitingFor(4), "rank 3 to send its f32 x 12");
  OpInfo x = CheckSendRecv(c, {PeerTransfer::Send(F32(2), 2), PeerTransfer::Recv(F32(2), 0)})
                 .value();
  x.sequence = 9;
  EXPECT_EQ(x.Describe(), "send_recv #9 (to ranks [2], from ranks [0])");
  OpInfo b = CheckBroadcast(c, F32(3), 0).value();
  b.sequence = 1;
  EXPECT_EQ(b.Describe(), "broadcast #1 (f32 x 3, root 0)");
  OpInfo g = CheckAllGather(c, F32(12), F32(3)).value();
  g.sequence = 2;
  EXPECT_EQ(g.Describe(), "all_gather #2 (f32 x 3 per rank)");
  OpInfo s = CheckReduceScatter(c, F32(3), F32(12), ReduceOp::kSum).value();
  s.sequence = 3;
  EXPECT_EQ(s.Describe(), "reduce_scatter #3 (f32 x 3 per rank, sum)");
}

TEST(OpInfoTest, TimeoutAndAbortMessages) {
  const CommIdentity c{2, 3, Device::Cpu()};
  OpInfo a = CheckAllReduce(c, F32(5), ReduceOp::kSum).value();
  a.sequence = 11;
  absl::Status t = WaitTimeoutError(c, a, absl::Seconds(5), "the thread is in barrier #10");
  EXPECT_EQ(t.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(t.message(),
            "rank 2: all_reduce #11 (f32 x 5, sum) not finished after 5s: waiting for all 3 "
            "ranks to join it; the thread is in barrier #10");
  absl::Status ab = OpAbortedError(c, a, "rank 0 hung");
  EXPECT_EQ(ab.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ab.message(), "rank 2: all_reduce #11 (f32 x 5, sum) aborted: rank 0 hung");
}

TEST(OpInfoTest, BadArgumentsNameRankOperationAndArgument) {
  const CommIdentity c{0, 2, Device::Cpu()};
  auto ints = Tensor::FromInts({1, 2}, Shape{2}).value();
  EXPECT_EQ(CheckAllReduce(c, ints, ReduceOp::kAvg).status().message(),
            "rank 0: all_reduce: cannot avg-reduce i32 (f32, bf16 and f16 reduce; i32 only sums)");
  EXPECT_TRUE(CheckAllReduce(c, ints, ReduceOp::kSum).ok());
  EXPECT_EQ(CheckAllReduce(c, Tensor(), ReduceOp::kSum).status().message(),
            "rank 0: all_reduce: tensor is undefined");
  EXPECT_EQ(CheckBroadcast(c, F32(1), 2).status().message(),
            "rank 0: broadcast: root 2 is outside ranks 0..1");
  EXPECT_EQ(CheckSend(c, F32(1), 0).status().message(),
            "rank 0: send: peer 0 is this rank; copy the tensor instead");
  EXPECT_EQ(CheckRecv(c, F32(1), -1).status().message(),
            "rank 0: recv: peer -1 is outside ranks 0..1");
  EXPECT_EQ(CheckAllGather(c, F32(5), F32(2)).status().message(),
            "rank 0: all_gather: out has 5 elements, expected world size 2 x 2 (in)");
  EXPECT_EQ(CheckReduceScatter(c, F32(2), F32(5), ReduceOp::kSum).status().message(),
            "rank 0: reduce_scatter: in has 5 elements, expected world size 2 x 2 (out)");
  EXPECT_EQ(CheckSendRecv(c, {}).status().message(), "rank 0: send_recv: no transfers given");
  auto bf16 = Tensor::Empty(Shape{4}, DType::kBF16, Device::Cpu()).value();
  EXPECT_EQ(CheckAllGather(c, bf16, F32(2)).status().message(),
            "rank 0: all_gather: out is bf16 but in is f32");
  const CommIdentity gpu{0, 2, Device::Cuda(0)};
  EXPECT_EQ(CheckAllReduce(gpu, F32(1), ReduceOp::kSum).status().message(),
            "rank 0: all_reduce: tensor is f32[1] on cpu but this communicator works on cuda:0");
}

}  // namespace
}  // namespace tandem
