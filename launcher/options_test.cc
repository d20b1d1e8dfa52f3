// Tests of the launcher's flag handling (hyphenated names, --help, unknown flags, bad values)
// and of validation: each bad input gives its own line, and validation creates nothing.
#include "launcher/options.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/paths.h"
#include "model/checkpoint.h"
#include "model/hf_gpt2.h"
#include "model/sharded_checkpoint.h"
#include "runtime/files.h"
#include "runtime/format.h"
#include "runtime/test_files.h"

namespace tandem {
namespace launcher {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(RewriteFlagName, HyphensInTheNameOnly) {
  EXPECT_EQ(RewriteFlagName("--micro-batches=4"), "--micro_batches=4");
  EXPECT_EQ(RewriteFlagName("--no-overlap"), "--nooverlap");
  EXPECT_EQ(RewriteFlagName("--data=my-file-name.txt"), "--data=my-file-name.txt");
  EXPECT_EQ(RewriteFlagName("-n-layer=2"), "-n_layer=2");
  EXPECT_EQ(RewriteFlagName("--heartbeat-timeout"), "--heartbeat_timeout");
  EXPECT_EQ(RewriteFlagName("--run-dir=a-b/c-d"), "--run_dir=a-b/c-d");
  EXPECT_EQ(RewriteFlagName("--gpus=2"), "--gpus=2");
}

TEST(RewriteFlagName, LeavesNonFlagsAlone) {
  EXPECT_EQ(RewriteFlagName("some-word"), "some-word");
  EXPECT_EQ(RewriteFlagName("--"), "--");
  EXPECT_EQ(RewriteFlagName("-"), "-");
  EXPECT_EQ(RewriteFlagName("-5"), "-5");
}

TEST(RewriteArgs, SeparateValuesAndAfterDoubleDashAreKept) {
  EXPECT_THAT(RewriteArgs({"--data", "-my-file", "--n-layer", "2", "--no-overlap"}),
              ElementsAre("--data", "-my-file", "--n_layer", "2", "--nooverlap"));
  EXPECT_THAT(RewriteArgs({"--seq-len=8", "--", "--not-a-flag"}),
              ElementsAre("--seq_len=8", "--", "--not-a-flag"));
}

TEST(ParseFlags, HyphenatedFlagsReachTheOptions) {
  absl::FlagSaver saver;
  bool help = true;
  ASSERT_TRUE(ParseFlags({"--strategy=pipeline", "--gpus", "4", "--no-overlap",
                          "--micro-batches=8", "--synthetic", "--heartbeat-timeout=30",
                          "--run-dir=out-dir", "--seed=7", "--lr=0.01"},
                         &help)
                  .ok());
  EXPECT_FALSE(help);
  const Options o = OptionsFromFlags();
  EXPECT_EQ(o.job.strategy, "pipeline");
  EXPECT_EQ(o.job.workers, 4);
  EXPECT_FALSE(o.job.overlap);
  EXPECT_EQ(o.job.micro_batches, 8);
  EXPECT_TRUE(o.job.synthetic);
  EXPECT_EQ(o.job.heartbeat_timeout_s, 30);
  EXPECT_EQ(o.job.run_dir, "out-dir");
  EXPECT_EQ(o.job.seed, 7u);
  EXPECT_DOUBLE_EQ(o.job.lr, 0.01);
  EXPECT_EQ(o.job.eval_every, 0);  // no validation data: no evaluation
  ASSERT_TRUE(ParseFlags({"--val-data=v.bin", "--eval-every=50", "--eval-batches=2"}, &help).ok());
  EXPECT_EQ(OptionsFromFlags().job.val_data, "v.bin");
  EXPECT_EQ(OptionsFromFlags().job.eval_every, 50);
  EXPECT_EQ(OptionsFromFlags().job.eval_batches, 2);
}

// --eval-every's default: every 100 steps with validation data, else never.
TEST(ParseFlags, EvalEveryDefaultFollowsTheValidationData) {
  absl::FlagSaver saver;
  bool help;
  ASSERT_TRUE(ParseFlags({"--val-fraction=0.05"}, &help).ok());
  EXPECT_DOUBLE_EQ(OptionsFromFlags().job.val_fraction, 0.05);
  EXPECT_EQ(OptionsFromFlags().job.eval_every, 100);
  ASSERT_TRUE(ParseFlags({"--val-fraction=0", "--val-data=v.bin"}, &help).ok());
  EXPECT_EQ(OptionsFromFlags().job.eval_every, 100);
  ASSERT_TRUE(ParseFlags({"--val-data=v.bin", "--eval-every=0"}, &help).ok());
  EXPECT_EQ(OptionsFromFlags().job.eval_every, 0);
  EXPECT_THAT(HelpText(), HasSubstr("default: 100 with --val-data or --val-fraction, else none"));
}

TEST(ParseFlags, BooleansAcceptEveryForm) {
  absl::FlagSaver saver;
  bool help;
  ASSERT_TRUE(ParseFlags({"--overlap=false", "--profile"}, &help).ok());
  EXPECT_FALSE(OptionsFromFlags().job.overlap);
  EXPECT_TRUE(OptionsFromFlags().job.profile);
  EXPECT_EQ(ParseFlags({"--no-overlap=1"}, &help).message(), "--no-overlap takes no value");
  ASSERT_TRUE(ParseFlags({"--overlap", "--noprofile"}, &help).ok());
  EXPECT_TRUE(OptionsFromFlags().job.overlap);
  EXPECT_FALSE(OptionsFromFlags().job.profile);
}

TEST(ParseFlags, Help) {
  absl::FlagSaver saver;
  bool help = false;
  EXPECT_TRUE(ParseFlags({"--help"}, &help).ok());
  EXPECT_TRUE(help);
  help = false;
  EXPECT_TRUE(ParseFlags({"-h"}, &help).ok());
  EXPECT_TRUE(help);
}

TEST(ParseFlags, EveryProblemOneLine) {
  absl::FlagSaver saver;
  bool help;
  absl::Status s = ParseFlags(
      {"--bogus-flag=1", "--gpus=abc", "stray", "--steps", "--no-gpus", "--lr=fast"}, &help);
  ASSERT_FALSE(s.ok());
  const std::vector<std::string> lines = absl::StrSplit(s.message(), '\n');
  EXPECT_THAT(lines, ElementsAre("unknown flag --bogus-flag (see --help)",
                                 "--gpus=abc: not a valid value; expected an integer",
                                 "unexpected argument 'stray': flags are written --name=value (see "
                                 "--help)",
                                 // --no-gpus is no flag of the launcher's (--gpus takes a
                                 // number): the value of --steps
                                 "--steps=--no-gpus: not a valid value; expected an integer",
                                 "--lr=fast: not a valid value; expected a number"));
}

TEST(ParseFlags, AFlagMissingItsValueDoesNotTakeTheNextFlag) {
  absl::FlagSaver saver;
  bool help;
  EXPECT_EQ(ParseFlags({"--model", "--check"}, &help).message(),
            "--model needs a value: --model=VALUE");
  ASSERT_TRUE(
      ParseFlags({"--data", "-my-file", "--lr", "-1", "--mpirun-args", "--mca btl self,tcp"}, &help)
          .ok());
  EXPECT_EQ(OptionsFromFlags().job.data, "-my-file");
  EXPECT_EQ(OptionsFromFlags().job.lr, -1);
  EXPECT_EQ(OptionsFromFlags().mpirun_args, "--mca btl self,tcp");
  // A word that is not one of the launcher's flags is a value: mpirun's options are.
  ASSERT_TRUE(ParseFlags({"--mpirun-args", "--oversubscribe", "--no-overlap"}, &help).ok());
  EXPECT_EQ(OptionsFromFlags().mpirun_args, "--oversubscribe");
  EXPECT_FALSE(OptionsFromFlags().job.overlap);
  EXPECT_EQ(ParseFlags({"--model", "--no-overlap"}, &help).message(),
            "--model needs a value: --model=VALUE");
  EXPECT_EQ(ParseFlags({"--model", "--", "--micro-batches=2"}, &help).message(),
            "--model needs a value: --model=VALUE\nunexpected argument '--micro-batches=2'");
}

TEST(ParseFlags, OtherLibrariesFlagsAreUnknown) {
  absl::FlagSaver saver;
  bool help;
  absl::Status s = ParseFlags({"--flagfile=x"}, &help);
  EXPECT_EQ(s.message(), "unknown flag --flagfile (see --help)");
  s = ParseFlags({"--steps"}, &help);
  EXPECT_EQ(s.message(), "--steps needs a value (an integer): --steps=VALUE");
}

TEST(HelpText, ListsEveryFlagHyphenatedWithItsDefault) {
  const std::string help = HelpText();
  for (const std::string& name : FlagNames()) {
    std::string shown = name;
    for (char& c : shown) c = c == '_' ? '-' : c;
    EXPECT_THAT(help, HasSubstr(shown)) << name;
  }
  EXPECT_THAT(help, HasSubstr("--gpus  (default: 1)"));
  EXPECT_THAT(help, HasSubstr("--micro-batches  (default: 0)"));
  EXPECT_THAT(help, HasSubstr("--[no-]overlap  (default: true)"));
  EXPECT_THAT(help, HasSubstr("--heartbeat-timeout  (default: 60)"));
  EXPECT_THAT(help, HasSubstr("--strategy  (default: data)"));
  EXPECT_THAT(help, Not(HasSubstr("micro_batches")));
}

TEST(HelpText, FlagNamesCoverEveryLauncherFlag) {
  std::set<std::string> defined;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "launcher/options.cc") ||
        absl::EndsWith(flag->Filename(), "launcher/job_flags.cc")) {
      defined.insert(std::string(name));
    }
  }
  const std::set<std::string> listed(FlagNames().begin(), FlagNames().end());
  EXPECT_EQ(defined, listed);
}

// ---- validation ----

HostInfo CpuHost(const std::string& user_dir) {
  HostInfo h;
  h.cuda_devices = 0;
  h.why_no_cuda = "no driver";
  h.user_dir = user_dir;
  h.now = absl::FromUnixSeconds(1700000000);
  return h;
}

Options Small() {
  Options o;
  o.job.workers = 2;
  o.job.model = "gpt";
  o.job.n_layer = 2;
  o.job.d_model = 32;
  o.job.n_head = 2;
  o.job.seq_len = 16;
  o.job.batch = 8;
  o.job.steps = 5;
  o.job.synthetic = true;
  return o;
}

// The problems Validate reports, one per line.
std::vector<std::string> Problems(const Options& o, const HostInfo& h) {
  absl::StatusOr<LaunchPlan> p = Validate(o, h);
  if (p.ok()) return {};
  return absl::StrSplit(p.status().message(), '\n');
}

MATCHER_P(AnyLineHas, text, "") {
  for (const std::string& l : arg) {
    if (absl::StrContains(l, text)) return true;
  }
  return false;
}

TEST(Validate, GoodJobCreatesNothing) {
  const std::string user = FreshTestPath("user");
  absl::StatusOr<LaunchPlan> p = Validate(Small(), CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.device, "cpu");
  EXPECT_EQ(p->job.workers, 2);
  EXPECT_TRUE(absl::StartsWith(p->job.run_dir, user + "/runs/")) << p->job.run_dir;
  EXPECT_TRUE(absl::EndsWith(p->job.run_dir, "-data")) << p->job.run_dir;
  EXPECT_THAT(p->notices, ElementsAre("no GPU visible (no driver): running 2 CPU workers"));
  EXPECT_FALSE(PathExists(user));
}

TEST(Validate, DefaultCorpusIsRead) {
  Options o = Small();
  o.job.synthetic = false;
  EXPECT_TRUE(Validate(o, CpuHost(FreshTestPath("user"))).ok());
}

TEST(Validate, CudaWhenVisible) {
  HostInfo h = CpuHost(FreshTestPath("user"));
  h.cuda_devices = 2;
  absl::StatusOr<LaunchPlan> p = Validate(Small(), h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.device, "cuda");
  EXPECT_TRUE(p->notices.empty());
}

TEST(Validate, AnotherStrategysFlagsAreSaidToBeIgnored) {
  HostInfo h = CpuHost(FreshTestPath("user"));
  h.cuda_devices = 2;
  Options o = Small();
  o.job.schedule = "1f1b";
  o.job.balance = "2,2";
  o.job.bucket_mb = 4;
  o.job.overlap = false;
  absl::StatusOr<LaunchPlan> p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices,
              ElementsAre("--schedule=1f1b applies to --strategy=pipeline only: ignored under "
                          "--strategy=data",
                          "--balance=2,2 applies to --strategy=pipeline and model only: ignored "
                          "under --strategy=data"));
  o.job.strategy = "model";
  p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices,
              ElementsAre(HasSubstr("--schedule=1f1b applies"),
                          "--bucket-mb=4 applies to --strategy=data and --data-parallel >= 2 "
                          "only: ignored under --strategy=model",
                          HasSubstr("--no-overlap applies")));
  o.job.strategy = "pipeline";
  p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices, ElementsAre(HasSubstr("--bucket-mb=4"), HasSubstr("--no-overlap")));
  // Replicas of the pipeline reduce their gradients in buckets: the flags apply.
  h.cuda_devices = 4;
  o.job.workers = 4;
  o.job.data_parallel = 2;
  o.job.balance = "params";
  p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices, IsEmpty());
  o.job.strategy = "data";
  o.job.schedule = "gpipe";
  o.job.workers = 2;
  p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices, ElementsAre(HasSubstr("--data-parallel=2 applies to --strategy=pipeline "
                                                "and model (data parallelism replicates")));
}

TEST(Validate, FlagsTheModelOrDataDoNotUseAreSaidToBeIgnored) {
  HostInfo h = CpuHost(FreshTestPath("user"));
  h.cuda_devices = 2;
  Options o = Small();
  o.job.model = "mlp";
  o.job.n_head = 2;
  o.job.attention = "flash";
  o.job.data = "/nonexistent";  // synthetic: never read
  absl::StatusOr<LaunchPlan> p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices,
              ElementsAre("--n-head=2 applies to GPT models only: ignored for --model=mlp",
                          "--attention=flash applies to GPT models only: ignored for --model=mlp",
                          "--data=/nonexistent is ignored with --synthetic (random tokens)"));
}

TEST(Validate, WarmupLongerThanTheRunIsSaid) {
  HostInfo h = CpuHost(FreshTestPath("user"));
  h.cuda_devices = 2;
  Options o = Small();
  o.job.warmup = 6;
  absl::StatusOr<LaunchPlan> p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices, ElementsAre("--warmup=6 is longer than --steps=5: the learning rate "
                                      "stays below --lr=0.003"));
  o.job.warmup = 5;
  p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->notices.empty());
  o.job.warmup = JobConfig().warmup;  // not set by the user: not said
  p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->notices.empty());
}

// --balance=time is measured by the launcher, once: the workers receive explicit stage sizes
// that cover the model's blocks (embedding, 2 layers, head).
TEST(Validate, BalanceByTimeReachesTheWorkersAsSizes) {
  Options o = Small();
  o.job.strategy = "pipeline";
  o.job.balance = "time";
  absl::StatusOr<LaunchPlan> p = Validate(o, CpuHost(FreshTestPath("user")));
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<std::string> sizes = absl::StrSplit(p->job.balance, ',');
  ASSERT_EQ(sizes.size(), 2u) << p->job.balance;
  int total = 0;
  for (const std::string& size : sizes) {
    int n = 0;
    ASSERT_TRUE(absl::SimpleAtoi(size, &n)) << p->job.balance;
    EXPECT_GE(n, 1);
    total += n;
  }
  EXPECT_EQ(total, 4);
}

// With replicas (4 workers, D = 2) and model chunks, the sizes are for the K x v stages the
// layout splits the model into, not one per worker.
TEST(Validate, BalanceByTimeSizesTheStagesOfAReplica) {
  Options o = Small();
  o.job.workers = 4;
  o.job.n_layer = 6;  // 8 blocks
  o.job.strategy = "pipeline";
  o.job.data_parallel = 2;
  o.job.balance = "time";
  absl::StatusOr<LaunchPlan> p = Validate(o, CpuHost(FreshTestPath("user")));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(p->job.balance, ',')).size(), 2u)
      << p->job.balance;
  o.job.data_parallel = 1;
  o.job.schedule = "interleaved";
  o.job.virtual_stages = 2;
  o.job.micro_batches = 4;
  p = Validate(o, CpuHost(FreshTestPath("user")));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(p->job.balance, ',')).size(), 8u)
      << p->job.balance;
}

// --explain: what runs on each rank, from the layout the workers resolve, with the run's own
// bucket size (not the 25 MB the fit check stands in); nothing without it.
TEST(Validate, ExplainSaysWhatEachRankRuns) {
  Options o = Small();
  o.job.workers = 4;
  o.job.strategy = "pipeline";
  o.job.data_parallel = 2;
  o.job.micro_batches = 2;
  o.job.bucket_mb = 0.01;
  HostInfo h = CpuHost(FreshTestPath("user"));
  absl::StatusOr<LaunchPlan> quiet = Validate(o, h);
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  EXPECT_EQ(quiet->explanation, "");
  o.explain = true;
  absl::StatusOr<LaunchPlan> p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  for (const char* place : {"rank 0 (replica 0, stage 0): ", "rank 1 (replica 1, stage 0): ",
                            "rank 2 (replica 0, stage 1): ", "rank 3 (replica 1, stage 1): "}) {
    EXPECT_THAT(p->explanation, HasSubstr(place)) << p->explanation;
  }
  EXPECT_THAT(p->explanation,
              HasSubstr(absl::StrCat("gradient buckets of about ", FormatBytes(int64_t{10485}))))
      << p->explanation;
  EXPECT_THAT(p->explanation, HasSubstr("schedule: 0F0")) << p->explanation;
}

// CPU workers on this host share its memory: the job is refused before it starts when what
// they keep together cannot fit.
TEST(Validate, WorkersOnThisHostMustFitInItsMemory) {
  Options o = Small();
  HostInfo h = CpuHost(FreshTestPath("user"));
  JobConfig j = o.job;
  j.device = "cpu";
  const ParallelConfig pc = *j.ToParallelConfig(Device::Cpu());
  const std::vector<MemoryNeed> needs = ResolveLayout(pc, 2)->memory;
  EXPECT_EQ(needs[1].total(), needs[0].total());  // replicas
  // Both workers' model state, activations and temporaries: each keeps its own.
  const int64_t both = 2 * needs[0].total();
  h.available_memory = both;
  absl::StatusOr<LaunchPlan> p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices, Contains(absl::StrFormat(
                              "memory: the 2 workers need at least %s of the %s this host has "
                              "available; optimizer state %s per rank",
                              FormatBytes(both), FormatBytes(both),
                              FormatBytes(needs[0].optimizer))));
  h.available_memory = -1;  // unknown
  EXPECT_TRUE(Validate(o, h).ok());
  h.available_memory = both - 1;
  EXPECT_THAT(Problems(o, h), ElementsAre(HasSubstr("not enough memory for the 2 workers")));
  // A sequence standard attention cannot hold: the figures, and what to change.
  o.job.seq_len = 100000;
  h.available_memory = int64_t{16} << 30;
  const std::vector<std::string> lines = Problems(o, h);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("TB is needed"));
  EXPECT_THAT(lines[0], HasSubstr("this host has 16.0 GB available"));
  EXPECT_THAT(lines[0], HasSubstr("--attention=flash"));
  o.job.attention = "flash";
  EXPECT_TRUE(Validate(o, h).ok());
  // --balance=time would time each block here first: refused before it allocates.
  o.job.attention = "standard";
  o.job.strategy = "pipeline";
  o.job.balance = "time";
  EXPECT_THAT(Problems(o, h),
              ElementsAre(HasSubstr("not enough memory for --balance=time, which times every "
                                    "block on one device")));
}

// Under ZeRO-1 each of D replicas keeps the AdamW moments (8 bytes a parameter) of a 1/D
// shard; the notice says so.
TEST(Validate, ZeroShardsTheOptimizerStatePerRank) {
  Options o = Small();
  o.job.workers = 4;
  HostInfo h = CpuHost(FreshTestPath("user"));
  h.available_memory = int64_t{64} << 30;
  JobConfig j = o.job;
  j.device = "cpu";
  const ParallelConfig pc = *j.ToParallelConfig(Device::Cpu());
  const int64_t whole = ResolveLayout(pc, 4)->memory[0].optimizer;
  const int64_t params = whole / 8;
  ASSERT_EQ(whole, 8 * params);
  o.job.zero = 1;
  absl::StatusOr<LaunchPlan> p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices,
              Contains(HasSubstr(absl::StrFormat(
                  "; optimizer state %s per rank (ZeRO-1: a 1/4 shard of each stage's)",
                  FormatBytes(8 * ((params + 3) / 4))))));
  // Two replicas of a two-stage pipeline: each stage's state in halves.
  o.job.strategy = "pipeline";
  o.job.data_parallel = 2;
  p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices, Contains(HasSubstr("per rank (ZeRO-1: a 1/2 shard of each stage's)")));
  EXPECT_EQ(p->job.data_parallel, 2);
  EXPECT_EQ(p->job.zero, 1);
}

// Each GPU worker's stage (here in bf16) must fit in its GPU, whatever the host has.
TEST(Validate, EachGpuMustHoldItsStage) {
  Options o = Small();
  o.job.strategy = "pipeline";
  o.job.dtype = "bf16";
  HostInfo h = CpuHost(FreshTestPath("user"));
  h.cuda_devices = 2;
  h.available_memory = 1;
  JobConfig j = o.job;
  j.device = "cuda";
  const ParallelConfig pc = *j.ToParallelConfig(Device::Cuda(0));
  const std::vector<MemoryNeed> needs = ResolveLayout(pc, 2)->memory;
  const int64_t need0 = needs[0].total(), need1 = needs[1].total();
  h.gpu_memory = {need0, need1};
  absl::StatusOr<LaunchPlan> p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  const int most = need1 > need0 ? 1 : 0;
  EXPECT_THAT(p->notices,
              Contains(absl::StrFormat(
                  "memory: rank %d needs the most, at least %s of cuda:%d's %s; optimizer state "
                  "up to %s per rank",
                  most, FormatBytes(std::max(need0, need1)), most,
                  FormatBytes(std::max(need0, need1)),
                  FormatBytes(std::max(needs[0].optimizer, needs[1].optimizer)))));
  h.gpu_memory = {need0, need1 - 1};
  EXPECT_THAT(Problems(o, h), ElementsAre(AllOf(HasSubstr("not enough memory for rank 1"),
                                                HasSubstr("cuda:1 (all of its memory) has"),
                                                HasSubstr("--schedule=1f1b or --recompute"))));
  h.gpu_memory = {-1, -1};  // unknown
  EXPECT_TRUE(Validate(o, h).ok());
}

TEST(Validate, EachBadInputGivesItsLine) {
  const HostInfo h = CpuHost(FreshTestPath("user"));
  struct Case {
    std::function<void(Options&)> set;
    std::string line;
  };
  const std::vector<Case> cases = {
      {[](Options& o) { o.job.strategy = "banana"; },
       "--strategy=banana: use data, model or pipeline"},
      {[](Options& o) { o.job.workers = 0; }, "--gpus=0: need between 1 and 4096 workers"},
      {[](Options& o) { o.job.device = "tpu"; }, "--device=tpu: use auto, cuda or cpu"},
      {[](Options& o) { o.job.device = "cuda"; }, "--device=cuda: no GPU visible (no driver)"},
      {[](Options& o) { o.job.batch = 7; },
       "--batch=7 is not divisible by 2 workers x 1 micro-batch; "},
      {[](Options& o) { o.job.dtype = "bf16"; }, "--dtype=bf16 on the CPU"},
      {[](Options& o) { o.job.dtype = "f8"; }, "--dtype=f8: use f32, bf16 or f16"},
      {[](Options& o) {
         o.job.strategy = "pipeline";
         o.job.workers = 5;
       },
       "5 stages but the model has only 4 blocks"},
      {[](Options& o) { o.job.n_head = 3; }, "--n-head=3 must divide --d-model=32"},
      {[](Options& o) { o.job.model = "gpt-huge"; }, "unknown model 'gpt-huge'"},
      {[](Options& o) {
         o.job.strategy = "pipeline";
         o.job.schedule = "zigzag";
       },
       "unknown schedule 'zigzag': use gpipe, 1f1b, zb-h1 or interleaved"},
      {[](Options& o) {
         o.job.strategy = "pipeline";
         o.job.schedule = "interleaved";
         o.job.virtual_stages = 2;
         o.job.micro_batches = 3;
         o.job.batch = 6;
       },
       "the interleaved schedule takes micro-batches in runs of one per stage: "
       "--micro-batches=3 is not a multiple of the 2 stages; use 2 or 4"},
      {[](Options& o) {
         o.job.strategy = "pipeline";
         o.job.schedule = "interleaved";
         o.job.virtual_stages = 3;
         o.job.micro_batches = 4;
       },
       "2 stages x 3 virtual stages need 6 model chunks of at least one block, but the model "
       "has 4 blocks: use fewer stages or virtual stages"},
      {[](Options& o) {
         o.job.strategy = "pipeline";
         o.job.schedule = "1f1b";
         o.job.virtual_stages = 2;
       },
       "2 virtual stages need --schedule=interleaved; '1f1b' runs one model chunk a stage"},
      {[](Options& o) {
         o.job.strategy = "model";
         o.job.micro_batches = 4;
       },
       "--micro-batches=4 with --strategy=model"},
      {[](Options& o) { o.job.steps = 0; }, "--steps=0: need at least 1"},
      {[](Options& o) { o.job.micro_batches = -1; }, "--micro-batches=-1: must be 0"},
      {[](Options& o) { o.job.lr = -1; }, "--lr=-1: must be a positive number"},
      {[](Options& o) { o.job.optimizer = "lion"; }, "--optimizer=lion: use adamw or sgd"},
      {[](Options& o) { o.job.heartbeat_timeout_s = 0; }, "--heartbeat-timeout=0: must be between"},
      {[](Options& o) { o.job.bucket_mb = 0; }, "--bucket-mb=0: must be a positive number"},
      {[](Options& o) { o.job.checkpoint_every = -2; }, "--checkpoint-every=-2"},
      {[](Options& o) {
         o.job.synthetic = false;
         o.job.data = "/nonexistent/corpus.txt";
       },
       "--data: data file /nonexistent/corpus.txt does not exist"},
      {[](Options& o) { o.job.data_format = "int8"; },
       "--data-format=int8: use auto, text, llmc (llm.c shards), uint16 or uint32"},
      {[](Options& o) { o.job.vocab = -3; }, "--vocab=-3: need at least 2"},
      {[](Options& o) {
         o.job.synthetic = false;
         o.job.data = "/nonexistent/shards/*.bin";
       },
       "--data: no file matches /nonexistent/shards/*.bin"},
      {[](Options& o) { o.hostfile = "/nonexistent/hosts"; },
       "--hostfile=/nonexistent/hosts does not exist"},
      {[](Options& o) { o.job.resume = "/nonexistent/step-000003"; },
       "--resume=/nonexistent/step-000003: checkpoint /nonexistent/step-000003 does not exist"},
      {[](Options& o) {
         o.job.strategy = "pipeline";
         o.job.data_parallel = 3;
       },
       "--data-parallel=3 does not divide --gpus=2: D replicas of a pipeline of K stages "
       "take D x K workers; use a D that divides 2"},
      {[](Options& o) {
         o.job.strategy = "model";
         o.job.data_parallel = 0;
       },
       "--data-parallel=0: must be at least 1"},
      {[](Options& o) { o.job.zero = 3; }, "--zero=3: use 0"},
      {[](Options& o) {
         o.job.strategy = "pipeline";
         o.job.zero = 1;
       },
       "--zero=1 with --strategy=pipeline and --data-parallel=1: ZeRO-1 shards"},
      {[](Options& o) {
         o.job.strategy = "pipeline";
         o.job.data_parallel = 2;
         o.job.batch = 6;
         o.job.micro_batches = 2;
       },
       "--batch=6 is not divisible by 2 replicas x 2 micro-batches"},
      {[](Options& o) { o.job.resume = "/nonexistent/weights.bin"; },
       "--resume=/nonexistent/weights.bin: name a checkpoint step"},
  };
  for (const Case& c : cases) {
    Options o = Small();
    c.set(o);
    const std::vector<std::string> problems = Problems(o, h);
    EXPECT_THAT(problems, AnyLineHas(c.line)) << "expected: " << c.line;
    EXPECT_EQ(problems.size(), 1u) << absl::StrJoin(problems, "\n");
  }
  EXPECT_FALSE(PathExists(h.user_dir));
}

TEST(Validate, MoreGpusThanVisible) {
  HostInfo h = CpuHost(FreshTestPath("user"));
  h.cuda_devices = 1;
  Options o = Small();
  EXPECT_THAT(Problems(o, h),
              ElementsAre("--gpus=2 but only 1 GPU is visible on this machine; use --gpus=1, or "
                          "--device=cpu for CPU workers"));
  h.cuda_devices = 2;
  o.job.workers = 4;
  o.job.device = "cuda";
  o.job.batch = 16;
  EXPECT_THAT(Problems(o, h), AnyLineHas("--gpus=4 but only 2 GPUs are visible"));
}

TEST(Validate, AllProblemsAtOnce) {
  Options o = Small();
  o.job.strategy = "pipeline";
  o.job.workers = 20;
  o.job.lr = -1;
  o.job.synthetic = false;
  o.job.data = "/nonexistent/corpus.txt";
  o.job.heartbeat_timeout_s = 1;
  const std::vector<std::string> p = Problems(o, CpuHost(FreshTestPath("user")));
  EXPECT_EQ(p.size(), 4u) << absl::StrJoin(p, "\n");
  EXPECT_THAT(p, AnyLineHas("--lr=-1"));
  EXPECT_THAT(p, AnyLineHas("20 stages"));
  EXPECT_THAT(p, AnyLineHas("/nonexistent/corpus.txt"));
  EXPECT_THAT(p, AnyLineHas("--heartbeat-timeout=1"));
}

// llm.c shards (a relative glob) give the job their kind's vocabulary, GPT-2's 50257, which
// the model pads to 50304; a token beyond --vocab is refused in one line.
TEST(Validate, VocabularyComesFromTheShards) {
  const std::string user = FreshTestPath("user");
  ASSERT_EQ(::mkdir(user.c_str(), 0755), 0);
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 1000;
  std::vector<uint16_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[i] = static_cast<uint16_t>(50000 + i % 257);
  for (const char* name : {"/tok_train_000000.bin", "/tok_train_000001.bin"}) {
    std::ofstream f(user + name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    f.write(reinterpret_cast<const char*>(tokens.data()), 2000);
  }
  Options o = Small();
  o.job.synthetic = false;
  o.job.data = "tok_train_*.bin";
  absl::StatusOr<LaunchPlan> p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.data, user + "/tok_train_*.bin");
  EXPECT_EQ(p->job.vocab, 50257);
  EXPECT_EQ(p->job.Model()->vocab, 50304);
  o.job.vocab = 50100;
  EXPECT_THAT(Problems(o, CpuHost(user)),
              ElementsAre("--data: data file " + user +
                          "/tok_train_000000.bin holds token 50100 at position 100 but the "
                          "vocabulary is 50100; pass --vocab=N with the tokenizer's size"));
}

// Validation data: --eval-every's default follows it, the file's path is the user's, job.conf
// carries the settings, and each bad combination is one line before anything starts.
TEST(Validate, ValidationFlags) {
  const std::string user = FreshTestPath("user");
  ASSERT_EQ(::mkdir(user.c_str(), 0755), 0);
  std::ofstream(user + "/val.txt") << std::string(2000, 'v');
  Options o = Small();
  absl::StatusOr<LaunchPlan> p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.eval_every, 0);  // no validation data: none
  o.job.val_data = "val.txt";
  o.job.eval_every = kDefaultEvalEvery;
  p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.val_data, user + "/val.txt");
  EXPECT_EQ(p->job.eval_every, 100);
  EXPECT_EQ(p->job.eval_batches, 4);
  o.job.val_data.clear();
  o.job.val_fraction = 0.2;
  o.job.eval_every = 7;
  p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.eval_every, 7);
  EXPECT_EQ(JobConfig::FromText(p->job.ToText())->val_fraction, 0.2);

  struct Case {
    std::function<void(Options&)> set;
    std::string line;
  };
  const std::vector<Case> cases = {
      {[](Options& o) {
         o.job.val_data = "val.txt";
         o.job.val_fraction = 0.1;
       },
       "--val-data=val.txt and --val-fraction=0.1: give one"},
      {[](Options& o) { o.job.val_fraction = 1; }, "--val-fraction=1: must be above 0 and below 1"},
      {[](Options& o) { o.job.val_fraction = -0.5; },
       "--val-fraction=-0.5: must be above 0 and below 1"},
      {[](Options& o) { o.job.eval_every = 10; },
       "--eval-every=10 without validation data: add --val-data=FILE or --val-fraction=F"},
      {[](Options& o) {
         o.job.val_fraction = 0.5;
         o.job.eval_batches = 0;
       },
       "--eval-batches=0: need at least 1"},
      // 2000 bytes of seq 16 are 124 samples: a batch of 200 is more.
      {[](Options& o) {
         o.job.val_data = "val.txt";
         o.job.batch = 200;
       },
       "--val-data=" + user + "/val.txt holds 124 samples of 17 tokens, fewer than one batch "
       "(--batch=200): give more validation data"},
      {[](Options& o) {
         o.job.synthetic = false;
         o.job.val_fraction = 1e-7;
       },
       "fewer than one batch (--batch=8): give more validation data (a larger --val-fraction)"},
      {[](Options& o) { o.job.val_data = "missing.bin"; }, "--val-data: "},
  };
  for (const Case& c : cases) {
    Options bad = Small();
    c.set(bad);
    const std::vector<std::string> lines = Problems(bad, CpuHost(user));
    EXPECT_THAT(lines, AnyLineHas(c.line)) << c.line;
    EXPECT_EQ(lines.size(), 1u) << absl::StrJoin(lines, "\n");
  }
}

TEST(Validate, RelativePathsAreTheUsers) {
  const std::string user = FreshTestPath("user");
  ASSERT_EQ(::mkdir(user.c_str(), 0755), 0);
  std::ofstream(user + "/corpus.txt") << std::string(1000, 'a');
  Options o = Small();
  o.job.synthetic = false;
  o.job.data = "corpus.txt";
  o.job.run_dir = "out/run1";
  absl::StatusOr<LaunchPlan> p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.data, user + "/corpus.txt");
  EXPECT_EQ(p->job.run_dir, user + "/out/run1");
  EXPECT_FALSE(PathExists(user + "/out"));
}

TEST(Validate, ExistingRunDirectory) {
  const std::string user = FreshTestPath("user");
  ASSERT_EQ(::mkdir(user.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((user + "/empty").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((user + "/full").c_str(), 0755), 0);
  std::ofstream(user + "/full/run.json") << "{}";
  std::ofstream(user + "/file") << "x";
  Options o = Small();
  o.job.run_dir = "empty";
  EXPECT_TRUE(Validate(o, CpuHost(user)).ok());
  o.job.run_dir = "full";
  EXPECT_THAT(Problems(o, CpuHost(user)),
              ElementsAre("--run-dir=full exists and is not empty; choose another directory (or "
                          "--resume)"));
  o.job.run_dir = "file";
  EXPECT_THAT(Problems(o, CpuHost(user)), ElementsAre("--run-dir=file exists and is not a directory"));
  o.job.run_dir = "file/run/1";
  EXPECT_THAT(Problems(o, CpuHost(user)),
              ElementsAre(absl::StrCat("--run-dir=file/run/1 cannot be created: ", user,
                                       "/file is not a directory; choose another directory")));
  EXPECT_THAT(Problems(Small(), CpuHost(user + "/file")),
              ElementsAre(HasSubstr(absl::StrCat(user, "/file is not a directory"))));
}

TEST(Validate, DefaultRunDirectoryNeverReused) {
  const std::string user = FreshTestPath("user");
  const HostInfo h = CpuHost(user);
  const std::string first = DefaultRunDir(user, h.now, "data");
  ASSERT_EQ(std::system(("mkdir -p " + first).c_str()), 0);
  absl::StatusOr<LaunchPlan> p = Validate(Small(), h);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->job.run_dir, first + "-2");
}

// A checkpoint of the small model at `step` as a 2-stage pipeline writes it: two shards and
// the manifest (validation reads the manifest and checks every shard; the workers load the
// values).
void WriteCheckpointAt(const std::string& dir, int step, int batch, const std::string& model) {
  Manifest m;
  m.step = step;
  m.strategy = "pipeline";
  m.world_size = 2;
  m.model = model;
  m.optimizer = "adamw";
  m.batch = batch;
  for (int r = 0; r < 2; ++r) {
    CheckpointData d;
    d.arrays.push_back({"params", {1, 2, 3}});
    d.meta["step"] = absl::StrCat(step);
    d.meta["batch"] = absl::StrCat(batch);
    d.meta["model"] = model;
    d.meta["model_blocks"] = "4";
    ShardRecord s;
    s.file = absl::StrFormat("step-%06d.stage-%d.ckpt", step, r);
    s.block_begin = 2 * r;
    s.block_end = 2 * r + 2;
    CheckpointFileInfo info;
    ASSERT_TRUE(WriteCheckpoint(dir + "/" + s.file, d, &info).ok());
    s.bytes = info.bytes;
    s.checksum = info.checksum;
    m.shards.push_back(s);
  }
  ASSERT_TRUE(WriteManifest(CheckpointPrefixFor(dir, step), m).ok());
}

std::string SmallModel() {
  JobConfig j;
  j.model = "gpt";
  j.n_layer = 2;
  j.d_model = 32;
  j.n_head = 2;
  j.seq_len = 16;
  return j.Model().value().ToString();
}

TEST(Validate, Resume) {
  const std::string dir = FreshTestPath("ckpt");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  Options o = Small();
  WriteCheckpointAt(dir, 3, 8, SmallModel());
  const HostInfo h = CpuHost(FreshTestPath("user"));

  o.job.resume = dir + "/step-000003";
  absl::StatusOr<LaunchPlan> p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.resume, dir + "/step-000003");
  o.job.resume = dir + "/step-000003.stage-1.ckpt";  // one of its files is fine too
  ASSERT_TRUE(Validate(o, h).ok());
  EXPECT_EQ(Validate(o, h)->job.resume, dir + "/step-000003");
  o.job.resume = dir + "/step-000003.manifest";
  EXPECT_EQ(Validate(o, h)->job.resume, dir + "/step-000003");
  // Any strategy and number of workers may load it.
  o.job.strategy = "data";
  o.job.workers = 1;
  EXPECT_TRUE(Validate(o, h).ok());
  o = Small();
  o.job.resume = dir + "/step-000003";

  o.job.steps = 3;
  EXPECT_THAT(Problems(o, h), ElementsAre(HasSubstr("at step 3 and --steps=3: nothing left")));
  o.job.steps = 5;
  o.job.batch = 16;
  EXPECT_THAT(Problems(o, h), ElementsAre(HasSubstr("trained with --batch=8, not 16")));
  o.job.batch = 8;
  o.job.d_model = 64;
  EXPECT_THAT(Problems(o, h), ElementsAre(HasSubstr("holds another model")));
  o.job.d_model = 32;
  o.job.optimizer = "sgd";
  EXPECT_THAT(Problems(o, h), ElementsAre(HasSubstr("trained with --optimizer=adamw, not sgd")));
  o.job.optimizer = "adamw";

  // A corrupt manifest is refused.
  std::ofstream(dir + "/step-000004.manifest") << "TANDEMCK garbage";
  o.job.resume = dir + "/step-000004";
  EXPECT_THAT(Problems(o, h), ElementsAre(HasSubstr("--resume=" + dir + "/step-000004: ")));
}

TEST(Validate, ResumeRefusesMissingAndCorruptShardsByName) {
  const std::string dir = FreshTestPath("shards");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  WriteCheckpointAt(dir, 3, 8, SmallModel());
  const HostInfo h = CpuHost(FreshTestPath("user"));
  Options o = Small();
  o.job.resume = dir + "/step-000003";
  const std::string shard = dir + "/step-000003.stage-1.ckpt";
  const std::string saved = shard + ".saved";
  ASSERT_EQ(std::rename(shard.c_str(), saved.c_str()), 0);
  EXPECT_THAT(Problems(o, h), ElementsAre(HasSubstr("checkpoint shard " + shard + " is missing")));
  // Corrupt: one byte changed in the middle, the trailer left as listed.
  std::string bytes = ReadAll(saved);
  bytes[bytes.size() / 2] ^= 1;
  std::ofstream(shard, std::ios::binary) << bytes;
  EXPECT_THAT(Problems(o, h), ElementsAre(AllOf(HasSubstr("checkpoint " + shard + " is corrupt"),
                                                HasSubstr("checksum mismatch"))));
}

TEST(Validate, ResumeAuto) {
  const std::string user = FreshTestPath("user");
  const std::string run = user + "/run";
  ASSERT_EQ(std::system(("mkdir -p " + run + "/checkpoints").c_str()), 0);
  std::ofstream(run + "/run.json") << "{}";
  Options o = Small();
  o.job.run_dir = "run";
  o.job.resume = "auto";
  // No checkpoint yet: start fresh, in a directory that may hold an earlier attempt.
  absl::StatusOr<LaunchPlan> p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.resume, "");
  EXPECT_THAT(p->notices, testing::Contains(HasSubstr("no complete checkpoint in " + run +
                                                      "/checkpoints; starting from step 0")));
  // The newest complete one; a newer incomplete one is passed over, saying why.
  WriteCheckpointAt(run + "/checkpoints", 2, 8, SmallModel());
  WriteCheckpointAt(run + "/checkpoints", 4, 8, SmallModel());
  WriteCheckpointAt(run + "/checkpoints", 6, 8, SmallModel());
  ASSERT_EQ(std::remove((run + "/checkpoints/step-000006.stage-0.ckpt").c_str()), 0);
  p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.resume, run + "/checkpoints/step-000004");
  EXPECT_THAT(p->notices, testing::Contains(HasSubstr("resuming from " + run +
                                                      "/checkpoints/step-000004 (step 4)")));
  EXPECT_THAT(p->notices, testing::Contains(HasSubstr("step-000006.stage-0.ckpt is missing")));
  // Its own checkpoint named: it continues the run in it too.
  o.job.resume = "./run//checkpoints/step-000004";
  p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.resume, run + "//checkpoints/step-000004");
  // Another run's checkpoint into this one: its run.json and metrics would mix the two.
  WriteCheckpointAt(user, 4, 8, SmallModel());
  o.job.resume = "step-000004";
  EXPECT_THAT(Problems(o, CpuHost(user)),
              ElementsAre("--run-dir=run holds another run than the checkpoint's; resume into an "
                          "empty directory, or continue that run with --resume=auto"));
  o.job.run_dir = "fresh";
  EXPECT_TRUE(Validate(o, CpuHost(user)).ok());
}

// The weights of `model` (seed 1) as a Hugging Face GPT-2 safetensors file at `path`.
void WriteGpt2File(const std::string& path, const ModelConfig& model) {
  std::unique_ptr<Stage> s = *Stage::Create(model, 0, model.num_blocks(), Device::Cpu(), 1);
  std::map<std::string, std::vector<float>> params;
  for (size_t i = 0; i < s->layout().entries().size(); ++i) {
    params[s->layout().entries()[i].spec.name] = *s->params().view(i).ToFloatVector();
  }
  ASSERT_TRUE(WriteSafetensors(path, *ExportGpt2(model, params)).ok());
}

TEST(Validate, InitFrom) {
  const std::string user = FreshTestDir("user");
  const HostInfo h = CpuHost(user);
  Options o = Small();
  WriteGpt2File(user + "/model.safetensors", *o.job.Model());
  o.job.init_from = "model.safetensors";  // the user's directory's
  absl::StatusOr<LaunchPlan> p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.init_from, user + "/model.safetensors");
  EXPECT_EQ(p->job.ToParallelConfig(Device::Cpu())->train.init_from, user + "/model.safetensors");

  o.job.init_from = "none.safetensors";
  EXPECT_THAT(Problems(o, h), ElementsAre("--init-from=none.safetensors does not exist"));
  o.job.init_from = "model.safetensors";
  o.job.d_model = 64;
  EXPECT_THAT(Problems(o, h), ElementsAre(AllOf(
                                  HasSubstr("--init-from: " + user + "/model.safetensors: tensor "
                                            "transformer.wte.weight is [256, 32]"),
                                  HasSubstr("pass the sizes of the model the file holds"))));
  o.job.d_model = 32;
  // A checkpoint holds the weights: not both.
  WriteCheckpointAt(user, 3, 8, SmallModel());
  o.job.resume = user + "/step-000003";
  EXPECT_THAT(Problems(o, h), ElementsAre(HasSubstr("a resumed run has its weights")));
  // --resume=auto: the file starts a run that has no checkpoint yet, and is not read after.
  o.job.resume = "auto";
  o.job.run_dir = "run";
  p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.init_from, user + "/model.safetensors");
  ASSERT_EQ(std::system(("mkdir -p " + user + "/run/checkpoints").c_str()), 0);
  WriteCheckpointAt(user + "/run/checkpoints", 2, 8, SmallModel());
  p = Validate(o, h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->job.init_from, "");
  EXPECT_THAT(p->notices, Contains(HasSubstr("--init-from=model.safetensors is not read: "
                                             "--resume=auto continues from")));
}

TEST(Validate, HostfileCoordinatorAndRestarts) {
  const std::string user = FreshTestPath("user");
  ASSERT_EQ(::mkdir(user.c_str(), 0755), 0);
  std::ofstream(user + "/hosts") << "# this host twice\nlocalhost slots=1\n127.0.0.1 slots=1\n";
  std::ofstream(user + "/bad-hosts") << "localhost slots=two\n";
  Options o = Small();
  o.hostfile = "hosts";
  absl::StatusOr<LaunchPlan> p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->hostfile, user + "/hosts");
  EXPECT_EQ(p->coordinator_host, "127.0.0.1");  // every host is this one
  EXPECT_FALSE(p->coordinator_remote);
  // --device=auto decides by this host's GPUs for all: the notice says how to ask for theirs.
  EXPECT_THAT(p->notices, Contains(HasSubstr("--device=cuda if theirs have GPUs")));
  o.job.workers = 4;
  o.job.batch = 8;
  EXPECT_THAT(Problems(o, CpuHost(user)),
              ElementsAre("--gpus=4 but --hostfile=hosts offers 2 slots; add hosts or slots, or "
                          "use --gpus=2"));
  o = Small();
  o.hostfile = "bad-hosts";
  EXPECT_THAT(Problems(o, CpuHost(user)),
              ElementsAre(HasSubstr("--hostfile=bad-hosts: line 1: 'slots=two'")));
  o = Small();
  o.coordinator_address = "127.0.0.1:23456";
  p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->coordinator_listen, "127.0.0.1:23456");
  o.coordinator_address = "192.0.2.1";  // TEST-NET-1: never this host's
  EXPECT_THAT(Problems(o, CpuHost(user)),
              ElementsAre(HasSubstr("192.0.2.1 is not an address of this host")));
  o.coordinator_address = "127.0.0.1:port";
  EXPECT_THAT(Problems(o, CpuHost(user)), ElementsAre(HasSubstr("--coordinator-address=")));
  o = Small();
  o.max_restarts = -1;
  EXPECT_THAT(Problems(o, CpuHost(user)),
              ElementsAre("--max-restarts=-1: must be between 0 and 1000"));
  o.max_restarts = 3;
  o.mpirun_args = " --mca  btl self,tcp ";
  p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->max_restarts, 3);
  EXPECT_THAT(p->mpirun_args, ElementsAre("--mca", "btl", "self,tcp"));
  // A host that does not resolve here is said (ssh may know it as an alias), not refused.
  std::ofstream(user + "/alias-hosts") << "localhost slots=1\nno-such-host.invalid slots=1\n";
  o = Small();
  o.hostfile = "alias-hosts";
  p = Validate(o, CpuHost(user));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->notices, Contains(AllOf(HasSubstr("cannot resolve host 'no-such-host.invalid'"),
                                         HasSubstr("only if ssh knows the name"))));
}

TEST(CheckpointPrefix, AcceptsPrefixOrFile) {
  EXPECT_EQ(CheckpointPrefix("a/step-000010"), "a/step-000010");
  EXPECT_EQ(CheckpointPrefix("a/step-000010.ckpt"), "a/step-000010");
  EXPECT_EQ(CheckpointPrefix("a/step-000010.stage-3.ckpt"), "a/step-000010");
  EXPECT_EQ(CheckpointPrefix("a/step-000010.manifest"), "a/step-000010");
}

TEST(Paths, AbsoluteAndDefaultRunDir) {
  EXPECT_EQ(AbsolutePath("/home/u", "x/y"), "/home/u/x/y");
  EXPECT_EQ(AbsolutePath("/home/u", "./x"), "/home/u/x");
  EXPECT_EQ(AbsolutePath("/home/u", "/abs"), "/abs");
  EXPECT_EQ(AbsolutePath("/home/u", ""), "");
  const std::string d = DefaultRunDir("/home/u", absl::Now(), "pipeline");
  EXPECT_TRUE(absl::StartsWith(d, "/home/u/runs/"));
  EXPECT_TRUE(absl::EndsWith(d, "-pipeline"));
  // runs/YYYYmmdd-HHMMSS-pipeline
  EXPECT_EQ(d.size(), std::string("/home/u/runs/20260101-120000-pipeline").size());
}

TEST(CreateRunDirectory, MakesTheSubdirectories) {
  const std::string d = FreshTestPath("run") + "/nested";
  ASSERT_TRUE(CreateRunDirectory(d).ok());
  EXPECT_TRUE(PathExists(d + "/logs"));
  EXPECT_TRUE(PathExists(d + "/metrics"));
  EXPECT_TRUE(PathExists(d + "/checkpoints"));
}

}  // namespace
}  // namespace launcher
}  // namespace tandem
