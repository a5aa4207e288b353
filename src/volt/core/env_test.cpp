#include "volt/core/env.h"

#include <gtest/gtest.h>

#include "volt/core/error.h"

namespace volt {
namespace {

TEST(Env, GetReturnsInjectedValues) {
  const Env env(Env::Vars{{"A", "1"}, {"B", ""}});
  EXPECT_EQ(env.get("A"), "1");
  EXPECT_TRUE(env.has("B"));
  EXPECT_FALSE(env.get("C").has_value());
  EXPECT_EQ(env.get_or("C", "x"), "x");
}

TEST(Env, MalformedIntegerNamesTheVariable) {
  const Env env(Env::Vars{{"SLURM_NTASKS", "two"}});
  try {
    env.get_int("SLURM_NTASKS");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_NTASKS='two'"), std::string::npos);
  }
}

TEST(Env, WithReturnsAModifiedCopy) {
  const Env env;
  const Env more = env.with("X", "7");
  EXPECT_FALSE(env.has("X"));
  EXPECT_EQ(more.get_int("X"), 7);
}

TEST(Env, FromProcessSeesThePath) { EXPECT_TRUE(Env::from_process().has("PATH")); }

}  // namespace
}  // namespace volt
