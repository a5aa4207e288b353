#include "volt/options/option_enums.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "volt/core/testing.h"

namespace volt {
namespace {

using volt::testing::error_message;

/// Every value of an option enum parses back from its to_string, in any case and with spaces.
template <typename E, typename Parse>
void expect_round_trip(std::initializer_list<E> values, Parse parse) {
  for (const E value : values) {
    EXPECT_EQ(parse(to_string(value)), value) << to_string(value);
    std::string upper = std::string(" ") + to_string(value) + " ";
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(parse(upper), value) << upper;
  }
}

TEST(OptionEnums, EveryNameRoundTrips) {
  expect_round_trip({AcceleratorRequest::kAuto, AcceleratorRequest::kCpu, AcceleratorRequest::kGpu},
                    parse_accelerator_request);
  expect_round_trip({StrategyRequest::kAuto, StrategyRequest::kSingleDevice, StrategyRequest::kDdp,
                     StrategyRequest::kDdpFindUnusedParametersTrue, StrategyRequest::kDp, StrategyRequest::kDdp2},
                    parse_strategy_request);
  expect_round_trip({Precision::k32True, Precision::k64True, Precision::k16Mixed, Precision::kBf16Mixed,
                     Precision::k16True, Precision::kBf16True},
                    parse_precision);
  expect_round_trip({AmpLevel::kO0, AmpLevel::kO1, AmpLevel::kO2, AmpLevel::kO3}, parse_amp_level);
  expect_round_trip({ProcessGroupBackend::kAuto, ProcessGroupBackend::kGloo, ProcessGroupBackend::kNccl},
                    parse_process_group_backend);
  expect_round_trip({GradientClipAlgorithm::kNorm, GradientClipAlgorithm::kValue}, parse_gradient_clip_algorithm);
  expect_round_trip({DeterministicMode::kOff, DeterministicMode::kOn, DeterministicMode::kWarn},
                    parse_deterministic_mode);
  expect_round_trip({RequeueSignal::kSigUsr1, RequeueSignal::kSigUsr2, RequeueSignal::kSigHup, RequeueSignal::kSigAlrm,
                     RequeueSignal::kSigQuit, RequeueSignal::kSigCont},
                    parse_requeue_signal);
  expect_round_trip({ProfilerKind::kSimple, ProfilerKind::kPytorch}, parse_profiler_kind);
}

TEST(OptionEnums, AliasesAreLightnings) {
  EXPECT_EQ(parse_accelerator_request("cuda"), AcceleratorRequest::kGpu);
  EXPECT_EQ(parse_precision("32"), Precision::k32True);
  EXPECT_EQ(parse_precision("64"), Precision::k64True);
  EXPECT_EQ(parse_precision("16"), Precision::k16Mixed);
  EXPECT_EQ(parse_precision("bf16"), Precision::kBf16Mixed);
  EXPECT_EQ(parse_amp_level("o2"), AmpLevel::kO2);
}

TEST(OptionEnums, UnknownNamesSayWhatWasGivenWhatIsSupportedAndAHint) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {error_message([] { parse_accelerator_request("tpu"); }),
       {"accelerator='tpu' is not supported", "'auto', 'cpu', 'gpu', 'cuda'"}},
      {error_message([] { parse_strategy_request("dpp"); }), {"strategy='dpp'", "'dp', 'ddp2'"}},
      {error_message([] { parse_precision("8-mixed"); }),
       {"precision='8-mixed'", "'32-true' (alias 32)", "'bf16-mixed' (alias bf16)", "'16-true'", "'bf16-true'"}},
      {error_message([] { parse_amp_level("O4"); }), {"amp_level='O4'", "'O0', 'O1', 'O2' or 'O3'"}},
      {error_message([] { parse_process_group_backend("mpi"); }), {"process_group_backend='mpi'", "'nccl'"}},
      {error_message([] { parse_gradient_clip_algorithm("l2"); }), {"gradient_clip_algorithm='l2'", "'value'"}},
      {error_message([] { parse_profiler_kind("advanced"); }), {"profiler='advanced'", "'simple', 'pytorch'"}},
  };
  for (const auto& [message, parts] : cases) {
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << part << " in " << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
}

TEST(RequeueSignal, AcceptsNamesWithOrWithoutSigAndNumbers) {
  EXPECT_EQ(parse_requeue_signal("SIGUSR2"), RequeueSignal::kSigUsr2);
  EXPECT_EQ(parse_requeue_signal("usr2"), RequeueSignal::kSigUsr2);
  EXPECT_EQ(parse_requeue_signal(" USR1 "), RequeueSignal::kSigUsr1);
  EXPECT_EQ(parse_requeue_signal(std::to_string(SIGUSR2)), RequeueSignal::kSigUsr2);
  EXPECT_EQ(parse_requeue_signal("SIGHUP"), RequeueSignal::kSigHup);
  EXPECT_EQ(signal_number(RequeueSignal::kSigUsr2), SIGUSR2);
}

TEST(RequeueSignal, RefusesSignalsThatAlreadyStopOrCannotBeCaught) {
  const std::string term = error_message([] { parse_requeue_signal("SIGTERM"); });
  EXPECT_NE(term.find("requeue_signal='SIGTERM' already stops the run"), std::string::npos) << term;
  EXPECT_NE(term.find("HINT:"), std::string::npos);
  EXPECT_NE(error_message([] { parse_requeue_signal(std::to_string(SIGINT)); }).find("already stops"),
            std::string::npos);
  const std::string kill = error_message([] { parse_requeue_signal("KILL"); });
  EXPECT_NE(kill.find("accepted: SIGUSR1, SIGUSR2"), std::string::npos) << kill;
  EXPECT_NE(error_message([] { parse_requeue_signal("usr3"); }).find("'usr3'"), std::string::npos);
  EXPECT_NE(error_message([] { parse_requeue_signal("999"); }).find("HINT:"), std::string::npos);
}

TEST(Precision, OnlyMixedModesAreMixed) {
  EXPECT_TRUE(is_mixed(Precision::k16Mixed));
  EXPECT_TRUE(is_mixed(Precision::kBf16Mixed));
  EXPECT_FALSE(is_mixed(Precision::kBf16True));
  EXPECT_FALSE(is_mixed(Precision::k32True));
  EXPECT_EQ(describe_precisions({Precision::k16Mixed, Precision::k16True}), "'16-mixed' (alias 16), '16-true'");
}

}  // namespace
}  // namespace volt
