#include "volt/data/data_module.h"

#include <gtest/gtest.h>

#include <vector>

namespace volt {
namespace {

/// A DataModule that only says where its data goes.
class Shared : public DataModule {
 public:
  explicit Shared(bool per_node) : per_node_(per_node) {}
  bool prepare_data_per_node() const override { return per_node_; }

 private:
  bool per_node_;
};

/// The global ranks that prepare the data in a run of 2 nodes of 2 processes each.
std::vector<int64_t> preparing_ranks(const DataModule& data) {
  std::vector<int64_t> out;
  for (int64_t node = 0; node < 2; ++node) {
    for (int64_t local = 0; local < 2; ++local) {
      const int64_t global = node * 2 + local;
      if (runs_prepare_data(data, local, global)) out.push_back(global);
    }
  }
  return out;
}

TEST(RunsPrepareData, PerNodeIsEachNodesLocalRankZeroAndTheDefault) {
  EXPECT_EQ(preparing_ranks(DataModule{}), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(preparing_ranks(Shared(true)), (std::vector<int64_t>{0, 2}));
}

TEST(RunsPrepareData, NotPerNodeIsGlobalRankZeroAlone) {
  EXPECT_EQ(preparing_ranks(Shared(false)), (std::vector<int64_t>{0}));
}

}  // namespace
}  // namespace volt
