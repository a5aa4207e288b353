// Training windows for a language model, cut from token streams stored as 1-D .npy files and
// read as a stream through memory maps (the reader of NpyShards).
//
// A corpus is tokenized once (e.g. scripts/prepare-text-corpus.py: SentencePiece ids, uint16)
// into files of a million tokens or so; a model trains on windows of block_size + 1 consecutive
// tokens, predicting each of the last block_size from the ones before it. Each file is cut into
// shards of whole windows, so processes x loader workers share a few files, and a resume seeks
// to the saved window instead of reading up to it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/data/iterable_dataset.h"
#include "volt/datasets/npy_shards.h"

namespace volt::datasets {

/// Options of TokenWindows.
struct TokenWindowsOptions {
  /// The tokens a window predicts: a window holds block_size + 1 tokens, and the next window
  /// starts block_size tokens later (its first token is the last one of the window before), so
  /// every token but a file's first is a target exactly once per epoch.
  int64_t block_size = 128;
  /// Cut each file into shards of at most this many windows, so that processes x loader workers
  /// have shards enough to share; unset: one shard per file.
  std::optional<int64_t> windows_per_shard;
  /// When set, every window read is checked against it: an id outside [0, vocab_size) is an
  /// error naming the file and the token's position there, not a failed embedding lookup
  /// steps later (shards tokenized with another tokenizer than the model's).
  std::optional<int64_t> vocab_size;
};

/// Language-model windows from 1-D .npy files of token ids (uint8, uint16, int16, int32 or
/// int64): each example is data = tokens [t, t + block_size) and target = tokens [t + 1, t +
/// block_size + 1), both int64 [block_size], for t = 0, block_size, 2 * block_size, ... within a
/// file (a file's trailing tokens that fill no window are dropped; windows do not span files). An
/// IterableDataset for volt::DataLoader, whose shuffle shuffles the shards and, through its
/// buffer, the windows.
///
/// Example: `DataLoader(std::make_shared<TokenWindows>(TokenWindows::in_folder("corpus", "train",
/// {.block_size = 256, .windows_per_shard = 512})), {.batch_size = 16, .shuffle = true})`.
class TokenWindows : public IterableDataset {
 public:
  /// Reads every file's header; throws volt::Error when one is missing or not a 1-D array of
  /// integers, or when the files hold no window at all.
  TokenWindows(std::vector<std::string> files, TokenWindowsOptions options);
  /// The files `folder`/`prefix`-*.npy, sorted by name (e.g. prefix "train": train-00000.npy, ...).
  static TokenWindows in_folder(const std::string& folder, const std::string& prefix, TokenWindowsOptions options);

  int64_t num_shards() const override { return static_cast<int64_t>(shards_.size()); }
  std::unique_ptr<ExampleReader> open(int64_t shard) const override;
  std::string describe(int64_t shard) const override;
  /// Windows in all files: the examples of an epoch.
  int64_t size() const { return size_; }
  /// Tokens in all files.
  int64_t num_tokens() const { return tokens_; }

 private:
  struct File {
    std::string path;
    NpyHeader header;
  };
  struct Shard {
    size_t file;    // index into files_
    int64_t first;  // the first window in the file
    int64_t count;  // windows in the shard
  };
  std::vector<File> files_;
  TokenWindowsOptions options_;
  std::vector<Shard> shards_;
  int64_t size_ = 0;
  int64_t tokens_ = 0;
};

}  // namespace volt::datasets
