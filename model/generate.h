// Sampling text from a trained GPT, one token at a time with a key/value cache: after the
// prompt, each new token runs the model on one position (its embedding, per layer one row of
// LayerNorm, QKV, attention of one query over the cached keys, projection and MLP, then one
// row of the head), so a token costs O(T) rather than the O(T^2) of a forward over the whole
// sequence. The same code on the CPU and on CUDA: the ops of runtime/ops.h on one stream.
// Legend: T = positions in the cache, C = channels, V = vocabulary, NH = heads, hs = C / NH.
#ifndef TANDEM_MODEL_GENERATE_H_
#define TANDEM_MODEL_GENERATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/block.h"
#include "model/config.h"
#include "model/params.h"
#include "model/rng.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace tandem {

// A GPT's parameters (f32) on one device, laid out as BuildBlocks' blocks list them, with
// each block's views in its Params() order.
class GptWeights {
 public:
  // Parameters initialized from `seed` as training starts (InitializeParams); a checkpoint's
  // are loaded over them with LoadParamsByName(prefix, config, layout(), flat()).
  static absl::StatusOr<std::unique_ptr<GptWeights>> Create(const ModelConfig& config,
                                                            Device device, uint64_t seed);
  const ModelConfig& config() const { return config_; }
  Device device() const { return device_; }
  const ParamLayout& layout() const { return *layout_; }
  const Tensor& flat() const { return params_.flat(); }
  const std::vector<std::unique_ptr<Block>>& blocks() const { return blocks_; }
  // The views of block b's parameters (0: the embedding, 1..n_layer: the layers, then the
  // head).
  const std::vector<Tensor>& block(int b) const { return block_params_[b]; }

 private:
  GptWeights(const ModelConfig& c, Device d) : config_(c), device_(d) {}
  ModelConfig config_;
  Device device_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<ParamLayout> layout_;
  FlatBuffer params_;
  std::vector<std::vector<Tensor>> block_params_;
};

// The model run a position at a time: for each layer, the keys and values of every position
// so far, (NH, seq_len, hs) each, on the weights' device.
class KvCacheDecoder {
 public:
  static absl::StatusOr<std::unique_ptr<KvCacheDecoder>> Create(const GptWeights& weights);
  // Runs `token` at position position(): appends its keys and values to every layer's cache
  // and returns the logits (V) for the token after it, read on the host (a synchronization).
  // An error when the cache is full (position() == seq_len).
  absl::StatusOr<std::vector<float>> Step(int32_t token);
  // Positions in the cache: each Step adds one.
  int position() const { return position_; }
  // Empties the cache (the next Step is at position 0).
  void Reset() { position_ = 0; }

 private:
  explicit KvCacheDecoder(const GptWeights& w) : w_(w) {}
  const GptWeights& w_;
  Stream* stream_ = nullptr;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer, (NH, seq_len, hs)
  int position_ = 0;
};

// The logits (T, V) f32 of every position of `tokens` (1 <= T <= seq_len) by the training
// forward: the blocks' Forward over the whole sequence, then the head's LayerNorm and vocabulary
// projection (where the head block's Forward goes on to the loss). What generation without a
// cache recomputes for each new token.
absl::StatusOr<Tensor> FullForwardLogits(const GptWeights& weights,
                                         const std::vector<int32_t>& tokens);

struct SamplingOptions {
  float temperature = 0.8f;  // logits are divided by it; 0: greedy (the largest logit)
  int top_k = 40;            // only the k largest logits are drawn from; 0: every id
};

// The next token from `logits` (V): ids >= vocab (a padded vocabulary's) are never chosen.
// Greedy, or with temperature > 0 a draw from softmax(logits / temperature) over the top_k
// largest (ties to the lower id, as greedy), one rng.Next() per draw; top_k = 1 is greedy.
int32_t SampleToken(const std::vector<float>& logits, int vocab, const SamplingOptions& o,
                    Rng& rng);

struct GenerateOptions {
  SamplingOptions sampling;
  int tokens = 200;     // tokens to generate after the prompt
  int vocab = 0;        // ids [0, vocab) may be generated (0: the model's vocabulary)
  uint64_t seed = 1;    // of the sampling's Rng: one seed, one text
  bool use_cache = true;  // false: each token runs FullForwardLogits over the context
};

// Feeds `prompt` (at least one token) and generates o.tokens tokens, calling `on_token` with
// each as it is chosen. Beyond the model's seq_len the context slides: when it is full, only
// its last seq_len / 2 tokens are kept (run again from position 0 to refill the cache), so
// every token sees at least seq_len / 2 tokens before it and costs O(seq_len) amortized. With
// or without the cache the same contexts, so the same tokens up to rounding.
absl::StatusOr<std::vector<int32_t>> Generate(
    const GptWeights& weights, const std::vector<int32_t>& prompt, const GenerateOptions& o,
    const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace tandem

#endif  // TANDEM_MODEL_GENERATE_H_
