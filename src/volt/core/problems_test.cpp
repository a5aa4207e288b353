#include "volt/core/problems.h"

#include <gtest/gtest.h>

#include "volt/core/error.h"

namespace volt {
namespace {

TEST(Problems, OneMessageNamesEveryProblem) {
  EXPECT_EQ(describe_problems("the sweep", {"a is empty", "b is negative"}),
            "the sweep has 2 problems:\n  - a is empty\n  - b is negative");
  EXPECT_EQ(describe_problems("the job", {"x"}), "the job has 1 problem:\n  - x");
}

TEST(Problems, ThrowsOnlyWhenThereAreAny) {
  EXPECT_NO_THROW(throw_if_problems("the job", {}));
  EXPECT_THROW(throw_if_problems("the job", {"x"}), Error);
}

}  // namespace
}  // namespace volt
