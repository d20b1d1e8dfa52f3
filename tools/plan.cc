#include "tools/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/flags.h"
#include "launcher/job_flags.h"
#include "runtime/files.h"
#include "runtime/format.h"
#include "runtime/json.h"
#include "runtime/status.h"

// The model, --batch, --dtype, --optimizer, --seed and --steps are the launcher's flags
// (launcher/job_flags.cc; here --steps defaults to 20: steps of each checking run). These are
// the planner's own: --gpus, --device and --bucket-mb mean something else for the launcher.
ABSL_FLAG(bool, plan, false, "predict every layout instead of running the strategies");
ABSL_FLAG(int, gpus, 4, "devices (workers) to plan for");
ABSL_FLAG(std::string, device, "cpu",
          "cpu or cuda: the device kind the memory estimate is for, and where block times are "
          "measured without --block-times");
ABSL_FLAG(std::string, device_memory, "",
          "memory per device, e.g. 80GB or 141GB (GB = 2^30 bytes, as Tandem prints sizes); "
          "layouts that need more are left out (default: not checked)");
ABSL_FLAG(std::string, block_times, "",
          "read each block's forward, B and W times from this JSON file (written by "
          "--write-block-times on the target hardware) instead of measuring them here");
ABSL_FLAG(std::string, derive_block_times, "",
          "TFLOPS,MFU,TBps: derive the block times from FLOPs at this MFU of this peak, and "
          "memory-bound work at this bandwidth, e.g. 989,0.4,4.8 for an H200 in bf16 (for "
          "hardware not here, until a measured --block-times file replaces them)");
ABSL_FLAG(std::string, write_block_times, "", "write the block times used to this file");
ABSL_FLAG(std::string, link, "",
          "bandwidth_GBps,latency_us[,handover_us] of the links between devices, e.g. 450,3 "
          "(NVLink) or 50,5 (InfiniBand); handover_us: what a pipeline's transfer on its "
          "critical path takes beyond its alpha-beta time (default 0); default: measured here "
          "with as many CPU workers as --gpus (2 to 8)");
ABSL_FLAG(std::string, tp_link, "",
          "bandwidth_GBps,latency_us of the links within a node, which tensor parallelism's "
          "collectives take, e.g. 450,3 (NVLink) beside --link=50,5 (InfiniBand across nodes); "
          "default: --link's");
ABSL_FLAG(int, gpus_per_node, 8,
          "devices a node holds: tensor-parallel layouts take T up to this, a power of two "
          "dividing the heads (1: none)");
ABSL_FLAG(double, waiting_share, -1,
          "CPU workers on fewer cores than workers: the share of a computing worker's turn on "
          "the cores that a pipeline worker waiting on its neighbour takes, 0 to 1 (default: "
          "fitted here to a measured pipeline step where the plan's workers outnumber the "
          "cores (the fastest of --repeats runs of a pipeline through the launcher, under "
          "--no-run too; 0 where the plan has no pipeline), 0 otherwise)");
ABSL_FLAG(bool, run, true,
          "run the top 3 layouts and the best pure strategy they leave out, none of the "
          "shape the waiting share was fitted on, and report predicted against measured, "
          "against the fastest and the median of --repeats runs (--no-run: predict only, after the host's own timings: "
          "the link and, where CPU workers outnumber the cores, the waiting share)");
ABSL_FLAG(int, repeats, 5,
          "runs of each checked layout, the layouts taken in turns; the measured step is the "
          "fastest run's (a CPU host's other work slows a whole run at times; 5 as Python's "
          "timeit repeats)");
ABSL_FLAG(int, top, 10, "layouts in the ranked table");
ABSL_FLAG(std::string, bucket_mb, "25",
          "gradient bucket sizes to consider, in MB, comma-separated (e.g. 1,4,25)");
ABSL_FLAG(std::string, out, "", "output folder (default reports/<time> in the current directory)");

namespace tandem {
namespace tools {
namespace {

const launcher::FlagSet& PlanFlags() {
  static const auto* flags = new launcher::FlagSet{
      "tools/plan.cc",
      {"plan", "gpus", "model", "n_layer", "d_model", "n_head", "seq_len", "batch", "dtype",
       "device", "optimizer", "seed", "device_memory", "block_times", "derive_block_times",
       "write_block_times", "link", "tp_link", "gpus_per_node", "waiting_share",
       "run", "steps", "repeats", "top", "bucket_mb", "out"},
      {launcher::kJobFlagsFile},
      {{"steps", "20"}}};
  return *flags;
}

constexpr char kUsage[] =
    "Usage: bazel run //tools:compare -- --plan --gpus=N --model=M [flags]\n"
    "Predicts the step time and memory of every layout of N devices (D replicas x K stages,\n"
    "each schedule, micro-batches, recomputation, ZeRO-1, bucket size) from each block's\n"
    "measured forward, B and W times, a simulation of the schedule and an alpha-beta model of\n"
    "the links; leaves out what does not fit in --device-memory; prints the ranked table and\n"
    "writes plan.md and plan.json. Without --no-run it then runs the top 3 layouts and the\n"
    "best pure strategy they leave out through the launcher and reports predicted against\n"
    "measured. CPU workers that outnumber the cores: it first fits the share of a core a\n"
    "waiting pipeline worker keeps to runs of a pipeline (--no-run too; --waiting-share\n"
    "gives it instead), and then checks no layout of that pipeline's shape (D x K), saying\n"
    "which it held out.\n"
    "  e.g. bazel run //tools:compare -- --plan --gpus=64 --model=gpt2-small --batch=512 \\\n"
    "         --dtype=bf16 --device=cuda --device-memory=141GB --link=450,3 \\\n"
    "         --block-times=examples/block_times/gpt2-small-h200.json --no-run\n";

// "141GB" -> 141 * 2^30, in the binary units Tandem prints sizes in ("GiB" the same); a bare
// number is bytes.
absl::StatusOr<int64_t> ParseMemory(const std::string& text) {
  static const std::pair<const char*, double> kUnits[] = {
      {"tib", 1099511627776.0}, {"gib", 1073741824.0}, {"mib", 1048576.0}, {"kib", 1024.0},
      {"tb", 1099511627776.0},  {"gb", 1073741824.0},  {"mb", 1048576.0},  {"kb", 1024.0},
      {"b", 1}};
  std::string t = absl::AsciiStrToLower(text);
  double unit = 1;
  for (const auto& [suffix, factor] : kUnits) {
    if (absl::EndsWith(t, suffix)) {
      t.resize(t.size() - std::strlen(suffix));
      unit = factor;
      break;
    }
  }
  double v = 0;
  if (!absl::SimpleAtod(t, &v) || !(v > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--device-memory=%s: give a size such as 80GB or 141GB", text));
  }
  return static_cast<int64_t>(v * unit);
}

std::string Seconds(double s) {
  if (s >= 1) return absl::StrFormat("%.2f s", s);
  return absl::StrFormat("%.1f ms", s * 1e3);
}

std::string Share(double part, double whole) {
  return whole > 0 ? absl::StrFormat("%.0f%%", 100 * part / whole) : "-";
}

std::string Row(int rank, const Prediction& p) {
  return absl::StrFormat("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                         rank > 0 ? absl::StrCat(rank) : "-", p.layout.Name(), Seconds(p.step_s),
                         Share(p.compute_s, p.step_s), Share(p.bubble_s, p.step_s),
                         Share(p.exposed_comm_s, p.step_s), Share(p.tensor_comm_s, p.step_s),
                         Share(p.optimizer_s, p.step_s), FormatBytes(p.memory_bytes),
                         p.Reason());
}

// "8, 4, 2": the row counts the profile's blocks were timed at.
std::string ProfileRows(const BlockProfile& p) {
  std::vector<int> rows = {p.rows};
  for (auto it = p.more_rows.rbegin(); it != p.more_rows.rend(); ++it) rows.push_back(it->first);
  return absl::StrJoin(rows, ", ");
}

}  // namespace

bool WantsPlan(const std::vector<std::string>& args) {
  return std::find(args.begin(), args.end(), "--plan") != args.end();
}

namespace {

// The flags that say how the blocks and the link are timed and the waiting share: into *o,
// each problem into *problems.
void ReadTimingFlags(PlanOptions* o, std::vector<std::string>* problems) {
  o->block_times = absl::GetFlag(FLAGS_block_times);
  o->write_block_times = absl::GetFlag(FLAGS_write_block_times);
  if (const std::string d = absl::GetFlag(FLAGS_derive_block_times); !d.empty()) {
    const std::vector<std::string> v = absl::StrSplit(d, ',');
    o->derive.resize(3);
    if (v.size() != 3 || !absl::SimpleAtod(v[0], &o->derive[0]) ||
        !absl::SimpleAtod(v[1], &o->derive[1]) || !absl::SimpleAtod(v[2], &o->derive[2]) ||
        !(o->derive[0] > 0) || !(o->derive[1] > 0 && o->derive[1] <= 1) || !(o->derive[2] > 0)) {
      problems->push_back(absl::StrFormat(
          "--derive-block-times=%s: give TFLOPS,MFU,TBps, e.g. 989,0.4,4.8 (MFU in (0, 1])", d));
    }
    if (!o->block_times.empty()) {
      problems->push_back("--derive-block-times and --block-times: give one of them");
    }
  }
  o->link = absl::GetFlag(FLAGS_link);
  if (!o->link.empty()) {
    if (absl::Status s = ParseLink(o->link).status(); !s.ok()) {
      problems->push_back(std::string(s.message()));
    }
  }
  o->tp_link = absl::GetFlag(FLAGS_tp_link);
  if (!o->tp_link.empty()) {
    if (absl::Status s = ParseLink(o->tp_link).status(); !s.ok()) {
      problems->push_back(absl::StrCat("--tp-link: ", s.message()));
    }
  }
  o->gpus_per_node = absl::GetFlag(FLAGS_gpus_per_node);
  if (o->gpus_per_node < 1) {
    problems->push_back(absl::StrFormat("--gpus-per-node=%d: give 1 or more (1: no tensor "
                                        "parallelism)", o->gpus_per_node));
  }
  o->waiting_share = absl::GetFlag(FLAGS_waiting_share);
  if (o->waiting_share != -1 && !(o->waiting_share >= 0 && o->waiting_share <= 1)) {
    problems->push_back(absl::StrFormat(
        "--waiting-share=%g: give a share from 0 to 1, e.g. 0.3", o->waiting_share));
  }
}

// The model and training flags each checking run passes the launcher.
std::vector<std::string> ModelFlags(const JobConfig& job, const TrainConfig& t,
                                    const std::string& device, int steps) {
  std::vector<std::string> flags = {absl::StrCat("--model=", job.model),
                                    absl::StrCat("--batch=", t.batch),
                                    absl::StrCat("--dtype=", DTypeName(t.dtype)),
                                    absl::StrCat("--device=", device),
                                    absl::StrCat("--optimizer=", t.optimizer.kind),
                                    absl::StrCat("--seed=", t.seed),
                                    absl::StrCat("--steps=", steps)};
  for (const auto& [name, v] :
       {std::pair<const char*, int>{"n-layer", job.n_layer},
        {"d-model", job.d_model},
        {"n-head", job.n_head},
        {"seq-len", job.seq_len}}) {
    if (v != 0) flags.push_back(absl::StrFormat("--%s=%d", name, v));
  }
  return flags;
}

}  // namespace

std::optional<int> ParsePlanArgs(const std::vector<std::string>& args, PlanOptions* o) {
  o->args = args;
  bool help = false;
  if (absl::Status s = launcher::ParseFlags(PlanFlags(), args, &help); !s.ok()) {
    for (absl::string_view line : absl::StrSplit(s.message(), '\n')) {
      std::fprintf(stderr, "compare --plan: %s\n", std::string(line).c_str());
    }
    return 2;
  }
  if (help) {
    std::fputs(launcher::HelpText(PlanFlags(), kUsage).c_str(), stdout);
    return 0;
  }
  std::vector<std::string> problems;
  auto problem = [&](const absl::Status& s) {
    if (!s.ok()) problems.push_back(std::string(s.message()));
  };
  PlanRequest& r = o->request;
  JobConfig job;  // the launcher's flags the plan takes
  launcher::JobFlagsInto(&job);
  r.gpus = absl::GetFlag(FLAGS_gpus);
  if (r.gpus < 1) problems.push_back("--gpus: plan for at least 1 device");
  TrainConfig& t = r.base.train;
  absl::StatusOr<ModelConfig> model =
      ModelPreset(job.model, job.n_layer, job.d_model, job.n_head, job.seq_len, "standard");
  if (model.ok()) {
    t.model = *model;
    problem(t.model.Validate());
  } else {
    problem(model.status());
  }
  t.batch = job.batch;
  if (t.batch < 1) problems.push_back("--batch: give at least 1 sample");
  if (absl::StatusOr<DType> d = ParseDType(job.dtype); d.ok()) {
    t.dtype = *d;
  } else {
    problem(d.status());
  }
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cpu" || device == "cuda") {
    t.device = device == "cpu" ? Device::Cpu() : Device::Cuda(0);
  } else {
    problems.push_back(absl::StrFormat("--device=%s: use cpu or cuda", device));
  }
  t.optimizer.kind = job.optimizer;
  if (t.optimizer.kind != "adamw" && t.optimizer.kind != "sgd") {
    problems.push_back(absl::StrFormat("--optimizer=%s: use adamw or sgd", t.optimizer.kind));
  }
  t.seed = job.seed;
  if (const std::string m = absl::GetFlag(FLAGS_device_memory); !m.empty()) {
    absl::StatusOr<int64_t> bytes = ParseMemory(m);
    if (bytes.ok()) r.device_memory = *bytes;
    problem(bytes.status());
  }
  r.bucket_bytes.clear();
  for (absl::string_view mb : absl::StrSplit(absl::GetFlag(FLAGS_bucket_mb), ',')) {
    double v = 0;
    if (!absl::SimpleAtod(mb, &v) || !(v > 0)) {
      problems.push_back(absl::StrFormat(
          "--bucket-mb=%s: give sizes in MB, comma-separated, e.g. 1,4,25",
          absl::GetFlag(FLAGS_bucket_mb)));
      break;
    }
    r.bucket_bytes.push_back(static_cast<int64_t>(v * (1 << 20)));
  }
  ReadTimingFlags(o, &problems);
  o->run = absl::GetFlag(FLAGS_run);
  o->steps = job.steps;
  o->repeats = absl::GetFlag(FLAGS_repeats);
  o->top = absl::GetFlag(FLAGS_top);
  o->out_dir = absl::GetFlag(FLAGS_out);
  if (o->run && t.device.is_cuda() && CudaDeviceCount() < r.gpus) {
    problems.push_back(absl::StrFormat(
        "--device=cuda: checking runs need %d GPUs here; add --no-run to predict only",
        r.gpus));
  }
  if (o->block_times.empty() && o->derive.empty() && t.device.is_cuda() &&
      CudaDeviceCount() < 1) {
    problems.push_back(
        "--device=cuda: no GPU here to time the blocks on; give --block-times=FILE written on "
        "the target hardware");
  }
  if (o->steps < 3) problems.push_back("--steps: the checking runs need at least 3 steps");
  if (o->repeats < 1) problems.push_back("--repeats: run each checked layout at least once");
  if (!problems.empty()) {
    for (const std::string& p : problems) std::fprintf(stderr, "compare --plan: %s\n", p.c_str());
    return 2;
  }
  o->model_flags = ModelFlags(job, t, device, o->steps);
  return std::nullopt;
}

int WorkersTimedHere(int gpus) { return std::clamp(gpus, 2, 8); }

absl::Status PreparePlan(PlanOptions* o, const std::optional<LinkModel>& measured_link) {
  PlanRequest& r = o->request;
  const TrainConfig& t = r.base.train;
  if (!o->block_times.empty()) {
    ASSIGN_OR_RETURN(r.profile, ReadBlockProfile(o->block_times));
  } else if (!o->derive.empty()) {
    ASSIGN_OR_RETURN(r.profile, DeriveBlockProfile(t.model, t.dtype, std::max(1, t.batch / r.gpus),
                                                   o->derive[0], o->derive[1], o->derive[2]));
  } else {
    // One micro-batch of a data-parallel replica's rows, and the smaller micro-batches the
    // layouts run (larger ones follow the line through the two largest). CPU workers compute
    // beside each other on the host's cores: the blocks are timed beside as many others.
    // And how far apart as many threads as workers (WorkersTimedHere) finish a pass each.
    const int peers = r.host_cores > 0 ? std::min(r.gpus, r.host_cores) - 1 : 0;
    const int crowd = r.host_cores > 0 && r.gpus >= 2 ? WorkersTimedHere(r.gpus) : 0;
    ASSIGN_OR_RETURN(r.profile, MeasureBlockProfile(t.model, t.device, t.dtype,
                                                    MicroBatchRows(t.batch, r.gpus),
                                                    t.optimizer.kind, t.seed, peers, crowd));
  }
  if (!o->write_block_times.empty()) {
    RETURN_IF_ERROR(WriteBlockProfile(r.profile, o->write_block_times));
  }
  if (o->waiting_share >= 0) {
    r.waiting_share = o->waiting_share;
    r.waiting_share_source = "given by --waiting-share";
  }
  if (!o->link.empty()) {
    ASSIGN_OR_RETURN(r.link, ParseLink(o->link));
  } else if (measured_link.has_value()) {
    r.link = *measured_link;
  } else {
    return absl::InvalidArgumentError(
        "no link model: give --link=bandwidth_GBps,latency_us[,handover_us]");
  }
  if (!o->tp_link.empty()) {
    ASSIGN_OR_RETURN(r.tp_link, ParseLink(o->tp_link));
  }
  r.gpus_per_node = o->gpus_per_node;
  return absl::OkStatus();
}

std::string PlanTable(const Plan& plan, int top) {
  std::string out =
      "| rank | layout | step | compute | bubble | exposed comm | tensor-parallel comm | "
      "optimizer | memory per device | why |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  const int n = std::min<int>(top, plan.ranked.size());
  for (int i = 0; i < n; ++i) absl::StrAppend(&out, Row(i + 1, plan.ranked[i]));
  for (const auto& [kind, i] : plan.best_pure) {
    if (static_cast<int>(i) >= n) {
      absl::StrAppend(&out, Row(static_cast<int>(i) + 1, plan.ranked[i]));  // not in the top
    }
  }
  return out;
}

std::vector<std::string> PlanNotes(const Plan& plan, const PlanRequest& r) {
  std::vector<std::string> notes = {
      absl::StrFormat("%d layouts of %d devices considered, %d fit%s.", plan.considered, r.gpus,
                      plan.ranked.size(),
                      r.device_memory >= 0
                          ? absl::StrCat(" in ", FormatBytes(r.device_memory), " per device")
                          : ""),
      absl::StrFormat("Block times: %s (%s, %s, %s rows a micro-batch; step overhead %s).",
                      r.profile.source, r.profile.device, r.profile.dtype, ProfileRows(r.profile),
                      Seconds(r.profile.step_overhead)),
      absl::StrFormat("Link: %s (alpha-beta; ring all-reduce, reduce-scatter, all-gather%s).",
                      r.link.ToString(),
                      r.link.reduce_scatter.bytes_per_s > 0 ? ", each timed on its own" : ""),
      r.tp_link.bytes_per_s > 0
          ? absl::StrFormat("Tensor-parallel link (within a node): %s.", r.tp_link.ToString())
          : "Tensor parallelism's collectives take the same link."};
  if (r.profile.finish_spread > 0) {
    notes.push_back(absl::StrFormat(
        "Finish spread: the last of %d threads computing alike ends %.1f%% after the cores, "
        "shared evenly, would have run them all; each step waits that share of its compute "
        "for its slowest worker.",
        r.profile.spread_threads, 100 * r.profile.finish_spread));
  }
  if (!r.waiting_share_source.empty()) {
    notes.push_back(absl::StrFormat(
        "Waiting share: a pipeline worker waiting on its neighbour takes %.2f of a computing "
        "worker's turn on the cores (%s).",
        r.waiting_share, r.waiting_share_source));
  }
  for (const auto& [reason, n] : plan.dropped) {
    notes.push_back(absl::StrFormat("Left out %d: %s.", n, reason));
  }
  for (const auto& [kind, i] : plan.best_pure) {
    const Prediction& p = plan.ranked[i];
    notes.push_back(absl::StrFormat("Best %s: %s, %s a step.", kind, p.layout.Name(),
                                    Seconds(p.step_s)));
  }
  return notes;
}

namespace {

// The indices in plan.ranked that the check runs, of those `eligible`: LayoutsToCheck's choice.
std::vector<size_t> ChooseChecks(const Plan& plan, const std::vector<bool>& eligible) {
  std::vector<size_t> out;
  auto add = [&](size_t i) {
    for (size_t j : out) {
      if (plan.ranked[j].layout.Name() == plan.ranked[i].layout.Name()) return;
    }
    out.push_back(i);
  };
  auto best = [&](auto&& wanted) -> std::optional<size_t> {
    for (size_t i = 0; i < plan.ranked.size(); ++i) {
      if (eligible[i] && wanted(plan.ranked[i].layout)) return i;
    }
    return std::nullopt;
  };
  for (size_t i = 0; i < plan.ranked.size() && out.size() < 3; ++i) {
    if (eligible[i]) add(i);
  }
  auto is_data = [](const tandem::Layout& l) { return l.strategy == StrategyKind::kData; };
  const bool has_data = std::any_of(out.begin(), out.end(),
                                    [&](size_t i) { return is_data(plan.ranked[i].layout); });
  const std::optional<size_t> data = best(is_data);
  if (data && !has_data) {
    add(*data);
    return out;
  }
  const bool any_pipeline = std::any_of(
      plan.ranked.begin(), plan.ranked.end(), [](const Prediction& p) {
        return p.layout.strategy == StrategyKind::kPipeline && p.layout.data_parallel == 1;
      });
  if (!any_pipeline) return out;
  const std::optional<size_t> pipe = best([](const tandem::Layout& l) {
    return l.strategy == StrategyKind::kPipeline && l.data_parallel == 1;
  });
  if (pipe) {
    add(*pipe);
    return out;
  }
  // The pipeline over every rank held out: the best of a shape the others have not.
  const std::optional<size_t> other = best([&](const tandem::Layout& l) {
    return std::none_of(out.begin(), out.end(), [&](size_t j) {
      const tandem::Layout& k = plan.ranked[j].layout;
      return k.data_parallel == l.data_parallel && k.stages == l.stages;
    });
  });
  if (other) add(*other);
  return out;
}

}  // namespace

CheckSelection LayoutsToCheck(const Plan& plan, const std::optional<tandem::Layout>& fitted) {
  std::vector<std::string> reasons(plan.ranked.size());
  std::vector<bool> eligible(plan.ranked.size(), true);
  if (fitted) {
    for (size_t i = 0; i < plan.ranked.size(); ++i) {
      reasons[i] = HeldOutReason(*fitted, plan.ranked[i].layout);
      eligible[i] = reasons[i].empty();
    }
  }
  CheckSelection out;
  for (size_t i : ChooseChecks(plan, eligible)) out.checked.push_back(plan.ranked[i]);
  for (size_t i : ChooseChecks(plan, std::vector<bool>(plan.ranked.size(), true))) {
    if (!eligible[i]) {
      out.held_out.push_back(absl::StrFormat("%s (ranked %d): %s", plan.ranked[i].layout.Name(),
                                             i + 1, reasons[i]));
    }
  }
  return out;
}

namespace {

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::vector<PlanCheck> CheckPlan(const std::vector<Prediction>& checked,
                                 const std::vector<std::vector<Figures>>& measured) {
  std::vector<PlanCheck> out;
  for (size_t i = 0; i < checked.size() && i < measured.size(); ++i) {
    if (measured[i].empty()) continue;
    PlanCheck c{checked[i], measured[i][0]};
    for (const Figures& f : measured[i]) {
      if (!f.ran) {
        c.measured = f;
        break;
      }
      c.step_runs.push_back(f.step_seconds);
      c.measured.peak_bytes = std::max(c.measured.peak_bytes, f.peak_bytes);
    }
    if (c.measured.ran) {
      const auto [lo, hi] = std::minmax_element(c.step_runs.begin(), c.step_runs.end());
      c.measured.step_seconds = *lo;
      c.median_step = MedianOf(c.step_runs);
      if (c.median_step > 0) {
        c.median_error = (c.predicted.step_s - c.median_step) / c.median_step;
        c.spread = (*hi - *lo) / c.median_step;
      }
    }
    if (c.measured.ran && c.measured.step_seconds > 0) {
      c.step_error = (c.predicted.step_s - c.measured.step_seconds) / c.measured.step_seconds;
    }
    if (c.measured.ran && c.measured.peak_bytes > 0) {
      c.memory_error = double(c.predicted.memory_bytes - c.measured.peak_bytes) /
                       double(c.measured.peak_bytes);
    }
    out.push_back(c);
  }
  return out;
}

std::string CheckTable(const std::vector<PlanCheck>& checks) {
  std::string out =
      "| layout | predicted step | fastest run | median run | spread of the runs | each run | "
      "error against the fastest | against the median | predicted memory | measured peak | "
      "error |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const PlanCheck& c : checks) {
    if (!c.measured.ran) {
      absl::StrAppend(&out, "| ", c.predicted.layout.Name(), " | ", Seconds(c.predicted.step_s),
                      " | a run failed: ", c.measured.error, " | | | | | | | | |\n");
      continue;
    }
    std::vector<std::string> runs;
    for (double s : c.step_runs) runs.push_back(Seconds(s));
    absl::StrAppend(
        &out, absl::StrFormat(
                  "| %s | %s | %s | %s | %.1f%% | %s | %+.1f%% | %+.1f%% | %s | %s | %+.1f%% |\n",
                  c.predicted.layout.Name(), Seconds(c.predicted.step_s),
                  Seconds(c.measured.step_seconds), Seconds(c.median_step), 100 * c.spread,
                  absl::StrJoin(runs, ", "), 100 * c.step_error, 100 * c.median_error,
                  FormatBytes(c.predicted.memory_bytes), FormatBytes(c.measured.peak_bytes),
                  100 * c.memory_error));
  }
  return out;
}

std::vector<std::string> CheckVerdict(const std::vector<PlanCheck>& checks,
                                      const std::vector<std::string>& held_out) {
  std::vector<std::string> out;
  double worst_step = 0, worst_median = 0, worst_spread = 0, worst_memory = 0, fastest = 0;
  int ran = 0;
  for (const PlanCheck& c : checks) {
    if (!c.measured.ran) continue;
    ++ran;
    worst_step = std::max(worst_step, std::abs(c.step_error));
    worst_median = std::max(worst_median, std::abs(c.median_error));
    worst_spread = std::max(worst_spread, c.spread);
    worst_memory = std::max(worst_memory, std::abs(c.memory_error));
    if (fastest == 0 || c.measured.step_seconds < fastest) fastest = c.measured.step_seconds;
  }
  if (ran == 0) {
    out.push_back("No checking run completed.");
  } else {
    out.push_back(absl::StrFormat(
        "Largest step-time error %.1f%% against the fastest run (target 15%%): %s; %.1f%% "
        "against the median run: %s; the runs of a layout spread up to %.1f%% of their "
        "median.",
        100 * worst_step, worst_step <= 0.15 ? "met" : "missed", 100 * worst_median,
        worst_median <= 0.15 ? "met" : "missed", 100 * worst_spread));
    out.push_back(absl::StrFormat("Largest memory error %.1f%% (target 10%%): %s.",
                                  100 * worst_memory, worst_memory <= 0.10 ? "met" : "missed"));
    if (checks[0].measured.ran) {
      const double behind = checks[0].measured.step_seconds / fastest - 1;
      out.push_back(absl::StrFormat(
          "The layout ranked first of those checked, %s, measured %.1f%% behind the fastest "
          "measured (target 5%%): %s.",
          checks[0].predicted.layout.Name(), 100 * behind, behind <= 0.05 ? "met" : "missed"));
    }
  }
  for (const std::string& h : held_out) out.push_back(absl::StrCat("Held out of the check: ", h, "."));
  return out;
}

absl::Status WritePlanReport(const std::string& dir, const PlanOptions& o, const Plan& plan,
                             const std::vector<PlanCheck>& checks,
                             const std::vector<std::string>& held_out, const std::string& date) {
  const PlanRequest& r = o.request;
  std::string command = "bazel run //tools:compare --";
  for (const std::string& a : o.args) absl::StrAppend(&command, " ", a);
  std::string md = absl::StrFormat("# Plan: %s on %d devices\n\n`%s`, %s\n\n",
                                   r.base.train.model.name, r.gpus, command, date);
  for (const std::string& n : PlanNotes(plan, r)) absl::StrAppend(&md, "- ", n, "\n");
  absl::StrAppend(&md, "\n## Ranked layouts\n\n", PlanTable(plan, o.top));
  if (!checks.empty()) {
    absl::StrAppend(&md, "\n## Predicted against measured\n\n", CheckTable(checks), "\n");
    for (const std::string& v : CheckVerdict(checks, held_out)) {
      absl::StrAppend(&md, "- ", v, "\n");
    }
  }
  Json j;
  j["command"] = command;
  j["date"] = date;
  j["gpus"] = r.gpus;
  j["model"] = r.base.train.model.ToString();
  j["considered"] = plan.considered;
  j["dropped"] = Json::object();
  for (const auto& [reason, n] : plan.dropped) j["dropped"][reason] = n;
  j["link"] = {{"bytes_per_second", JsonNumber(r.link.bytes_per_s)},
               {"latency_seconds", JsonNumber(r.link.latency_s)},
               {"handover_seconds", JsonNumber(r.link.handover_s)}};
  for (auto [name, pair] : {std::pair{"reduce_scatter", &r.link.reduce_scatter},
                            std::pair{"all_gather", &r.link.all_gather}}) {
    if (pair->bytes_per_s > 0) {
      j["link"][name] = {{"bytes_per_second", JsonNumber(pair->bytes_per_s)},
                         {"latency_seconds", JsonNumber(pair->latency_s)}};
    }
  }
  if (!r.waiting_share_source.empty()) {
    j["waiting_share"] = {{"share", JsonNumber(r.waiting_share)},
                          {"source", r.waiting_share_source}};
    if (r.waiting_share_fit) j["waiting_share"]["fitted_on"] = r.waiting_share_fit->Name();
  }
  j["held_out"] = Json::array();
  for (const std::string& h : held_out) j["held_out"].push_back(h);
  auto prediction = [](const Prediction& p) {
    return Json{{"layout", p.layout.Name()},
                {"flags", absl::StrJoin(p.layout.LauncherFlags(), " ")},
                {"step_seconds", JsonNumber(p.step_s)},
                {"compute_seconds", JsonNumber(p.compute_s)},
                {"bubble_seconds", JsonNumber(p.bubble_s)},
                {"exposed_comm_seconds", JsonNumber(p.exposed_comm_s)},
                {"tensor_comm_seconds", JsonNumber(p.tensor_comm_s)},
                {"optimizer_seconds", JsonNumber(p.optimizer_s)},
                {"sharing_seconds", JsonNumber(p.sharing_s)},
                {"spread_seconds", JsonNumber(p.spread_s)},
                {"memory_bytes", p.memory_bytes},
                {"reason", p.Reason()}};
  };
  j["ranked"] = Json::array();
  for (size_t i = 0; i < plan.ranked.size() && static_cast<int>(i) < o.top; ++i) {
    j["ranked"].push_back(prediction(plan.ranked[i]));
  }
  j["checks"] = Json::array();
  for (const PlanCheck& c : checks) {
    Json k = prediction(c.predicted);
    k["ran"] = c.measured.ran;
    if (c.measured.ran) {
      k["measured_step_seconds"] = JsonNumber(c.measured.step_seconds);
      k["measured_step_runs_seconds"] = Json::array();
      for (double s : c.step_runs) k["measured_step_runs_seconds"].push_back(JsonNumber(s));
      k["measured_median_step_seconds"] = JsonNumber(c.median_step);
      k["measured_step_spread"] = JsonNumber(c.spread);
      k["measured_peak_bytes"] = c.measured.peak_bytes;
      k["step_error"] = JsonNumber(c.step_error);
      k["median_step_error"] = JsonNumber(c.median_error);
      k["memory_error"] = JsonNumber(c.memory_error);
    } else {
      k["error"] = c.measured.error;
    }
    j["checks"].push_back(k);
  }
  RETURN_IF_ERROR(MakeDirs(dir));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/plan.md", md));
  return WriteFileAtomically(dir + "/plan.json", JsonText(j, JsonLayout::kObjects) + "\n");
}

}  // namespace tools
}  // namespace tandem
