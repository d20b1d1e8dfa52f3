#include "parallel/job.h"

#include <functional>
#include <map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "model/data.h"

namespace tandem {
namespace {

// One table of fields drives both directions of the text form.
struct Field {
  const char* key;
  std::function<std::string(const JobConfig&)> get;
  std::function<bool(JobConfig&, const std::string&)> set;
};

template <typename T>
Field Num(const char* key, T JobConfig::*m) {
  return {key, [m](const JobConfig& c) { return absl::StrCat(c.*m); },
          [m](JobConfig& c, const std::string& v) {
            if constexpr (std::is_same_v<T, double>) {
              return absl::SimpleAtod(v, &(c.*m));
            } else {
              return absl::SimpleAtoi(v, &(c.*m));
            }
          }};
}

Field Str(const char* key, std::string JobConfig::*m) {
  return {key, [m](const JobConfig& c) { return c.*m; },
          [m](JobConfig& c, const std::string& v) {
            c.*m = v;
            return true;
          }};
}

Field Bool(const char* key, bool JobConfig::*m) {
  return {key, [m](const JobConfig& c) { return std::string(c.*m ? "true" : "false"); },
          [m](JobConfig& c, const std::string& v) { return absl::SimpleAtob(v, &(c.*m)); }};
}

const std::vector<Field>& Fields() {
  static const auto* fields = new std::vector<Field>{
      Str("strategy", &JobConfig::strategy),
      Num("workers", &JobConfig::workers),
      Str("device", &JobConfig::device),
      Str("model", &JobConfig::model),
      Num("n_layer", &JobConfig::n_layer),
      Num("d_model", &JobConfig::d_model),
      Num("n_head", &JobConfig::n_head),
      Num("seq_len", &JobConfig::seq_len),
      Str("attention", &JobConfig::attention),
      Bool("tie_embeddings", &JobConfig::tie_embeddings),
      Str("dtype", &JobConfig::dtype),
      Num("steps", &JobConfig::steps),
      Num("batch", &JobConfig::batch),
      Num("micro_batches", &JobConfig::micro_batches),
      Str("schedule", &JobConfig::schedule),
      Num("virtual_stages", &JobConfig::virtual_stages),
      Str("balance", &JobConfig::balance),
      Num("data_parallel", &JobConfig::data_parallel),
      Num("tensor_parallel", &JobConfig::tensor_parallel),
      Num("zero", &JobConfig::zero),
      Num("lr", &JobConfig::lr),
      Num("warmup", &JobConfig::warmup),
      Str("optimizer", &JobConfig::optimizer),
      Num("weight_decay", &JobConfig::weight_decay),
      Bool("decay_all", &JobConfig::decay_all),
      Num("clip_norm", &JobConfig::clip_norm),
      Num("seed", &JobConfig::seed),
      Str("data", &JobConfig::data),
      Str("data_format", &JobConfig::data_format),
      Num("vocab", &JobConfig::vocab),
      Bool("synthetic", &JobConfig::synthetic),
      Str("val_data", &JobConfig::val_data),
      Num("val_fraction", &JobConfig::val_fraction),
      Num("eval_every", &JobConfig::eval_every),
      Num("eval_batches", &JobConfig::eval_batches),
      Str("run_dir", &JobConfig::run_dir),
      Num("checkpoint_every", &JobConfig::checkpoint_every),
      Str("resume", &JobConfig::resume),
      Str("init_from", &JobConfig::init_from),
      Num("bucket_mb", &JobConfig::bucket_mb),
      Bool("overlap", &JobConfig::overlap),
      Bool("recompute", &JobConfig::recompute),
      Bool("sequence_parallel", &JobConfig::sequence_parallel),
      Num("heartbeat_timeout_s", &JobConfig::heartbeat_timeout_s),
      Bool("profile", &JobConfig::profile),
      Num("log_every", &JobConfig::log_every),
      Bool("debug_syncs", &JobConfig::debug_syncs),
  };
  return *fields;
}

}  // namespace

std::string JobConfig::ToText() const {
  std::string out;
  for (const Field& f : Fields()) absl::StrAppend(&out, f.key, "=", f.get(*this), "\n");
  return out;
}

absl::StatusOr<JobConfig> JobConfig::FromText(const std::string& text) {
  JobConfig c;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("job config line without '=': ", line));
    }
    const std::string key(line.substr(0, eq)), value(line.substr(eq + 1));
    bool known = false;
    for (const Field& f : Fields()) {
      if (key != f.key) continue;
      known = true;
      if (!f.set(c, value)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("job config: bad value '%s' for %s", value, key));
      }
    }
    if (!known) return absl::InvalidArgumentError(absl::StrCat("job config: unknown key ", key));
  }
  return c;
}

void JobConfig::ResolveVocab() {
  if (vocab != 0 || synthetic || data.empty()) return;
  absl::StatusOr<DataFormat> format = ParseDataFormat(data_format);
  if (!format.ok()) return;
  absl::StatusOr<DataInfo> info = InspectData(data, *format);
  if (info.ok()) vocab = info->vocab;
}

absl::StatusOr<ModelConfig> JobConfig::Model() const {
  absl::StatusOr<ModelConfig> m =
      ModelPreset(model, n_layer, d_model, n_head, seq_len, attention, tie_embeddings);
  if (!m.ok()) return m.status();
  if (vocab < 0 || vocab == 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--vocab=%d: need at least 2 (0: the data's, else the model's)", vocab));
  }
  if (vocab > 0) {
    m->vocab = PaddedVocab(vocab);
    m->data_vocab = vocab;  // the padded logits are masked out of the loss
  }
  absl::Status s = m->Validate();
  if (!s.ok()) return s;
  return m;
}

ProcessGrid JobConfig::Grid() const {
  const int tp = std::max(tensor_parallel, 1);
  absl::StatusOr<ProcessGrid> g = ProcessGrid::Make(
      workers, strategy == "data" ? workers / tp : data_parallel, tensor_parallel);
  if (g.ok()) return *g;
  ProcessGrid one;
  one.stages = std::max(workers, 1);
  return one;
}

int JobConfig::EffectiveMicroBatches() const {
  if (micro_batches > 0) return micro_batches;
  if (strategy != "pipeline") return 1;
  const ProcessGrid grid = Grid();
  const int share = batch / grid.replicas;
  // The interleaved schedule takes micro-batches in runs of one per stage.
  const int step = schedule == "interleaved" ? grid.stages : 1;
  for (int m = std::min(4 * grid.stages, share); m > 1; --m) {
    if (share % m == 0 && m % step == 0) return m;
  }
  return step;
}

absl::StatusOr<ParallelConfig> JobConfig::ToParallelConfig(Device dev) const {
  ParallelConfig p;
  absl::StatusOr<StrategyKind> kind = ParseStrategy(strategy);
  if (!kind.ok()) return kind.status();
  p.strategy = *kind;
  absl::StatusOr<ModelConfig> m = Model();
  if (!m.ok()) return m.status();
  TrainConfig& t = p.train;
  t.model = *m;
  absl::StatusOr<DType> dt = ParseDType(dtype);
  if (!dt.ok()) return dt.status();
  t.dtype = *dt;
  t.device = dev;
  t.steps = steps;
  t.batch = batch;
  t.micro_batches = EffectiveMicroBatches();
  t.seed = seed;
  t.data = data;
  absl::StatusOr<DataFormat> format = ParseDataFormat(data_format);
  if (!format.ok()) return format.status();
  t.data_format = *format;
  t.data_vocab = vocab;
  t.init_from = init_from;
  t.synthetic_data = synthetic;
  t.val_data = val_data;
  t.val_fraction = val_fraction;
  t.eval_every = eval_every;
  t.eval_batches = eval_batches;
  t.optimizer.kind = optimizer;
  t.optimizer.lr = static_cast<float>(lr);
  t.optimizer.warmup_steps = warmup;
  t.optimizer.total_steps = steps;
  t.optimizer.weight_decay = static_cast<float>(weight_decay);
  t.optimizer.decay_all = decay_all;
  t.optimizer.clip_norm = static_cast<float>(clip_norm);
  p.schedule = schedule;
  p.virtual_stages = virtual_stages;
  p.balance = balance;
  p.data_parallel = data_parallel;
  p.tensor_parallel = tensor_parallel;
  p.sequence_parallel = sequence_parallel;
  p.zero = zero;
  p.bucket_bytes = static_cast<int64_t>(bucket_mb * (1 << 20));
  p.overlap = overlap;
  p.recompute = recompute;
  return p;
}

absl::StatusOr<Device> JobConfig::WorkerDevice(int local_rank, int visible_gpus,
                                               const std::string& host) const {
  if (device != "cuda") return Device::Cpu();
  if (visible_gpus > 1 && local_rank >= visible_gpus) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "local rank %d on %s, which has %d GPUs visible: start at most %d workers on it (its "
        "slots in the hostfile, or Slurm's tasks per node)",
        local_rank, host, visible_gpus, visible_gpus));
  }
  return Device::Cuda(visible_gpus == 1 ? 0 : local_rank);
}

}  // namespace tandem
