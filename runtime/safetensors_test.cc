#include "runtime/safetensors.h"

#include <cstring>

#include "gtest/gtest.h"
#include "runtime/test_files.h"

namespace tandem {
namespace {

SafetensorsFile Sample() {
  SafetensorsFile f;
  f.metadata["format"] = "pt";
  f.tensors.push_back({"a", "F32", {2, 3}, {1, 2, 3, 4, 5, 6}});
  f.tensors.push_back({"b", "F32", {1}, {-0.5f}});
  f.tensors.push_back({"s", "F32", {}, {7}});
  return f;
}

// The header of `bytes` replaced by `header` (JSON), the data kept.
std::string WithHeader(const std::string& bytes, const std::string& header) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  std::string out(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(out.data(), &len, 8);
  return out + header + bytes.substr(8 + n);
}

TEST(Safetensors, WriteThenReadGivesTheSameTensors) {
  const std::string path = FreshTestPath("sample.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, Sample()).ok());
  absl::StatusOr<SafetensorsFile> f = ReadSafetensors(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors.size(), 3u);
  EXPECT_EQ(f->metadata.at("format"), "pt");
  for (const SafetensorsTensor& want : Sample().tensors) {
    const SafetensorsTensor* got = f->Find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->dtype, "F32");
    EXPECT_EQ(got->shape, want.shape);
    EXPECT_EQ(got->values, want.values);
  }
  absl::StatusOr<SafetensorsFile> h = ReadSafetensorsHeader(path);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->Find("a")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(h->Find("a")->values.empty());
}

TEST(Safetensors, LayoutIsTheFormats) {
  absl::StatusOr<std::string> bytes = SafetensorsBytes(Sample());
  ASSERT_TRUE(bytes.ok());
  uint64_t n = 0;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);  // the data 8-byte aligned
  EXPECT_EQ(bytes->size(), 8 + n + 8 * 4);  // 6 + 1 + 1 floats
  const std::string header = bytes->substr(8, n);
  EXPECT_EQ(header.find("{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                        "\"data_offsets\":[0,24]}"),
            0u)
      << header;
  float b;
  std::memcpy(&b, bytes->data() + 8 + n + 24, 4);
  EXPECT_EQ(b, -0.5f);
}

TEST(Safetensors, ReadsHalfAndBfloat16AsF32) {
  // 1.0 and -2.5 in f16 (0x3c00, 0xc100) and bf16 (0x3f80, 0xc020).
  const std::string header =
      "{\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}";
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += header;
  const unsigned char data[] = {0x00, 0x3c, 0x00, 0xc1, 0x80, 0x3f, 0x20, 0xc0};
  bytes.append(reinterpret_cast<const char*>(data), sizeof(data));
  absl::StatusOr<SafetensorsFile> f = ParseSafetensors(bytes, "x");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Find("h")->values, (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(f->Find("b")->values, (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ(f->Find("b")->dtype, "BF16");
}

TEST(Safetensors, BadFilesAreRefusedInOneLine) {
  const std::string good = *SafetensorsBytes(Sample());
  struct Case {
    std::string label, bytes, words;
  };
  std::string long_header = good;
  long_header[0] = static_cast<char>(0xff);
  const std::vector<Case> cases = {
      {"short", "abc", "fewer than 8"},
      {"header length", long_header, "header length"},
      {"not json", WithHeader(good, "{nope"), "not JSON"},
      {"not an object", WithHeader(good, "[1]"), "start with '{'"},
      {"dtype",
       WithHeader(good, "{\"a\":{\"dtype\":\"I64\",\"shape\":[4],\"data_offsets\":[0,32]}}"),
       "dtype I64"},
      {"shape",
       WithHeader(good, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,32]}}"),
       "need 12"},
      {"out of range",
       WithHeader(good, "{\"a\":{\"dtype\":\"F32\",\"shape\":[9],\"data_offsets\":[0,36]}}"),
       "outside"},
      {"overlap",
       WithHeader(good,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[20,28]},"
                  "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[28,32]}}"),
       "overlaps"},
      {"hole",
       WithHeader(good, "{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]}}"),
       "last 8 bytes"},
      {"twice",
       WithHeader(good,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}"),
       "appears twice"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SafetensorsFile> f = ParseSafetensors(c.bytes, "m.safetensors");
    ASSERT_FALSE(f.ok()) << c.label;
    const std::string msg(f.status().message());
    EXPECT_NE(msg.find("m.safetensors is not a valid safetensors file"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.words), std::string::npos) << c.label << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(Safetensors, WriterRefusesValuesThatDoNotFitTheShape) {
  SafetensorsFile f = Sample();
  f.tensors[0].values.pop_back();
  EXPECT_FALSE(SafetensorsBytes(f).ok());
}

}  // namespace
}  // namespace tandem
