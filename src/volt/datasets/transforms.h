// The image transforms a classifier needs, as small functions that compose (torchvision's
// transforms): each takes a float image [C, H, W] and a generator for its random choices.
#pragma once

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <functional>
#include <vector>

namespace volt::datasets {

/// An image transform: `image` [C, H, W] to a new image; random ones draw from `generator`
/// (give them volt::example_generator(index) so workers and resume agree).
using Transform = std::function<torch::Tensor(const torch::Tensor& image, at::Generator& generator)>;

/// Bilinear resize to `height` x `width` (torchvision's Resize((h, w)), antialias off).
Transform resize(int64_t height, int64_t width);
/// The centre `height` x `width` window; throws volt::Error when the image is smaller.
Transform center_crop(int64_t height, int64_t width);
/// A random `height` x `width` window, after zero-padding each side by `padding` pixels.
Transform random_crop(int64_t height, int64_t width, int64_t padding = 0);
/// Mirrors the image left-right with probability `p`.
Transform random_horizontal_flip(double p = 0.5);
/// (image - mean) / std per channel; `mean` and `std` have one value per channel (or one for all).
Transform normalize(std::vector<double> mean, std::vector<double> std);
/// The transforms in order.
Transform compose(std::vector<Transform> transforms);

}  // namespace volt::datasets
