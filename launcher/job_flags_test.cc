// The job's shared flags: defined once (launcher/job_flags.cc), taken by the launcher as its
// own, and the FlagSet mechanics a program that takes them relies on: only the shared flags it
// lists, its own defaults for them, and --help showing those.
#include "launcher/job_flags.h"

#include <set>
#include <string>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/flags.h"
#include "launcher/options.h"

namespace tandem {
namespace launcher {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::set<std::string> DefinedIn(const std::string& file) {
  std::set<std::string> names;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), file)) names.insert(std::string(name));
  }
  return names;
}

TEST(JobFlags, NamesCoverEveryFlagTheFileDefines) {
  const std::set<std::string> listed(JobFlagNames().begin(), JobFlagNames().end());
  EXPECT_EQ(listed.size(), JobFlagNames().size());
  EXPECT_EQ(DefinedIn(kJobFlagsFile), listed);
}

TEST(JobFlags, TheLauncherTakesEveryOneAndDefinesNone) {
  const std::set<std::string> own = DefinedIn("launcher/options.cc");
  const std::set<std::string> listed(FlagNames().begin(), FlagNames().end());
  for (const std::string& name : JobFlagNames()) {
    EXPECT_EQ(own.count(name), 0u) << name;
    EXPECT_EQ(listed.count(name), 1u) << name;
    const absl::CommandLineFlag* f = LauncherFlags().Find(name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_TRUE(absl::EndsWith(f->Filename(), kJobFlagsFile)) << name;
  }
}

TEST(JobFlags, ReadIntoTheJob) {
  absl::FlagSaver saver;
  bool help;
  ASSERT_TRUE(ParseFlags({"--model=gpt", "--n-layer=3", "--steps=7", "--lr=0.01",
                          "--val-fraction=0.1", "--checkpoint-every=2", "--strategy=pipeline"},
                         &help)
                  .ok());
  JobConfig job;
  JobFlagsInto(&job);
  EXPECT_EQ(job.model, "gpt");
  EXPECT_EQ(job.n_layer, 3);
  EXPECT_EQ(job.steps, 7);
  EXPECT_DOUBLE_EQ(job.lr, 0.01);
  EXPECT_EQ(job.eval_every, 100);  // resolved: validation data given
  EXPECT_EQ(job.checkpoint_every, 2);
  EXPECT_EQ(job.strategy, "data");  // not a shared flag: left as it was
  const Options o = OptionsFromFlags();
  EXPECT_EQ(o.job.steps, 7);
  EXPECT_EQ(o.job.strategy, "pipeline");
}

// A program that takes some of the shared flags, with its own default for one.
FlagSet Program() {
  return FlagSet{"launcher/job_flags_test.cc", {"model", "steps"}, {kJobFlagsFile},
                 {{"steps", "300"}}};
}

TEST(SharedFlags, OnlyThoseListedAreTheProgramsAndItsDefaultsApply) {
  absl::FlagSaver saver;
  const FlagSet flags = Program();
  EXPECT_NE(flags.Find("model"), nullptr);
  EXPECT_EQ(flags.Find("lr"), nullptr);
  EXPECT_EQ(flags.Find("strategy"), nullptr);
  bool help;
  ASSERT_TRUE(ParseFlags(flags, {"--model=gpt"}, &help).ok());
  JobConfig job;
  JobFlagsInto(&job);
  EXPECT_EQ(job.steps, 300);
  ASSERT_TRUE(ParseFlags(flags, {"--steps=5"}, &help).ok());
  JobFlagsInto(&job);
  EXPECT_EQ(job.steps, 5);
  EXPECT_EQ(ParseFlags(flags, {"--lr=1"}, &help).message(), "unknown flag --lr (see --help)");
  EXPECT_EQ(ParseFlags(flags, {"--model", "--steps=2"}, &help).message(),
            "--model needs a value: --model=VALUE");
  // --lr is not this program's flag: it may be a value.
  ASSERT_TRUE(ParseFlags(flags, {"--model", "--lr"}, &help).ok());
  JobFlagsInto(&job);
  EXPECT_EQ(job.model, "--lr");
}

TEST(SharedFlags, HelpShowsTheProgramsDefaultAndOnlyItsFlags) {
  const std::string help = HelpText(Program(), "Usage: p\n");
  EXPECT_THAT(help, HasSubstr("--steps  (default: 300)\n      optimizer steps to train\n"));
  EXPECT_THAT(help, HasSubstr("--model  (default: gpt-tiny)"));
  EXPECT_THAT(help, Not(HasSubstr("--lr")));
  EXPECT_THAT(HelpText(), HasSubstr("--steps  (default: 100)\n      optimizer steps to train\n"));
}

TEST(SharedFlags, ABadDefaultIsSaid) {
  absl::FlagSaver saver;
  FlagSet flags = Program();
  flags.defaults = {{"steps", "many"}, {"lr", "1"}};
  bool help;
  EXPECT_EQ(ParseFlags(flags, {}, &help).message(),
            "the default --steps=many is not a valid value of one of the program's flags\n"
            "the default --lr=1 is not a valid value of one of the program's flags");
}

}  // namespace
}  // namespace launcher
}  // namespace tandem
