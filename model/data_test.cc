#include "model/data.h"

#include <unistd.h>

#include <fstream>
#include <map>
#include <set>

#include "gtest/gtest.h"

namespace tandem {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                           "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(DataTest, SamplesAreShiftedByOne) {
  auto d = *TokenDataset::FromFile(WriteTemp("abc.txt", "abcdefghij"), 3, 256);
  EXPECT_EQ(d.num_samples(), 3);  // (10 - 1) / 3
  int32_t in[3], tg[3];
  d.Sample(1, in, tg);
  EXPECT_EQ(in[0], 'd');
  EXPECT_EQ(in[2], 'f');
  EXPECT_EQ(tg[0], 'e');
  EXPECT_EQ(tg[2], 'g');
}

TEST(DataTest, BadFilesAreClearErrors) {
  auto missing = TokenDataset::FromFile("/nonexistent/corpus.txt", 8, 256);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/corpus.txt does not exist"),
            std::string::npos);
  auto empty = TokenDataset::FromFile(WriteTemp("empty.txt", ""), 8, 256);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("is empty"), std::string::npos);
  auto short_file = TokenDataset::FromFile(WriteTemp("short.txt", "12345678"), 8, 256);
  ASSERT_FALSE(short_file.ok());
  EXPECT_NE(short_file.status().message().find("shorter than one sample of 9"),
            std::string::npos);
  auto vocab = TokenDataset::FromFile(WriteTemp("hi.txt", "hello world"), 4, 100);
  ASSERT_FALSE(vocab.ok());
  EXPECT_NE(vocab.status().message().find("byte 119"), std::string::npos);  // 'w'
  EXPECT_FALSE(TokenDataset::FromFile("/", 4, 256).ok());
}

TEST(DataTest, DefaultCorpusIsFound) {
  auto d = TokenDataset::Default(64, 256);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_GT(d->num_tokens(), 10000);
}

TEST(DataTest, OrderIsAPermutationPerEpochAndDeterministic) {
  DataOrder a(50, 7), b(50, 7), c(50, 8);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> seen;
    for (int i = 0; i < 50; ++i) seen.insert(a.SampleAt(epoch * 50 + i));
    EXPECT_EQ(seen.size(), 50u);
  }
  bool differs = false;
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(a.SampleAt(i), b.SampleAt(i));
    differs |= a.SampleAt(i) != c.SampleAt(i);
  }
  EXPECT_TRUE(differs);
  // Epochs are shuffled differently.
  bool epochs_differ = false;
  for (int i = 0; i < 50; ++i) epochs_differ |= a.SampleAt(i) != a.SampleAt(50 + i);
  EXPECT_TRUE(epochs_differ);
}

// Across 1, 2, 3 and 4 ranks, each taking its share of every global batch, every sample is
// seen exactly once per epoch.
TEST(DataTest, ShardingCoversEachSampleOncePerEpoch) {
  auto d = *TokenDataset::FromFile(
      WriteTemp("corpus.txt", std::string(12 * 60 + 1, 'x')), 12, 256);  // 60 samples
  ASSERT_EQ(d.num_samples(), 60);
  const int batch = 12;  // divisible by 1, 2, 3, 4
  for (int world : {1, 2, 3, 4}) {
    DataOrder order(d.num_samples(), 99);
    std::map<int64_t, int> count;
    for (int step = 0; step < 60 / batch; ++step) {
      for (int rank = 0; rank < world; ++rank) {
        const int rows = batch / world;
        for (int r = 0; r < rows; ++r) {
          count[order.SampleAt(int64_t{step} * batch + rank * rows + r)]++;
        }
      }
    }
    EXPECT_EQ(count.size(), 60u) << world << " ranks";
    for (auto [sample, n] : count) EXPECT_EQ(n, 1) << "sample " << sample << ", " << world;
  }
}

TEST(DataTest, FillBatchTakesRowsOfTheGlobalBatch) {
  auto d = *TokenDataset::FromFile(WriteTemp("digits.txt", "0123456789abcdefghij"), 4, 256);
  DataOrder order(d.num_samples(), 3);
  std::vector<int32_t> all_t, all_y, part_t, part_y;
  FillBatch(d, order, 4, 0, 4, &all_t, &all_y);
  FillBatch(d, order, 4, 2, 2, &part_t, &part_y);
  EXPECT_EQ(std::vector<int32_t>(all_t.begin() + 8, all_t.end()), part_t);
  EXPECT_EQ(std::vector<int32_t>(all_y.begin() + 8, all_y.end()), part_y);
}

// An llm.c shard: magic, version, token count and (optionally) the vocabulary in a header of
// 256 int32, then uint16 tokens.
std::string Shard(const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                  int32_t vocab = 0, int64_t count = -1) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = 1;
  header[2] = static_cast<int32_t>(count >= 0 ? count : tokens.size());
  header[3] = vocab;
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size());
  return bytes;
}

std::vector<uint16_t> Counting(int n, int from) {
  std::vector<uint16_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(from + i);
  return v;
}

std::string OpenError(const std::string& path, DataFormat format, int seq_len, int vocab) {
  auto d = TokenDataset::Open(path, format, seq_len, vocab);
  return d.ok() ? "opened" : std::string(d.status().message());
}

TEST(DataTest, LlmcShardsAreReadAcrossFilesInNameOrder) {
  // Shard a: tokens 1000..1010 (11 tokens, 2 samples of 4 + 1); b: 2000..2008 (9: 2 samples).
  WriteTemp("tok_train_000001.bin", Shard(Counting(9, 2000)));
  WriteTemp("tok_train_000000.bin", Shard(Counting(11, 1000)));
  const std::string dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  auto d = TokenDataset::Open(dir + "/tok_train_*.bin", DataFormat::kAuto, 4, 50257);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->num_samples(), 4);
  EXPECT_EQ(d->num_tokens(), 20);
  int32_t in[4], tg[4];
  d->Sample(1, in, tg);  // shard a, tokens 4..8
  EXPECT_EQ(std::vector<int32_t>(in, in + 4), (std::vector<int32_t>{1004, 1005, 1006, 1007}));
  EXPECT_EQ(tg[3], 1008);
  d->Sample(2, in, tg);  // shard b's first sample: samples do not cross files
  EXPECT_EQ(std::vector<int32_t>(in, in + 4), (std::vector<int32_t>{2000, 2001, 2002, 2003}));
  EXPECT_EQ(tg[3], 2004);
  d->Sample(3, in, tg);
  EXPECT_EQ(in[0], 2004);
  EXPECT_EQ(tg[3], 2008);
  auto info = InspectData(dir + "/tok_train_*.bin", DataFormat::kAuto);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->files.size(), 2u);
  EXPECT_EQ(info->vocab, 50257);  // GPT-2's, where the header does not say
  auto bytes = InspectData(WriteTemp("bytes.bin", Shard(Counting(9, 65), 20240520, 256)),
                           DataFormat::kAuto);
  EXPECT_EQ(bytes->vocab, 256);
  EXPECT_EQ(InspectData(WriteTemp("plain.txt", "hello"), DataFormat::kAuto)->vocab, 0);
  EXPECT_EQ(PaddedVocab(50257), 50304);
  EXPECT_EQ(PaddedVocab(256), 256);
  EXPECT_EQ(PaddedVocab(300), 320);
}

TEST(DataTest, RawTokenArrays) {
  const std::vector<uint16_t> u16 = Counting(9, 40000);
  const std::string p16 = WriteTemp(
      "train16.bin", std::string(reinterpret_cast<const char*>(u16.data()), 2 * u16.size()));
  auto d16 = TokenDataset::Open(p16, DataFormat::kUint16, 4, 50304);
  ASSERT_TRUE(d16.ok()) << d16.status();
  int32_t in[4], tg[4];
  d16->Sample(1, in, tg);
  EXPECT_EQ(in[0], 40004);
  EXPECT_EQ(tg[3], 40008);
  const std::vector<uint32_t> u32 = {70000, 70001, 70002, 70003, 70004, 70005};
  const std::string p32 = WriteTemp(
      "train32.bin", std::string(reinterpret_cast<const char*>(u32.data()), 4 * u32.size()));
  auto d32 = TokenDataset::Open(p32, DataFormat::kUint32, 5, 128256);
  ASSERT_TRUE(d32.ok()) << d32.status();
  d32->Sample(0, in, tg);
  EXPECT_EQ(in[0], 70000);
  EXPECT_EQ(tg[3], 70004);
  // Without --data-format a .bin is taken for an llm.c shard, and the error says what to pass.
  EXPECT_NE(OpenError(p16, DataFormat::kAuto, 4, 50304).find("--data-format=uint16 or uint32"),
            std::string::npos);
  EXPECT_NE(OpenError(WriteTemp("odd.bin", "abc"), DataFormat::kUint16, 1, 256)
                .find("odd.bin has 3 bytes, not a whole number of 2-byte tokens"),
            std::string::npos);
}

TEST(DataTest, TextThroughOpenIsTheBytesAsBefore) {
  const std::string path = WriteTemp("text.txt", "the quick brown fox jumps over the lazy dog");
  auto a = *TokenDataset::FromFile(path, 5, 256);
  auto b = TokenDataset::Open(path, DataFormat::kAuto, 5, 256);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a.num_samples(), b->num_samples());
  for (int64_t i = 0; i < a.num_samples(); ++i) {
    int32_t x[5], y[5], u[5], v[5];
    a.Sample(i, x, y);
    b->Sample(i, u, v);
    EXPECT_TRUE(std::equal(x, x + 5, u) && std::equal(y, y + 5, v)) << i;
  }
  EXPECT_NE(OpenError(path, DataFormat::kAuto, 5, 100).find("holds byte 122"),
            std::string::npos);  // 'z', the text's largest
}

TEST(DataTest, BadShardsAreOneLineEach) {
  auto expect = [](const std::string& error, const std::string& want) {
    EXPECT_NE(error.find(want), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  };
  expect(OpenError(WriteTemp("magic.bin", Shard(Counting(20, 0), 12345)), DataFormat::kAuto, 4,
                   256),
         "magic.bin is not an llm.c token shard: wrong magic 12345 (want 20240520)");
  expect(OpenError(WriteTemp("magic2.dat", Shard(Counting(20, 0), 12345)), DataFormat::kLlmc, 4,
                   256),
         "wrong magic 12345");
  std::string cut = Shard(Counting(20, 0));
  cut.resize(cut.size() - 6);  // 3 tokens short
  expect(OpenError(WriteTemp("cut.bin", cut), DataFormat::kAuto, 4, 256),
         "cut.bin is truncated: its header gives 20 tokens (1064 bytes with the header) but it "
         "has 1058 bytes");
  expect(OpenError(WriteTemp("header.bin", Shard(Counting(20, 0)).substr(0, 100)),
                   DataFormat::kLlmc, 4, 256),
         "header.bin is truncated: 100 bytes, shorter than an llm.c shard's 1024-byte header");
  expect(OpenError(WriteTemp("big.bin", Shard(Counting(20, 250))), DataFormat::kAuto, 4, 256),
         "big.bin holds token 256 at position 6 but the vocabulary is 256");
  expect(OpenError(WriteTemp("few.bin", Shard(Counting(4, 0))), DataFormat::kAuto, 4, 256),
         "few.bin has 4 tokens, fewer than one sample of 5 (sequence length + 1)");
  expect(OpenError("/nonexistent/*.bin", DataFormat::kAuto, 4, 256),
         "no file matches /nonexistent/*.bin");
  expect(OpenError("/nonexistent/a.bin", DataFormat::kAuto, 4, 256),
         "/nonexistent/a.bin does not exist");
  EXPECT_FALSE(ParseDataFormat("int8").ok());
  EXPECT_EQ(*ParseDataFormat("uint32"), DataFormat::kUint32);
}

TEST(DataTest, SyntheticIsDeterministic) {
  auto a = TokenDataset::Synthetic(1000, 16, 256, 5);
  auto b = TokenDataset::Synthetic(1000, 16, 256, 5);
  int32_t x[16], y[16], u[16], v[16];
  a.Sample(10, x, y);
  b.Sample(10, u, v);
  EXPECT_TRUE(std::equal(x, x + 16, u));
}

}  // namespace
}  // namespace tandem
