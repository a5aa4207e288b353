// The context example_generator reads while a batch is made (the loader's seed and the epoch).
#pragma once

#include <cstdint>

namespace volt::internal {

/// SplitMix64's finalizer: a cheap bijective mix, so nearby (seed, epoch, index) give unrelated seeds.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Sets this thread's batch context while a batch is made (restored after, also when making it
/// throws), so that example_generator gives the same augmentations on any thread.
class BatchContextScope {
 public:
  BatchContextScope(uint64_t seed, int64_t epoch);
  ~BatchContextScope();
  BatchContextScope(const BatchContextScope&) = delete;
  BatchContextScope& operator=(const BatchContextScope&) = delete;

 private:
  bool active_;
  uint64_t seed_;
  int64_t epoch_;
};

}  // namespace volt::internal
