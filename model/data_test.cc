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
