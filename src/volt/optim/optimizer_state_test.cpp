#include "volt/optim/optimizer_state.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "volt/core/error.h"
#include "volt/core/testing.h"
#include "volt/optim/optimizer_compat.h"

namespace volt {
namespace {

using torch::optim::OptimizerParamGroup;
using Groups = std::vector<OptimizerParamGroup>;
using OptimizerPtr = std::unique_ptr<torch::optim::Optimizer>;

/// A stand-in for a user's optimizer that Volt does not know: SGD with momentum written by hand,
/// reusing SGD's option and state types, saved through LibTorch's archive.
class HandWrittenMomentum : public torch::optim::Optimizer {
 public:
  HandWrittenMomentum(Groups groups, torch::optim::SGDOptions defaults)
      : Optimizer(std::move(groups), std::make_unique<torch::optim::SGDOptions>(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups_) {
      const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
      for (auto& param : group.params()) {
        if (!param.grad().defined()) continue;
        auto& slot = state_[compat::optimizer_state_key(param)];
        if (!slot) {
          auto state = std::make_unique<torch::optim::SGDParamState>();
          state->momentum_buffer(torch::zeros_like(param));
          slot = std::move(state);
        }
        const auto& buffer = static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer();
        buffer.mul_(options.momentum()).add_(param.grad());
        param.add_(buffer, -options.lr());
      }
    }
    return {};
  }
  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<torch::optim::SGDParamState, torch::optim::SGDOptions>(archive, *this);
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<torch::optim::SGDParamState, torch::optim::SGDOptions>(archive, *this);
  }
};

/// An optimizer with state but without save()/load(): LibTorch's defaults write nothing.
class Unsaveable : public torch::optim::Optimizer {
 public:
  explicit Unsaveable(Groups groups) : Optimizer(std::move(groups), std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  torch::Tensor step(LossClosure closure = nullptr) override {
    for (const auto& param : param_groups_[0].params()) {
      state_[compat::optimizer_state_key(param)] = std::make_unique<torch::optim::SGDParamState>();
    }
    return {};
  }
};

torch::nn::Sequential make_model(int64_t hidden = 3) {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(4, hidden), torch::nn::Tanh(), torch::nn::Linear(hidden, 2));
}

/// Two groups, as a model with per-layer lrs has: the first layer, then the rest.
Groups two_groups(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> first = model[0]->parameters();
  std::vector<torch::Tensor> rest = model[2]->parameters();
  return {OptimizerParamGroup(first), OptimizerParamGroup(rest)};
}

/// Steps `optimizer` on batches that depend only on the step's index.
void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int first, int count) {
  for (int i = first; i < first + count; ++i) {
    const torch::Tensor x = torch::sin(torch::arange(32, torch::kFloat32).view({8, 4}) * (i + 1));
    optimizer.zero_grad();
    model->forward(x).pow(2).mean().backward();
    optimizer.step();
  }
}

c10::IValue pickle_round_trip(const c10::IValue& value) { return torch::pickle_load(torch::pickle_save(value)); }

void copy_parameters(torch::nn::Sequential& from, torch::nn::Sequential& to) {
  torch::NoGradGuard no_grad;
  const auto source = from->parameters();
  auto target = to->parameters();
  for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
}

bool same_parameters(torch::nn::Sequential& a, torch::nn::Sequential& b) {
  const auto pa = a->parameters();
  const auto pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!torch::equal(pa[i], pb[i])) return false;
  }
  return true;
}

std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer) {
  std::vector<double> lrs;
  for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

c10::impl::GenericDict as_dict(const c10::IValue& value) { return value.toGenericDict(); }

c10::IValue at(const c10::IValue& dict, const std::string& key) { return as_dict(dict).at(c10::IValue(key)); }

struct OptimizerCase {
  std::string name;
  std::function<OptimizerPtr(Groups)> make;
  /// Whether steps leave state behind (so that skipping the load must change the result).
  bool keeps_state = true;
};

std::vector<OptimizerCase> optimizer_cases() {
  namespace o = torch::optim;
  return {
      {"SgdPlain", [](Groups g) { return std::make_unique<o::SGD>(g, o::SGDOptions(0.1)); }, false},
      {"SgdMomentum",
       [](Groups g) {
         return std::make_unique<o::SGD>(g, o::SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(1e-3));
       }},
      {"SgdNesterov",
       [](Groups g) { return std::make_unique<o::SGD>(g, o::SGDOptions(0.1).momentum(0.9).nesterov(true)); }},
      {"Adam", [](Groups g) { return std::make_unique<o::Adam>(g, o::AdamOptions(0.01)); }},
      {"AdamAmsgrad",
       [](Groups g) {
         return std::make_unique<o::Adam>(g, o::AdamOptions(0.01).amsgrad(true).weight_decay(1e-2).betas({0.8, 0.99}));
       }},
      {"AdamW", [](Groups g) { return std::make_unique<o::AdamW>(g, o::AdamWOptions(0.01)); }},
      {"AdamWAmsgrad", [](Groups g) { return std::make_unique<o::AdamW>(g, o::AdamWOptions(0.01).amsgrad(true)); }},
      {"RMSprop", [](Groups g) { return std::make_unique<o::RMSprop>(g, o::RMSpropOptions(0.01)); }},
      {"RMSpropCenteredMomentum",
       [](Groups g) {
         return std::make_unique<o::RMSprop>(g,
                                             o::RMSpropOptions(0.01).centered(true).momentum(0.5).weight_decay(1e-3));
       }},
      {"Adagrad",
       [](Groups g) {
         return std::make_unique<o::Adagrad>(g, o::AdagradOptions(0.1).lr_decay(0.01).initial_accumulator_value(0.1));
       }},
      {"CustomOptimizerThroughLibtorchArchive",
       [](Groups g) { return std::make_unique<HandWrittenMomentum>(g, o::SGDOptions(0.05).momentum(0.9)); }},
  };
}

class OptimizerStateRoundTrip : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(OptimizerStateRoundTrip, ResumedTrainingIsBitIdenticalToUninterruptedTraining) {
  const OptimizerCase& c = GetParam();
  auto original_model = make_model();
  OptimizerPtr original = c.make(two_groups(original_model));
  train(original_model, *original, 0, 3);
  // Per-group lrs differ, as after a scheduler with per-group base lrs.
  original->param_groups()[1].options().set_lr(original->param_groups()[0].options().get_lr() / 2);

  const c10::IValue saved = pickle_round_trip(optimizer_state_dict(*original));

  auto resumed_model = make_model();
  copy_parameters(original_model, resumed_model);
  OptimizerPtr resumed = c.make(two_groups(resumed_model));
  load_optimizer_state_dict(*resumed, saved);
  EXPECT_EQ(group_lrs(*resumed), group_lrs(*original));

  auto fresh_model = make_model();
  copy_parameters(original_model, fresh_model);
  OptimizerPtr fresh = c.make(two_groups(fresh_model));
  fresh->param_groups()[1].options().set_lr(original->param_groups()[1].options().get_lr());

  train(original_model, *original, 3, 4);
  train(resumed_model, *resumed, 3, 4);
  train(fresh_model, *fresh, 3, 4);
  EXPECT_TRUE(same_parameters(original_model, resumed_model));
  // The comparison above can fail: without the state, training goes elsewhere.
  if (c.keeps_state) {
    EXPECT_FALSE(same_parameters(original_model, fresh_model));
  }
}

INSTANTIATE_TEST_SUITE_P(EveryOptimizer, OptimizerStateRoundTrip, ::testing::ValuesIn(optimizer_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(OptimizerStateDict, AdamStateHasPytorchsLayoutAndKeys) {
  auto model = make_model();
  torch::optim::Adam adam(two_groups(model), torch::optim::AdamOptions(0.01));
  train(model, adam, 0, 2);
  const c10::IValue state = pickle_round_trip(optimizer_state_dict(adam));

  EXPECT_EQ(at(state, kOptimizerKindKey).toStringRef(), "Adam");
  const auto groups = at(state, "param_groups").toListRef();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(at(groups[0], "lr").toDouble(), 0.01);
  EXPECT_EQ(at(groups[0], "betas").toDoubleVector(), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(at(groups[0], "eps").toDouble(), 1e-8);
  EXPECT_EQ(at(groups[0], "amsgrad").toBool(), false);
  EXPECT_EQ(at(groups[0], "params").toIntVector(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(at(groups[1], "params").toIntVector(), (std::vector<int64_t>{2, 3}));

  // Int keys survive pickling, as in PyTorch's state_dict.
  const auto per_param = at(state, "state").toGenericDict();
  ASSERT_EQ(per_param.size(), 4u);
  const c10::IValue first = per_param.at(c10::IValue(int64_t{0}));
  // torch 1.13's Python Adam: `'step': tensor(2.)`, a float32 scalar tensor.
  const torch::Tensor step = at(first, "step").toTensor();
  EXPECT_EQ(step.dim(), 0);
  EXPECT_EQ(step.scalar_type(), torch::kFloat32);
  EXPECT_EQ(step.item<float>(), 2.0f);
  EXPECT_EQ(at(first, "exp_avg").toTensor().sizes(), model[0]->parameters()[0].sizes());
  EXPECT_FALSE(as_dict(first).contains(c10::IValue("max_exp_avg_sq")));
}

TEST(OptimizerStateDict, RmspropStepIsAPlainIntLikeTorch113) {
  auto model = make_model();
  torch::optim::RMSprop rmsprop(model->parameters(), torch::optim::RMSpropOptions(0.01));
  train(model, rmsprop, 0, 3);
  const c10::IValue state = optimizer_state_dict(rmsprop);
  const c10::IValue first = at(state, "state").toGenericDict().at(c10::IValue(int64_t{0}));
  EXPECT_EQ(at(first, "step").toInt(), 3);
  EXPECT_FALSE(as_dict(first).contains(c10::IValue("momentum_buffer")));
}

TEST(LoadOptimizerStateDict, AcceptsIntStepsAndTupleBetasAsPythonWritesThem) {
  auto model = make_model();
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
  train(model, adam, 0, 2);
  c10::IValue state = optimizer_state_dict(adam);
  auto group = at(state, "param_groups").toListRef()[0].toGenericDict();
  group.insert_or_assign(c10::IValue("betas"), c10::ivalue::Tuple::create({c10::IValue(0.5), c10::IValue(0.6)}));
  group.insert_or_assign(c10::IValue("weight_decay"), c10::IValue(int64_t{0}));
  at(state, "state")
      .toGenericDict()
      .at(c10::IValue(int64_t{1}))
      .toGenericDict()
      .insert_or_assign(c10::IValue("step"), c10::IValue(int64_t{7}));

  torch::optim::Adam loaded(model->parameters(), torch::optim::AdamOptions(0.01));
  load_optimizer_state_dict(loaded, state);
  const auto& options = static_cast<const torch::optim::AdamOptions&>(loaded.param_groups()[0].options());
  EXPECT_EQ(std::get<0>(options.betas()), 0.5);
  EXPECT_EQ(std::get<1>(options.betas()), 0.6);
  const auto& param_state = static_cast<const torch::optim::AdamParamState&>(
      *loaded.state().at(compat::optimizer_state_key(model->parameters()[1])));
  EXPECT_EQ(param_state.step(), 7);
}

TEST(LoadOptimizerStateDict, LoadedStateDoesNotShareMemoryWithTheCheckpoint) {
  auto model = make_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train(model, sgd, 0, 1);
  const c10::IValue state = optimizer_state_dict(sgd);
  torch::optim::SGD loaded(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  load_optimizer_state_dict(loaded, state);
  const auto key = compat::optimizer_state_key(model->parameters()[0]);
  const auto& original_buffer = static_cast<const torch::optim::SGDParamState&>(*sgd.state().at(key)).momentum_buffer();
  const auto& loaded_buffer =
      static_cast<const torch::optim::SGDParamState&>(*loaded.state().at(key)).momentum_buffer();
  EXPECT_TRUE(torch::equal(original_buffer, loaded_buffer));
  EXPECT_FALSE(original_buffer.is_same(loaded_buffer));
  EXPECT_NE(original_buffer.data_ptr(), loaded_buffer.data_ptr());
}

TEST(LoadOptimizerStateDict, WrongShapesAreNamedAndLeaveTheOptimizerUnchanged) {
  auto small = make_model(3);
  torch::optim::Adam saved(small->parameters(), torch::optim::AdamOptions(0.01));
  train(small, saved, 0, 1);
  const c10::IValue state = optimizer_state_dict(saved);

  auto wide = make_model(5);
  torch::optim::Adam target(wide->parameters(), torch::optim::AdamOptions(0.02));
  const std::string message =
      testing::error_message<CheckpointError>([&] { load_optimizer_state_dict(target, state); });
  EXPECT_NE(message.find("state[0]['exp_avg'] has shape [3, 4]; the parameter it belongs to has "
                         "shape [5, 4]"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("state[1]['exp_avg_sq'] has shape [3]"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  EXPECT_TRUE(target.state().empty());
  EXPECT_EQ(group_lrs(target), std::vector<double>{0.02});
}

TEST(LoadOptimizerStateDict, DifferentGroupCountIsReported) {
  auto model = make_model();
  torch::optim::SGD two(two_groups(model), torch::optim::SGDOptions(0.1));
  torch::optim::SGD one(model->parameters(), torch::optim::SGDOptions(0.1));
  const std::string message =
      testing::error_message<CheckpointError>([&] { load_optimizer_state_dict(one, optimizer_state_dict(two)); });
  EXPECT_NE(message.find("the checkpoint has 2 param group(s); the optimizer has 1"), std::string::npos) << message;
}

TEST(LoadOptimizerStateDict, DifferentParameterCountInAGroupIsReported) {
  auto model = make_model();
  torch::optim::SGD all(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD weights_only(std::vector<torch::Tensor>{model[0]->parameters()[0]}, torch::optim::SGDOptions(0.1));
  const std::string message = testing::error_message<CheckpointError>(
      [&] { load_optimizer_state_dict(weights_only, optimizer_state_dict(all)); });
  EXPECT_NE(message.find("param_groups[0] has 4 parameter(s) in the checkpoint; the optimizer's "
                         "group has 1"),
            std::string::npos)
      << message;
}

TEST(LoadOptimizerStateDict, AnotherOptimizerKindIsReported) {
  auto model = make_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::Adam adam(model->parameters());
  const std::string message =
      testing::error_message<CheckpointError>([&] { load_optimizer_state_dict(adam, optimizer_state_dict(sgd)); });
  EXPECT_NE(message.find("the checkpoint holds the state of a SGD optimizer; this optimizer is a "
                         "Adam"),
            std::string::npos)
      << message;
}

TEST(LoadOptimizerStateDict, MissingAndMistypedFieldsAreAllListed) {
  auto model = make_model();
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01).amsgrad(true));
  train(model, adam, 0, 1);
  c10::IValue state = optimizer_state_dict(adam);
  auto group = at(state, "param_groups").toListRef()[0].toGenericDict();
  EXPECT_EQ(group.erase(c10::IValue("lr")), 1u);
  group.insert_or_assign(c10::IValue("eps"), c10::IValue("small"));
  EXPECT_EQ(at(state, "state")
                .toGenericDict()
                .at(c10::IValue(int64_t{2}))
                .toGenericDict()
                .erase(c10::IValue("max_exp_avg_sq")),
            1u);

  torch::optim::Adam target(model->parameters(), torch::optim::AdamOptions(0.01).amsgrad(true));
  const std::string message =
      testing::error_message<CheckpointError>([&] { load_optimizer_state_dict(target, state); });
  EXPECT_NE(message.find("param_groups[0]['lr'] is missing"), std::string::npos) << message;
  EXPECT_NE(message.find("param_groups[0]['eps'] is a String; expected a number"), std::string::npos) << message;
  EXPECT_NE(message.find("state[2]['max_exp_avg_sq'] is missing"), std::string::npos) << message;
}

TEST(LoadOptimizerStateDict, SomethingOtherThanADictIsRejectedWithAHint) {
  auto model = make_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  const std::string message =
      testing::error_message<CheckpointError>([&] { load_optimizer_state_dict(sgd, c10::IValue(int64_t{3})); });
  EXPECT_NE(message.find("is a Int; expected a dict"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
}

TEST(OptimizerStateDict, CustomOptimizerIsStoredAsItsLibtorchArchive) {
  auto model = make_model();
  HandWrittenMomentum optimizer(two_groups(model), torch::optim::SGDOptions(0.05).momentum(0.9));
  train(model, optimizer, 0, 1);
  const c10::IValue state = optimizer_state_dict(optimizer);
  EXPECT_EQ(at(state, kOptimizerKindKey).toStringRef(), "volt::(anonymous namespace)::HandWrittenMomentum");
  const torch::Tensor bytes = at(state, kLibtorchArchiveKey).toTensor();
  EXPECT_EQ(bytes.scalar_type(), torch::kUInt8);
  EXPECT_GT(bytes.numel(), 0);
  EXPECT_EQ(at(at(state, "param_groups").toListRef()[1], "lr").toDouble(), 0.05);
}

TEST(OptimizerStateDict, CustomOptimizerStateDoesNotLoadIntoAKnownOne) {
  auto model = make_model();
  HandWrittenMomentum custom({OptimizerParamGroup(model->parameters())}, torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const std::string message =
      testing::error_message<CheckpointError>([&] { load_optimizer_state_dict(sgd, optimizer_state_dict(custom)); });
  EXPECT_NE(message.find("HandWrittenMomentum optimizer; this optimizer is a SGD"), std::string::npos) << message;
}

TEST(OptimizerStateDict, OptimizerWhoseSaveWritesNothingIsReportedWithAHint) {
  auto model = make_model();
  Unsaveable optimizer({OptimizerParamGroup(model->parameters())});
  EXPECT_NO_THROW(optimizer_state_dict(optimizer));  // no state yet: nothing to lose
  optimizer.step();
  try {
    optimizer_state_dict(optimizer);
    ADD_FAILURE() << "expected a volt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wrote nothing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace volt
