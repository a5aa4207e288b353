// Pipeline parallelism: a sequence of layers split into stages, one thread per stage (each on its
// own device: CUDA devices, or the CPU for all of them), each batch cut into micro-batches that
// flow through the stages so that they compute at the same time (GPipe; torchgpipe's design with
// explicit stage threads instead of CUDA streams).
#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "volt/options/option_enums.h"  // PipelineSchedule

namespace volt {

/// What one pipelined step measured.
struct PipelineStepStats {
  /// Wall time of the step.
  double seconds = 0;
  /// Seconds each stage spent computing (not waiting for its neighbours).
  std::vector<double> busy;
  /// The share of stage time spent idle: 1 - sum(busy) / (stages x seconds). GPipe's bubble is
  /// (k - 1) / (m + k - 1) for k equal stages and m micro-batches.
  double bubble() const;
};

/// A sequence of layers split into stages that run on their own threads.
///
/// Each stage's input is a detached copy of the previous stage's output (moved to the stage's
/// device), so its backward pass ends at that copy and hands the gradient back; parameters of a
/// stage are touched only by its thread. The layers are shared with the Sequential given (the
/// same parameters), so optimizers built over that Sequential's parameters optimize the pipeline.
class Pipeline {
 public:
  /// Splits `layers` into stages of `balance` layer counts (check_balance), stage s on
  /// `devices[s]` (one per stage; its layers are moved there).
  Pipeline(const torch::nn::Sequential& layers, std::vector<int64_t> balance, std::vector<torch::Device> devices);

  /// Number of stages.
  int64_t stages() const { return static_cast<int64_t>(stages_.size()); }
  /// Layers per stage.
  const std::vector<int64_t>& balance() const { return balance_; }
  /// Stage `s`'s layers.
  torch::nn::Sequential& stage(int64_t s) { return stages_.at(static_cast<size_t>(s)); }

  /// The loss of one micro-batch: its output and the rows [begin, end) of the batch it holds.
  using MicroBatchLoss = std::function<torch::Tensor(const torch::Tensor& output, int64_t begin, int64_t end)>;

  /// Forward and backward of `input` cut into `chunks` micro-batches along dimension 0 (as
  /// torch.chunk: fewer when the batch has fewer rows). `loss` gives each micro-batch's loss,
  /// already weighted (for a mean over the batch: the micro-batch's mean times its share of the
  /// rows); the stages' parameter gradients accumulate the sum of their gradients, which is the
  /// whole batch's gradient. Returns the sum of the losses, detached, on the last stage's device.
  /// A stage that throws stops the others and the step throws volt::Error naming the stage,
  /// the micro-batch and the pass.
  torch::Tensor train_step(const torch::Tensor& input, int64_t chunks, PipelineSchedule schedule,
                           const MicroBatchLoss& loss, PipelineStepStats* stats = nullptr);

  /// The output for `input`, its micro-batches pipelined, on the last stage's device. Under grad
  /// mode it carries a graph whose backward runs every micro-batch's backward pass on the stage
  /// threads (GPipe's fill, then its drain), so a loss computed from it trains the stages as
  /// loss.backward() would train the unsplit layers; without grad mode it is the plain output.
  torch::Tensor forward_with_graph(const torch::Tensor& input, int64_t chunks);

  /// The output for `input` (no graph), its micro-batches pipelined; on the last stage's device.
  torch::Tensor forward(const torch::Tensor& input, int64_t chunks);

  /// One pass (forward or backward) of one micro-batch on one stage.
  struct Op {
    /// True for the forward pass.
    bool forward;
    /// Which micro-batch.
    int64_t micro_batch;
  };

 private:
  struct Run;
  /// A run over `input`'s micro-batches (checks chunks and the batch).
  std::shared_ptr<Run> start(const torch::Tensor& input, int64_t chunks) const;
  /// Runs `ops(s)` on stage s's thread for every stage, passing activations and gradients
  /// between them; the last stage computes `loss` per micro-batch when given, else its backward
  /// takes run.seeds. Throws volt::Error naming the first stage that failed.
  void execute(Run& run, const torch::Tensor& input, const std::function<std::vector<Op>(int64_t)>& ops,
               const MicroBatchLoss* loss);

  std::vector<int64_t> balance_;
  std::vector<torch::Device> devices_;
  std::vector<torch::nn::Sequential> stages_;
};

}  // namespace volt
