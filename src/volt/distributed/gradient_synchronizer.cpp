#include "volt/distributed/gradient_synchronizer.h"

#include <sstream>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <tuple>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/distributed/c10d_compat.h"

namespace volt {

namespace {
// PyTorch DDP's first bucket is small so communication starts early in the backward pass.
constexpr int64_t kFirstBucketBytes = 1024 * 1024;

/// c10d's Reducer with its check for an unfinished reduction callable on its own: Volt keeps
/// the bucket layout it was built with instead of calling rebuild_buckets (see below).
class FixedLayoutReducer : public c10d::Reducer {
 public:
  using c10d::Reducer::Reducer;
  /// Throws c10d's error when a parameter got no gradient in the previous step.
  void check_prior_reduction_finished() { ensure_prior_reduction_finished(); }
};

/// c10d's message speaks of Python's DDP and parameter indices; say it in Volt's terms, with names.
std::string explain_unfinished_reduction(const std::string& message, const std::vector<std::string>& names) {
  if (message.find("Expected to have finished reduction") == std::string::npos) return message;
  std::vector<std::string> unused;
  const std::string marker = "did not receive grad for rank ";
  const auto at = message.find(marker);
  if (at != std::string::npos) {
    std::istringstream in(message.substr(message.find(':', at) + 1));
    size_t index = 0;
    while (in >> index) unused.push_back(index < names.size() ? "'" + names[index] + "'" : std::to_string(index));
  }
  return fmt::format(
      "ddp: some parameters got no gradient in the previous step{}{}, so their gradients were never "
      "averaged. HINT: set find_unused_parameters=true (--find-unused-parameters, or strategy="
      "\"ddp_find_unused_parameters_true\"), or make every parameter take part in the loss.",
      unused.empty() ? "" : ": ", join(unused, ", "));
}

/// The buckets (indices into `parameters`) and each one's size limit, for a cap of `cap` bytes.
std::tuple<std::vector<std::vector<size_t>>, std::vector<size_t>> bucket_layout(
    const std::vector<torch::Tensor>& parameters, int64_t cap) {
  // Buckets filled in the order gradients become ready, the reverse of registration, which is the
  // layout PyTorch DDP rebuilds after its first step. Filling them in registration order and
  // reversing the list (PyTorch's layout before the rebuild) splits a small model's gradients over
  // two buckets where one would do (the benchmark's MLP: two all-reduces per step instead of one).
  const size_t count = parameters.size();
  std::vector<torch::Tensor> ready_order(parameters.rbegin(), parameters.rend());
  std::vector<int64_t> indices(count);
  for (size_t i = 0; i < count; ++i) indices[i] = static_cast<int64_t>(count - 1 - i);
  return c10d::compute_bucket_assignment_by_size(ready_order,
                                                 {static_cast<size_t>(kFirstBucketBytes), static_cast<size_t>(cap)},
                                                 std::vector<bool>(count, false), indices);
}
}  // namespace

ReducerSynchronizer::ReducerSynchronizer(std::vector<torch::Tensor> parameters, std::vector<std::string> names,
                                         c10::intrusive_ptr<c10d::ProcessGroup> group,
                                         const GradientSyncOptions& options)
    : find_unused_parameters_(options.find_unused_parameters), names_(names) {
  VOLT_CHECK(!parameters.empty(),
             "ddp needs at least one parameter that requires grad; the module has none. HINT: register the trainable "
             "parameters (register_parameter or register_module) and leave some unfrozen before fit.");
  VOLT_CHECK(options.bucket_cap_mb > 0, "bucket_cap_mb={} must be positive. HINT: the default is 25 (MiB).",
             options.bucket_cap_mb);
  const int64_t cap = options.bucket_cap_mb * 1024 * 1024;
  const std::vector<bool> sparse(parameters.size(), false);
  auto [buckets, limits] = bucket_layout(parameters, cap);
  std::unordered_map<size_t, std::string> param_names;
  for (size_t i = 0; i < names.size(); ++i) param_names[i] = names[i];
  reducer_ = compat::make_reducer<FixedLayoutReducer>(std::move(parameters), std::move(buckets), std::move(limits),
                                                      std::move(group), sparse, cap, options.find_unused_parameters,
                                                      std::move(param_names), kFirstBucketBytes);
}

ReducerSynchronizer::~ReducerSynchronizer() = default;

std::vector<std::vector<size_t>> internal::gradient_buckets(const std::vector<torch::Tensor>& parameters,
                                                            int64_t bucket_cap_mb) {
  VOLT_CHECK(bucket_cap_mb > 0, "bucket_cap_mb={} must be positive. HINT: the default is 25 (MiB).", bucket_cap_mb);
  return std::get<0>(bucket_layout(parameters, bucket_cap_mb * 1024 * 1024));
}

void ReducerSynchronizer::prepare_for_backward(const torch::Tensor& loss) {
  // What PyTorch DDP's forward does first: fail if the previous reduction never finished (a
  // parameter got no gradient without find_unused_parameters). Unlike PyTorch DDP, the buckets
  // are not rebuilt in the order gradients became ready after the first step: the layout decides
  // in which order the all-reduce adds each element, so a run resumed from a checkpoint would add
  // its first step's gradients differently from the uninterrupted run (pre-rebuild layout) and
  // drift from it. A fixed layout keeps resume bit-identical; gradients still arrive roughly in
  // reverse registration order, the order the buckets are built in.
  try {
    static_cast<FixedLayoutReducer&>(*reducer_).check_prior_reduction_finished();
  } catch (const c10::Error& e) {
    throw Error(explain_unfinished_reduction(e.what_without_backtrace(), names_));
  }
  // With find_unused_parameters the reducer walks the graph from the outputs to find parameters
  // that will get no gradient; without it an empty list is what PyTorch DDP passes.
  reducer_->prepare_for_backward(find_unused_parameters_ ? std::vector<torch::Tensor>{loss}
                                                         : std::vector<torch::Tensor>{});
}

}  // namespace volt
