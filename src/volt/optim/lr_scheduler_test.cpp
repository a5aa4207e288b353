#include "volt/optim/lr_scheduler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "volt/core/error.h"
#include "volt/core/testing.h"
#include "volt/optim/optimizer_state.h"

namespace volt {
namespace {

using LrPairs = std::vector<std::vector<double>>;
using StateDict = c10::Dict<std::string, c10::IValue>;

/// An SGD over two one-element parameters in two groups with lrs 0.1 and 0.05, the setup the
/// expected values below were computed with.
struct TwoGroupSgd {
  TwoGroupSgd()
      : first(torch::ones({1}, torch::requires_grad())),
        second(torch::ones({1}, torch::requires_grad())),
        optimizer({torch::optim::OptimizerParamGroup({first}),
                   torch::optim::OptimizerParamGroup({second}, std::make_unique<torch::optim::SGDOptions>(0.05))},
                  torch::optim::SGDOptions(0.1)) {}

  std::vector<double> lrs() const {
    return {optimizer.param_groups()[0].options().get_lr(), optimizer.param_groups()[1].options().get_lr()};
  }

  torch::Tensor first;
  torch::Tensor second;
  torch::optim::SGD optimizer;
};

using MakeScheduler = std::function<std::unique_ptr<LRScheduler>(torch::optim::Optimizer&)>;

struct SchedulerCase {
  std::string name;
  MakeScheduler make;
  /// get_last_lr() after construction, then after each of 10 steps.
  LrPairs expected;
};

// Expected values: PyTorch 1.13.1 (/usr/bin/python3), with
//   p, q = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
//   o = torch.optim.SGD([{'params': [p]}, {'params': [q], 'lr': 0.05}], lr=0.1)
//   s = <scheduler>(o, ...); seq = [s.get_last_lr()]
//   for i in range(10): o.step(); s.step(); seq.append(s.get_last_lr())
// PyTorch multiplies step by step where Volt uses closed forms, so they agree up to rounding.
std::vector<SchedulerCase> scheduler_cases() {
  return {
      {"StepLR",  // StepLR(o, step_size=3, gamma=0.5)
       [](torch::optim::Optimizer& o) { return std::make_unique<StepLR>(o, 3, 0.5); },
       {{0.1, 0.05},
        {0.1, 0.05},
        {0.1, 0.05},
        {0.05, 0.025},
        {0.05, 0.025},
        {0.05, 0.025},
        {0.025, 0.0125},
        {0.025, 0.0125},
        {0.025, 0.0125},
        {0.0125, 0.00625},
        {0.0125, 0.00625}}},
      {"MultiStepLR",  // MultiStepLR(o, milestones=[2, 5, 5, 8], gamma=0.1)
       [](torch::optim::Optimizer& o) {
         return std::make_unique<MultiStepLR>(o, std::vector<int64_t>{8, 5, 2, 5}, 0.1);
       },
       {{0.1, 0.05},
        {0.1, 0.05},
        {0.010000000000000002, 0.005000000000000001},
        {0.010000000000000002, 0.005000000000000001},
        {0.010000000000000002, 0.005000000000000001},
        {0.00010000000000000005, 5.000000000000002e-05},
        {0.00010000000000000005, 5.000000000000002e-05},
        {0.00010000000000000005, 5.000000000000002e-05},
        {1.0000000000000006e-05, 5.000000000000003e-06},
        {1.0000000000000006e-05, 5.000000000000003e-06},
        {1.0000000000000006e-05, 5.000000000000003e-06}}},
      {"ExponentialLR",  // ExponentialLR(o, gamma=0.9)
       [](torch::optim::Optimizer& o) { return std::make_unique<ExponentialLR>(o, 0.9); },
       {{0.1, 0.05},
        {0.09000000000000001, 0.045000000000000005},
        {0.08100000000000002, 0.04050000000000001},
        {0.07290000000000002, 0.03645000000000001},
        {0.06561000000000002, 0.03280500000000001},
        {0.05904900000000002, 0.02952450000000001},
        {0.05314410000000002, 0.02657205000000001},
        {0.04782969000000002, 0.02391484500000001},
        {0.043046721000000024, 0.021523360500000012},
        {0.03874204890000002, 0.01937102445000001},
        {0.03486784401000002, 0.01743392200500001}}},
      {"CosineAnnealingLR",  // CosineAnnealingLR(o, T_max=4, eta_min=0.001)
       [](torch::optim::Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 4, 0.001); },
       {{0.1, 0.05},
        {0.0855017856687341, 0.04282411613907042},
        {0.0505, 0.025500000000000002},
        {0.0154982143312659, 0.008175883860929586},
        {0.001, 0.001},
        {0.015498214331265896, 0.008175883860929585},
        {0.05050000000000001, 0.025500000000000005},
        {0.08550178566873413, 0.04282411613907043},
        {0.10000000000000003, 0.050000000000000024},
        {0.08550178566873413, 0.04282411613907044},
        {0.05050000000000003, 0.02550000000000002}}},
      {"LinearWarmupCosineLR",  // transformers' get_cosine_schedule_with_warmup(o, 3, 10): a LambdaLR
       [](torch::optim::Optimizer& o) { return std::make_unique<LinearWarmupCosineLR>(o, 3, 10); },
       {{0.0, 0.0},
        {0.03333333333333333, 0.016666666666666666},
        {0.06666666666666667, 0.03333333333333333},
        {0.1, 0.05},
        {0.09504844339512096, 0.04752422169756048},
        {0.08117449009293669, 0.040587245046468344},
        {0.06112604669781572, 0.03056302334890786},
        {0.03887395330218429, 0.019436976651092144},
        {0.018825509907063328, 0.009412754953531664},
        {0.004951556604879049, 0.0024757783024395245},
        {0.0, 0.0}}},
      {"LambdaLR",  // LambdaLR(o, lambda e: 1.0 / (e + 1))
       [](torch::optim::Optimizer& o) {
         return std::make_unique<LambdaLR>(o, [](int64_t e) { return 1.0 / (e + 1); });
       },
       {{0.1, 0.05},
        {0.05, 0.025},
        {0.03333333333333333, 0.016666666666666666},
        {0.025, 0.0125},
        {0.020000000000000004, 0.010000000000000002},
        {0.016666666666666666, 0.008333333333333333},
        {0.014285714285714285, 0.007142857142857143},
        {0.0125, 0.00625},
        {0.011111111111111112, 0.005555555555555556},
        {0.010000000000000002, 0.005000000000000001},
        {0.009090909090909092, 0.004545454545454546}}},
  };
}

void expect_close(const std::vector<double>& actual, const std::vector<double>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-12 * expected[i]) << what << ", group " << i;
  }
}

StateDict pickle_round_trip(const StateDict& state) {
  const c10::IValue loaded = torch::pickle_load(torch::pickle_save(state));
  return c10::impl::toTypedDict<std::string, c10::IValue>(loaded.toGenericDict());
}

class SchedulerMatchesPytorch : public ::testing::TestWithParam<SchedulerCase> {};

TEST_P(SchedulerMatchesPytorch, LrSequenceEqualsPytorchs) {
  const SchedulerCase& c = GetParam();
  TwoGroupSgd sgd;
  const auto scheduler = c.make(sgd.optimizer);
  expect_close(scheduler->get_last_lr(), c.expected[0], "after construction");
  expect_close(sgd.lrs(), c.expected[0], "optimizer after construction");
  for (size_t step = 1; step < c.expected.size(); ++step) {
    scheduler->step();
    expect_close(scheduler->get_last_lr(), c.expected[step], "step " + std::to_string(step));
    expect_close(sgd.lrs(), c.expected[step], "optimizer at step " + std::to_string(step));
  }
  EXPECT_EQ(scheduler->last_epoch(), 10);
}

TEST_P(SchedulerMatchesPytorch, ResumedScheduleIsIdenticalToTheUninterruptedOne) {
  const SchedulerCase& c = GetParam();
  TwoGroupSgd uninterrupted;
  const auto scheduler = c.make(uninterrupted.optimizer);
  for (int i = 0; i < 4; ++i) scheduler->step();

  const StateDict saved = pickle_round_trip(scheduler->state_dict());
  const c10::IValue saved_optimizer =
      torch::pickle_load(torch::pickle_save(optimizer_state_dict(uninterrupted.optimizer)));

  TwoGroupSgd resumed;
  const auto resumed_scheduler = c.make(resumed.optimizer);
  load_optimizer_state_dict(resumed.optimizer, saved_optimizer);
  resumed_scheduler->load_state_dict(saved);
  EXPECT_EQ(resumed_scheduler->last_epoch(), 4);
  EXPECT_EQ(resumed_scheduler->get_last_lr(), scheduler->get_last_lr());
  for (int i = 0; i < 6; ++i) {
    scheduler->step();
    resumed_scheduler->step();
    EXPECT_EQ(resumed.lrs(), uninterrupted.lrs()) << "step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(EpochSchedulers, SchedulerMatchesPytorch, ::testing::ValuesIn(scheduler_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(StepLR, StateDictUsesPytorchsKeys) {
  TwoGroupSgd sgd;
  StepLR scheduler(sgd.optimizer, 3, 0.5);
  for (int i = 0; i < 10; ++i) scheduler.step();
  const StateDict state = scheduler.state_dict();
  // PyTorch: {'step_size': 3, 'gamma': 0.5, 'base_lrs': [0.1, 0.05], 'last_epoch': 10,
  //           '_step_count': 11, '_last_lr': [0.0125, 0.00625], ...}
  EXPECT_EQ(state.at("step_size").toInt(), 3);
  EXPECT_EQ(state.at("gamma").toDouble(), 0.5);
  EXPECT_EQ(state.at("base_lrs").toDoubleVector(), (std::vector<double>{0.1, 0.05}));
  EXPECT_EQ(state.at("last_epoch").toInt(), 10);
  EXPECT_EQ(state.at("_step_count").toInt(), 11);
  EXPECT_EQ(state.at("_last_lr").toDoubleVector(), (std::vector<double>{0.0125, 0.00625}));
  EXPECT_EQ(state.at(kSchedulerKindKey).toStringRef(), "StepLR");
}

TEST(StepLR, LoadingRestoresHyperparametersAsPytorchDoes) {
  TwoGroupSgd a;
  StepLR saved(a.optimizer, 2, 0.5);
  TwoGroupSgd b;
  StepLR loaded(b.optimizer, 7, 0.9);
  loaded.load_state_dict(saved.state_dict());
  EXPECT_EQ(loaded.state_dict().at("step_size").toInt(), 2);
  EXPECT_EQ(loaded.state_dict().at("gamma").toDouble(), 0.5);
}

TEST(LRScheduler, ConstructorRejectsOutOfRangeArguments) {
  TwoGroupSgd sgd;
  EXPECT_THROW(StepLR(sgd.optimizer, 0), Error);
  EXPECT_THROW(ExponentialLR(sgd.optimizer, 0.0), Error);
  EXPECT_THROW(CosineAnnealingLR(sgd.optimizer, 0), Error);
  EXPECT_THROW(LinearWarmupCosineLR(sgd.optimizer, 10, 10), Error);  // no steps left to anneal
  EXPECT_THROW(LinearWarmupCosineLR(sgd.optimizer, 2, 10, 0.0, 1.5), Error);
  EXPECT_THROW(MultiStepLR(sgd.optimizer, {-1, 3}), Error);
  EXPECT_THROW(LambdaLR(sgd.optimizer, nullptr), Error);
  ReduceLROnPlateauOptions options;
  options.factor = 1.0;
  EXPECT_THROW(ReduceLROnPlateau(sgd.optimizer, options), Error);
}

TEST(LinearWarmupCosineLR, HoldsEtaMinAfterTheLastStepAndStartsFromTheWarmupFactor) {
  TwoGroupSgd sgd;
  LinearWarmupCosineLR scheduler(sgd.optimizer, 2, 4, /*eta_min=*/0.001, /*warmup_start_factor=*/0.5);
  EXPECT_DOUBLE_EQ(scheduler.get_last_lr()[0], 0.05);  // half of 0.1 at step 0
  for (int i = 0; i < 6; ++i) scheduler.step();
  EXPECT_DOUBLE_EQ(scheduler.get_last_lr()[0], 0.001) << "held at eta_min after total_steps, not rising again";
}

TEST(LRScheduler, EpochSchedulersIgnoreAMetric) {
  TwoGroupSgd sgd;
  StepLR scheduler(sgd.optimizer, 1, 0.5);
  EXPECT_FALSE(scheduler.needs_metric());
  scheduler.step(0.25);
  EXPECT_EQ(scheduler.get_last_lr(), (std::vector<double>{0.05, 0.025}));
}

TEST(LRScheduler, LoadingAnotherSchedulersStateIsRejectedAndChangesNothing) {
  TwoGroupSgd sgd;
  ExponentialLR exponential(sgd.optimizer, 0.5);
  exponential.step();
  TwoGroupSgd other;
  StepLR step_lr(other.optimizer, 3, 0.1);
  const std::string message =
      testing::error_message<CheckpointError>([&] { step_lr.load_state_dict(exponential.state_dict()); });
  EXPECT_NE(message.find("holds the state of a ExponentialLR; this scheduler is a StepLR"), std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  EXPECT_EQ(step_lr.last_epoch(), 0);
}

TEST(LRScheduler, LoadingListsEveryProblemAndChangesNothing) {
  TwoGroupSgd sgd;
  StepLR scheduler(sgd.optimizer, 3, 0.5);
  for (int i = 0; i < 5; ++i) scheduler.step();
  StateDict state = scheduler.state_dict();
  state.insert_or_assign("base_lrs", c10::List<double>({0.1, 0.05, 0.2}));
  state.insert_or_assign("gamma", "half");
  EXPECT_EQ(state.erase("step_size"), 1u);

  TwoGroupSgd other;
  StepLR target(other.optimizer, 4, 0.25);
  target.step();
  const StateDict before = target.state_dict();
  const std::string message = testing::error_message<CheckpointError>([&] { target.load_state_dict(state); });
  EXPECT_NE(message.find("'base_lrs'] has 3 value(s); the optimizer has 2 param group(s)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("['gamma'] is a String; expected a number"), std::string::npos) << message;
  EXPECT_NE(message.find("['step_size'] is missing"), std::string::npos) << message;
  const StateDict after = target.state_dict();
  EXPECT_EQ(after.at("last_epoch").toInt(), before.at("last_epoch").toInt());
  EXPECT_EQ(after.at("step_size").toInt(), 4);
  EXPECT_EQ(after.at("gamma").toDouble(), 0.25);
}

/// Values from PyTorch 1.13 (StepLR(step_size=2, gamma=0.5) over SGD lr 0.1; a group of lr 0.04
/// added after the first step, set to 0.03 by hand after the second): its chainable step()
/// multiplies every group's current lr, the added one's too.
TEST(LRScheduler, AGroupAddedLaterFollowsTheScheduleFromItsCurrentLr) {
  torch::Tensor a = torch::ones({1}, torch::requires_grad());
  torch::Tensor b = torch::ones({1}, torch::requires_grad());
  torch::optim::SGD optimizer({torch::optim::OptimizerParamGroup({a})}, torch::optim::SGDOptions(0.1));
  StepLR scheduler(optimizer, 2, 0.5);
  const auto lrs = [&optimizer] {
    std::vector<double> out;
    for (const auto& group : optimizer.param_groups()) out.push_back(group.options().get_lr());
    return out;
  };
  scheduler.step();
  EXPECT_EQ(lrs(), std::vector<double>({0.1}));
  // BaseFinetuning's unfreeze_and_add_param_group.
  optimizer.add_param_group(torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(0.04)));
  scheduler.step();
  EXPECT_EQ(lrs(), std::vector<double>({0.05, 0.02}));
  optimizer.param_groups()[1].options().set_lr(0.03);  // BackboneFinetuning's ramp, between steps
  scheduler.step();
  EXPECT_EQ(lrs(), std::vector<double>({0.05, 0.03}));
  const StateDict saved = scheduler.state_dict();
  scheduler.step();
  const std::vector<double> expected = {0.025, 0.015};
  EXPECT_EQ(lrs(), expected);
  EXPECT_EQ(scheduler.get_last_lr(), expected);

  // A resumed run: the optimizer has both groups again (BaseFinetuning restores them), the
  // state's base_lrs only the first's; the next step sets what the uninterrupted one did.
  torch::Tensor c = torch::ones({1}, torch::requires_grad());
  torch::Tensor d = torch::ones({1}, torch::requires_grad());
  torch::optim::SGD resumed({torch::optim::OptimizerParamGroup({c}),
                             torch::optim::OptimizerParamGroup({d}, std::make_unique<torch::optim::SGDOptions>(0.04))},
                            torch::optim::SGDOptions(0.1));
  StepLR again(resumed, 2, 0.5);
  again.load_state_dict(saved);
  resumed.param_groups()[0].options().set_lr(0.05);  // the optimizer's own state brings its lrs back
  resumed.param_groups()[1].options().set_lr(0.03);
  again.step();
  EXPECT_EQ(again.get_last_lr(), expected);
}

TEST(ReduceLROnPlateau, AGroupAddedLaterIsReducedDownToTheMinLr) {
  torch::Tensor a = torch::ones({1}, torch::requires_grad());
  torch::Tensor b = torch::ones({1}, torch::requires_grad());
  torch::optim::SGD optimizer({torch::optim::OptimizerParamGroup({a})}, torch::optim::SGDOptions(1.0));
  ReduceLROnPlateau scheduler(optimizer, ReduceLROnPlateauOptions{.factor = 0.5, .patience = 0, .min_lr = 0.3});
  optimizer.add_param_group(torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(0.4)));
  scheduler.step(1.0);
  scheduler.step(2.0);  // no improvement: reduce
  EXPECT_EQ(scheduler.get_last_lr(), std::vector<double>({0.5, 0.3}));
  EXPECT_EQ(scheduler.state_dict().at("min_lrs").toDoubleList().size(), 2u);
}

TEST(MultiStepLR, LoadsPytorchsCounterOfMilestones) {
  TwoGroupSgd sgd;
  MultiStepLR scheduler(sgd.optimizer, {1}, 0.1);
  StateDict state = scheduler.state_dict();
  // PyTorch stores milestones=[2, 5, 5, 8] as Counter({5: 2, 2: 1, 8: 1}).
  c10::Dict<int64_t, int64_t> counter;
  counter.insert(5, 2);
  counter.insert(2, 1);
  counter.insert(8, 1);
  state.insert_or_assign("milestones", counter);
  scheduler.load_state_dict(state);
  EXPECT_EQ(scheduler.state_dict().at("milestones").toIntVector(), (std::vector<int64_t>{2, 5, 5, 8}));
}

// Expected values: PyTorch 1.13.1 (/usr/bin/python3), with the two-group SGD above and
//   s = ReduceLROnPlateau(o, mode='min', factor=0.5, patience=1, threshold=0.1,
//                         threshold_mode='rel', cooldown=1, min_lr=0.02)
//   for m in metrics: o.step(); s.step(m); seq.append(s._last_lr)
const std::vector<double> kMinMetrics = {1.0, 0.95, 0.95, 0.8, 0.8, 0.8, 0.8, 0.5, 0.5, 0.5, 0.5, 0.5};
const LrPairs kMinExpected = {{0.1, 0.05},   {0.1, 0.05},   {0.05, 0.025}, {0.05, 0.025}, {0.05, 0.025}, {0.025, 0.02},
                              {0.025, 0.02}, {0.025, 0.02}, {0.025, 0.02}, {0.02, 0.02},  {0.02, 0.02},  {0.02, 0.02}};

ReduceLROnPlateauOptions min_options() {
  ReduceLROnPlateauOptions options;
  options.mode = Mode::kMin;
  options.factor = 0.5;
  options.patience = 1;
  options.threshold = 0.1;
  options.threshold_mode = ThresholdMode::kRel;
  options.cooldown = 1;
  options.min_lr = 0.02;
  return options;
}

TEST(ReduceLROnPlateau, MinModeWithCooldownMatchesPytorch) {
  TwoGroupSgd sgd;
  ReduceLROnPlateau scheduler(sgd.optimizer, min_options());
  EXPECT_EQ(scheduler.get_last_lr(), (std::vector<double>{0.1, 0.05}));
  for (size_t i = 0; i < kMinMetrics.size(); ++i) {
    scheduler.step(kMinMetrics[i]);
    EXPECT_EQ(scheduler.get_last_lr(), kMinExpected[i]) << "step " << i;
  }
  // PyTorch: 'best': 0.5, 'num_bad_epochs': 1, 'cooldown_counter': 0, 'last_epoch': 12.
  const StateDict state = scheduler.state_dict();
  EXPECT_EQ(state.at("best").toDouble(), 0.5);
  EXPECT_EQ(state.at("num_bad_epochs").toInt(), 1);
  EXPECT_EQ(state.at("cooldown_counter").toInt(), 0);
  EXPECT_EQ(state.at("last_epoch").toInt(), 12);
  EXPECT_EQ(state.at("min_lrs").toDoubleVector(), (std::vector<double>{0.02, 0.02}));
  EXPECT_EQ(state.at("mode").toStringRef(), "min");
  EXPECT_EQ(state.at("threshold_mode").toStringRef(), "rel");
}

TEST(ReduceLROnPlateau, MaxModeWithAbsoluteThresholdMatchesPytorch) {
  // PyTorch: ReduceLROnPlateau(o, mode='max', factor=0.1, patience=0, threshold=0.05,
  //                            threshold_mode='abs'), metrics below.
  const std::vector<double> metrics = {1.0, 1.04, 1.06, 1.06, 1.2, 1.0};
  const LrPairs expected = {{0.1, 0.05},
                            {0.010000000000000002, 0.005000000000000001},
                            {0.010000000000000002, 0.005000000000000001},
                            {0.0010000000000000002, 0.0005000000000000001},
                            {0.0010000000000000002, 0.0005000000000000001},
                            {0.00010000000000000003, 5.0000000000000016e-05}};
  TwoGroupSgd sgd;
  ReduceLROnPlateauOptions options;
  options.mode = Mode::kMax;
  options.factor = 0.1;
  options.patience = 0;
  options.threshold = 0.05;
  options.threshold_mode = ThresholdMode::kAbs;
  ReduceLROnPlateau scheduler(sgd.optimizer, options);
  for (size_t i = 0; i < metrics.size(); ++i) {
    scheduler.step(metrics[i]);
    EXPECT_EQ(scheduler.get_last_lr(), expected[i]) << "step " << i;
  }
}

TEST(ReduceLROnPlateau, StepWithoutAMetricSaysWhatToDo) {
  TwoGroupSgd sgd;
  ReduceLROnPlateau scheduler(sgd.optimizer);
  EXPECT_TRUE(scheduler.needs_metric());
  try {
    scheduler.step();
    ADD_FAILURE() << "expected a volt::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("ReduceLROnPlateau.step() was called without a metric"), std::string::npos) << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
  EXPECT_EQ(scheduler.last_epoch(), 0);
}

TEST(ReduceLROnPlateau, ResumedScheduleIsIdenticalToTheUninterruptedOne) {
  TwoGroupSgd uninterrupted;
  ReduceLROnPlateau scheduler(uninterrupted.optimizer, min_options());
  for (size_t i = 0; i < 4; ++i) scheduler.step(kMinMetrics[i]);

  const StateDict saved = pickle_round_trip(scheduler.state_dict());
  const c10::IValue saved_optimizer = optimizer_state_dict(uninterrupted.optimizer);
  TwoGroupSgd resumed;
  ReduceLROnPlateau resumed_scheduler(resumed.optimizer, ReduceLROnPlateauOptions{});
  load_optimizer_state_dict(resumed.optimizer, saved_optimizer);
  resumed_scheduler.load_state_dict(saved);
  for (size_t i = 4; i < kMinMetrics.size(); ++i) {
    scheduler.step(kMinMetrics[i]);
    resumed_scheduler.step(kMinMetrics[i]);
    EXPECT_EQ(resumed.lrs(), uninterrupted.lrs()) << "step " << i;
    EXPECT_EQ(resumed.lrs(), kMinExpected[i]) << "step " << i;
  }
}

TEST(Mode, NamesRoundTripAndBadNamesListTheChoices) {
  for (const Mode mode : {Mode::kMin, Mode::kMax}) {
    EXPECT_EQ(parse_mode(to_string(mode)), mode);
  }
  for (const ThresholdMode mode : {ThresholdMode::kRel, ThresholdMode::kAbs}) {
    EXPECT_EQ(parse_threshold_mode(to_string(mode)), mode);
  }
  try {
    parse_mode("lowest");
    ADD_FAILURE() << "expected a volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected one of: min, max"), std::string::npos) << e.what();
  }
}

TEST(ReduceLROnPlateauOptions, DefaultsArePytorchs) {
  const ReduceLROnPlateauOptions options;
  EXPECT_EQ(options.mode, Mode::kMin);
  EXPECT_EQ(options.factor, 0.1);
  EXPECT_EQ(options.patience, 10);
  EXPECT_EQ(options.threshold, 1e-4);
  EXPECT_EQ(options.threshold_mode, ThresholdMode::kRel);
  EXPECT_EQ(options.cooldown, 0);
  EXPECT_EQ(options.min_lr, 0.0);
  EXPECT_EQ(options.eps, 1e-8);
}

}  // namespace
}  // namespace volt
