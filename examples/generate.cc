// Samples text from a trained GPT, a token at a time with a key/value cache (model/generate.h):
//   bazel run //examples:generate -- --checkpoint=runs/tiny --prompt="The " --tokens=200
// --checkpoint is a run directory (its newest complete checkpoint; examples/train's newest
// file), its checkpoints/ directory, or one checkpoint (checkpoints/step-000300, or any file of it), written by any
// strategy and world size. The model comes from the checkpoint's own description of it; the
// ids the data had (below a padded vocabulary) from the run's job.conf or run.json. Tokens
// are bytes, or with --tokenizer a tokenizer.json's byte-level BPE.

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "launcher/flags.h"
#include "launcher/paths.h"
#include "model/generate.h"
#include "model/sharded_checkpoint.h"
#include "model/tokenizer.h"
#include "parallel/job.h"
#include "runtime/device.h"
#include "runtime/files.h"
#include "runtime/json.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, checkpoint, "",
          "a run directory (its newest complete checkpoint), its checkpoints/ directory, or one "
          "checkpoint: <run>/checkpoints/step-000300 or any file of it");
ABSL_FLAG(std::string, prompt, "\n", "the text generation continues (at least one token)");
ABSL_FLAG(int, tokens, 200,
          "tokens to generate; beyond the model's seq_len the context slides: when full, its "
          "last seq_len / 2 tokens are kept and run again from position 0");
ABSL_FLAG(double, temperature, 0.8, "logits are divided by it before sampling; 0: greedy");
ABSL_FLAG(int, top_k, 40, "sample among the k most likely tokens only; 0: all");
ABSL_FLAG(uint64_t, seed, 1, "seed of the sampling: the same seed gives the same text");
ABSL_FLAG(std::string, device, "auto",
          "auto (CUDA when a GPU is visible, else the CPU), cpu, cuda or cuda:N");
ABSL_FLAG(std::string, tokenizer, "",
          "a tokenizer.json (GPT-2's byte-level BPE) for a model trained on its token ids; "
          "without it tokens are bytes");
ABSL_FLAG(bool, benchmark, false,
          "also time generation without the cache (each token recomputes the forward over "
          "the context) and print tokens/s of both");

namespace tandem {
namespace {

// The ids of the run's data (0 when the run does not say): job.conf's vocab, else run.json's.
int DataVocab(const std::string& run_dir) {
  if (absl::StatusOr<std::string> text = ReadWholeFile(run_dir + "/" + kJobConfigFile); text.ok()) {
    if (absl::StatusOr<JobConfig> job = JobConfig::FromText(*text); job.ok()) return job->vocab;
  }
  if (absl::StatusOr<Json> run = ReadJsonFile(run_dir + "/run.json"); run.ok()) {
    return static_cast<int>(NumberOr(run->contains("config") ? (*run)["config"] : Json(), "vocab", 0));
  }
  return 0;
}

absl::Status Run() {
  const std::string user_dir = [] {
    const std::string bwd = launcher::BuildWorkingDirectory();
    return bwd.empty() ? std::string(".") : bwd;
  }();
  const std::string checkpoint_flag = absl::GetFlag(FLAGS_checkpoint);
  if (checkpoint_flag.empty()) {
    return absl::InvalidArgumentError(
        "--checkpoint is required: a run directory or one of its checkpoints");
  }
  const int tokens = absl::GetFlag(FLAGS_tokens);
  const double temperature = absl::GetFlag(FLAGS_temperature);
  const int top_k = absl::GetFlag(FLAGS_top_k);
  if (tokens < 0) return absl::InvalidArgumentError("--tokens must be >= 0");
  if (tokens == 0 && absl::GetFlag(FLAGS_benchmark)) {
    return absl::InvalidArgumentError("--benchmark times the tokens generated: give --tokens >= 1");
  }
  if (!(temperature >= 0)) return absl::InvalidArgumentError("--temperature must be >= 0");
  if (top_k < 0) return absl::InvalidArgumentError("--top-k must be >= 0 (0: every token)");
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  if (prompt.empty()) {
    return absl::InvalidArgumentError(
        "--prompt is empty: generation continues from at least one token (e.g. --prompt=$'\\n')");
  }

  // Everything the user gave is checked before the weights are read.
  const std::string path = launcher::AbsolutePath(user_dir, checkpoint_flag);
  ASSIGN_OR_RETURN(const std::string prefix, ResolveCheckpointArg(path));
  ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(prefix));
  ASSIGN_OR_RETURN(const ModelConfig model, ParseModelDescription(manifest.model));
  std::string device_name = absl::GetFlag(FLAGS_device);
  if (device_name == "auto") {
    std::string why;
    device_name = CudaDeviceCount(&why) > 0 ? "cuda" : "cpu";
    if (device_name == "cpu") std::fprintf(stderr, "generate: no GPU visible (%s): on the CPU\n", why.c_str());
  }
  ASSIGN_OR_RETURN(const Device device, ParseDevice(device_name));
  if (device.is_cuda()) {
    std::string why;
    if (CudaDeviceCount(&why) <= device.index()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--device=%s: no such CUDA device (%s); use --device=cpu", device.ToString(), why));
    }
  }
  BpeTokenizer tokenizer;
  const std::string tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  const bool bpe = !tokenizer_path.empty();
  if (bpe) {
    ASSIGN_OR_RETURN(tokenizer, BpeTokenizer::Load(launcher::AbsolutePath(user_dir, tokenizer_path)));
  }
  // The ids that may be generated: the data's, never a padded vocabulary's extra ids.
  const int data_vocab = DataVocab(launcher::DirOf(launcher::DirOf(prefix)));
  if (!bpe && data_vocab > 256) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the run trained on token ids (vocabulary %d), not bytes: pass --tokenizer=<the "
        "tokenizer.json its data was prepared with>",
        data_vocab));
  }
  int vocab = data_vocab <= 0 || data_vocab > model.vocab ? model.vocab : data_vocab;
  // Bytes are ids 0..255 whatever the model's vocabulary (gpt2-small's is padded past them).
  vocab = std::min(vocab, bpe ? tokenizer.size() : 256);
  std::vector<int32_t> prompt_ids;
  if (bpe) {
    ASSIGN_OR_RETURN(prompt_ids, tokenizer.Encode(prompt));
  } else {
    if (model.vocab < 256) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the model's vocabulary is %d ids, fewer than the 256 bytes: pass --tokenizer", model.vocab));
    }
    for (unsigned char b : prompt) prompt_ids.push_back(b);
  }
  for (int32_t id : prompt_ids) {
    if (id >= model.vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--prompt's token %d is outside the model's vocabulary of %d: is --tokenizer the one "
          "the data was prepared with?",
          id, model.vocab));
    }
  }

  ASSIGN_OR_RETURN(std::unique_ptr<GptWeights> weights, GptWeights::Create(model, device, 0));
  RETURN_IF_ERROR(LoadParamsByName(prefix, model, weights->layout(), weights->flat()));
  std::fprintf(stderr, "generate: %s, step %d of %s, on %s\n", model.ToString().c_str(),
               manifest.step, prefix.c_str(), device.ToString().c_str());

  GenerateOptions o;
  o.sampling.temperature = static_cast<float>(temperature);
  o.sampling.top_k = top_k;
  o.tokens = tokens;
  o.vocab = vocab;
  o.seed = absl::GetFlag(FLAGS_seed);
  // Bytes as they come; BPE ids as soon as they are whole UTF-8 where the tokenizer decodes.
  absl::Status decode = absl::OkStatus();
  auto print = [&](int32_t id) {
    if (!bpe) {
      std::fputc(static_cast<unsigned char>(id), stdout);
    } else if (absl::StatusOr<std::string> text = tokenizer.Decode({id}); text.ok()) {
      std::fwrite(text->data(), 1, text->size(), stdout);
    } else if (decode.ok()) {
      decode = text.status();
    }
    std::fflush(stdout);
  };
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  const absl::Time start = absl::Now();
  const std::clock_t cpu_start = std::clock();
  ASSIGN_OR_RETURN(std::vector<int32_t> out, Generate(*weights, prompt_ids, o, print));
  const double cached_s = absl::ToDoubleSeconds(absl::Now() - start);
  const double cached_cpu_s = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  std::fputc('\n', stdout);
  RETURN_IF_ERROR(decode);
  if (absl::GetFlag(FLAGS_benchmark)) {
    o.use_cache = false;
    const absl::Time full_start = absl::Now();
    const std::clock_t full_cpu_start = std::clock();
    ASSIGN_OR_RETURN(std::vector<int32_t> again, Generate(*weights, prompt_ids, o));
    const double full_s = absl::ToDoubleSeconds(absl::Now() - full_start);
    const double full_cpu_s = static_cast<double>(std::clock() - full_cpu_start) / CLOCKS_PER_SEC;
    // Wall time, and this process's CPU time (all its threads): on a shared machine the
    // second is the steadier measure of the work done.
    std::fprintf(stderr,
                 "generate: %d tokens after a %zu-token prompt on %s: %.1f tokens/s with the "
                 "key/value cache, %.1f tokens/s recomputing the forward (%.1fx); per token "
                 "%.2f ms and %.2f ms of CPU time (%.1fx)%s\n",
                 tokens, prompt_ids.size(), device.ToString().c_str(), tokens / cached_s,
                 tokens / full_s, full_s / cached_s, 1e3 * cached_cpu_s / tokens,
                 1e3 * full_cpu_s / tokens, full_cpu_s / cached_cpu_s,
                 again == out ? "; the same tokens" : "; the tokens differ (rounding)");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const tandem::launcher::FlagSet flags{
      "examples/generate.cc",
      {"checkpoint", "prompt", "tokens", "temperature", "top_k", "seed", "device", "tokenizer",
       "benchmark"}};
  bool help = false;
  const absl::Status parsed =
      tandem::launcher::ParseFlags(flags, std::vector<std::string>(argv + 1, argv + argc), &help);
  if (help) {
    std::fputs(tandem::launcher::HelpText(
                   flags,
                   "Usage: bazel run //examples:generate -- --checkpoint=<run dir> [flags]\n"
                   "Samples text from a trained GPT with a key/value cache (each new token runs\n"
                   "the model on one position) and prints the prompt and what follows.\n"
                   "  e.g. bazel run //examples:generate -- --checkpoint=runs/tiny "
                   "--prompt=\"The \" --tokens=200\n")
                   .c_str(),
               stdout);
    return 0;
  }
  if (!parsed.ok()) {
    for (absl::string_view line : absl::StrSplit(parsed.message(), '\n')) {
      std::fprintf(stderr, "generate: %s\n", std::string(line).c_str());
    }
    return 2;
  }
  const absl::Status s = tandem::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "generate: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
