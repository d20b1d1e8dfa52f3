// safetensors files (Hugging Face's format, github.com/huggingface/safetensors): named tensors
// that transformers and PyTorch read and write without pickle. Tandem writes f32 and reads
// f32, f16 and bf16 (as transformers may save either), converting to f32.
//
// Format (little-endian):
//   u64 N | N bytes of JSON header | byte buffer
// The header is an object: each tensor's name -> {"dtype": "F32", "shape": [...],
// "data_offsets": [begin, end]} (offsets into the byte buffer), and an optional
// "__metadata__" object of strings. The header starts with '{' and may end in spaces; the
// tensors' byte ranges must cover the buffer exactly, without holes or overlaps.
#ifndef TANDEM_RUNTIME_SAFETENSORS_H_
#define TANDEM_RUNTIME_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // as stored: "F32", "F16" or "BF16"; written as "F32"
  std::vector<int64_t> shape;   // row-major; [] is a scalar
  std::vector<float> values;    // converted to f32; empty when only the header was read

  int64_t numel() const;
};

struct SafetensorsFile {
  std::vector<SafetensorsTensor> tensors;     // in the order of their data in the file
  std::map<std::string, std::string> metadata;  // "__metadata__"

  // The tensor named `name`, or nullptr.
  const SafetensorsTensor* Find(absl::string_view name) const;
};

// Writes `file` as f32 (each tensor's values must hold the product of its shape), atomically
// (temporary file, fsync, rename). The header is padded with spaces to a multiple of 8 bytes,
// so every tensor's data is 8-byte aligned, as the safetensors library writes it.
absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file);
// The bytes WriteSafetensors writes.
absl::StatusOr<std::string> SafetensorsBytes(const SafetensorsFile& file);

// Reads and checks a whole file. A bad file is refused in one line naming it and the problem:
// a header length past the end, a header that is not a JSON object of tensors, an unknown
// dtype, a shape that does not match its byte range, ranges out of the buffer, overlapping
// or leaving holes.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);
// The same checks, reading only the header: every tensor's name, dtype and shape, no values.
absl::StatusOr<SafetensorsFile> ReadSafetensorsHeader(const std::string& path);
// Parses a file's bytes; `what` names it in errors.
absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes, const std::string& what);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_SAFETENSORS_H_
