#include "volt/datasets/token_windows.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <numeric>

#include "volt/data/data_loader.h"
#include "volt/datasets/test_files.h"

namespace volt::datasets {
namespace {

namespace fs = std::filesystem;
using testing::write_npy;

/// Writes `folder`/`name` as a uint16 .npy file of the token ids first, first + 1, ... (n of them),
/// stored as numpy stores uint16: ids of 32768 and more have the sign bit of an int16 set.
void write_tokens(const fs::path& folder, const std::string& name, int64_t first, int64_t n) {
  const torch::Tensor ids = torch::arange(first, first + n, torch::kInt);
  write_npy(folder / name, torch::where(ids >= 32768, ids - 65536, ids).to(torch::kShort), "<u2");
}

TEST(TokenWindows, WindowsAreConsecutiveBlocksWithTheTargetOneTokenLater) {
  testing::TempDir dir;
  write_tokens(dir.path(), "train-00000.npy", 40000, 23);  // 5 windows of 4 + 1 tokens; 2 tokens left over
  const TokenWindows windows = TokenWindows::in_folder(dir.path(), "train", {.block_size = 4});
  ASSERT_EQ(windows.num_shards(), 1);
  EXPECT_EQ(windows.size(), 5);
  EXPECT_EQ(windows.num_tokens(), 23);
  auto reader = windows.open(0);
  for (int64_t w = 0; w < 5; ++w) {
    const std::optional<Example> e = reader->next();
    ASSERT_TRUE(e.has_value()) << w;
    EXPECT_EQ(e->data.scalar_type(), torch::kLong);
    EXPECT_TRUE(torch::equal(e->data, torch::arange(40000 + 4 * w, 40004 + 4 * w, torch::kLong))) << e->data;
    EXPECT_TRUE(torch::equal(e->target, torch::arange(40001 + 4 * w, 40005 + 4 * w, torch::kLong))) << e->target;
  }
  EXPECT_FALSE(reader->next().has_value());
}

TEST(TokenWindows, FilesAreCutIntoShardsThatSeek) {
  testing::TempDir dir;
  write_tokens(dir.path(), "val-00000.npy", 0, 21);   // 5 windows
  write_tokens(dir.path(), "val-00001.npy", 100, 9);  // 2 windows
  write_tokens(dir.path(), "train-00000.npy", 0, 9);  // another split: not read
  const TokenWindows windows = TokenWindows::in_folder(dir.path(), "val", {.block_size = 4, .windows_per_shard = 2});
  ASSERT_EQ(windows.num_shards(), 4);  // 2 + 2 + 1, 2
  EXPECT_EQ(windows.size(), 7);
  EXPECT_NE(windows.describe(1).find("val-00000.npy (windows 2 to 3"), std::string::npos) << windows.describe(1);
  auto reader = windows.open(1);
  EXPECT_EQ(reader->skip(1), 1);
  EXPECT_EQ(reader->next()->data[0].item<int64_t>(), 12);  // window 3 of the file
  EXPECT_FALSE(reader->next().has_value());
  EXPECT_EQ(windows.open(3)->next()->target[3].item<int64_t>(), 104);
  EXPECT_EQ(windows.open(2)->skip(5), 1);
}

TEST(TokenWindows, AnIdOutsideTheVocabularyIsAnErrorNamingTheFileAndPosition) {
  testing::TempDir dir;
  write_tokens(dir.path(), "train-00000.npy", 0, 21);  // ids 0..20: 5 windows of 4 + 1 tokens
  const TokenWindows fits = TokenWindows::in_folder(dir.path(), "train", {.block_size = 4, .vocab_size = 21});
  EXPECT_TRUE(fits.open(0)->next().has_value());
  // A vocabulary of 15: id 15 is the 16th token, in the fourth window (tokens 12..16).
  const TokenWindows windows =
      TokenWindows::in_folder(dir.path(), "train", {.block_size = 4, .windows_per_shard = 2, .vocab_size = 15});
  auto reader = windows.open(1);  // windows 2 and 3: tokens 8..16
  EXPECT_TRUE(reader->next().has_value());
  try {
    reader->next();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("train-00000.npy: token id 15 at position 15 is outside the model's vocabulary (ids "
                           "0..14). HINT:"),
              std::string::npos)
        << message;
  }
}

TEST(TokenWindows, ALoaderReadsEveryWindowOnceAcrossProcessesAndWorkers) {
  testing::TempDir dir;
  for (int f = 0; f < 3; ++f) write_tokens(dir.path(), fmt::format("train-{:05d}.npy", f), 1000 * f, 41);
  const auto windows = std::make_shared<TokenWindows>(
      TokenWindows::in_folder(dir.path(), "train", {.block_size = 4, .windows_per_shard = 3}));
  std::vector<int64_t> seen;  // each window's first token
  for (int64_t rank = 0; rank < 2; ++rank) {
    DataLoader loader(std::static_pointer_cast<const IterableDataset>(windows),
                      {.batch_size = 3, .shuffle = true, .shuffle_buffer = 4, .num_workers = 2});
    loader.configure(2, rank, 1);
    loader.set_epoch(0);
    BatchStream stream = loader.stream(0);
    while (stream.has_next()) {
      const Batch batch = stream.next();
      ASSERT_TRUE(torch::equal(batch.target.narrow(1, 0, 3), batch.data.narrow(1, 1, 3)));
      const torch::Tensor first = batch.data.select(1, 0).contiguous();
      seen.insert(seen.end(), first.data_ptr<int64_t>(), first.data_ptr<int64_t>() + first.numel());
    }
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> all;
  for (int64_t f = 0; f < 3; ++f) {
    for (int64_t w = 0; w < 10; ++w) all.push_back(1000 * f + 4 * w);
  }
  EXPECT_EQ(seen, all);
}

TEST(TokenWindows, BadFilesAreErrorsThatSayWhatToDo) {
  testing::TempDir dir;
  const fs::path folder = dir.path();
  write_npy(folder / "a-00000.npy", torch::zeros({3, 2}, torch::kInt), "<i4");
  EXPECT_NE(testing::error_message([&] {
              TokenWindows::in_folder(dir.path(), "a", {});
            }).find("holds a 2-dimensional array of Int; expected a 1-D array of integer token ids"),
            std::string::npos);
  write_npy(folder / "b-00000.npy", torch::zeros({30}), "<f4");
  EXPECT_NE(testing::error_message([&] { TokenWindows::in_folder(dir.path(), "b", {}); }).find("array of Float"),
            std::string::npos);
  write_tokens(folder, "c-00000.npy", 0, 8);
  EXPECT_NE(testing::error_message([&] {
              TokenWindows::in_folder(dir.path(), "c", {.block_size = 8});
            }).find("hold no window of block_size + 1 = 9 tokens. HINT"),
            std::string::npos);
  EXPECT_NE(testing::error_message([&] {
              TokenWindows::in_folder(dir.path(), "d", {});
            }).find("holds no d-*.npy files. HINT: write a tokenized corpus there with scripts/prepare-text-corpus.py"),
            std::string::npos);
  EXPECT_NE(testing::error_message([&] { NpyShards::in_folder(dir.path()); }).find("no data-*.npy"), std::string::npos);
  write_tokens(folder, "data-00000.npy", 0, 8);
  EXPECT_NE(testing::error_message([&] { NpyShards::in_folder(dir.path()); }).find("uint16 elements"),
            std::string::npos);
}

}  // namespace
}  // namespace volt::datasets
