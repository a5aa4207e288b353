// Averages gradients across processes during the backward pass.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

namespace c10d {
class ProcessGroup;
class Reducer;
}  // namespace c10d

namespace volt {

/// Options of gradient synchronization, with PyTorch DDP's defaults.
struct GradientSyncOptions {
  /// Bucket size: gradients are all-reduced bucket by bucket as soon as a bucket is ready.
  int64_t bucket_cap_mb = 25;
  /// Allow parameters that get no gradient in a step (costs a graph traversal per step).
  bool find_unused_parameters = false;
};

namespace internal {
/// The gradient buckets ReducerSynchronizer all-reduces, as indices into its parameters: filled in
/// reverse registration order (the order backward makes gradients ready), the first bucket
/// closing at 1 MiB and the others at `bucket_cap_mb` MiB, each starting a new one once full.
/// Exposed for the tests of the layout.
std::vector<std::vector<size_t>> gradient_buckets(const std::vector<torch::Tensor>& parameters, int64_t bucket_cap_mb);
}  // namespace internal

/// Synchronizes gradients of a set of parameters; the strategy decides when.
class GradientSynchronizer {
 public:
  virtual ~GradientSynchronizer() = default;
  /// Arms synchronization for the next backward pass of `loss` (call right before backward).
  /// Steps that only accumulate gradients do not call it and communicate nothing.
  virtual void prepare_for_backward(const torch::Tensor& loss) = 0;
};

/// c10d's Reducer, the engine of PyTorch's DistributedDataParallel: autograd hooks mark
/// gradients ready, full buckets are all-reduced asynchronously while backward goes on, and
/// the end of backward waits for the last bucket and averages.
class ReducerSynchronizer : public GradientSynchronizer {
 public:
  /// `names[i]` names `parameters[i]` in errors (e.g. unused parameters).
  ReducerSynchronizer(std::vector<torch::Tensor> parameters, std::vector<std::string> names,
                      c10::intrusive_ptr<c10d::ProcessGroup> group, const GradientSyncOptions& options);
  ~ReducerSynchronizer() override;
  void prepare_for_backward(const torch::Tensor& loss) override;

 private:
  std::shared_ptr<c10d::Reducer> reducer_;
  bool find_unused_parameters_;
  std::vector<std::string> names_;
};

}  // namespace volt
