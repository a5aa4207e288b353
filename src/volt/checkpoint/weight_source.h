// Initial weights a module reads from outside Volt's checkpoints (a Hugging Face folder, another
// framework's files), by parameter and by element range, so that a process reads only what it keeps.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace volt {

/// Where a fit's initial weights come from when a module returns one from
/// LightningModule::initial_weights. The Trainer reads it after the strategy has placed the
/// parameters: each parameter whole, except those fsdp's full_shard keeps in pieces, of which a
/// process asks only for its own elements (PyTorch's pattern of loading a state dict into an
/// already sharded model). A resumed fit restores its checkpoint instead and never asks.
///
/// Example (a source of constants; a real one maps names to a file's tensors):
/// ```
/// struct Ones : volt::WeightSource {
///   std::string describe() const override { return "ones"; }
///   at::Tensor read(const std::string&, const std::vector<int64_t>&, int64_t begin, int64_t end) override {
///     return torch::ones({end - begin});
///   }
/// };
/// ```
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// The source as errors name it (e.g. its folder).
  virtual std::string describe() const = 0;
  /// Elements [begin, end) of parameter `name` (its module-level name, e.g. "transformer.h.0.ln_1.weight"),
  /// whose whole shape is `shape`, in row-major order: a 1-D tensor of end - begin floating-point
  /// values (the Trainer converts them to the parameter's dtype and device). Throws volt::Error
  /// naming the parameter for one the source does not hold.
  virtual at::Tensor read(const std::string& name, const std::vector<int64_t>& shape, int64_t begin, int64_t end) = 0;
};

}  // namespace volt
