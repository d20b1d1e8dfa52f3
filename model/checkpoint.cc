#include "model/checkpoint.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "model/rng.h"
#include "runtime/files.h"

namespace tandem {
namespace {

constexpr char kMagic[] = "TANDEMCK";
constexpr char kEnd[] = "TANDEMEND";
constexpr uint32_t kVersion = 1;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Reads from a buffer with bounds checks; any overrun marks the file corrupt.
class Reader {
 public:
  explicit Reader(absl::string_view b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (pos_ + sizeof(T) > b_.size()) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Bytes(size_t n, std::string* out) {
    if (n > b_.size() - pos_) return false;
    out->assign(b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Floats(uint64_t n, std::vector<float>* out) {
    if (n > (b_.size() - pos_) / 4) return false;
    out->resize(n);
    if (n > 0) std::memcpy(out->data(), b_.data() + pos_, n * 4);  // data() may be null
    pos_ += n * 4;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  const absl::string_view b_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<const std::vector<float>*> CheckpointData::Array(const std::string& name) const {
  for (const auto& [n, v] : arrays) {
    if (n == name) return &v;
  }
  return absl::NotFoundError(absl::StrFormat("checkpoint has no array '%s'", name));
}

absl::StatusOr<std::string> CheckpointData::Meta(const std::string& key) const {
  auto it = meta.find(key);
  if (it == meta.end()) {
    return absl::NotFoundError(absl::StrFormat("checkpoint has no '%s' entry", key));
  }
  return it->second;
}

absl::Status WriteCheckpoint(const std::string& path, const CheckpointData& data,
                             CheckpointFileInfo* info) {
  std::string buf(kMagic, 8);
  Put<uint32_t>(&buf, kVersion);
  Put<uint32_t>(&buf, static_cast<uint32_t>(data.arrays.size()));
  for (const auto& [name, values] : data.arrays) {
    Put<uint32_t>(&buf, static_cast<uint32_t>(name.size()));
    buf += name;
    Put<uint64_t>(&buf, values.size());
    buf.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  }
  std::string meta;
  for (const auto& [k, v] : data.meta) meta += k + "=" + v + "\n";
  Put<uint32_t>(&buf, static_cast<uint32_t>(meta.size()));
  buf += meta;
  const uint64_t checksum = Fnv1a64(buf);
  Put<uint64_t>(&buf, checksum);
  buf.append(kEnd, 9);

  const absl::Status written = WriteFileAtomically(path, buf);
  if (!written.ok()) {
    return absl::Status(written.code(), absl::StrCat("checkpoint: ", written.message()));
  }
  if (info != nullptr) {
    info->bytes = static_cast<int64_t>(buf.size());
    info->checksum = checksum;
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointFileInfo> StatCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(absl::StrFormat("checkpoint %s cannot be opened", path));
  }
  const std::streamoff size = in.tellg();
  if (size < 8 + 4 + 4 + 4 + 8 + 9) {
    return absl::DataLossError(
        absl::StrFormat("checkpoint %s is corrupt or incomplete (too short)", path));
  }
  char tail[17];
  in.seekg(size - 17);
  if (!in.read(tail, 17) || std::memcmp(tail + 8, kEnd, 9) != 0) {
    return absl::DataLossError(
        absl::StrFormat("checkpoint %s is corrupt or incomplete (truncated)", path));
  }
  CheckpointFileInfo info;
  info.bytes = static_cast<int64_t>(size);
  std::memcpy(&info.checksum, tail, 8);
  return info;
}

absl::Status CorruptCheckpointError(const std::string& path, const std::string& why) {
  return absl::DataLossError(absl::StrFormat(
      "checkpoint %s is corrupt or incomplete (%s); it was not loaded: resume from an earlier "
      "checkpoint",
      path, why));
}

absl::StatusOr<CheckpointData> ReadCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrFormat("checkpoint %s cannot be opened", path));
  }
  const std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto corrupt = [&](const std::string& why) { return CorruptCheckpointError(path, why); };
  if (buf.size() < 8 + 4 + 4 + 4 + 8 + 9 || buf.compare(0, 8, kMagic, 8) != 0) {
    return corrupt("not a Tandem checkpoint");
  }
  if (buf.compare(buf.size() - 9, 9, kEnd, 9) != 0) return corrupt("truncated");
  uint64_t stored;
  std::memcpy(&stored, buf.data() + buf.size() - 17, 8);
  const absl::string_view body(buf.data(), buf.size() - 17);
  if (Fnv1a64(body) != stored) return corrupt("checksum mismatch");

  Reader r(body);
  std::string magic;
  uint32_t version = 0, count = 0;
  r.Bytes(8, &magic);
  if (!r.Get(&version) || version != kVersion) {
    return corrupt(absl::StrFormat("version %d, this build reads %d", version, kVersion));
  }
  if (!r.Get(&count)) return corrupt("no array count");
  CheckpointData data;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t name_len;
    std::string name;
    uint64_t numel;
    std::vector<float> values;
    if (!r.Get(&name_len) || !r.Bytes(name_len, &name) || !r.Get(&numel) ||
        !r.Floats(numel, &values)) {
      return corrupt(absl::StrFormat("array %d runs past the end", i));
    }
    data.arrays.emplace_back(std::move(name), std::move(values));
  }
  uint32_t meta_len;
  std::string meta;
  if (!r.Get(&meta_len) || !r.Bytes(meta_len, &meta) || r.pos() != body.size()) {
    return corrupt("bad metadata");
  }
  for (absl::string_view line : absl::StrSplit(meta, '\n', absl::SkipEmpty())) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) return corrupt("bad metadata line");
    data.meta[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  return data;
}

}  // namespace tandem
