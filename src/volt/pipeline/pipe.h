// The module a LightningModule holds its pipelined layers in: a Sequential that strategy="pipeline"
// runs as a Pipeline (stages on threads and devices, micro-batches) and every other strategy runs
// as the Sequential, so the module does not change between strategies.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/pipeline/pipeline.h"

namespace volt {

/// How a Pipe splits and runs its layers under strategy="pipeline" (the Trainer sets them).
struct PipeOptions {
  /// Layers per stage; empty: "auto", balance_by_time over the layers' times measured on the
  /// first batch (unless a checkpoint restored the partition).
  std::vector<int64_t> balance;
  /// One device per stage (on the CPU: the CPU, once per stage thread).
  std::vector<torch::Device> devices;
  /// Micro-batches per batch.
  int64_t chunks = 1;
  /// The micro-batches' order in train_step.
  PipelineSchedule schedule = PipelineSchedule::kGPipe;
  /// The run scales its loss before backward (16-mixed): train_step, which seeds the backward
  /// itself, refuses to run.
  bool loss_scaling = false;
  /// Told once, with describe_balance's text, when the partition is chosen.
  std::function<void(const std::string&)> report;
};

/// The most stages a Pipe records in its `balance` buffer.
inline constexpr int64_t kMaxPipeStages = 32;

/// A Sequential that runs as a pipeline when the strategy enables it.
///
/// Example (in a LightningModule's constructor; training_step calls `layers_(x)` as it would call
/// a Sequential):
/// ```
/// layers_ = register_module("layers", volt::Pipe(torch::nn::Sequential(
///     torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10))));
/// ```
/// The partition in force is the buffer `balance` (layer counts, zero-padded to kMaxPipeStages),
/// so a checkpoint records it and a resumed run splits the layers the same way.
class PipeImpl : public torch::nn::Module {
 public:
  /// Holds `layers` (registered as "layers": their parameters are the Pipe's).
  explicit PipeImpl(torch::nn::Sequential layers);
  ~PipeImpl() override;

  /// `layers`' output for `x`: through the pipeline when enabled (micro-batched over the stages,
  /// with a graph whose backward runs on the stage threads), else the Sequential's. The output
  /// is on `x`'s device.
  torch::Tensor forward(const torch::Tensor& x);

  /// A training step's loss of `x` through the layers, `loss` giving each micro-batch's (as
  /// Pipeline::train_step: its output and its rows [begin, end) of the batch, weighted by its
  /// share of the rows for a mean). Pipelined, the forward and backward passes run here, in the
  /// schedule PipeOptions names (1F1B or GPipe), and the returned loss (the micro-batches' sum)
  /// carries a graph whose backward adds nothing: the layers' gradients are complete already,
  /// so training_step returns it as any loss. Otherwise (another strategy, or no grad mode) it is
  /// `loss(layers(x), 0, rows)` with its graph.
  ///
  /// Example (in training_step):
  /// ```
  /// const int64_t rows = batch.data.size(0);
  /// return layers_->train_step(batch.data, [&](const torch::Tensor& out, int64_t begin, int64_t end) {
  ///   const torch::Tensor target = batch.target.slice(0, begin, end).to(out.device());
  ///   return torch::mse_loss(out, target) * (static_cast<double>(end - begin) / rows);
  /// });
  /// ```
  torch::Tensor train_step(const torch::Tensor& x, const Pipeline::MicroBatchLoss& loss);

  /// Runs the layers as a pipeline from the next forward on (strategy="pipeline").
  void enable(PipeOptions options);
  /// Back to the plain Sequential.
  void disable();
  /// Whether the strategy enabled the pipeline (forward and train_step then run the stages).
  bool enabled() const { return options_.has_value(); }
  /// Layers per stage in force: chosen at the first pipelined forward, or restored; empty before.
  std::vector<int64_t> balance() const;

  /// The layers.
  torch::nn::Sequential layers;

 private:
  /// Builds pipeline_ on `sample`'s first forward: the restored, the requested or the measured partition.
  void build(const torch::Tensor& sample);

  torch::Tensor balance_buffer_;
  std::optional<PipeOptions> options_;
  std::unique_ptr<Pipeline> pipeline_;
};

/// The ModuleHolder of PipeImpl (as torch::nn::Sequential is of SequentialImpl).
TORCH_MODULE(Pipe);

}  // namespace volt
