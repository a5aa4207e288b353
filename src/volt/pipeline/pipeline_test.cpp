#include "volt/pipeline/pipeline.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>

#include "volt/core/error.h"

namespace volt {
namespace {

torch::nn::Sequential make_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                               torch::nn::Tanh(), torch::nn::Linear(16, 3));
}

std::vector<torch::Tensor> gradients(const torch::nn::Sequential& model) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}

void zero(const torch::nn::Sequential& model) {
  for (const torch::Tensor& p : model->parameters())
    if (p.grad().defined()) p.mutable_grad().zero_();
}

struct Case {
  std::vector<int64_t> balance;
  PipelineSchedule schedule;
};

TEST(PipelineTest, MicroBatchedStagesGiveTheUnsplitModelsLossAndGradients) {
  torch::nn::Sequential model = make_model();
  const torch::Tensor x = torch::randn({12, 6});
  const torch::Tensor y = torch::randn({12, 3});
  const torch::Tensor whole_loss = torch::mse_loss(model->forward(x), y);
  whole_loss.backward();
  const std::vector<torch::Tensor> expected = gradients(model);
  for (const Case& c : {Case{{2, 3}, PipelineSchedule::kGPipe}, Case{{2, 3}, PipelineSchedule::k1F1B},
                        Case{{1, 2, 2}, PipelineSchedule::kGPipe}, Case{{1, 2, 2}, PipelineSchedule::k1F1B}}) {
    Pipeline pipeline(model, c.balance, std::vector<torch::Device>(c.balance.size(), torch::kCPU));
    for (int64_t chunks = 1; chunks <= 8; ++chunks) {
      zero(model);
      // Each micro-batch's mean, weighted by its share of the rows: their sum is the batch mean.
      const torch::Tensor loss =
          pipeline.train_step(x, chunks, c.schedule, [&](const torch::Tensor& out, int64_t begin, int64_t end) {
            return torch::mse_loss(out, y.narrow(0, begin, end - begin)) * (static_cast<double>(end - begin) / 12.0);
          });
      const std::string where =
          fmt::format("{} stages, {} chunks, {}", c.balance.size(), chunks, to_string(c.schedule));
      EXPECT_TRUE(torch::allclose(loss, whole_loss.detach(), 1e-5, 1e-7)) << where;
      const std::vector<torch::Tensor> got = gradients(model);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(torch::allclose(got[i], expected[i], 1e-5, 1e-7)) << where << ", parameter " << i;
      }
    }
  }
}

TEST(PipelineTest, ForwardEqualsTheUnsplitModel) {
  torch::nn::Sequential model = make_model();
  const torch::Tensor x = torch::randn({10, 6});
  const torch::Tensor expected = model->forward(x).detach();
  Pipeline pipeline(model, {3, 2}, {torch::kCPU, torch::kCPU});
  for (int64_t chunks : {1, 3, 10, 16}) {
    EXPECT_TRUE(torch::allclose(pipeline.forward(x, chunks), expected, 1e-6, 1e-7)) << chunks << " chunks";
  }
}

TEST(PipelineTest, AStageThatThrowsStopsTheStepAndIsNamed) {
  std::atomic<int> calls{0};
  // A layer in stage 1 that fails on its third micro-batch; the stages before and after it
  // must not wait for it forever.
  torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                              torch::nn::Functional([&calls](const torch::Tensor& t) {
                                if (++calls == 3) throw std::runtime_error("layer broke");
                                return t;
                              }),
                              torch::nn::Tanh(), torch::nn::Linear(16, 3));
  Pipeline pipeline(model, {2, 2, 2}, std::vector<torch::Device>(3, torch::kCPU));
  const torch::Tensor x = torch::randn({8, 6});
  for (const PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    calls = 0;
    try {
      pipeline.train_step(x, 4, schedule, [](const torch::Tensor& out, int64_t, int64_t) { return out.sum(); });
      FAIL() << "the failing stage went unnoticed";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("pipeline stage 1 (layers 2-3) failed in the forward pass of micro-batch 2 of 4"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("layer broke"), std::string::npos) << message;
    }
  }
}

TEST(PipelineTest, RefusesABalanceOrDevicesThatDoNotFit) {
  torch::nn::Sequential model = make_model();
  EXPECT_THROW(Pipeline(model, {2, 2}, {torch::kCPU, torch::kCPU}), Error);
  EXPECT_THROW(Pipeline(model, {2, 3}, {torch::kCPU}), Error);
  Pipeline pipeline(model, {5}, {torch::kCPU});
  EXPECT_THROW(pipeline.train_step(torch::randn({4, 6}), 0, PipelineSchedule::kGPipe,
                                   [](const torch::Tensor& out, int64_t, int64_t) { return out.sum(); }),
               Error);
  EXPECT_EQ(parse_pipeline_schedule(" 1F1B "), PipelineSchedule::k1F1B);
  EXPECT_THROW(parse_pipeline_schedule("interleaved"), Error);
}

}  // namespace
}  // namespace volt
