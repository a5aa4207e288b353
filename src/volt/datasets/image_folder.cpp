#include "volt/datasets/image_folder.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/data/data_loader.h"

namespace volt::datasets {

namespace fs = std::filesystem;

namespace {

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VOLT_CHECK(in.good(), "cannot open image '{}': {}. HINT: check that the file exists and is readable.", path,
             std::strerror(errno));
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool is_png(const std::vector<unsigned char>& bytes) {
  static const unsigned char kMagic[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  return bytes.size() >= sizeof(kMagic) && std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0;
}

bool is_jpeg(const std::vector<unsigned char>& bytes) {
  return bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff;
}

torch::Tensor decode_png(const std::vector<unsigned char>& bytes, const std::string& path,
                         std::optional<int64_t> channels) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  // libpng's simplified API: it frees its own state on failure and reports in image.message.
  if (png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()) == 0) {
    throw Error(
        fmt::format("cannot decode PNG '{}': {}. HINT: the file is damaged; replace or remove it, or set "
                    "ImageFolderOptions::skip_unreadable.",
                    path, image.message));
  }
  const int64_t c = channels.value_or((image.format & PNG_FORMAT_FLAG_COLOR) != 0 ? 3 : 1);
  image.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  torch::Tensor out =
      torch::empty({static_cast<int64_t>(image.height), static_cast<int64_t>(image.width), c}, torch::kUInt8);
  if (png_image_finish_read(&image, nullptr, out.data_ptr<uint8_t>(), 0, nullptr) == 0) {
    png_image_free(&image);
    throw Error(
        fmt::format("cannot decode PNG '{}': {}. HINT: the file is damaged; replace or remove it, or set "
                    "ImageFolderOptions::skip_unreadable.",
                    path, image.message));
  }
  return out.permute({2, 0, 1}).contiguous();
}

torch::Tensor decode_jpeg(const std::vector<unsigned char>& bytes, const std::string& path,
                          std::optional<int64_t> channels) {
  const std::unique_ptr<void, int (*)(tjhandle)> handle(tjInitDecompress(), tjDestroy);
  VOLT_CHECK(handle != nullptr,
             "libjpeg-turbo could not start a decompressor for '{}'. HINT: this happens when memory runs out; free "
             "memory or lower DataLoaderOptions::num_workers.",
             path);
  int width = 0;
  int height = 0;
  int subsampling = 0;
  int colorspace = 0;
  const auto fail = [&] {
    throw Error(
        fmt::format("cannot decode JPEG '{}': {}. HINT: the file is damaged; replace or remove it, or set "
                    "ImageFolderOptions::skip_unreadable.",
                    path, tjGetErrorStr2(handle.get())));
  };
  if (tjDecompressHeader3(handle.get(), bytes.data(), bytes.size(), &width, &height, &subsampling, &colorspace) != 0)
    fail();
  const int64_t c = channels.value_or(colorspace == TJCS_GRAY ? 1 : 3);
  torch::Tensor out = torch::empty({height, width, c}, torch::kUInt8);
  if (tjDecompress2(handle.get(), bytes.data(), bytes.size(), out.data_ptr<uint8_t>(), width, 0, height,
                    c == 1 ? TJPF_GRAY : TJPF_RGB, TJFLAG_ACCURATEDCT) != 0) {
    fail();
  }
  return out.permute({2, 0, 1}).contiguous();
}

bool is_image_name(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

}  // namespace

torch::Tensor decode_image(const std::string& path, std::optional<int64_t> channels) {
  VOLT_CHECK(!channels || *channels == 1 || *channels == 3,
             "decode_image: channels={} is not supported; expected 1 (gray) or 3 (RGB). HINT: pass 1 or 3, or leave "
             "channels unset to keep each image's own.",
             channels.value_or(0));
  const std::vector<unsigned char> bytes = read_bytes(path);
  if (is_png(bytes)) return decode_png(bytes, path, channels);
  if (is_jpeg(bytes)) return decode_jpeg(bytes, path, channels);
  throw Error(
      fmt::format("'{}' is neither a PNG nor a JPEG file ({} bytes; its first bytes are not either "
                  "format's signature). HINT: convert it, or remove it from the image folder.",
                  path, bytes.size()));
}

ImageFolder::ImageFolder(std::string root, ImageFolderOptions options)
    : root_(std::move(root)), options_(std::move(options)) {
  VOLT_CHECK(fs::is_directory(root_),
             "image folder '{}' does not exist or is not a directory. HINT: pass a folder with one subfolder per "
             "class (root/<class>/<image>.png), as torchvision's ImageFolder reads.",
             root_);
  for (const auto& entry : fs::directory_iterator(root_))
    if (entry.is_directory()) classes_.push_back(entry.path().filename().string());
  std::sort(classes_.begin(), classes_.end());
  for (size_t label = 0; label < classes_.size(); ++label) {
    std::vector<std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(fs::path(root_) / classes_[label])) {
      if (entry.is_regular_file() && is_image_name(entry.path())) files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    for (std::string& file : files) samples_.emplace_back(std::move(file), static_cast<int64_t>(label));
  }
  VOLT_CHECK(!samples_.empty(),
             "image folder '{}' holds no images ({} class folders: {}); expected root/<class>/<image> with .png, "
             ".jpg or .jpeg files. HINT: point at the folder whose subfolders are the classes.",
             root_, classes_.size(), classes_.empty() ? "none" : join(classes_, ", "));
}

int64_t ImageFolder::size() const { return static_cast<int64_t>(samples_.size()); }

Example ImageFolder::get(int64_t index) const {
  VOLT_CHECK(index >= 0 && index < size(),
             "ImageFolder '{}' has {} images; index {} is out of range. HINT: pass an index in [0, size()); check that "
             "the sampler was made for this dataset.",
             root_, size(), index);
  const auto& [path, label] = samples_[static_cast<size_t>(index)];
  torch::Tensor image = decode_image(path, options_.channels).to(torch::kFloat).div_(255);
  if (options_.transform) {
    at::Generator generator = example_generator(index);
    image = options_.transform(image, generator);
  }
  return Example{image, torch::tensor(label, torch::kLong), {}, {}};
}

Batch ImageFolder::get_batch(const torch::Tensor& indices) const {
  if (!options_.skip_unreadable) return Dataset::get_batch(indices);
  const torch::Tensor order = indices.to(torch::kLong).contiguous();
  std::vector<Example> examples;
  std::vector<std::string> failures;
  for (int64_t i = 0; i < order.numel(); ++i) {
    try {
      examples.push_back(get(order.data_ptr<int64_t>()[i]));
    } catch (const Error& e) {
      failures.push_back(e.what());
    }
  }
  if (!failures.empty()) {
    const std::lock_guard<std::mutex> lock(skipped_mutex_);
    skipped_.insert(failures.begin(), failures.end());
  }
  VOLT_CHECK(!examples.empty(),
             "every image of a batch of {} from '{}' was unreadable; the first: {}\nHINT: skip_unreadable needs at "
             "least one readable image per batch; replace or remove the broken files.",
             order.numel(), root_, failures.front());
  return default_collate(std::move(examples));
}

std::vector<std::string> ImageFolder::skipped_files() const {
  const std::lock_guard<std::mutex> lock(skipped_mutex_);
  return std::vector<std::string>(skipped_.begin(), skipped_.end());
}

}  // namespace volt::datasets
