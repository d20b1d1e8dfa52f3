// The executor does what the schedule's replay says (parallel/stage_replay.h), through mpirun
// on 2, 3 and 4 ranks (one pipeline stage each): for every schedule generator (GPipe, 1F1B,
// ZB-H1 with its deferred Ws, interleaved with 2 model chunks a stage), each rank runs its
// row of one step with a real Stage and the MPI communicator, logging every buffer taken and
// given back, every group posted and done and every compute action, and the log must be
// ReplayStage's event for event. The memory estimate walks that replay, so the bytes it
// finds at its peak are the executor's too: the transfers' tensors it counts are checked to
// be the boundary's size the estimate gives each.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "comm/mpi_test_main.h"
#include "gtest/gtest.h"
#include "model/test_configs.h"
#include "model/trainer.h"
#include "parallel/layout.h"
#include "parallel/pipeline_executor.h"
#include "parallel/stage_replay.h"
#include "parallel/step_phases.h"

namespace tandem {
namespace {

Communicator* comm = nullptr;

// One step of `schedule` over every rank (M micro-batches, v chunks), this rank's row run by
// the executor with a log; returns the log.
std::vector<ReplayEvent> RunRow(const std::string& schedule, int M, int v, JobLayout* layout) {
  ParallelConfig c;
  c.train.model = TwoLayerModel("gpt", 16, 2, 8, 32);
  c.train.model.n_layer = 2 * comm->world_size();  // room for v = 2 chunks a stage
  c.train.batch = 2 * M;
  c.train.micro_batches = M;
  c.strategy = StrategyKind::kPipeline;
  c.schedule = schedule;
  c.virtual_stages = v;
  absl::StatusOr<JobLayout> l = ResolveLayout(c, comm->world_size());
  EXPECT_TRUE(l.ok()) << l.status();
  if (!l.ok()) return {};
  *layout = *l;
  const int rank = comm->rank();
  auto stage = Stage::Create(c.train.model, l->ChunkRanges(rank), Device::Cpu(), 3, DType::kF32);
  EXPECT_TRUE(stage.ok()) << stage.status();
  if (!stage.ok()) return {};
  auto data = LoadDataset(c.train);
  EXPECT_TRUE(data.ok()) << data.status();
  DataOrder order(TrainingSamples(c.train, *data), c.train.seed);
  auto input = InputPrefetcher::Create(Device::Cpu());
  Stream* s = *Stream::Compute(Device::Cpu());
  auto timeline = StreamTimeline::Start(*s);
  EXPECT_TRUE(timeline.ok());
  auto loss_sum = Tensor::Empty({1}, DType::kF32, Device::Cpu());
  EXPECT_TRUE(ZeroFill(*loss_sum, *s).ok());
  std::vector<ReplayEvent> log;
  PipelineStepIO io;
  io.stage = stage->get();
  io.pp = comm;
  io.stream = s;
  io.timeline = &*timeline;
  io.loss_sum = *loss_sum;
  io.rows = 2;
  io.dtype = DType::kF32;
  io.load = [&](int m) {
    return (*input)->Load(*data, order, 0, 2 * m, 2, c.train.model.seq_len, 1.0f / (2 * M * 8));
  };
  io.wait_on = [&](Work& w, const char*) { return w.WaitOn(*s, absl::Minutes(1)); };
  io.log = &log;
  PipelineExecutor executor(l->schedule, l->exchange_groups[rank], rank, std::move(io));
  const absl::Status ran = executor.Run();
  EXPECT_TRUE(ran.ok()) << ran;
  EXPECT_TRUE(s->Synchronize().ok());
  // Every transfer moved a boundary: a micro-batch's rows x seq x d_model f32.
  const int64_t transfers = std::count_if(log.begin(), log.end(), [](const ReplayEvent& e) {
    return e.kind == ReplayKind::kAcquire &&
           (e.buffer == ReplayBuffer::kReceived || e.buffer == ReplayBuffer::kSent);
  });
  EXPECT_EQ(executor.comm_bytes(), transfers * 2 * 8 * 16 * 4);
  return log;
}

void ExpectReplayed(const std::string& schedule, int M, int v) {
  JobLayout layout;
  const std::vector<ReplayEvent> ran = RunRow(schedule, M, v, &layout);
  if (ran.empty()) return;
  const int rank = comm->rank();
  const std::vector<ReplayEvent> replay =
      ReplayStage(layout.schedule, layout.exchange_groups[rank], rank);
  ASSERT_EQ(ran.size(), replay.size()) << schedule << " stage " << rank;
  for (size_t i = 0; i < ran.size(); ++i) {
    ASSERT_EQ(ran[i], replay[i]) << schedule << " stage " << rank << " event " << i << ": ran "
                                 << ReplayEventText(ran[i]) << ", the replay says "
                                 << ReplayEventText(replay[i]);
  }
  // Every buffer taken was given back, and each was given back after it was taken.
  int held = 0;
  for (const ReplayEvent& e : ran) {
    if (e.kind == ReplayKind::kAcquire) ++held;
    if (e.kind == ReplayKind::kRelease) ASSERT_GT(held--, 0) << ReplayEventText(e);
  }
  EXPECT_EQ(held, 0) << schedule << " stage " << rank;
}

TEST(PipelineReplayTest, GPipe) { ExpectReplayed("gpipe", 4, 1); }
TEST(PipelineReplayTest, OneFOneB) { ExpectReplayed("1f1b", 2 * comm->world_size(), 1); }
TEST(PipelineReplayTest, ZeroBubbleH1) { ExpectReplayed("zb-h1", 2 * comm->world_size(), 1); }
TEST(PipelineReplayTest, Interleaved) {
  ExpectReplayed("interleaved", comm->world_size() * 2, 2);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::RunMpiTests(argc, argv, &tandem::comm); }
