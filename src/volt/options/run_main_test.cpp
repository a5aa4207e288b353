#include "volt/options/run_main.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include "volt/core/error.h"

namespace volt {
namespace {

/// An exception type run_main does not know, like LibTorch's c10::Error.
struct ForeignError : std::runtime_error {
  ForeignError() : std::runtime_error("what() with a backtrace") {}
};

/// run_main's exit code for `body`, and what it printed on stderr.
std::pair<int, std::string> run(const std::function<int()>& body, const ForeignErrorDescriber& describe = {}) {
  ::testing::internal::CaptureStderr();
  const int code = run_main(body, describe);
  return {code, ::testing::internal::GetCapturedStderr()};
}

TEST(RunMain, ExitCodesArePinned) {
  EXPECT_EQ(kExitBadInput, 1);
  EXPECT_EQ(kExitUsage, 2);
  EXPECT_EQ(kExitInternalError, 70);
}

TEST(RunMain, ReturnsWhatTheBodyReturns) {
  EXPECT_EQ(run([] { return 0; }).first, 0);
  EXPECT_EQ(run([] { return 130; }).first, 130);
}

TEST(RunMain, BadInputIsOneWithTheMessage) {
  const auto [code, err] = run([]() -> int { throw Error("devices=0 is bad. HINT: use 1."); });
  EXPECT_EQ(code, kExitBadInput);
  EXPECT_EQ(err, "error: devices=0 is bad. HINT: use 1.\n");
}

TEST(RunMain, AnUnknownFlagIsUsage) {
  const auto [code, err] = run([] {
    CLI::App app;
    app.parse(std::vector<std::string>{"--bogus"});
    return 0;
  });
  EXPECT_EQ(code, kExitUsage);
  EXPECT_NE(err.find("--bogus"), std::string::npos) << err;
  EXPECT_NE(err.find("HINT:"), std::string::npos) << err;
  EXPECT_EQ(run([]() -> int { throw CLI::Success(); }).first, 0);
}

TEST(RunMain, BugsAndOtherExceptionsAreInternalErrors) {
  EXPECT_EQ(run([]() -> int { throw InternalError("broken invariant"); }).first, kExitInternalError);
  const auto [code, err] = run([]() -> int { throw ForeignError(); });
  EXPECT_EQ(code, kExitInternalError);
  EXPECT_EQ(err, "error: what() with a backtrace\n");
}

TEST(RunMain, ADescriberNamesTheExceptionsItKnows) {
  const ForeignErrorDescriber describe = [](const std::exception& e) -> std::optional<std::string> {
    if (dynamic_cast<const ForeignError*>(&e) != nullptr) return "(Foreign) the message alone";
    return std::nullopt;
  };
  EXPECT_EQ(run([]() -> int { throw ForeignError(); }, describe).second, "error: (Foreign) the message alone\n");
  EXPECT_EQ(run([]() -> int { throw std::runtime_error("other"); }, describe).second, "error: other\n");
}

}  // namespace
}  // namespace volt
