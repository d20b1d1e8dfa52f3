// The instruction-set variants of the CPU ops (ops.h, "CPU instruction sets"): the widest one
// the CPU runs is the default, and every variant gives the base variant's bits for every op.
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/ops.h"
#include "runtime/status_testing.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace tandem {
namespace ops {
namespace {

// Declared first: gtest runs a file's tests in order, and later tests change the variant.
TEST(CpuIsaTest, TheWidestVariantIsTheDefault) {
  EXPECT_EQ(CpuIsaInUse(), BestCpuIsa());
  std::printf("this CPU runs the %s variant\n", CpuIsaName(BestCpuIsa()));
}

TEST(CpuIsaTest, RefusesAWiderVariantThanTheCpuRuns) {
  ASSERT_OK(UseCpuIsa(CpuIsa::kBase));
  EXPECT_EQ(CpuIsaInUse(), CpuIsa::kBase);
  ASSERT_OK(UseCpuIsa(BestCpuIsa()));
  EXPECT_EQ(CpuIsaInUse(), BestCpuIsa());
  if (BestCpuIsa() == CpuIsa::kAvx512) GTEST_SKIP() << "this CPU runs every variant";
  const absl::Status st = UseCpuIsa(CpuIsa::kAvx512);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("avx512"), std::string::npos) << st;
  EXPECT_EQ(CpuIsaInUse(), BestCpuIsa());  // unchanged
}

// Every op once, on odd sizes (vector bodies and their scalar tails), from inputs drawn from a
// fixed seed; returns each output's name and bytes.
class EveryOp {
 public:
  using Outputs = std::vector<std::pair<std::string, std::vector<char>>>;

  Outputs Run() {
    gen_.seed(20261130);
    outputs_.clear();
    Stream& s = *Stream::Compute(Device::Cpu()).value();
    const int64_t n = 5, c = 131, oc = 67;  // 131 = 8 * 16 + 3: every vector width has a tail
    const Tensor x = Rand({n, c}), y = Rand({n, c}), dout = Rand({n, c});
    const Tensor w = Rand({oc, c}), bias = Rand({oc}), gamma = Rand({c}), beta = Rand({c});

    Tensor out = Zeros({n, oc}), pre = Zeros({n, oc});
    Check(Matmul(s, out, x, w, false, true, 0.5f, 0.0f), "Matmul", out);
    Check(LinearForward(s, out, x, w, bias), "LinearForward", out);
    Check(LinearGeluForward(s, out, pre, x, w, bias), "LinearGeluForward", out);
    Tensor dinp = Zeros({n, c}), dw = Rand({oc, c}), db = Rand({oc});
    Check(LinearBackward(s, dinp, dw, db, Rand({n, oc}), x, w), "LinearBackward", dinp, dw, db);

    Tensor o = Zeros({n, c}), p = Zeros({n, c});
    Check(GeluForward(s, o, Rand({n, c}, -6.0f, 6.0f)), "GeluForward", o);
    Check(GeluBackward(s, o, Rand({n, c}, -6.0f, 6.0f), dout), "GeluBackward", o);
    Check(BiasGeluForward(s, o, p, x, gamma), "BiasGeluForward", o, p);
    Check(ReluForward(s, o, x), "ReluForward", o);
    Check(ReluBackward(s, o, x, dout), "ReluBackward", o);
    Tensor acc = Rand({n, c});
    Check(BiasAdd(s, acc, gamma), "BiasAdd", acc);
    Check(Add(s, o, x, y), "Add", o);
    Check(Axpy(s, acc, 0.3f, x), "Axpy", acc);
    Check(Scale(s, acc, 1.7f), "Scale", acc);
    Check(Fill(s, o, 0.25f), "Fill", o);
    for (DType low : {DType::kBF16, DType::kF16}) {
      Tensor l = Tensor::Empty({n, c}, low, Device::Cpu()).value();
      Check(Cast(s, l, x), "Cast to 16 bits", l);
      Check(Cast(s, o, l), "Cast from 16 bits", o);
    }

    Tensor mean = Zeros({n}), rstd = Zeros({n});
    Check(LayerNormForward(s, o, mean, rstd, x, gamma, beta), "LayerNormForward", o, mean, rstd);
    Tensor dgamma = Rand({c}), dbeta = Rand({c});
    Check(LayerNormBackward(s, dinp, dgamma, dbeta, dout, x, gamma, mean, rstd),
          "LayerNormBackward", dinp, dgamma, dbeta);
    Check(ResidualLayerNormForward(s, p, o, mean, rstd, x, y, gamma, beta),
          "ResidualLayerNormForward", p, o, mean, rstd);
    Tensor sm = Zeros({n, c});
    Check(SoftmaxForward(s, sm, Rand({n, c}, -30.0f, 30.0f)), "SoftmaxForward", sm);
    Check(SoftmaxBackward(s, o, sm, dout), "SoftmaxBackward", o);

    const int64_t b = 2, t = 37, ac = 48, nh = 2;
    const Tensor qkv = Rand({b, t, 3 * ac}, -2.0f, 2.0f);
    Tensor att_out = Zeros({b, t, ac}), att = Zeros({b, nh, t, t}), dqkv = Zeros({b, t, 3 * ac});
    Check(AttentionForward(s, att_out, att, qkv, nh), "AttentionForward", att_out, att);
    Check(AttentionBackward(s, dqkv, Rand({b, t, ac}), qkv, att, nh), "AttentionBackward", dqkv);
    Tensor lse = Zeros({b, nh, t});
    Check(FlashAttentionForward(s, att_out, lse, qkv, nh), "FlashAttentionForward", att_out, lse);
    Check(FlashAttentionBackward(s, dqkv, Rand({b, t, ac}), qkv, att_out, lse, nh),
          "FlashAttentionBackward", dqkv);

    const int64_t v = 259;
    std::vector<int32_t> ids(b * t);
    for (int32_t& id : ids) id = static_cast<int32_t>(gen_() % v);
    const Tensor tokens = Tensor::FromInts(ids, {b, t}).value();
    const Tensor wte = Rand({v, ac}), wpe = Rand({t + 3, ac});
    Check(EmbeddingForward(s, att_out, tokens, wte, wpe), "EmbeddingForward", att_out);
    Tensor dwte = Rand({v, ac}), dwpe = Rand({t + 3, ac});
    Check(EmbeddingBackward(s, dwte, dwpe, Rand({b, t, ac}), tokens), "EmbeddingBackward", dwte,
          dwpe);
    Tensor losses = Zeros({b * t}), dlogits = Zeros({b * t, v});
    ids[3] = -1;  // an ignored target
    const Tensor targets = Tensor::FromInts(ids, {b * t}).value();
    Check(SoftmaxCrossEntropy(s, losses, dlogits, Rand({b * t, v}, -8.0f, 8.0f), targets, 0.1f),
          "SoftmaxCrossEntropy", losses, dlogits);

    Tensor total = Zeros({1});
    Check(Sum(s, total, x), "Sum", total);
    Check(SumSquaresAccumulate(s, total, y), "SumSquaresAccumulate", total);

    const int64_t count = 4099;  // two optimizer chunks and a tail
    for (DType low : {DType::kBF16, DType::kF16}) {
      Tensor params = Rand({count}), grads = Rand({count}), m = Rand({count}),
             v2 = Rand({count}, 0.0f, 1.0f), momentum = Rand({count});
      Tensor params_low = Tensor::Empty({count}, low, Device::Cpu()).value();
      AdamWConfig adamw;
      adamw.weight_decay = 0.1f;
      adamw.step = 3;
      adamw.grad_scale = 0.5f;
      Check(AdamWUpdate(s, params, grads, m, v2, adamw, params_low), "AdamWUpdate", params, m, v2,
            params_low);
      SgdConfig sgd;
      sgd.weight_decay = 0.01f;
      Check(SgdMomentumUpdate(s, params, grads, momentum, sgd, params_low), "SgdMomentumUpdate",
            params, momentum, params_low);
    }
    return outputs_;
  }

 private:
  Tensor Rand(const Shape& shape, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> values(shape.numel());
    for (float& value : values) value = u(gen_);
    return Tensor::FromVector(values, shape).value();
  }
  static Tensor Zeros(const Shape& shape) {
    return Tensor::FromVector(std::vector<float>(shape.numel(), 0.0f), shape).value();
  }

  template <typename... T>
  void Check(const absl::Status& st, const std::string& op, const T&... results) {
    EXPECT_TRUE(st.ok()) << op << ": " << st;
    // The op may still be queued on the stream's thread: read its outputs once it has run.
    EXPECT_TRUE(Stream::Compute(Device::Cpu()).value()->Synchronize().ok()) << op;
    int i = 0;
    for (const Tensor* r : {&results...}) {
      const char* bytes = static_cast<const char*>(r->raw());
      outputs_.push_back({op + " output " + std::to_string(i++),
                          std::vector<char>(bytes, bytes + r->bytes())});
    }
  }

  std::mt19937 gen_;
  Outputs outputs_;
};

TEST(CpuIsaTest, EveryVariantGivesTheBaseVariantsBits) {
  if (BestCpuIsa() == CpuIsa::kBase) GTEST_SKIP() << "this CPU runs the base variant only";
  EveryOp ops;
  ASSERT_OK(UseCpuIsa(CpuIsa::kBase));
  const EveryOp::Outputs want = ops.Run();
  ASSERT_GT(want.size(), 40u);
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) > static_cast<int>(BestCpuIsa())) continue;
    ASSERT_OK(UseCpuIsa(isa));
    const EveryOp::Outputs got = ops.Run();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); i++) {
      ASSERT_EQ(got[i].first, want[i].first);
      EXPECT_TRUE(got[i].second == want[i].second)
          << CpuIsaName(isa) << " differs from base in " << want[i].first;
    }
  }
  ASSERT_OK(UseCpuIsa(BestCpuIsa()));
}

}  // namespace
}  // namespace ops
}  // namespace tandem
