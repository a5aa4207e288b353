#include "volt/pipeline/balance.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <numeric>
#include <unordered_set>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {

namespace {

int64_t bytes_of(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// The leaves whose gradients a backward of `out` would accumulate (the parameters it used, and
// `input` if it requires grad), found in its graph rather than among a layer's registered
// parameters: a layer may use parameters registered elsewhere (a tied embedding, a view of a
// model's modules), and they cost time and memory all the same.
std::vector<torch::Tensor> graph_leaves(const torch::Tensor& out) {
  std::vector<torch::Tensor> leaves;
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> pending;
  if (out.grad_fn()) pending.push_back(out.grad_fn().get());
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* accumulate = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      leaves.push_back(accumulate->variable);
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function) pending.push_back(edge.function.get());
    }
  }
  return leaves;
}

}  // namespace

std::vector<LayerCost> profile_layers(torch::nn::Sequential& layers, const torch::Tensor& sample, int repeats) {
  VOLT_CHECK(layers->size() > 0, "profile_layers was given an empty Sequential. HINT: add the model's layers first.");
  VOLT_CHECK(repeats >= 1,
             "profile_layers needs repeats >= 1; got {}. HINT: it is how many timed passes to take the median of; the "
             "default is 3.",
             repeats);
  // The timing passes compute the gradients the backward would (autograd::grad of every leaf in
  // the graph) without accumulating them: whatever gradients the parameters hold stay.
  std::vector<LayerCost> costs;
  torch::Tensor x = sample.detach();
  for (auto it = layers->begin(); it != layers->end(); ++it) {
    LayerCost cost;
    std::vector<double> times;
    torch::Tensor out;
    for (int r = 0; r <= repeats; ++r) {
      const torch::Tensor input = x.is_floating_point() ? x.detach().requires_grad_(true) : x;
      const auto start = std::chrono::steady_clock::now();
      out = it->forward(input);
      if (out.requires_grad()) {
        const std::vector<torch::Tensor> leaves = graph_leaves(out);
        if (!leaves.empty())
          torch::autograd::grad({out}, leaves, {torch::ones_like(out)}, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
        if (r == 0) {
          for (const torch::Tensor& leaf : leaves) {
            if (!leaf.is_same(input)) cost.parameter_bytes += 2 * bytes_of(leaf);  // the value and its gradient
          }
        }
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (r > 0) times.push_back(seconds);  // the first pass warms caches and allocators
    }
    std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
    cost.seconds = times[times.size() / 2];
    cost.activation_bytes = bytes_of(out);
    costs.push_back(cost);
    x = out.detach();
  }
  return costs;
}

void check_balance(const std::vector<int64_t>& balance, int64_t layers) {
  const int64_t total = std::accumulate(balance.begin(), balance.end(), int64_t{0});
  const bool positive = std::all_of(balance.begin(), balance.end(), [](int64_t n) { return n >= 1; });
  VOLT_CHECK(!balance.empty() && positive && total == layers,
             "balance [{}] does not split the {} layers into non-empty stages (it covers {}). HINT: give one layer "
             "count >= 1 per stage, summing to {}, or balance \"auto\".",
             fmt::join(balance, ", "), layers, total, layers);
}

std::vector<double> stage_seconds(const std::vector<LayerCost>& costs, const std::vector<int64_t>& balance) {
  check_balance(balance, static_cast<int64_t>(costs.size()));
  std::vector<double> out;
  size_t layer = 0;
  for (const int64_t n : balance) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += costs[layer++].seconds;
    out.push_back(sum);
  }
  return out;
}

std::vector<int64_t> balance_by_time(const std::vector<LayerCost>& costs, int64_t stages,
                                     std::optional<int64_t> memory_limit, int64_t micro_batches) {
  const auto n = static_cast<int64_t>(costs.size());
  VOLT_CHECK(stages >= 1 && stages <= n,
             "cannot split {} layers into {} pipeline stages. HINT: use between 1 and {} stages (devices).", n, stages,
             n);
  std::vector<double> time_prefix(static_cast<size_t>(n) + 1, 0.0);
  std::vector<int64_t> bytes_prefix(static_cast<size_t>(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const LayerCost& c = costs[static_cast<size_t>(i)];
    time_prefix[i + 1] = time_prefix[i] + c.seconds;
    bytes_prefix[i + 1] = bytes_prefix[i] + c.parameter_bytes + c.activation_bytes * micro_batches;
  }
  const auto fits = [&](int64_t begin, int64_t end) {
    return !memory_limit || bytes_prefix[end] - bytes_prefix[begin] <= *memory_limit;
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[s][i]: the slowest stage of the best split of the first i layers into s stages.
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                        std::vector<double>(static_cast<size_t>(n) + 1, kInf));
  std::vector<std::vector<int64_t>> cut(best.size(), std::vector<int64_t>(static_cast<size_t>(n) + 1, -1));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s) {
    for (int64_t i = s; i <= n; ++i) {
      for (int64_t j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == kInf || !fits(j, i)) continue;
        const double slowest = std::max(best[s - 1][j], time_prefix[i] - time_prefix[j]);
        // Ties go to the later cut, which leaves earlier stages lighter: they also run first.
        if (slowest <= best[s][i]) {
          best[s][i] = slowest;
          cut[s][i] = j;
        }
      }
    }
  }
  if (best[stages][n] == kInf) {
    int64_t largest = 0;
    for (const LayerCost& c : costs)
      largest = std::max(largest, c.parameter_bytes + c.activation_bytes * micro_batches);
    throw Error(fmt::format(
        "no split of the {} layers into {} stages keeps every stage within memory_limit={} bytes (the largest layer "
        "alone needs {} with {} micro-batches). HINT: raise the limit, use more stages, or fewer micro-batches.",
        n, stages, *memory_limit, largest, micro_batches));
  }
  std::vector<int64_t> balance(static_cast<size_t>(stages));
  for (int64_t s = stages, i = n; s >= 1; --s) {
    const int64_t j = cut[s][i];
    balance[static_cast<size_t>(s - 1)] = i - j;
    i = j;
  }
  return balance;
}

std::string describe_balance(const std::vector<LayerCost>& costs, const std::vector<int64_t>& balance) {
  const std::vector<double> seconds = stage_seconds(costs, balance);
  std::vector<std::string> parts;
  int64_t first = 0;
  for (size_t s = 0; s < balance.size(); ++s) {
    int64_t bytes = 0;
    for (int64_t i = first; i < first + balance[s]; ++i)
      bytes += costs[static_cast<size_t>(i)].parameter_bytes + costs[static_cast<size_t>(i)].activation_bytes;
    parts.push_back(fmt::format("stage {}: layers {}-{} ({}), {:.3f} ms, {} bytes", s, first, first + balance[s] - 1,
                                balance[s], seconds[s] * 1000.0, bytes));
    first += balance[s];
  }
  return join(parts, "; ");
}

}  // namespace volt
