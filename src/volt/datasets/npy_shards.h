// A data set stored as NumPy .npy shard files, read as a stream through memory maps.
//
// `np.save` writes what Python users already have; a folder of files of a few hundred MB each is
// how data larger than memory is kept. Each shard is mapped, read front to back and its pages
// released as it goes, so a process holds a few MB of it however large the whole is, and a
// resume seeks to the saved example instead of reading up to it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/data/iterable_dataset.h"
#include "volt/datasets/transforms.h"

namespace volt::datasets {

/// The layout of one .npy file: what its header says.
struct NpyHeader {
  /// The element type.
  torch::ScalarType dtype = torch::kFloat;
  /// The elements are uint16 ('<u2', e.g. token ids), which LibTorch 1.13 has no type for: dtype
  /// is then kShort, the same two bytes, and a reader widens them (TokenWindows and gpt's
  /// --eval-tokens do). NpyShards refuses such files.
  bool uint16 = false;
  /// The array's shape (the first dimension indexes the examples).
  std::vector<int64_t> shape;
  /// Where the data starts in the file.
  int64_t data_offset = 0;
  /// Bytes per example (one row of the first dimension).
  int64_t row_bytes = 0;
};

/// Reads the header of the .npy file `path` (format 1.0 to 3.0, little-endian, C order); throws
/// volt::Error naming the file and what it holds when Volt cannot map it.
NpyHeader read_npy_header(const std::string& path);

/// Options of NpyShards.
struct NpyShardsOptions {
  /// Cut each file into shards of at most this many examples, so that processes x loader
  /// workers have shards enough to share; unset: one shard per file.
  std::optional<int64_t> examples_per_shard;
  /// Applied to each example's data row as stored (e.g. uint8 pixels to normalized floats), on
  /// the loader's worker; its generator is example_generator of the example's global index.
  Transform transform;
};

/// Examples from pairs of .npy files: `data[i]` holds inputs [N_i, ...], `targets[i]` (if
/// given) targets [N_i] or [N_i, ...] of the same N_i. An IterableDataset for
/// volt::DataLoader: its shards are the files (or their pieces, examples_per_shard).
///
/// Example: `DataLoader(std::make_shared<NpyShards>(NpyShards::in_folder("/data/train")), {.batch_size = 256})`.
class NpyShards : public IterableDataset {
 public:
  /// Reads every file's header; throws volt::Error when one is missing, unreadable, or when
  /// data and target files differ in count or length.
  NpyShards(std::vector<std::string> data, std::vector<std::string> targets, NpyShardsOptions options = {});
  /// The files `folder`/data-*.npy and `folder`/target-*.npy, each sorted by name.
  static NpyShards in_folder(const std::string& folder, NpyShardsOptions options = {});

  int64_t num_shards() const override { return static_cast<int64_t>(shards_.size()); }
  std::unique_ptr<ExampleReader> open(int64_t shard) const override;
  std::string describe(int64_t shard) const override;
  /// Examples in all files.
  int64_t size() const { return size_; }

 private:
  struct File {
    std::string path;
    NpyHeader header;
  };
  struct Shard {
    size_t file;     // index into data_ (and targets_)
    int64_t first;   // the first example in the file
    int64_t count;   // examples in the shard
    int64_t global;  // the index of its first example across all files
  };
  std::vector<File> data_;
  std::vector<File> targets_;
  NpyShardsOptions options_;
  std::vector<Shard> shards_;
  int64_t size_ = 0;
};

}  // namespace volt::datasets
