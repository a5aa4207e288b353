// Activation checkpointing: a block's activations are dropped in forward and recomputed in
// backward, trading one more forward pass for the memory of everything the block saves for
// backward (torch.utils.checkpoint, which LibTorch's C++ API lacks).
#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

namespace volt {

/// A piece of a forward pass that checkpoint() may run twice: it must compute the same function
/// of its inputs each time (its randomness is replayed) and must not change state outside its
/// outputs (a BatchNorm's running statistics would be updated twice).
using CheckpointFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>& inputs)>;

/// Runs `fn(inputs)` keeping none of its activations: only the inputs are saved, and backward
/// runs `fn` again with gradients on, under the random generators' state (CPU and, for CUDA
/// inputs, their device's) and the autocast settings of the first run, then back-propagates
/// through that recomputation. Gradients equal those of `fn` run plainly. The parameters `fn`
/// uses receive their gradients during that inner backward (as PyTorch's reentrant checkpoint
/// does); the inputs' gradients flow on through the returned outputs.
///
/// With gradients off, or no input requiring them, it is `fn(inputs)`. Outputs that alias an
/// input are copied. Only floating-point outputs carry gradients.
///
/// Example (each transformer block recomputed in backward):
/// ```
/// x = volt::checkpoint([&](const std::vector<torch::Tensor>& in) {
///   return std::vector<torch::Tensor>{block->forward(in[0])};
/// }, {x})[0];
/// ```
std::vector<torch::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<torch::Tensor>& inputs);

/// checkpoint() of a one-tensor function.
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input);

}  // namespace volt
