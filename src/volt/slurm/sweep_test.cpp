#include "volt/slurm/sweep.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "volt/core/testing.h"

namespace volt::slurm {
namespace {

using volt::testing::error_message;
using Values = std::vector<std::pair<std::string, std::string>>;
using Strings = std::vector<std::string>;

/// The values parameter `name` takes across `trials`, in order.
Strings column(const std::vector<Trial>& trials, std::size_t parameter) {
  Strings out;
  for (const auto& trial : trials) out.push_back(trial.values.at(parameter).second);
  return out;
}

/// The one problem validate_sweep finds; records a failure unless there is exactly one.
std::string only_problem(const std::vector<SweepParameter>& parameters, SearchKind kind, int64_t nb_trials) {
  const Strings problems = validate_sweep(parameters, kind, nb_trials);
  if (problems.size() != 1) {
    ADD_FAILURE() << "expected one problem, got " << problems.size();
    return problems.empty() ? "" : problems[0];
  }
  EXPECT_NE(problems[0].find("HINT:"), std::string::npos) << problems[0];
  return problems[0];
}

TEST(SweepKinds, ParseTheirNames) {
  EXPECT_EQ(parse_search_kind("grid"), SearchKind::kGrid);
  EXPECT_EQ(parse_search_kind("Random"), SearchKind::kRandom);
  EXPECT_EQ(to_string(SearchKind::kRandom), std::string("random"));
  EXPECT_EQ(parse_parameter_kind("log_uniform"), ParameterKind::kLogUniform);
  EXPECT_EQ(to_string(ParameterKind::kIntRange), std::string("int_range"));
  EXPECT_NE(error_message([] { parse_search_kind("bayes"); }).find("expected one of: grid, random"), std::string::npos);
}

TEST(SweepParameter, NumericChoicesAreWrittenRoundTrip) {
  EXPECT_EQ(SweepParameter::choice("lr", {0.001, 0.1, 64, 1e-7}).values, (Strings{"0.001", "0.1", "64", "1e-07"}));
  EXPECT_EQ(SweepParameter::choice("optimizer", {"adam", "sgd"}).values, (Strings{"adam", "sgd"}));
}

TEST(GridSearch, IsTheProductWithTheLastParameterChangingFastest) {
  const auto trials = expand_sweep(
      {SweepParameter::choice("lr", {0.1, 0.01}), SweepParameter::choice("optimizer", {"adam", "sgd", "rms"})},
      SearchKind::kGrid, 0, 0);
  ASSERT_EQ(trials.size(), 6u);
  EXPECT_EQ(column(trials, 0), (Strings{"0.1", "0.1", "0.1", "0.01", "0.01", "0.01"}));
  EXPECT_EQ(column(trials, 1), (Strings{"adam", "sgd", "rms", "adam", "sgd", "rms"}));
  for (std::size_t i = 0; i < trials.size(); ++i) EXPECT_EQ(trials[i].index, static_cast<int64_t>(i));
  EXPECT_EQ(trials[4].values, (Values{{"lr", "0.01"}, {"optimizer", "sgd"}}));
}

TEST(GridSearch, SteppedRangesIncludeTheHighEndWhenAStepLandsOnIt) {
  auto trials = expand_sweep({SweepParameter::int_range("layers", 2, 8, 2)}, SearchKind::kGrid, 0, 0);
  EXPECT_EQ(column(trials, 0), (Strings{"2", "4", "6", "8"}));
  trials = expand_sweep({SweepParameter::int_range("layers", 2, 9, 3)}, SearchKind::kGrid, 0, 0);
  EXPECT_EQ(column(trials, 0), (Strings{"2", "5", "8"}));
  trials = expand_sweep({SweepParameter::float_range("dropout", 0.1, 0.5, 0.1)}, SearchKind::kGrid, 0, 0);
  EXPECT_EQ(column(trials, 0), (Strings{"0.1", "0.2", "0.3", "0.4", "0.5"}));
  trials = expand_sweep({SweepParameter::float_range("dropout", 0.1, 0.3, 0.1)}, SearchKind::kGrid, 0, 0);
  EXPECT_EQ(column(trials, 0), (Strings{"0.1", "0.2", "0.3"}));  // 0.2 / 0.1 is 1.9999999999999998
  trials = expand_sweep({SweepParameter::float_range("wd", 0, 1e-3, 2.5e-4)}, SearchKind::kGrid, 0, 0);
  EXPECT_EQ(column(trials, 0), (Strings{"0", "0.00025", "0.0005", "0.00075", "0.001"}));
}

TEST(GridSearch, NbTrialsKeepsTheFirstTrials) {
  const std::vector<SweepParameter> sweep{SweepParameter::int_range("a", 0, 9), SweepParameter::int_range("b", 0, 9)};
  EXPECT_EQ(expand_sweep(sweep, SearchKind::kGrid, 0, 0).size(), 100u);
  const auto trials = expand_sweep(sweep, SearchKind::kGrid, 12, 0);
  ASSERT_EQ(trials.size(), 12u);
  EXPECT_EQ(trials[11].values, (Values{{"a", "1"}, {"b", "1"}}));
  EXPECT_EQ(expand_sweep(sweep, SearchKind::kGrid, 1000, 0).size(), 100u);
}

TEST(GridSearch, TooLargeAGridIsAnErrorUnlessCapped) {
  std::vector<SweepParameter> sweep;
  for (int i = 0; i < 6; ++i) sweep.push_back(SweepParameter::int_range(fmt::format("p{}", i), 1, 10));  // 10^6
  EXPECT_NE(only_problem(sweep, SearchKind::kGrid, 0).find("the grid search has more than 100000 trials"),
            std::string::npos);
  EXPECT_NE(only_problem(sweep, SearchKind::kGrid, 200000).find("more than 100000"), std::string::npos);
  const auto trials = expand_sweep(sweep, SearchKind::kGrid, 5, 0);
  ASSERT_EQ(trials.size(), 5u);
  EXPECT_EQ(trials[4].values.back(), (std::pair<std::string, std::string>{"p5", "5"}));
}

TEST(RandomSearch, IsDeterministicForASeedAndDiffersAcrossSeeds) {
  const std::vector<SweepParameter> sweep{SweepParameter::log_uniform("lr", 1e-5, 1e-1),
                                          SweepParameter::uniform("dropout", 0, 0.5),
                                          SweepParameter::int_range("batch_size", 16, 256, 16)};
  const auto first = expand_sweep(sweep, SearchKind::kRandom, 20, 42);
  const auto again = expand_sweep(sweep, SearchKind::kRandom, 20, 42);
  const auto other = expand_sweep(sweep, SearchKind::kRandom, 20, 43);
  ASSERT_EQ(first.size(), 20u);
  for (std::size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(first[i].values, again[i].values);
  }
  EXPECT_NE(column(first, 0), column(other, 0));
  EXPECT_NE(column(first, 1), column(other, 1));
}

TEST(RandomSearch, DrawsFollowTheDocumentedFormula) {
  const auto trials = expand_sweep({SweepParameter::uniform("x", 2, 3), SweepParameter::log_uniform("lr", 1e-4, 1),
                                    SweepParameter::choice("c", {"a", "b", "c"})},
                                   SearchKind::kRandom, 2, 7);
  std::mt19937_64 rng(7);
  for (const auto& trial : trials) {
    const double u1 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const uint64_t r3 = rng();
    EXPECT_EQ(trial.values[0].second, fmt::format("{}", 2 + u1 * (3 - 2)));
    EXPECT_EQ(trial.values[1].second,
              fmt::format("{}", std::exp(std::log(1e-4) + u2 * (std::log(1.0) - std::log(1e-4)))));
    EXPECT_EQ(trial.values[2].second, (Strings{"a", "b", "c"}[r3 % 3]));
  }
}

TEST(RandomSearch, ValuesStayInTheirRanges) {
  const auto trials =
      expand_sweep({SweepParameter::uniform("x", -1, 1), SweepParameter::log_uniform("lr", 1e-5, 1e-1),
                    SweepParameter::int_range("n", 0, 10, 5), SweepParameter::float_range("d", 0.1, 0.3, 0.1)},
                   SearchKind::kRandom, 2000, 1);
  int below_geometric_mean = 0;
  std::set<std::string> ints;
  std::set<std::string> floats;
  for (const auto& trial : trials) {
    const double x = std::stod(trial.values[0].second);
    const double lr = std::stod(trial.values[1].second);
    EXPECT_TRUE(x >= -1 && x <= 1) << x;
    EXPECT_TRUE(lr >= 1e-5 && lr <= 1e-1) << lr;
    below_geometric_mean += lr < 1e-3 ? 1 : 0;
    ints.insert(trial.values[2].second);
    floats.insert(trial.values[3].second);
  }
  // Log-uniform: half the draws fall below the geometric mean of the bounds (a uniform draw
  // would put 1% there).
  EXPECT_NEAR(below_geometric_mean / 2000.0, 0.5, 0.05);
  EXPECT_EQ(ints, (std::set<std::string>{"0", "5", "10"}));
  EXPECT_EQ(floats, (std::set<std::string>{"0.1", "0.2", "0.3"}));
}

TEST(SweepValidation, EachProblemNamesTheParameter) {
  const auto lr = SweepParameter::choice("lr", {0.1});
  EXPECT_NE(only_problem({}, SearchKind::kGrid, 0).find("the sweep has no parameters"), std::string::npos);
  EXPECT_NE(only_problem({lr, lr}, SearchKind::kGrid, 0).find("parameter 'lr' is given twice"), std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::choice("--lr", {0.1})}, SearchKind::kGrid, 0)
                .find("parameter name '--lr' is not a flag name"),
            std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::choice("a b", {0.1})}, SearchKind::kGrid, 0).find("'a b'"),
            std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::choice("opt", Strings{})}, SearchKind::kGrid, 0)
                .find("parameter 'opt' (choice) has no values"),
            std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::int_range("n", 5, 5)}, SearchKind::kGrid, 0)
                .find("parameter 'n' (int_range) has low=5 and high=5; expected finite bounds with low < high"),
            std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::uniform("x", 1, 0)}, SearchKind::kRandom, 3).find("low=1 and high=0"),
            std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::int_range("n", 0, 5, 0)}, SearchKind::kGrid, 0).find("step=0"),
            std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::float_range("d", 0, 1, -0.1)}, SearchKind::kGrid, 0).find("step=-0.1"),
            std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::float_range("d", 0, 1, 1e-20)}, SearchKind::kRandom, 1)
                .find("more than 2^53 values"),
            std::string::npos);
  SweepParameter fractional = SweepParameter::int_range("n", 0, 5);
  fractional.step = 0.5;
  EXPECT_NE(only_problem({fractional}, SearchKind::kGrid, 0).find("expected whole numbers"), std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::log_uniform("lr", 0, 1)}, SearchKind::kRandom, 3)
                .find("parameter 'lr' (log_uniform) has low=0; expected bounds above 0"),
            std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::log_uniform("lr", 1e-4, 1)}, SearchKind::kGrid, 0)
                .find("parameter 'lr' is log_uniform, a continuous range a grid cannot enumerate"),
            std::string::npos);
  EXPECT_NE(only_problem({SweepParameter::uniform("x", 0, 1)}, SearchKind::kGrid, 0).find("'x' is uniform"),
            std::string::npos);
  EXPECT_NE(only_problem({lr}, SearchKind::kRandom, 0).find("a random search needs nb_trials above 0, not 0"),
            std::string::npos);
  EXPECT_NE(only_problem({lr}, SearchKind::kRandom, 100001).find("nb_trials=100001 is more than 100000"),
            std::string::npos);
}

TEST(SweepValidation, ExpandThrowsListingEveryProblem) {
  const std::string message = error_message([] {
    expand_sweep({SweepParameter::choice("a", Strings{}), SweepParameter::uniform("b", 2, 1)}, SearchKind::kRandom, 1,
                 0);
  });
  EXPECT_NE(message.find("the sweep has 2 problems:\n  - parameter 'a'"), std::string::npos) << message;
  EXPECT_NE(message.find("\n  - parameter 'b'"), std::string::npos) << message;
}

TEST(Trial, FlagsAndOutputDir) {
  const Trial trial{3, {{"lr", "0.001"}, {"batch-size", "64"}}};
  EXPECT_EQ(trial.flags(), (Strings{"--lr", "0.001", "--batch-size", "64"}));
  EXPECT_EQ(trial.output_dir("runs"), "runs/trial_003");
  EXPECT_EQ(trial.output_dir("runs/"), "runs/trial_003");
  EXPECT_EQ(trial.output_dir(""), "trial_003");
  EXPECT_EQ((Trial{1234, {}}).output_dir("/scratch/sweep"), "/scratch/sweep/trial_1234");
}

TEST(Manifest, RoundTripsTrialsInOrder) {
  auto trials = expand_sweep({SweepParameter::log_uniform("lr", 1e-4, 1), SweepParameter::int_range("z", 1, 3),
                              SweepParameter::choice("a", {"it's \"quoted\"", "tab\there", "line\nbreak", "ünï"})},
                             SearchKind::kRandom, 30, 5);
  const std::string manifest = render_manifest(trials);
  const std::vector<Trial> back = parse_manifest(manifest);
  ASSERT_EQ(back.size(), trials.size());
  for (std::size_t i = 0; i < trials.size(); ++i) {
    EXPECT_EQ(back[i].index, trials[i].index);
    EXPECT_EQ(back[i].values, trials[i].values);  // order kept: lr, z, a (not sorted)
    EXPECT_EQ(std::stod(back[i].values[0].second), std::stod(trials[i].values[0].second));
  }
  EXPECT_EQ(trial_flags_from_manifest(manifest, 7), trials[7].flags());
  EXPECT_EQ(trial_from_manifest(manifest, 29).output_dir("out"), "out/trial_029");
}

TEST(Manifest, HasOneTrialPerLine) {
  const std::vector<Trial> trials{{0, {{"lr", "0.1"}, {"bs", "32"}}}, {1, {{"lr", "0.01"}, {"bs", "64"}}}};
  EXPECT_EQ(render_manifest(trials),
            "{\"format\": \"volt-sweep-manifest\", \"version\": 1, \"trials\": [\n"
            "  {\"index\":0,\"values\":{\"lr\":\"0.1\",\"bs\":\"32\"}},\n"
            "  {\"index\":1,\"values\":{\"lr\":\"0.01\",\"bs\":\"64\"}}\n"
            "]}\n");
  EXPECT_EQ(parse_manifest(render_manifest({})).size(), 0u);
}

TEST(Manifest, AMissingIndexNamesTheIndicesThereAre) {
  const std::string manifest =
      render_manifest(expand_sweep({SweepParameter::choice("lr", {0.1, 0.01, 0.001, 1e-4})}, SearchKind::kGrid, 0, 0));
  const std::string message = error_message([&] { trial_flags_from_manifest(manifest, 4); });
  EXPECT_NE(message.find("the sweep manifest has no trial 4; it has 4 trials, indices 0 to 3. HINT:"),
            std::string::npos)
      << message;
}

TEST(Manifest, OtherTextIsAClearError) {
  EXPECT_NE(error_message([] { parse_manifest("{not json"); }).find("not a sweep manifest: invalid JSON"),
            std::string::npos);
  EXPECT_NE(error_message([] { parse_manifest("{\"trials\": []}"); }).find("\"format\": \"volt-sweep-manifest\""),
            std::string::npos);
  EXPECT_NE(error_message([] {
              parse_manifest("{\"format\": \"volt-sweep-manifest\", \"version\": 2}");
            }).find("version 2 is not 1"),
            std::string::npos);
  EXPECT_NE(error_message([] {
              parse_manifest("{\"format\": \"volt-sweep-manifest\", \"version\": 1, \"trials\": [{\"index\": \"0\"}]}");
            }).find("lacks an integer \"index\""),
            std::string::npos);
  EXPECT_NE(error_message([] {
              parse_manifest(
                  "{\"format\": \"volt-sweep-manifest\", \"version\": 1, \"trials\": [{\"index\": 0, "
                  "\"values\": {\"lr\": 0.1}}]}");
            }).find("value 0.1 of 'lr' is not a string"),
            std::string::npos);
}

}  // namespace
}  // namespace volt::slurm
