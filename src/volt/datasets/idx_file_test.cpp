#include "volt/datasets/idx_file.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>

#include "volt/core/error.h"
#include "volt/datasets/test_files.h"

namespace volt::datasets {
namespace {

using testing::error_message;
using testing::idx_bytes;
using testing::TempDir;

std::vector<uint8_t> counting(size_t n) {
  std::vector<uint8_t> data(n);
  std::iota(data.begin(), data.end(), uint8_t{0});
  return data;
}

TEST(ReadIdxFile, ReadsAPlainFileIntoATensorOfItsShape) {
  TempDir dir;
  testing::write_plain(dir.file("x-idx3-ubyte"), idx_bytes({2, 3, 2}, counting(12)));
  const torch::Tensor tensor = read_idx_file(dir.file("x-idx3-ubyte"));
  EXPECT_EQ(tensor.scalar_type(), torch::kUInt8);
  EXPECT_EQ(tensor.sizes(), (std::vector<int64_t>{2, 3, 2}));
  EXPECT_TRUE(torch::equal(tensor, torch::arange(12, torch::kUInt8).view({2, 3, 2})));
}

TEST(ReadIdxFile, ReadsAGzipFileIntoATensorOfItsShape) {
  TempDir dir;
  testing::write_gzip(dir.file("y-idx1-ubyte.gz"), idx_bytes({200}, counting(200)));
  const torch::Tensor tensor = read_idx_file(dir.file("y-idx1-ubyte.gz"));
  EXPECT_EQ(tensor.sizes(), (std::vector<int64_t>{200}));
  EXPECT_EQ(tensor[199].item<int>(), 199);
}

TEST(ReadIdxFile, MissingFileIsNamed) {
  TempDir dir;
  const std::string message = error_message([&] { read_idx_file(dir.file("absent.gz")); });
  EXPECT_NE(message.find("'" + dir.file("absent.gz") + "' does not exist"), std::string::npos) << message;
}

TEST(ReadIdxFile, BadMagicNumberIsReportedWithWhatWasFound) {
  TempDir dir;
  testing::write_plain(dir.file("bad"), "PK\x03\x04 not an idx file");
  const std::string message = error_message([&] { read_idx_file(dir.file("bad")); });
  EXPECT_NE(message.find("is not an IDX file: its magic number is 0x504b0304"), std::string::npos) << message;
}

TEST(ReadIdxFile, OtherDataTypesAreRejectedByName) {
  TempDir dir;
  testing::write_plain(dir.file("floats"), idx_bytes({1}, {0, 0, 0, 0}, 0x0D));
  const std::string message = error_message([&] { read_idx_file(dir.file("floats")); });
  EXPECT_NE(message.find("type 0x0d (float); expected 0x08 (unsigned byte)"), std::string::npos) << message;
}

TEST(ReadIdxFile, TruncatedDataSaysHowMuchWasDeclaredAndFound) {
  TempDir dir;
  testing::write_gzip(dir.file("short.gz"), idx_bytes({10, 2}, counting(15)));
  const std::string message = error_message([&] { read_idx_file(dir.file("short.gz")); });
  EXPECT_NE(message.find("truncated: its header declares shape [10, 2] (20 bytes of data) but "
                         "the file holds only 15"),
            std::string::npos)
      << message;
}

TEST(ReadIdxFile, TruncatedHeaderIsReported) {
  TempDir dir;
  // Rank 3, but only 2 bytes of the first size follow.
  testing::write_plain(dir.file("header"), std::string("\0\0\x08\x03\0\0", 6));
  const std::string message = error_message([&] { read_idx_file(dir.file("header")); });
  EXPECT_NE(message.find("truncated: its header declares 3 dimensions"), std::string::npos) << message;
}

TEST(ReadIdxFile, TrailingDataIsReported) {
  TempDir dir;
  testing::write_plain(dir.file("long"), idx_bytes({4}, counting(6)));
  const std::string message = error_message([&] { read_idx_file(dir.file("long")); });
  EXPECT_NE(message.find("holds more data than its header declares (shape [4], 4 bytes)"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace volt::datasets
