#include "volt/datasets/npy_shards.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "volt/core/error.h"
#include "volt/data/data_loader.h"
#include "volt/datasets/test_files.h"

namespace volt::datasets {
namespace {

namespace fs = std::filesystem;
using testing::write_npy;

/// data-0000<f>.npy (uint8 [n, 2, 3], example i filled with i) and target-0000<f>.npy (int64 [n] = i).
void write_pair(const fs::path& dir, int file, int64_t first, int64_t n) {
  const torch::Tensor ids = torch::arange(first, first + n, torch::kLong);
  write_npy(dir / fmt::format("data-{:05d}.npy", file),
            ids.to(torch::kByte).view({n, 1, 1}).expand({n, 2, 3}).contiguous(), "|u1");
  write_npy(dir / fmt::format("target-{:05d}.npy", file), ids, "<i8");
}

std::vector<int64_t> read_all(const NpyShards& shards, int64_t shard) {
  std::vector<int64_t> out;
  auto reader = shards.open(shard);
  while (std::optional<Example> e = reader->next()) {
    EXPECT_EQ(e->data.sizes(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(e->data.scalar_type(), torch::kByte);
    EXPECT_EQ(e->data.min().item<int64_t>(), e->target.item<int64_t>());
    out.push_back(e->target.item<int64_t>());
  }
  return out;
}

TEST(NpyShards, ReadsEveryExampleOfEveryFileInOrder) {
  testing::TempDir dir;
  write_pair(fs::path(dir.path()), 0, 0, 5);
  write_pair(fs::path(dir.path()), 1, 5, 3);
  const NpyShards shards = NpyShards::in_folder(fs::path(dir.path()).string());
  ASSERT_EQ(shards.num_shards(), 2);
  EXPECT_EQ(shards.size(), 8);
  EXPECT_EQ(read_all(shards, 0), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(read_all(shards, 1), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_NE(shards.describe(1).find("data-00001.npy"), std::string::npos);
}

TEST(NpyShards, ExamplesPerShardCutsFilesIntoPieces) {
  testing::TempDir dir;
  write_pair(fs::path(dir.path()), 0, 0, 5);
  write_pair(fs::path(dir.path()), 1, 5, 3);
  const NpyShards shards = NpyShards::in_folder(fs::path(dir.path()).string(), {.examples_per_shard = 2});
  ASSERT_EQ(shards.num_shards(), 5);  // 2 + 2 + 1, 2 + 1
  EXPECT_EQ(read_all(shards, 2), (std::vector<int64_t>{4}));
  EXPECT_EQ(read_all(shards, 3), (std::vector<int64_t>{5, 6}));
  EXPECT_NE(shards.describe(3).find("(examples 0 to 1)"), std::string::npos) << shards.describe(3);
}

TEST(NpyShards, SkipSeeksWithoutReading) {
  testing::TempDir dir;
  write_pair(fs::path(dir.path()), 0, 0, 6);
  const NpyShards shards = NpyShards::in_folder(fs::path(dir.path()).string());
  auto reader = shards.open(0);
  EXPECT_EQ(reader->skip(4), 4);
  EXPECT_EQ(reader->next()->target.item<int64_t>(), 4);
  EXPECT_EQ(reader->skip(10), 1);
  EXPECT_FALSE(reader->next().has_value());
}

TEST(NpyShards, TheTransformSeesTheStoredRow) {
  testing::TempDir dir;
  write_pair(fs::path(dir.path()), 0, 0, 3);
  NpyShardsOptions options;
  options.transform = [](const torch::Tensor& row, at::Generator&) { return row.to(torch::kFloat).div(255); };
  const NpyShards shards = NpyShards::in_folder(fs::path(dir.path()).string(), options);
  auto reader = shards.open(0);
  reader->next();
  const Example e = *reader->next();
  EXPECT_EQ(e.data.scalar_type(), torch::kFloat);
  EXPECT_FLOAT_EQ(e.data[0][0].item<float>(), 1.0f / 255);
}

TEST(NpyShards, FeedsALoaderAcrossProcesses) {
  testing::TempDir dir;
  for (int f = 0; f < 3; ++f) write_pair(fs::path(dir.path()), f, 10 * f, 10);
  const auto shards =
      std::make_shared<NpyShards>(NpyShards::in_folder(fs::path(dir.path()).string(), {.examples_per_shard = 4}));
  std::vector<int64_t> seen;
  for (int64_t rank = 0; rank < 2; ++rank) {
    DataLoader loader(std::static_pointer_cast<const IterableDataset>(shards),
                      {.batch_size = 3, .shuffle = true, .num_workers = 2});
    loader.configure(2, rank, 1);
    loader.set_epoch(0);
    BatchStream stream = loader.stream(0);
    while (stream.has_next()) {
      const torch::Tensor t = stream.next().target;
      seen.insert(seen.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    }
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> all(30);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(seen, all);
}

TEST(NpyShards, FloatShardsReadBackBitExact) {
  testing::TempDir dir;
  const torch::Tensor x = torch::randn({4, 7});
  write_npy(fs::path(dir.path()) / "data-0.npy", x, "<f4");
  const NpyShards shards({(fs::path(dir.path()) / "data-0.npy").string()}, {});
  auto reader = shards.open(0);
  for (int64_t i = 0; i < 4; ++i) {
    const Example e = *reader->next();
    EXPECT_TRUE(torch::equal(e.data, x[i]));
    EXPECT_FALSE(e.target.defined());
  }
}

void expect_error(const std::function<void()>& make, const std::string& part) {
  try {
    make();
    ADD_FAILURE() << "no error; expected one with: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(NpyShards, BadFilesAreErrorsThatSayWhatToDo) {
  testing::TempDir dir;
  const fs::path p = fs::path(dir.path()) / "x.npy";
  std::ofstream(fs::path(dir.path()) / "not.npy") << "hello, world";
  expect_error([&] { read_npy_header((fs::path(dir.path()) / "not.npy").string()); }, "does not start with \\x93NUMPY");
  write_npy(p, torch::zeros({3, 2}), "<f4", /*fortran=*/true);
  expect_error([&] { read_npy_header(p.string()); }, "Fortran order. HINT:");
  write_npy(p, torch::zeros({3, 2}), ">f4");
  expect_error([&] { read_npy_header(p.string()); }, "big-endian");
  write_npy(p, torch::zeros({3, 2}), "<c8");
  expect_error([&] { read_npy_header(p.string()); }, "type '<c8'");
  // uint16 (token ids) has no LibTorch 1.13 type: the header says so, and NpyShards refuses it.
  write_npy(p, torch::zeros({3}, torch::kShort), "<u2");
  EXPECT_TRUE(read_npy_header(p.string()).uint16);
  expect_error([&] { NpyShards({p.string()}, {}); }, "holds uint16 elements, which NpyShards does not read");
  write_npy(p, torch::zeros({3, 2}), "<f4");
  fs::resize_file(p, fs::file_size(p) - 4);
  expect_error([&] { read_npy_header(p.string()); }, "is cut short");
  write_npy(fs::path(dir.path()) / "a.npy", torch::zeros({3, 2}), "<f4");
  write_npy(fs::path(dir.path()) / "b.npy", torch::zeros({4}, torch::kLong), "<i8");
  expect_error(
      [&] { NpyShards({(fs::path(dir.path()) / "a.npy").string()}, {(fs::path(dir.path()) / "b.npy").string()}); },
      "has 3 examples but its target file");
  expect_error([&] { NpyShards::in_folder((fs::path(dir.path()) / "nothing").string()); }, "is not a folder");
  expect_error([&] { NpyShards::in_folder(fs::path(dir.path()).string()); }, "holds no data-*.npy files. HINT");
}

}  // namespace
}  // namespace volt::datasets
