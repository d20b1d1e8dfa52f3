// The flags of a job's model and training that the launcher, examples/train and
// compare --plan all take, each with its one help text and default (a program may give
// another default: FlagSet::defaults). Names use underscores here; users write them with
// hyphens (RewriteFlagName).
#include "launcher/job_flags.h"

#include <cstdint>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, model, "gpt-tiny",
          "gpt-tiny, gpt2-small (GPT-2 124M, tied: 124,475,904 parameters), or gpt / mlp sized "
          "by --n-layer, --d-model, --n-head, --seq-len");
ABSL_FLAG(int, n_layer, 0, "layers (0: the model's default)");
ABSL_FLAG(int, d_model, 0, "channels, or the MLP's width (0: the model's default)");
ABSL_FLAG(int, n_head, 0, "attention heads (0: the model's default)");
ABSL_FLAG(int, seq_len, 0, "tokens per sample (0: the model's default)");
ABSL_FLAG(std::string, attention, "standard",
          "GPT attention: standard (keeps the T x T probabilities for backward) or flash "
          "(keeps each row's log-sum-exp and recomputes them; O(T) memory per head)");
ABSL_FLAG(bool, tie_embeddings, false,
          "the output head's weight is the token embedding's table, as GPT-2's (on a pipeline the "
          "first and last stage each hold it and sum its gradients every step); gpt2-small, "
          "GPT-2 124M (124,475,904 parameters with its vocabulary padded to 50304; GPT-2's "
          "124,439,808 at 50257), is always tied");
ABSL_FLAG(std::string, dtype, "f32", "compute dtype: f32 (bf16 and f16 on CUDA only)");
ABSL_FLAG(int, steps, 100, "optimizer steps to train");
ABSL_FLAG(int, batch, 16, "global batch in samples, split across workers as the strategy needs");
ABSL_FLAG(double, lr, 3e-3, "peak learning rate");
ABSL_FLAG(int, warmup, 20, "linear learning-rate warmup steps");
ABSL_FLAG(std::string, optimizer, "adamw", "adamw or sgd");
ABSL_FLAG(double, weight_decay, 0.0,
          "decoupled weight decay (AdamW) / L2 (SGD), on the 2-D weight matrices and the token "
          "embedding only, as nanoGPT, Megatron and Hugging Face (--decay-all: every parameter)");
ABSL_FLAG(bool, decay_all, false,
          "apply --weight-decay to every parameter, biases, LayerNorm gains and the position "
          "table too (the old behaviour)");
ABSL_FLAG(double, clip_norm, 1.0, "clip gradients to this global L2 norm (0: off)");
ABSL_FLAG(uint64_t, seed, 1234, "seed of initialization and data order");
ABSL_FLAG(std::string, data, "",
          "text file (bytes) or token shards to train on, a file or a glob such as "
          "'data/*_train_*.bin' (llm.c's format, tools/prepare_data.py writes it); memory-mapped; "
          "empty: the files under /usr/share/common-licenses");
ABSL_FLAG(std::string, data_format, "auto",
          "auto (a file starting with llm.c's magic 20240520, or named *.bin, is an llm.c shard; "
          "others are text), text, llmc, or uint16 / uint32 for raw token arrays such as "
          "nanoGPT's train.bin");
ABSL_FLAG(int, vocab, 0,
          "the data's vocabulary: tokens must be below it; the model's is it padded to a "
          "multiple of 64 (GPT-2's 50257 to 50304, as llm.c) (0: an llm.c shard's kind, else "
          "the model's: 256 bytes, gpt2-small 50304)");
ABSL_FLAG(bool, synthetic, false, "random tokens instead of text (for benchmarks)");
ABSL_FLAG(std::string, val_data, "",
          "validation data: a file or glob in --data's formats (e.g. 'data/*_val_*.bin'); its "
          "loss is evaluated forward only, never trained on");
ABSL_FLAG(double, val_fraction, 0,
          "hold out the last F (0 < F < 1) of the training samples as validation data, never "
          "trained on (instead of --val-data)");
ABSL_FLAG(int, eval_every, -1,
          "steps between validation losses, and after the last step (0: none; default: 100 "
          "with --val-data or --val-fraction, else none)");
ABSL_FLAG(int, eval_batches, 4,
          "global batches (of --batch samples) each validation evaluates: the validation "
          "data's first ones, in order, the same every time");
ABSL_FLAG(int, checkpoint_every, 0,
          "steps between checkpoints; a run from its start also keeps its initial weights, as "
          "step 0 (0: none)");

namespace tandem {
namespace launcher {

const std::vector<std::string>& JobFlagNames() {
  static const auto* names = new std::vector<std::string>{
      "model", "n_layer", "d_model", "n_head", "seq_len", "attention", "tie_embeddings", "dtype",
      "steps", "batch", "lr", "warmup", "optimizer", "weight_decay", "decay_all", "clip_norm",
      "seed", "data", "data_format", "vocab", "synthetic", "val_data", "val_fraction",
      "eval_every", "eval_batches", "checkpoint_every"};
  return *names;
}

void JobFlagsInto(JobConfig* job) {
  job->model = absl::GetFlag(FLAGS_model);
  job->n_layer = absl::GetFlag(FLAGS_n_layer);
  job->d_model = absl::GetFlag(FLAGS_d_model);
  job->n_head = absl::GetFlag(FLAGS_n_head);
  job->seq_len = absl::GetFlag(FLAGS_seq_len);
  job->attention = absl::GetFlag(FLAGS_attention);
  job->tie_embeddings = absl::GetFlag(FLAGS_tie_embeddings);
  job->dtype = absl::GetFlag(FLAGS_dtype);
  job->steps = absl::GetFlag(FLAGS_steps);
  job->batch = absl::GetFlag(FLAGS_batch);
  job->lr = absl::GetFlag(FLAGS_lr);
  job->warmup = absl::GetFlag(FLAGS_warmup);
  job->optimizer = absl::GetFlag(FLAGS_optimizer);
  job->weight_decay = absl::GetFlag(FLAGS_weight_decay);
  job->decay_all = absl::GetFlag(FLAGS_decay_all);
  job->clip_norm = absl::GetFlag(FLAGS_clip_norm);
  job->seed = absl::GetFlag(FLAGS_seed);
  job->data = absl::GetFlag(FLAGS_data);
  job->data_format = absl::GetFlag(FLAGS_data_format);
  job->vocab = absl::GetFlag(FLAGS_vocab);
  job->synthetic = absl::GetFlag(FLAGS_synthetic);
  job->val_data = absl::GetFlag(FLAGS_val_data);
  job->val_fraction = absl::GetFlag(FLAGS_val_fraction);
  job->eval_every = absl::GetFlag(FLAGS_eval_every);
  job->eval_batches = absl::GetFlag(FLAGS_eval_batches);
  job->ResolveEvalEvery();  // --eval-every not given: decided by the validation data
  job->checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
}

}  // namespace launcher
}  // namespace tandem
