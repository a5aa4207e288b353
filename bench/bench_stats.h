// What the benchmarks' reports share: the median of a contender's repeats.
#pragma once

#include <algorithm>
#include <vector>

namespace volt::bench {

/// The median of `v` (the mean of the middle two for an even count); `v` must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

}  // namespace volt::bench
