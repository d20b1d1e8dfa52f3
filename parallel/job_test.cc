#include "parallel/job.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(JobTest, TextRoundTrip) {
  JobConfig c;
  c.strategy = "pipeline";
  c.workers = 3;
  c.model = "mlp";
  c.d_model = 48;
  c.lr = 0.125;
  c.overlap = false;
  c.data = "/tmp/x y=z.txt";
  c.seed = 99;
  auto back = JobConfig::FromText(c.ToText());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToText(), c.ToText());
  EXPECT_EQ(back->data, "/tmp/x y=z.txt");
  EXPECT_EQ(back->lr, 0.125);
  EXPECT_FALSE(back->overlap);
}

// --tie-embeddings travels in the job's text to the model every worker builds; gpt2-small is
// tied whatever the flag says.
TEST(JobTest, TiedEmbeddings) {
  JobConfig c;
  EXPECT_FALSE(c.Model()->tie_embeddings);
  c.tie_embeddings = true;
  auto back = JobConfig::FromText(c.ToText());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->tie_embeddings);
  EXPECT_TRUE(back->Model()->tie_embeddings);
  EXPECT_NE(back->Model()->ToString().find(", tied"), std::string::npos);
  JobConfig small;
  small.model = "gpt2-small";
  EXPECT_TRUE(small.Model()->tie_embeddings);
  EXPECT_EQ(small.Model()->num_params(), 124475904);
}

TEST(JobTest, BadTextIsRefused) {
  EXPECT_FALSE(JobConfig::FromText("steps=ten\n").ok());
  EXPECT_FALSE(JobConfig::FromText("colour=blue\n").ok());
  EXPECT_FALSE(JobConfig::FromText("no equals sign\n").ok());
}

TEST(JobTest, PipelineMicroBatchDefault) {
  JobConfig c;
  c.strategy = "pipeline";
  c.workers = 2;
  c.batch = 16;
  EXPECT_EQ(c.EffectiveMicroBatches(), 8);  // 4 x 2 stages
  c.batch = 12;
  EXPECT_EQ(c.EffectiveMicroBatches(), 6);  // the largest count <= 8 dividing 12
  c.batch = 7;
  EXPECT_EQ(c.EffectiveMicroBatches(), 7);
  c.strategy = "data";
  EXPECT_EQ(c.EffectiveMicroBatches(), 1);
  c.micro_batches = 3;
  EXPECT_EQ(c.EffectiveMicroBatches(), 3);
}

TEST(JobTest, HybridGridAndMicroBatches) {
  JobConfig c;
  c.strategy = "pipeline";
  c.workers = 6;
  c.data_parallel = 2;
  c.batch = 16;
  const ProcessGrid g = c.Grid();
  EXPECT_EQ(g.replicas, 2);
  EXPECT_EQ(g.stages, 3);
  EXPECT_TRUE(g.hybrid());
  // Megatron's order: a stage's replicas on neighbouring ranks.
  EXPECT_EQ(g.Places(),
            "rank (replica, stage): 0 (0, 0), 1 (1, 0), 2 (0, 1), 3 (1, 1), 4 (0, 2), 5 (1, 2)");
  EXPECT_EQ(g.Place(3), "(replica 1, stage 1)");
  // Each replica's 8 samples in up to 4 x 3 micro-batches: 8 of one sample.
  EXPECT_EQ(c.EffectiveMicroBatches(), 8);
  c.batch = 48;  // 24 each: 12 micro-batches of 2
  EXPECT_EQ(c.EffectiveMicroBatches(), 12);
  c.strategy = "data";  // data parallelism is one stage, whatever --data-parallel says
  EXPECT_EQ(c.Grid().replicas, 6);
  EXPECT_EQ(c.Grid().stages, 1);
  c.strategy = "pipeline";
  c.data_parallel = 4;  // does not divide 6: refused by validation, one replica meanwhile
  EXPECT_EQ(c.Grid().replicas, 1);
  EXPECT_EQ(c.Grid().stages, 6);
  c.data_parallel = 2;
  c.zero = 1;
  const absl::StatusOr<JobConfig> back = JobConfig::FromText(c.ToText());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data_parallel, 2);
  EXPECT_EQ(back->zero, 1);
  const absl::StatusOr<ParallelConfig> p = c.ToParallelConfig(Device::Cpu());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->data_parallel, 2);
  EXPECT_EQ(p->zero, 1);
  EXPECT_EQ(p->train.micro_batches, 12);
}

TEST(JobTest, ToParallelConfig) {
  JobConfig c;
  c.strategy = "model";
  c.workers = 2;
  c.steps = 7;
  c.bucket_mb = 1;
  auto p = c.ToParallelConfig(Device::Cpu());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->strategy, StrategyKind::kModel);
  EXPECT_EQ(p->train.optimizer.total_steps, 7);
  EXPECT_EQ(p->bucket_bytes, 1 << 20);
  EXPECT_TRUE(ResolveLayout(*p, 2).ok());
  c.strategy = "tensor";
  EXPECT_FALSE(c.ToParallelConfig(Device::Cpu()).ok());
}

// The validation settings travel to the workers; a data vocabulary is padded for the model
// and kept beside it, for the head's mask.
TEST(JobTest, ValidationAndVocabularyReachTheTrainer) {
  JobConfig c;
  c.val_fraction = 0.25;
  c.eval_every = 7;
  c.eval_batches = 3;
  c.vocab = 50257;
  auto back = JobConfig::FromText(c.ToText());
  ASSERT_TRUE(back.ok()) << back.status();
  auto p = back->ToParallelConfig(Device::Cpu());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->train.val_fraction, 0.25);
  EXPECT_EQ(p->train.eval_every, 7);
  EXPECT_EQ(p->train.eval_batches, 3);
  EXPECT_EQ(p->train.model.vocab, 50304);
  EXPECT_EQ(p->train.model.data_vocab, 50257);
  back->val_data = "/data/val.bin";
  back->val_fraction = 0;
  EXPECT_EQ(JobConfig::FromText(back->ToText())->val_data, "/data/val.bin");
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// --balance=time measures every block once and turns the split into explicit sizes, so every
// rank gets the same stages.
TEST(JobTest, WorkerDevice) {
  JobConfig j;
  j.device = "cpu";
  EXPECT_EQ(*j.WorkerDevice(3, 8, "h"), Device::Cpu());
  j.device = "cuda";
  EXPECT_EQ(*j.WorkerDevice(3, 8, "h"), Device::Cuda(3));  // one GPU per local rank
  EXPECT_EQ(*j.WorkerDevice(7, 8, "h"), Device::Cuda(7));
  EXPECT_EQ(*j.WorkerDevice(3, 1, "h"), Device::Cuda(0));  // each task sees its own GPU
  const absl::StatusOr<Device> beyond = j.WorkerDevice(2, 2, "node7");
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.status().message().find("local rank 2 on node7, which has 2 GPUs visible"),
            std::string::npos)
      << beyond.status();
}

TEST(JobTest, BalanceByTime) {
  JobConfig c;
  c.strategy = "pipeline";
  c.workers = 2;
  c.model = "gpt";
  c.n_layer = 3;
  c.d_model = 32;
  c.n_head = 2;
  c.seq_len = 16;
  c.batch = 8;
  c.balance = "time";
  auto p = c.ToParallelConfig(Device::Cpu());
  ASSERT_TRUE(p.ok());
  auto seconds = MeasureBlockSeconds(p->train.model, Device::Cpu(), DType::kF32, 4, 1);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  ASSERT_EQ(seconds->size(), 5u);
  for (double s : *seconds) EXPECT_GT(s, 0);
  auto sizes = BalancedSizes(*seconds, 2);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_TRUE(ExplicitPartition(*sizes, 5, 2).ok()) << *sizes;
  LayoutInputs in;
  in.block_seconds = &*seconds;
  EXPECT_TRUE(ResolveLayout(*p, 2, in).ok());
  // Without the times, --balance=time is refused: nothing is timed inside.
  EXPECT_FALSE(ResolveLayout(*p, 2).ok());
  p->balance = "2,2,1";
  auto bad = ResolveLayout(*p, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("gives 3 stages but the job has 2"), std::string::npos);
}

}  // namespace
}  // namespace tandem
