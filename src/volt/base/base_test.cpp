#include <gtest/gtest.h>

#include "volt/base/monitor_mode.h"
#include "volt/base/reduce.h"
#include "volt/base/state_dict.h"
#include "volt/core/error.h"

namespace volt {
namespace {

TEST(Reduce, NamesRoundTripAndBadNamesListTheChoices) {
  for (const Reduce reduce : {Reduce::kMean, Reduce::kSum, Reduce::kMax, Reduce::kMin}) {
    EXPECT_EQ(parse_reduce(to_string(reduce)), reduce);
  }
  try {
    parse_reduce("median");
    ADD_FAILURE() << "expected a volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown reduce_fx 'median'; expected one of: mean, sum, max, min"),
              std::string::npos)
        << e.what();
  }
}

TEST(Mode, OneParserForEveryMonitor) {
  EXPECT_EQ(parse_mode("MAX"), Mode::kMax);
  EXPECT_EQ(parse_mode(to_string(Mode::kMin)), Mode::kMin);
  EXPECT_THROW(parse_mode("lowest"), Error);
}

TEST(StateDict, StartsEmptyWithStringKeys) {
  StateDict state = make_state_dict();
  EXPECT_EQ(state.size(), 0U);
  EXPECT_TRUE(state.keyType()->kind() == c10::TypeKind::StringType);
  state.insert("epoch", int64_t{3});
  EXPECT_EQ(state.at("epoch").toInt(), 3);
}

}  // namespace
}  // namespace volt
