#include "volt/profiler/profiler.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "volt/core/testing.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

ProfileStats stats_with(std::initializer_list<std::pair<Action, double>> totals, int64_t count) {
  ProfileStats stats;
  for (const auto& [action, total] : totals) {
    stats[action].count = count;
    stats[action].total = total;
    stats[action].min = total / static_cast<double>(count);
    stats[action].max = total / static_cast<double>(count);
  }
  return stats;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(Profiler, ScopeTimesItsActionIntoTheStageAndTheWindow) {
  Profiler profiler;
  profiler.start_stage("fit", "");
  for (int i = 0; i < 3; ++i) {
    const Profiler::Scope scope(profiler, Action::kForward);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const ActionStats& forward = profiler.stats()[Action::kForward];
  EXPECT_EQ(forward.count, 3);
  EXPECT_GE(forward.min, 0.002);
  EXPECT_GE(forward.total, 0.006);
  EXPECT_LE(forward.min, forward.max);
  EXPECT_EQ(profiler.stats()[Action::kBackward].count, 0);
  EXPECT_EQ(profiler.take_window()[Action::kForward].count, 3);
  EXPECT_EQ(profiler.take_window()[Action::kForward].count, 0) << "take_window starts a new window";
  EXPECT_EQ(profiler.stats()[Action::kForward].count, 3) << "the stage keeps its statistics";
  profiler.start_stage("validate", "");
  EXPECT_EQ(profiler.stats()[Action::kForward].count, 0) << "a new stage starts from nothing";
  EXPECT_EQ(profiler.stage(), "validate");
}

TEST(Profiler, StepBreakdownSplitsTheStepAndNamesTheRest) {
  // 10 steps of 10 ms: 9.5 ms in parts, 0.5 ms the loop's own.
  const ProfileStats stats = stats_with({{Action::kTrainStep, 0.100},
                                         {Action::kDataFetch, 0.010},
                                         {Action::kForward, 0.030},
                                         {Action::kBackward, 0.040},
                                         {Action::kOptimizerStep, 0.015},
                                         {Action::kValidation, 5.0}},
                                        10);
  const StepBreakdown breakdown = step_breakdown(stats);
  EXPECT_DOUBLE_EQ(breakdown.step, 0.010);
  ASSERT_EQ(breakdown.parts.size(), 4u) << "the parts that ran";
  EXPECT_EQ(breakdown.parts[0].first, Action::kDataFetch);
  EXPECT_EQ(breakdown.parts[3].first, Action::kOptimizerStep);
  EXPECT_DOUBLE_EQ(breakdown.parts[0].second, 0.001);
  EXPECT_NEAR(breakdown.other, 0.0005, 1e-12) << "validation is not part of a step";
  EXPECT_EQ(step_breakdown(ProfileStats{}).parts.size(), 0u) << "no steps, no breakdown";
}

TEST(Profiler, ReportListsWhatRanAndTheBreakdown) {
  const ProfileStats stats = stats_with({{Action::kTrainStep, 0.100}, {Action::kForward, 0.030}}, 10);
  const std::string text = format_profile(stats, "fit", 0.2);
  EXPECT_NE(text.find("Profiler report: fit"), std::string::npos) << text;
  EXPECT_NE(text.find("forward"), std::string::npos) << text;
  EXPECT_NE(text.find("3.000"), std::string::npos) << "forward's mean in ms:\n" << text;
  EXPECT_NE(text.find("50.0%"), std::string::npos) << "train_step's share of the stage:\n" << text;
  EXPECT_EQ(text.find("eval_step"), std::string::npos) << "actions that never ran are left out:\n" << text;
  EXPECT_NE(text.find("Training step breakdown"), std::string::npos) << text;
  EXPECT_NE(text.find("other"), std::string::npos) << text;
}

TEST(Profiler, AcrossRanksShowsEveryRankOrTheSlowest) {
  const ProfileStats fast = stats_with({{Action::kForward, 0.010}}, 10);
  const ProfileStats slow = stats_with({{Action::kForward, 0.050}}, 10);
  const std::string two = format_profile_across_ranks({fast, slow}, {"node1", "node2"});
  EXPECT_NE(two.find("rank 1"), std::string::npos) << two;
  EXPECT_NE(two.find("node2"), std::string::npos) << two;
  EXPECT_NE(two.find("5.000"), std::string::npos) << two;
  std::vector<ProfileStats> many(12, fast);
  many[7] = slow;
  std::vector<std::string> hosts(12, "node");
  hosts[7] = "slowhost";
  const std::string table = format_profile_across_ranks(many, hosts);
  EXPECT_NE(table.find("median"), std::string::npos) << table;
  EXPECT_NE(table.find("rank 7 on slowhost"), std::string::npos) << table;
}

TEST(Profiler, StatisticsSurviveTheExchangeAndGarbageIsRefused) {
  const ProfileStats stats = stats_with({{Action::kTrainStep, 0.123456789}, {Action::kGradSync, 1e-7}}, 7);
  const ProfileStats back = decode_profile_stats(encode_profile_stats(stats));
  for (size_t i = 0; i < kActionCount; ++i) {
    EXPECT_EQ(back.actions[i].count, stats.actions[i].count);
    EXPECT_DOUBLE_EQ(back.actions[i].total, stats.actions[i].total);
    EXPECT_DOUBLE_EQ(back.actions[i].max, stats.actions[i].max);
  }
  const std::string message = testing::error_message([] { decode_profile_stats("1 2 x"); });
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
}

/// Steps of a tiny matmul, each a "forward" scope, with step_done after each.
void run_steps(Profiler& profiler, int steps) {
  const torch::Tensor a = torch::randn({16, 16});
  for (int i = 0; i < steps; ++i) {
    {
      const Profiler::Scope scope(profiler, Action::kForward);
      (void)torch::mm(a, a);
    }
    profiler.step_done();
  }
}

TEST(Profiler, PytorchTracesTheActiveStepsAsAChromeTrace) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("volt_profiler_{}", ::getpid());
  fs::create_directories(dir);
  const fs::path path = dir / "trace-fit-rank0.json";
  Profiler profiler(ProfilerKind::kPytorch, /*wait=*/1, /*warmup=*/1, /*active=*/2);
  profiler.start_stage("fit", path.string());
  run_steps(profiler, 3);
  EXPECT_FALSE(fs::exists(path)) << "written when the active steps are done";
  run_steps(profiler, 3);
  ASSERT_TRUE(fs::exists(path));
  EXPECT_EQ(profiler.trace_written(), path.string());
  const std::string text = read_file(path);
  const nlohmann::json trace = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(trace.is_discarded()) << "not JSON:\n" << text.substr(0, 400);
  EXPECT_EQ(count_of(text, "\"volt/forward\""), 2u) << "the 2 active steps, not the wait or warm-up step";
  EXPECT_NE(text.find("aten::mm"), std::string::npos) << "LibTorch's operators inside Volt's ranges";
  profiler.end_stage();
  fs::remove_all(dir);
}

TEST(Profiler, PytorchWritesWhatItHasWhenTheStageEndsEarly) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("volt_profiler_short_{}", ::getpid());
  fs::create_directories(dir);
  const fs::path path = dir / "trace-validate-rank0.json";
  Profiler profiler(ProfilerKind::kPytorch, /*wait=*/0, /*warmup=*/0, /*active=*/10);
  profiler.start_stage("validate", path.string());
  run_steps(profiler, 2);
  EXPECT_FALSE(fs::exists(path));
  profiler.end_stage();
  ASSERT_TRUE(fs::exists(path));
  EXPECT_EQ(count_of(read_file(path), "\"volt/forward\""), 2u);
  fs::remove_all(dir);
}

TEST(Profiler, SimpleTracesNothing) {
  const fs::path path = fs::temp_directory_path() / fmt::format("volt_profiler_none_{}.json", ::getpid());
  Profiler profiler(ProfilerKind::kSimple, 0, 0, 1);
  profiler.start_stage("fit", path.string());
  run_steps(profiler, 3);
  profiler.end_stage();
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(profiler.stats()[Action::kForward].count, 3);
}

}  // namespace
}  // namespace volt
