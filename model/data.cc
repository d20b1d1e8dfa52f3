#include "model/data.h"

#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "model/rng.h"
#include "runtime/status.h"

namespace tandem {
namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;
constexpr int kGpt2Vocab = 50257;

absl::Status CheckRegularFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat(
        "data file %s does not exist; pass --data=PATH to a text file or token shards", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data file %s is not a regular file; pass a text file", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> ReadFile(const std::string& path) {
  RETURN_IF_ERROR(CheckRegularFile(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrFormat("cannot read data file %s", path));
  }
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

// A whole file mapped read-only; unmapped with the last reference.
class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path) {
    RETURN_IF_ERROR(CheckRegularFile(path));
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) {
      return absl::PermissionDeniedError(absl::StrFormat("cannot read data file %s", path));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const std::string why = strerror(errno);
      close(fd);
      return absl::InternalError(absl::StrFormat("cannot stat data file %s: %s", path, why));
    }
    auto m = std::shared_ptr<MappedFile>(new MappedFile);
    m->size_ = st.st_size;
    if (m->size_ > 0) {
      void* p = mmap(nullptr, m->size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        close(fd);
        return absl::InternalError(
            absl::StrFormat("cannot memory-map data file %s: %s", path, strerror(errno)));
      }
      m->data_ = static_cast<const uint8_t*>(p);
    }
    close(fd);
    return std::shared_ptr<const MappedFile>(std::move(m));
  }
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
  }
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  int32_t Int32At(int64_t i) const {
    int32_t v;
    std::memcpy(&v, data_ + 4 * i, 4);
    return v;
  }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

uint32_t TokenAt(const uint8_t* tokens, int width, int64_t k) {
  if (width == 1) return tokens[k];
  if (width == 2) {
    uint16_t v;
    std::memcpy(&v, tokens + 2 * k, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens + 4 * k, 4);
  return v;
}

bool IsGlob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

absl::StatusOr<std::vector<std::string>> ExpandData(const std::string& path_or_glob) {
  if (!IsGlob(path_or_glob)) return std::vector<std::string>{path_or_glob};
  glob_t g;
  std::vector<std::string> files;
  if (glob(path_or_glob.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) files.push_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (files.empty()) {
    return absl::NotFoundError(absl::StrFormat("no file matches %s", path_or_glob));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The format of one file under kAuto: llm.c's magic makes a shard, so does the name *.bin
// (where a wrong magic is then an error), anything else is text.
DataFormat Resolve(DataFormat format, const std::string& path, const MappedFile& f) {
  if (format != DataFormat::kAuto) return format;
  if (f.size() >= 4 && f.Int32At(0) == kLlmcMagic) return DataFormat::kLlmc;
  return absl::EndsWith(path, ".bin") ? DataFormat::kLlmc : DataFormat::kText;
}

// An llm.c shard's header: its token count and vocabulary, or the one-line problem.
struct ShardHeader {
  int64_t num_tokens = 0;
  int vocab = kGpt2Vocab;
};
absl::StatusOr<ShardHeader> ReadShardHeader(const std::string& path, const MappedFile& f) {
  if (f.size() >= 4 && f.Int32At(0) != kLlmcMagic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data file %s is not an llm.c token shard: wrong magic %d (want %d); for a raw token "
        "array such as nanoGPT's train.bin pass --data-format=uint16 or uint32",
        path, f.Int32At(0), kLlmcMagic));
  }
  if (f.size() < kLlmcHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data file %s is truncated: %d bytes, shorter than an llm.c shard's %d-byte header",
        path, f.size(), kLlmcHeaderBytes));
  }
  if (f.Int32At(1) != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data file %s: llm.c shard version %d is not supported (1: uint16 tokens)", path,
        f.Int32At(1)));
  }
  ShardHeader h;
  h.num_tokens = f.Int32At(2);
  if (f.Int32At(3) > 0) h.vocab = f.Int32At(3);
  const int64_t want = kLlmcHeaderBytes + 2 * h.num_tokens;
  if (h.num_tokens < 0 || f.size() != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data file %s is %s: its header gives %d tokens (%d bytes with the header) but it "
        "has %d bytes",
        path, f.size() < want ? "truncated" : "not a whole llm.c shard", h.num_tokens, want,
        f.size()));
  }
  return h;
}

}  // namespace

absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name) {
  if (name == "auto") return DataFormat::kAuto;
  if (name == "text") return DataFormat::kText;
  if (name == "llmc") return DataFormat::kLlmc;
  if (name == "uint16") return DataFormat::kUint16;
  if (name == "uint32") return DataFormat::kUint32;
  return absl::InvalidArgumentError(absl::StrFormat(
      "--data-format=%s: use auto, text, llmc (llm.c shards), uint16 or uint32", name));
}

absl::StatusOr<DataInfo> InspectData(const std::string& path_or_glob, DataFormat format) {
  DataInfo info;
  ASSIGN_OR_RETURN(info.files, ExpandData(path_or_glob));
  for (const std::string& path : info.files) {
    ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> f, MappedFile::Open(path));
    if (Resolve(format, path, *f) != DataFormat::kLlmc) continue;
    ASSIGN_OR_RETURN(ShardHeader h, ReadShardHeader(path, *f));
    info.vocab = std::max(info.vocab, h.vocab);
  }
  return info;
}

int PaddedVocab(int vocab) { return (vocab + 63) / 64 * 64; }

void TokenDataset::Add(std::shared_ptr<const void> owner, const uint8_t* tokens, int width,
                       int64_t num_tokens) {
  owners_.push_back(std::move(owner));
  pieces_.push_back({tokens, width, num_tokens, num_samples_});
  // Samples start every seq_len tokens; each needs seq_len + 1 (its last target).
  num_samples_ += (num_tokens - 1) / seq_len_;
}

TokenDataset TokenDataset::FromBytes(std::vector<uint8_t> bytes, int seq_len,
                                     std::string source) {
  TokenDataset d;
  d.seq_len_ = seq_len;
  d.source_ = std::move(source);
  auto owned = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  d.Add(owned, owned->data(), 1, static_cast<int64_t>(owned->size()));
  return d;
}

int64_t TokenDataset::num_tokens() const {
  int64_t n = 0;
  for (const Piece& p : pieces_) n += p.num_tokens;
  return n;
}

absl::StatusOr<TokenDataset> TokenDataset::FromFile(const std::string& path, int seq_len,
                                                    int vocab) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(path));
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data file %s is empty; pass a text file with at least %d bytes",
                        path, seq_len + 1));
  }
  if (static_cast<int64_t>(bytes.size()) < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data file %s has %d bytes, shorter than one sample of %d (sequence length + 1); "
        "use a longer file or a smaller --seq-len",
        path, bytes.size(), seq_len + 1));
  }
  const uint8_t max_byte = *std::max_element(bytes.begin(), bytes.end());
  if (max_byte >= vocab) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data file %s holds byte %d but the model's vocabulary is %d; use --vocab=256",
        path, max_byte, vocab));
  }
  return FromBytes(std::move(bytes), seq_len, path);
}

absl::StatusOr<TokenDataset> TokenDataset::Open(const std::string& path_or_glob,
                                                DataFormat format, int seq_len, int vocab) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandData(path_or_glob));
  TokenDataset d;
  d.seq_len_ = seq_len;
  d.source_ = path_or_glob;
  for (const std::string& path : files) {
    ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> f, MappedFile::Open(path));
    const DataFormat kind = Resolve(format, path, *f);
    if (kind == DataFormat::kText) {
      ASSIGN_OR_RETURN(TokenDataset text, FromFile(path, seq_len, vocab));
      d.Add(text.owners_[0], text.pieces_[0].tokens, 1, text.pieces_[0].num_tokens);
      continue;
    }
    int64_t offset = 0, num_tokens = 0;
    int width = 2;
    if (kind == DataFormat::kLlmc) {
      ASSIGN_OR_RETURN(ShardHeader h, ReadShardHeader(path, *f));
      offset = kLlmcHeaderBytes;
      num_tokens = h.num_tokens;
    } else {
      width = kind == DataFormat::kUint16 ? 2 : 4;
      if (f->size() % width != 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "data file %s has %d bytes, not a whole number of %d-byte tokens: truncated, or "
            "not --data-format=%s",
            path, f->size(), width, width == 2 ? "uint16" : "uint32"));
      }
      num_tokens = f->size() / width;
    }
    if (num_tokens < seq_len + 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "data file %s has %d tokens, fewer than one sample of %d (sequence length + 1); use "
          "more data or a smaller --seq-len",
          path, num_tokens, seq_len + 1));
    }
    const uint8_t* tokens = f->data() + offset;
    for (int64_t k = 0; k < num_tokens; ++k) {
      const uint32_t t = TokenAt(tokens, width, k);
      if (t >= static_cast<uint32_t>(vocab)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "data file %s holds token %d at position %d but the vocabulary is %d; pass "
            "--vocab=N with the tokenizer's size",
            path, t, k, vocab));
      }
    }
    d.Add(f, tokens, width, num_tokens);
  }
  return d;
}

TokenDataset TokenDataset::Synthetic(int64_t num_tokens, int seq_len, int vocab,
                                     uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> tokens(std::max<int64_t>(num_tokens, seq_len + 1));
  for (uint8_t& t : tokens) t = static_cast<uint8_t>(rng.Below(std::min(vocab, 256)));
  const std::string source =
      absl::StrFormat("synthetic(%d tokens, seed %d)", tokens.size(), seed);
  return FromBytes(std::move(tokens), seq_len, source);
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
  std::vector<uint8_t> tokens;
  for (const std::string& n : names) {
    auto bytes = ReadFile(dir + "/" + n);  // refuses what is not a regular file: links to dirs
    if (bytes.ok()) tokens.insert(tokens.end(), bytes->begin(), bytes->end());
  }
  if (static_cast<int64_t>(tokens.size()) < seq_len + 1) {
    return absl::NotFoundError(absl::StrFormat(
        "the default corpus (%s) is missing or too short on this machine; pass --data=PATH",
        dir));
  }
  for (uint8_t& t : tokens) {
    if (t >= vocab) t = static_cast<uint8_t>(t % vocab);
  }
  return FromBytes(std::move(tokens), seq_len, dir);
}

void TokenDataset::Sample(int64_t i, int32_t* inputs, int32_t* targets) const {
  size_t k = 0;
  if (pieces_.size() > 1) {
    k = std::upper_bound(pieces_.begin(), pieces_.end(), i,
                         [](int64_t x, const Piece& p) { return x < p.first_sample; }) -
        pieces_.begin() - 1;
  }
  const Piece& p = pieces_[k];
  const int64_t first = (i - p.first_sample) * seq_len_;
  for (int t = 0; t < seq_len_; ++t) {
    inputs[t] = static_cast<int32_t>(TokenAt(p.tokens, p.width, first + t));
    targets[t] = static_cast<int32_t>(TokenAt(p.tokens, p.width, first + t + 1));
  }
}

int64_t DataOrder::SampleAt(int64_t position) const {
  if (!shuffle_) return first_ + position % n_;
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
