#include "volt/progress/model_summary.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "volt/core/error.h"

namespace volt {
namespace {

/// encoder (frozen): Linear(10, 20) + ReLU = 220 params; head: Linear(20, 2) = 42 params;
/// scale: 3 params on the module itself.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    encoder = register_module("encoder", torch::nn::Sequential(torch::nn::Linear(10, 20), torch::nn::ReLU()));
    head = register_module("head", torch::nn::Linear(20, 2));
    scale = register_parameter("scale", torch::ones({3}));
    for (auto& p : encoder->parameters()) p.set_requires_grad(false);
  }
  torch::nn::Sequential encoder{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(Net);

TEST(ModelSummary, CountsDirectChildrenAndTotalsWithAFrozenChild) {
  Net net;
  const ModelSummary summary = summarize(*net);
  ASSERT_EQ(summary.rows.size(), 2u);
  EXPECT_EQ(summary.rows[0].name, "encoder");
  EXPECT_EQ(summary.rows[0].type, "Sequential");
  EXPECT_EQ(summary.rows[0].params, 220);
  EXPECT_FALSE(summary.rows[0].trainable);
  EXPECT_EQ(summary.rows[1].name, "head");
  EXPECT_EQ(summary.rows[1].type, "Linear");
  EXPECT_EQ(summary.rows[1].params, 42);
  EXPECT_TRUE(summary.rows[1].trainable);

  EXPECT_EQ(summary.total_params, 265);
  EXPECT_EQ(summary.trainable_params, 45);
  EXPECT_EQ(summary.non_trainable_params, 220);
  EXPECT_EQ(summary.other_params, 3);
  EXPECT_DOUBLE_EQ(summary.size_mb, 265 * 4 / 1e6);
}

TEST(ModelSummary, DeeperLevelsGetDottedNames) {
  Net net;
  const ModelSummary summary = summarize(*net, 2);
  ASSERT_EQ(summary.rows.size(), 4u);
  EXPECT_EQ(summary.rows[1].name, "encoder.0");
  EXPECT_EQ(summary.rows[1].type, "Linear");
  EXPECT_EQ(summary.rows[2].name, "encoder.1");
  EXPECT_EQ(summary.rows[2].type, "ReLU");
  EXPECT_EQ(summary.rows[2].params, 0);
  EXPECT_EQ(summarize(*net, -1).rows.size(), 4u);
  EXPECT_TRUE(summarize(*net, 0).rows.empty());
  EXPECT_THROW(summarize(*net, -2), Error);
}

TEST(ModelSummary, UserModulesAreNamedWithoutImpl) {
  auto outer = std::make_shared<torch::nn::Module>();
  outer->register_module("net", Net());
  EXPECT_EQ(summarize(*outer).rows.at(0).type, "Net");
}

TEST(ModelSummary, SharedParametersAreCountedOnce) {
  auto shared = torch::nn::Linear(4, 4);  // 20 params
  auto outer = std::make_shared<torch::nn::Module>();
  outer->register_module("a", shared);
  outer->register_module("b", shared);
  EXPECT_EQ(summarize(*outer).total_params, 20);
}

TEST(ModelSummary, TableIsLightningsLayout) {
  Net net;
  EXPECT_EQ(summarize(*net).to_string(),
            "  | Name         | Type       | Params\n"
            "--------------------------------------------\n"
            "0 | encoder      | Sequential | 220   \n"
            "1 | head         | Linear     | 42    \n"
            "  | other params | n/a        | 3     \n"
            "--------------------------------------------\n"
            "45        Trainable params\n"
            "220       Non-trainable params\n"
            "265       Total params\n"
            "0.001     Total estimated model params size (MB)");
}

TEST(ModelSummary, CountsReadLikeLightnings) {
  EXPECT_EQ(human_readable_count(0), "0  ");
  EXPECT_EQ(human_readable_count(123), "123  ");
  EXPECT_EQ(human_readable_count(1234), "1.2 K");
  EXPECT_EQ(human_readable_count(235'000), "235 K");
  EXPECT_EQ(human_readable_count(2'000'000), "2.0 M");
  EXPECT_EQ(human_readable_count(1'200'000), "1.2 M");
  EXPECT_EQ(human_readable_count(3'000'000'000), "3.0 B");
  EXPECT_EQ(human_readable_count(400'000'000'000'000), "400 T");
  EXPECT_EQ(human_readable_count(5'000'000'000'000'000), "5,000 T");
}

TEST(ModelSummary, LargeSizesGetThousandsSeparators) {
  ModelSummary summary;
  summary.size_mb = 12345.6789;
  const std::string table = summary.to_string();
  EXPECT_NE(table.find("\n12,345.679Total estimated model params size (MB)"), std::string::npos) << table;
}

}  // namespace
}  // namespace volt
