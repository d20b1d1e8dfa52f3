// MPI communicator tests, run by mpirun at world sizes 1 to 4 (mpirun_test.sh). Every rank
// runs every test; rank r contributes known values and results are checked against closed
// forms. Rank 0 prints the gtest log; other ranks print only their failures.
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/doorbells.h"
#include "comm/mpi_communicator.h"
#include "gtest/gtest.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace tandem {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);
// Just over 16 MB of f32 (and the same count of bf16: just over 8 MB) / of bf16.
constexpr int64_t kBigF32 = (int64_t{16} << 20) / 4 + 3;
constexpr int64_t kBigBf16 = (int64_t{16} << 20) / 2 + 5;
// Just over 16 MB of `dtype`.
int64_t Big(DType dtype) { return dtype == DType::kF32 ? kBigF32 : kBigBf16; }

// Rank r's element i: small integers and halves, exact in f32 and bf16 and in their sums.
float Value(int r, int64_t i) { return static_cast<float>(r + 1) + 0.5f * (i % 7); }
// Sum over n ranks of Value(r, i).
float SumOver(int n, int64_t i) { return n * (n + 1) / 2.0f + n * 0.5f * (i % 7); }

std::vector<float> RankValues(int r, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Value(r, i);
  return v;
}

Tensor Make(const std::vector<float>& v, DType dtype = DType::kF32) {
  auto t = Tensor::FromVector(v, Shape{static_cast<int64_t>(v.size())}, Device::Cpu(), dtype);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

Tensor MakeEmpty(int64_t n, DType dtype = DType::kF32) {
  auto t = Tensor::Empty(Shape{n}, dtype, Device::Cpu());
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

std::vector<float> Floats(const Tensor& t) {
  auto v = t.ToFloatVector();
  EXPECT_TRUE(v.ok()) << v.status();
  return *v;
}

// Checks every element against want(i) within a relative tolerance, reporting the first
// few mismatches only (the big tensors have millions of elements).
template <typename F>
void ExpectAll(const std::vector<float>& got, int64_t n, F want, float rel_tol,
               const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), n) << what;
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    const float w = want(i);
    if (std::fabs(got[i] - w) > rel_tol * std::fabs(w)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << w;
      ++bad;
    }
  }
}

void WorldBarrier() { MPI_Barrier(MPI_COMM_WORLD); }

class MpiCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = CreateMpiCommunicator();
    ASSERT_TRUE(c.ok()) << c.status();
    comm_ = std::move(*c);
    rank_ = comm_->rank();
    world_ = comm_->world_size();
  }

  // Issues and waits; returns the op's status.
  absl::Status Run(absl::StatusOr<std::unique_ptr<Work>> work) {
    if (!work.ok()) return work.status();
    return (*work)->Wait(kTimeout);
  }

  std::unique_ptr<Communicator> comm_;
  int rank_ = 0;
  int world_ = 1;
};

TEST_F(MpiCommunicatorTest, IdentityMatchesMpi) {
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  EXPECT_EQ(comm_->rank(), r);
  EXPECT_EQ(comm_->world_size(), n);
  EXPECT_TRUE(comm_->device().is_cpu());
  EXPECT_EQ(comm_->last_issued_sequence(), 0u);
}

TEST_F(MpiCommunicatorTest, AllReduceSumF32) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1001}, kBigF32}) {
    Tensor t = Make(RankValues(rank_, n));
    ASSERT_TRUE(Run(comm_->AllReduce(t)).ok());
    ExpectAll(Floats(t), n, [&](int64_t i) { return SumOver(world_, i); }, 0.0f,
              absl::StrCat("f32 sum, count ", n));
  }
}

TEST_F(MpiCommunicatorTest, AllReduceAvgF32) {
  for (int64_t n : {int64_t{1}, int64_t{13}, kBigF32}) {
    Tensor t = Make(RankValues(rank_, n));
    ASSERT_TRUE(Run(comm_->AllReduce(t, {ReduceOp::kAvg})).ok());
    ExpectAll(Floats(t), n, [&](int64_t i) { return SumOver(world_, i) / world_; }, 1e-6f,
              absl::StrCat("f32 avg, count ", n));
  }
}

// The largest of every rank's element: an element that is largest on a different rank each
// time (i mod world), in f32 and bf16; reduce-scatter refuses max.
TEST_F(MpiCommunicatorTest, AllReduceMax) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {int64_t{1}, int64_t{13}, kBigBf16}) {
      std::vector<float> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = i % world_ == rank_ ? 3.0f + i % 5 : -1.0f - rank_;
      Tensor t = Make(v, dtype);
      ASSERT_TRUE(Run(comm_->AllReduce(t, {ReduceOp::kMax})).ok());
      ExpectAll(Floats(t), n, [&](int64_t i) { return 3.0f + i % 5; }, 0.0f,
                absl::StrCat(DTypeName(dtype), " max, count ", n));
    }
  }
  Tensor in = Make(RankValues(rank_, 2 * world_)), out = Make(RankValues(rank_, 2));
  const auto refused = comm_->ReduceScatter(out, in, {ReduceOp::kMax});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("max reduces in all-reduce only"), std::string::npos)
      << refused.status();
}

TEST_F(MpiCommunicatorTest, AllReduceBf16AndF16) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{9}, kBigBf16}) {
    Tensor t = Make(RankValues(rank_, n), DType::kBF16);
    ASSERT_TRUE(Run(comm_->AllReduce(t)).ok());
    // Sums up to 22 are exact in bf16 (8 significant bits).
    ExpectAll(Floats(t), n, [&](int64_t i) { return SumOver(world_, i); }, 0.0f,
              absl::StrCat("bf16 sum, count ", n));
  }
  Tensor avg = Make(RankValues(rank_, 1001), DType::kBF16);
  ASSERT_TRUE(Run(comm_->AllReduce(avg, {ReduceOp::kAvg})).ok());
  ExpectAll(Floats(avg), 1001, [&](int64_t i) { return SumOver(world_, i) / world_; },
            1.0f / 256, "bf16 avg");
  Tensor half = Make(RankValues(rank_, 333), DType::kF16);
  ASSERT_TRUE(Run(comm_->AllReduce(half, {ReduceOp::kAvg})).ok());
  ExpectAll(Floats(half), 333, [&](int64_t i) { return SumOver(world_, i) / world_; },
            1.0f / 2048, "f16 avg");
}

TEST_F(MpiCommunicatorTest, AllReduceI32Sum) {
  std::vector<int32_t> v(100);
  for (int i = 0; i < 100; ++i) v[i] = (rank_ + 1) * 1000 + i;
  auto t = Tensor::FromInts(v, Shape{100});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(Run(comm_->AllReduce(*t)).ok());
  auto got = t->ToIntVector();
  ASSERT_TRUE(got.ok());
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ((*got)[i], world_ * (world_ + 1) / 2 * 1000 + world_ * i) << i;
  }
}

TEST_F(MpiCommunicatorTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < world_; ++root) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{11}}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        Tensor t = Make(RankValues(rank_, n), dtype);
        ASSERT_TRUE(Run(comm_->Broadcast(t, {root})).ok());
        ExpectAll(Floats(t), n, [&](int64_t i) { return Value(root, i); }, 0.0f,
                  absl::StrCat("broadcast root ", root, " count ", n, " ",
                               DTypeName(dtype)));
      }
    }
  }
  const int root = world_ - 1;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Tensor big = Make(RankValues(rank_, Big(dtype)), dtype);
    ASSERT_TRUE(Run(comm_->Broadcast(big, {root})).ok());
    ExpectAll(Floats(big), Big(dtype), [&](int64_t i) { return Value(root, i); }, 0.0f,
              absl::StrCat("big broadcast ", DTypeName(dtype)));
  }
}

TEST_F(MpiCommunicatorTest, AllGather) {
  // The last count makes the gathered tensor just over 16 MB at every world size.
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, Big(dtype) / world_ + 1}) {
      Tensor in = Make(RankValues(rank_, n), dtype);
      Tensor out = MakeEmpty(n * world_, dtype);
      ASSERT_TRUE(Run(comm_->AllGather(out, in)).ok());
      ExpectAll(Floats(out), n * world_, [&](int64_t j) { return Value(j / n, j % n); }, 0.0f,
                absl::StrCat("all_gather count ", n, " ", DTypeName(dtype)));
    }
  }
}

TEST_F(MpiCommunicatorTest, AllGatherInPlace) {
  const int64_t n = 17;
  std::vector<float> all(n * world_, -1.0f);
  for (int64_t i = 0; i < n; ++i) all[rank_ * n + i] = Value(rank_, i);
  Tensor out = Make(all);
  auto in = out.View(rank_ * n, Shape{n});
  ASSERT_TRUE(in.ok());
  ASSERT_TRUE(Run(comm_->AllGather(out, *in)).ok());
  ExpectAll(Floats(out), n * world_, [&](int64_t j) { return Value(j / n, j % n); }, 0.0f,
            "in-place all_gather");
}

TEST_F(MpiCommunicatorTest, ReduceScatter) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{9}, Big(dtype) / world_ + 1}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        Tensor in = Make(RankValues(rank_, n * world_), dtype);
        Tensor out = MakeEmpty(n, dtype);
        ASSERT_TRUE(Run(comm_->ReduceScatter(out, in, {op})).ok());
        const float tol = op == ReduceOp::kSum ? 0.0f : (dtype == DType::kF32 ? 1e-6f : 1e-2f);
        ExpectAll(Floats(out), n,
                  [&](int64_t i) {
                    const float s = SumOver(world_, rank_ * n + i);
                    return op == ReduceOp::kSum ? s : s / world_;
                  },
                  tol,
                  absl::StrCat("reduce_scatter count ", n, " ", DTypeName(dtype), " ",
                               ReduceOpName(op)));
      }
    }
  }
}

TEST_F(MpiCommunicatorTest, SendRecvAroundARing) {
  if (world_ < 2) GTEST_SKIP() << "a ring needs 2 ranks";
  const int next = (rank_ + 1) % world_;
  const int prev = (rank_ + world_ - 1) % world_;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{19}, Big(dtype)}) {
      Tensor send = Make(RankValues(rank_, n), dtype);
      Tensor recv = MakeEmpty(n, dtype);
      ASSERT_TRUE(Run(comm_->SendRecv(
                          {PeerTransfer::Send(send, next), PeerTransfer::Recv(recv, prev)}))
                      .ok());
      ExpectAll(Floats(recv), n, [&](int64_t i) { return Value(prev, i); }, 0.0f,
                absl::StrCat("ring count ", n, " ", DTypeName(dtype)));
    }
  }
  // Both directions at once, in bf16.
  Tensor to_next = Make(RankValues(rank_, 33), DType::kBF16);
  Tensor to_prev = Make(RankValues(rank_ + 10, 33), DType::kBF16);
  Tensor from_prev = MakeEmpty(33, DType::kBF16);
  Tensor from_next = MakeEmpty(33, DType::kBF16);
  ASSERT_TRUE(Run(comm_->SendRecv({PeerTransfer::Send(to_next, next),
                                   PeerTransfer::Send(to_prev, prev),
                                   PeerTransfer::Recv(from_prev, prev),
                                   PeerTransfer::Recv(from_next, next)}))
                  .ok());
  if (world_ == 2) return;  // prev == next: the two receives match the two sends in order
  ExpectAll(Floats(from_prev), 33, [&](int64_t i) { return Value(prev, i); }, 0.0f,
            "from prev");
  ExpectAll(Floats(from_next), 33, [&](int64_t i) { return Value(next + 10, i); }, 0.0f,
            "from next");
}

TEST_F(MpiCommunicatorTest, StandaloneSendAndRecvInPairs) {
  if (world_ < 2) GTEST_SKIP() << "needs 2 ranks";
  // Pairs (0, 1), (2, 3): the even rank sends first, the odd rank receives first.
  const int peer = rank_ ^ 1;
  if (peer >= world_) return;  // rank 2 of 3 sits out
  const int64_t n = 100003;
  Tensor mine = Make(RankValues(rank_, n));
  Tensor theirs = MakeEmpty(n);
  if (rank_ % 2 == 0) {
    ASSERT_TRUE(Run(comm_->Send(mine, peer)).ok());
    ASSERT_TRUE(Run(comm_->Recv(theirs, peer)).ok());
  } else {
    auto recv = comm_->Recv(theirs, peer);
    auto send = comm_->Send(mine, peer);  // queued behind the receive
    ASSERT_TRUE(recv.ok() && send.ok());
    ASSERT_TRUE((*send)->Wait(kTimeout).ok());
    ASSERT_TRUE((*recv)->IsCompleted().value());
  }
  ExpectAll(Floats(theirs), n, [&](int64_t i) { return Value(peer, i); }, 0.0f, "pair");
}

TEST_F(MpiCommunicatorTest, BarrierAndSequenceNumbers) {
  auto a = comm_->Barrier();
  auto b = comm_->Barrier();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->sequence(), 1u);
  EXPECT_EQ((*b)->sequence(), 2u);
  EXPECT_EQ((*b)->description(), "barrier #2");
  EXPECT_EQ(comm_->last_issued_sequence(), 2u);
  ASSERT_TRUE((*b)->Wait(kTimeout).ok());
  EXPECT_EQ(comm_->last_completed_sequence(), 2u);
  EXPECT_TRUE((*a)->IsCompleted().value());
}

TEST_F(MpiCommunicatorTest, OperationsInFlightCompleteInIssueOrder) {
  const std::vector<int64_t> counts = {1 << 20, 3, 1 << 18, 0, 77777, 1 << 21, 5};
  std::vector<Tensor> tensors;
  std::vector<std::unique_ptr<Work>> works;
  for (size_t k = 0; k < counts.size(); ++k) {
    tensors.push_back(Make(RankValues(rank_ + static_cast<int>(k), counts[k])));
    auto w = comm_->AllReduce(tensors.back());
    ASSERT_TRUE(w.ok());
    works.push_back(std::move(*w));
  }
  Tensor bcast = Make(RankValues(rank_, 1000));
  auto b = comm_->Broadcast(bcast, {0});
  ASSERT_TRUE(b.ok());
  works.push_back(std::move(*b));
  for (size_t k = 0; k < works.size(); ++k) EXPECT_EQ(works[k]->sequence(), k + 1);
  // Poll until all are done; whenever one reads complete, every earlier one must too.
  const absl::Time deadline = absl::Now() + kTimeout;
  size_t done = 0;
  while (done < works.size() && absl::Now() < deadline) {
    for (size_t k = 0; k < works.size(); ++k) {
      auto c = works[k]->IsCompleted();
      ASSERT_TRUE(c.ok()) << c.status();
      if (*c) {
        for (size_t j = 0; j < k; ++j) {
          ASSERT_TRUE(works[j]->IsCompleted().value())
              << works[k]->description() << " finished before " << works[j]->description();
        }
        done = std::max(done, k + 1);
      }
    }
  }
  ASSERT_EQ(done, works.size());
  for (size_t k = 0; k < counts.size(); ++k) {
    // sum over r of Value(r + k, i) = sum over r of Value(r, i) + k * world.
    ExpectAll(Floats(tensors[k]), counts[k],
              [&](int64_t i) { return SumOver(world_, i) + static_cast<float>(k) * world_; },
              0.0f, absl::StrCat("in-flight all_reduce ", k));
  }
  ExpectAll(Floats(bcast), 1000, [&](int64_t i) { return Value(0, i); }, 0.0f, "broadcast");
}

TEST_F(MpiCommunicatorTest, WaitTimeoutNamesRankOperationAndSequence) {
  if (world_ < 2) GTEST_SKIP() << "needs a peer that has not sent yet";
  Tensor t = MakeEmpty(12);
  if (rank_ == 0) {
    ASSERT_TRUE(Run(comm_->Barrier()).ok());  // #1
    auto recv = comm_->Recv(t, 1);             // #2, rank 1 sends only after the check
    ASSERT_TRUE(recv.ok());
    absl::Status s = (*recv)->Wait(absl::Milliseconds(50));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("rank 0: recv #2 (f32 x 12 from rank 1)"), std::string::npos) << s;
    EXPECT_NE(s.message().find("waiting for rank 1 to send"), std::string::npos) << s;
    EXPECT_NE(s.message().find("the communication thread is in recv #2"), std::string::npos)
        << s;
    EXPECT_EQ((*recv)->IsCompleted().value(), false);
    WorldBarrier();
    EXPECT_TRUE((*recv)->Wait(kTimeout).ok());
  } else {
    ASSERT_TRUE(Run(comm_->Barrier()).ok());
    WorldBarrier();
    if (rank_ == 1) {
      ASSERT_TRUE(Run(comm_->Send(Make(RankValues(1, 12)), 0)).ok());
    }
  }
}

// A hang inside a group names the group, the job's rank and the group's own collective and
// sequence number (the group counts from 1 whatever the job's communicator issued).
TEST_F(MpiCommunicatorTest, WaitTimeoutInAGroupNamesTheGroup) {
  if (world_ < 2) GTEST_SKIP() << "needs a peer that has not joined yet";
  ASSERT_TRUE(Run(comm_->Barrier()).ok());  // the job's #1
  const int pair = rank_ / 2;
  std::vector<int> members = {2 * pair};
  if (2 * pair + 1 < world_) members.push_back(2 * pair + 1);
  auto split = comm_->Split(pair, rank_, absl::StrCat("pair ", pair), members);
  ASSERT_TRUE(split.ok()) << split.status();
  Communicator& g = **split;
  Tensor t = Make({1.0f, 2.0f, 3.0f, 4.0f});
  if (rank_ == 0) {
    auto w = g.AllReduce(t);  // rank 1 joins only after the check
    ASSERT_TRUE(w.ok());
    absl::Status s = (*w)->Wait(absl::Milliseconds(50));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("rank 0 (0 of pair 0): all_reduce #1 (f32 x 4, sum)"),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("waiting for all 2 ranks to join it"), std::string::npos) << s;
    WorldBarrier();
    EXPECT_TRUE((*w)->Wait(kTimeout).ok());
  } else {
    WorldBarrier();
    if (rank_ == 1) ASSERT_TRUE(Run(g.AllReduce(t)).ok());
  }
}

// The parts collectives: rank r owns [offsets[r], offsets[r + 1]) of one tensor (uneven and
// empty parts included); after ReduceScatterParts each rank's part holds the sum over ranks,
// after AllGatherParts every rank holds every rank's part.
TEST_F(MpiCommunicatorTest, ReduceScatterAndAllGatherParts) {
  for (int64_t n : {int64_t{1}, int64_t{10}, int64_t{1003}}) {
    std::vector<int64_t> offsets = {0};
    for (int r = 0; r < world_; ++r) {
      // Part r: about n / world elements, rank 1's empty.
      const int64_t end = r == world_ - 1 ? n : std::min(n, (r + 1) * n / world_ + (r == 0));
      offsets.push_back(r == 1 ? offsets.back() : std::max(offsets.back(), end));
    }
    offsets.back() = n;
    Tensor t = Make(RankValues(rank_, n));
    ASSERT_TRUE(Run(comm_->ReduceScatterParts(t, offsets)).ok());
    const std::vector<float> got = Floats(t);
    for (int64_t i = offsets[rank_]; i < offsets[rank_ + 1]; ++i) {
      ASSERT_EQ(got[i], SumOver(world_, i)) << "element " << i << " of " << n;
    }
    // Into `out`: the same sums, and the tensor reduced from left as it was.
    const int64_t mine = offsets[rank_ + 1] - offsets[rank_];
    Tensor from = Make(RankValues(rank_, n));
    Tensor out = Make(std::vector<float>(mine, -1.0f));
    ASSERT_TRUE(Run(comm_->ReduceScatterParts(from, offsets, out)).ok());
    const std::vector<float> sums = Floats(out);
    for (int64_t i = 0; i < mine; ++i) {
      ASSERT_EQ(sums[i], SumOver(world_, offsets[rank_] + i)) << "element " << i << " of out";
    }
    ASSERT_EQ(Floats(from), RankValues(rank_, n));
    Tensor wrong = Make(std::vector<float>(mine + 1, 0.0f));
    ASSERT_FALSE(comm_->ReduceScatterParts(from, offsets, wrong).ok());
    // Each rank's part, written by its owner, reaches everyone.
    Tensor u = Make(std::vector<float>(n, -1.0f));
    {
      std::vector<float> mine = Floats(u);
      for (int64_t i = offsets[rank_]; i < offsets[rank_ + 1]; ++i) mine[i] = 1000.0f * rank_ + i;
      u = Make(mine);
    }
    ASSERT_TRUE(Run(comm_->AllGatherParts(u, offsets)).ok());
    const std::vector<float> all = Floats(u);
    for (int r = 0; r < world_; ++r) {
      for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
        ASSERT_EQ(all[i], 1000.0f * r + i) << "element " << i << " of rank " << r << "'s part";
      }
    }
  }
  // Offsets that do not split the tensor in order are refused, naming them.
  auto bad = comm_->AllGatherParts(Make({1, 2, 3}), std::vector<int64_t>(world_ + 1, 0));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("do not split 3 elements"), std::string::npos)
      << bad.status();
}

// Split: ranks of one color form a group ranked by key; its collectives run among them only,
// with their own sequence numbers, and its messages name the group and the job's rank.
TEST_F(MpiCommunicatorTest, SplitMakesGroupsOfOneColor) {
  const int color = rank_ % 2;
  // Keys reverse the order inside each group: its members are the job's ranks of this parity,
  // last first.
  std::vector<int> members;
  for (int r = world_ - 1; r >= 0; --r) {
    if (r % 2 == color) members.push_back(r);
  }
  auto group =
      comm_->Split(color, world_ - rank_, absl::StrCat("the group of color ", color), members);
  ASSERT_TRUE(group.ok()) << group.status();
  Communicator& g = **group;
  const int size = (world_ + 1 - color) / 2;  // ranks of this parity
  EXPECT_EQ(g.world_size(), size);
  EXPECT_EQ(g.rank(), size - 1 - rank_ / 2);
  EXPECT_EQ(g.name(), absl::StrCat("the group of color ", color));
  EXPECT_EQ(g.last_issued_sequence(), 0u);
  // The sum over the group's job ranks.
  Tensor t = Make({static_cast<float>(rank_)});
  ASSERT_TRUE(Run(g.AllReduce(t)).ok());
  float want = 0;
  for (int r = color; r < world_; r += 2) want += static_cast<float>(r);
  EXPECT_EQ(Floats(t)[0], want);
  EXPECT_EQ(g.last_issued_sequence(), 1u);
  // An argument error names the job's rank and the group.
  auto bad = g.Send(Make({1.0f}), g.world_size());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(absl::StrCat("rank ", rank_, " (", g.rank(),
                                                     " of the group of color ", color, ")")),
            std::string::npos)
      << bad.status();
  // A transfer in the group names its peer by the job's rank.
  if (g.world_size() > 1) {
    const int next = (g.rank() + 1) % g.world_size();
    const int prev = (g.rank() + g.world_size() - 1) % g.world_size();
    Tensor in = MakeEmpty(1);
    auto w = g.SendRecv({PeerTransfer::Send(Make({1.0f}), next), PeerTransfer::Recv(in, prev)});
    ASSERT_TRUE(w.ok()) << w.status();
    const std::string names =
        absl::StrFormat("(to ranks [%d], from ranks [%d])", members[next], members[prev]);
    EXPECT_NE((*w)->description().find(names), std::string::npos) << (*w)->description();
    ASSERT_TRUE(Run(std::move(w)).ok());
  }
  EXPECT_FALSE(comm_->Split(-1, 0, "nothing", {}).ok());
  // Members that are not the ones the split makes are refused, naming both (a group of one
  // is the same either way).
  std::vector<int> ascending(members.rbegin(), members.rend());
  auto wrong = comm_->Split(color, world_ - rank_, "a group in the wrong order", ascending);
  if (ascending.size() > 1) {
    ASSERT_FALSE(wrong.ok());
    const std::string says = absl::StrCat(
        "split of a group in the wrong order: the layout says its members are ranks [",
        absl::StrJoin(ascending, ", "), "], but the split made ranks [",
        absl::StrJoin(members, ", "), "]");
    EXPECT_NE(wrong.status().message().find(says), std::string::npos) << wrong.status();
  } else {
    EXPECT_TRUE(wrong.ok()) << wrong.status();
  }
  // The job's communicator goes on after its groups: the two splits were its operations #1
  // and #2 (the refused colour issued nothing).
  EXPECT_EQ(comm_->last_issued_sequence(), 2u);
  ASSERT_TRUE(Run(comm_->Barrier()).ok());
}

TEST_F(MpiCommunicatorTest, AbortFailsPendingWorkAndRefusesMore) {
  // Rank 0 aborts while its communication thread is inside a receive that rank 1 satisfies
  // only afterwards; the other ranks abort an idle communicator. Rank 1 does not abort.
  if (world_ > 1 && rank_ == 1) {
    WorldBarrier();  // rank 0 has aborted
    ASSERT_TRUE(Run(comm_->Send(Make(RankValues(1, 8)), 0)).ok());
    return;
  }
  Tensor t = MakeEmpty(8);
  std::unique_ptr<Work> pending;
  if (rank_ == 0 && world_ > 1) {
    auto w = comm_->Recv(t, 1);
    ASSERT_TRUE(w.ok());
    pending = std::move(*w);
    // Abort only once the thread is blocked in MPI_Recv.
    for (;;) {
      absl::Status s = pending->Wait(absl::Milliseconds(5));
      ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      if (s.message().find("the communication thread is in recv #1") != std::string::npos) break;
    }
  }
  comm_->Abort("the coordinator aborted the job: rank 3 hung");
  comm_->Abort("a second abort keeps the first reason");
  if (pending) {
    absl::Status s = pending->Wait(absl::Seconds(5));
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("rank 0: recv #1 (f32 x 8 from rank 1) aborted"),
              std::string::npos) << s;
    EXPECT_NE(s.message().find("rank 3 hung"), std::string::npos) << s;
    EXPECT_EQ(pending->IsCompleted().status().code(), absl::StatusCode::kAborted);
  }
  auto refused = comm_->AllReduce(t);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(refused.status().message().find("rank 3 hung"), std::string::npos)
      << refused.status();
  if (world_ > 1) WorldBarrier();
}

// Aborting the job's communicator (what the heartbeat thread does on the coordinator's word)
// aborts the groups split from it: an operation pending in one fails, and they refuse more.
TEST_F(MpiCommunicatorTest, AbortReachesTheGroupsSplitFromIt) {
  std::vector<int> everyone(world_);
  for (int r = 0; r < world_; ++r) everyone[r] = r;
  auto split = comm_->Split(0, rank_, "the data-parallel group of stage 0", everyone);
  ASSERT_TRUE(split.ok()) << split.status();
  Communicator& group = **split;
  Tensor t = MakeEmpty(4);
  // Rank 1 keeps its communicators and later sends what rank 0's pending receive waits for.
  if (world_ > 1 && rank_ == 1) {
    WorldBarrier();  // rank 0 has aborted
    ASSERT_TRUE(Run(group.Send(Make(RankValues(1, 4)), 0)).ok());
    return;
  }
  std::unique_ptr<Work> pending;
  if (rank_ == 0 && world_ > 1) {
    auto w = group.Recv(t, 1);
    ASSERT_TRUE(w.ok());
    pending = std::move(*w);
  }
  comm_->Abort("the coordinator aborted the job: rank 2 hung");
  if (pending) {
    absl::Status s = pending->Wait(absl::Seconds(5));
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("rank 2 hung"), std::string::npos) << s;
  }
  auto refused = group.AllReduce(t);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(refused.status().message().find("the data-parallel group of stage 0"),
            std::string::npos)
      << refused.status();
  if (world_ > 1) WorldBarrier();
}

TEST_F(MpiCommunicatorTest, BadArgumentsAreRefusedWithTheirReason) {
  Tensor t = Make(RankValues(rank_, 4));
  auto bad_root = comm_->Broadcast(t, {world_});
  EXPECT_EQ(bad_root.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_root.status().message().find(absl::StrCat("rank ", rank_, ": broadcast: root")),
            std::string::npos)
      << bad_root.status();
  auto self = comm_->Send(t, rank_);
  EXPECT_EQ(self.status().code(), absl::StatusCode::kInvalidArgument);
  auto gather = comm_->AllGather(MakeEmpty(4 * world_ + 1), t);
  EXPECT_EQ(gather.status().code(), absl::StatusCode::kInvalidArgument);
  auto ints = Tensor::FromInts({1, 2}, Shape{2});
  ASSERT_TRUE(ints.ok());
  auto avg = comm_->AllReduce(*ints, {ReduceOp::kAvg});
  EXPECT_EQ(avg.status().code(), absl::StatusCode::kInvalidArgument) << avg.status();
  auto undefined = comm_->AllReduce(Tensor());
  EXPECT_EQ(undefined.status().code(), absl::StatusCode::kInvalidArgument);
  // Refused calls take no sequence number.
  EXPECT_EQ(comm_->last_issued_sequence(), 0u);
}

TEST_F(MpiCommunicatorTest, MpiErrorsBecomeStatusAndStopLaterOperations) {
  if (world_ < 2) GTEST_SKIP() << "needs a sender";
  if (rank_ > 1) return;
  if (rank_ == 1) {
    ASSERT_TRUE(Run(comm_->Send(Make(RankValues(1, 10)), 0)).ok());
    return;
  }
  Tensor small = MakeEmpty(4);  // 10 elements arrive: MPI reports truncation
  absl::Status s = Run(comm_->Recv(small, 1));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 0: recv #1 (f32 x 4 from rank 1) failed"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("MPI_Recv"), std::string::npos) << s;
  EXPECT_NE(s.message().find("truncat"), std::string::npos) << s;
  absl::Status later = Run(comm_->Barrier());
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  EXPECT_NE(later.message().find("barrier #2 not run: operation #1 failed"), std::string::npos)
      << later;
}

// Every rank of this host has a doorbell, and its shared memory is gone from /dev/shm once
// made (nothing is left behind, even by a job that dies).
TEST(DoorbellsTest, EveryRankOnThisHostHasABellAndNothingIsLeftInDevShm) {
  std::unique_ptr<Doorbells> bells = Doorbells::Create(MPI_COMM_WORLD);
  ASSERT_NE(bells, nullptr);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int r = 0; r < world; ++r) EXPECT_TRUE(bells->Reaches(r)) << "rank " << r;
  EXPECT_FALSE(bells->Reaches(world));
  EXPECT_FALSE(bells->Reaches(-1));
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_EQ(e.path().filename().string().rfind("tandem-doorbells-", 0), std::string::npos)
        << e.path();
  }
}

// All or none: one rank without doorbells (TANDEM_MPI_DOORBELLS=off there) leaves every
// rank without, so that no wait sleeps on a bell a peer never rings.
TEST(DoorbellsTest, OneRankWithoutLeavesEveryRankWithout) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_EQ(Doorbells::Create(MPI_COMM_WORLD, /*enabled=*/rank != 0), nullptr);
}

// Rank r rings rank r + 1 (around the ring) a little after every rank took its count: each
// wait ends on the ring, long before its timeout, and sees the count moved.
TEST(DoorbellsTest, ARingFromAnotherProcessEndsTheWait) {
  std::unique_ptr<Doorbells> bells = Doorbells::Create(MPI_COMM_WORLD);
  ASSERT_NE(bells, nullptr);
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const uint32_t seen = bells->Count();
  MPI_Barrier(MPI_COMM_WORLD);
  std::thread ringer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    bells->Ring((rank + 1) % world);
  });
  const absl::Time start = absl::Now();
  while (bells->Count() == seen && absl::Now() - start < kTimeout) {
    bells->Wait(seen, std::chrono::seconds(60));
  }
  const absl::Duration waited = absl::Now() - start;
  ringer.join();
  EXPECT_NE(bells->Count(), seen);
  EXPECT_LT(waited, absl::Seconds(30)) << "the wait ended on its timeout, not on the ring";
  MPI_Barrier(MPI_COMM_WORLD);
}

// Prints only failed assertions, prefixed with the rank (for ranks other than 0).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.message());
    }
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::Status s = tandem::InitMpi(&argc, &argv);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  int provided = 0, rank = 0;
  MPI_Query_thread(&provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::testing::InitGoogleTest(&argc, argv);
  if (provided < MPI_THREAD_MULTIPLE) {
    // The tests call MPI_Barrier on the main thread while communication threads run.
    std::fprintf(stderr, "these tests need MPI_THREAD_MULTIPLE\n");
    return 1;
  }
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new tandem::RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = failed;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  s = tandem::FinalizeMpi();
  if (!s.ok()) std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
  if (rank == 0 && any_failed) std::fprintf(stderr, "FAILED on at least one rank\n");
  return any_failed;
}
