// Token data: a text file read as bytes, llm.c's token shards (a header of 256 int32: magic
// 20240520, version 1, token count; then uint16 tokens) or raw uint16 / uint32 token arrays
// (nanoGPT's train.bin), token files memory-mapped (read once at opening, to check every
// token against the vocabulary; a text file is read into memory as before). Each file is cut
// into samples of seq_len + 1 tokens (inputs and next-token targets), shuffled per epoch by
// seed. Training draws global batches
// from the endless sequence epoch 0, epoch 1, ...; a rank takes its contiguous share of each
// global batch, so across ranks every sample is seen exactly once per epoch. A position in
// that sequence (samples consumed) is all a checkpoint needs to resume the data exactly.
#ifndef TANDEM_MODEL_DATA_H_
#define TANDEM_MODEL_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// How --data's files hold tokens. kAuto: a file that starts with llm.c's magic is a shard, one
// named *.bin must be one, any other is text.
enum class DataFormat { kAuto, kText, kLlmc, kUint16, kUint32 };
// "auto", "text", "llmc", "uint16" or "uint32"; the error names the choices.
absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name);

// What --data names, from its files' names and headers alone.
struct DataInfo {
  std::vector<std::string> files;  // a glob's matches, in name order
  // The vocabulary its tokens come from: an llm.c shard's kind (GPT-2: 50257, or what the
  // header's fourth int records, as tools/prepare_data.py writes); 0 where the files do not
  // say (text: bytes, raw arrays), the model's then.
  int vocab = 0;
};
absl::StatusOr<DataInfo> InspectData(const std::string& path_or_glob, DataFormat format);

// The model's vocabulary for data of `vocab` tokens: rounded up to a multiple of 64, as llm.c
// pads GPT-2's 50257 to 50304, for tensor-core-friendly head matmuls. The padded ids are
// never targets.
int PaddedVocab(int vocab);

class TokenDataset {
 public:
  // Reads `path`; a missing, empty or too-short file (fewer than seq_len + 1 bytes) is an
  // error naming the file and the fix; bytes >= vocab are an error too.
  static absl::StatusOr<TokenDataset> FromFile(const std::string& path, int seq_len, int vocab);
  // Maps every file `path_or_glob` names, in `format`. Each bad file is one line: missing,
  // wrong magic, truncated, a token >= vocab, fewer tokens than one sample. A text file gives
  // the bits FromFile gives.
  static absl::StatusOr<TokenDataset> Open(const std::string& path_or_glob, DataFormat format,
                                           int seq_len, int vocab);
  // Random tokens (for benchmarks): `num_tokens` drawn from `seed`.
  static TokenDataset Synthetic(int64_t num_tokens, int seq_len, int vocab, uint64_t seed);
  // The default corpus: every file under /usr/share/common-licenses (present on every
  // Debian system), concatenated in name order.
  static absl::StatusOr<TokenDataset> Default(int seq_len, int vocab);

  int64_t num_samples() const { return num_samples_; }
  int seq_len() const { return seq_len_; }
  const std::string& source() const { return source_; }
  int64_t num_tokens() const;

  // Sample `i` of the dataset (unshuffled): seq_len inputs and seq_len targets. Samples do not
  // cross files: file k's come after those of the files before it.
  void Sample(int64_t i, int32_t* inputs, int32_t* targets) const;

 private:
  // One file's tokens (or the bytes read into memory), `width` bytes each, little-endian.
  struct Piece {
    const uint8_t* tokens = nullptr;
    int width = 1;
    int64_t num_tokens = 0;
    int64_t first_sample = 0;  // of the dataset
  };
  // Appends a piece over memory `owner` keeps alive, its samples after the others'.
  void Add(std::shared_ptr<const void> owner, const uint8_t* tokens, int width,
           int64_t num_tokens);
  // Text bytes held in memory, as one piece.
  static TokenDataset FromBytes(std::vector<uint8_t> bytes, int seq_len, std::string source);

  std::vector<std::shared_ptr<const void>> owners_;  // the mappings and byte buffers
  std::vector<Piece> pieces_;
  int seq_len_ = 0;
  int64_t num_samples_ = 0;
  std::string source_;
};

// Which samples each step takes: a pure function of (seed, position), no hidden state.
class DataOrder {
 public:
  // Samples [0, num_samples), shuffled per epoch by seed.
  DataOrder(int64_t num_samples, uint64_t seed) : n_(num_samples), seed_(seed) {}
  // Samples [first, first + num_samples) in order, unshuffled (validation).
  static DataOrder InOrder(int64_t first, int64_t num_samples) {
    DataOrder o(num_samples, 0);
    o.first_ = first;
    o.shuffle_ = false;
    return o;
  }
  // The dataset index of the `position`-th sample of the endless sequence.
  int64_t SampleAt(int64_t position) const;

 private:
  int64_t n_;
  uint64_t seed_;
  int64_t first_ = 0;
  bool shuffle_ = true;
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
