#include "model/data.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "absl/strings/str_format.h"
#include "model/rng.h"

namespace tandem {
namespace {

absl::StatusOr<std::vector<uint8_t>> ReadFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat(
        "data file %s does not exist; pass --data=PATH to a text file", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data file %s is not a regular file; pass a text file", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrFormat("cannot read data file %s", path));
  }
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}


}  // namespace

absl::StatusOr<TokenDataset> TokenDataset::FromFile(const std::string& path, int seq_len,
                                                    int vocab) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  TokenDataset d;
  d.tokens_ = std::move(*bytes);
  d.seq_len_ = seq_len;
  d.source_ = path;
  if (d.tokens_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data file %s is empty; pass a text file with at least %d bytes",
                        path, seq_len + 1));
  }
  if (static_cast<int64_t>(d.tokens_.size()) < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data file %s has %d bytes, shorter than one sample of %d (sequence length + 1); "
        "use a longer file or a smaller --seq-len",
        path, d.tokens_.size(), seq_len + 1));
  }
  const uint8_t max_byte = *std::max_element(d.tokens_.begin(), d.tokens_.end());
  if (max_byte >= vocab) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data file %s holds byte %d but the model's vocabulary is %d; use --vocab=256",
        path, max_byte, vocab));
  }
  // Samples start every seq_len bytes; each needs seq_len + 1 bytes (its last target).
  d.num_samples_ = (static_cast<int64_t>(d.tokens_.size()) - 1) / seq_len;
  return d;
}

TokenDataset TokenDataset::Synthetic(int64_t num_tokens, int seq_len, int vocab,
                                     uint64_t seed) {
  TokenDataset d;
  Rng rng(seed);
  d.tokens_.resize(std::max<int64_t>(num_tokens, seq_len + 1));
  for (uint8_t& t : d.tokens_) t = static_cast<uint8_t>(rng.Below(std::min(vocab, 256)));
  d.seq_len_ = seq_len;
  d.num_samples_ = (static_cast<int64_t>(d.tokens_.size()) - 1) / seq_len;
  d.source_ = absl::StrFormat("synthetic(%d tokens, seed %d)", d.tokens_.size(), seed);
  return d;
}

absl::StatusOr<TokenDataset> TokenDataset::Default(int seq_len, int vocab) {
  const std::string dir = "/usr/share/common-licenses";
  std::vector<std::string> names;
  if (DIR* dp = opendir(dir.c_str())) {
    while (dirent* e = readdir(dp)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(dp);
  }
  std::sort(names.begin(), names.end());
  TokenDataset d;
  for (const std::string& n : names) {
    auto bytes = ReadFile(dir + "/" + n);  // refuses what is not a regular file: links to dirs
    if (bytes.ok()) d.tokens_.insert(d.tokens_.end(), bytes->begin(), bytes->end());
  }
  if (static_cast<int64_t>(d.tokens_.size()) < seq_len + 1) {
    return absl::NotFoundError(absl::StrFormat(
        "the default corpus (%s) is missing or too short on this machine; pass --data=PATH",
        dir));
  }
  for (uint8_t& t : d.tokens_) {
    if (t >= vocab) t = static_cast<uint8_t>(t % vocab);
  }
  d.seq_len_ = seq_len;
  d.num_samples_ = (static_cast<int64_t>(d.tokens_.size()) - 1) / seq_len;
  d.source_ = dir;
  return d;
}

void TokenDataset::Sample(int64_t i, int32_t* inputs, int32_t* targets) const {
  const uint8_t* p = tokens_.data() + i * seq_len_;
  for (int t = 0; t < seq_len_; ++t) {
    inputs[t] = p[t];
    targets[t] = p[t + 1];
  }
}

int64_t DataOrder::SampleAt(int64_t position) const {
  const int64_t epoch = position / n_;
  if (epoch != cached_epoch_) {
    // Fisher-Yates with a generator seeded by (seed, epoch): the same order everywhere.
    perm_.resize(n_);
    for (int64_t i = 0; i < n_; ++i) perm_[i] = i;
    Rng rng(seed_ * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(epoch) + 1);
    for (int64_t i = n_ - 1; i > 0; --i) std::swap(perm_[i], perm_[rng.Below(i + 1)]);
    cached_epoch_ = epoch;
  }
  return perm_[position % n_];
}

void FillBatch(const TokenDataset& data, const DataOrder& order, int64_t batch_start,
               int64_t row_begin, int64_t rows, std::vector<int32_t>* tokens,
               std::vector<int32_t>* targets) {
  const int T = data.seq_len();
  tokens->resize(rows * T);
  targets->resize(rows * T);
  for (int64_t r = 0; r < rows; ++r) {
    data.Sample(order.SampleAt(batch_start + row_begin + r), tokens->data() + r * T,
                targets->data() + r * T);
  }
}

}  // namespace tandem
