// Byte-level token data: a text file read as bytes, cut into samples of seq_len + 1 tokens
// (inputs and next-byte targets), shuffled per epoch by seed. Training draws global batches
// from the endless sequence epoch 0, epoch 1, ...; a rank takes its contiguous share of each
// global batch, so across ranks every sample is seen exactly once per epoch. A position in
// that sequence (samples consumed) is all a checkpoint needs to resume the data exactly.
#ifndef TANDEM_MODEL_DATA_H_
#define TANDEM_MODEL_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class TokenDataset {
 public:
  // Reads `path`; a missing, empty or too-short file (fewer than seq_len + 1 bytes) is an
  // error naming the file and the fix; bytes >= vocab are an error too.
  static absl::StatusOr<TokenDataset> FromFile(const std::string& path, int seq_len, int vocab);
  // Random tokens (for benchmarks): `num_tokens` drawn from `seed`.
  static TokenDataset Synthetic(int64_t num_tokens, int seq_len, int vocab, uint64_t seed);
  // The default corpus: every file under /usr/share/common-licenses (present on every
  // Debian system), concatenated in name order.
  static absl::StatusOr<TokenDataset> Default(int seq_len, int vocab);

  int64_t num_samples() const { return num_samples_; }
  int seq_len() const { return seq_len_; }
  const std::string& source() const { return source_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }

  // Sample `i` of the dataset (unshuffled): seq_len inputs and seq_len targets.
  void Sample(int64_t i, int32_t* inputs, int32_t* targets) const;

 private:
  std::vector<uint8_t> tokens_;
  int seq_len_ = 0;
  int64_t num_samples_ = 0;
  std::string source_;
};

// Which samples each step takes: a pure function of (seed, position), no hidden state.
class DataOrder {
 public:
  DataOrder(int64_t num_samples, uint64_t seed) : n_(num_samples), seed_(seed) {}
  // The dataset index of the `position`-th sample of the endless shuffled sequence.
  int64_t SampleAt(int64_t position) const;

 private:
  int64_t n_;
  uint64_t seed_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

// Fills tokens/targets (rows x seq_len each) with rows [row_begin, row_begin + rows) of the
// global batch that starts at sample position `batch_start`.
void FillBatch(const TokenDataset& data, const DataOrder& order, int64_t batch_start,
               int64_t row_begin, int64_t rows, std::vector<int32_t>* tokens,
               std::vector<int32_t>* targets);

}  // namespace tandem

#endif  // TANDEM_MODEL_DATA_H_
