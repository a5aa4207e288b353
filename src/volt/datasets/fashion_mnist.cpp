#include "volt/datasets/fashion_mnist.h"

#include <fmt/format.h>

#include <filesystem>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt::datasets {
namespace {

constexpr int64_t kImageSide = 28;
constexpr int64_t kClassCount = 10;

constexpr const char* kInstallHint =
    "HINT: install Debian's package with `apt-get install dataset-fashion-mnist`, or pass the "
    "directory that holds the IDX files (--data-dir).";

/// `dir`/`stem`.gz, or `dir`/`stem` when only the uncompressed file is there.
std::string find_idx_file(const std::filesystem::path& dir, const std::string& stem) {
  const std::filesystem::path compressed = dir / (stem + ".gz");
  if (std::filesystem::exists(compressed)) return compressed.string();
  const std::filesystem::path plain = dir / stem;
  if (std::filesystem::exists(plain)) return plain.string();
  throw Error(fmt::format("Fashion-MNIST file '{}' (or '{}') does not exist.\n{}", compressed.string(), plain.string(),
                          kInstallHint));
}

std::string shape_string(const torch::Tensor& tensor) {
  std::vector<std::string> parts;
  for (const int64_t dim : tensor.sizes()) parts.push_back(std::to_string(dim));
  return "[" + join(parts, ", ") + "]";
}

}  // namespace

const char* to_string(Split split) {
  switch (split) {
    case Split::kTrain:
      return "train";
    case Split::kTest:
      return "test";
  }
  VOLT_INTERNAL_ASSERT(false, "unknown Split {}", static_cast<int>(split));
}

Split parse_split(std::string_view text) {
  static constexpr Split kValues[] = {Split::kTrain, Split::kTest};
  return parse_enum(text, kValues, "split");
}

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> kClasses = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return kClasses;
}

FashionMnist load_fashion_mnist(const std::string& dir, Split split) {
  VOLT_CHECK(std::filesystem::is_directory(dir), "Fashion-MNIST directory '{}' does not exist.\n{}", dir, kInstallHint);
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = find_idx_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_idx_file(dir, prefix + "-labels-idx1-ubyte");
  const torch::Tensor images = read_idx_file(images_path);
  const torch::Tensor labels = read_idx_file(labels_path);

  VOLT_CHECK(images.dim() == 3 && images.size(1) == kImageSide && images.size(2) == kImageSide,
             "'{}' holds images of shape {}; expected [N, 28, 28]. HINT: this is not a Fashion-MNIST images file; "
             "install the data set again or check --data-dir.",
             images_path, shape_string(images));
  VOLT_CHECK(labels.dim() == 1,
             "'{}' holds labels of shape {}; expected [N]. HINT: this is not a Fashion-MNIST labels file; install the "
             "data set again or check --data-dir.",
             labels_path, shape_string(labels));
  VOLT_CHECK(images.size(0) == labels.size(0),
             "'{}' holds {} images but '{}' holds {} labels; expected one label per image. "
             "HINT: the two files come from different splits or downloads; install them again.",
             images_path, images.size(0), labels_path, labels.size(0));
  if (labels.numel() > 0) {
    const int64_t largest = labels.max().item<int64_t>();
    VOLT_CHECK(largest < kClassCount,
               "'{}' holds the label {}; expected labels in [0, 9] (Fashion-MNIST's 10 classes). HINT: the labels file "
               "is damaged or from another data set; install Fashion-MNIST again.",
               labels_path, largest);
  }

  // As torchvision's ToTensor() then Normalize((0.2860,), (0.3530,)), so that models and
  // numbers carry over from Python.
  torch::Tensor normalized = images.to(torch::kFloat32);
  normalized.div_(255).sub_(kFashionMnistMean).div_(kFashionMnistStd);
  return FashionMnist{normalized.unsqueeze(1), labels.to(torch::kInt64)};
}

}  // namespace volt::datasets
