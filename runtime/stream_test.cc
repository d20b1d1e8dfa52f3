// CPU streams and events against CUDA's semantics: work queued returns at once and runs in
// order on the stream's thread, events order one stream after another without the host
// waiting, errors are the stream's, and time comes from the stream's own clock.
#include "runtime/stream.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "runtime/host_sync.h"
#include "runtime/ops.h"
#include "runtime/status_testing.h"
#include "runtime/timeline.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Work that takes `ms` milliseconds of the stream's thread, and says how long it took by its
// own clock.
std::function<absl::Status()> Slow(double ms, double* took_ms = nullptr) {
  return [ms, took_ms] {
    const auto start = Clock::now();
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
    if (took_ms != nullptr) *took_ms = MsSince(start);
    return absl::OkStatus();
  };
}

TEST(CpuStreamTest, WorkIsQueuedAndRunsInOrderOnTheStreamsThread) {
  auto s = Stream::CreateCpu(CpuStreamMode::kAsync);
  EXPECT_TRUE(s->async());
  std::vector<int> order;
  std::thread::id ran_on;
  const auto start = Clock::now();
  ASSERT_OK(s->Launch(Slow(40)));
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(s->Launch([&order, &ran_on, i] {
      order.push_back(i);
      ran_on = std::this_thread::get_id();
      return absl::OkStatus();
    }));
  }
  EXPECT_LT(MsSince(start), 20) << "the host waited for queued work";
  EXPECT_TRUE(order.empty());
  ASSERT_OK(s->Synchronize());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(CpuStreamTest, ImmediateStreamsRunWorkWhenIssued) {
  auto s = Stream::CreateCpu(CpuStreamMode::kImmediate);
  EXPECT_FALSE(s->async());
  bool ran = false;
  ASSERT_OK(s->Launch([&ran] {
    ran = true;
    return absl::OkStatus();
  }));
  EXPECT_TRUE(ran);
  auto e = *Event::Create(Device::Cpu());
  ASSERT_OK(e->Record(*s));
  EXPECT_TRUE(*e->Query());
}

// cudaStreamWaitEvent: the second stream's later work runs after the first's recorded work,
// and the host goes on at once.
TEST(CpuStreamTest, MakeStreamWaitOrdersAnotherStreamWithoutTheHost) {
  auto a = Stream::CreateCpu(CpuStreamMode::kAsync);
  auto b = Stream::CreateCpu(CpuStreamMode::kAsync);
  std::atomic<int> value{0};
  int seen = -1;
  ASSERT_OK(a->Launch(Slow(40)));
  ASSERT_OK(a->Launch([&value] {
    value = 1;
    return absl::OkStatus();
  }));
  auto written = *Event::Create(Device::Cpu(), /*timing=*/false);
  ASSERT_OK(written->Record(*a));
  const auto start = Clock::now();
  ASSERT_OK(written->MakeStreamWait(*b));
  ASSERT_OK(b->Launch([&value, &seen] {
    seen = value.load();
    return absl::OkStatus();
  }));
  EXPECT_LT(MsSince(start), 20) << "the host waited";
  EXPECT_FALSE(*written->Query());
  ASSERT_OK(b->Synchronize());
  EXPECT_EQ(seen, 1);
  EXPECT_TRUE(*written->Query());
}

// cudaEventSynchronize and cudaEventQuery: the host waits for the recorded work only; an
// event never recorded is complete.
TEST(CpuStreamTest, EventSynchronizeAndQuery) {
  auto s = Stream::CreateCpu(CpuStreamMode::kAsync);
  auto never = *Event::Create(Device::Cpu());
  EXPECT_TRUE(*never->Query());
  ASSERT_OK(never->Synchronize());
  auto e = *Event::Create(Device::Cpu());
  ASSERT_OK(s->Launch(Slow(30)));
  ASSERT_OK(e->Record(*s));
  ASSERT_OK(s->Launch(Slow(200)));  // after the event: not waited for
  EXPECT_FALSE(*e->Query());
  const auto start = Clock::now();
  ASSERT_OK(e->Synchronize());
  EXPECT_TRUE(*e->Query());
  EXPECT_LT(MsSince(start), 150) << "the event waited for work recorded after it";
  ASSERT_OK(s->Synchronize());
}

// The event timing test: a deliberately slow op on an asynchronous stream takes next to no
// host time to issue, and the time between events around it is the op's own time.
TEST(CpuStreamTest, EventsTimeTheOpNotItsIssue) {
  auto s = Stream::CreateCpu(CpuStreamMode::kAsync);
  auto start = *Event::Create(Device::Cpu()), end = *Event::Create(Device::Cpu());
  double op_ms = 0;
  const auto host = Clock::now();
  ASSERT_OK(start->Record(*s));
  ASSERT_OK(s->Launch(Slow(50, &op_ms)));
  ASSERT_OK(end->Record(*s));
  const double host_ms = MsSince(host);
  // Not complete yet: no elapsed time to read.
  EXPECT_FALSE(end->ElapsedMsSince(*start).ok());
  ASSERT_OK(end->Synchronize());
  const float event_ms = *end->ElapsedMsSince(*start);
  EXPECT_LT(host_ms, 5) << "issuing waited for the op";
  EXPECT_GE(op_ms, 50);
  EXPECT_NEAR(event_ms, op_ms, 1.0);
  // On the trace's clock, where the stream's thread reached each event.
  EXPECT_NEAR(*end->MicrosSinceOrigin() - *start->MicrosSinceOrigin(), event_ms * 1e3, 1.0);
}

// A timeline of phases on the compute stream, as training steps are timed: each phase is the
// stream's time between two marks.
TEST(CpuStreamTest, TimelinePhasesAreTheStreamsTime) {
  auto s = Stream::CreateCpu(CpuStreamMode::kAsync);
  auto timeline = *StreamTimeline::Start(*s);
  double a_ms = 0, b_ms = 0;
  ASSERT_OK(s->Launch(Slow(20, &a_ms)));
  ASSERT_OK(timeline.Mark(0, "first"));
  ASSERT_OK(s->Launch(Slow(40, &b_ms)));
  ASSERT_OK(timeline.Mark(1, "second", 3));
  EXPECT_FALSE(*timeline.Complete());
  ASSERT_OK(s->Synchronize());
  EXPECT_TRUE(*timeline.Complete());
  const auto phases = *timeline.Phases();
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_EQ(phases[1].name, "second");
  EXPECT_EQ(phases[1].kind, 1);
  EXPECT_EQ(phases[1].micro_batch, 3);
  EXPECT_NEAR(phases[0].seconds * 1e3, a_ms, 1.0);
  EXPECT_NEAR(phases[1].seconds * 1e3, b_ms, 1.0);
  EXPECT_NEAR(phases[1].start_us, phases[0].start_us + phases[0].seconds * 1e6, 1.0);
}

// As on CUDA, an error found while work runs is the stream's: the next launch or
// synchronization returns it, once, and the work the host queued before it heard of it is
// skipped; later work runs again.
TEST(CpuStreamTest, AnErrorIsReportedOnceAndSkipsTheWorkQueuedMeanwhile) {
  auto s = Stream::CreateCpu(CpuStreamMode::kAsync);
  bool skipped_ran = false, later_ran = false;
  ASSERT_OK(s->Launch(Slow(20)));
  ASSERT_OK(s->Launch([] { return absl::InvalidArgumentError("token id 9 is outside [0, 5)"); }));
  ASSERT_OK(s->Launch([&skipped_ran] {
    skipped_ran = true;
    return absl::OkStatus();
  }));
  const absl::Status st = s->Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("token id 9"), std::string::npos) << st;
  EXPECT_FALSE(skipped_ran);
  ASSERT_OK(s->Synchronize());  // told once
  ASSERT_OK(s->Launch([&later_ran] {
    later_ran = true;
    return absl::OkStatus();
  }));
  ASSERT_OK(s->Synchronize());
  EXPECT_TRUE(later_ran);
  // Reported by the next launch too, which then queues nothing.
  ASSERT_OK(s->Launch([] { return absl::InternalError("a kernel failed"); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  bool refused_ran = false;
  EXPECT_EQ(s->Launch([&refused_ran] {
                refused_ran = true;
                return absl::OkStatus();
              }).code(),
            absl::StatusCode::kInternal);
  ASSERT_OK(s->Synchronize());
  EXPECT_FALSE(refused_ran);
}

TEST(CpuStreamTest, ADestroyedStreamFinishesItsWork) {
  bool ran = false;
  {
    auto s = Stream::CreateCpu(CpuStreamMode::kAsync);
    ASSERT_OK(s->Launch(Slow(20)));
    ASSERT_OK(s->Launch([&ran] {
      ran = true;
      return absl::OkStatus();
    }));
  }
  EXPECT_TRUE(ran);
}

TEST(CpuStreamTest, TheComputeStreamFollowsTheDefaultMode) {
  Stream* s = *Stream::Compute(Device::Cpu());
  EXPECT_EQ(s->async(), DefaultCpuStreamMode() == CpuStreamMode::kAsync);
  EXPECT_EQ(*Stream::Compute(Device::Cpu()), s);
}

// Reading a tensor on the host waits for the work queued on it.
TEST(CpuStreamTest, ReadingATensorSynchronizes) {
  Stream& s = **Stream::Compute(Device::Cpu());
  Tensor x = *Tensor::FromVector(std::vector<float>(4096, 1.0f), {4096});
  ASSERT_OK(s.Launch(Slow(30)));
  for (int i = 0; i < 10; ++i) ASSERT_OK(ops::Scale(s, x, 2.0f));
  const int64_t before = HostSync::Count();
  const std::vector<float> v = *x.ToFloatVector();
  EXPECT_EQ(v[0], 1024.0f);
  EXPECT_EQ(v[4095], 1024.0f);
  EXPECT_EQ(HostSync::Count() - before, 1);
}

// Host synchronizations are counted on host threads, not on a stream's; with debugging on,
// one outside an expected read says where it came from.
TEST(HostSyncTest, CountedOnTheHostAndReportedWhenUnexpected) {
  auto s = Stream::CreateCpu(CpuStreamMode::kAsync);
  auto other = Stream::CreateCpu(CpuStreamMode::kAsync);
  const int64_t before = HostSync::Count();
  // A wait on a stream's own thread is the device's ordering.
  ASSERT_OK(s->Launch([&other] { return other->Synchronize(); }));
  ASSERT_OK(s->Synchronize());
  EXPECT_EQ(HostSync::Count() - before, 1);
  HostSync::SetDebug(true);
  ::testing::internal::CaptureStderr();
  {
    ExpectedHostSync reading;
    ASSERT_OK(s->Synchronize());
  }
  const std::string quiet = ::testing::internal::GetCapturedStderr();
  ::testing::internal::CaptureStderr();
  ASSERT_OK(s->Synchronize());
  const std::string loud = ::testing::internal::GetCapturedStderr();
  HostSync::SetDebug(false);
  EXPECT_EQ(HostSync::Count() - before, 3);
  EXPECT_EQ(quiet, "");
  EXPECT_NE(loud.find("host sync #"), std::string::npos) << loud;
  EXPECT_NE(loud.find("Stream::Synchronize"), std::string::npos) << loud;
  // The stack names the caller.
  EXPECT_NE(loud.find("CountedOnTheHostAndReportedWhenUnexpected"), std::string::npos) << loud;
}

}  // namespace
}  // namespace tandem
