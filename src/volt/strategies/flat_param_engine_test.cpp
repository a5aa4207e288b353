// The flat-parameter engine over real Gloo, each rank a thread of this process (one TCPStore
// rendezvous on a free local port), so its layout and collectives are checked without launching
// processes or a Trainer.
#include "volt/strategies/flat_param_engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "volt/distributed/process_group.h"
#include "volt/distributed/testing_process_group.h"
#include "volt/optim/optimizer_state.h"

namespace volt {
namespace {

using testing::on_ranks;

/// A Linear(3, 2) (8 elements) and a unit around a Linear(2, 1) (3): 11 elements, so 6 per rank of
/// 2 with one of padding. Every rank holds the same values: 0, 1, 2, ... in registration order.
struct Model {
  torch::nn::Sequential module{torch::nn::Linear(3, 2), FsdpUnit(torch::nn::Linear(2, 1))};
  Model() {
    torch::NoGradGuard no_grad;
    double next = 0;
    for (torch::Tensor& p : module->parameters()) {
      p.copy_(torch::arange(next, next + static_cast<double>(p.numel()), torch::kFloat).reshape(p.sizes()));
      next += static_cast<double>(p.numel());
    }
  }
};

TEST(FlatParamEngine, HandsEachOptimizerThisProcesssPiecesAndKeepsTheModuleWhole) {
  on_ranks(2, [](ProcessGroup& group) {
    Model model;
    const std::vector<torch::Tensor> before = model.module->parameters();
    std::vector<torch::Tensor> copies;
    for (const torch::Tensor& p : before) copies.push_back(p.detach().clone());
    auto sgd = std::make_shared<torch::optim::SGD>(model.module->parameters(), torch::optim::SGDOptions(0.1));
    FlatParamEngine engine(group);
    engine.lay_out(*model.module, {sgd}, {});
    EXPECT_EQ(engine.group_count(), 1);
    EXPECT_FALSE(engine.shards_parameters());
    EXPECT_TRUE(engine.covers_optimizers());
    EXPECT_EQ(engine.trainable(), (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
    // 11 elements padded to 12: rank 0 owns elements 0..5 (the weight's), rank 1 6..11.
    std::vector<torch::Tensor> pieces = sgd->param_groups()[0].params();
    int64_t owned = 0;
    for (const torch::Tensor& piece : pieces) owned += piece.numel();
    EXPECT_EQ(owned, 6 - (group.rank() == 1 ? 1 : 0));
    const torch::Tensor first = torch::cat(pieces);
    EXPECT_TRUE(torch::equal(first, torch::arange(group.rank() * 6, group.rank() * 6 + owned, torch::kFloat)));
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], copies[i]));
  });
}

TEST(FlatParamEngine, AveragesTheGradientsIntoThePiecesAndGathersTheUpdatedParameters) {
  on_ranks(2, [](ProcessGroup& group) {
    Model model;
    auto sgd = std::make_shared<torch::optim::SGD>(model.module->parameters(), torch::optim::SGDOptions(1.0));
    FlatParamEngine engine(group);
    engine.lay_out(*model.module, {sgd}, {});
    engine.begin_backward();
    // Rank r's gradient is r + 1 everywhere: the average is 1.5.
    torch::Tensor loss = torch::zeros({});
    for (const torch::Tensor& p : model.module->parameters())
      loss = loss + p.sum() * static_cast<double>(group.rank() + 1);
    loss.backward();
    engine.reduce_root_gradients();
    for (const torch::Tensor& p : model.module->parameters()) EXPECT_FALSE(p.grad().defined());
    for (const torch::Tensor& piece : sgd->param_groups()[0].params())
      EXPECT_TRUE(torch::allclose(piece.grad(), torch::full_like(piece, 1.5)));
    sgd->step();
    engine.gather_root();
    double next = 0;
    for (const torch::Tensor& p : model.module->parameters()) {
      const torch::Tensor expected = torch::arange(next, next + static_cast<double>(p.numel()), torch::kFloat) - 1.5;
      EXPECT_TRUE(torch::allclose(p.reshape({-1}), expected));
      next += static_cast<double>(p.numel());
    }
  });
}

TEST(FlatParamEngine, FreesAUnitsParametersAndGathersThemWhole) {
  on_ranks(2, [](ProcessGroup& group) {
    Model model;
    auto unit = std::dynamic_pointer_cast<FsdpUnitImpl>(model.module->ptr(1));
    ASSERT_NE(unit, nullptr);
    const torch::Tensor weight = unit->module().parameters()[0];
    const torch::Tensor values = weight.detach().clone();
    auto sgd = std::make_shared<torch::optim::SGD>(model.module->parameters(), torch::optim::SGDOptions(0.1));
    FlatParamEngine engine(group);
    engine.lay_out(*model.module, {sgd}, {unit});
    ASSERT_EQ(engine.group_count(), 2);
    EXPECT_TRUE(engine.shards_parameters());
    EXPECT_EQ(engine.unit(1), unit);
    EXPECT_EQ(engine.parameters(1).size(), 2);
    engine.release_unit(1);
    EXPECT_EQ(weight.numel(), 0);  // between gathers
    engine.gather_unit(1);
    EXPECT_TRUE(torch::equal(weight, values));
  });
}

TEST(FlatParamEngine, GathersTheWholeOptimizerStateAndCutsItBackToTheSamePieces) {
  on_ranks(2, [](ProcessGroup& group) {
    Model model;
    auto adam = std::make_shared<torch::optim::Adam>(model.module->parameters(), torch::optim::AdamOptions(0.1));
    FlatParamEngine engine(group);
    engine.lay_out(*model.module, {adam}, {});
    engine.begin_backward();
    torch::Tensor loss = torch::zeros({});
    for (const torch::Tensor& p : model.module->parameters()) loss = loss + (p * p).sum();
    loss.backward();
    engine.reduce_root_gradients();
    adam->step();
    const c10::IValue before = optimizer_state_dict(*adam);
    const std::vector<c10::IValue> whole = engine.whole_optimizer_states(/*everyone=*/true);
    ASSERT_EQ(whole.size(), 1);
    // The whole state holds every parameter's exp_avg at its full size (0.weight: 6 elements).
    EXPECT_EQ(
        whole[0].toGenericDict().at("state").toGenericDict().at(0).toGenericDict().at("exp_avg").toTensor().numel(), 6);
    engine.load_optimizer_state(*adam, whole[0]);
    const auto pieces = [](const c10::IValue& dict) {
      std::map<int64_t, torch::Tensor> out;  // parameter id -> exp_avg
      for (const auto& entry : dict.toGenericDict().at("state").toGenericDict())
        out.emplace(entry.key().toInt(), entry.value().toGenericDict().at("exp_avg").toTensor());
      return out;
    };
    const std::map<int64_t, torch::Tensor> was = pieces(before);
    const std::map<int64_t, torch::Tensor> is = pieces(optimizer_state_dict(*adam));
    ASSERT_EQ(was.size(), 4);
    ASSERT_EQ(is.size(), 4);
    for (const auto& [id, tensor] : was) EXPECT_TRUE(torch::equal(tensor, is.at(id))) << id;
  });
}

}  // namespace
}  // namespace volt
