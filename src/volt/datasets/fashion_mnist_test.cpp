#include "volt/datasets/fashion_mnist.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "volt/core/error.h"
#include "volt/datasets/test_files.h"

namespace volt::datasets {
namespace {

using testing::error_message;
using testing::idx_bytes;
using testing::TempDir;

/// Writes a 3-image training split: image i is filled with the value 255 * i / 2, label 7 - i.
void write_tiny_train_split(const TempDir& dir, uint32_t labels = 3, uint8_t first_label = 7) {
  std::vector<uint8_t> pixels;
  for (const uint8_t value : {0, 127, 255}) pixels.insert(pixels.end(), 28 * 28, value);
  testing::write_gzip(dir.file("train-images-idx3-ubyte.gz"), idx_bytes({3, 28, 28}, pixels));
  std::vector<uint8_t> label_values;
  for (uint32_t i = 0; i < labels; ++i) label_values.push_back(first_label - i);
  // Uncompressed, under the name without .gz, as some downloads unpack them.
  testing::write_plain(dir.file("train-labels-idx1-ubyte"), idx_bytes({labels}, label_values));
}

TEST(LoadFashionMnist, ReadsGzipAndPlainFilesAndNormalizes) {
  TempDir dir;
  write_tiny_train_split(dir);
  const FashionMnist data = load_fashion_mnist(dir.path(), Split::kTrain);
  EXPECT_EQ(data.images.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_EQ(data.images.scalar_type(), torch::kFloat32);
  EXPECT_EQ(data.labels.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(data.labels, torch::tensor({7, 6, 5}, torch::kInt64)));
  EXPECT_FLOAT_EQ(data.images[0][0][0][0].item<float>(), (0.0 - 0.2860) / 0.3530);
  EXPECT_FLOAT_EQ(data.images[2][0][27][27].item<float>(), (1.0 - 0.2860) / 0.3530);
}

TEST(LoadFashionMnist, MissingDirectorySaysHowToInstallTheData) {
  const std::string message = error_message([] { load_fashion_mnist("/nonexistent/fashion", Split::kTrain); });
  EXPECT_NE(message.find("directory '/nonexistent/fashion' does not exist"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT: install Debian's package with `apt-get install "
                         "dataset-fashion-mnist`, or pass the directory that holds the IDX "
                         "files (--data-dir)"),
            std::string::npos)
      << message;
}

TEST(LoadFashionMnist, MissingFileNamesBothAcceptedNames) {
  TempDir dir;
  write_tiny_train_split(dir);
  const std::string message = error_message([&] { load_fashion_mnist(dir.path(), Split::kTest); });
  EXPECT_NE(message.find("'" + dir.file("t10k-images-idx3-ubyte.gz") + "' (or '" + dir.file("t10k-images-idx3-ubyte") +
                         "') does not exist"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("apt-get install dataset-fashion-mnist"), std::string::npos) << message;
}

TEST(LoadFashionMnist, ImageAndLabelCountsMustAgree) {
  TempDir dir;
  write_tiny_train_split(dir, /*labels=*/2);
  const std::string message = error_message([&] { load_fashion_mnist(dir.path(), Split::kTrain); });
  EXPECT_NE(message.find("holds 3 images but"), std::string::npos) << message;
  EXPECT_NE(message.find("holds 2 labels; expected one label per image"), std::string::npos) << message;
}

TEST(LoadFashionMnist, LabelsOutsideTheTenClassesAreRejected) {
  TempDir dir;
  write_tiny_train_split(dir, 3, /*first_label=*/12);
  const std::string message = error_message([&] { load_fashion_mnist(dir.path(), Split::kTrain); });
  EXPECT_NE(message.find("holds the label 12; expected labels in [0, 9]"), std::string::npos) << message;
}

TEST(LoadFashionMnist, ImagesMustBe28By28) {
  TempDir dir;
  write_tiny_train_split(dir);
  testing::write_gzip(dir.file("train-images-idx3-ubyte.gz"),
                      idx_bytes({3, 27, 28}, std::vector<uint8_t>(3 * 27 * 28)));
  const std::string message = error_message([&] { load_fashion_mnist(dir.path(), Split::kTrain); });
  EXPECT_NE(message.find("holds images of shape [3, 27, 28]; expected [N, 28, 28]"), std::string::npos) << message;
}

TEST(Split, NamesRoundTripAndBadNamesListTheChoices) {
  EXPECT_EQ(parse_split(to_string(Split::kTrain)), Split::kTrain);
  EXPECT_EQ(parse_split(to_string(Split::kTest)), Split::kTest);
  const std::string message = error_message([] { parse_split("validation"); });
  EXPECT_NE(message.find("expected one of: train, test"), std::string::npos) << message;
}

TEST(FashionMnistClasses, AreTheTenNamesInLabelOrder) {
  const auto& classes = fashion_mnist_classes();
  ASSERT_EQ(classes.size(), 10u);
  EXPECT_EQ(classes.front(), "T-shirt/top");
  EXPECT_EQ(classes[5], "Sandal");
  EXPECT_EQ(classes.back(), "Ankle boot");
}

/// Skips the test, saying why, when Debian's Fashion-MNIST package is not installed.
#define SKIP_WITHOUT_INSTALLED_FASHION_MNIST()                 \
  if (!std::filesystem::is_directory(kFashionMnistDefaultDir)) \
  GTEST_SKIP() << kFashionMnistDefaultDir                      \
               << " does not exist; install the package dataset-fashion-mnist to run this test"

TEST(InstalledFashionMnist, TrainSplitHas6000ImagesPerClassNormalizedToMean0Std1) {
  SKIP_WITHOUT_INSTALLED_FASHION_MNIST();
  const auto start = std::chrono::steady_clock::now();
  const FashionMnist train = load_fashion_mnist(kFashionMnistDefaultDir, Split::kTrain);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  std::cout << "loading the train split took " << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count()
            << " ms\n";

  EXPECT_EQ(train.images.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(train.labels.sizes(), (std::vector<int64_t>{60000}));
  EXPECT_EQ(train.labels.min().item<int64_t>(), 0);
  EXPECT_EQ(train.labels.max().item<int64_t>(), 9);
  EXPECT_TRUE(torch::equal(torch::bincount(train.labels), torch::full({10}, 6000, torch::kInt64)));
  EXPECT_NEAR(train.images.mean().item<double>(), 0.0, 1e-3);
  EXPECT_NEAR(train.images.std().item<double>(), 1.0, 1e-3);
}

TEST(InstalledFashionMnist, TestSplitHas10000ImagesPerClass1000) {
  SKIP_WITHOUT_INSTALLED_FASHION_MNIST();
  const FashionMnist test = load_fashion_mnist(kFashionMnistDefaultDir, Split::kTest);
  EXPECT_EQ(test.images.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(torch::bincount(test.labels), torch::full({10}, 1000, torch::kInt64)));
}

}  // namespace
}  // namespace volt::datasets
