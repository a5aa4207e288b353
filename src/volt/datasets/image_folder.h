// Images from disk, laid out as torchvision's ImageFolder reads them: one subfolder per class,
// PNG and JPEG files inside, decoded by libpng and libjpeg-turbo.
#pragma once

#include <torch/types.h>

#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "volt/data/dataset.h"
#include "volt/datasets/transforms.h"

namespace volt::datasets {

/// Decodes the PNG or JPEG file `path` (told apart by their first bytes, not the name) into a
/// uint8 tensor [C, H, W], with `channels` 1 (gray) or 3 (RGB) or, unset, the file's own (1 for
/// gray files, else 3; alpha is dropped). Throws volt::Error naming the file and what is wrong.
torch::Tensor decode_image(const std::string& path, std::optional<int64_t> channels = std::nullopt);

/// Options of ImageFolder.
struct ImageFolderOptions {
  /// Channels to decode every image to (1 or 3); unset: each file's own.
  std::optional<int64_t> channels;
  /// Applied to each decoded image, a float tensor [C, H, W] in [0, 1] (torchvision's
  /// ToTensor); random transforms draw from example_generator, so workers and resume agree.
  Transform transform;
  /// Leave out files that cannot be decoded instead of failing the batch, and count them
  /// (skipped_files); a batch gets fewer examples then. Off: such a file is an error naming it.
  bool skip_unreadable = false;
};

/// A classification data set from `root`/<class>/<image>: classes sorted by name (label = rank),
/// files sorted by path within each class, as torchvision's ImageFolder does. Examples are the
/// transformed image (data) and the class index (target, int64).
class ImageFolder : public Dataset {
 public:
  /// Lists `root`; throws volt::Error when it is missing or holds no class folder with images.
  explicit ImageFolder(std::string root, ImageFolderOptions options = {});

  int64_t size() const override;
  /// Example `index`; throws volt::Error naming the file when it cannot be decoded.
  Example get(int64_t index) const override;
  /// The examples at `indices`, collated; with skip_unreadable, those whose file cannot be
  /// decoded are left out (and counted).
  Batch get_batch(const torch::Tensor& indices) const override;

  /// The class names, by label.
  const std::vector<std::string>& classes() const { return classes_; }
  /// Every (file, label), by index.
  const std::vector<std::pair<std::string, int64_t>>& samples() const { return samples_; }
  /// The files left out so far (skip_unreadable), each once, with why, sorted.
  std::vector<std::string> skipped_files() const;

 private:
  std::string root_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::vector<std::pair<std::string, int64_t>> samples_;
  mutable std::mutex skipped_mutex_;
  mutable std::set<std::string> skipped_;
};

}  // namespace volt::datasets
