#include "parallel/schedule.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

std::string Row(const PipelineSchedule& s, int stage) {
  std::vector<std::string> out;
  for (const Action& a : s.actions[stage]) out.push_back(ActionText(stage, a));
  return absl::StrJoin(out, " ");
}

PipelineSchedule FromText(int stages, int mbs, const std::vector<std::string>& rows,
                          int chunks = 1) {
  PipelineSchedule s{stages, mbs, std::vector<std::vector<Action>>(stages), chunks};
  for (int st = 0; st < stages; ++st) {
    std::vector<std::string> parts = absl::StrSplit(rows[st], ' ', absl::SkipEmpty());
    for (const std::string& p : parts) {
      int parsed_stage;
      s.actions[st].push_back(*ParseAction(p, &parsed_stage));
      EXPECT_EQ(parsed_stage, st);
    }
  }
  return s;
}

TEST(ScheduleTest, GpipeTable) {
  PipelineSchedule s = GpipeSchedule(2, 3);
  EXPECT_EQ(Row(s, 0), "0F0 0F1 0F2 0B2 0B1 0B0");
  EXPECT_EQ(Row(s, 1), "1F0 1F1 1F2 1B2 1B1 1B0");
}

TEST(ScheduleTest, OneFOneBTable) {
  PipelineSchedule s = OneFOneBSchedule(3, 4);
  EXPECT_EQ(Row(s, 0), "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3");
  EXPECT_EQ(Row(s, 1), "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3");
  EXPECT_EQ(Row(s, 2), "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3");
  // Fewer micro-batches than stages: warm-up is capped by M.
  PipelineSchedule t = OneFOneBSchedule(4, 2);
  EXPECT_EQ(Row(t, 0), "0F0 0F1 0B0 0B1");
  EXPECT_EQ(Row(t, 3), "3F0 3B0 3F1 3B1");
}

// ZB-H1 on 3 stages, 4 micro-batches: stage s defers its Ws by s backwards; without the Ws
// every row is 1F1B's.
TEST(ScheduleTest, ZeroBubbleH1Table) {
  const PipelineSchedule s = ZeroBubbleH1Schedule(3, 4);
  EXPECT_EQ(Row(s, 0), "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3");
  EXPECT_EQ(Row(s, 1), "1F0 1F1 1B0 1F2 1B1 1W0 1F3 1B2 1W1 1B3 1W2 1W3");
  EXPECT_EQ(Row(s, 2), "2F0 2B0 2F1 2B1 2F2 2B2 2W0 2F3 2B3 2W1 2W2 2W3");
  for (int k = 1; k <= 8; ++k) {
    for (int m = 1; m <= 16; ++m) {
      const PipelineSchedule z = ZeroBubbleH1Schedule(k, m), o = OneFOneBSchedule(k, m);
      for (int st = 0; st < k; ++st) {
        std::vector<Action> fb, ws;
        for (const Action& a : z.actions[st]) {
          (a.type == ActionType::kWeightGradient ? ws : fb).push_back(a);
        }
        EXPECT_EQ(fb, o.actions[st]) << "K=" << k << " M=" << m << " stage " << st;
        EXPECT_EQ(ws.size(), st == 0 ? 0u : static_cast<size_t>(m));
      }
      const PipelineSchedule full = HoistReceives(InsertCommunication(z));
      const absl::Status v = ValidateSchedule(full);
      EXPECT_TRUE(v.ok()) << "K=" << k << " M=" << m << "\n" << v.message();
    }
  }
}

// Interleaved on 2 stages, 2 chunks, 4 micro-batches, worked out from Megatron's rule: stage
// 0 warms up with 2(K-1) + (v-1)K = 4 forwards, stage 1 with 2; micro-batches go in runs of K
// = 2 through chunk 0, then chunk 1, the backwards from chunk 1 down.
TEST(ScheduleTest, InterleavedTable) {
  const PipelineSchedule s = InterleavedSchedule(2, 2, 4);
  EXPECT_EQ(s.chunks, 2);
  EXPECT_EQ(Row(s, 0),
            "0F0 0F1 0F0c1 0F1c1 0F2 0B0c1 0F3 0B1c1 0F2c1 0B0 0F3c1 0B1 0B2c1 0B3c1 0B2 0B3");
  EXPECT_EQ(Row(s, 1),
            "1F0 1F1 1F0c1 1B0c1 1F1c1 1B1c1 1F2 1B0 1F3 1B1 1F2c1 1B2c1 1F3c1 1B3c1 1B2 1B3");
  // M = K: every forward first.
  EXPECT_EQ(Row(InterleavedSchedule(2, 2, 2), 1), "1F0 1F1 1F0c1 1F1c1 1B0c1 1B1c1 1B0 1B1");
  for (int k = 2; k <= 6; ++k) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = k; m <= 4 * k; m += k) {
        auto full = MakeSchedule("interleaved", k, m, v);
        ASSERT_TRUE(full.ok()) << full.status();
        const absl::Status valid = ValidateSchedule(*full);
        EXPECT_TRUE(valid.ok()) << "K=" << k << " v=" << v << " M=" << m << "\n"
                                << valid.message();
        // Megatron's bound: stage s holds at most its warm-up forwards + 1 at once.
        for (int st = 0; st < k; ++st) {
          const int warmup = m == k ? m * v : 2 * (k - st - 1) + (v - 1) * k;
          EXPECT_LE(PeakInFlight(*full, st), std::min(m * v, warmup + 1))
              << "K=" << k << " v=" << v << " M=" << m << " stage " << st << "\n"
              << ScheduleGrid(*full);
        }
      }
    }
  }
}

TEST(ScheduleTest, InterleavedRefusesWhatItCannotRun) {
  const absl::Status odd = MakeSchedule("interleaved", 2, 3, 2).status();
  EXPECT_EQ(odd.message(),
            "the interleaved schedule takes micro-batches in runs of one per stage: "
            "--micro-batches=3 is not a multiple of the 2 stages; use 2 or 4");
  EXPECT_FALSE(MakeSchedule("interleaved", 2, 4, 1).ok());
  EXPECT_FALSE(MakeSchedule("interleaved", 1, 4, 2).ok());
  const absl::Status chunks = MakeSchedule("1f1b", 2, 4, 2).status();
  EXPECT_EQ(chunks.message(),
            "2 virtual stages need --schedule=interleaved; '1f1b' runs one model chunk a stage");
}

TEST(ScheduleTest, CommunicationIsInserted) {
  PipelineSchedule s = InsertCommunication(OneFOneBSchedule(2, 2));
  EXPECT_EQ(Row(s, 0), "0F0 0SA0 0F1 0SA1 0RG0 0B0 0RG1 0B1 0OPT");
  EXPECT_EQ(Row(s, 1), "1RA0 1F0 1B0 1SG0 1RA1 1F1 1B1 1SG1 1OPT");
  PipelineSchedule one = InsertCommunication(GpipeSchedule(1, 2));
  EXPECT_EQ(Row(one, 0), "0F0 0F1 0B1 0B0 0OPT");
}

TEST(ScheduleTest, GeneratedSchedulesAreValid) {
  for (const char* name : {"gpipe", "1f1b"}) {
    for (int k = 1; k <= 8; ++k) {
      for (int m = 1; m <= 16; ++m) {
        auto s = MakeSchedule(name, k, m);
        ASSERT_TRUE(s.ok());
        absl::Status v = ValidateSchedule(*s);
        EXPECT_TRUE(v.ok()) << name << " K=" << k << " M=" << m << "\n" << v.message();
      }
    }
  }
}

// GPipe on 2 stages, 2 micro-batches: stage 0's run [send activation 1, receive gradient 1]
// is split, since stage 1 receives that activation in one run and sends that gradient in
// another, after its forward and backward; both sides group each link's transfers alike.
TEST(ScheduleTest, ExchangeGroupsMatchThePeersRuns) {
  const PipelineSchedule s = InsertCommunication(GpipeSchedule(2, 2));
  ASSERT_EQ(Row(s, 0), "0F0 0SA0 0F1 0SA1 0RG1 0B1 0RG0 0B0 0OPT");
  ASSERT_EQ(Row(s, 1), "1RA0 1F0 1RA1 1F1 1B1 1SG1 1B0 1SG0 1OPT");
  const auto groups = ExchangeGroups(s);
  using G = std::vector<std::vector<int>>;
  EXPECT_EQ(groups[0], (G{{1}, {3}, {4}, {6}}));
  EXPECT_EQ(groups[1], (G{{0}, {2}, {5}, {7}}));
  // With the receives hoisted, stage 1's run [receive 0, receive 1] is split by stage 0's
  // two runs that send them.
  auto h = MakeSchedule("gpipe", 2, 2);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(Row(*h, 1), "1RA0 1RA1 1F0 1F1 1B1 1SG1 1B0 1SG0 1OPT");
  EXPECT_EQ(ExchangeGroups(*h)[1], (G{{0}, {1}, {5}, {7}}));
  // 1F1B on 2 stages: the runs already match, and each stays one group.
  auto o = MakeSchedule("1f1b", 2, 4);
  ASSERT_TRUE(o.ok());
  for (const auto& stage : ExchangeGroups(*o)) {
    for (const auto& g : stage) EXPECT_LE(g.size(), 2u);
  }
}

// Each receive moves one compute action earlier where the schedule stays valid: GPipe's next
// activation and gradient are received while the current micro-batch computes; under 1F1B
// stage 0 receives each gradient a forward early, and stage 1's receives stay where a move
// would put a receive before the send its peer needs first (a deadlock the validator finds).
TEST(ScheduleTest, ReceivesAreHoistedWhereValid) {
  auto g = MakeSchedule("gpipe", 2, 4);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(Row(*g, 0), "0F0 0SA0 0F1 0SA1 0F2 0SA2 0F3 0SA3 0RG3 0RG2 0B3 0RG1 0B2 0RG0 0B1 0B0 0OPT");
  EXPECT_EQ(Row(*g, 1), "1RA0 1RA1 1F0 1RA2 1F1 1RA3 1F2 1F3 1B3 1SG3 1B2 1SG2 1B1 1SG1 1B0 1SG0 1OPT");
  auto o = MakeSchedule("1f1b", 2, 4);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(Row(*o, 0), "0F0 0SA0 0RG0 0F1 0SA1 0B0 0RG1 0F2 0SA2 0B1 0RG2 0F3 0SA3 0RG3 0B2 0B3 0OPT");
  EXPECT_EQ(Row(*o, 1), Row(InsertCommunication(OneFOneBSchedule(2, 4)), 1));
  // A schedule with nothing to receive is unchanged.
  const PipelineSchedule one = InsertCommunication(GpipeSchedule(1, 3));
  EXPECT_EQ(Row(HoistReceives(one), 0), Row(one, 0));
}

TEST(ScheduleTest, InFlightActivations) {
  for (int k = 1; k <= 5; ++k) {
    for (int m = 1; m <= 10; ++m) {
      PipelineSchedule g = GpipeSchedule(k, m), o = OneFOneBSchedule(k, m);
      for (int st = 0; st < k; ++st) {
        EXPECT_EQ(PeakInFlight(g, st), m);
        EXPECT_EQ(PeakInFlight(o, st), std::min(m, k - st));
      }
    }
  }
}

// ZB-H1's Bs free the activations where 1F1B's backwards do, so the micro-batches in flight
// are 1F1B's; the pending Ws: none on the first stage; on stage s, each W comes s Bs after
// its own, so right after a B in the steady state s + 1 are pending (with M = 2K micro-batches
// the steady state is reached on every stage).
TEST(ScheduleTest, ZeroBubbleH1InFlightAndPendingWeights) {
  for (int k = 1; k <= 6; ++k) {
    const int m = 2 * k;
    const PipelineSchedule z = ZeroBubbleH1Schedule(k, m);
    for (int st = 0; st < k; ++st) {
      EXPECT_EQ(PeakInFlight(z, st), k - st) << "K=" << k << " stage " << st;
      EXPECT_EQ(PeakPendingWeights(z, st), st == 0 ? 0 : st + 1) << "K=" << k << " stage " << st;
    }
  }
  // Table of ZeroBubbleH1Table, stage 2: 2B0 2F1 2B1 2F2 2B2 (three pending) 2W0 ...
  EXPECT_EQ(PeakPendingWeights(ZeroBubbleH1Schedule(3, 4), 2), 3);
  // No W: nothing pending.
  EXPECT_EQ(PeakPendingWeights(OneFOneBSchedule(3, 4), 2), 0);
}

// Qi et al.'s memory claim for ZB-H1, in micro-batches: at no moment does a stage hold more
// micro-batches (from a forward to the B, or with its W deferred, to the W) than 1F1B's first
// stage holds in flight, min(K, M). On stage s, K - s forwards in flight before a B and s
// pending Ws; right after the B, K - s - 1 and s + 1. So as long as a pending W keeps no more
// than its micro-batch's activations, ZB-H1 needs no more memory than 1F1B's largest stage
// (where the stages hold alike).
TEST(ScheduleTest, ZeroBubbleH1HoldsNoMoreMicroBatchesThanOneFOneBsFirstStage) {
  for (int k = 2; k <= 6; ++k) {
    for (int m = 1; m <= 4 * k; ++m) {
      const PipelineSchedule z = ZeroBubbleH1Schedule(k, m);
      for (int st = 0; st < k; ++st) {
        int held = 0, most = 0;
        for (const Action& a : z.actions[st]) {
          if (a.type == ActionType::kForward) ++held;
          // A whole backward (stage 0) or a W releases the micro-batch.
          const bool whole = a.type == ActionType::kBackward && st == 0;
          if (a.type == ActionType::kWeightGradient || whole) --held;
          most = std::max(most, held);
        }
        EXPECT_EQ(held, 0);
        EXPECT_LE(most, std::min(k, m)) << "K=" << k << " M=" << m << " stage " << st;
      }
      EXPECT_EQ(PeakInFlight(OneFOneBSchedule(k, m), 0), std::min(k, m));
    }
  }
}

TEST(ScheduleTest, ZeroBubbleH1IsOffered) {
  auto z = MakeSchedule("zb-h1", 3, 6);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_TRUE(ValidateSchedule(*z).ok());
  EXPECT_EQ(Row(*z, 1), Row(HoistReceives(InsertCommunication(ZeroBubbleH1Schedule(3, 6))), 1));
  const absl::Status unknown = MakeSchedule("zigzag", 2, 2).status();
  EXPECT_EQ(unknown.message(), "unknown schedule 'zigzag': use gpipe, 1f1b, zb-h1 or interleaved");
}

TEST(ScheduleTest, DeadlockIsCaughtAndMarked) {
  // Stage 0 runs each micro-batch's backward before the next forward, but stage 1 runs both
  // forwards first: stage 0 waits for a gradient stage 1 only sends after a forward that
  // needs stage 0's next activation.
  PipelineSchedule s = InsertCommunication(
      FromText(2, 2, {"0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"}));
  absl::Status v = ValidateSchedule(s);
  ASSERT_FALSE(v.ok());
  const std::string msg(v.message());
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0SA0"), std::string::npos) << msg;  // the grid is printed
  EXPECT_NE(msg.find("<-- ERROR HERE (stage 0)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<-- ERROR HERE (stage 1)"), std::string::npos) << msg;
}

TEST(ScheduleTest, MissingAndMisorderedStepsAreCaught) {
  auto missing = ValidateSchedule(InsertCommunication(FromText(1, 2, {"0F0 0F1 0B1"})));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("never runs the backward of micro-batch 0"), std::string::npos);
  auto early = ValidateSchedule(InsertCommunication(FromText(1, 1, {"0B0 0F0"})));
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.message().find("backward of micro-batch 0 before its forward"), std::string::npos);
  auto twice = ValidateSchedule(InsertCommunication(FromText(1, 1, {"0F0 0F0 0B0"})));
  ASSERT_FALSE(twice.ok());
  // Optimizer step in the middle.
  PipelineSchedule s = FromText(1, 1, {"0F0 0OPT 0B0"});
  auto mid = ValidateSchedule(s);
  ASSERT_FALSE(mid.ok());
  EXPECT_NE(mid.message().find("optimizer step is not last"), std::string::npos);
}

TEST(ScheduleTest, MismatchedTransfersAreCaught) {
  // Stage 1 receives micro-batch 1 first while stage 0 sends 0 first.
  PipelineSchedule s = FromText(2, 2, {"0F0 0SA0 0F1 0SA1 0RG0 0B0 0RG1 0B1 0OPT",
                                       "1RA1 1F1 1RA0 1F0 1B0 1SG0 1B1 1SG1 1OPT"});
  auto v = ValidateSchedule(s);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("sent in micro-batch order 0,1 and received in order 1,0"),
            std::string::npos)
      << v.message();
}

TEST(ScheduleTest, ParseErrors) {
  int st;
  EXPECT_FALSE(ParseAction("F0", &st).ok());
  EXPECT_FALSE(ParseAction("1X0", &st).ok());
  EXPECT_FALSE(ParseAction("1F", &st).ok());
  EXPECT_TRUE(ParseAction("12SG7", &st).ok());
  EXPECT_EQ(st, 12);
  EXPECT_FALSE(MakeSchedule("zigzag", 2, 2).ok());
  EXPECT_FALSE(MakeSchedule("gpipe", 0, 2).ok());
  for (const char* bad : {"1B3c", "1B3x1", "1Bc1", "1W", "1B3c1c2", "1OPTc1", "1B-1"}) {
    EXPECT_FALSE(ParseAction(bad, &st).ok()) << bad;
  }
  const absl::Status no_chunk = ParseAction("1B3c", &st).status();
  EXPECT_NE(no_chunk.message().find("[c CHUNK]"), std::string::npos) << no_chunk;
}

// Weight gradients and chunks in the text form: each text reads back as itself, chunk 0
// without its suffix.
TEST(ScheduleTest, ActionTextRoundTrip) {
  for (const char* text : {"1B3c1", "1W3c1", "0W0", "0SA3", "12SG7", "2OPT", "3RG0c4", "0F0",
                           "5RA11c10"}) {
    int st = -1;
    const auto a = ParseAction(text, &st);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status();
    EXPECT_EQ(ActionText(st, *a), text);
  }
  int st = -1;
  const auto w = ParseAction("1W3c1", &st);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(st, 1);
  EXPECT_EQ(*w, (Action{ActionType::kWeightGradient, 3, 1}));
  const auto c0 = ParseAction("1B3c0", &st);
  ASSERT_TRUE(c0.ok());
  EXPECT_EQ(*c0, (Action{ActionType::kBackward, 3, 0}));
  EXPECT_EQ(ActionText(st, *c0), "1B3");
}

// Megatron's loop placement: 8 global stages on 4 ranks, two chunks each.
TEST(ScheduleTest, ChunkPlacement) {
  const StagePlace want[8] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1}};
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(PlaceStage(g, 4), want[g]) << g;
    EXPECT_EQ(GlobalStage(want[g].stage, want[g].chunk, 4), g);
  }
  EXPECT_EQ(PlaceStage(7, 3), (StagePlace{1, 2}));
  EXPECT_EQ(PlaceStage(2, 1), (StagePlace{0, 2}));
}

// Two stages holding two chunks each (global stages 0 and 2 on stage 0, 1 and 3 on stage 1),
// one micro-batch, weight gradients deferred: the activation goes from stage 1's chunk 0 back
// to stage 0's chunk 1, and the gradient the other way; W needs no transfer.
TEST(ScheduleTest, ChunksAndWeightGradientsValidate) {
  const PipelineSchedule s = InsertCommunication(
      FromText(2, 1, {"0F0 0F0c1 0B0c1 0B0 0W0c1 0W0", "1F0 1F0c1 1B0c1 1W0c1 1B0 1W0"}, 2));
  EXPECT_EQ(s.chunks, 2);
  EXPECT_EQ(Row(s, 0),
            "0F0 0SA0 0RA0c1 0F0c1 0SA0c1 0RG0c1 0B0c1 0SG0c1 0RG0 0B0 0W0c1 0W0 0OPT");
  // Stage 1's receive of gradient 0 for chunk 0 goes before W0c1, in the run of SG0c1.
  EXPECT_EQ(Row(s, 1), "1RA0 1F0 1SA0 1RA0c1 1F0c1 1B0c1 1SG0c1 1RG0 1W0c1 1B0 1SG0 1W0 1OPT");
  // With several chunks each run is one group, although the transfers of each run of two
  // have their counterparts in different runs of the peer: each completes once its two ends
  // are posted, so the groups need not pair up.
  using G = std::vector<std::vector<int>>;
  const auto groups = ExchangeGroups(s);
  EXPECT_EQ(groups[0], (G{{1, 2}, {4, 5}, {7, 8}}));
  EXPECT_EQ(groups[1], (G{{0}, {2, 3}, {6, 7}, {10}}));
  const absl::Status v = ValidateSchedule(s);
  EXPECT_TRUE(v.ok()) << v.message();
  // The same with one chunk is refused: the chunk-1 actions are out of range.
  PipelineSchedule one = s;
  one.chunks = 1;
  const absl::Status r = ValidateSchedule(one);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("stage 0: chunk 1 out of range [0, 1) in 0RA0c1"), std::string::npos)
      << r.message();
}

TEST(ScheduleTest, WeightGradientAndChunkErrorsAreCaught) {
  const absl::Status early =
      ValidateSchedule(InsertCommunication(FromText(1, 2, {"0F0 0F1 0B1 0W0 0B0 0W1"})));
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.message().find("stage 0: weight gradient of micro-batch 0 before its backward"),
            std::string::npos)
      << early.message();
  EXPECT_NE(early.message().find("0W0"), std::string::npos);  // the grid is printed
  const absl::Status twice =
      ValidateSchedule(InsertCommunication(FromText(1, 1, {"0F0 0B0 0W0 0W0"})));
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.message().find("weight gradient of micro-batch 0 twice"), std::string::npos)
      << twice.message();
  const absl::Status chunk =
      ValidateSchedule(FromText(2, 1, {"0F0 0F0c2 0OPT", "1F0 1OPT"}, 2));
  ASSERT_FALSE(chunk.ok());
  EXPECT_NE(chunk.message().find("stage 0: chunk 2 out of range [0, 2) in 0F0c2"),
            std::string::npos)
      << chunk.message();
  // A chunk's backward is missing: named with its chunk.
  const absl::Status missing = ValidateSchedule(
      InsertCommunication(FromText(2, 1, {"0F0 0F0c1 0B0c1 0B0", "1F0 1F0c1 1B0"}, 2)));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("stage 1 never runs the backward of micro-batch 0 on chunk 1"),
            std::string::npos)
      << missing.message();
  // One stage holding two chunks would send to itself.
  const absl::Status alone = ValidateSchedule(
      InsertCommunication(FromText(1, 1, {"0F0 0F0c1 0B0c1 0B0"}, 2)));
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.message().find("several chunks need at least 2 stages"), std::string::npos)
      << alone.message();
}

// The textbook bubbles, with F = B = W = 1 (a whole backward is B + W = 2): GPipe and 1F1B
// take (M + K - 1)(F + B + W) and each stage computes M(F + B + W), so the bubble is
// (K - 1) / (M + K - 1) (Huang et al.; Narayanan et al.); ZB-H1 waits (K - 1)(F + B - W) per
// stage (Qi et al., section 3), so it takes 3M + K - 1 and its bubble is
// (K - 1) / (3M + K - 1); interleaving v chunks a stage takes GPipe's to (K - 1) / (vM + K - 1).
// Receives hoisted and transfers grouped as the runtime does.
TEST(SimulateScheduleTest, TextbookBubbles) {
  for (int k = 1; k <= 6; ++k) {
    for (int m : {1, 2, 3, 4, 8, 16}) {
      const ScheduleDurations unit = ScheduleDurations::Uniform(k, 1, {1, 1, 1});
      for (const char* name : {"gpipe", "1f1b"}) {
        auto s = MakeSchedule(name, k, m);
        ASSERT_TRUE(s.ok());
        auto r = SimulateSchedule(*s, unit);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_DOUBLE_EQ(r->makespan, 3.0 * (m + k - 1)) << name << " K=" << k << " M=" << m;
        for (int st = 0; st < k; ++st) EXPECT_DOUBLE_EQ(r->busy[st], 3.0 * m);
        EXPECT_NEAR(r->bubble_fraction, double(k - 1) / (m + k - 1), 1e-12)
            << name << " K=" << k << " M=" << m;
      }
      // Interleaved with v chunks, each chunk's F = 1 and B = 2 (a v-th of a stage's work):
      // Narayanan et al.'s (K - 1) / (vM + K - 1), for M a multiple of K.
      for (int v = 2; k >= 2 && m % k == 0 && v <= 3; ++v) {
        auto s = MakeSchedule("interleaved", k, m, v);
        ASSERT_TRUE(s.ok()) << s.status();
        auto r = SimulateSchedule(*s, ScheduleDurations::Uniform(k, v, {1, 2, 0}));
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_DOUBLE_EQ(r->makespan, 3.0 * (v * m + k - 1))
            << "interleaved K=" << k << " v=" << v << " M=" << m;
        for (int st = 0; st < k; ++st) EXPECT_DOUBLE_EQ(r->busy[st], 3.0 * v * m);
        EXPECT_NEAR(r->bubble_fraction, double(k - 1) / (v * m + k - 1), 1e-12);
      }
      // ZB-H1's figure needs its steady state: at least K micro-batches.
      if (m < k) continue;
      auto z = MakeSchedule("zb-h1", k, m);
      ASSERT_TRUE(z.ok());
      auto r = SimulateSchedule(*z, unit);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_DOUBLE_EQ(r->makespan, 3.0 * m + (k - 1)) << "zb-h1 K=" << k << " M=" << m;
      for (int st = 0; st < k; ++st) EXPECT_DOUBLE_EQ(r->busy[st], 3.0 * m);
      EXPECT_NEAR(r->bubble_fraction, double(k - 1) / (3 * m + k - 1), 1e-12)
          << "zb-h1 K=" << k << " M=" << m;
    }
  }
}

// Unequal times, each makespan worked out by hand on a Gantt chart of the compute actions.
TEST(SimulateScheduleTest, UnequalTimesByHand) {
  // K=2, M=2, F=1, B=2, W=1. 1F1B: stage 1 F0 [1,2] B0 [2,5] F1 [5,6] B1 [6,9]; stage 0
  // F0 F1 [0,2], B0 [5,8], B1 [9,12]: 12 = (M+K-1)(F+B+W), each stage waiting 4.
  const ScheduleDurations d = ScheduleDurations::Uniform(2, 1, {1, 2, 1});
  auto o = SimulateSchedule(*MakeSchedule("1f1b", 2, 2), d);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_DOUBLE_EQ(o->makespan, 12);
  EXPECT_DOUBLE_EQ(o->bubble_fraction, 4.0 / 12);
  // ZB-H1: stage 1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7] W0 [7,8] W1 [8,9]; stage 0 (whole
  // backwards of 3) F0 F1 [0,2], B0 [4,7], B1 [7,10]: 10, each stage waiting
  // (K-1)(F+B-W) = 2.
  auto z = SimulateSchedule(*MakeSchedule("zb-h1", 2, 2), d);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_DOUBLE_EQ(z->makespan, 10);
  EXPECT_DOUBLE_EQ(z->busy[0], 8);
  EXPECT_DOUBLE_EQ(z->busy[1], 8);
  EXPECT_DOUBLE_EQ(z->bubble_fraction, 2.0 / 10);
  // GPipe, stages unlike: stage 0 F=1, backward 1; stage 1 F=2, backward 3. Stage 0 F0 F1
  // [0,2]; stage 1 F0 [1,3] F1 [3,5] B1 [5,8] B0 [8,11]; stage 0 B1 [8,9] B0 [11,12]: 12, the
  // stages waiting 8 and 2.
  ScheduleDurations u;
  u.per_stage = {{{1, 1, 0}}, {{2, 3, 0}}};
  auto g = SimulateSchedule(*MakeSchedule("gpipe", 2, 2), u);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_DOUBLE_EQ(g->makespan, 12);
  EXPECT_DOUBLE_EQ(g->busy[0], 4);
  EXPECT_DOUBLE_EQ(g->busy[1], 10);
  EXPECT_DOUBLE_EQ(g->bubble_fraction, (8.0 / 12 + 2.0 / 12) / 2);
  // A transfer of 0.5: GPipe, K=2, M=1, F=B=1: stage 0 F0 [0,1], the activation there at
  // 1.5; stage 1 F0 [1.5,2.5] B0 [2.5,3.5], the gradient there at 4; stage 0 B0 [4,5].
  ScheduleDurations t = ScheduleDurations::Uniform(2, 1, {1, 1, 0});
  t.transfer = 0.5;
  auto x = SimulateSchedule(*MakeSchedule("gpipe", 2, 1), t);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_DOUBLE_EQ(x->makespan, 5);
  EXPECT_DOUBLE_EQ(x->bubble_fraction, 3.0 / 5);
  // And a handover of 0.25 on top of each group (one transfer each): the activation there at
  // 1.75, stage 1 F0 [1.75,2.75] B0 [2.75,3.75], the gradient there at 4.5, stage 0 B0
  // [4.5,5.5]; each stage computes 2 of 5.5.
  t.handover = 0.25;
  auto h = SimulateSchedule(*MakeSchedule("gpipe", 2, 1), t);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_DOUBLE_EQ(h->makespan, 5.5);
  EXPECT_DOUBLE_EQ(h->bubble_fraction, 3.5 / 5.5);
  // Groups of two transfers: stage 0 sends both activations in one run, stage 1 receives both
  // in one, and likewise the gradients. F = B = 1, a transfer 0.25, a handover 0.5 a group:
  // stage 0 F0 F1 [0,2], posts both groups at 2; the activations' group meets at 2 and ends
  // at 2 + 2 x 0.25 + 0.5 = 3; stage 1 F0 F1 B0 B1 [3,7], posts the gradients at 7, there at
  // 8; stage 0 B0 B1 [8,10]. Each stage computes 4 of 10 (a handover a transfer: 11).
  const PipelineSchedule pairs = FromText(2, 2,
                                          {"0F0 0F1 0SA0 0SA1 0RG0 0RG1 0B0 0B1 0OPT",
                                           "1RA0 1RA1 1F0 1F1 1B0 1B1 1SG0 1SG1 1OPT"});
  ASSERT_TRUE(ValidateSchedule(pairs).ok()) << ValidateSchedule(pairs);
  ScheduleDurations grouped = ScheduleDurations::Uniform(2, 1, {1, 1, 0});
  grouped.transfer = 0.25;
  grouped.handover = 0.5;
  auto two = SimulateSchedule(pairs, grouped);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_DOUBLE_EQ(two->makespan, 10);
  EXPECT_DOUBLE_EQ(two->bubble_fraction, 6.0 / 10);
  // Each action's own time (a measured step replayed): GPipe, K=2, M=2, F=B=1 but stage 1's
  // F1 taking 3. Stage 0 F0 F1 [0,2]; stage 1 F0 [1,2] F1 [2,5] B1 [5,6] B0 [6,7]; stage 0 B1 [6,7] B0 [7,8]: 8.
  auto p = MakeSchedule("gpipe", 2, 2);
  ASSERT_TRUE(p.ok());
  ScheduleDurations a = ScheduleDurations::Uniform(2, 1, {1, 1, 0});
  a.per_action.resize(2);
  for (size_t i = 0; i < p->actions[1].size(); ++i) {
    const Action& y = p->actions[1][i];
    a.per_action[1].push_back(y.type == ActionType::kForward && y.micro_batch == 1 ? 3 : -1);
  }
  auto r = SimulateSchedule(*p, a);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->makespan, 8);
  EXPECT_DOUBLE_EQ(r->busy[1], 6);
  EXPECT_DOUBLE_EQ(r->bubble_fraction, (4.0 / 8 + 2.0 / 8) / 2);
}

TEST(SimulateScheduleTest, BadDurationsAndSchedulesAreRefused) {
  auto s = MakeSchedule("1f1b", 2, 2);
  ASSERT_TRUE(s.ok());
  const absl::Status rows = SimulateSchedule(*s, ScheduleDurations::Uniform(3, 1, {1, 1, 0})).status();
  EXPECT_EQ(rows.message(),
            "durations for a schedule of 2 stages x 1 chunks: give 2 rows of 1 (or none), and no "
            "negative time");
  EXPECT_FALSE(SimulateSchedule(*s, ScheduleDurations::Uniform(2, 1, {1, -1, 0})).ok());
  ScheduleDurations negative_handover;
  negative_handover.handover = -1;
  EXPECT_FALSE(SimulateSchedule(*s, negative_handover).ok());
  ScheduleDurations long_rows;
  long_rows.per_action = {std::vector<double>(s->actions[0].size() + 1, 1.0), {}};
  EXPECT_EQ(SimulateSchedule(*s, long_rows).status().message(),
            "per-action durations for a schedule of 2 stages: give 2 rows (or none), each no "
            "longer than its stage's actions");
  // An invalid schedule: the validator's error.
  const PipelineSchedule stuck = FromText(2, 1, {"0RG0 0F0 0SA0 0B0 0OPT", "1RA0 1F0 1B0 1SG0 1OPT"});
  const absl::Status v = SimulateSchedule(stuck, ScheduleDurations::Uniform(2, 1, {1, 1, 0})).status();
  EXPECT_EQ(v, ValidateSchedule(stuck));
  EXPECT_NE(v.message().find("deadlock"), std::string::npos) << v.message();
}

// A run of transfers whose last belongs to an earlier exchange group than one before it: GPipe
// on 3 stages with stage 1's backward of micro-batch 4 moved up beside that of 5, so that its
// run after them reads SG5 RG3 SG4, grouped {SG5, SG4} (to stage 0) and {RG3} (from stage 2).
// The executor posts both groups when it reaches the run; the simulation does too, and finds
// no deadlock. Sending gradient 4 before the backward that makes it is refused.
TEST(SimulateScheduleTest, EveryGroupOfARunIsPosted) {
  const PipelineSchedule gpipe = *MakeSchedule("gpipe", 3, 6);
  auto find = [](const std::vector<Action>& row, const char* text) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (ActionText(1, row[i]) == text) return i;
    }
    return row.size();
  };
  PipelineSchedule s = gpipe;
  std::vector<Action>& row = s.actions[1];
  const size_t b4 = find(row, "1B4"), b5 = find(row, "1B5");
  ASSERT_LT(b5, b4) << ScheduleGrid(s);
  const Action moved = row[b4];
  row.erase(row.begin() + b4);
  row.insert(row.begin() + b5 + 1, moved);
  const size_t sg4 = find(row, "1SG4");
  ASSERT_EQ(ActionText(1, row[sg4 - 2]), "1SG5") << ScheduleGrid(s);
  ASSERT_EQ(ActionText(1, row[sg4 - 1]), "1RG3") << ScheduleGrid(s);
  const std::vector<int> group_of = GroupOfActions(ExchangeGroups(s)[1], row.size());
  EXPECT_EQ(group_of[sg4 - 2], group_of[sg4]);      // {SG5, SG4}
  EXPECT_EQ(group_of[sg4 - 1], group_of[sg4] + 1);  // then {RG3}
  const absl::Status v = ValidateSchedule(s);
  EXPECT_TRUE(v.ok()) << v.message();

  PipelineSchedule early = gpipe;
  std::vector<Action>& r = early.actions[1];
  std::swap(r[find(r, "1B4")], r[find(r, "1SG4")]);
  const absl::Status refused = ValidateSchedule(early);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("stage 1: gradient of micro-batch 4 sent before its backward"),
            std::string::npos)
      << refused.message();
}

}  // namespace
}  // namespace tandem
