#include "volt/datasets/token_windows.h"

#include <algorithm>
#include <filesystem>

#include "volt/core/error.h"
#include "volt/datasets/mapped_bytes.h"

namespace volt::datasets {

namespace {

namespace fs = std::filesystem;

bool is_token_type(const NpyHeader& header) {
  switch (header.dtype) {
    case torch::kByte:
    case torch::kShort:
    case torch::kInt:
    case torch::kLong:
      return true;
    default:
      return false;
  }
}

/// Reads windows [first, first + count) of a token file: tokens [first * block, (first + count)
/// * block + 1).
class WindowReader : public ExampleReader {
 public:
  WindowReader(const std::string& path, const NpyHeader& header, int64_t block, int64_t first, int64_t count,
               std::optional<int64_t> vocab_size)
      : tokens_(path, header.data_offset + first * block * header.row_bytes, (count * block + 1) * header.row_bytes),
        header_(header),
        path_(path),
        block_(block),
        first_(first),
        count_(count),
        vocab_size_(vocab_size) {}

  std::optional<Example> next() override {
    if (next_ >= count_) return std::nullopt;
    const uint8_t* start = tokens_.data() + next_ * block_ * header_.row_bytes;
    // A copy of its own (the map goes away with the reader), widened to int64 ids.
    torch::Tensor window =
        torch::from_blob(const_cast<uint8_t*>(start), {block_ + 1}, header_.dtype).to(torch::kLong, false, true);
    if (header_.uint16) window.bitwise_and_(0xffff);  // read as int16: the same bits
    if (vocab_size_) check_ids(window);
    ++next_;
    const int64_t read = next_ * block_ * header_.row_bytes;
    if (read - released_ >= internal::kReleaseEvery) {
      released_ = read;
      tokens_.release_before(released_);
    }
    return Example{.data = window.narrow(0, 0, block_), .target = window.narrow(0, 1, block_)};
  }

  int64_t skip(int64_t count) override {
    const int64_t skipped = std::min(count, count_ - next_);
    next_ += skipped;
    return skipped;
  }

 private:
  void check_ids(const torch::Tensor& window) const {
    const int64_t vocab = *vocab_size_;
    // One pass over the window's int64 ids (a copy of our own, contiguous).
    const auto* ids = window.data_ptr<int64_t>();
    if (std::all_of(ids, ids + window.numel(), [vocab](int64_t id) { return id >= 0 && id < vocab; })) return;
    const int64_t at = torch::logical_or(window < 0, window >= vocab).nonzero()[0][0].item<int64_t>();
    throw Error(fmt::format(
        "{}: token id {} at position {} is outside the model's vocabulary (ids 0..{}). HINT: the file was "
        "tokenized with another tokenizer than the model's; tokenize the corpus again with the model's tokenizer, "
        "or give the model a vocabulary that covers it.",
        path_, window[at].item<int64_t>(), (first_ + next_) * block_ + at, vocab - 1));
  }

  internal::MappedBytes tokens_;
  NpyHeader header_;
  std::string path_;
  int64_t block_;
  int64_t first_;
  int64_t count_;
  std::optional<int64_t> vocab_size_;
  int64_t next_ = 0;
  int64_t released_ = 0;
};

}  // namespace

TokenWindows::TokenWindows(std::vector<std::string> files, TokenWindowsOptions options) : options_(options) {
  VOLT_CHECK(!files.empty(), "TokenWindows got no token files. HINT: pass the .npy files of a tokenized corpus.");
  VOLT_CHECK(options_.block_size >= 1, "TokenWindows block_size={} must be at least 1. HINT: e.g. 128 tokens.",
             options_.block_size);
  VOLT_CHECK(!options_.vocab_size || *options_.vocab_size >= 1,
             "TokenWindows vocab_size={} must be at least 1. HINT: the model's vocabulary size, or unset.",
             options_.vocab_size.value_or(0));
  VOLT_CHECK(!options_.windows_per_shard || *options_.windows_per_shard >= 1,
             "TokenWindows windows_per_shard={} must be at least 1. HINT: a few hundred windows per shard.",
             options_.windows_per_shard.value_or(0));
  const int64_t block = options_.block_size;
  for (const std::string& path : files) {
    NpyHeader header = read_npy_header(path);
    VOLT_CHECK(header.shape.size() == 1 && is_token_type(header),
               "{} holds a {}-dimensional array of {}; expected a 1-D array of integer token ids (uint8, uint16, "
               "int16, int32 or int64). HINT: save the token stream with numpy.save(path, "
               "numpy.asarray(ids, dtype='uint16')).",
               path, header.shape.size(), header.uint16 ? "uint16" : c10::toString(header.dtype));
    const int64_t n = header.shape[0];
    const int64_t windows = n >= block + 1 ? (n - 1) / block : 0;
    const int64_t step = options_.windows_per_shard.value_or(std::max<int64_t>(windows, 1));
    for (int64_t first = 0; first < windows; first += step) {
      shards_.push_back({files_.size(), first, std::min(step, windows - first)});
    }
    files_.push_back({path, std::move(header)});
    size_ += windows;
    tokens_ += n;
  }
  VOLT_CHECK(size_ > 0,
             "{} files of {} tokens in all (the first: {}) hold no window of block_size + 1 = {} tokens. HINT: use "
             "a smaller --block-size or more text.",
             files_.size(), tokens_, files_.front().path, block + 1);
}

TokenWindows TokenWindows::in_folder(const std::string& folder, const std::string& prefix,
                                     TokenWindowsOptions options) {
  VOLT_CHECK(fs::is_directory(folder), "{} is not a folder. HINT: pass the folder holding {}-*.npy files.", folder,
             prefix);
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix + "-", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".npy") {
      files.push_back(entry.path().string());
    }
  }
  VOLT_CHECK(!files.empty(),
             "{} holds no {}-*.npy files. HINT: write a tokenized corpus there with "
             "scripts/prepare-text-corpus.py {}.",
             folder, prefix, folder);
  std::sort(files.begin(), files.end());
  return TokenWindows(std::move(files), options);
}

std::unique_ptr<ExampleReader> TokenWindows::open(int64_t shard) const {
  const Shard& s = shards_[static_cast<size_t>(shard)];
  const File& file = files_[s.file];
  return std::make_unique<WindowReader>(file.path, file.header, options_.block_size, s.first, s.count,
                                        options_.vocab_size);
}

std::string TokenWindows::describe(int64_t shard) const {
  const Shard& s = shards_[static_cast<size_t>(shard)];
  return fmt::format("{} (windows {} to {} of {} tokens)", files_[s.file].path, s.first, s.first + s.count - 1,
                     options_.block_size + 1);
}

}  // namespace volt::datasets
