// Where the optimized parameters lie when their values are split evenly over processes (fsdp):
// one flat buffer of all of them, cut into world_size equal chunks, each process owning one.
// Pure arithmetic and tensor slicing, so it is tested without processes.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace volt {

/// This process's part of one tensor: the flat element range [begin, end) of the tensor
/// (flattened), empty when begin == end.
struct ShardPiece {
  /// First element of the tensor that this process owns.
  int64_t begin = 0;
  /// One past the last.
  int64_t end = 0;
  /// Where the piece starts inside this process's chunk.
  int64_t chunk_offset = 0;
  /// Elements owned (end - begin).
  int64_t numel() const { return end - begin; }
};

/// A list of tensors laid end to end in a flat buffer padded to world_size equal chunks; rank r
/// owns elements [r * chunk, (r + 1) * chunk). ZeRO's and FSDP's flat-parameter layout.
class ShardLayout {
 public:
  /// The layout of tensors with `numels` elements over `world_size` processes, seen by `rank`.
  /// Throws volt::Error for a world_size < 1 or a rank outside it.
  ShardLayout(std::vector<int64_t> numels, int64_t world_size, int64_t rank);

  /// How many tensors.
  size_t size() const { return numels_.size(); }
  /// Elements of all tensors together.
  int64_t total() const { return total_; }
  /// Elements each process owns (the last chunks may hold padding).
  int64_t chunk() const { return chunk_; }
  /// world_size x chunk: the flat buffer's length.
  int64_t padded() const { return chunk_ * world_size_; }
  /// Where tensor `i` starts in the flat buffer.
  int64_t offset(size_t i) const { return offsets_.at(i); }
  /// Elements of tensor `i`.
  int64_t numel(size_t i) const { return numels_.at(i); }
  /// This process's piece of tensor `i`.
  ShardPiece piece(size_t i) const;

  /// The flat buffer of `tensors` (one per entry, flattened; undefined ones as zeros), padded with
  /// zeros, with `options`' dtype and device.
  torch::Tensor flatten(const std::vector<torch::Tensor>& tensors, const torch::TensorOptions& options) const;
  /// Tensor `i`'s elements of `flat` (a full flat buffer), as a view shaped like `shape`.
  torch::Tensor view(const torch::Tensor& flat, size_t i, at::IntArrayRef shape) const;

 private:
  std::vector<int64_t> numels_;
  std::vector<int64_t> offsets_;
  int64_t world_size_;
  int64_t rank_;
  int64_t total_ = 0;
  int64_t chunk_ = 0;
};

/// True for the optimizer state entries that hold one value per parameter element (Adam's
/// exp_avg, exp_avg_sq and max_exp_avg_sq, SGD's and RMSprop's momentum_buffer, RMSprop's
/// square_avg and grad_avg, Adagrad's sum), which are sharded like the parameters; every other
/// entry (step) is the same on every process.
bool is_elementwise_state(const std::string& key);

/// `full` (an optimizer_state_dict of the whole parameters, numbered across groups) cut to this
/// process's pieces: `pieces[id]` is the piece of parameter `id`, nullopt for one that is not
/// sharded (its state is kept whole). Elementwise entries become 1-D tensors of the piece's
/// length; the rest is copied. Throws volt::CheckpointError when an elementwise entry's size is
/// not the parameter's (`numels[id]`).
c10::IValue shard_optimizer_state(const c10::IValue& full, const std::vector<std::optional<ShardPiece>>& pieces,
                                  const std::vector<int64_t>& numels);

}  // namespace volt
