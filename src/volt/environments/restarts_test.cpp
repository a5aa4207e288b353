#include "volt/environments/restarts.h"

#include <gtest/gtest.h>

#include "volt/core/error.h"

namespace volt {
namespace {

std::string error_of(const Env::Vars& vars, int64_t attempt = 0) {
  try {
    read_fault_injection(Env(vars), attempt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Restarts, TheAttemptIsTorchrunsRestartCountElseVoltsElseZero) {
  EXPECT_EQ(restart_attempt(Env(Env::Vars{})), 0);
  EXPECT_EQ(restart_attempt(Env(Env::Vars{{"VOLT_RESTART_COUNT", "2"}})), 2);
  EXPECT_EQ(restart_attempt(Env(Env::Vars{{"TORCHELASTIC_RESTART_COUNT", "1"}, {"VOLT_RESTART_COUNT", "2"}})), 1);
  EXPECT_THROW(restart_attempt(Env(Env::Vars{{"VOLT_RESTART_COUNT", "x"}})), Error);
}

TEST(Restarts, AFaultStrikesInTheAttemptItNamesOnly) {
  const Env::Vars vars{{"VOLT_INJECT_FAULT", "rank=1,step=7"}};
  const std::optional<FaultInjection> fault = read_fault_injection(Env(vars), 0);
  ASSERT_TRUE(fault.has_value());
  EXPECT_EQ(fault->rank, 1);
  EXPECT_EQ(fault->step, 7);
  EXPECT_EQ(fault->at, FaultPoint::kStep);
  EXPECT_FALSE(read_fault_injection(Env(vars), 1)) << "the restarted run goes on";
  EXPECT_FALSE(read_fault_injection(Env(Env::Vars{}), 0));
  const auto later =
      read_fault_injection(Env(Env::Vars{{"VOLT_INJECT_FAULT", "rank=0,step=3,at=snapshot,attempt=1"}}), 1);
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->at, FaultPoint::kSnapshot);
  EXPECT_STREQ(to_string(FaultPoint::kValidation), "validation");
}

TEST(Restarts, SeveralFaultsStrikeOnePerAttemptAndARendezvousFaultNeedsNoStep) {
  const Env env(Env::Vars{{"VOLT_INJECT_FAULT", "rank=1,step=7;rank=0,at=rendezvous,attempt=1"}});
  EXPECT_EQ(read_fault_injection(env, 0)->at, FaultPoint::kStep);
  const std::optional<FaultInjection> second = read_fault_injection(env, 1);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->at, FaultPoint::kRendezvous);
  EXPECT_EQ(second->rank, 0);
  EXPECT_FALSE(read_fault_injection(env, 2));
  EXPECT_NE(error_of({{"VOLT_INJECT_FAULT", "rank=1,step=7;rank=0,step=2"}}).find("names attempt 0 twice"),
            std::string::npos);
}

TEST(Restarts, ABadFaultSaysWhatWasGivenAndHowToWriteIt) {
  EXPECT_NE(error_of({{"VOLT_INJECT_FAULT", "rank=1"}}).find("has no step in 'rank=1'. HINT: VOLT_INJECT_FAULT takes"),
            std::string::npos);
  EXPECT_NE(error_of({{"VOLT_INJECT_FAULT", "rank=1,step=2,at=later"}}).find("at='later' is not step"),
            std::string::npos);
  EXPECT_NE(error_of({{"VOLT_INJECT_FAULT", "rank=1,step=2,when=3"}}).find("unknown key 'when'"), std::string::npos);
  EXPECT_NE(error_of({{"VOLT_INJECT_FAULT", "rank=1,step=2,at=snapshot"}}).find("at=snapshot needs rank=0"),
            std::string::npos);
  EXPECT_NE(error_of({{"VOLT_INJECT_FAULT", "rank=one,step=2"}}).find("rank='one' is not a whole number"),
            std::string::npos);
}

}  // namespace
}  // namespace volt
