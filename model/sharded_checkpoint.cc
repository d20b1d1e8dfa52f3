// Name-addressed checkpoints: shard layouts, the manifest, verification, finding the newest
// complete checkpoint of a directory, and loading a stage's state from whichever shards hold
// its parameters.
#include "model/sharded_checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/files.h"
#include "runtime/status.h"

namespace tandem {
namespace {

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool ParseBlocks(const std::string& text, int* begin, int* end) {
  std::vector<std::string> parts = absl::StrSplit(text, '-');
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], begin) &&
         absl::SimpleAtoi(parts[1], end) && *begin >= 0 && *begin < *end;
}

// The manifest's own metadata entries.
constexpr char kFormat[] = "tandem-manifest-1";

// Reads and checks one shard against its manifest record.
absl::StatusOr<CheckpointData> ReadShard(const std::string& dir, const ShardRecord& s,
                                         const std::string& manifest) {
  const std::string path = absl::StrCat(dir, "/", s.file);
  if (!PathExists(path)) {
    return absl::NotFoundError(absl::StrFormat(
        "checkpoint shard %s is missing (listed in %s); the checkpoint is incomplete: resume "
        "from an earlier checkpoint",
        path, manifest));
  }
  absl::StatusOr<CheckpointFileInfo> info = StatCheckpoint(path);
  if (!info.ok()) {
    return absl::Status(info.status().code(),
                        absl::StrCat(info.status().message(), " (listed in ", manifest, ")"));
  }
  if (s.bytes > 0 && (info->bytes != s.bytes || info->checksum != s.checksum)) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint shard %s is not the one %s lists (%d bytes, checksum %016x; the manifest "
        "says %d bytes, %016x); it was not loaded",
        path, manifest, info->bytes, info->checksum, s.bytes, s.checksum));
  }
  absl::StatusOr<CheckpointData> d = ReadCheckpoint(path);
  if (!d.ok()) {
    return absl::Status(d.status().code(),
                        absl::StrCat(d.status().message(), " (a shard of ", manifest, ")"));
  }
  return d;
}

}  // namespace

std::string CheckpointName(int step) { return absl::StrFormat("step-%06d", step); }

std::string CheckpointPrefixFor(const std::string& dir, int step) {
  return absl::StrCat(dir, "/", CheckpointName(step));
}

std::string ManifestPath(const std::string& prefix) { return prefix + ".manifest"; }

int CheckpointStep(const std::string& path) {
  const std::string base = BaseOf(path);
  if (!absl::StartsWith(base, "step-")) return -1;
  size_t end = 5;
  while (end < base.size() && base[end] >= '0' && base[end] <= '9') ++end;
  int step;
  if (end == 5 || !absl::SimpleAtoi(base.substr(5, end - 5), &step)) return -1;
  const std::string rest = base.substr(end);
  if (!rest.empty() && rest != ".ckpt" && rest != ".manifest" &&
      !(absl::StartsWith(rest, ".stage-") && absl::EndsWith(rest, ".ckpt"))) {
    return -1;
  }
  return step;
}

std::string FormatShardLayout(const ParamLayout& layout, int64_t skip) {
  std::string out;
  for (const ParamEntry& e : layout.entries()) {
    if (e.offset < skip) continue;
    absl::StrAppend(&out, out.empty() ? "" : ",", e.spec.name, ":", e.offset - skip, ":",
                    e.spec.shape.numel());
  }
  return out;
}

absl::StatusOr<std::vector<ShardParam>> ParseShardLayout(const std::string& text) {
  std::vector<ShardParam> params;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(item, ':');
    ShardParam p;
    if (f.size() != 3 || f[0].empty() || !absl::SimpleAtoi(f[1], &p.offset) ||
        !absl::SimpleAtoi(f[2], &p.numel) || p.offset < 0 || p.numel < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("bad layout entry '%s'", item));
    }
    p.name = f[0];
    params.push_back(std::move(p));
  }
  return params;
}

absl::Status WriteManifest(const std::string& prefix, const Manifest& m) {
  CheckpointData d;
  d.meta["format"] = kFormat;
  d.meta["step"] = absl::StrCat(m.step);
  d.meta["strategy"] = m.strategy;
  d.meta["world_size"] = absl::StrCat(m.world_size);
  d.meta["model"] = m.model;
  d.meta["optimizer"] = m.optimizer;
  d.meta["batch"] = absl::StrCat(m.batch);
  d.meta["seed"] = absl::StrCat(m.seed);
  d.meta["shards"] = absl::StrCat(m.shards.size());
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const ShardRecord& s = m.shards[i];
    const std::string k = absl::StrCat("shard.", i, ".");
    d.meta[k + "file"] = s.file;
    d.meta[k + "blocks"] = absl::StrCat(s.block_begin, "-", s.block_end);
    d.meta[k + "bytes"] = absl::StrCat(s.bytes);
    d.meta[k + "checksum"] = absl::StrFormat("%016x", s.checksum);
  }
  return WriteCheckpoint(ManifestPath(prefix), d);
}

absl::StatusOr<Manifest> ReadManifest(const std::string& prefix) {
  const std::string path = ManifestPath(prefix);
  Manifest m;
  if (!PathExists(path)) {
    // A lone file holding the whole model (one worker) is a checkpoint of one shard.
    const std::string lone = prefix + ".ckpt";
    if (!PathExists(lone)) {
      return absl::NotFoundError(absl::StrFormat(
          "checkpoint %s does not exist (neither %s nor %s)", prefix, path, lone));
    }
    ASSIGN_OR_RETURN(CheckpointData d, ReadCheckpoint(lone));
    ShardRecord s;
    s.file = BaseOf(lone);
    ASSIGN_OR_RETURN(std::string blocks, d.Meta("blocks"));
    if (!ParseBlocks(blocks, &s.block_begin, &s.block_end)) {
      return CorruptCheckpointError(lone, absl::StrCat("bad blocks entry '", blocks, "'"));
    }
    std::string step, batch;
    ASSIGN_OR_RETURN(step, d.Meta("step"));
    ASSIGN_OR_RETURN(batch, d.Meta("batch"));
    ASSIGN_OR_RETURN(m.model, d.Meta("model"));
    ASSIGN_OR_RETURN(m.optimizer, d.Meta("optimizer"));
    if (!absl::SimpleAtoi(step, &m.step) || !absl::SimpleAtoi(batch, &m.batch)) {
      return CorruptCheckpointError(lone, "bad step or batch entry");
    }
    absl::StatusOr<std::string> seed = d.Meta("seed");
    if (seed.ok()) (void)absl::SimpleAtoi(*seed, &m.seed);
    m.strategy = d.meta.count("strategy") ? d.meta["strategy"] : "data";
    m.world_size = 1;
    m.shards.push_back(s);  // bytes 0: nothing to compare against
    return m;
  }
  ASSIGN_OR_RETURN(CheckpointData d, ReadCheckpoint(path));
  auto get = [&](const std::string& key) -> absl::StatusOr<std::string> {
    auto it = d.meta.find(key);
    if (it == d.meta.end()) return CorruptCheckpointError(path, absl::StrCat("no '", key, "' entry"));
    return it->second;
  };
  ASSIGN_OR_RETURN(std::string format, get("format"));
  if (format != kFormat) return CorruptCheckpointError(path, absl::StrCat("unknown format '", format, "'"));
  std::string step, world, batch, seed, count;
  ASSIGN_OR_RETURN(step, get("step"));
  ASSIGN_OR_RETURN(world, get("world_size"));
  ASSIGN_OR_RETURN(batch, get("batch"));
  ASSIGN_OR_RETURN(seed, get("seed"));
  ASSIGN_OR_RETURN(count, get("shards"));
  ASSIGN_OR_RETURN(m.strategy, get("strategy"));
  ASSIGN_OR_RETURN(m.model, get("model"));
  ASSIGN_OR_RETURN(m.optimizer, get("optimizer"));
  int n = 0;
  if (!absl::SimpleAtoi(step, &m.step) || !absl::SimpleAtoi(world, &m.world_size) ||
      !absl::SimpleAtoi(batch, &m.batch) || !absl::SimpleAtoi(seed, &m.seed) ||
      !absl::SimpleAtoi(count, &n) || n < 1) {
    return CorruptCheckpointError(path, "bad number");
  }
  for (int i = 0; i < n; ++i) {
    const std::string k = absl::StrCat("shard.", i, ".");
    ShardRecord s;
    std::string blocks, bytes, checksum;
    ASSIGN_OR_RETURN(s.file, get(k + "file"));
    ASSIGN_OR_RETURN(blocks, get(k + "blocks"));
    ASSIGN_OR_RETURN(bytes, get(k + "bytes"));
    ASSIGN_OR_RETURN(checksum, get(k + "checksum"));
    if (s.file.empty() || s.file.find('/') != std::string::npos ||
        !ParseBlocks(blocks, &s.block_begin, &s.block_end) ||
        !absl::SimpleAtoi(bytes, &s.bytes) || !absl::SimpleHexAtoi(checksum, &s.checksum)) {
      return CorruptCheckpointError(path, absl::StrCat("bad entry for shard ", i));
    }
    m.shards.push_back(std::move(s));
  }
  return m;
}

absl::Status VerifyCheckpoint(
    const std::string& prefix, const Manifest& m,
    const std::function<absl::Status(const std::string&, const CheckpointData&)>& each) {
  const std::string manifest = ManifestPath(prefix);
  const std::string dir = DirOf(prefix);
  std::vector<std::pair<int, int>> blocks;
  int model_blocks = -1;
  for (const ShardRecord& s : m.shards) {
    ASSIGN_OR_RETURN(CheckpointData d, ReadShard(dir, s, manifest));
    const std::string path = absl::StrCat(dir, "/", s.file);
    absl::StatusOr<std::string> step = d.Meta("step");
    if (!step.ok() || *step != absl::StrCat(m.step)) {
      return absl::DataLossError(absl::StrFormat(
          "checkpoint shard %s is not of step %d (listed in %s)", path, m.step, manifest));
    }
    if (absl::StatusOr<std::string> total = d.Meta("model_blocks"); total.ok()) {
      (void)absl::SimpleAtoi(*total, &model_blocks);
    }
    if (each) RETURN_IF_ERROR(each(path, d));
    blocks.push_back({s.block_begin, s.block_end});
  }
  std::sort(blocks.begin(), blocks.end());
  int next = 0;
  for (const auto& [b, e] : blocks) {
    if (b != next) {
      return absl::DataLossError(absl::StrFormat(
          "checkpoint %s: its shards do not hold every block once (block %d %s)", manifest,
          std::min(b, next), b > next ? "is missing" : "is held twice"));
    }
    next = e;
  }
  if (model_blocks >= 0 && next != model_blocks) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint %s: its shards hold blocks 0-%d of the model's %d", manifest, next,
        model_blocks));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FindLatestCheckpoint(const std::string& dir,
                                                 std::vector<std::string>* passed_over) {
  std::vector<int> steps;
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (!absl::EndsWith(name, ".manifest")) continue;
      const int step = CheckpointStep(name);
      if (step >= 0) steps.push_back(step);
    }
    closedir(d);
  }
  std::sort(steps.rbegin(), steps.rend());
  for (int step : steps) {
    const std::string prefix = CheckpointPrefixFor(dir, step);
    absl::StatusOr<Manifest> m = ReadManifest(prefix);
    absl::Status s = m.ok() ? VerifyCheckpoint(prefix, *m) : m.status();
    if (s.ok()) return prefix;
    if (passed_over) passed_over->push_back(std::string(s.message()));
  }
  return absl::NotFoundError(absl::StrFormat("no complete checkpoint in %s", dir));
}

absl::StatusOr<std::map<std::string, std::vector<float>>> ReadCheckpointParams(
    const std::string& prefix, Manifest* manifest, std::map<std::string, std::string>* meta) {
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(prefix));
  std::map<std::string, std::vector<float>> params;
  bool first = true;
  auto gather = [&](const std::string& path, const CheckpointData& d) -> absl::Status {
    ASSIGN_OR_RETURN(std::string layout_text, d.Meta("layout"));
    absl::StatusOr<std::vector<ShardParam>> layout = ParseShardLayout(layout_text);
    if (!layout.ok()) return CorruptCheckpointError(path, std::string(layout.status().message()));
    ASSIGN_OR_RETURN(const std::vector<float>* values, d.Array("params"));
    if (meta != nullptr && first) *meta = d.meta;
    first = false;
    for (const ShardParam& p : *layout) {
      if (p.offset + p.numel > static_cast<int64_t>(values->size())) {
        return CorruptCheckpointError(path, absl::StrFormat("parameter %s runs past the end of 'params'", p.name));
      }
      params[p.name].assign(values->begin() + p.offset, values->begin() + p.offset + p.numel);
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(VerifyCheckpoint(prefix, m, gather));
  if (manifest != nullptr) *manifest = std::move(m);
  return params;
}

absl::Status LoadStateFromShards(
    const std::vector<std::pair<std::string, const CheckpointData*>>& shards,
    const std::string& what, const TrainConfig& c, Stage& stage, Optimizer* optimizer,
    LossScaler* scaler, int* step, StateRange range) {
  if (shards.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("checkpoint %s: no shard to load", what));
  }
  const bool two_states = optimizer->state1().defined();
  // Where each parameter sits: the shard and the offset in its arrays.
  struct Source {
    const std::vector<float>* arrays[3] = {nullptr, nullptr, nullptr};
    int64_t offset = 0, numel = 0;
  };
  std::map<std::string, Source> by_name;
  std::string step_text, scale, good;
  for (const auto& shard : shards) {
    const std::string& path = shard.first;
    const CheckpointData* d = shard.second;
    auto expect = [&](const std::string& key, const std::string& want,
                      const std::string& fix) -> absl::Status {
      ASSIGN_OR_RETURN(std::string got, d->Meta(key));
      if (got != want) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "checkpoint %s is of %s '%s', not '%s'; %s", path, key, got, want, fix));
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(expect("model", c.model.ToString(), "pass the same --model and sizes"));
    RETURN_IF_ERROR(expect("optimizer", c.optimizer.kind, "pass the same --optimizer"));
    RETURN_IF_ERROR(expect("batch", absl::StrCat(c.batch), "pass the same --batch"));
    ASSIGN_OR_RETURN(std::string s, d->Meta("step"));
    if (step_text.empty()) {
      step_text = s;
      ASSIGN_OR_RETURN(scale, d->Meta("loss_scale"));
      ASSIGN_OR_RETURN(good, d->Meta("loss_scale_good_steps"));
    } else if (s != step_text) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint %s: shard %s is of step %s, not %s", what, path, s, step_text));
    }
    ASSIGN_OR_RETURN(std::string layout_text, d->Meta("layout"));
    absl::StatusOr<std::vector<ShardParam>> layout = ParseShardLayout(layout_text);
    if (!layout.ok()) return CorruptCheckpointError(path, std::string(layout.status().message()));
    const char* names[3] = {"params", "optimizer.0", "optimizer.1"};
    Source base;
    for (int a = 0; a < (two_states ? 3 : 2); ++a) {
      absl::StatusOr<const std::vector<float>*> v = d->Array(names[a]);
      if (!v.ok()) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "checkpoint %s has no '%s' array; pass the same --optimizer", path, names[a]));
      }
      base.arrays[a] = *v;
    }
    for (const ShardParam& p : *layout) {
      for (int a = 0; a < (two_states ? 3 : 2); ++a) {
        if (p.offset + p.numel > static_cast<int64_t>(base.arrays[a]->size())) {
          return CorruptCheckpointError(path, absl::StrFormat("parameter %s runs past the end of '%s'",
                                               p.name, names[a]));
        }
      }
      Source src = base;
      src.offset = p.offset;
      src.numel = p.numel;
      by_name[p.name] = src;
    }
  }
  // Every check before anything changes.
  const ParamLayout& layout = stage.layout();
  for (const ParamEntry& e : layout.entries()) {
    auto it = by_name.find(e.spec.name);
    if (it == by_name.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint %s holds no parameter '%s' (blocks %d-%d need it)", what, e.spec.name,
          stage.begin(), stage.end()));
    }
    // A checkpoint holds whole tensors; a tensor-parallel stage takes its part of each.
    const int64_t whole = e.spec.WholeShape().numel();
    if (it->second.numel != whole) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint %s: parameter '%s' has %d values, the model needs %d", what, e.spec.name,
          it->second.numel, whole));
    }
  }
  int new_step;
  float new_scale;
  int new_good;
  if (!absl::SimpleAtoi(step_text, &new_step) || !absl::SimpleAtof(scale, &new_scale) ||
      !absl::SimpleAtoi(good, &new_good)) {
    return CorruptCheckpointError(what, "bad step or loss scale entry");
  }
  const int64_t end = range.end < 0 ? layout.numel() : range.end;
  if (range.begin < 0 || end > layout.numel() || range.begin > end ||
      optimizer->state0().numel() != end - range.begin) {
    return absl::InternalError(absl::StrFormat(
        "loading %s: an optimizer state of %d elements for elements [%d, %d) of %d", what,
        optimizer->state0().numel(), range.begin, end, layout.numel()));
  }
  std::vector<Tensor> targets = {stage.params().flat(), optimizer->state0()};
  if (two_states) targets.push_back(optimizer->state1());
  for (size_t a = 0; a < targets.size(); ++a) {
    std::vector<float> host(layout.numel());
    for (const ParamEntry& e : layout.entries()) {
      const Source& src = by_name[e.spec.name];
      ExtractShard(e.spec, src.arrays[a]->data() + src.offset, host.data() + e.offset);
    }
    if (a > 0) host = std::vector<float>(host.begin() + range.begin, host.begin() + end);
    RETURN_IF_ERROR(CopyFromHost(targets[a], host));
  }
  *step = new_step;
  scaler->Restore(new_scale, new_good);
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(stage.device()));
  return stage.ParamsChanged(*s);
}

absl::Status LoadShardedTrainingState(const std::string& prefix, const TrainConfig& c,
                                      Stage& stage, Optimizer* optimizer, LossScaler* scaler,
                                      int* step, StateRange range) {
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(prefix));
  const std::string manifest = ManifestPath(prefix);
  if (m.model != c.model.ToString()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint %s is of model '%s', not '%s'; pass the same --model and sizes", prefix,
        m.model, c.model.ToString()));
  }
  const std::string dir = DirOf(prefix);
  std::vector<CheckpointData> data;
  std::vector<std::string> paths;
  data.reserve(m.shards.size());
  for (const ShardRecord& s : m.shards) {
    // Shards holding the stage's blocks, and the embedding's for a copy of the tied table.
    const bool copy = stage.embedding_copy_numel() > 0 && s.block_begin == 0;
    if (!copy && (s.block_end <= stage.begin() || s.block_begin >= stage.end())) continue;
    ASSIGN_OR_RETURN(CheckpointData d, ReadShard(dir, s, manifest));
    data.push_back(std::move(d));
    paths.push_back(absl::StrCat(dir, "/", s.file));
  }
  std::vector<std::pair<std::string, const CheckpointData*>> shards;
  for (size_t i = 0; i < data.size(); ++i) shards.push_back({paths[i], &data[i]});
  if (shards.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint %s has no shard holding blocks %d-%d", prefix, stage.begin(), stage.end()));
  }
  return LoadStateFromShards(shards, prefix, c, stage, optimizer, scaler, step, range);
}

absl::Status LoadParamsByName(const std::string& prefix, const ModelConfig& model,
                              const ParamLayout& layout, const Tensor& params) {
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(prefix));
  if (m.model != model.ToString()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint %s is of model '%s', not '%s'", prefix, m.model, model.ToString()));
  }
  const std::string dir = DirOf(prefix);
  std::vector<float> host(layout.numel());
  std::map<std::string, const ParamEntry*> wanted;
  for (const ParamEntry& e : layout.entries()) wanted[e.spec.name] = &e;
  for (const ShardRecord& s : m.shards) {
    const std::string path = absl::StrCat(dir, "/", s.file);
    ASSIGN_OR_RETURN(CheckpointData d, ReadShard(dir, s, ManifestPath(prefix)));
    ASSIGN_OR_RETURN(std::string layout_text, d.Meta("layout"));
    absl::StatusOr<std::vector<ShardParam>> shard_layout = ParseShardLayout(layout_text);
    if (!shard_layout.ok()) {
      return CorruptCheckpointError(path, std::string(shard_layout.status().message()));
    }
    ASSIGN_OR_RETURN(const std::vector<float>* values, d.Array("params"));
    for (const ShardParam& p : *shard_layout) {
      auto it = wanted.find(p.name);
      if (it == wanted.end()) continue;
      const ParamEntry& e = *it->second;
      if (p.numel != e.spec.shape.numel() ||
          p.offset + p.numel > static_cast<int64_t>(values->size())) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "checkpoint %s: parameter '%s' has %d values, the model needs %d", path, p.name,
            p.numel, e.spec.shape.numel()));
      }
      std::copy_n(values->data() + p.offset, p.numel, host.data() + e.offset);
      wanted.erase(it);
    }
  }
  if (!wanted.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint %s holds no parameter '%s'", prefix, wanted.begin()->first));
  }
  return CopyFromHost(params, host);
}

namespace {

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

absl::StatusOr<std::string> ResolveCheckpointArg(const std::string& path) {
  if (IsDir(path)) {
    const std::string dir =
        IsDir(path + "/checkpoints") ? path + "/checkpoints" : path;
    std::vector<std::string> passed_over;
    absl::StatusOr<std::string> latest = FindLatestCheckpoint(dir, &passed_over);
    if (!latest.ok() && passed_over.empty()) {
      // No manifest: examples/train writes lone step-NNNNNN.ckpt files.
      int newest = -1;
      if (DIR* d = opendir(dir.c_str())) {
        while (struct dirent* e = readdir(d)) {
          const std::string name = e->d_name;
          if (absl::EndsWith(name, ".ckpt") && !absl::StrContains(name, ".stage-")) {
            newest = std::max(newest, CheckpointStep(name));
          }
        }
        closedir(d);
      }
      if (newest >= 0) latest = CheckpointPrefixFor(dir, newest);
    }
    if (!latest.ok()) {
      return absl::NotFoundError(absl::StrFormat(
          "--checkpoint=%s: no complete checkpoint in %s%s; train with --checkpoint-every or "
          "name one checkpoint",
          path, dir, passed_over.empty() ? "" : " (" + absl::StrJoin(passed_over, "; ") + ")"));
    }
    return *latest;
  }
  const int step = CheckpointStep(path);
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--checkpoint=%s: name <run_dir>/checkpoints/step-N (or one of its files), or a run "
        "directory",
        path));
  }
  return CheckpointPrefixFor(path.substr(0, path.rfind('/') == std::string::npos ? 0 : path.rfind('/')), step);
}

}  // namespace tandem
