#include "volt/datasets/transforms.h"

#include <torch/torch.h>

#include "volt/core/error.h"

namespace volt::datasets {

namespace {

void check_image(const torch::Tensor& image, const char* who) {
  VOLT_CHECK(image.defined() && image.dim() == 3,
             "{} takes an image shaped [C, H, W]; got {}. HINT: decode images to [C, H, W] (ImageFolder does).", who,
             image.defined() ? c10::str(image.sizes()) : std::string("an undefined tensor"));
}

/// A uniform integer in [0, bound].
int64_t uniform(at::Generator& generator, int64_t bound) {
  return torch::randint(bound + 1, {1}, generator, torch::kLong).item<int64_t>();
}

}  // namespace

Transform resize(int64_t height, int64_t width) {
  VOLT_CHECK(height >= 1 && width >= 1,
             "resize({}, {}): sizes must be at least 1. HINT: pass the output height and width in pixels, e.g. "
             "resize(224, 224).",
             height, width);
  return [height, width](const torch::Tensor& image, at::Generator&) {
    check_image(image, "resize");
    namespace F = torch::nn::functional;
    return F::interpolate(image.unsqueeze(0).to(torch::kFloat), F::InterpolateFuncOptions()
                                                                    .size(std::vector<int64_t>{height, width})
                                                                    .mode(torch::kBilinear)
                                                                    .align_corners(false))
        .squeeze(0);
  };
}

Transform center_crop(int64_t height, int64_t width) {
  return [height, width](const torch::Tensor& image, at::Generator&) {
    check_image(image, "center_crop");
    VOLT_CHECK(image.size(1) >= height && image.size(2) >= width,
               "center_crop({}, {}) got an image of {} x {}. HINT: resize first, or crop less.", height, width,
               image.size(1), image.size(2));
    const int64_t top = (image.size(1) - height) / 2;
    const int64_t left = (image.size(2) - width) / 2;
    return image.narrow(1, top, height).narrow(2, left, width);
  };
}

Transform random_crop(int64_t height, int64_t width, int64_t padding) {
  VOLT_CHECK(padding >= 0,
             "random_crop padding={} must be >= 0. HINT: pass the number of pixels to pad on each side, or 0 (the "
             "default) for none.",
             padding);
  return [height, width, padding](const torch::Tensor& image, at::Generator& generator) {
    check_image(image, "random_crop");
    const torch::Tensor padded =
        padding > 0 ? torch::constant_pad_nd(image, {padding, padding, padding, padding}, 0) : image;
    VOLT_CHECK(padded.size(1) >= height && padded.size(2) >= width,
               "random_crop({}, {}) got an image of {} x {} (after padding {}). HINT: resize first, or crop less.",
               height, width, padded.size(1), padded.size(2), padding);
    const int64_t top = uniform(generator, padded.size(1) - height);
    const int64_t left = uniform(generator, padded.size(2) - width);
    return padded.narrow(1, top, height).narrow(2, left, width);
  };
}

Transform random_horizontal_flip(double p) {
  VOLT_CHECK(p >= 0 && p <= 1,
             "random_horizontal_flip p={} must be in [0, 1]. HINT: p is the probability of a flip; the default is 0.5.",
             p);
  return [p](const torch::Tensor& image, at::Generator& generator) {
    check_image(image, "random_horizontal_flip");
    const double draw = torch::rand({1}, generator).item<double>();
    return draw < p ? image.flip({2}) : image;
  };
}

Transform normalize(std::vector<double> mean, std::vector<double> std) {
  VOLT_CHECK(!mean.empty() && mean.size() == std.size(),
             "normalize got {} means and {} standard deviations; expected one pair per channel (or one for all). HINT: "
             "pass e.g. normalize({{0.485, 0.456, 0.406}}, {{0.229, 0.224, 0.225}}) for RGB, or normalize({{0.5}}, "
             "{{0.5}}) for all channels.",
             mean.size(), std.size());
  for (const double s : std)
    VOLT_CHECK(s > 0,
               "normalize: a standard deviation of {} must be > 0. HINT: pass each channel's standard deviation over "
               "the training data, e.g. {{0.229, 0.224, 0.225}} for ImageNet.",
               s);
  const torch::Tensor m = torch::tensor(mean, torch::kFloat).view({-1, 1, 1});
  const torch::Tensor s = torch::tensor(std, torch::kFloat).view({-1, 1, 1});
  return [m, s](const torch::Tensor& image, at::Generator&) {
    check_image(image, "normalize");
    VOLT_CHECK(m.size(0) == 1 || m.size(0) == image.size(0),
               "normalize has {} channel values but the image has {} channels. HINT: give one mean and std per "
               "channel, or one for all.",
               m.size(0), image.size(0));
    return (image.to(torch::kFloat) - m) / s;
  };
}

Transform compose(std::vector<Transform> transforms) {
  return [transforms = std::move(transforms)](const torch::Tensor& image, at::Generator& generator) {
    torch::Tensor out = image;
    for (const Transform& t : transforms) out = t(out, generator);
    return out;
  };
}

}  // namespace volt::datasets
