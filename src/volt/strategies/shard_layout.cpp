#include "volt/strategies/shard_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "volt/base/state_dict.h"
#include "volt/core/error.h"

namespace volt {

ShardLayout::ShardLayout(std::vector<int64_t> numels, int64_t world_size, int64_t rank)
    : numels_(std::move(numels)), world_size_(world_size), rank_(rank) {
  VOLT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
             "a shard layout needs 0 <= rank < world_size; got rank {} of {}. HINT: this is the process group's "
             "topology; check the rank variables.",
             rank, world_size);
  offsets_.reserve(numels_.size());
  for (const int64_t n : numels_) {
    offsets_.push_back(total_);
    total_ += n;
  }
  // Never zero: a collective over empty chunks is legal but every backend treats it differently.
  chunk_ = std::max<int64_t>(1, (total_ + world_size - 1) / world_size);
}

ShardPiece ShardLayout::piece(size_t i) const {
  const int64_t lo = rank_ * chunk_;
  const int64_t hi = lo + chunk_;
  const int64_t begin = std::max(offsets_.at(i), lo);
  const int64_t end = std::min(offsets_.at(i) + numels_.at(i), hi);
  if (begin >= end) return {};
  return ShardPiece{.begin = begin - offsets_[i], .end = end - offsets_[i], .chunk_offset = begin - lo};
}

torch::Tensor ShardLayout::flatten(const std::vector<torch::Tensor>& tensors,
                                   const torch::TensorOptions& options) const {
  VOLT_INTERNAL_ASSERT(tensors.size() == numels_.size(), "flatten of {} tensors in a layout of {}", tensors.size(),
                       numels_.size());
  torch::Tensor flat = torch::zeros({padded()}, options);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;
    VOLT_INTERNAL_ASSERT(tensors[i].numel() == numels_[i], "tensor {} has {} values, layout {}", i, tensors[i].numel(),
                         numels_[i]);
    flat.narrow(0, offsets_[i], numels_[i]).copy_(tensors[i].reshape({-1}));
  }
  return flat;
}

torch::Tensor ShardLayout::view(const torch::Tensor& flat, size_t i, at::IntArrayRef shape) const {
  return flat.narrow(0, offsets_.at(i), numels_.at(i)).view(shape);
}

bool is_elementwise_state(const std::string& key) {
  static const std::array<const char*, 7> kKeys = {
      "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "grad_avg", "sum"};
  return std::any_of(kKeys.begin(), kKeys.end(), [&key](const char* k) { return key == k; });
}

c10::IValue shard_optimizer_state(const c10::IValue& full, const std::vector<std::optional<ShardPiece>>& pieces,
                                  const std::vector<int64_t>& numels) {
  // A malformed state is passed on whole: load_optimizer_state_dict names what is wrong with it.
  if (!full.isGenericDict() || !full.toGenericDict().contains("state") ||
      !full.toGenericDict().at("state").isGenericDict()) {
    return full;
  }
  const c10::impl::GenericDict top = full.toGenericDict();
  c10::impl::GenericDict out = top.copy();
  const c10::impl::GenericDict state = top.at("state").toGenericDict();
  c10::impl::GenericDict sharded = state.copy();
  for (const auto& entry : state) {
    if (!entry.key().isInt()) continue;
    const int64_t id = entry.key().toInt();
    if (id < 0 || id >= static_cast<int64_t>(pieces.size()) || !pieces[id]) continue;
    const ShardPiece piece = *pieces[id];
    if (!entry.value().isGenericDict()) continue;
    c10::impl::GenericDict param_state = entry.value().toGenericDict().copy();
    for (const auto& field : entry.value().toGenericDict()) {
      const std::string key = field.key().toStringRef();
      if (!is_elementwise_state(key) || !field.value().isTensor()) continue;
      const torch::Tensor whole = field.value().toTensor();
      if (whole.numel() != numels[id]) {
        throw CheckpointError(fmt::format(
            "optimizer state '{}' of parameter {} holds {} values, but the parameter has {}. HINT: resume with "
            "the module and optimizer the checkpoint was written with.",
            key, id, whole.numel(), numels[id]));
      }
      param_state.insert_or_assign(key, whole.reshape({-1}).narrow(0, piece.begin, piece.numel()).clone());
    }
    sharded.insert_or_assign(entry.key(), param_state);
  }
  out.insert_or_assign("state", sharded);
  return out;
}

}  // namespace volt
