// Fashion-MNIST (Xiao et al., 2017): 70000 28x28 grayscale images of clothing in 10 classes,
// a drop-in replacement for MNIST, read from its IDX files.
#pragma once

#include <torch/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "volt/datasets/idx_file.h"

namespace volt::datasets {

/// Where Debian's dataset-fashion-mnist package installs the IDX files.
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

/// The mean of the training images' pixels scaled to [0, 1] (0.28604 over all 60000 x 784
/// pixels), the usual normalisation constant for Fashion-MNIST.
inline constexpr double kFashionMnistMean = 0.2860;
/// The standard deviation of the training images' pixels scaled to [0, 1] (0.35302).
inline constexpr double kFashionMnistStd = 0.3530;

/// Which part of a data set: the 60000 training or the 10000 test examples.
enum class Split { kTrain, kTest };
/// "train" or "test".
const char* to_string(Split split);
/// Parses "train" or "test"; throws volt::Error listing the accepted names.
Split parse_split(std::string_view text);

/// A split of Fashion-MNIST in memory.
struct FashionMnist {
  /// float32 [N, 1, 28, 28]: pixels scaled to [0, 1], then normalised as
  /// (x - kFashionMnistMean) / kFashionMnistStd (torchvision's ToTensor + Normalize).
  torch::Tensor images;
  /// int64 [N], class indices in [0, 9] (see fashion_mnist_classes()).
  torch::Tensor labels;
};

/// The 10 class names, by label: "T-shirt/top", "Trouser", ..., "Ankle boot".
const std::vector<std::string>& fashion_mnist_classes();

/// Loads one split from `dir`, which holds the IDX files under their usual names
/// (`train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`,
/// `t10k-labels-idx1-ubyte.gz`, each gzip-compressed or not, with or without the `.gz`).
///
/// Example: `auto train = volt::datasets::load_fashion_mnist(kFashionMnistDefaultDir,
/// volt::datasets::Split::kTrain);`
///
/// Throws volt::Error naming the file and saying how to get it when a file is missing, and
/// naming what was found when the files are damaged or do not belong together.
FashionMnist load_fashion_mnist(const std::string& dir, Split split);

}  // namespace volt::datasets
