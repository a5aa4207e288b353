#include "volt/pipeline/pipe.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/pipeline/pipeline.h"

namespace volt {
namespace {

torch::nn::Sequential layers() {
  torch::manual_seed(1);
  return torch::nn::Sequential(torch::nn::Linear(5, 32), torch::nn::ReLU(), torch::nn::Linear(32, 32),
                               torch::nn::ReLU(), torch::nn::Linear(32, 2));
}

/// The loss's gradients of the parameters and of the input.
std::vector<torch::Tensor> gradients(const std::function<torch::Tensor(const torch::Tensor&)>& model,
                                     const std::vector<torch::Tensor>& params, const torch::Tensor& x,
                                     const torch::Tensor& y) {
  for (const torch::Tensor& p : params)
    if (p.grad().defined()) p.mutable_grad().zero_();
  const torch::Tensor input = x.detach().requires_grad_(true);
  torch::mse_loss(model(input), y).backward();
  std::vector<torch::Tensor> out{input.grad().clone()};
  for (const torch::Tensor& p : params) out.push_back(p.grad().clone());
  return out;
}

TEST(PipeTest, APipelinedForwardTrainsLikeTheSequentialAndPassesTheInputsGradient) {
  Pipe pipe(layers());
  const torch::Tensor x = torch::randn({9, 5});
  const torch::Tensor y = torch::randn({9, 2});
  const auto params = pipe->parameters();
  const auto plain = gradients([&](const torch::Tensor& t) { return pipe->forward(t); }, params, x, y);
  for (const int64_t chunks : {1, 2, 4, 9}) {
    pipe->enable({.balance = {2, 3}, .devices = {torch::kCPU, torch::kCPU}, .chunks = chunks});
    const auto piped = gradients([&](const torch::Tensor& t) { return pipe->forward(t); }, params, x, y);
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(torch::allclose(piped[i], plain[i], 1e-5, 1e-7)) << chunks << " chunks, tensor " << i;
    }
    EXPECT_EQ(pipe->balance(), (std::vector<int64_t>{2, 3}));
  }
  // Without grad mode (an evaluation) the output is the same, with no graph.
  const torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(pipe->forward(x), pipe->layers->forward(x), 1e-6, 1e-7));
}

TEST(PipeTest, AutoMeasuresTheLayersOnceAndAResumedPipeKeepsThePartition) {
  Pipe pipe(layers());
  std::vector<std::string> reports;
  const auto report = [&reports](const std::string& line) { reports.push_back(line); };
  pipe->enable({.devices = {torch::kCPU, torch::kCPU, torch::kCPU}, .chunks = 2, .report = report});
  const torch::Tensor x = torch::randn({8, 5});
  pipe->forward(x).sum().backward();
  pipe->forward(x).sum().backward();
  ASSERT_EQ(reports.size(), 1U);
  EXPECT_NE(reports[0].find("auto: balanced by the layers' measured time"), std::string::npos) << reports[0];
  const std::vector<int64_t> chosen = pipe->balance();
  ASSERT_EQ(chosen.size(), 3U);
  // The buffer goes into state_dict, so a checkpoint restores the partition.
  Pipe resumed(layers());
  {
    torch::NoGradGuard no_grad;
    resumed->named_buffers()["balance"].copy_(pipe->named_buffers()["balance"]);
  }
  resumed->enable({.devices = {torch::kCPU, torch::kCPU, torch::kCPU}, .chunks = 2, .report = report});
  resumed->forward(x);
  ASSERT_EQ(reports.size(), 2U);
  EXPECT_NE(reports[1].find("restored from the checkpoint"), std::string::npos) << reports[1];
  EXPECT_EQ(resumed->balance(), chosen);
}

TEST(PipeTest, RefusesMoreStagesThanLayersAndABalanceOfAnotherLength) {
  Pipe pipe(layers());
  EXPECT_THROW(pipe->enable({.devices = std::vector<torch::Device>(6, torch::kCPU)}), Error);
  EXPECT_THROW(pipe->enable({.balance = {1, 1, 3}, .devices = {torch::kCPU, torch::kCPU}}), Error);
  EXPECT_THROW(pipe->enable({.balance = {1, 1}, .devices = {torch::kCPU, torch::kCPU}}), Error);
}

TEST(PipelineGraphTest, TheGraphsBackwardDrainsTheStagesLikeTheUnsplitBackward) {
  torch::nn::Sequential model = layers();
  const torch::Tensor x = torch::randn({7, 5});
  const torch::Tensor y = torch::randn({7, 2});
  const auto params = model->parameters();
  const auto plain = gradients([&](const torch::Tensor& t) { return model->forward(t); }, params, x, y);
  Pipeline pipeline(model, {1, 2, 2}, std::vector<torch::Device>(3, torch::kCPU));
  const auto piped = gradients([&](const torch::Tensor& t) { return pipeline.forward_with_graph(t, 3); }, params, x, y);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::allclose(piped[i], plain[i], 1e-5, 1e-7)) << i;
}

}  // namespace
}  // namespace volt
