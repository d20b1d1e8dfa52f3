// Checkpoints addressed by parameter name, so that one written by any strategy and world
// size loads into any other (data parallel to pipeline and back, 4 stages to 2). A
// checkpoint of step N in a directory is a set of shard files plus a manifest written last:
//
//   step-NNNNNN.ckpt            data parallel (rank 0) or one worker: every block
//   step-NNNNNN.stage-R.ckpt    pipeline / model parallel: stage R's blocks
//   step-NNNNNN.manifest        the shards (file, blocks, bytes, checksum), the writer's
//                               strategy and world size, model, optimizer, batch, step
//
// Each shard is a checkpoint file (model/checkpoint.h) written by SaveTrainingState: flat
// "params", "optimizer.0" and "optimizer.1" arrays over its blocks and a "layout" entry
// naming every parameter's offset and size in them. A checkpoint is complete when its
// manifest reads and every shard it lists is present, whole and the one listed; the newest
// complete one is what --resume=auto and restarts start from.
#ifndef TANDEM_MODEL_SHARDED_CHECKPOINT_H_
#define TANDEM_MODEL_SHARDED_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/params.h"
#include "model/trainer.h"

namespace tandem {

// "step-NNNNNN": the name every file of one checkpoint starts with.
std::string CheckpointName(int step);
// "<dir>/step-NNNNNN": the prefix every file of one checkpoint starts with.
std::string CheckpointPrefixFor(const std::string& dir, int step);
// "<prefix>.manifest".
std::string ManifestPath(const std::string& prefix);
// The step of a prefix or of any of its files ("…/step-000012.stage-1.ckpt" -> 12); -1 if
// the name is not a checkpoint's.
int CheckpointStep(const std::string& path);

// One parameter of a shard: where its values sit in the shard's flat arrays.
struct ShardParam {
  std::string name;
  int64_t offset = 0;
  int64_t numel = 0;
};
// The "layout" metadata entry: "name:offset:numel" for each parameter, comma-separated;
// those within the first `skip` elements (a last stage's copy of the tied table, which the
// first stage's shard holds) left out and the others' offsets counted from `skip`.
std::string FormatShardLayout(const ParamLayout& layout, int64_t skip = 0);
absl::StatusOr<std::vector<ShardParam>> ParseShardLayout(const std::string& text);

// One shard as the manifest lists it.
struct ShardRecord {
  std::string file;      // file name, in the manifest's directory
  int block_begin = 0;   // the model blocks it holds, [begin, end)
  int block_end = 0;
  int64_t bytes = 0;
  uint64_t checksum = 0;
};

struct Manifest {
  int step = 0;
  std::string strategy;  // the writer's
  int world_size = 1;    // the writer's
  std::string model;     // ModelConfig::ToString()
  std::string optimizer;
  int batch = 0;
  uint64_t seed = 0;
  std::vector<ShardRecord> shards;
};

// Writes <prefix>.manifest atomically, with a checksum (a checkpoint file without arrays).
absl::Status WriteManifest(const std::string& prefix, const Manifest& m);
// Reads <prefix>.manifest; where there is none but a lone <prefix>.ckpt holding every block
// (one worker, examples/train), a manifest describing that file. Errors name the file.
absl::StatusOr<Manifest> ReadManifest(const std::string& prefix);

// Checks that every shard the manifest lists is present, whole (read in full, checksum
// verified) and the one listed (size and checksum as in the manifest), and that together
// they hold every block of the model once. The error names the shard and the manifest.
// `each`, if given, sees every shard (its path and contents) as it is read, in the
// manifest's order; its error ends the verification.
absl::Status VerifyCheckpoint(
    const std::string& prefix, const Manifest& m,
    const std::function<absl::Status(const std::string&, const CheckpointData&)>& each = nullptr);

// The newest complete checkpoint (manifest and shards verified) in `dir`, as a prefix;
// NotFound when there is none. Each newer checkpoint passed over adds a line saying why to
// `passed_over`, if given.
absl::StatusOr<std::string> FindLatestCheckpoint(const std::string& dir,
                                                 std::vector<std::string>* passed_over = nullptr);

// The checkpoint prefix a tool's --checkpoint=`path` names: a run directory or its
// checkpoints/ (the newest complete checkpoint; where none has a manifest, the newest lone
// step-NNNNNN.ckpt, as examples/train writes them), or one checkpoint (its prefix or any of its
// files). The error names the flag and says what to give.
absl::StatusOr<std::string> ResolveCheckpointArg(const std::string& path);

// Every parameter of checkpoint `prefix` by name, gathered from all of its shards (read once,
// as VerifyCheckpoint checks them), for tools that read a model without building it
// (tools/export). `manifest`, if given, receives the checkpoint's manifest, and `meta` the
// metadata of its first shard (SaveTrainingState's entries). The error names the shard.
absl::StatusOr<std::map<std::string, std::vector<float>>> ReadCheckpointParams(
    const std::string& prefix, Manifest* manifest = nullptr,
    std::map<std::string, std::string>* meta = nullptr);

// The part of a stage's flat buffer an optimizer's state covers: all of it, or, under
// ZeRO-1, one data-parallel rank's shard [begin, end).
struct StateRange {
  int64_t begin = 0;
  int64_t end = -1;  // -1: to the end
};

// The training state of one stage, assembled from shards by parameter name (a last stage's
// copy of the tied table from the shard holding the embedding): the stage's
// parameters and optimizer state are found, each by its name, in whichever shards hold them
// (written by any strategy and world size, with ZeRO-1 or without: a checkpoint holds the
// whole state), after checking model, optimizer and batch. The optimizer receives `range` of
// its state. On any error nothing is changed. `shards` pairs each shard's path (for
// messages) with its contents; `what` names the checkpoint in messages.
absl::Status LoadStateFromShards(
    const std::vector<std::pair<std::string, const CheckpointData*>>& shards,
    const std::string& what, const TrainConfig& c, Stage& stage, Optimizer* optimizer,
    LossScaler* scaler, int* step, StateRange range = {});

// Loads a stage's state from checkpoint `prefix`: reads the manifest and only the shards
// holding the stage's blocks, refusing a missing, corrupt or foreign shard by name before
// anything changes.
absl::Status LoadShardedTrainingState(const std::string& prefix, const TrainConfig& c,
                                      Stage& stage, Optimizer* optimizer, LossScaler* scaler,
                                      int* step, StateRange range = {});

// The model's parameters alone from checkpoint `prefix` (written by any strategy and world
// size), each found by its name, into `params` (f32, laid out by `layout`, on any device): for
// inference, which needs no optimizer state. Refuses, before anything changes, a checkpoint of
// another model than `model` or one missing a parameter of the layout, naming it.
absl::Status LoadParamsByName(const std::string& prefix, const ModelConfig& model,
                              const ParamLayout& layout, const Tensor& params);

}  // namespace tandem

#endif  // TANDEM_MODEL_SHARDED_CHECKPOINT_H_
