// Streaming data sets: examples read in order, from shards, with no length and no random access.
//
// For data that does not fit in memory or arrives as files. The shard (a file, or a range of
// one) is the unit the loader splits across processes and worker threads: each shard is read by
// exactly one worker of one process per epoch, so no example is seen twice and none is lost.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "volt/data/batch.h"

namespace volt {

/// Reads the examples of one shard in order.
class ExampleReader {
 public:
  virtual ~ExampleReader() = default;
  /// The next example, or none at the end of the shard.
  virtual std::optional<Example> next() = 0;
  /// Skips up to `count` examples and returns how many it skipped (fewer at the end of the
  /// shard). A resume calls it to reach the saved position; the default reads and drops them,
  /// a reader with random access overrides it to seek.
  virtual int64_t skip(int64_t count);
};

/// A data set read as a stream: a fixed list of shards, each read from its start.
///
/// Loader workers open shards from several threads at once, so open() must not change the data
/// set (it is const); each reader is used by one thread.
class IterableDataset {
 public:
  virtual ~IterableDataset() = default;
  /// The number of shards (at least the number of processes x workers that read it, or some
  /// of them have nothing to read).
  virtual int64_t num_shards() const = 0;
  /// A reader of shard `shard` (0 <= shard < num_shards()) from its first example.
  virtual std::unique_ptr<ExampleReader> open(int64_t shard) const = 0;
  /// Names shard `shard` in errors, e.g. its file; the default is "shard N".
  virtual std::string describe(int64_t shard) const;
};

}  // namespace volt
