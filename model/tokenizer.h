// GPT-2's byte-level BPE, from a Hugging Face tokenizer.json: text to token ids for a prompt,
// and ids back to bytes for what a model generates. The vocabulary (model.vocab) maps strings
// to ids, each string's characters standing for bytes in GPT-2's bytes_to_unicode alphabet
// (printable bytes as themselves, the others as the code points 256 and up); merges
// (model.merges) are ranked pairs of such strings. added_tokens (<|endoftext|>) decode to
// their text.
#ifndef TANDEM_MODEL_TOKENIZER_H_
#define TANDEM_MODEL_TOKENIZER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// GPT-2's bytes_to_unicode: the code point that stands for each byte.
std::vector<char32_t> ByteLevelAlphabet();

class BpeTokenizer {
 public:
  // From a tokenizer.json's text, or its file; errors name what is missing or malformed.
  static absl::StatusOr<BpeTokenizer> FromJson(absl::string_view json);
  static absl::StatusOr<BpeTokenizer> Load(const std::string& path);

  // One past the largest id: ids below it may be decoded (those with a string).
  int size() const { return size_; }
  // The bytes of `ids`, one after another; an error names an id without a string.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;
  // `text` split as GPT-2 pre-tokenizes it (contractions, words, numbers and punctuation each
  // with the space before it, runs of whitespace; bytes above 127 count as letters), each
  // piece merged by rank; an error names a piece the vocabulary cannot spell.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;

 private:
  std::map<std::string, int32_t> ids_;       // a vocabulary string -> its id
  std::map<int32_t, std::string> bytes_;     // an id -> the bytes it stands for
  std::map<std::string, int> merge_rank_;    // "left right" -> its rank (lower merges first)
  std::vector<std::string> byte_symbol_;     // byte -> its one-character string (UTF-8)
  int size_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_MODEL_TOKENIZER_H_
