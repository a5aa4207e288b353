// What a step receives: a batch of any shape, and the examples it is collated from.
//
// The simple case stays LibTorch's: `batch.data` and `batch.target`. Anything else (masks,
// several inputs, a second target) goes into `tensors` by name, and what differs in size from
// example to example (detection boxes, token lists) into `lists`, one tensor per example. The
// Trainer moves every tensor to the device, and dp/ddp2 split every one along the batch dimension.
#pragma once

#include <torch/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace volt {

/// One example of a map-style dataset (Dataset::get), before a collate function batches it.
struct Example {
  /// The input.
  torch::Tensor data;
  /// The target; may be undefined.
  torch::Tensor target;
  /// More named tensors, stacked into the batch's `tensors` like data and target.
  std::map<std::string, torch::Tensor> tensors;
  /// Named tensors whose size varies between examples, kept as one list entry per example
  /// (the batch's `lists`) instead of being stacked.
  std::map<std::string, torch::Tensor> lists;
};

/// A batch. `data` and `target` keep the simple case as it was (LibTorch's Example<>).
struct Batch {
  /// The inputs, batch dimension first; may be undefined when everything is named.
  torch::Tensor data;
  /// The targets; may be undefined.
  torch::Tensor target;
  /// Named tensors, batch dimension first (masks, extra inputs, more targets).
  std::map<std::string, torch::Tensor> tensors;
  /// Named per-example tensors of varying size: entry i belongs to example i.
  std::map<std::string, std::vector<torch::Tensor>> lists;

  /// The named tensor `name`; throws volt::Error listing the names there are.
  const torch::Tensor& at(const std::string& name) const;
  /// The named per-example list `name`; throws volt::Error listing the names there are.
  const std::vector<torch::Tensor>& list(const std::string& name) const;
  /// Examples in the batch: the first dimension of `data`, else of `target`, else of any named
  /// tensor, else the length of any list; 1 for a batch of scalars or nothing.
  int64_t size() const;
  /// This batch with `fn` applied to every defined tensor (data, target, named, in lists).
  Batch map(const std::function<torch::Tensor(const torch::Tensor&)>& fn) const;
  /// Examples [start, start + length): every tensor narrowed along dimension 0, every list cut
  /// (dp's and ddp2's split of a batch across devices).
  Batch slice(int64_t start, int64_t length) const;
  /// Checks that every tensor and list has size() examples; throws volt::Error naming the one
  /// that does not, with `who` (e.g. "dp") in the message.
  void check_sizes(const std::string& who) const;
};

/// Turns examples into a batch (DataLoaderOptions::collate).
using CollateFn = std::function<Batch(std::vector<Example>)>;

/// The default collate: stacks data, target and each named tensor along a new dimension 0, and
/// gathers `lists`. Examples must agree on which fields they have and on the shapes they stack;
/// a mismatch is a volt::Error naming the field, the two examples and their shapes, with a HINT.
Batch default_collate(std::vector<Example> examples);

}  // namespace volt
