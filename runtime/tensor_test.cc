#include "runtime/tensor.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ShapeTest, Basics) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.dim(-1), 4);
  EXPECT_EQ(s.ToString(), "[2, 3, 4]");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ((Shape{3, 0}).numel(), 0);
}

TEST(DeviceTest, ParseAndPrint) {
  EXPECT_EQ(ParseDevice("cpu")->ToString(), "cpu");
  EXPECT_EQ(*ParseDevice("cuda"), Device::Cuda(0));
  EXPECT_EQ(ParseDevice("cuda:3")->ToString(), "cuda:3");
  EXPECT_FALSE(ParseDevice("gpu").ok());
  EXPECT_FALSE(ParseDevice("cuda:-1").ok());
}

TEST(TensorTest, EmptyHasShapeDtypeDevice) {
  Tensor t = *Tensor::Empty({2, 3}, DType::kBF16, Device::Cpu());
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.bytes(), 12u);
  EXPECT_EQ(t.ToString(), "bf16[2, 3] on cpu");
  EXPECT_FALSE(Tensor().defined());
}

TEST(TensorTest, NegativeExtentIsRefused) {
  auto r = Tensor::Empty(Shape{2, -1}, DType::kF32, Device::Cpu());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("[2, -1]"), std::string::npos);
}

TEST(TensorTest, ZeroSizedTensorsWork) {
  Tensor t = *Tensor::Empty({0, 5}, DType::kF32, Device::Cpu());
  EXPECT_EQ(t.numel(), 0);
  Tensor u = *Tensor::Empty({0, 5}, DType::kF32, Device::Cpu());
  EXPECT_TRUE(CopySync(u, t).ok());
  EXPECT_TRUE(t.ToFloatVector()->empty());
}

TEST(TensorTest, FromVectorConvertsDtypes) {
  std::vector<float> v = {1.0f, -2.5f, 0.1f};
  EXPECT_EQ(*Tensor::FromVector(v, {3})->ToFloatVector(), v);
  std::vector<float> bf = *Tensor::FromVector(v, {3}, Device::Cpu(), DType::kBF16)->ToFloatVector();
  EXPECT_EQ(bf[1], -2.5f);
  EXPECT_NEAR(bf[2], 0.1f, 1e-3);
  std::vector<float> h = *Tensor::FromVector(v, {3}, Device::Cpu(), DType::kF16)->ToFloatVector();
  EXPECT_NEAR(h[2], 0.1f, 1e-4);
  auto wrong = Tensor::FromVector(v, {2, 2});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("3 values for shape [2, 2]"), std::string::npos);
}

TEST(TensorTest, ViewsShareStorage) {
  Tensor flat = *Tensor::FromVector({0, 1, 2, 3, 4, 5, 6, 7}, {8});
  Tensor w = *flat.View(2, {2, 2});
  EXPECT_EQ(*w.ToFloatVector(), (std::vector<float>{2, 3, 4, 5}));
  w.data<float>()[0] = 42;
  EXPECT_EQ(flat.data<float>()[2], 42);
  EXPECT_EQ(w.storage(), flat.storage());
  auto out = flat.View(6, {3});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("[6, 9)"), std::string::npos);
}

TEST(TensorTest, ReshapeChecksElementCount) {
  Tensor t = *Tensor::Empty({2, 6}, DType::kF32, Device::Cpu());
  EXPECT_EQ(t.Reshape({3, 4})->shape(), (Shape{3, 4}));
  auto bad = t.Reshape({5});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("[2, 6] has 12 elements, [5] has 5"), std::string::npos);
}

TEST(TensorTest, StorageGoesBackToTheAllocator) {
  Allocator* cpu = *GetAllocator(Device::Cpu());
  const int64_t before = cpu->stats().allocated_bytes;
  {
    Tensor t = *Tensor::Empty({1024}, DType::kF32, Device::Cpu());
    Tensor v = *t.View(10, {10});
    EXPECT_EQ(cpu->stats().allocated_bytes, before + 4096);
  }
  EXPECT_EQ(cpu->stats().allocated_bytes, before);
}

TEST(TensorTest, HostCopyAndPinnedMemory) {
  Tensor src = *Tensor::FromVector({1, 2, 3, 4}, {4});
  Tensor pinned = *Tensor::Empty({2, 2}, DType::kF32, Device::Cpu(), HostMemoryKind::kPinned);
  ASSERT_TRUE(CopySync(pinned, src).ok());
  EXPECT_EQ(*pinned.ToFloatVector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(pinned.storage()->allocator(), GetPinnedHostAllocator());
}

TEST(TensorTest, CopyMismatchNamesBothTensors) {
  Tensor a = *Tensor::Empty({2, 3}, DType::kF32, Device::Cpu());
  Tensor b = *Tensor::Empty({3, 3}, DType::kF32, Device::Cpu());
  Tensor c = *Tensor::Empty({2, 3}, DType::kF16, Device::Cpu());
  absl::Status s = CopySync(a, b);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("f32[2, 3] on cpu"), std::string::npos) << s;
  EXPECT_NE(s.message().find("f32[3, 3] on cpu"), std::string::npos) << s;
  EXPECT_FALSE(CopySync(a, c).ok());
}

TEST(TensorTest, ArgumentChecksNameOpAndShapes) {
  Tensor a = *Tensor::Empty({2, 3}, DType::kF32, Device::Cpu());
  absl::Status s = CheckShape("matmul", "b", a, Shape{3, 4});
  EXPECT_EQ(s.message(), "matmul: b has shape [2, 3], expected [3, 4]");
  s = CheckDType("embedding", "tokens", a, DType::kI32);
  EXPECT_EQ(s.message(), "embedding: tokens is f32, expected i32");
}

// Events time the work queued between them on the stream, as cudaEventElapsedTime does, in
// either CPU stream mode: the host need not wait for the work to be queued behind it.
TEST(StreamTest, CpuEventsTimeTheStreamsWork) {
  auto stream = *Stream::Create(Device::Cpu());
  auto start = *Event::Create(Device::Cpu());
  auto stop = *Event::Create(Device::Cpu());
  EXPECT_FALSE(stop->ElapsedMsSince(*start).ok());  // never recorded
  ASSERT_TRUE(start->Record(*stream).ok());
  ASSERT_TRUE(stream
                  ->Launch([] {
                    volatile double x = 0;
                    for (int i = 0; i < 1000000; ++i) x = x + i;
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(stop->Record(*stream).ok());
  ASSERT_TRUE(stop->Synchronize().ok());
  EXPECT_TRUE(*stop->Query());
  EXPECT_TRUE(stop->MakeStreamWait(*stream).ok());
  EXPECT_GT(*stop->ElapsedMsSince(*start), 0.0f);
  EXPECT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(*Stream::Compute(Device::Cpu()), *Stream::Compute(Device::Cpu()));
}

}  // namespace
}  // namespace tandem
