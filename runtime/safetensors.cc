#include "runtime/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/dtype.h"
#include "runtime/files.h"
#include "runtime/json.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// The safetensors library refuses headers above 100 MB; so does Tandem.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

int DTypeBytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

absl::Status Bad(const std::string& what, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s is not a valid safetensors file: %s", what, why));
}

uint64_t ReadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// A tensor as the header describes it.
struct Entry {
  SafetensorsTensor tensor;
  uint64_t begin = 0, end = 0;
};

// Parses and checks the header against a byte buffer of `buffer_bytes`: entries in data order.
absl::StatusOr<std::vector<Entry>> ParseHeader(absl::string_view text, uint64_t buffer_bytes,
                                               const std::string& what,
                                               std::map<std::string, std::string>* metadata) {
  if (text.empty() || text[0] != '{') return Bad(what, "the header does not start with '{'");
  // nlohmann keeps the last of duplicate keys; the format forbids them.
  std::set<std::string> keys;
  std::string duplicate;
  Json header;
  try {
    header = Json::parse(
        text.begin(), text.end(),
        [&](int depth, Json::parse_event_t event, Json& parsed) {
          if (depth == 1 && event == Json::parse_event_t::key &&
              !keys.insert(parsed.get<std::string>()).second) {
            duplicate = parsed.get<std::string>();
          }
          return true;
        });
  } catch (const Json::exception& e) {
    return Bad(what, absl::StrCat("its header is not JSON (", e.what(), ")"));
  }
  if (!duplicate.empty()) return Bad(what, absl::StrCat("tensor '", duplicate, "' appears twice"));
  if (!header.is_object()) return Bad(what, "its header is not a JSON object");
  std::vector<Entry> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return Bad(what, "__metadata__ is not an object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) return Bad(what, absl::StrCat("__metadata__ '", k, "' is not a string"));
        (*metadata)[k] = s.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& why) { return Bad(what, absl::StrCat("tensor '", name, "': ", why)); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
        !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
      return bad("needs \"dtype\", \"shape\" and \"data_offsets\": [begin, end]");
    }
    Entry e;
    e.tensor.name = name;
    e.tensor.dtype = v["dtype"].get<std::string>();
    const int bytes = DTypeBytes(e.tensor.dtype);
    if (bytes == 0) {
      return bad(absl::StrFormat("dtype %s is not one Tandem reads (F32, F16, BF16)", e.tensor.dtype));
    }
    uint64_t numel = 1;
    for (const Json& d : v["shape"]) {
      if (!d.is_number_unsigned()) return bad("a dimension is not a non-negative integer");
      const uint64_t n = d.get<uint64_t>();
      if (n != 0 && numel > (uint64_t{1} << 62) / n) return bad("its shape is too large");
      numel *= n;
      e.tensor.shape.push_back(static_cast<int64_t>(n));
    }
    const Json& o = v["data_offsets"];
    if (!o[0].is_number_unsigned() || !o[1].is_number_unsigned()) {
      return bad("data_offsets are not non-negative integers");
    }
    e.begin = o[0].get<uint64_t>();
    e.end = o[1].get<uint64_t>();
    if (e.begin > e.end || e.end > buffer_bytes) {
      return bad(absl::StrFormat("data_offsets [%d, %d] lie outside the %d-byte data", e.begin,
                                 e.end, buffer_bytes));
    }
    if (e.end - e.begin != numel * bytes) {
      return bad(absl::StrFormat("data_offsets [%d, %d] hold %d bytes; its shape and dtype need %d",
                                 e.begin, e.end, e.end - e.begin, numel * bytes));
    }
    entries.push_back(std::move(e));
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  // The ranges must tile the buffer: no overlap, no hole (a hole could hide another file).
  uint64_t next = 0;
  for (const Entry& e : entries) {
    if (e.end == e.begin) continue;  // an empty tensor holds no bytes
    if (e.begin < next) {
      return Bad(what, absl::StrFormat("tensor '%s' overlaps the tensor before it", e.tensor.name));
    }
    if (e.begin > next) {
      return Bad(what, absl::StrFormat("bytes [%d, %d) before tensor '%s' belong to no tensor",
                                       next, e.begin, e.tensor.name));
    }
    next = e.end;
  }
  if (next != buffer_bytes) {
    return Bad(what, absl::StrFormat("its last %d bytes belong to no tensor", buffer_bytes - next));
  }
  return entries;
}

// The header's length from the first 8 bytes of a file of `file_bytes`, checked.
absl::StatusOr<uint64_t> HeaderLength(const char* first8, uint64_t file_bytes,
                                      const std::string& what) {
  if (file_bytes < 8) return Bad(what, absl::StrFormat("it has %d bytes, fewer than 8", file_bytes));
  const uint64_t n = ReadU64(first8);
  if (n > kMaxHeaderBytes || n > file_bytes - 8) {
    return Bad(what, absl::StrFormat("its header length %d runs past its %d bytes", n, file_bytes));
  }
  return n;
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsTensor* SafetensorsFile::Find(absl::string_view name) const {
  for (const SafetensorsTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<std::string> SafetensorsBytes(const SafetensorsFile& file) {
  Json header = Json::object();
  if (!file.metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : file.metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : file.tensors) {
    if (t.name == "__metadata__" || header.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrFormat("safetensors: tensor name '%s' twice or reserved", t.name));
    }
    if (static_cast<int64_t>(t.values.size()) != t.numel()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "safetensors: tensor '%s' has %d values for a shape of %d", t.name, t.values.size(), t.numel()));
    }
    const uint64_t bytes = t.values.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  out += text;
  out.reserve(out.size() + offset);
  for (const SafetensorsTensor& t : file.tensors) {
    // Tandem runs on little-endian machines only (x86-64 and CUDA hosts): f32 as in memory.
    out.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file) {
  ASSIGN_OR_RETURN(std::string bytes, SafetensorsBytes(file));
  return WriteFileAtomically(path, bytes);
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes, const std::string& what) {
  ASSIGN_OR_RETURN(uint64_t n, HeaderLength(bytes.data(), bytes.size(), what));
  SafetensorsFile file;
  ASSIGN_OR_RETURN(std::vector<Entry> entries,
                   ParseHeader(bytes.substr(8, n), bytes.size() - 8 - n, what, &file.metadata));
  const char* data = bytes.data() + 8 + n;
  for (Entry& e : entries) {
    SafetensorsTensor& t = e.tensor;
    const char* p = data + e.begin;
    const int64_t count = t.numel();
    t.values.resize(count);
    if (t.dtype == "F32") {
      std::memcpy(t.values.data(), p, count * sizeof(float));
    } else {
      const bool bf16 = t.dtype == "BF16";
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        t.values[i] = bf16 ? Bf16ToFloat(h) : HalfToFloat(h);
      }
    }
    file.tensors.push_back(std::move(t));
  }
  return file;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  return ParseSafetensors(bytes, path);
}

absl::StatusOr<SafetensorsFile> ReadSafetensorsHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  struct stat st;
  if (!in || ::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat("cannot read %s", path));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  char first8[8] = {0};
  in.read(first8, 8);
  ASSIGN_OR_RETURN(uint64_t n, HeaderLength(first8, in ? size : 0, path));
  std::string text(n, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(n))) {
    return absl::NotFoundError(absl::StrFormat("cannot read %s", path));
  }
  SafetensorsFile file;
  ASSIGN_OR_RETURN(std::vector<Entry> entries, ParseHeader(text, size - 8 - n, path, &file.metadata));
  for (Entry& e : entries) file.tensors.push_back(std::move(e.tensor));
  return file;
}

}  // namespace tandem
