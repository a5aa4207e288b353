// How to split a sequence of layers into pipeline stages: torchgpipe's balance_by_time and
// balance_by_size, computed exactly (a dynamic program over contiguous partitions) from costs that
// profile_layers measures on a sample batch.
#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace volt {

/// What one layer costs, measured on a sample batch.
struct LayerCost {
  /// Seconds of its forward and backward pass (median of the repeats).
  double seconds = 0;
  /// Bytes of its parameters (and their gradients: counted twice).
  int64_t parameter_bytes = 0;
  /// Bytes of its output for the sample batch (the activation a stage keeps per micro-batch).
  int64_t activation_bytes = 0;
};

/// Times each layer of `layers` forward and backward on `sample` (`repeats` times after one
/// warm-up, keeping the median) and measures its parameter and activation bytes. A layer's
/// parameters are those its output's graph reaches, registered in the layer or not (a tied
/// embedding counts in each layer that uses it). No parameter's gradient changes. Throws
/// volt::Error when `layers` is empty.
std::vector<LayerCost> profile_layers(torch::nn::Sequential& layers, const torch::Tensor& sample, int repeats = 3);

/// The partition of layers with `costs` into `stages` contiguous, non-empty stages that minimizes
/// the slowest stage's time, keeping every stage's parameter and activation bytes (activations
/// times `micro_batches`, which a stage holds until their backward) within `memory_limit` when
/// given. Returns layer counts per stage (torchgpipe's `balance`). Throws volt::Error when
/// stages is out of [1, layers] or no partition fits the limit (naming the smallest stage
/// memory that would).
std::vector<int64_t> balance_by_time(const std::vector<LayerCost>& costs, int64_t stages,
                                     std::optional<int64_t> memory_limit = std::nullopt, int64_t micro_batches = 1);

/// Each stage's total time under `balance`.
std::vector<double> stage_seconds(const std::vector<LayerCost>& costs, const std::vector<int64_t>& balance);

/// Checks that `balance` splits `layers` layers into non-empty stages; throws volt::Error with a
/// HINT otherwise.
void check_balance(const std::vector<int64_t>& balance, int64_t layers);

/// "stage 0: layers 0-2 (3), 12.1 ms; stage 1: ..." for the log.
std::string describe_balance(const std::vector<LayerCost>& costs, const std::vector<int64_t>& balance);

}  // namespace volt
