#include "param_spec.h"

#include <gtest/gtest.h>

#include "volt/core/testing.h"

namespace volt::tool {
namespace {

using volt::testing::error_message;
using Strings = std::vector<std::string>;

TEST(ParamSpec, ChoicesKeepTheirText) {
  const auto p = parse_param_spec("lr=choice:0.1,0.01");
  EXPECT_EQ(p.name, "lr");
  EXPECT_EQ(p.kind, slurm::ParameterKind::kChoice);
  EXPECT_EQ(p.values, (Strings{"0.1", "0.01"}));
  EXPECT_EQ(parse_param_spec("optimizer=choice:adam").values, Strings{"adam"});
}

TEST(ParamSpec, IntRangesTakeAnOptionalStep) {
  const auto p = parse_param_spec("layers=int_range:2:8:2");
  EXPECT_EQ(p.kind, slurm::ParameterKind::kIntRange);
  EXPECT_EQ(p.low, 2);
  EXPECT_EQ(p.high, 8);
  EXPECT_EQ(p.step, 2);
  EXPECT_EQ(parse_param_spec("layers=int_range:2:8").step, 1);
}

TEST(ParamSpec, FloatAndContinuousRanges) {
  const auto range = parse_param_spec("x=float_range:0:1:0.25");
  EXPECT_EQ(range.kind, slurm::ParameterKind::kFloatRange);
  EXPECT_EQ(range.step, 0.25);
  const auto uniform = parse_param_spec("y=uniform:0:1");
  EXPECT_EQ(uniform.kind, slurm::ParameterKind::kUniform);
  EXPECT_EQ(uniform.high, 1);
  const auto log = parse_param_spec("lr=log_uniform:1e-4:1e-1");
  EXPECT_EQ(log.kind, slurm::ParameterKind::kLogUniform);
  EXPECT_DOUBLE_EQ(log.low, 1e-4);
  EXPECT_DOUBLE_EQ(log.high, 0.1);
}

TEST(ParamSpec, BadSpecsSayWhatWasGivenAndExpected) {
  const auto message = [](const char* spec) { return error_message([&] { parse_param_spec(spec); }); };
  EXPECT_NE(message("lr").find("--param 'lr' has no NAME=; expected NAME=KIND:ARGS"), std::string::npos);
  EXPECT_NE(message("lr=0.1,0.01").find("has no KIND: after 'lr='"), std::string::npos);
  EXPECT_NE(message("lr=0.1,0.01").find("HINT: write lr=choice:0.1,0.01"), std::string::npos);
  EXPECT_NE(message("lr=normal:0:1").find("expected one of: choice, int_range"), std::string::npos)
      << message("lr=normal:0:1");
  EXPECT_NE(message("layers=int_range:2").find("gives 1 value(s) after 'int_range:'; expected LOW:HIGH"),
            std::string::npos);
  EXPECT_NE(message("layers=int_range:2:8.5").find("high='8.5', which is not a whole number"), std::string::npos);
  EXPECT_NE(message("x=float_range:0:1").find("expected LOW:HIGH:STEP"), std::string::npos);
  EXPECT_NE(message("y=uniform:a:1").find("low='a', which is not a number"), std::string::npos);
  EXPECT_NE(message("lr=choice:0.1,,0.01").find("has an empty choice"), std::string::npos);
  for (const char* bad : {"lr", "lr=0.1", "lr=normal:0:1", "x=float_range:0:1", "lr=choice:,"}) {
    EXPECT_NE(message(bad).find("HINT:"), std::string::npos) << bad;
  }
}

TEST(ParamSpec, ParamsFilesSkipBlankLinesAndComments) {
  EXPECT_EQ(param_specs_from_text("# the sweep\nlr=choice:0.1,0.01\n\n  layers=int_range:2:4  \n"),
            (Strings{"lr=choice:0.1,0.01", "layers=int_range:2:4"}));
}

}  // namespace
}  // namespace volt::tool
