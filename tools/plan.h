// `bazel run //tools:compare -- --plan ...`: the planner's command line, its ranked table and
// report, and the check of its predictions against runs (planner/planner.h predicts).
#ifndef TANDEM_TOOLS_PLAN_H_
#define TANDEM_TOOLS_PLAN_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/planner.h"
#include "tools/comparison.h"

namespace tandem {
namespace tools {

struct PlanOptions {
  PlanRequest request;       // all but the profile and the link, which Prepare fills
  std::string block_times;   // --block-times: read the profile from here
  std::vector<double> derive;  // --derive-block-times: TFLOPS, MFU, TB/s; empty: none
  std::string write_block_times;
  std::string link;          // --link as given; "" to measure
  std::string tp_link;       // --tp-link as given; "" for the --link's
  int gpus_per_node = 8;     // --gpus-per-node: tensor parallelism's T at most this
  double waiting_share = -1;  // --waiting-share as given; -1 to fit where it matters
  bool run = true;           // run the top layouts and check the predictions
  int steps = 20;            // of each run
  int repeats = 5;           // runs of each checked layout, the layouts taken in turns
  int top = 10;
  std::string out_dir;       // as given; "" for reports/plan-<time>
  std::vector<std::string> model_flags;  // the launcher flags that name the model and batch
  std::vector<std::string> args;         // as given
};

// The workers that the host's timings for a plan of `gpus` stand for (the link's all-reduce,
// the blocks' finish spread): the plan's, at least 2 and at most 8, so that a plan for a
// cluster that is not here does not start a crowd of processes or threads.
int WorkersTimedHere(int gpus);

// True where compare's command line asks for the planner.
bool WantsPlan(const std::vector<std::string>& args);

// Parses compare --plan's command line into *o. Returns the exit code to stop with: 0 after
// --help, 2 after printing the problems (one line each); nothing to go on.
std::optional<int> ParsePlanArgs(const std::vector<std::string>& args, PlanOptions* o);

// Fills o->request's profile (read from --block-times, or measured here on the request's
// device and written to --write-block-times where given) and link (--link, or
// `measured_link` where --link is not given: none is an error saying what to give).
absl::Status PreparePlan(PlanOptions* o, const std::optional<LinkModel>& measured_link);

// The plan's ranked table (markdown): the top `top` layouts, then the best of each pure
// strategy not among them, each with its predicted step, parts, memory and reason.
std::string PlanTable(const Plan& plan, int top);
// What the plan considered and left out, a line each.
std::vector<std::string> PlanNotes(const Plan& plan, const PlanRequest& r);

// The layouts the planner checks by running them, and those it holds out of the check.
struct CheckSelection {
  std::vector<Prediction> checked;
  // A line for each layout the check would have run but holds out, and why (HeldOutReason):
  // "d1k4 1f1b M=8 (ranked 2): the waiting share was fitted on it".
  std::vector<std::string> held_out;
};
// Of the layouts not held out by `fitted` (the layout the waiting share was fitted on, where
// it was; HeldOutReason): the top 3 and the best pure strategy they leave out (data parallel
// where none of them is, else the pipeline over every rank; the pipeline too where no
// data-parallel layout fits), where that pure strategy is held out the best layout of a shape
// none of them has, without repeats. held_out names the layouts that the same choice over
// every layout would have run and that are held out.
CheckSelection LayoutsToCheck(const Plan& plan, const std::optional<tandem::Layout>& fitted);

// One checked layout: predicted against measured.
struct PlanCheck {
  Prediction predicted;
  // Over its runs: the step the fastest run's (a slower one met the host's other work, as
  // Python's timeit takes the best of its repeats), the peak their largest; measured.ran
  // false where a run did not complete (measured.error says why).
  Figures measured;
  std::vector<double> step_runs;  // each run's step
  double step_error = 0;     // (predicted - measured) / measured, against the fastest run
  double median_step = 0;    // the median run's step (of an even count, the mean of the two)
  double median_error = 0;   // (predicted - median_step) / median_step
  double spread = 0;         // (slowest - fastest) / median_step of its runs
  double memory_error = 0;
};
// measured[i]: each run of checked[i].
std::vector<PlanCheck> CheckPlan(const std::vector<Prediction>& checked,
                                 const std::vector<std::vector<Figures>>& measured);
// The check's table and verdict lines: every error against its target (step 15%, memory
// 10%), against the fastest run and against the median, and whether the layout ranked first
// is within 5% of the fastest measured; `held_out`'s lines after them.
std::string CheckTable(const std::vector<PlanCheck>& checks);
std::vector<std::string> CheckVerdict(const std::vector<PlanCheck>& checks,
                                      const std::vector<std::string>& held_out = {});

// plan.md and plan.json in `dir`.
absl::Status WritePlanReport(const std::string& dir, const PlanOptions& o, const Plan& plan,
                             const std::vector<PlanCheck>& checks,
                             const std::vector<std::string>& held_out, const std::string& date);

}  // namespace tools
}  // namespace tandem

#endif  // TANDEM_TOOLS_PLAN_H_
